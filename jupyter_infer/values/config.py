"""One source for the service's configuration: every knob, its default and its check.

``InferApp``'s traits take their defaults from here, the embedded client uses the same
defaults, and ``ServiceConfig`` resolves what depends on other knobs (``max_batch_size=0``
picks for the mode) in one place. A bad value raises ``ValueError`` with a message that
names the ``InferApp`` option to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

ENGINES = ("auto", "hf", "simulated", "openai", "router")
LOCAL_ENGINES = ("auto", "hf", "simulated")  # engines that run the model in this process
ROUTER_POLICIES = ("sensitivity", "complexity")  # built in; "module:function" names a callable
MODES = ("continuous", "window")
DTYPES = ("auto", "float32", "bfloat16", "float16")
QUANTIZE = ("none", "int8", "int4")
# How a model writes tool calls (constraints/tool_formats.FORMATS; "": its chat template says).
TOOL_CALL_FORMATS = ("", "hermes", "llama3_json", "mistral", "granite", "pythonic")
SPECULATIVE = ("auto", "ngram", "draft", "off")
DEFAULT_MODEL = "sshleifer/tiny-gpt2"
# Measured best on CPU (docs/benchmark.md): the classic batcher closes at 16, continuous
# batching keeps gaining up to 32 rows.
DEFAULT_BATCH_SIZE = {"window": 16, "continuous": 32}
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")
_BACKEND_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
_CALLABLE = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_]\w*")


@dataclass(frozen=True)
class ServiceConfig:
    # -- the engine ---------------------------------------------------------------------------
    engine: str = "auto"
    model: str = DEFAULT_MODEL
    device: str = "auto"
    dtype: str = "auto"
    num_threads: int = 0  # 0: pick for this machine
    # CPU linears: reorder weights once into our kernel's blocks, or oneDNN's (docs/engine.md)
    prepack_weights: bool = True
    quantize: str = "none"  # "int8" (q8_0's form) or "int4" (q4_0's), groups of 32, our kernels: x86 CPU; docs/engine.md
    seed: int = 0
    # The checkpoint's generation config sets the sampling an OpenAI request leaves out
    generation_defaults: bool = True
    split_reasoning: bool = True  # a reasoning model's <think> section as reasoning_content
    tool_call_format: str = ""  # how the model writes tool calls; "": its chat template says
    simulated_token_delay_ms: tuple[float, float] = (10.0, 40.0)
    simulated_prefill_ms_per_token: float = 0.2
    # -- scheduling -----------------------------------------------------------------------------
    mode: str = "continuous"
    batch_window_ms: float = 50.0
    max_batch_size: int = 0  # 0: DEFAULT_BATCH_SIZE[mode]
    max_queue_size: int = 256
    max_new_tokens: int = 512
    max_prompt_tokens: int = 32768  # the models users run read 32k; an agent's tools and system prompt take ~10k
    max_prefill_tokens: int = 4096
    idle_admit_delay_ms: float = 5.0
    # A longer prompt is prefilled in chunks of this many tokens, between decode steps of the
    # running rows (continuous mode); 0 prefills every prompt whole; None: the engine's own
    # choice (hf: 64 on a CPU, measured in docs/engine.md; 512 on a GPU).
    prefill_chunk_tokens: int | None = None
    # -- speculative decoding: draft tokens verified in the decode step (engine/ngram.py) --------
    # "auto": "draft" with a draft_model, else "ngram" (prompt lookup); "off"
    speculative: str = "auto"
    draft_model: str = ""  # a smaller model with the model's tokenizer that guesses (engine/draft_model.py)
    speculative_tokens: int = 16  # most draft tokens a row proposes a step (fewer when many rows guess)
    speculative_max_rows: int = 8  # no drafts while more rows than this decode (measured: docs/engine.md)
    # -- many users: fair share and per-owner limits (an owner is the Jupyter or hub user) -------
    fair_share: bool = True  # rows shared between owners (fair.py); False: priority + FIFO for all
    # Weights of owners against each other: "alice": 2, or "group:staff": 4 (a hub group); default 1
    fair_share_weights: Mapping[str, float] = field(default_factory=dict, hash=False)
    owner_max_running: int = 0  # rows one owner holds at once (the rest of its requests wait); 0: no cap
    owner_max_queued: int = 0  # requests one owner may have waiting (more: 429); 0: only max_queue_size
    owner_tokens_per_minute: int = 0  # prompt + generated tokens per owner per minute (more: 429); 0: none
    admin_users: tuple[str, ...] = ()  # see everyone's requests in full (as do hub admins)
    # -- the engine's prefix cache --------------------------------------------------------------
    prefix_cache_mb: float = 512.0  # KV of recent prompt prefixes, reused by later prompts; 0: off
    # -- structured outputs ---------------------------------------------------------------------
    grammar_timeout_s: float = 10.0  # a constraint that takes longer to compile is refused (400)
    # Tokens a grammar allows no alternative to are appended without sampling (a step for many)
    grammar_fast_forward: bool = True
    # -- records and live events -----------------------------------------------------------------
    keep_records: int = 1000
    max_event_subscribers: int = 64
    event_buffer: int = 2048  # events a live subscriber may fall behind before it loses some
    # -- engine = "openai": an upstream OpenAI-compatible server ----------------------------------
    upstream_url: str = ""  # base URL, e.g. http://vllm:8000/v1
    upstream_model: str = ""  # "": the first id of the upstream's v1/models
    upstream_api_key: str = field(default="", repr=False)  # never logged, never in status
    upstream_api_key_env: str = ""  # or: the environment variable that holds the key
    upstream_timeout_s: float = 60.0  # for the first token (retries included), then between chunks
    upstream_retries: int = 2  # retries before the first token, with backoff
    # -- engine = "router": named backends and the rule that picks one per request -------------
    # repr=False: a backend's options may hold an upstream_api_key
    router_backends: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, hash=False, repr=False)
    router_default: str = ""  # "": the first backend
    router_policies: tuple[str, ...] = ("sensitivity", "complexity")
    router_sensitive_patterns: tuple[str, ...] = ()
    router_private_backend: str = ""  # "": the first backend that runs in this process
    router_complex_backend: str = ""  # "": the first openai backend
    router_complex_prompt_tokens: int = 1024
    router_complex_max_tokens: int = 512
    router_fallback: Mapping[str, str] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        def fail(name: str, rule: str) -> None:
            raise ValueError(f"InferApp.{name} must be {rule}; got {getattr(self, name)!r}.")

        _set(self, "device", self.device.strip().lower())
        _set(self, "model", self.model.strip())
        _set(self, "simulated_token_delay_ms", tuple(self.simulated_token_delay_ms))
        _set(self, "upstream_url", self.upstream_url.strip().rstrip("/"))
        _set(self, "router_policies", tuple(self.router_policies))
        _set(self, "router_sensitive_patterns", tuple(self.router_sensitive_patterns))
        _set(self, "router_backends", {str(k): dict(v) if isinstance(v, Mapping) else v
                                       for k, v in dict(self.router_backends).items()})
        _set(self, "router_fallback", dict(self.router_fallback))
        _set(self, "fair_share_weights", {str(k): v for k, v in dict(self.fair_share_weights).items()})
        _set(self, "admin_users", tuple(self.admin_users))
        if self.engine not in ENGINES:
            fail("engine", f"one of {', '.join(ENGINES)}")
        if self.mode not in MODES:
            fail("mode", f"one of {', '.join(MODES)}")
        if self.dtype not in DTYPES:
            fail("dtype", f"one of {', '.join(DTYPES)}")
        if self.quantize not in QUANTIZE:
            fail("quantize", f"one of {', '.join(QUANTIZE)}")
        if self.tool_call_format not in TOOL_CALL_FORMATS:
            fail("tool_call_format", f"one of {', '.join(map(repr, TOOL_CALL_FORMATS))}")
        _set(self, "draft_model", self.draft_model.strip())
        if self.speculative not in SPECULATIVE:
            fail("speculative", f"one of {', '.join(SPECULATIVE)}")
        if self.speculative == "draft" and not self.draft_model:
            raise ValueError("InferApp.speculative = 'draft' needs InferApp.draft_model: a smaller model "
                             "with the model's tokenizer.")
        for name in ("speculative_tokens", "speculative_max_rows"):
            if getattr(self, name) < 0:
                fail(name, "0 or more")
        if not _DEVICE.fullmatch(self.device):
            fail("device", "auto, cpu, cuda, cuda:N or mps")
        if not self.model:
            raise ValueError("InferApp.model is empty: give a Hugging Face model id or a directory.")
        for name in ("max_queue_size", "max_new_tokens", "max_prompt_tokens", "max_prefill_tokens",
                     "keep_records", "max_event_subscribers", "event_buffer"):
            if getattr(self, name) < 1:
                fail(name, "at least 1")
        for name in ("owner_max_running", "owner_max_queued", "owner_tokens_per_minute"):
            if getattr(self, name) < 0:
                fail(name, "0 (no limit) or more")
        for key, weight in self.fair_share_weights.items():
            if isinstance(weight, bool) or not isinstance(weight, (int, float)) or not 0 < weight < math.inf:
                raise ValueError(f"InferApp.fair_share_weights[{key!r}] must be a number above 0; got {weight!r}.")
        if self.max_batch_size < 0:
            fail("max_batch_size", "0 (pick for the mode) or more")
        if self.num_threads < 0:
            fail("num_threads", "0 (auto) or more")
        if self.prefill_chunk_tokens is not None and self.prefill_chunk_tokens < 0:
            fail("prefill_chunk_tokens", "0 (prefill prompts whole) or more")
        if not 0 < self.grammar_timeout_s < math.inf:
            fail("grammar_timeout_s", "above 0")
        for name in ("batch_window_ms", "idle_admit_delay_ms", "simulated_prefill_ms_per_token", "prefix_cache_mb"):
            if not getattr(self, name) >= 0 or math.isinf(getattr(self, name)):  # NaN fails too
                fail(name, "0 or more")
        low_high = self.simulated_token_delay_ms
        if len(low_high) != 2 or not 0 <= low_high[0] <= low_high[1]:
            fail("simulated_token_delay_ms", "two numbers [low, high] with 0 <= low <= high")
        if not self.upstream_timeout_s > 0 or math.isinf(self.upstream_timeout_s):
            fail("upstream_timeout_s", "above 0")
        if self.upstream_retries < 0:
            fail("upstream_retries", "0 or more")
        if self.engine == "openai" and not re.match(r"https?://[^/]", self.upstream_url):
            raise ValueError(
                "InferApp.upstream_url must be the http(s) base URL of an OpenAI-compatible server "
                f"(e.g. http://vllm:8000/v1) when engine is 'openai'; got {self.upstream_url!r}."
            )
        if self.engine == "router":
            self.backend_configs()  # every backend checks its own options

    # -- the router's backends --------------------------------------------------------------
    def backend_configs(self) -> dict[str, ServiceConfig]:
        """Each router backend's configuration: this one, with the backend's options over it.
        Raises ``ValueError`` naming what to fix."""
        backends = self.router_backends
        if not backends:
            raise ValueError(
                "InferApp.router_backends is empty: name at least one backend, e.g. "
                "{'local': {'engine': 'simulated'}, 'cluster': {'engine': 'openai', "
                "'upstream_url': 'http://vllm:8000/v1'}}."
            )
        own = {f.name for f in fields(ServiceConfig) if not f.name.startswith("router_")}
        configs = {}
        for name, options in backends.items():
            where = f"InferApp.router_backends[{name!r}]"
            if not _BACKEND_NAME.fullmatch(name):
                raise ValueError(f"{where}: a backend name is letters, digits, '_', '.' or '-'.")
            if not isinstance(options, Mapping) or options.get("engine") not in ENGINES[:-1]:
                raise ValueError(
                    f"{where} must be a dict of InferApp options with an 'engine' among "
                    f"{', '.join(ENGINES[:-1])}; got {options!r}."
                )
            unknown = sorted(set(options) - own)
            if unknown:
                raise ValueError(f"{where}: unknown option(s) {', '.join(unknown)}.")
            try:
                configs[name] = replace(self, **options,
                                        router_backends={}, router_fallback={})
            except (TypeError, ValueError) as err:
                raise ValueError(f"{where}: {err}") from None
        names = list(configs)
        for knob in ("router_default", "router_private_backend", "router_complex_backend"):
            value = getattr(self, knob)
            if value and value not in configs:
                raise ValueError(f"InferApp.{knob} is {value!r}, not a backend; backends: {', '.join(names)}.")
        for source, target in self.router_fallback.items():
            if source not in configs or target not in configs or source == target:
                raise ValueError(
                    f"InferApp.router_fallback maps a backend to another backend; {source!r} -> "
                    f"{target!r} is not that (backends: {', '.join(names)})."
                )
        for policy in self.router_policies:
            if policy not in ROUTER_POLICIES and not _CALLABLE.fullmatch(policy):
                raise ValueError(
                    f"InferApp.router_policies: {policy!r} is none of {', '.join(ROUTER_POLICIES)} "
                    "nor a callable named 'module:function'."
                )
        for pattern in self.router_sensitive_patterns:
            try:
                re.compile(pattern)
            except re.error as err:
                raise ValueError(f"InferApp.router_sensitive_patterns: {pattern!r} is not a regular expression ({err}).") from None
        for knob in ("router_complex_prompt_tokens", "router_complex_max_tokens"):
            if getattr(self, knob) < 1:
                raise ValueError(f"InferApp.{knob} must be at least 1; got {getattr(self, knob)!r}.")
        return configs

    @property
    def batch_size(self) -> int:
        """``max_batch_size`` with 0 resolved for the mode."""
        return self.max_batch_size or DEFAULT_BATCH_SIZE[self.mode]

    @property
    def speculation(self) -> str:
        """``speculative`` with "auto" resolved: "draft" with a draft model, else "ngram"."""
        if self.speculative == "auto":
            return "draft" if self.draft_model else "ngram"
        return self.speculative

    @classmethod
    def default(cls, name: str) -> Any:
        """The default of one knob (``InferApp``'s traits take theirs from here)."""
        f = next(f for f in fields(cls) if f.name == name)
        return f.default_factory() if f.default is MISSING else f.default


def _set(config: ServiceConfig, name: str, value: Any) -> None:
    object.__setattr__(config, name, value)  # normalising a frozen dataclass in __post_init__


def normalize_url(url: str) -> str:
    """``127.0.0.1:8888/base`` → ``http://127.0.0.1:8888/base/``."""
    url = url.strip()
    if "://" not in url:
        url = "http://" + url
    return url if url.endswith("/") else url + "/"
