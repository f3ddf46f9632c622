"""``InferPanel``: send many prompts at once, watch them stream, see how they were batched.

Everything that changes a widget runs in asyncio tasks on the kernel's own event loop (the
tokens arrive there through ``Client.astream``); redraws are throttled to a few per second
and coalesced with ``hold_sync()``. Nothing here writes to widgets from another thread.
"""

from __future__ import annotations

import asyncio
import html
import time
from typing import Any

import ipywidgets as widgets

from ..client import Client, arrival_times, default_client
from ..errors import InferError
from ..prompts import SAMPLE_PROMPTS
from .run_view import RunView

REDRAW_S = 0.2  # widget updates at most 5 times a second
SERVER_REFRESH_S = 1.0  # fetch the server's batch records at most once a second


class InferPanel(widgets.VBox):
    """Prompts, controls, one live output per request, the batch timeline and a summary.

    ``panel.fill(8)`` loads sample prompts; ``await panel.send()`` runs them (a button
    click does the same without waiting); ``panel.cancel()`` stops a run.
    """

    def __init__(self, client: Client | None = None, prompts: list[str] | None = None, **kwargs: Any) -> None:
        self._client = client
        self._prompt_rows = widgets.VBox()
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
        self.send_button = widgets.Button(description="Send", button_style="primary", icon="play")
        self.cancel_button = widgets.Button(description="Cancel", button_style="warning", icon="stop", disabled=True)
        self.send_button.on_click(lambda _: self.send())
        self.cancel_button.on_click(lambda _: self.cancel())
        self.status = widgets.HTML()
        self.outputs = widgets.VBox(layout=widgets.Layout(max_height="320px", overflow="auto"))
        self.run_view = RunView()

        super().__init__(children=[
            widgets.HTML("<b>jupyter_infer</b> — send prompts together and watch them batch"),
            self._prompt_rows,
            widgets.HBox([add, fill, self.fill_count, clear]),
            widgets.HBox([self.concurrency, self.rate, self.max_tokens, self.temperature]),
            widgets.HBox([self.send_button, self.cancel_button, self.status]),
            self.outputs,
            self.run_view,
        ], **kwargs)
        self._task: asyncio.Task | None = None
        self._texts: list[str] = []
        self._states: list[str] = []
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
        return [row.children[0].value for row in self._prompt_rows.children]

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
        box = widgets.Textarea(text, placeholder="a prompt", rows=1, layout=widgets.Layout(width="90%"))
        remove = widgets.Button(icon="times", tooltip="remove", layout=widgets.Layout(width="36px"))
        row = widgets.HBox([box, remove])
        remove.on_click(lambda _: self.remove_prompt(list(self._prompt_rows.children).index(row)))
        return row

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
        self._task = loop.create_task(self._run())
        return self._task

    def cancel(self) -> None:
        """Stop the run: the server cancels every request still queued or running."""
        if self.running:
            self._task.cancel()

    async def _run(self) -> None:
        prompts = [p for p in self.prompts if p.strip()]
        if not prompts:
            self.status.value = "Add a prompt first."
            return
        params = {"max_tokens": self.max_tokens.value, "temperature": self.temperature.value}
        n = len(prompts)
        self._texts = [""] * n
        self._states = ["waiting"] * n
        self.outputs.children = [widgets.HTML() for _ in prompts]
        self._dirty = set(range(n))
        view = self.run_view
        view.reset()
        for i, prompt in enumerate(prompts):
            view.track(f"#{i + 1}", f"#{i + 1} {prompt[:22]}")
        delays = arrival_times(n, self.rate.value or None, seed=int(time.time()))
        gate = asyncio.Semaphore(self.concurrency.value or n)
        self.send_button.disabled, self.cancel_button.disabled = True, False
        redraws = asyncio.get_running_loop().create_task(self._redraw_loop())
        tasks = [asyncio.ensure_future(self._one(i, prompt, delays[i], gate, params)) for i, prompt in enumerate(prompts)]
        try:
            await asyncio.gather(*tasks)
        except asyncio.CancelledError:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
        finally:
            redraws.cancel()
            self.send_button.disabled, self.cancel_button.disabled = False, True
            try:
                await view.arefresh(self.client)
            except InferError as err:
                self.status.value = f"<span style='color:#c00'>{html.escape(err.message)}</span>"
            self._redraw(final=True)

    async def _one(self, i: int, prompt: str, delay: float, gate: asyncio.Semaphore, params: dict[str, Any]) -> None:
        key = f"#{i + 1}"
        await asyncio.sleep(delay)
        async with gate:
            stream = self.client.astream(prompt, **params)
            self.run_view.record(key, queued_at=time.time(), outcome="queued")
            self._states[i] = "queued"
            outcome = "cancelled"
            try:
                async for _ in stream:
                    if self._states[i] == "queued":
                        self._states[i] = "streaming"
                        self.run_view.record(key, id=stream.id, first_token_at=stream.first_token_at,
                                              outcome="running")
                    self._texts[i] = stream.text  # the stream keeps the text: no second copy per token
                    self._dirty.add(i)
                self._states[i] = "done"
                outcome = "ok"
            except asyncio.CancelledError:
                self._states[i] = "cancelled"
                raise
            except InferError as err:
                self._states[i] = f"error: {err.message}"
                outcome = "error"
            finally:
                self._dirty.add(i)
                self.run_view.record(key, finished_at=time.time(), tokens=stream.tokens, outcome=outcome)

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
                    self.outputs.children[i].value = _output_html(i, self._states[i], self._texts[i])
            self.run_view.redraw()
            done = sum(s == "done" for s in self._states)
            streaming = sum(s == "streaming" for s in self._states)
            word = "finished" if final else "running"
            self.status.value = f"{word}: {done}/{len(self._states)} done, {streaming} streaming"


def _output_html(i: int, state: str, text: str) -> str:
    colour = {"done": "#2a7", "streaming": "#37c", "queued": "#999", "waiting": "#bbb"}.get(state, "#c33")
    return (
        f"<div style='border-left:3px solid {colour};padding:2px 6px;margin:2px 0'>"
        f"<b>#{i + 1}</b> <small style='color:{colour}'>{html.escape(state)}</small>"
        f"<div style='white-space:pre-wrap;font-family:var(--jp-code-font-family,monospace);font-size:12px'>"
        f"{html.escape(text)}</div></div>"
    )
