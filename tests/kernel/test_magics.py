"""The magics in a real ipykernel, against a real Jupyter server with the extension."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from jupyter_client.manager import start_new_kernel

from jupyter_infer.kernel.launcher import LocalServer
from jupyter_infer.kernel.magics import questions_are_prompts, split_options


@pytest.fixture(scope="module")
def kernel() -> Iterator[Any]:
    with LocalServer(engine="simulated", simulated_token_delay_ms=[2.0, 5.0]) as server:
        env = {**os.environ, "JUPYTER_INFER_URL": server.url, "JUPYTER_INFER_TOKEN": server.token}
        km, kc = start_new_kernel(kernel_name="python3", env=env)
        kc.km = km  # for the interrupt test
        try:
            run(kc, "%load_ext jupyter_infer")
            yield kc
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


def run(kc: Any, code: str) -> tuple[str, list[dict[str, Any]], dict[str, Any]]:
    """Execute ``code``; return its status, its iopub messages and the reply's content."""
    messages: list[dict[str, Any]] = []
    reply = kc.execute_interactive(code, output_hook=messages.append, timeout=60)
    return reply["content"]["status"], messages, reply["content"]


def texts(messages: list[dict[str, Any]], *types: str) -> list[str]:
    out = []
    for msg in messages:
        if msg["msg_type"] in types:
            content = msg["content"]
            out.append(content["text"] if msg["msg_type"] == "stream" else content["data"].get("text/plain", ""))
    return out


def test_split_options() -> None:
    assert split_options("What's a KV cache?") == ("", "What's a KV cache?")
    assert split_options("--max-tokens 20 --no-stream  Explain  it") == ("--max-tokens 20 --no-stream", "Explain  it")
    assert split_options("--seed=3 -- --not an option") == ("--seed=3", "--not an option")
    assert split_options("-1 is a number") == ("", "-1 is a number")
    assert split_options('--chat --system "Be brief." What is it?') == ('--chat --system "Be brief."', "What is it?")


def test_questions_are_prompts() -> None:
    """The input transformer: a line of ours that ends in "?" runs the magic; help stays."""
    assert questions_are_prompts(["%infer What is dynamic batching?\n"]) == [
        "get_ipython().run_line_magic('infer', 'What is dynamic batching?')\n"]
    assert questions_are_prompts(["x = 1\n", "    %infer --max-tokens 8 What's RAG?\n"])[1] == (
        "    get_ipython().run_line_magic('infer', \"--max-tokens 8 What's RAG?\")\n")
    untouched = ["%infer?\n", "%infer??\n", "%infer_burst?\n", "%%infer\n", "What?\n", "%info what?\n",
                 's = """\n', "%infer inside a string?\n", '"""\n']
    assert questions_are_prompts(untouched) == untouched


def test_a_question_streams_its_answer(kernel: Any) -> None:
    """The example in ``%infer?``; IPython alone reads it as ``batching?`` (help)."""
    status, messages, _ = run(kernel, "%infer What is dynamic batching?")
    assert status == "ok"
    assert not any("not found" in t for t in texts(messages, "stream")), texts(messages, "stream")
    final = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"]["text/plain"]
    assert "batching" in final.lower() and "tokens · first token" in final
    _, _, reply = run(kernel, "%infer?")
    assert "Complete a prompt" in reply["payload"][0]["data"]["text/plain"]


def test_cell_magic_streams_into_one_updating_display(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%%infer --max-tokens 40 --seed 1\nWhat is dynamic batching?")
    assert status == "ok"
    displays = [m for m in messages if m["msg_type"] == "display_data"]
    updates = [m for m in messages if m["msg_type"] == "update_display_data"]
    assert len(displays) == 1 and len(updates) >= 2
    display_id = displays[0]["content"]["transient"]["display_id"]
    assert all(m["content"]["transient"]["display_id"] == display_id for m in updates)
    final = updates[-1]["content"]["data"]["text/plain"]
    assert "batching" in final.lower() and "[40 tokens · first token" in final
    assert not texts(messages, "stream")  # no line per token
    # Fluent text from no model says so in the cell (only the side panel's badge did).
    assert "[simulated engine: no model wrote this" in final


def test_line_magic_and_no_stream(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%infer --max-tokens 8 --no-stream What's the KV cache? ")
    assert status == "ok"
    (shown,) = texts(messages, "display_data")
    assert "[8 tokens · length" in shown and "batch #" in shown and "[simulated engine:" in shown


def test_errors_are_one_short_line(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%infer --max-tokens 100000 hello")
    assert status == "ok"
    assert not [m for m in messages if m["msg_type"] == "error"]
    (err,) = [t for t in texts(messages, "stream") if t.strip()]
    assert err.startswith("jupyter_infer: This model's maximum context length") and "Traceback" not in err
    status, messages, _ = run(kernel, "%infer --bogus 1 hello")
    assert "unrecognized arguments: --bogus" in "".join(texts(messages, "stream"))
    status, messages, _ = run(kernel, "%%infer\n   ")
    assert "Give a prompt" in "".join(texts(messages, "stream"))


def test_help_text(kernel: Any) -> None:
    _, _, reply = run(kernel, "%infer?")
    page = reply["payload"][0]["data"]["text/plain"]
    assert "Complete a prompt" in page and "--max-tokens" in page and "%%infer" in page
    _, _, reply = run(kernel, "%infer_burst?")
    assert "--rate" in reply["payload"][0]["data"]["text/plain"]


def test_status(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%infer_status")
    assert status == "ok"
    (shown,) = texts(messages, "display_data")
    for word in ("found via environment", "simulated", "scheduling mode", "continuous", "queue / running",
                 "TTFT p50 / p95", "mean batch size"):
        assert word in shown


def test_burst_shows_a_timeline_and_its_summary_once(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%infer_burst 8 --max-tokens 12")
    assert status == "ok"
    (shown,) = [m for m in messages if m["msg_type"] == "display_data"]
    assert "application/vnd.jupyter.widget-view+json" in shown["content"]["data"]
    # The summary is printed once: in the view (HTML, drawn by the widget), whose text for
    # front ends without widgets becomes the summary at the end; nothing on stdout.
    assert not [t for t in texts(messages, "stream") if t.strip()], texts(messages, "stream")
    final = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]
    assert final["transient"]["display_id"] == shown["content"]["transient"]["display_id"]
    assert final["data"]["application/vnd.jupyter.widget-view+json"] == shown["content"]["data"][
        "application/vnd.jupyter.widget-view+json"]  # the same widget
    summary = final["data"]["text/plain"]
    assert summary.startswith("burst of 8, all at once: 8 requests (8 ok"), summary
    assert "TTFT p50" in summary and "mean size" in summary
    status, messages, _ = run(kernel, (
        "t = _infer_burst.timeline\n"
        "assert len(t.requests) == 8 and all(r['id'].startswith('req-') for r in t.requests)\n"
        "assert all(r['batch_ids'] and set(r['batch_ids']) <= set(t.batch_ids) for r in t.requests)\n"
        "assert max(b['size'] for b in t.batches) >= 4\n"
        "assert 'mean batch size' in _infer_burst.summary_html.value\n"
        "print('ok', len(t.batches))"
    ))
    assert status == "ok", messages
    _, messages, _ = run(kernel, "%infer_burst 4 --rate 50 --max-tokens 4")
    final = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"]["text/plain"]
    assert final.startswith("burst of 4 at 50/s: 4 requests (4 ok"), final


def test_panel_magic(kernel: Any) -> None:
    status, messages, _ = run(kernel, "%infer_panel 3")
    assert status == "ok"
    assert any("InferPanel" in t for t in texts(messages, "display_data"))


def test_interrupt_cancels_the_request(kernel: Any) -> None:
    """Ctrl-C (a kernel interrupt) while tokens stream: the server cancels the request."""
    before = metrics(kernel)["cancelled"]
    messages: list[dict[str, Any]] = []

    def hook(msg: dict[str, Any]) -> None:
        messages.append(msg)
        if msg["msg_type"] == "update_display_data" and not interrupted.is_set():
            interrupted.set()  # tokens are streaming: interrupt now
            kernel.km.interrupt_kernel()

    interrupted = threading.Event()
    reply = kernel.execute_interactive("%%infer --max-tokens 500\nExplain batching at length",
                                       output_hook=hook, timeout=60)
    assert interrupted.is_set()
    assert reply["content"]["status"] == "error"  # stops a "run all" like any interrupted cell
    # One line says so, with no KeyboardInterrupt traceback under it.
    errors = [m["content"] for m in messages if m["msg_type"] == "error"]
    assert [e["traceback"] for e in errors] == [["jupyter_infer: interrupted; the server cancels the request."]]
    deadline = time.monotonic() + 5
    while metrics(kernel)["cancelled"] == before and time.monotonic() < deadline:
        time.sleep(0.1)
    assert metrics(kernel)["cancelled"] == before + 1


def metrics(kc: Any) -> dict[str, int]:
    _, messages, _ = run(kc, "print(__import__('json').dumps(__import__('jupyter_infer.kernel.client', fromlist=['default_client']).default_client()"
                             ".metrics()['requests']))")
    import json

    return json.loads("".join(texts(messages, "stream")))


def test_panel_send_button_in_a_real_kernel(kernel: Any) -> None:
    """A click on Send (a comm message, as the browser sends it) runs the prompts on the
    kernel's loop; the run goes on after the click's handler returns."""
    status, messages, _ = run(kernel, (
        "from jupyter_infer.kernel.widgets import InferPanel\n"
        "panel = InferPanel(prompts=['What is RAG?', 'What is attention?'])\n"
        "panel.max_tokens.value = 8\n"
        "print(panel.send_button.comm.comm_id)"
    ))
    comm_id = "".join(texts(messages, "stream")).strip()
    msg = kernel.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})
    kernel.shell_channel.send(msg)
    for _ in range(50):
        _, messages, _ = run(kernel, "print(panel.running, [r['outcome'] for r in panel.timeline.requests])")
        if "".join(texts(messages, "stream")).startswith("False ['ok', 'ok']"):
            break
        time.sleep(0.2)
    else:
        pytest.fail("the click did not run the prompts: " + "".join(texts(messages, "stream")))


def test_send_and_cancel_twelve_times_leaves_no_stray_traceback(kernel: Any) -> None:
    """The issue saw up to 5 "Task exception was never retrieved … aclose(): asynchronous
    generator is already running" tracebacks in the cell after a Cancel, in 2 of 12 tries.
    Twelve clicks on Send then Cancel (comm messages, as the browser sends them), each Cancel
    once tokens stream; then a cell that collects garbage (where such logs appear): nothing
    on stderr, and the server ended every request."""
    _, messages, _ = run(kernel, (
        "from jupyter_infer.kernel.widgets import InferPanel\n"
        "panel = InferPanel(prompts=['Explain batching at length'] * 4)\n"
        "panel.max_tokens.value = 400\n"
        "print(panel.send_button.comm.comm_id, panel.cancel_button.comm.comm_id)"
    ))
    send, cancel = "".join(texts(messages, "stream")).split()
    stderr: list[str] = []

    def click(comm_id: str) -> None:
        msg = kernel.session.msg("comm_msg", {"comm_id": comm_id, "data": {"method": "custom", "content": {"event": "click"}}})
        kernel.shell_channel.send(msg)

    def poll(code: str, expected: str) -> None:
        for _ in range(100):
            _, messages, _ = run(kernel, code)
            stderr.extend(t for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"
                          for t in [m["content"]["text"]])
            if "".join(texts(messages, "stream")).strip() == expected:
                return
            time.sleep(0.05)
        pytest.fail(f"{code!r} never printed {expected!r}")

    for _ in range(12):
        click(send)
        poll("print('streaming' in panel._states)", "True")
        click(cancel)
        poll("print(panel.running)", "False")
    _, messages, _ = run(kernel, "import gc; gc.collect(); print(panel.status.value)")
    assert "cancelled" in "".join(texts(messages, "stream"))
    stderr += [m["content"]["text"] for m in messages if m["msg_type"] == "stream" and m["content"]["name"] == "stderr"]
    assert not stderr, stderr
    poll("m = __import__('jupyter_infer.kernel.client', fromlist=['default_client']).default_client().metrics()['requests']; print(m['queued'] + m['running'])", "0")


def test_chat_option_sends_messages_through_the_chat_template(kernel: Any) -> None:
    status, messages, _ = run(kernel, '%infer --chat --system "Be brief." --max-tokens 6 What is a KV cache?')
    assert status == "ok", messages
    final = [m for m in messages if m["msg_type"] == "update_display_data"][-1]["content"]["data"]["text/plain"]
    assert "[6 tokens · first token" in final
    status, messages, _ = run(kernel, "%infer --chat --no-stream --max-tokens 6 What is a KV cache?")
    (shown,) = texts(messages, "display_data")
    assert status == "ok" and "[6 tokens · length" in shown
    run(kernel, "%infer --no-stream --max-tokens 6 What is a KV cache?")  # the same words, no template
    _, messages, _ = run(kernel, "print([r['prompt_tokens'] for r in __import__('jupyter_infer.kernel.client', "
                                 "fromlist=['default_client']).default_client().batches()['requests'][-3:]])")
    system_chat, chat, plain = eval("".join(texts(messages, "stream")))
    assert system_chat > chat > plain, (system_chat, chat, plain)  # the template's markers, the system message
    status, messages, _ = run(kernel, "%infer --system oops What?")
    assert status == "error" and "give --chat too" in str(messages)


def test_infer_model_lists_and_loads_with_the_kernel_alive(kernel: Any, tiny_model_dir: Any) -> None:
    status, messages, _ = run(kernel, "%infer_model")
    (shown,) = texts(messages, "display_data")
    assert status == "ok" and shown.startswith("state: ready · loaded: simulated") and "● simulated" in shown
    status, messages, _ = run(kernel, f"x = 41\n%infer_model {tiny_model_dir}")
    (shown,) = texts(messages, "display_data")
    assert status == "ok" and f"loaded: {tiny_model_dir}" in shown, messages
    said = [(m["content"]["name"], m["content"]["text"]) for m in messages if m["msg_type"] == "stream"]
    assert said == [("stdout", f"jupyter_infer: loading {tiny_model_dir}…\n")]  # progress, not red as an error
    status, messages, _ = run(kernel, "%infer --max-tokens 2 --no-stream hi")
    assert status == "ok" and "simulated engine" not in texts(messages, "display_data")[0]  # a model wrote it
    status, messages, _ = run(kernel, "print(x + 1)")  # the same kernel, its state kept
    assert "".join(texts(messages, "stream")).strip() == "42"
    status, messages, _ = run(kernel, "%infer_model simulated")
    assert status == "ok" and "loaded: simulated" in texts(messages, "display_data")[0]
