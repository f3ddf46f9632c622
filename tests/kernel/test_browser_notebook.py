"""The notebook widgets in a real browser: JupyterLab, a notebook, ``%infer_burst`` and the panel.

Debian's Chromium driven by Playwright, a real ``jupyter lab`` on loopback with a token and
the simulated engine (the lab and browser set-up are ``test_browser_lab``'s). The test runs a
cell with ``%load_ext jupyter_infer``, ``%infer_burst 8`` and ``%infer_panel 8``, clicks Send
and Cancel several times (once cancelling one request by its prompt's ✕), runs another cell,
and checks what a person would see: the timelines are drawn, no output is stderr or an error,
the browser console has no error. It also checks the panel at 900 px (controls wrap, none
clipped) and that the compact answers show all eight without scrolling. Screenshots (light,
900 px, dark) go to ``bench-results/screenshots/notebook-*.png`` (gitignored;
labextension/README.md).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest
import test_browser_lab as lab_browser  # skips this module too where Chromium is missing
from test_browser_lab import (
    CHROMIUM,
    CHROMIUM_ARGS,
    Lab,
    LabProcess,
    _run_command,
    _shot,
    _wait_until,
    sync_api,
)

# The same lab as the side panel's browser test: jupyter lab on loopback, token, simulated engine.
lab_process = lab_browser.lab_process
lab = lab_browser.lab

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]
expect = sync_api.expect
NOTEBOOK = "burst.ipynb"
FIRST_CELL = "%load_ext jupyter_infer\n%infer_burst 8\n%infer_panel 8"
LAST_CELL = "import gc\ngc.collect()  # a task exception nobody retrieved would be logged now\nprint('after the panel')"
STDERR = '[data-mime-type="application/vnd.jupyter.stderr"]'


def _write_notebook(process: LabProcess) -> None:
    cells = [{"cell_type": "code", "execution_count": None, "id": f"cell-{i}", "metadata": {}, "outputs": [],
              "source": source} for i, source in enumerate((FIRST_CELL, LAST_CELL))]
    notebook = {"cells": cells, "metadata": {"kernelspec": {"display_name": "Python 3 (ipykernel)",
                                                            "language": "python", "name": "python3"}},
                "nbformat": 4, "nbformat_minor": 5}
    (process.home / NOTEBOOK).write_text(json.dumps(notebook))


@pytest.fixture
def notebook(lab_process: LabProcess, lab: Lab) -> Iterator[tuple[Any, list[str]]]:
    """The notebook open in Chromium with its kernel idle; yields the page and the browser's
    errors (uncaught exceptions and console errors)."""
    _write_notebook(lab_process)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1500, "height": 2100})
        page = context.new_page()
        errors: list[str] = []
        page.on("pageerror", lambda err: errors.append(f"uncaught: {err}"))
        page.on("console", lambda msg: errors.append(f"console: {msg.text}") if msg.type == "error" else None)
        page.goto(f"{lab.url}/lab/tree/{NOTEBOOK}?token={lab.token}")
        page.set_default_timeout(30_000)
        expect.set_options(timeout=30_000)  # a new kernel imports the client and the widgets
        expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(2, timeout=60_000)
        # The kernel is connected: the status bar names it and says it is idle.
        expect(page.locator(".jp-StatusBar-Item", has_text="Python 3 (ipykernel) | Idle")).to_be_visible(timeout=60_000)
        yield page, errors
        expect.set_options(timeout=5_000)  # Playwright's default, for the tests after this one
        context.close()
        browser.close()


def _run_cell(page: Any, index: int) -> Any:
    """Run cell ``index`` as a person does (click into it, Shift+Enter); return the cell."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".jp-InputArea-editor").click()
    page.keyboard.press("Shift+Enter")
    expect(cell.locator(".jp-InputPrompt")).to_have_text(re.compile(r"\[(\*|\d+)\]:"))  # it runs
    return cell


def test_burst_and_panel_in_a_notebook(lab: Lab, notebook: tuple[Any, list[str]]) -> None:
    page, errors = notebook
    cell = _run_cell(page, 0)
    # The burst: its timeline draws 8 rows, then its summary (once: no text output under it).
    burst = cell.locator(".jp-OutputArea-output").first
    expect(burst.locator("g.ji-row")).to_have_count(8)
    expect(burst.locator(".ji-summary")).to_contain_text("8 (8 ok)", timeout=60_000)
    panel = cell.locator(".ji-panel")
    expect(panel).to_be_visible()
    expect(page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).to_be_attached()
    # Printed once: the summary is in the view, with no text output under it.
    expect(cell.locator('.jp-OutputArea-output[data-mime-type^="application/vnd.jupyter.std"]')).to_have_count(0)
    _shot(burst, "notebook-burst.png")

    prompts = panel.locator(".ji-prompt-row")
    expect(prompts).to_have_count(8)
    max_tokens = panel.locator(".widget-text", has_text="max tokens").locator("input")
    max_tokens.fill("400")  # long answers: a run is still going when Cancel is clicked
    max_tokens.press("Enter")
    status = panel.locator(".ji-status")
    send = panel.locator("button", has_text="Send")
    cancel = panel.locator("button", has_text="Cancel")
    answers = panel.locator(".ji-answer")
    streaming = panel.locator(".ji-answer[data-state='streaming']")
    cancelled_at_server = lab.get("infer/metrics")["requests"]["cancelled"]
    for attempt in range(4):
        send.click()
        expect(streaming.first).to_be_attached()
        if attempt == 1:
            # One request by its prompt's ✕: that request stops, the others go on.
            cross = prompts.nth(2).locator("button")
            expect(cross).to_have_attribute("title", "cancel request #3")
            cross.click()
            expect(answers.nth(2)).to_have_attribute("data-state", "cancelled")
            expect(streaming.first).to_be_attached()
            _wait_until(lambda: lab.get("infer/metrics")["requests"]["cancelled"] > cancelled_at_server,
                        15, "the server counts the request cancelled by its ✕")
            _shot(panel, "notebook-panel-one-cancelled.png")
        cancel.click()
        expect(status).to_contain_text(re.compile(r"finished: \d+/8 done.* cancelled"))
        expect(send).to_be_enabled()
    expect(prompts).to_have_count(8)  # the ✕ that cancelled a request removed no prompt

    # The timeline of the last run is drawn; every answer ended (none left streaming).
    expect(panel.locator("g.ji-row")).to_have_count(8)
    expect(streaming).to_have_count(0)
    _shot(panel, "notebook-panel-after-cancels.png")

    # A short run to its end: all eight compact answers show without scrolling the box.
    max_tokens.fill("24")
    max_tokens.press("Enter")
    send.click()
    expect(status).to_contain_text("finished: 8/8 done")
    box = panel.locator(".widget-accordion .widget-vbox").first
    _wait_until(lambda: _fully_visible(box) == 8, 10, "all 8 answers visible in the box")
    answers.nth(0).locator("summary").click()  # a click opens one answer in full
    expect(answers.nth(0).locator("details")).to_have_attribute("open", "")
    _shot(panel, "notebook-panel-done.png")

    # Narrow window: the control rows wrap; no control sticks out of the output area.
    page.set_viewport_size({"width": 900, "height": 2400})
    area = cell.locator(".jp-OutputArea-output").last
    page.wait_for_function("el => el.getBoundingClientRect().width < 860", arg=area.element_handle())
    right = area.bounding_box()["x"] + area.bounding_box()["width"]
    controls = panel.locator("button, input")
    clipped = [controls.nth(i).get_attribute("title") or controls.nth(i).inner_text()
               for i in range(controls.count())
               if controls.nth(i).bounding_box()["x"] + controls.nth(i).bounding_box()["width"] > right + 1]
    assert not clipped, f"controls beyond the output's right edge at 900 px: {clipped}"
    _shot(cell.locator(".jp-OutputArea"), "notebook-panel-900px.png")
    page.set_viewport_size({"width": 1500, "height": 2100})

    # The next cell: its output is there, and nothing anywhere is stderr or an error.
    last = _run_cell(page, 1)
    expect(last.locator(".jp-OutputArea-output")).to_contain_text("after the panel")
    expect(page.locator('.jp-Notebook-ExecutionIndicator[data-status="idle"]')).to_be_attached()
    expect(page.locator(f".jp-Notebook .jp-OutputArea-output{STDERR}")).to_have_count(0)
    expect(page.locator(".jp-Notebook svg.ji-tl-rows")).to_have_count(2)  # the burst's, the panel's
    assert not errors, errors

    # For a person to judge: the same outputs in the dark theme (theme variables only).
    _run_command(page, "Use Theme: JupyterLab Dark")
    expect(page.locator('body[data-jp-theme-light="false"]')).to_have_count(1)
    _shot(panel, "notebook-panel-dark.png")
    assert not errors, errors


def _fully_visible(box: Any) -> int:
    """How many answers lie wholly inside the scroll box's visible area."""
    return box.evaluate(
        """(box, selector) => {
            const b = box.getBoundingClientRect();
            return [...box.querySelectorAll(selector)].filter(el => {
                const r = el.getBoundingClientRect();
                return r.top >= b.top - 1 && r.bottom <= b.bottom + 1;
            }).length;
        }""",
        ".ji-answer",
    )
