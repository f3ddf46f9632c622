"""IPython magics: ``%load_ext jupyter_infer`` gives ``%infer``, ``%%infer``, ``%infer_panel``,
``%infer_burst`` and ``%infer_status``.

They use one client per kernel (``jupyter_infer.kernel.client.default_client``): the Jupyter server
that runs this kernel, found by itself, or whatever ``JUPYTER_INFER_URL``/``TOKEN`` name.
Errors a user can hit print as one short line, not a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import re
import sys
import time
from collections.abc import Callable
from concurrent.futures import wait
from queue import SimpleQueue
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from ..errors import InferError
from ..values.prompts import SAMPLE_PROMPTS
from .client import Client, Completion, TokenStream, arrival_times, default_client
from .status_view import models_bundle, ms, status_bundle

STREAM_REDRAW_S = 0.1  # the streamed output is redrawn at most 10 times a second
BURST_POLL_S = 0.4


class Interrupted(KeyboardInterrupt):
    """A magic interrupted by the user; IPython shows ``_render_traceback_``'s lines for it."""

    def _render_traceback_(self) -> list[str]:
        return ["jupyter_infer: interrupted; the server cancels the request."]


def _short_errors(func: Callable[..., Any]) -> Callable[..., Any]:
    """Print an ``InferError`` as one readable line instead of a traceback."""

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except InferError as err:
            print(f"jupyter_infer: {err.message}", file=sys.stderr)
        except KeyboardInterrupt:
            # Still an interrupt (a "run all" stops here, as at any interrupted cell), shown as
            # its one line instead of a KeyboardInterrupt traceback under it.
            raise Interrupted() from None
        return None

    return wrapper


def split_options(line: str) -> tuple[str, str]:
    """Split ``--max-tokens 20 --no-stream What is a KV cache?`` into options and the prompt.

    Options are leading ``-``/``--`` words (with a value unless they are flags); ``--`` ends
    them. The prompt keeps its own spacing and quotes.
    """
    flags = {"--no-stream", "--chat", "--help", "-h"}
    rest = line.lstrip()
    options: list[str] = []
    while rest.startswith("-"):
        word, _, after = rest.partition(" ")
        if word == "--":
            rest = after.lstrip()
            break
        if not word.startswith("--") and len(word) > 1 and word[1].isdigit():
            break  # a negative number is prompt text
        options.append(word)
        rest = after.lstrip()
        if word not in flags and "=" not in word:
            value, rest = _option_value(rest)
            options.append(value)
    return " ".join(options), rest


def _option_value(rest: str) -> tuple[str, str]:
    """An option's value at the start of ``rest`` (a word, or a quoted phrase kept quoted for
    the option parser: ``--system "Answer in one line."``) and what follows it."""
    quote = rest[:1]
    if quote in ("'", '"') and (end := rest.find(quote, 1)) != -1:
        return rest[: end + 1], rest[end + 1:].lstrip()
    value, _, after = rest.partition(" ")
    return value, after.lstrip()


def _stream_into_display(stream: TokenStream) -> None:
    """Stream a completion into one display that is updated in place."""
    handle = display({"text/plain": "…"}, raw=True, display_id=True)
    last = 0.0
    try:
        for _ in stream:
            now = time.monotonic()
            if now - last >= STREAM_REDRAW_S:
                last = now
                handle.update({"text/plain": stream.text + " ▌"}, raw=True)
    except BaseException:
        handle.update({"text/plain": stream.text}, raw=True)  # no placeholder or cursor left behind
        raise
    footer = (
        f"[{stream.tokens} tokens · first token {stream.ttft_ms:.0f} ms · "
        f"total {stream.total_ms / 1000:.2f} s · {stream.id}]"
        if stream.ttft_ms is not None and stream.total_ms is not None else f"[{stream.id}]"
    )
    completion = stream.completion
    handle.update({"text/plain": f"{stream.text}\n\n{footer}{_simulated_note(completion)}"}, raw=True)


def _show_completion(result: Completion) -> None:
    footer = (
        f"[{result.completion_tokens} tokens · {result.finish_reason} · first token "
        f"{ms(result.ttft_ms)} · total {ms(result.total_ms)} · batch #{result.batch_id} "
        f"of {result.batch_size} · {result.id}]"
    )
    display({"text/plain": f"{result.text}\n\n{footer}{_simulated_note(result)}"}, raw=True)


def _simulated_note(result: Completion | None) -> str:
    """A fluent answer from no model is said to be one, in the cell itself (the side panel's
    badge alone went unseen)."""
    if result is None or result.model != "simulated":
        return ""
    return ("\n[simulated engine: no model wrote this (sample text for trying the server). %infer_status "
            "says why; load a model with %infer_model NAME]")


@magics_class
class InferMagics(Magics):
    """The jupyter_infer magics; one client per kernel."""

    def __init__(self, shell: Any, client: Client | None = None) -> None:
        super().__init__(shell)
        self._client = client

    @property
    def client(self) -> Client:
        if self._client is None:
            self._client = default_client()
        return self._client

    @magic_arguments()
    @argument("--max-tokens", type=int, default=None, help="most tokens to generate (server default: 64)")
    @argument("--temperature", type=float, default=None, help="0 = greedy (default); up to 2")
    @argument("--seed", type=int, default=None, help="sampling seed, for repeatable answers")
    @argument("--no-stream", action="store_true", help="wait for the whole answer, then show it with its batch")
    @argument("--chat", action="store_true",
              help="send the prompt as a user's message, through the model's chat template")
    @argument("--system", default=None, help="with --chat: a system message first")
    @argument("prompt", nargs="*", help="the prompt (line magic); for %%%%infer the cell body is the prompt")
    @line_cell_magic
    @_short_errors
    def infer(self, line: str, cell: str | None = None) -> None:
        """Complete a prompt with the inference engine; tokens stream into the output.

        Line magic, options first, then the prompt::

            %infer What is dynamic batching?
            %infer --max-tokens 32 --seed 1 Explain the KV cache
            %infer --chat --system "Answer in one line." What is a KV cache?

        Cell magic, the options on the first line, the cell is the prompt::

            %%infer --max-tokens 64 --temperature 0.7
            Explain speculative decoding
            in two sentences.

        The answer streams into one output that updates in place, then shows how many tokens
        came, the time to the first token and the total. With ``--no-stream`` it shows the
        whole answer at once, with the batch it ran in. The engine is the Jupyter server that
        runs this kernel (or ``JUPYTER_INFER_URL``); see ``%infer_status``.
        """
        options, prompt = (line, cell) if cell is not None else split_options(line)
        args = parse_argstring(self.infer, options)
        if cell is not None and args.prompt:
            raise UsageError("%%infer takes options on its first line; the prompt is the cell body.")
        prompt = prompt.strip()
        if not prompt:
            raise UsageError("Give a prompt: `%infer What is a KV cache?`, or a %%infer cell with text.")
        params = {"max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed}
        if args.system is not None and not args.chat:
            raise UsageError("--system is a chat's system message: give --chat too.")
        chat = ([{"role": "system", "content": args.system}] if args.system else []) + [
            {"role": "user", "content": prompt}] if args.chat else None
        if args.no_stream:
            _show_completion(self.client.chat(chat, **params) if chat else self.client.generate(prompt, **params))
        else:
            _stream_into_display(self.client.stream_chat(chat, **params) if chat
                                 else self.client.stream(prompt, **params))

    @magic_arguments()
    @argument("--quantize", default=None, help="load it as int4, int8, bf16 or none")
    @argument("--unload", action="store_true", help="unload the model (the next request loads it again)")
    @argument("model", nargs="?", default=None,
              help="the model to load: a listed id, a folder, a .gguf file or a Hugging Face id")
    @line_magic
    @_short_errors
    def infer_model(self, line: str = "") -> None:
        """List the models this machine can serve and which is loaded; load one in place of it.

            %infer_model                          # the list
            %infer_model ~/models/qwen2.5-0.5b    # load it (the kernels keep running)
            %infer_model qwen2.5:0.5b --quantize int4
            %infer_model --unload
        """
        args = parse_argstring(self.infer_model, line)
        client = self.client
        if args.unload:
            answer = client.unload_model()
        elif args.model:
            print(f"jupyter_infer: loading {args.model}…")  # progress, not an error: stdout
            answer = client.load_model(args.model, **({"quantize": args.quantize} if args.quantize else {}))
        else:
            answer = client.models()
        display(models_bundle(answer), raw=True)

    @line_magic
    @_short_errors
    def infer_panel(self, line: str = "") -> Any:
        """Show the inference panel: prompts, controls, live outputs, batch timeline, summary.

        ``%infer_panel`` (empty), ``%infer_panel 8`` (filled with 8 sample prompts).
        """
        from .widgets import InferPanel

        panel = InferPanel(self.client)
        if line.strip():
            try:
                panel.fill(int(line.strip()))
            except ValueError:
                raise UsageError("%infer_panel takes an optional number of sample prompts.") from None
        display(panel)

    @magic_arguments()
    @argument("n", type=int, help="how many prompts (sample prompts, cycled)")
    @argument("--rate", type=float, default=None,
              help="Poisson arrivals at this many requests per second (default: all at once)")
    @argument("--max-tokens", type=int, default=32, help="most tokens per answer (default 32)")
    @argument("--seed", type=int, default=0, help="seed of the arrival times")
    @line_magic
    @_short_errors
    def infer_burst(self, line: str) -> Any:
        """Send N prompts at once (or as Poisson arrivals) and show how they were batched.

        ``%infer_burst 16`` sends 16 sample prompts together; ``%infer_burst 32 --rate 20
        --max-tokens 48`` spreads them as Poisson arrivals at 20 requests/s. The batch
        timeline draws one row per request (queued, prefill, decoding; colour = batch) and
        updates while the burst runs, with a summary under it (TTFT and latency p50/p95,
        tokens/s, mean batch size, batch-size histogram; where widgets do not render, the
        output's text is that summary). Returns nothing; the view is in ``_infer_burst``.
        """
        from .widgets import RunView

        args = parse_argstring(self.infer_burst, line)
        if args.n < 1:
            raise UsageError("%infer_burst needs N >= 1.")
        prompts = [SAMPLE_PROMPTS[i % len(SAMPLE_PROMPTS)] for i in range(args.n)]
        client = self.client
        view = RunView(title=f"burst of {args.n}" + (f" at {args.rate:g}/s" if args.rate else ", all at once"))
        for i, prompt in enumerate(prompts):
            view.track(f"#{i + 1}", f"#{i + 1} {prompt}")
        handle = display(view, display_id=True)
        facts: SimpleQueue[tuple[int, dict[str, Any]]] = SimpleQueue()  # filled on the client's I/O thread
        future = client.submit(_burst(client, prompts, args.rate, args.seed, {"max_tokens": args.max_tokens}, facts))
        try:
            while not future.done():
                # Widgets change only here, on the kernel's thread; the burst runs on the client's.
                wait([future], timeout=BURST_POLL_S)
                _observe(view, facts)
                try:
                    view.refresh(client)
                except InferError:
                    view.redraw()
            errors = future.result()
        except BaseException:
            future.cancel()
            raise
        _observe(view, facts)
        view.refresh(client)
        self.shell.user_ns["_infer_burst"] = view
        handle.update(view)  # the same widget; its text (nbconvert, terminals) now holds the summary
        if errors:
            print(f"jupyter_infer: {len(errors)} of {args.n} requests failed: {errors[0]}", file=sys.stderr)

    @line_magic
    @_short_errors
    def infer_status(self, line: str = "") -> None:
        """Show where requests go (server or embedded), the engine, model, device, mode, the
        queue and the main metrics."""
        client = self.client
        status = client.status()
        metrics = client.metrics()
        display(status_bundle(client, status, metrics), raw=True)


async def _burst(
    client: Client, prompts: list[str], rate: float | None, seed: int, params: dict[str, Any],
    facts: SimpleQueue[tuple[int, dict[str, Any]]],
) -> list[str]:
    """Stream every prompt (at once, or as Poisson arrivals), reporting to ``facts`` what each
    request's row learns as it learns it: sent, its id and first token, its end. Streams, not
    ``generate``: the rows of a live timeline then hold facts, not guesses. Returns the errors."""
    delays = arrival_times(len(prompts), rate, seed)

    async def one(i: int, prompt: str) -> str | None:
        await asyncio.sleep(delays[i])
        stream = client.astream(prompt, **params)
        facts.put((i, {"queued_at": time.time()}))
        try:
            async for _ in stream:
                if stream.fragments == 1:
                    facts.put((i, {"id": stream.id, "first_token_at": stream.first_token_at, "outcome": "running"}))
                facts.put((i, {"tokens": stream.tokens}))  # tokens/s so far
        except InferError as err:
            facts.put((i, {"id": stream.id, "finished_at": time.time(), "outcome": "error"}))
            return err.message
        result = stream.completion
        facts.put((i, {"id": result.id, "finished_at": result.received_at, "tokens": result.completion_tokens,
                       "outcome": "cancelled" if result.finish_reason == "cancelled" else "ok"}))
        return None

    return [e for e in await asyncio.gather(*(one(i, p) for i, p in enumerate(prompts))) if e]


def _observe(view: Any, facts: SimpleQueue[tuple[int, dict[str, Any]]]) -> None:
    """Record the facts that came in since the last call."""
    while not facts.empty():
        i, fields = facts.get()
        view.record(f"#{i + 1}", **fields)


MAGIC_NAMES = ("infer", "infer_burst", "infer_model", "infer_panel", "infer_status")
# One of our line magics whose argument ends in "?": a question, not a help request.
_ASKING = re.compile(r"(?P<indent>[ \t]*)%(?P<name>{})[ \t]+(?P<args>.*[^?\s].*\?)[ \t]*".format("|".join(MAGIC_NAMES)))
_TRIPLE_QUOTE = re.compile("\"{3}|'{3}")


def questions_are_prompts(lines: list[str]) -> list[str]:
    """An input transformer: ``%infer What is dynamic batching?`` asks the question.

    IPython reads any line that ends in ``?`` as a help request (``%infer What is X?`` would
    look up ``X``); questions end in ``?``. This cleanup transform runs before IPython's own
    and turns such a line of ours into the call IPython makes for ``%infer …``, so it is not
    read as help; ``%infer?`` and ``%infer??`` (nothing between) still show the help. Lines
    inside a triple-quoted string are left alone.
    """
    out = []
    in_string = False
    for line in lines:
        match = None if in_string else _ASKING.fullmatch(line.rstrip("\r\n"))
        if match:
            line = f"{match['indent']}get_ipython().run_line_magic({match['name']!r}, {match['args'].strip()!r})\n"
        elif len(_TRIPLE_QUOTE.findall(line)) % 2:
            in_string = not in_string
        out.append(line)
    return out


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext jupyter_infer``: the magics, and questions that end in ``?``."""
    ipython.register_magics(InferMagics(ipython))
    if questions_are_prompts not in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.append(questions_are_prompts)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext jupyter_infer``: questions ending in ``?`` are help requests again."""
    if questions_are_prompts in ipython.input_transformers_cleanup:
        ipython.input_transformers_cleanup.remove(questions_are_prompts)
