"""The ecosystem's own tools, unmodified, against the real server on the hf engine:
lm-eval's ``local-completions`` (loglikelihood via echo + logprobs, token-id prompts,
``--batch_size 4``, six ``until`` strings) and guidellm's streaming benchmark.

Each tool runs as a subprocess from its own environment (``tests/tool_venvs.py``), so the
server keeps serving on this test's event loop meanwhile. Nothing is downloaded at run time:
the tasks' data are files the test writes, the tokenizer is the local model folder.
"""

from __future__ import annotations

import asyncio
import json
import math
import os
from pathlib import Path
from typing import Any

import pytest
import tool_venvs
from server_helpers import TOKEN, server_config, service_of

# The first run installs the tools (minutes); later runs reuse them.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]
UNTIL = ["\n\n", "Question:", "</s>", "<|im_end|>", "###", "Q:"]


@pytest.fixture
def jp_server_config(tiny_model_dir: Path) -> dict[str, Any]:
    return server_config(engine="hf", model=str(tiny_model_dir), dtype="float32", num_threads=1)


@pytest.fixture
def server_url(jp_fetch: Any, jp_http_port: int, jp_base_url: str) -> str:
    return f"http://127.0.0.1:{jp_http_port}{jp_base_url}infer"


async def run(command: list[str], **env: str) -> str:
    """Run ``command`` without blocking the server's loop; its output, or a failure with it."""
    base = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # jupyter_server sets it to ours
    process = await asyncio.create_subprocess_exec(
        *command, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**base, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", **env},
    )
    out, _ = await process.communicate()
    text = out.decode(errors="replace")
    assert process.returncode == 0, text[-4000:]
    return text


def write_tasks(folder: Path) -> None:
    """A multiple-choice task (loglikelihood) and a generate_until task, as local files."""
    folder.mkdir()
    mc = [{"question": f"Question {i}: which word names an animal?", "choices": ["cat", "table", "blue sky", "run"],
           "answer": 0} for i in range(6)]
    gen = [{"question": f"Question: what number comes after {i}?\nAnswer:", "answer": str(i + 1)} for i in range(6)]
    (folder / "mc.jsonl").write_text("".join(json.dumps(x) + "\n" for x in mc))
    (folder / "gen.jsonl").write_text("".join(json.dumps(x) + "\n" for x in gen))
    common = "dataset_path: json\ntest_split: test\ndoc_to_text: \"{{question}}\"\n"
    (folder / "infer_mc.yaml").write_text(
        f"task: infer_mc\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'mc.jsonl'}\n"
        "output_type: multiple_choice\ndoc_to_choice: \"{{choices}}\"\ndoc_to_target: \"{{answer}}\"\n"
        "metric_list:\n  - metric: acc\n")
    (folder / "infer_gen.yaml").write_text(
        f"task: infer_gen\n{common}dataset_kwargs:\n  data_files:\n    test: {folder / 'gen.jsonl'}\n"
        "output_type: generate_until\ndoc_to_target: \"{{answer}}\"\n"
        f"generation_kwargs:\n  until: {json.dumps(UNTIL)}\n  max_gen_toks: 12\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")


async def test_lm_eval_local_completions(server_url: str, tiny_model_dir: Path, tmp_path: Path,
                                         jp_serverapp: Any) -> None:
    lm_eval = await asyncio.to_thread(tool_venvs.ensure, "lm-eval")
    write_tasks(tmp_path / "tasks")
    model_args = (f"model={tiny_model_dir},base_url={server_url}/v1/completions,tokenizer={tiny_model_dir},"
                  "num_concurrent=1,max_retries=1")  # tokenized_requests: the default (token-id prompts)
    await run([str(lm_eval), "--model", "local-completions", "--model_args", model_args,
               "--tasks", "infer_mc,infer_gen", "--include_path", str(tmp_path / "tasks"),
               "--batch_size", "4", "--output_path", str(tmp_path / "out"), "--log_samples"],
              OPENAI_API_KEY=TOKEN)
    results = json.loads(next((tmp_path / "out").rglob("results_*.json")).read_text())["results"]
    assert results["infer_mc"]["sample_len"] == 6 and "acc,none" in results["infer_mc"]
    assert results["infer_gen"]["sample_len"] == 6 and "exact_match,none" in results["infer_gen"]
    samples = [json.loads(line) for line in next((tmp_path / "out").rglob("samples_infer_mc_*.jsonl")).open()]
    for sample in samples:  # four real loglikelihoods per question, one per choice
        scores = [float(resp[0][0]) for resp in sample["resps"]]
        assert len(scores) == 4 and all(math.isfinite(s) and s < 0 for s in scores)
        assert len(set(scores)) > 1
    requests = service_of(jp_serverapp).metrics()["requests"]
    assert requests["ok"] == 6 * 4 + 6 and requests["failed"] == requests["rejected"] == 0


async def test_guidellm_streaming_benchmark(server_url: str, tiny_model_dir: Path, tmp_path: Path,
                                           jp_serverapp: Any) -> None:
    guidellm = await asyncio.to_thread(tool_venvs.ensure, "guidellm")
    report = tmp_path / "guidellm.json"
    await run([str(guidellm), "run",
               "--backend", f"kind=openai_http,target={server_url},api_key={TOKEN}",  # probes {target}/health
               "--profile", "kind=concurrent,streams=4",
               "--constraint", "kind=max_requests,count=12",
               "--data", "kind=synthetic_text,prompt_tokens=32,output_tokens=16",
               "--tokenizer", f"kind=huggingface_auto,model={tiny_model_dir}",
               "--output", f"kind=json,path={report}", "--disable-console-interactive"])
    metrics = json.loads(report.read_text())["benchmarks"][0]["metrics"]
    assert metrics["request_totals"] == {"successful": 12, "errored": 0, "incomplete": 0, "total": 12}
    # ignore_eos: every request produced exactly the tokens guidellm asked for.
    assert metrics["output_token_count"]["successful"]["total_sum"] == 12 * 16
    assert service_of(jp_serverapp).metrics()["requests"]["ok"] == 12
