"""The JupyterLab side panel in a real browser: Debian's Chromium driven by Playwright.

A real ``jupyter lab`` (loopback, token, simulated engine) serves the prebuilt extension the
package installs. The test opens the panel from the command palette, sends requests from
outside over HTTP and watches them appear in the live timeline, cancels one by clicking its
row, streams a prompt from the panel's box, and checks the status-bar item; it switches the
model from the panel's Models section (a kernel started before lives on) and shows a managed
child server's log. Screenshots go to ``bench-results/screenshots/`` (labextension/README.md);
the Models section's to ``/tmp/panel-shots/``.

Chromium is never downloaded (no ``playwright install``): ``.ci/run`` installs Debian's.
"""

from __future__ import annotations

import json
import os
import queue
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from jupyter_infer.cpu.child_process import dies_with_parent

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
SHOTS = ROOT / "bench-results" / "screenshots"
PANEL_SHOTS = Path("/tmp/panel-shots")
TOKEN = "browser-test-token-0123456789"
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-background-networking",
    "--disable-component-update", "--no-first-run", "--disable-sync",
]
PANEL = "#jupyter-infer"

if not CHROMIUM.exists():
    pytest.skip(
        f"Debian's Chromium is not at {CHROMIUM}: `apt-get install -y chromium` (.ci/run does)",
        allow_module_level=True,
    )
sync_api = pytest.importorskip("playwright.sync_api", reason="needs the test extra: pip install -e '.[test]'")
expect = sync_api.expect


@dataclass
class Lab:
    url: str
    token: str

    def get(self, path: str) -> Any:
        response = httpx.get(f"{self.url}/{path}", headers=self.headers, timeout=10)
        response.raise_for_status()
        return response.json()

    def post(self, path: str, body: dict[str, Any] | None = None, timeout: float = 10) -> Any:
        response = httpx.post(f"{self.url}/{path}", json=body or {}, headers=self.headers, timeout=timeout)
        response.raise_for_status()
        return response.json()

    def delete(self, path: str) -> None:
        httpx.delete(f"{self.url}/{path}", headers=self.headers, timeout=10).raise_for_status()

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"token {self.token}"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_until(check: Callable[[], bool], timeout: float, what: str) -> None:
    """Poll a real condition (a server answer) until it holds."""
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: still not true after {timeout:.0f} s")
        time.sleep(0.1)


class LabProcess:
    """``jupyter lab`` in a clean Jupyter home, on a fixed port so that it can be restarted."""

    def __init__(self, home: Path) -> None:
        self.home = home
        port = _free_port()
        self.lab = Lab(f"http://127.0.0.1:{port}", TOKEN)
        self.env = {
            **os.environ,
            # A clean Jupyter home: no user settings or workspaces leak in, none leak out.
            "JUPYTER_CONFIG_DIR": str(home / "config"),
            "JUPYTER_DATA_DIR": str(home / "data"),
            "JUPYTER_RUNTIME_DIR": str(home / "runtime"),
            "HF_HUB_OFFLINE": "1",
        }
        self.cmd = [
            sys.executable, "-m", "jupyter", "lab", "--no-browser", "--allow-root",
            "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}", "--ServerApp.port_retries=0",
            f"--ServerApp.root_dir={home}", f"--IdentityProvider.token={TOKEN}",
            f"--LabApp.user_settings_dir={home / 'settings'}", f"--LabApp.workspaces_dir={home / 'workspaces'}",
            "--InferApp.engine=simulated",
            # What infer/models lists besides the HF cache: this home's folder, empty until a
            # test builds a model there (not the user's ~/models).
            f"--InferApp.model_dirs={home / 'models'}",
        ]
        # No "get notified about Jupyter news?" toast over the panel.
        news = home / "settings" / "@jupyterlab" / "apputils-extension" / "notification.jupyterlab-settings"
        news.parent.mkdir(parents=True, exist_ok=True)
        news.write_text(json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        # Serve this checkout's build (jupyter_infer/labextension), not whatever copy an earlier
        # install left in the environment: JUPYTER_PATH comes first on the data path.
        served = home / "path" / "labextensions" / "jupyter-infer"
        served.parent.mkdir(parents=True, exist_ok=True)
        if not served.exists():
            served.symlink_to(ROOT / "jupyter_infer" / "labextension", target_is_directory=True)
        self.env["JUPYTER_PATH"] = os.pathsep.join(filter(None, [str(home / "path"), os.environ.get("JUPYTER_PATH")]))
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.home / "lab.log", "a") as log:
            self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.home,
                                         preexec_fn=dies_with_parent())

        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"jupyter lab exited:\n{(self.home / 'lab.log').read_text()[-3000:]}")
            try:
                return self.lab.get("infer/status")["state"] == "ready"
            except httpx.HTTPError:
                return False

        _wait_until(ready, 60, "jupyter lab with the simulated engine")

    def stop(self) -> None:
        if self.proc is None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        self.proc = None


@pytest.fixture(scope="module")
def lab_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabProcess]:
    process = LabProcess(tmp_path_factory.mktemp("lab"))
    process.start()
    yield process
    process.stop()


@pytest.fixture
def lab(lab_process: LabProcess) -> Lab:
    if lab_process.proc is None:  # a test that restarts it failed half-way
        lab_process.start()
    return lab_process.lab


# Function scope: Playwright's sync API runs its own event loop, which must be closed before
# pytest-jupyter's autouse loop fixtures tear down after each test.
@pytest.fixture
def page(lab: Lab) -> Iterator[Any]:
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1500, "height": 1000})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(str(err)))
        page.goto(f"{lab.url}/lab?token={lab.token}")
        # The app has started once our status-bar item (activated last) is there.
        expect(page.locator(".ji-status-item")).to_be_visible(timeout=60_000)
        page.set_default_timeout(20_000)
        yield page, errors
        context.close()
        browser.close()


class Burst:
    """``n`` streaming requests sent from outside the browser, each on its own thread."""

    def __init__(self, lab: Lab, prompts: list[str], max_tokens: int | list[int], *, ignore_eos: bool = False,
                 extra: list[dict[str, Any]] | None = None) -> None:
        self.ids: queue.Queue[str] = queue.Queue()
        self.results: dict[str, dict[str, Any]] = {}
        self.bodies: dict[str, dict[str, Any]] = {}  # what each request sent, by id
        self._pool = ThreadPoolExecutor(len(prompts))
        lengths = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        extra = extra or [{}] * len(prompts)  # more of each request's body: a constraint
        self._futures = [self._pool.submit(self._one, lab, p, n, ignore_eos, more)
                         for p, n, more in zip(prompts, lengths, extra, strict=True)]

    def _one(self, lab: Lab, prompt: str, max_tokens: int, ignore_eos: bool, extra: dict[str, Any]) -> None:
        body = {"prompt": prompt, "max_tokens": max_tokens, "ignore_eos": ignore_eos, **extra}
        with httpx.stream("POST", f"{lab.url}/infer/generate_stream", json=body,
                          headers=lab.headers, timeout=60) as response:
            response.raise_for_status()
            rid = response.headers["X-Request-Id"]
            self.bodies[rid] = body
            self.ids.put(rid)
            event = ""
            for line in response.iter_lines():
                if line.startswith("event: "):
                    event = line[7:]
                elif line.startswith("data: ") and event == "result":
                    self.results[rid] = json.loads(line[6:])

    def take(self, n: int) -> list[str]:
        return [self.ids.get(timeout=30) for _ in range(n)]

    def wait(self) -> None:
        for future in self._futures:
            future.result(timeout=90)
        self._pool.shutdown()


def _shot(target: Any, name: str, folder: Path = SHOTS) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    target.screenshot(path=str(folder / name))


def _run_command(page: Any, label: str) -> None:
    """Run a command from the command palette, as a person would. The modal palette closes
    when the app moves the focus (at start-up, after a theme change): then open it again."""
    palette = page.locator("#command-palette")
    for attempt in range(3):
        page.keyboard.press("Control+Shift+C")
        try:
            palette.locator(".lm-CommandPalette-input").fill(label, timeout=5_000)
            palette.locator(".lm-CommandPalette-item", has_text=label).first.click(timeout=5_000)
            return
        except sync_api.TimeoutError:
            if attempt == 2:
                raise
            page.keyboard.press("Escape")


def _widen_right_sidebar(page: Any, width: int) -> None:
    """Drag the right sidebar's edge, as a person would, until it is ``width`` px wide."""
    stack = page.locator("#jp-right-stack")
    left = stack.bounding_box()["x"]
    handles = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle")
    for i in range(handles.count()):
        box = handles.nth(i).bounding_box()
        if box and abs(box["x"] + box["width"] / 2 - left) < 8:
            x, y = box["x"] + box["width"] / 2, box["y"] + box["height"] / 2
            page.mouse.move(x, y)
            page.mouse.down()
            page.mouse.move(x - (width - stack.bounding_box()["width"]), y, steps=8)
            page.mouse.up()
            break
    page.wait_for_function(f"document.querySelector('#jp-right-stack').offsetWidth >= {width - 10}")


def test_side_panel_follows_the_server(lab: Lab, page: Any) -> None:
    page, errors = page
    panel = page.locator(PANEL)
    _run_command(page, "Open the Inference Panel")
    expect(panel).to_be_visible()
    _widen_right_sidebar(page, 460)
    expect(panel.locator('[data-field="engine"] .ji-field-value')).to_have_text("simulated")
    expect(panel.locator(".ji-state")).to_have_text("ready")
    status_item = page.locator(".ji-status-item")
    expect(status_item).to_contain_text("infer: ready")

    # Six requests from outside the browser: each gets a row in the live timeline.
    burst = Burst(lab, [f"Explain {topic} in detail." for topic in (
        "dynamic batching", "the KV cache", "speculative decoding", "paged attention",
        "prefix caching", "quantization")], max_tokens=300)
    ids = burst.take(6)
    for rid in ids:
        expect(panel.locator(f'g.ji-row[data-id="{rid}"]')).to_have_count(1)
    expect(panel.locator('[data-figure="running"] .ji-figure-value')).not_to_have_text("0")
    expect(status_item).to_contain_text("running")

    # Cancel one running request by clicking its row; the server counts it.
    cancelled_before = lab.get("infer/metrics")["requests"]["cancelled"]
    victim = ids[2]
    row = panel.locator(f'g.ji-row[data-id="{victim}"]')
    expect(row).to_have_class("ji-row ji-clickable ji-live")
    row.click()
    _wait_until(lambda: lab.get("infer/metrics")["requests"]["cancelled"] == cancelled_before + 1,
                15, "the server counts the cancelled request")
    expect(row.locator(".ji-marker.ji-cancelled")).to_have_count(1)
    panel.locator(f'g.ji-row[data-id="{ids[4]}"] rect.ji-part').last.hover()
    expect(panel.locator(".ji-tl-tip")).to_contain_text(ids[4])
    _shot(panel, "lab-panel-burst-light.png")  # mid-burst: a cancelled row, a hovered one
    expect(panel.locator('[data-figure="outcomes"] .ji-figure-value')).to_contain_text(
        f"{cancelled_before + 1} cancelled")
    burst.wait()
    assert burst.results[victim]["finish_reason"] == "cancelled"
    assert all(burst.results[rid]["finish_reason"] != "cancelled" for rid in ids if rid != victim)

    # A prompt from the panel's box streams its answer in.
    box = panel.locator(".ji-prompt")
    box.locator("textarea").fill("What is speculative decoding?")
    box.locator('input[name="max_tokens"]').fill("120")
    box.locator(".ji-send").click()
    output = box.locator(".ji-output")
    expect(output).to_have_attribute("data-state", "streaming")
    expect(output).not_to_be_empty()
    partial = output.text_content()
    expect(output).to_have_attribute("data-state", "done", timeout=30_000)
    final = output.text_content()
    assert partial and final.startswith(partial) and len(final) > len(partial), "the answer arrived at once"
    expect(box.locator(".ji-result")).to_contain_text(re.compile(r"(stop|length) · \d+ tokens · TTFT \d+ ms"))
    # Its row in the timeline is labelled with the prompt (truncated; in full on hover).
    expect(panel.locator('g.ji-row[aria-label^="What is speculative decoding?"]')).to_have_count(1)

    # Stop cancels the streaming request on the server.
    cancelled_before = lab.get("infer/metrics")["requests"]["cancelled"]
    box.locator("textarea").fill("Explain continuous batching at length, with examples.")
    box.locator('input[name="max_tokens"]').fill("500")
    box.locator(".ji-send").click()
    expect(output).not_to_be_empty()
    box.locator(".ji-stop").click()
    expect(output).to_have_attribute("data-state", "stopped")
    expect(box.locator(".ji-result")).to_contain_text("cancelled")
    _wait_until(lambda: lab.get("infer/metrics")["requests"]["cancelled"] == cancelled_before + 1,
                15, "the server counts the stopped request")
    assert not errors, errors


def test_panel_follows_a_server_restart(lab_process: LabProcess, lab: Lab, page: Any) -> None:
    page, _ = page
    panel = page.locator(PANEL)
    _run_command(page, "Open the Inference Panel")
    expect(panel.locator(".ji-state")).to_have_text("ready")
    lab_process.stop()
    expect(panel.locator(".ji-state")).to_have_text("reconnecting…")
    expect(page.locator(".ji-status-item")).to_have_text("infer: offline")
    lab_process.start()
    expect(panel.locator(".ji-state")).to_have_text("ready", timeout=30_000)
    # The live stream is back: a request from outside shows up.
    burst = Burst(lab, ["Are you back?"], max_tokens=40)
    (rid,) = burst.take(1)
    expect(panel.locator(f'g.ji-row[data-id="{rid}"]')).to_have_count(1)
    burst.wait()


def test_dark_theme_and_long_history(lab: Lab, page: Any) -> None:
    """Screenshots for a person to judge: the panel in the dark theme during a burst, and the
    notebook widget's bundle drawing a long history (63 requests over ~150 s)."""
    page, errors = page
    _run_command(page, "Use Theme: JupyterLab Dark")
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    panel = page.locator(PANEL)
    if not panel.is_visible():
        _run_command(page, "Open the Inference Panel")
    _widen_right_sidebar(page, 460)
    _run_command(page, "Open the Inference Timeline")
    wide = page.locator(".ji-timeline-widget")
    expect(wide).to_be_visible()
    # Answers of different lengths, so that rows leave the batch one by one: EOS ignored, or the
    # simulated answers (100-130 tokens here) would end most rows at once, and the mid-burst
    # moment below would last well under a second.
    burst = Burst(lab, [f"Tell me about topic {i} and batching" for i in range(12)],
                  max_tokens=[40 + 25 * i for i in range(12)], ignore_eos=True)
    for rid in burst.take(12):
        expect(panel.locator(f'g.ji-row[data-id="{rid}"]')).to_have_count(1)
        expect(wide.locator(f'g.ji-row[data-id="{rid}"]')).to_have_count(1)
    # Mid-burst: some rows have finished, others still stream.
    expect(panel.locator("g.ji-row:not(.ji-live)").nth(3)).to_be_attached(timeout=30_000)
    expect(panel.locator("g.ji-row.ji-live").nth(3)).to_be_attached()
    _shot(panel, "lab-panel-burst-dark.png")
    _shot(page, "lab-burst-dark-full.png")
    burst.wait()
    for theme in ("Dark", "Light"):
        if theme == "Light":
            _run_command(page, "Use Theme: JupyterLab Light")
            expect(page.locator('body[data-jp-theme-light="true"]')).to_have_count(1)
        _draw_long_history(page)
        _shot(page.locator("#ji-long-history"), f"timeline-long-history-{theme.lower()}.png")
        page.evaluate("document.getElementById('ji-long-history').remove()")
    assert not errors, errors


ANSWER = {"type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
          "required": ["answer", "confidence"], "additionalProperties": False}
PICK = {"type": "object", "properties": {"a": {"enum": ["x", "y"]}}, "required": ["a"], "additionalProperties": False}


def test_constrained_rows_and_fast_forwarded_steps(lab: Lab, page: Any) -> None:
    """Constrained requests among free ones: their rows get a badge and an outline, their
    tooltip the kind and "N of M tokens fast-forwarded"; steps that forced tokens are ticked
    on the batch track. Screenshots of the wide view and the panel for a person to judge."""
    page, errors = page
    _run_command(page, "Open the Inference Timeline")
    wide = page.locator(".ji-timeline-widget")
    expect(wide).to_be_visible()
    requests = [
        ("Explain dynamic batching.", 90, {}),
        ("Answer in JSON: what is a KV cache?", 60, {"json_schema": ANSWER}),
        ("Explain paged attention.", 140, {}),
        ("x", 20, {"json_schema": PICK}),
        ("Is prefix caching worth it?", 8, {"choice": ["yes", "no", "it depends"]}),
        ("Explain speculative decoding.", 60, {}),
        ("A phone number, please.", 20, {"regex": "[0-9]{3}-[0-9]{3}-[0-9]{4}"}),
        ("Answer in JSON: what is quantization?", 60, {"response_format": {"type": "json_object"}}),
    ]
    burst = Burst(lab, [p for p, _, _ in requests], max_tokens=[n for _, n, _ in requests], ignore_eos=True,
                  extra=[x for _, _, x in requests])
    ids = burst.take(len(requests))
    burst.wait()
    kinds = {"json_schema": 2, "choice": 1, "regex": 1, "json_object": 1}
    for kind, n in kinds.items():
        expect(wide.locator(f'g.ji-row[data-constraint="{kind}"] .ji-constraint-badge')).to_have_count(n)
    expect(wide.locator("g.ji-row.ji-constrained")).to_have_count(5)
    expect(wide.locator("g.ji-row:not(.ji-constrained) .ji-constraint-badge")).to_have_count(0)
    expect(wide.locator(".ji-tl-head .ji-ff-tick").first).to_be_attached()
    expect(wide.locator(".ji-legend")).to_contain_text(re.compile(r"constrained: .*JSON schema"))  # kinds in arrival order
    expect(wide.locator(".ji-legend")).to_contain_text("fast-forwarded")
    # The records have been merged in: the tooltip says how many tokens the grammar forced.
    row = wide.locator('g.ji-row[data-constraint="json_schema"]').first
    row.locator("rect.ji-part").last.hover()
    expect(wide.locator(".ji-tl-tip")).to_contain_text(
        re.compile(r"constrained: JSON schema · \d+ of \d+ tokens fast-forwarded"))
    _shot(wide, "lab-timeline-constrained.png")
    panel = page.locator(PANEL)
    if not panel.is_visible():
        _run_command(page, "Open the Inference Panel")
    _widen_right_sidebar(page, 460)
    expect(panel.locator("g.ji-row.ji-constrained")).to_have_count(5)
    _shot(panel, "lab-panel-constrained.png")
    # The notebook's timeline (the same renderer, bundled) draws the server's records alike.
    from jupyter_infer.kernel.widgets.timeline import timeline_data

    kind_of = {"json_schema", "choice", "regex", "response_format"}
    labels = {rid: f"{body['prompt']} ({next((k for k in body if k in kind_of), 'free text')})"
              for rid, body in burst.bodies.items()}
    rows, batches = timeline_data(lab.get("infer/batches"), ids, labels=labels)
    _draw_with_bundle(page, rows, batches, "Constrained and free requests")
    drawn = page.locator("#ji-long-history")
    expect(drawn.locator("g.ji-row.ji-constrained .ji-constraint-badge")).to_have_count(5)
    expect(drawn.locator(".ji-legend")).to_contain_text("fast-forwarded")
    _shot(drawn, "timeline-constrained-notebook.png")
    page.evaluate("document.getElementById('ji-long-history').remove()")
    _run_command(page, "Use Theme: JupyterLab Dark")
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    expect(page.locator("#jupyterlab-splash")).to_have_count(0)  # the theme change's splash is gone
    row.locator("rect.ji-part").last.hover()
    expect(wide.locator(".ji-tl-tip")).to_be_visible()
    _shot(wide, "lab-timeline-constrained-dark.png")
    _run_command(page, "Use Theme: JupyterLab Light")  # the lab's settings outlive this test
    expect(page.locator('body[data-jp-theme-light="true"]')).to_have_count(1)
    assert not errors, errors


def _long_history_payload() -> dict[str, Any]:
    """An ``infer/batches`` answer like the issue's: 63 requests in 7 bursts over ~150 s,
    continuous batching (a new span whenever a row joins or leaves)."""
    import random

    rng = random.Random(7)
    batches: list[dict[str, Any]] = []
    requests: list[dict[str, Any]] = []
    t = 1_700_000_000.0
    bid = 0
    n = 0
    for burst in range(7):
        start = t + burst * 22.0 + rng.uniform(0, 3)
        size = 9
        rows = []
        for i in range(size):
            n += 1
            queued = start + i * rng.uniform(0.005, 0.03)
            rows.append({"id": f"req-{n:03d}{rng.randrange(16**8):08x}", "queued_at": queued,
                         "admitted_at": start + 0.3, "first_token_at": start + 0.3 + rng.uniform(0.05, 0.2),
                         "finished_at": start + 0.6 + rng.uniform(0.5, 2.5), "completion_tokens": rng.randrange(20, 120),
                         "outcome": "ok", "batch_ids": []})
        if burst == 3:
            rows[4]["outcome"] = "cancelled"
        ends = sorted({r["finished_at"] for r in rows})
        span_start = start + 0.3
        for end in ends:
            live = [r for r in rows if r["finished_at"] >= end]
            bid += 1
            for r in live:
                r["batch_ids"].append(bid)
            batches.append({"id": bid, "mode": "continuous", "members": [r["id"] for r in live],
                            "size": len(live), "started_at": span_start, "ended_at": end,
                            "steps": 10, "tokens": 10 * len(live)})
            span_start = end
        requests.extend(rows)
    return {"batches": batches, "requests": requests}


def _draw_long_history(page: Any) -> None:
    """Draw a long history with the notebook widget's own bundle."""
    from jupyter_infer.kernel.widgets.timeline import timeline_data

    payload = _long_history_payload()
    labels = {r["id"]: f"#{i + 1} {q}" for i, (r, q) in enumerate(zip(payload["requests"], _questions(), strict=False))}
    rows, batches = timeline_data(payload, labels=labels)
    _draw_with_bundle(page, rows, batches, "Last 30 batches of the server")
    expect(page.locator("#ji-long-history g.ji-row")).to_have_count(63)


def _draw_with_bundle(page: Any, rows: list[dict[str, Any]], batches: list[dict[str, Any]], title: str) -> None:
    """Draw rows with the notebook widget's own bundle (static/timeline.js, the same renderer
    as the panel) inside the page, so that it gets JupyterLab's theme variables."""
    static = ROOT / "jupyter_infer" / "kernel" / "widgets" / "static"
    page.evaluate(
        """([js, css, state]) => {
            document.getElementById('ji-long-history')?.remove();
            const host = document.createElement('div');
            host.id = 'ji-long-history';
            host.style.cssText = 'position:fixed;left:40px;top:60px;width:900px;z-index:10000;padding:10px;' +
              'background:var(--jp-layout-color1);border:1px solid var(--jp-border-color1)';
            document.body.appendChild(host);
            const style = document.createElement('style');
            style.textContent = css;
            host.appendChild(style);
            const url = URL.createObjectURL(new Blob([js], {type: 'text/javascript'}));
            return import(url).then(mod => {
              const model = {get: k => state[k], on: () => {}, off: () => {}};
              mod.default.render({model, el: host});
              return new Promise(r => requestAnimationFrame(() => requestAnimationFrame(r)));
            });
        }""",
        [(static / "timeline.js").read_text(), (static / "timeline.css").read_text(),
         {"requests": rows, "batches": batches, "now": None, "title": title}],
    )


def _questions() -> Iterator[str]:
    topics = ["dynamic batching", "the KV cache", "speculative decoding", "paged attention",
              "prefix caching", "quantization", "mixture of experts", "rotary embeddings", "LoRA"]
    while True:
        for topic in topics:
            yield f"What is {topic} and why does it matter for serving?"


def test_switch_models_from_the_panel(lab_process: LabProcess, lab: Lab, page: Any) -> None:
    """The Models section lists what the server can load; a model built into InferApp.model_dirs
    shows up on refresh and loads from the panel in place of the simulated engine, while a
    kernel started before lives on; a load that fails says why; loading "simulated" by name
    brings the simulated engine back."""
    page, errors = page
    from jupyter_infer.commands.model_builder import make_model

    kernel = lab.post("api/kernels", {"name": "python3"})["id"]
    try:
        assert _run_in_kernel(lab_process, kernel, "answer = 41\nanswer") == "41"
        panel = page.locator(PANEL)
        _run_command(page, "Open the Inference Panel")
        _widen_right_sidebar(page, 460)
        models = panel.locator(".ji-models")
        expect(models.locator('.ji-model-row[data-id="simulated"]')).to_have_attribute("data-loaded", "true")
        expect(models.locator('.ji-model-row[data-id="simulated"] .ji-model-badge')).to_have_text("loaded")
        expect(panel.locator(".ji-child")).to_be_hidden()  # the engine runs in this process

        tiny = make_model(lab_process.home / "models" / "tiny", "tiny")
        models.locator(".ji-link", has_text="refresh").click()
        row = models.locator('.ji-model-row[data-id="tiny"]')  # listed by its name under ~/models
        expect(row.locator(".ji-model-name")).to_have_text("tiny")
        expect(row.locator(".ji-model-meta")).to_have_text(re.compile(r"^folder · [\d.]+ [KM]iB$"))
        expect(row).to_have_attribute("data-loaded", "false")
        expect(models.locator(".ji-load")).to_be_disabled()  # nothing picked yet
        row.click()
        expect(row).to_have_attribute("aria-selected", "true")
        expect(models.locator(".ji-model-input")).to_have_value("tiny")
        _shot(panel, "panel-models-before.png", PANEL_SHOTS)

        models.locator(".ji-load").click()
        try:  # mid-switch, for a person to judge (best effort: a fast machine may load it at once)
            expect(panel.locator(".ji-notice").first).to_contain_text(
                re.compile(r"^(Switching to|Loading) tiny"), timeout=3_000)
            _shot(panel, "panel-models-loading.png", PANEL_SHOTS)
        except AssertionError:
            pass
        expect(row).to_have_attribute("data-loaded", "true", timeout=120_000)
        expect(row.locator(".ji-model-badge")).to_have_text("loaded")
        expect(panel.locator(".ji-state")).to_have_text("ready")
        expect(panel.locator('[data-field="engine"] .ji-field-value')).to_have_text("hf")
        expect(panel.locator('[data-field="model"] .ji-field-value')).to_have_text("tiny")  # its listed name
        expect(models.locator(".ji-model-message")).to_have_text(re.compile(r"^Loaded tiny in "))
        expect(models.locator(".ji-load")).to_be_disabled()  # it is the loaded one now
        status = lab.get("infer/status")
        assert (status["state"], status["engine"], status["model"], status["model_path"]) == (
            "ready", "hf", "tiny", str(tiny))
        # The kernel started before the switch lives on, its variables too.
        assert lab.get(f"api/kernels/{kernel}")["execution_state"] not in ("dead", "restarting")
        assert _run_in_kernel(lab_process, kernel, "answer + 1") == "42"
        _shot(panel, "panel-models-after.png", PANEL_SHOTS)

        # A load that cannot work says why under the buttons, and the loaded model stays.
        models.locator(".ji-model-input").fill(str(lab_process.home / "models" / "no-such-model"))
        models.locator(".ji-load").click()
        message = models.locator('.ji-model-message[data-kind="error"]')
        expect(message).to_be_visible(timeout=60_000)
        expect(message).to_contain_text(re.compile(r"No model at .*no-such-model"))
        assert lab.get("infer/status")["model_path"] == str(tiny)
        _shot(panel, "panel-models-error.png", PANEL_SHOTS)

        # A name typed in: the simulated engine is back.
        models.locator(".ji-model-input").fill("simulated")
        models.locator(".ji-load").click()
        expect(panel.locator('[data-field="engine"] .ji-field-value')).to_have_text("simulated", timeout=60_000)
        expect(models.locator('.ji-model-row[data-id="simulated"]')).to_have_attribute("data-loaded", "true")
        expect(message).to_be_hidden()
        assert lab.get("infer/status")["engine"] == "simulated"
        assert lab.get(f"api/kernels/{kernel}")["execution_state"] == "idle"
        assert _run_in_kernel(lab_process, kernel, "answer + 2") == "43"
        assert not errors, errors
    finally:
        if lab.get("infer/status")["engine"] != "simulated":  # the module's other tests want it
            lab.post("infer/models", {"model": "simulated"}, timeout=60)
        lab.delete(f"api/kernels/{kernel}")


def _run_in_kernel(lab_process: LabProcess, kernel_id: str, code: str) -> str:
    """Run ``code`` in a kernel the lab started (through its connection file); its result's text."""
    from jupyter_client import BlockingKernelClient

    client = BlockingKernelClient(connection_file=str(lab_process.home / "runtime" / f"kernel-{kernel_id}.json"))
    client.load_connection_file()
    client.start_channels()
    try:
        client.wait_for_ready(timeout=60)
        results: list[str] = []

        def keep(msg: dict[str, Any]) -> None:
            if msg["msg_type"] == "execute_result":
                results.append(msg["content"]["data"]["text/plain"])

        reply = client.execute_interactive(code, timeout=30, output_hook=keep)
        assert reply["content"]["status"] == "ok", reply["content"]
        return results[-1] if results else ""
    finally:
        client.stop_channels()


def test_panel_shows_a_child_servers_log(lab: Lab, page: Any) -> None:
    """A managed child server (InferApp.engine = "vllm") that keeps failing: the panel shows its
    kind, state, restarts, error and last log lines. No vLLM here: the browser's own
    infer/status answers get the block a failing child adds (upstream/managed_server.py)."""
    page, errors = page
    child = {
        "kind": "vllm", "command": "vllm serve Qwen/Qwen3-0.6B --port 8123 --api-key <key>", "pid": 4242,
        "url": "http://127.0.0.1:8123/v1", "state": "restarting", "restarts": 2,
        "error": "vllm exited (code 1) before it answered", "log": "/tmp/jupyter-infer/vllm-8123.log",
        "log_tail": ["INFO 05-02 10:11:12 api_server.py:712] vLLM API server version 0.9.1",
                     "INFO 05-02 10:11:14 model_runner.py:1041] Loading model weights took 1.1 GiB",
                     "Traceback (most recent call last):",
                     '  File "vllm/worker/worker.py", line 237, in determine_num_available_blocks',
                     "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB "
                     "(GPU 0; 7.79 GiB total capacity; 6.90 GiB already allocated)", ""],
    }

    def with_child(route: Any) -> None:
        response = route.fetch()
        body = response.json()
        route.fulfill(response=response, json={**body, "state": "starting", "child_server": child})

    status_url = re.compile(r"/infer/status(\?|$)")  # ServerConnection adds a cache-busting ?<time>
    page.route(status_url, with_child)
    page.reload()  # the panel's first status goes through the route too
    expect(page.locator(".ji-status-item")).to_be_visible(timeout=60_000)
    panel = page.locator(PANEL)
    if not panel.is_visible():
        _run_command(page, "Open the Inference Panel")
    _widen_right_sidebar(page, 460)
    block = panel.locator(".ji-child")
    expect(block).to_be_visible(timeout=20_000)
    expect(block.locator(".ji-child-summary")).to_have_text("vllm · restarting · 2 restarts · pid 4242")
    expect(block.locator(".ji-child-error")).to_have_text(child["error"])
    expect(block.locator(".ji-child-log")).to_contain_text("torch.OutOfMemoryError: CUDA out of memory")
    expect(block.locator(".ji-child-where")).to_contain_text("log: /tmp/jupyter-infer/vllm-8123.log")
    expect(panel.locator(".ji-notice").first).to_contain_text("Starting the vllm server")
    _shot(panel, "panel-child-server.png", PANEL_SHOTS)
    # The dark theme, with a row picked: the list's selection and the log block still read.
    panel.locator(".ji-model-row").last.click()
    expect(panel.locator(".ji-model-row").last).to_have_attribute("aria-selected", "true")
    _run_command(page, "Use Theme: JupyterLab Dark")
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    expect(page.locator("#jupyterlab-splash")).to_have_count(0)
    _shot(panel, "panel-child-server-dark.png", PANEL_SHOTS)
    _run_command(page, "Use Theme: JupyterLab Light")  # the lab's settings outlive this test
    expect(page.locator('body[data-jp-theme-light="true"]')).to_have_count(1)
    page.unroute(status_url)
    assert not errors, errors
