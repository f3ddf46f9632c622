"""What a caller asks for (``Request``) and what comes back (``TokenEvent``, ``RequestResult``).

Validation lives here so that every front (HTTP handlers, the OpenAI routes, the embedded
client) rejects the same bad input with the same message, before anything is enqueued.
"""

from __future__ import annotations

import itertools
import json
import re
import reprlib
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from ..errors import InvalidRequest
from .answer import AnswerPiece

# vLLM has no cap; ours bounds the per-token stop check (lm-eval sends a task's `until`
# strings plus EOS, often 5-10).
MAX_STOP_SEQUENCES = 64
MAX_LOGPROBS = 20  # most alternatives per token a request may ask for (vLLM's default too)
# Each token checks every stop sequence against the text's tail, on the event loop: a long
# one would make every step of the batch slow.
MAX_STOP_CHARS = 256
_counter = itertools.count()
_SURROGATE = re.compile("[\ud800-\udfff]")
_shown = reprlib.Repr()
_shown.maxstring = _shown.maxother = 60  # a value quoted back in an error message stays short
_shown.maxlevel = 3


def show(value: Any) -> str:
    """``repr(value)``, cut short: error messages quote what was sent without echoing a
    megabyte or recursing into a deeply nested value."""
    return _shown.repr(value)


def short(name: str) -> str:
    """A name (a field, a parameter) as sent, cut short for an error message."""
    return name if len(name) <= 60 else show(name)


def brief(message: str, limit: int = 600) -> str:
    """The first line of ``message`` (a library's error, a reason shown in status and the panel),
    cut at a word's end, not inside one, with "…" where it was cut."""
    line = message.strip().splitlines()[0] if message.strip() else ""
    if len(line) <= limit:
        return line
    cut = line[:limit + 1].rsplit(" ", 1)[0] if " " in line[:limit + 1] else line[:limit]
    return cut.rstrip(" ,;:") + "…"


def check_text(text: str, name: str) -> str:
    """Refuse text that is not valid Unicode: a lone surrogate (JSON's ``"\\ud800"``, or
    the bytes ED A0 80) cannot be encoded, tokenized or streamed back."""
    bad = _SURROGATE.search(text)
    if bad is not None:
        raise InvalidRequest(
            f"'{name}' holds a lone surrogate (U+{ord(bad.group()):04X} at character {bad.start()}), "
            "which is not valid Unicode text. Send UTF-8 text; in JSON, a character outside the "
            "Basic Multilingual Plane is a surrogate pair such as \\ud83d\\ude00.", param=name,
        )
    return text


def message_text(message: Mapping[str, Any], index: int = 0) -> str:
    """A chat message's text: its string content, or its text parts joined (``index`` names it
    in errors). Beside ``Request``: the wire's parsers and an engine that reads a chat (the
    simulated one) read a message the same way."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise InvalidRequest(
                    f"messages[{index}].content: only text parts ({{\"type\": \"text\", \"text\": ...}}) "
                    "are supported.", param="messages",
                )
            texts.append(part["text"])
        return "".join(texts)
    raise InvalidRequest(f"messages[{index}].content must be a string.", param="messages")


def new_request_id() -> str:
    return f"req-{uuid.uuid4().hex[:12]}"


ConstraintKind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tools"]


@dataclass(frozen=True)
class Constraint:
    """The answer must match ``spec``: a JSON schema (JSON text, its keys in the order sent,
    which is the order the answer's keys come in; ``{}`` for any object), a regex, a JSON
    list of choices, a grammar (Lark or GBNF) or a tool set (its JSON; the set itself rides on
    the constraint, ``constraints.spec.ToolsConstraint``). ``name`` is the schema's name and
    ``strict`` its flag, as sent (an upstream gets them back); ``param`` is the request field
    it came in (errors name it).
    ``after_reasoning``: a reasoning model's answer may open a ``<think>`` section first
    ("may"), or the prompt opened one ("open"); the constraint applies after it ends."""

    kind: ConstraintKind
    spec: str
    name: str | None = None
    strict: bool | None = None
    param: str | None = field(default=None, compare=False)
    after_reasoning: Literal["", "may", "open"] = ""

    def __post_init__(self) -> None:
        if self.kind == "tools" and not hasattr(self, "tools"):  # no set read back from JSON
            raise TypeError("A tools constraint carries its tool set: constraints.tools.ToolSet.constraint() makes it.")

    @property
    def value(self) -> Any:
        """``spec`` as the client sent it (parsed back from JSON where it is JSON)."""
        return self.spec if self.kind in ("regex", "grammar") else json.loads(self.spec)

    def describe(self) -> str:
        """Its kind as a noun, for error messages ("The JSON schema constraint ...")."""
        return {"json_object": "JSON object", "json_schema": "JSON schema", "regex": "regex",
                "choice": "choice", "grammar": "grammar", "tools": "tools"}[self.kind]


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` means greedy decoding; ``max_tokens=None``
    means as many as fit (the service resolves it before queueing); ``max_tokens=0`` runs
    only the prompt (for its log probabilities).

    The penalties and ``logit_bias`` follow vLLM: ``repetition_penalty`` divides positive
    (multiplies negative) logits of tokens seen in the prompt or output; ``frequency_penalty``
    subtracts per occurrence in the output, ``presence_penalty`` once. ``min_tokens`` masks
    EOS (and defers stop strings) until that many tokens exist; ``ignore_eos`` keeps going
    past EOS. ``logprobs``: ``None`` computes none, ``k`` the chosen token's and ``k``
    alternatives; ``prompt_logprobs`` the same for every prompt token (``echo``).
    """

    max_tokens: int | None = 64
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    min_tokens: int = 0
    ignore_eos: bool = False
    repetition_penalty: float = 1.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    # The answer must match it (``constraints/``): a schema, regex, choice, grammar or tools.
    constraint: Constraint | None = None

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class TokenLogprob:
    """One position's log probability: the token there, its logprob under the model's raw
    distribution (before temperature, penalties or bias, as vLLM's default), and the top
    alternatives ``(token_id, logprob)``, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True)
class Request:
    """What to generate from: a ``prompt``, or chat ``messages`` that the service renders
    with the model's chat template. A value: the service never changes it (``prepare``
    makes the resolved copy it runs), so a router can hand the same request to a fallback."""

    prompt: str
    params: SamplingParams = field(default_factory=SamplingParams)
    messages: list[dict[str, str]] | None = None
    # The chat as the client sent it, where tools are involved (calls, results, ``tools``):
    # what an upstream server gets, to render its own way; ``messages`` is this server's.
    wire_messages: list[dict[str, Any]] | None = None
    # Variables for the chat template, as vLLM's ``chat_template_kwargs`` (Qwen3's
    # ``enable_thinking``); an upstream server gets them as sent.
    chat_template_kwargs: dict[str, Any] | None = None
    # Token ids to run instead of tokenizing ``prompt`` (OpenAI's token-array prompts);
    # the service then fills ``prompt`` with their text.
    prompt_ids: list[int] | None = None
    # Infill: the code after the gap, ``prompt`` being the code before it; the engine's model
    # writes the two with its fill-in-the-middle tokens (``ModelText.infill_prompt``), after
    # ``context_files`` (name, text: the project's other files, llama-server's input_extra).
    suffix: str | None = None
    context_files: tuple[tuple[str, str], ...] = ()
    # An embedding, not an answer: the prompt runs in a step beside the others, and the request
    # ends with its pooled, normalized vector (``RequestResult.embedding``), no token written.
    embed: bool = False
    # A cross-encoder's pair: the second text (a document), ``prompt`` the first (the query);
    # the model reads them as one sequence and its score is the request's one-value embedding.
    pair: str | None = None
    priority: int = 0
    model: str | None = None  # the model (or router backend) the caller named; None: any
    # A rendered chat's prompt opened a reasoning model's <think> section (set where the chat
    # is rendered: loops/tokenizing.render_prompt; the answer's split reads it).
    opened_reasoning: bool = False
    # Who sent it: the Jupyter (or JupyterHub) user the handler authenticated; "local" in a
    # kernel. What fair sharing and per-user views go by.
    owner: str = "local"
    owner_weight: float = 1.0  # its owner's share of the rows against others' (fair_share_weights)
    id: str = field(default_factory=new_request_id)
    arrival: float = field(default_factory=time.monotonic)
    # FIFO tie-break within a priority, immune to equal timestamps.
    order: int = field(default_factory=lambda: next(_counter))


@dataclass(frozen=True)
class TokenEvent:
    """What a step (or an upstream's chunk) added to one answer, as the answer stage read it
    (``loops/answer_stage.py``): the model's text as it wrote it, and the same as pieces of
    reasoning, content and tool calls (a piece that could still turn out to be a call's start,
    or a tag's, waits for the next event)."""

    request_id: str
    index: int  # the answer's tokens so far
    token_id: int
    text: str  # the new text fragment (may be "" while a multi-byte character is incomplete)
    # Only for requests that ask: the log probabilities of the tokens since the previous
    # event (usually one), and the prompt's on the request's first event.
    logprobs: tuple[TokenLogprob, ...] = ()
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = None
    pieces: tuple[AnswerPiece, ...] = ()



def token_usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    """The ``usage`` object of every answer (ours and OpenAI's have the same three counts)."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}

@dataclass(frozen=True)
class RequestResult:
    id: str
    text: str
    finish_reason: str  # "stop" | "length" | "tool_calls" | "cancelled"
    prompt_tokens: int
    completion_tokens: int
    batch_id: int | None
    batch_size: int
    queued_ms: float
    ttft_ms: float | None
    total_ms: float
    token_ids: tuple[int, ...] = field(default=(), repr=False)  # the generated tokens
    prompt_ids: tuple[int, ...] = field(default=(), repr=False)
    prompt_text: str = field(default="", repr=False)
    # Only for requests that ask (``SamplingParams.logprobs`` / ``prompt_logprobs``); the
    # prompt's first entry is None (nothing predicts the first token).
    logprobs: tuple[TokenLogprob, ...] | None = field(default=None, repr=False)
    prompt_logprobs: tuple[TokenLogprob | None, ...] | None = field(default=None, repr=False)
    route: str | None = None  # the router's backend that served it (engine = "router")
    # The answer as the answer stage read it (loops/answer_stage.py), what every dialect
    # renders: a reasoning model's reasoning section (None: it wrote none), the answer's text
    # after it (None: the answer is tool calls), and the calls it makes (OpenAI's
    # ``tool_calls`` entries; cut short by max_tokens, the last one's arguments as far as they
    # got), or None: a text answer, or no tools offered. ``text`` is all of it as written.
    reasoning: str | None = field(default=None, repr=False)
    content: str | None = field(default=None, repr=False)
    tool_calls: tuple[dict[str, Any], ...] | None = field(default=None, repr=False)
    whole_calls: int = 0  # how many of them are whole (after them: one cut short)
    # The stop sequence that ended it, where the answer stage cut one (None: EOS, max_tokens,
    # or an upstream server, which cuts its own and does not say which).
    stop_sequence: str | None = field(default=None, repr=False)
    # An embedding request's vector (``Request.embed``): normalized to length 1.
    embedding: tuple[float, ...] | None = field(default=None, repr=False)

    def to_json(self) -> dict[str, Any]:
        out = {
            "id": self.id,
            "text": self.text,
            "finish_reason": self.finish_reason,
            "usage": token_usage(self.prompt_tokens, self.completion_tokens),
            "batch": {"id": self.batch_id, "size": self.batch_size},
            "timings": {
                "queued_ms": round(self.queued_ms, 2),
                "ttft_ms": None if self.ttft_ms is None else round(self.ttft_ms, 2),
                "total_ms": round(self.total_ms, 2),
            },
        }
        if self.route is not None:
            out["route"] = self.route
        if self.tool_calls and self.whole_calls:  # the whole calls only: one cut short is not callable
            out["tool_calls"] = list(self.tool_calls[: self.whole_calls])
        return out
