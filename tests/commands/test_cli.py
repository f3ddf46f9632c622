"""The command line: ``jupyter infer demo``, ``loadgen`` and ``make-model``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from jupyter_infer.commands.cli import main
from jupyter_infer.commands.loadgen import make_workload
from jupyter_infer.values.metrics import percentile

VENV_BIN = Path(sys.executable).parent


# -- loadgen pieces -----------------------------------------------------------------------------
def test_percentile_interpolates_and_skips_missing() -> None:
    assert percentile([], 50) is None
    assert percentile([None], 50) is None
    assert percentile([3.0, 1.0, 2.0, None], 50) == 2.0
    assert percentile([0.0, 10.0], 95) == pytest.approx(9.5)


def test_workload_is_seeded_and_poisson() -> None:
    a = make_workload(200, rate=10, min_tokens=4, max_tokens=9, seed=7)
    assert a == make_workload(200, rate=10, min_tokens=4, max_tokens=9, seed=7)
    assert a != make_workload(200, rate=10, min_tokens=4, max_tokens=9, seed=8)
    assert all(4 <= x.max_tokens <= 9 for x in a)
    assert [x.at for x in a] == sorted(x.at for x in a)
    assert a[-1].at / 199 == pytest.approx(0.1, rel=0.35)  # mean gap 1/rate
    assert len({x.prompt for x in a}) > 20  # prompt lengths vary
    assert all(x.at == 0 for x in make_workload(5, rate=0))


# -- loadgen end to end -------------------------------------------------------------------------
def test_loadgen_in_process_prints_percentiles(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    out_json = tmp_path / "loadgen.json"
    code = main([
        "loadgen", "--engine", "simulated", "--token-delay-ms", "0", "0", "--prefill-ms-per-token", "0",
        "-n", "40", "--rate", "0", "--min-tokens", "4", "--max-tokens", "12", "--json", str(out_json),
    ])
    out = capsys.readouterr().out
    assert code == 0
    assert "40/40 ok" in out
    assert re.search(r"p50\s+p95\s+p99", out)
    assert re.search(r"TTFT ms\s+[\d.,]+\s+[\d.,]+\s+[\d.,]+", out)
    assert re.search(r"latency ms\s+[\d.,]+\s+[\d.,]+\s+[\d.,]+", out)
    assert "tokens/s" in out
    saved = json.loads(out_json.read_text())
    assert saved["summary"]["ok"] == 40 and len(saved["outcomes"]) == 40
    assert saved["summary"]["ttft_ms"]["p99"] >= saved["summary"]["ttft_ms"]["p50"]


@pytest.mark.slow
def test_loadgen_over_http(capsys: pytest.CaptureFixture[str]) -> None:
    from jupyter_infer.kernel.launcher import LocalServer

    with LocalServer(engine="simulated", simulated_token_delay_ms=[0, 1], simulated_prefill_ms_per_token=0) as server:
        code = main(["loadgen", "--url", server.url, "--token", server.token, "-n", "12", "--rate", "50",
                     "--min-tokens", "3", "--max-tokens", "8"])
    out = capsys.readouterr().out
    assert code == 0
    assert "12/12 ok" in out
    assert "engine simulated" in out
    assert re.search(r"TTFT ms\s+[\d.,]+", out)


# -- demo ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_demo_drives_the_real_server_and_shows_batching(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["demo", "--engine", "simulated", "--token-delay-ms", "5", "10", "--sequential", "2",
                 "--bursts", "3,6", "--max-tokens", "12"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "engine simulated" in out and "(token auth)" in out
    # The streamed request printed its tokens, then the sequential requests ran alone.
    assert "streamed token by token" in out and "fragments in" in out
    assert re.search(r"Q1\s+done\s+batch #\d+\s+size\s+1\b", out)
    # A burst was grouped: several requests share a batch, and the live log says who joined.
    sizes = [int(s) for s in re.findall(r"batch #\d+\s+size\s+(\d+):", out)]
    assert max(sizes) >= 2, out
    assert "joined" in out
    # The closing table compares sequential with batched latency.
    assert "Sequential vs batched" in out
    for phase in ("sequential", "burst of 3", "burst of 6"):
        assert re.search(rf"^\s+{phase}\s+\d+\s+[\d.]+\s+\d+ ms", out, re.M), phase
    assert "faster" in out
    assert "shutting the server down" in out


def test_demo_rejects_bad_bursts(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "--bursts", "four"]) == 2
    assert "--bursts" in capsys.readouterr().err


# -- make-model through the console script ----------------------------------------------------------
@pytest.mark.slow
def test_make_model_via_jupyter_infer(tmp_path: Path) -> None:
    env = {**os.environ, "PATH": f"{VENV_BIN}{os.pathsep}{os.environ.get('PATH', '')}"}
    jupyter = VENV_BIN / "jupyter"
    command = [str(jupyter), "infer"] if jupyter.exists() else [str(VENV_BIN / "jupyter-infer")]
    target = tmp_path / "model"
    done = subprocess.run([*command, "make-model", str(target), "--size", "tiny"],
                          env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stderr
    assert "built 'tiny' model" in done.stdout
    for name in ("config.json", "model.safetensors", "tokenizer.json", "jupyter_infer_model.json"):
        assert (target / name).is_file(), name
    assert json.loads((target / "config.json").read_text())["model_type"] == "gpt2"


def test_make_model_takes_a_longer_context(tmp_path: Path) -> None:
    """Tool schemas take ~430 tokens of the prompt: a 512-position model had no room to call."""
    from jupyter_infer.commands.cli import main

    assert main(["make-model", str(tmp_path / "long"), "--size", "llama-tiny", "--context", "4096"]) == 0
    config = json.loads((tmp_path / "long" / "config.json").read_text())
    assert config["max_position_embeddings"] == 4096
    assert json.loads((tmp_path / "long" / "tokenizer_config.json").read_text())["model_max_length"] == 4096
    with pytest.raises(SystemExit, match="from 16 to 131072"):
        main(["make-model", str(tmp_path / "bad"), "--context", "3"])


# -- the command line itself --------------------------------------------------------------------
_IMPORTED = """
import sys
from jupyter_infer.commands.cli import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
heavy = ("torch", "transformers", "httpx", "jupyter_infer.commands.bench", "jupyter_infer.commands.make_model")
print("imported:", [name for name in heavy if name in sys.modules])
"""


@pytest.mark.parametrize("argv", [["--help"], ["serve", "--help"]])
def test_a_command_imports_only_its_own_module(argv: list[str]) -> None:
    """`jupyter infer --help` took ~3 s and `serve` held httpx, rich and the bench's modules:
    every command's module was imported to build the parser."""
    done = subprocess.run([sys.executable, "-c", _IMPORTED, *argv], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage: jupyter infer" in done.stdout
    assert done.stdout.strip().splitlines()[-1] == "imported: []"


def test_each_command_still_parses_its_own_options(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["make-model", "--help"])
    said = " ".join(capsys.readouterr().out.split())
    # Each size says what it is (the help listed four names and nothing more).
    assert all(s in said for s in ("tiny: GPT-2, 2 layers", "llama-tiny: Llama", "0.5b: Llama with Qwen2.5-0.5B's shape"))
    with pytest.raises(SystemExit):
        main(["nope"])
    assert "invalid choice: 'nope'" in capsys.readouterr().err
