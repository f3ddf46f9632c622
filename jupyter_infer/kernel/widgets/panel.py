"""``InferPanel``: send many prompts at once, watch them stream, see how they were batched.

Everything that changes a widget runs in asyncio tasks on the kernel's own event loop (the
tokens arrive there through ``Client.astream``); redraws are throttled to a few per second
and coalesced with ``hold_sync()``. Nothing here writes to widgets from another thread, and
every task the panel starts is awaited or has its outcome read: an error shows in the
panel's status line, never as a "Task exception was never retrieved" log in a later cell.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

import ipywidgets as widgets

from ...errors import InferError
from ...values.prompts import SAMPLE_PROMPTS
from ..client import Client, arrival_times, default_client
from .run_view import RunView

REDRAW_S = 0.2  # widget updates at most 5 times a second
SERVER_REFRESH_S = 1.0  # fetch the server's batch records at most once a second
IN_FLIGHT = ("waiting", "queued", "streaming")
TAIL_CHARS = 240  # a streaming answer shows its newest text
# What the answers are held to ("answer as"): free text, or a constraint the server's grammar
# enforces (the timeline marks those rows, the summary counts them and their forced tokens).
ANSWER_FORMATS: list[tuple[str, dict[str, Any]]] = [
    ("text", {}),
    ("JSON", {"response_format": {"type": "json_object"}}),
    ("JSON schema {answer, confidence}", {"json_schema": {
        "type": "object", "properties": {"answer": {"type": "string"}, "confidence": {"type": "number"}},
        "required": ["answer", "confidence"], "additionalProperties": False}}),
    ("yes / no", {"choice": ["yes", "no"]}),
]

# Theme variables (light and dark), with fallbacks for front ends that have none.
_COLOURS = {
    "done": "var(--jp-success-color1, #2a7)",
    "streaming": "var(--jp-brand-color1, #37c)",
    "queued": "var(--jp-ui-font-color2, #888)",
    "waiting": "var(--jp-ui-font-color3, #aaa)",
    "cancelled": "var(--jp-warn-color1, #c80)",
}
_ERROR_COLOUR = "var(--jp-error-color1, #c33)"
_CSS = """<style>
.ji-panel .ji-wrap { flex-wrap: wrap; gap: 2px 4px; align-items: center; }
.ji-panel .ji-prompt-row .widget-textarea { flex: 1 1 auto; width: auto; min-width: 0; }
.ji-panel .ji-prompt-row textarea { field-sizing: content; max-height: 8.5em; }
.ji-panel .jupyter-widget-Collapse-header { padding: 5px 10px; }
.ji-panel .ji-row-index { flex: 0 0 auto; min-width: 26px; color: var(--jp-ui-font-color2, #777); font-size: 11px; }
.ji-panel .ji-status { flex: 1 1 200px; min-width: 0; }
.ji-panel .jupyter-widget-Collapse-contents { padding: 4px 6px; }
.ji-answer { border-left: 3px solid; padding: 0 6px; margin: 3px 0; font-size: 12px; line-height: 1.45; }
.ji-answer summary { cursor: pointer; list-style: none; }
.ji-answer summary::-webkit-details-marker { display: none; }
.ji-answer-line { overflow: hidden; display: -webkit-box; -webkit-line-clamp: 2; -webkit-box-orient: vertical; }
.ji-answer-head { color: var(--jp-ui-font-color2, #666); font-size: 11px; margin-right: 4px; }
.ji-answer-head b { color: var(--jp-ui-font-color1, #222); }
.ji-answer-text { font-family: var(--jp-code-font-family, monospace); color: var(--jp-content-font-color1, #222); }
.ji-answer-full { white-space: pre-wrap; word-break: break-word; max-height: 260px; overflow: auto; }
.ji-answer details[open] .ji-answer-preview { display: none; }
.ji-answer-more { color: var(--jp-brand-color1, #37c); }
.ji-answer details:not([open]) .ji-answer-more::after { content: "show all ▸"; }
.ji-answer details[open] .ji-answer-more::after { content: "show less ▴"; }
</style>"""


class InferPanel(widgets.VBox):
    """Prompts, controls, one live answer per request, the batch timeline and a summary.

    ``panel.fill(8)`` loads sample prompts; ``await panel.send()`` runs them (a button
    click does the same without waiting); ``panel.cancel()`` stops a run, and
    ``panel.cancel_request(i)`` (a prompt's ✕ during a run) stops one request of it.
    ``panel.answer_format`` ("answer as") holds the answers to JSON, a JSON schema or a choice
    (``ANSWER_FORMATS``); the timeline marks those rows and the summary counts them.
    """

    def __init__(self, client: Client | None = None, prompts: list[str] | None = None, **kwargs: Any) -> None:
        self._client = client
        self._prompt_rows = widgets.VBox()
        wrap = {"layout": widgets.Layout(width="100%")}
        self.fill_count = widgets.BoundedIntText(8, min=1, max=256, layout=widgets.Layout(width="70px"))
        add = widgets.Button(description="Add prompt", icon="plus")
        fill = widgets.Button(description="Fill with samples", icon="list")
        clear = widgets.Button(description="Clear", icon="trash")
        add.on_click(lambda _: self.add_prompt(""))
        fill.on_click(lambda _: self.fill(self.fill_count.value))
        clear.on_click(lambda _: self.set_prompts([]))

        style = {"description_width": "initial"}
        self.concurrency = widgets.BoundedIntText(
            0, min=0, max=1024, description="concurrency (0 = all)", style=style,
            layout=widgets.Layout(width="190px"))
        self.rate = widgets.BoundedFloatText(
            0.0, min=0.0, max=1000.0, step=1.0, description="arrivals/s (0 = at once)", style=style,
            layout=widgets.Layout(width="210px"))
        self.max_tokens = widgets.BoundedIntText(
            48, min=1, max=4096, description="max tokens", style=style, layout=widgets.Layout(width="150px"))
        self.temperature = widgets.BoundedFloatText(
            0.0, min=0.0, max=2.0, step=0.1, description="temperature", style=style,
            layout=widgets.Layout(width="150px"))
        self.answer_format = widgets.Dropdown(
            options=ANSWER_FORMATS, value=ANSWER_FORMATS[0][1], description="answer as", style=style,
            layout=widgets.Layout(width="250px"))
        self.send_button = widgets.Button(description="Send", button_style="primary", icon="play")
        self.cancel_button = widgets.Button(description="Cancel", button_style="warning", icon="stop", disabled=True)
        self.send_button.on_click(lambda _: self.send())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.status = widgets.HTML()
        self.status.add_class("ji-status")
        # Compact answers (two lines each, the whole text a click away), in a collapsible box.
        self.outputs = widgets.VBox(layout=widgets.Layout(max_height="360px", overflow="auto"))
        self.answers = widgets.Accordion(children=[self.outputs], titles=("Answers",), selected_index=None)
        self.answers.layout.display = "none"  # until there are answers
        self.run_view = RunView()

        rows = [
            widgets.HBox([add, fill, self.fill_count, clear], **wrap),
            widgets.HBox([self.concurrency, self.rate, self.max_tokens, self.temperature, self.answer_format], **wrap),
            widgets.HBox([self.send_button, self.cancel_button, self.status], **wrap),
        ]
        for row in rows:
            row.add_class("ji-wrap")
        super().__init__(children=[
            widgets.HTML(_CSS + "<b>jupyter_infer</b> — send prompts together and watch them batch"),
            self._prompt_rows,
            *rows,
            self.answers,
            self.run_view,
        ], **kwargs)
        self.add_class("ji-panel")
        self._task: asyncio.Task | None = None
        self._tasks: list[asyncio.Task] = []
        self._run_rows: list[widgets.HBox] = []  # the prompt row of each request of the run
        self._cancelling = False
        self._texts: list[str] = []
        self._states: list[str] = []
        self._tokens: list[int] = []
        self._dirty: set[int] = set()
        self.set_prompts(prompts or [])

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = default_client()
        return self._client

    @property
    def timeline(self) -> Any:
        return self.run_view.timeline

    # -- the prompt list ------------------------------------------------------------------------
    @property
    def prompts(self) -> list[str]:
        return [_textarea(row).value for row in self._prompt_rows.children]

    def set_prompts(self, prompts: list[str]) -> None:
        self._prompt_rows.children = [self._prompt_row(p) for p in prompts]

    def add_prompt(self, text: str = "") -> None:
        self._prompt_rows.children = [*self._prompt_rows.children, self._prompt_row(text)]

    def remove_prompt(self, index: int) -> None:
        rows = list(self._prompt_rows.children)
        del rows[index]
        self._prompt_rows.children = rows

    def fill(self, n: int = 8) -> None:
        """Replace the prompts with ``n`` sample prompts."""
        self.set_prompts([SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)] for i in range(n)])

    def _prompt_row(self, text: str) -> widgets.HBox:
        index = widgets.HTML()
        index.add_class("ji-row-index")
        box = widgets.Textarea(text, placeholder="a prompt", rows=1)
        button = widgets.Button(icon="times", tooltip="remove this prompt", layout=widgets.Layout(width="36px"))
        row = widgets.HBox([index, box, button], layout=widgets.Layout(width="100%", align_items="center"))
        row.add_class("ji-prompt-row")
        button.on_click(lambda _: self._row_button(row))
        return row

    def _row_button(self, row: widgets.HBox) -> None:
        """A prompt's ✕: stops its request while that is in flight, else removes the prompt."""
        i = self._request_of(row)
        if self.running and i is not None and self._states[i] in IN_FLIGHT:
            self.cancel_request(i)
        elif row in self._prompt_rows.children:
            self.remove_prompt(list(self._prompt_rows.children).index(row))

    def _request_of(self, row: widgets.HBox) -> int | None:
        """The index of the request that the last run sent for this prompt row, if any."""
        return next((i for i, r in enumerate(self._run_rows) if r is row), None)

    # -- running --------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def send(self) -> asyncio.Task:
        """Start a run on the kernel's event loop; returns its task (``await`` it to wait)."""
        if self.running:
            return self._task
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            raise RuntimeError("InferPanel.send() runs on the kernel's event loop: call it in a notebook, "
                               "or 'await panel.send()' in async code.") from None
        self._cancelling = False
        self._task = loop.create_task(self._run())
        self._task.add_done_callback(self._run_ended)
        return self._task

    def cancel(self) -> None:
        """Stop the run: the server cancels every request still queued or running."""
        if self.running and not self._cancelling:
            self._cancelling = True  # a second click must not interrupt the first one's cleanup
            self.cancel_button.disabled = True
            self.status.value = "cancelling…"
            self._task.cancel()

    def cancel_request(self, index: int) -> None:
        """Stop request ``index`` of the running run (closing its stream cancels it on the
        server); the others go on."""
        if self.running and 0 <= index < len(self._tasks) and not self._tasks[index].done():
            self._tasks[index].cancel()

    def _run_ended(self, task: asyncio.Task) -> None:
        # Read the run's outcome, so that a failure is shown here and not logged later.
        if not task.cancelled() and task.exception() is not None:
            self._show_error(task.exception())
            self.send_button.disabled, self.cancel_button.disabled = False, True

    def _show_error(self, err: BaseException) -> None:
        message = err.message if isinstance(err, InferError) else f"{type(err).__name__}: {err}"
        self.status.value = f"<span style='color:{_ERROR_COLOUR}'>{html.escape(message)}</span>"

    async def _run(self) -> None:
        rows = [row for row in self._prompt_rows.children if _textarea(row).value.strip()]
        if not rows:
            self.status.value = "Add a prompt first."
            return
        prompts = [_textarea(row).value for row in rows]
        params = {"max_tokens": self.max_tokens.value, "temperature": self.temperature.value,
                  **self.answer_format.value}
        n = len(prompts)
        self._run_rows = rows
        self._texts, self._states, self._tokens = [""] * n, ["waiting"] * n, [0] * n
        self.outputs.children = [widgets.HTML() for _ in prompts]
        self._dirty = set(range(n))
        with self.hold_sync():
            self._label_rows()
            if self.answers.layout.display == "none":  # the first run: show the answers, open
                self.answers.layout.display = None
                self.answers.selected_index = 0
        view = self.run_view
        view.reset()
        for i, prompt in enumerate(prompts):
            view.track(f"#{i + 1}", f"#{i + 1} {prompt}")
        delays = arrival_times(n, self.rate.value or None, seed=int(time.time()))
        gate = asyncio.Semaphore(self.concurrency.value or n)
        self.send_button.disabled, self.cancel_button.disabled = True, False
        loop = asyncio.get_running_loop()
        redraws = loop.create_task(self._redraw_loop())
        self._tasks = [loop.create_task(self._one(i, prompt, delays[i], gate, params))
                       for i, prompt in enumerate(prompts)]
        try:
            # Each request ends on its own (one cancelled by its ✕ included); a Cancel of the
            # whole run cancels this gather, which cancels every request still running.
            await asyncio.gather(*self._tasks, return_exceptions=True)
        except asyncio.CancelledError:
            await asyncio.gather(*self._tasks, return_exceptions=True)
        finally:
            redraws.cancel()
            (failure,) = await asyncio.gather(redraws, return_exceptions=True)
            self.send_button.disabled, self.cancel_button.disabled = False, True
            try:
                await view.arefresh(self.client)
            except Exception as err:  # the rows stay as the client saw them
                failure = failure if isinstance(failure, Exception) else err
            self._redraw(final=True)
            if isinstance(failure, Exception):
                self._show_error(failure)

    async def _one(self, i: int, prompt: str, delay: float, gate: asyncio.Semaphore, params: dict[str, Any]) -> None:
        key = f"#{i + 1}"
        stream = None
        outcome = "cancelled"
        try:
            await asyncio.sleep(delay)
            async with gate:
                stream = self.client.astream(prompt, **params)
                self.run_view.record(key, queued_at=time.time())
                self._states[i] = "queued"
                self._dirty.add(i)
                async for _ in stream:
                    if self._states[i] == "queued":
                        self._states[i] = "streaming"
                        self.run_view.record(key, id=stream.id, first_token_at=stream.first_token_at,
                                             outcome="running")
                    self._texts[i] = stream.text  # the stream keeps the text: no second copy per token
                    self._tokens[i] = stream.tokens
                    self._dirty.add(i)
                result = stream.completion
                outcome = "cancelled" if result is not None and result.finish_reason == "cancelled" else "ok"
                self._states[i] = "done" if outcome == "ok" else "cancelled"
        except asyncio.CancelledError:
            self._states[i] = "cancelled"
            raise
        except Exception as err:  # a request's failure (or a bug) ends that request only
            self._states[i] = f"error: {err.message if isinstance(err, InferError) else err}"
            outcome = "error"
        finally:
            self._dirty.add(i)
            if stream is not None:
                self._tokens[i] = stream.tokens
                self.run_view.record(key, id=stream.id, finished_at=time.time(), tokens=stream.tokens,
                                     outcome=outcome)
            else:  # never sent
                self.run_view.record(key, outcome=outcome)

    async def _redraw_loop(self) -> None:
        last_fetch = 0.0
        while True:
            await asyncio.sleep(REDRAW_S)
            if time.monotonic() - last_fetch >= SERVER_REFRESH_S:
                last_fetch = time.monotonic()
                try:
                    await self.run_view.afetch(self.client)
                except InferError:
                    pass  # the live rows go on from what the client sees
            self._redraw()

    def _redraw(self, final: bool = False) -> None:
        dirty, self._dirty = self._dirty, set()
        with self.hold_sync():
            for i in sorted(dirty):
                if i < len(self.outputs.children):
                    self.outputs.children[i].value = _answer_html(i, self._states[i], self._texts[i],
                                                                  self._tokens[i])
                    self.run_view.record(f"#{i + 1}", tokens=self._tokens[i])  # tokens/s so far
            if dirty:
                self._label_rows()
            self.run_view.redraw()
            self.status.value = self._status_text(final)
            self.answers.set_title(0, f"Answers ({self._status_text(final, short=True)})")

    def _status_text(self, final: bool, short: bool = False) -> str:
        counts = {s: sum(1 for x in self._states if x == s) for s in ("done", "streaming", "cancelled")}
        failed = sum(1 for x in self._states if x.startswith("error"))
        parts = [f"{counts['done']}/{len(self._states)} done"]
        if counts["streaming"] and not final:
            parts.append(f"{counts['streaming']} streaming")
        parts += [f"{counts['cancelled']} cancelled"] if counts["cancelled"] else []
        parts += [f"{failed} failed"] if failed else []
        text = ", ".join(parts)
        return text if short else f"{'finished' if final else 'running'}: {text}"

    def _label_rows(self) -> None:
        """Number the prompts as their answers are numbered; a prompt's ✕ says what it does."""
        for row in self._prompt_rows.children:
            index, _, button = row.children
            i = self._request_of(row)
            index.value = "" if i is None else f"#{i + 1}"
            live = i is not None and self._states[i] in IN_FLIGHT
            button.tooltip = f"cancel request #{i + 1}" if live else "remove this prompt"


def _textarea(row: widgets.HBox) -> widgets.Textarea:
    return row.children[1]


def _answer_html(i: int, state: str, text: str, tokens: int) -> str:
    """One answer in two lines: its number, state and tokens, then the start of its text (the
    newest text while it streams); a click opens a finished answer to its whole text."""
    colour = _COLOURS.get(state, _ERROR_COLOUR)
    head = (f"<span class='ji-answer-head'><b>#{i + 1}</b> <span style='color:{colour}'>"
            f"{html.escape(state)}</span>{f' · {tokens} tokens' if tokens else ''}</span>")
    box = f"<div class='ji-answer' data-state='{html.escape(state)}' style='border-color:{colour}'>"
    if state in IN_FLIGHT or not text:
        shown = text if len(text) <= TAIL_CHARS else "…" + text[-TAIL_CHARS:]
        return f"{box}<div class='ji-answer-line'>{head}<span class='ji-answer-text'>{html.escape(shown)}</span></div></div>"
    return (
        f"{box}<details><summary><div class='ji-answer-line'>{head}<span class='ji-answer-head ji-answer-more'></span>"
        f"<span class='ji-answer-text ji-answer-preview'>{html.escape(text)}</span></div></summary>"
        f"<div class='ji-answer-text ji-answer-full'>{html.escape(text)}</div></details></div>"
    )
