"""One source for the service's configuration: every knob, its default, its help and its check.

A knob is one line here (``knob(default, help)``): ``InferApp``'s trait of it is made from the
field (``server/config_traits.py``), the embedded client uses the same defaults, and
``ServiceConfig`` resolves what depends on other knobs (``max_batch_size=0`` picks for the
mode) in one place. A bad value raises ``ValueError`` with a message that
names the ``InferApp`` option to fix.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any

ENGINES = ("auto", "hf", "simulated", "openai", "router", "vllm", "llama.cpp", "sglang", "command")
MANAGED_ENGINES = ("vllm", "llama.cpp", "sglang", "command")  # a serving engine started as a child
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


def knob(default: Any = MISSING, help: str = "", *, factory: Callable[[], Any] | None = None,
         **options: Any) -> Any:
    """One configuration knob: its default and the help text its ``InferApp`` trait shows
    (``--help-all``, the config docs); ``factory`` makes a mutable default."""
    if factory is not None:
        return field(default_factory=factory, metadata={"help": help}, **options)
    return field(default=default, metadata={"help": help}, **options)


# Knobs a negative (or infinite, or NaN) value makes no sense for.
_NON_NEGATIVE = ("batch_window_ms", "idle_admit_delay_ms", "simulated_prefill_ms_per_token", "prefix_cache_mb",
                 "prefix_cache_disk_mb")


@dataclass(frozen=True)
class ServiceConfig:
    # -- the engine ---------------------------------------------------------------------------
    engine: str = knob("auto", f"""One of {', '.join(ENGINES)}. Which engine generates tokens: 'hf' (a Hugging Face causal LM through
        transformers), 'simulated' (offline, deterministic, realistic timing), 'auto'
        ('hf' with the configured model; 'simulated' if it cannot load, and status says why),
        'openai' (an upstream OpenAI-compatible server at upstream_url: vLLM, TGI, SGLang,
        llama.cpp, another jupyter_infer), 'router' (the backends of router_backends and a
        rule per request; docs/scale-out.md), or a serving engine this server starts as a child
        with the model and serves through: 'vllm', 'llama.cpp', 'sglang', 'command' (serve_command).""")
    model: str = knob(DEFAULT_MODEL, "Hugging Face model id or local directory of the model the 'hf' engine serves.")
    device: str = knob("auto", "Device for the 'hf' engine: auto (CUDA > MPS > CPU), cpu, cuda, cuda:N or mps.")
    dtype: str = knob("auto", f"""One of {', '.join(DTYPES)}. Weights dtype for the 'hf' engine; auto: bfloat16/float16 on GPUs; on
        a CPU bfloat16 where it has bf16 instructions (AVX512-BF16, AMX), else float32.""")
    num_threads: int = knob(0, "CPU threads for the 'hf' engine; 0 picks for this machine, and runs fewer while "
                            "other processes keep its threads waiting for a CPU (infer/status: cpu).")
    prepack_weights: bool = knob(True, """'hf' engine on a CPU: reorder each linear weight once at load into a
        blocked layout: float32 and bfloat16 for our own kernel, oneDNN's where it cannot build
        (docs/engine.md). False keeps PyTorch's eager linears.""")
    quantize: str = knob("none", """'hf' engine on a CPU: 'none'; 'int8' for int8 linears (groups of 32 with a
        scale, llama.cpp's q8_0 form, our kernel; fbgemm's where it cannot build);
        'int4' for 4-bit linears in groups of 32 (a scale each, 4.5 bits a weight: llama.cpp's
        q4_0 form, a seventh of float32's), loaded without a float32 copy of the model. x86 CPUs with AVX2;
        speed, memory and quality in docs/engine.md.""")
    seed: int = knob(0, "The seed of the simulated engine's answers and timings.")
    generation_defaults: bool = knob(True, """'hf' engine: where an OpenAI request leaves out temperature,
        top_p, top_k or repetition_penalty, use the checkpoint's own (its generation_config.json;
        shown in infer/status as sampling_defaults). Off: OpenAI's defaults. The native
        infer/generate route is greedy unless asked, either way.""")
    model_dirs: tuple[str, ...] = knob(("~/models",), """Folders to look in for models to list and load by name
        (infer/models, v1/models, %infer_model): checkpoint folders (config.json) and .gguf files, two levels
        deep; the Hugging Face cache and Ollama's local store are listed too.""")
    load_on_demand: bool = knob(False, """A request whose 'model' names another listed model loads it first
        (in place of the one loaded), as Ollama does; off: such a request is refused (404). On a shared
        server any user who may generate could then switch the model for everyone: keep it off there.""")
    unload_after_s: float = knob(0.0, """Unload the model after this many idle seconds (its memory back to
        the machine; the next request, or a load, brings one back); 0: never.""")
    switch_drain_s: float = knob(30.0, """Switching models: how long the requests already queued or running
        may take to finish on the old one before they are cancelled.""")
    switches_per_minute: float = knob(4.0, """Load on demand: the most model switches in any minute. Requests
        for another model wait their turn, the loaded model's first; past this many switches the loaded
        model serves its own requests until a switch may happen again, so two agents on two models
        cannot make every request a switch.""")
    max_loaded_models: int = knob(1, """Load on demand: how many models may be resident at once (a chat model,
        an embedder and a coder side by side, each with its own scheduler), as Ollama's
        OLLAMA_MAX_LOADED_MODELS. A request for one more loads it beside the others; past this many, or
        where it would not fit in the memory available, the least recently used goes first. 1: one model,
        switched.""")
    split_reasoning: bool = knob(True, """'hf' engine, a reasoning model (Qwen3, DeepSeek-R1's distills: its
        chat template and vocabulary have <think> and </think>): the OpenAI chat answer's <think>
        section comes as message.reasoning_content (streamed as delta.reasoning_content), the rest
        as content. Off: all in content.""")
    tool_call_format: str = knob("", """'hf' engine: how the model writes tool calls, where its chat
        template does not tell: 'hermes' (<tool_call>{...}</tool_call>: Qwen, Hermes), 'llama3_json'
        ({"name": ..., "parameters": ...}: Llama 3.1-3.3), 'mistral' ([TOOL_CALLS][...]), 'granite'
        (<|tool_call|>[...]). Empty: read from the chat template (hermes when it shows none).
        Shown in infer/status as tool_calls.""")
    simulated_token_delay_ms: tuple[float, float] = knob((10.0, 40.0), "The simulated engine's per-step decode delay, drawn uniformly from [low, high] ms.")
    simulated_prefill_ms_per_token: float = knob(0.2, "The simulated engine's prefill cost per prompt token (ms).")
    # -- scheduling -----------------------------------------------------------------------------
    mode: str = knob("continuous", f"""One of {', '.join(MODES)}. Batching: 'continuous' (newcomers join the running batch at the next step) or
        'window' (the first request opens a batch_window_ms window; the batch then runs to
        completion).""")
    batch_window_ms: float = knob(50.0, "How long a 'window' batch waits for more requests after the first one (ms).")
    max_batch_size: int = knob(0, """Most requests that run together in one batch; 0 picks for the mode: 16 in
        'window' mode (the classic batcher), 32 in 'continuous' mode (measured best on CPU:
        docs/benchmark.md).""")
    max_queue_size: int = knob(256, "Most requests that may wait; more are refused with 429 and Retry-After.")
    max_new_tokens: int = knob(0, """Largest max_tokens a request may ask for; 0 (default): what is left of
        the model's context after the prompt, as vLLM and Ollama allow.""")
    max_prompt_tokens: int = knob(32768, "Longest prompt (in tokens) a request may send.")
    max_model_len: int = knob(0, """The context a request may hold (prompt and answer, in tokens), below the
        model's own (its max_position_embeddings): vLLM's --max-model-len, llama-server's -c, Ollama's
        num_ctx; shown in v1/models, api/show and infer/status. 0: the model's own.""")
    max_prefill_tokens: int = knob(4096, "Prompt tokens that one step may run (newcomers together); bounds a step's cost.")
    idle_admit_delay_ms: float = knob(5.0, """Continuous mode: an idle engine starts its first prefill once no request
        arrived for this long (at most 10x this after the first), so that a burst of requests
        shares one prefill (ms).""")
    prefill_chunk_tokens: int | None = knob(None, """Continuous mode: a prompt longer than this is prefilled in chunks of this many
        tokens, with a decode step of the running requests between two chunks, so a long
        prompt never freezes the streams already running for its whole prefill; while requests
        run, a group prefill of short prompts is bounded by it too. 0 prefills every prompt
        whole. Unset: the engine's choice, 64 on a CPU (measured: docs/engine.md), 512 on a GPU.""")
    # -- speculative decoding: draft tokens verified in the decode step (speculative/) ------------
    speculative: str = knob("auto", """Speculative decoding for the 'hf' engine: draft tokens that the
        decode step verifies in the same forward; a row keeps those its model agrees with, so
        its answer is the same, several tokens a step where the guesses land. 'ngram': a row
        proposes the tokens that followed its latest tokens earlier in its prompt or answer
        (prompt lookup: pays where it quotes tool results, code, documents, JSON keys; a row
        with no match proposes nothing and pays nothing). 'draft': draft_model guesses.
        'auto' (default): 'draft' when draft_model is set, else 'ngram'. 'off'.""")
    draft_model: str = knob("", """A smaller causal LM with the model's tokenizer (a Hugging Face id or a
        directory) whose greedy guesses the model verifies (speculative = 'draft' or 'auto').
        It pays where it is ~10x cheaper than the model and agrees with it often.""")
    speculative_tokens: int = knob(16, "Most draft tokens a row proposes a step (it follows the row's recent acceptance).")
    speculative_max_rows: int = knob(8, """No drafts while more rows than this decode: a step of many rows is
        busy enough that verifying guesses costs more than it saves (docs/engine.md).""")
    # -- many users: fair share and per-owner limits (an owner is the Jupyter or hub user) -------
    fair_share: bool = knob(True, """Share the batch's rows between users (the Jupyter or hub users who send
        the requests): the next row goes to the user holding the fewest, and a user with none
        takes a row from one holding more than their share, whose request is parked (its KV
        kept) and resumes where it was. So on a shared server nobody waits for another's burst.
        Priorities order each user's own requests. False: priority + FIFO for everyone. A
        single-user server has one user: nothing changes there.""")
    fair_share_weights: Mapping[str, float] = knob(factory=dict, hash=False, help="""Users' weights against each other in fair share (default 1):
        {"alice": 2} or, for a JupyterHub group, {"group:staff": 4}; a user's own weight wins
        over their groups', else their groups' highest.""")
    owner_max_running: int = knob(0, """The most rows one user holds at once (the rest of their
        requests wait in the queue). 0: no cap.""")
    owner_max_queued: int = knob(0, """The most requests one user may have waiting; more are refused
        with 429 and Retry-After. 0: only max_queue_size bounds them.""")
    owner_tokens_per_minute: int = knob(0, """Tokens per user per minute: a request reserves its prompt
        and max_tokens when queued (what it really cost once it ends); over the budget it is
        refused with 429 and a Retry-After of when enough has aged out. 0: no limit.""")
    admin_users: tuple[str, ...] = knob((), """Users who see everyone's requests in full
        in infer/batches, infer/events, infer/metrics and the panels (hub admins do too); others
        see their own, and everyone else's only as anonymous rows.""")
    # -- the engine's prefix cache --------------------------------------------------------------
    prefix_cache_mb: float = knob(512.0, """Memory (MB) for the 'hf' engine's prefix cache: the KV of recent prompts, in
        blocks of 16 tokens, so that a prompt starting like an earlier one (a shared system
        prompt, an agent's growing history) prefills only what is new. Least recently used
        blocks go first. 0 turns it off.""")
    prefix_cache_disk_mb: float = knob(4096.0, """Disk (MB) for the prefix cache's blocks, kept per model under
        ~/.cache/jupyter_infer/prompts (JUPYTER_INFER_CACHE moves it), so that a restart or a
        switch back to a model finds its prompts without computing them again. Least recently
        used blocks go first. 0: prompts are cached in memory only.""")
    # -- structured outputs ---------------------------------------------------------------------
    grammar_timeout_s: float = knob(10.0, """Seconds a structured-output constraint (JSON schema, regex, grammar,
        tools) may take to compile; a slower one is refused with 400. Compiled constraints are cached.""")
    grammar_fast_forward: bool = knob(True, """Append the tokens a constrained answer's grammar allows no
        alternative to (a schema's keys and punctuation, a tool's name) without sampling them: several
        tokens per step. Off: one token per step, as unconstrained rows.""")
    # -- records and live events -----------------------------------------------------------------
    keep_records: int = knob(1000, """Most finished requests whose records infer/batches and the timeline keep (the
        oldest go first).""")
    max_event_subscribers: int = knob(64, "Most live infer/events subscribers at once; more are refused with 429.")
    event_buffer: int = knob(2048, """Events an infer/events subscriber may fall behind (one log shared by all
        subscribers); one further behind loses the oldest and is told how many (a 'dropped' event).""")
    # -- engine = "openai": an upstream OpenAI-compatible server ----------------------------------
    serve_command: str = knob("", """engine='command' (or in place of the built-in command of 'vllm', 'llama.cpp',
        'sglang'): the command that starts the serving engine, with {model}, {port} and {token} (its API key)
        filled in, e.g. 'jupyter infer serve --model {model} --port {port} --IdentityProvider.token={token}'.""")
    serve_args: tuple[str, ...] = knob((), "engine='vllm' / 'llama.cpp' / 'sglang' / 'command': arguments added to its command.")
    serve_api_path: str = knob("", """Where the child's OpenAI API is under its port ('' : /v1; /infer/v1 for
        jupyter infer serve).""")
    serve_start_timeout_s: float = knob(600.0, "How long the child server may take to answer before its start fails.")
    upstream_url: str = knob("", """engine='openai': the upstream server's OpenAI-compatible base URL, ending in
        /v1 (e.g. http://vllm:8000/v1, or http://host:8888/infer/v1 for another jupyter_infer).""")
    upstream_model: str = knob("", "engine='openai': the upstream model to use; empty: the first id of its v1/models.")
    upstream_api_key: str = knob("", """engine='openai': the upstream's API key, sent as a Bearer token; never logged
        nor shown in status. Prefer upstream_api_key_env, which keeps it out of config files.""", repr=False)
    upstream_api_key_env: str = knob("", "engine='openai': the environment variable that holds the upstream's API key.")
    upstream_timeout_s: float = knob(60.0, """engine='openai': seconds to wait for the upstream's first token (retries
        included) and then between two chunks; past it the request fails with 504.""")
    upstream_retries: int = knob(2, """engine='openai': how often a request is retried (with backoff) while the
        upstream is unreachable or overloaded, before its first token only.""")
    # -- engine = "router": named backends and the rule that picks one per request -------------
    router_backends: Mapping[str, Mapping[str, Any]] = knob(factory=dict, hash=False, repr=False, help="""engine='router': the backends by name, each a dict of InferApp options with
        an 'engine', e.g. {'local': {'engine': 'hf', 'model': 'Qwen/Qwen2.5-0.5B-Instruct'},
        'cluster': {'engine': 'openai', 'upstream_url': 'http://vllm:8000/v1',
        'upstream_api_key_env': 'VLLM_KEY'}}. Options not given are the router's own.""")
    router_default: str = knob("", "engine='router': the backend for requests no policy decides; empty: the first.")
    router_policies: tuple[str, ...] = knob(("sensitivity", "complexity"), """engine='router': the policies asked in order, after the model a request names; the
        first that picks a backend wins: 'sensitivity', 'complexity', or 'module:function' (a
        callable f(request, prompt_tokens) returning a backend name or None).""")
    router_sensitive_patterns: tuple[str, ...] = knob((), """engine='router', policy 'sensitivity': regular expressions (case-insensitive); a
        request whose text matches one stays on router_private_backend.""")
    router_private_backend: str = knob("", """engine='router': where sensitive requests go; empty: the first backend that
        runs in this process.""")
    router_complex_backend: str = knob("", "engine='router': where complex requests go; empty: the first 'openai' backend.")
    router_complex_prompt_tokens: int = knob(1024, """engine='router', policy 'complexity': prompts of at least this many tokens
        (estimated, 4 characters a token) are complex.""")
    router_complex_max_tokens: int = knob(512, "engine='router', policy 'complexity': requests for at least this many tokens are complex.")
    router_fallback: Mapping[str, str] = knob(factory=dict, hash=False, help="""engine='router': where a request goes when its backend fails before the first
        token (unreachable, overloaded, queue full), e.g. {'cluster': 'local'}.""")

    def given(self) -> dict[str, Any]:
        """What this configuration says beyond the defaults (engine and model always), as
        ``infer/status`` shows it (``configured``)."""
        return given_options({f.name: getattr(self, f.name) for f in fields(self)})

    def _check_models(self) -> None:
        """The options of the models a server can load and switch between."""
        for folder in self.model_dirs:
            if folder.strip().startswith(("[", "(")):  # a literal list on the command line is one string
                raise ValueError(f"InferApp.model_dirs has {folder!r}, a list written as one folder: on the command "
                                 "line give each folder as its own --InferApp.model_dirs=/path (repeat the option), "
                                 "or set c.InferApp.model_dirs = ['/path', ...] in jupyter_server_config.py.")
        if isinstance(self.max_loaded_models, bool) or not isinstance(self.max_loaded_models, int) \
                or self.max_loaded_models < 1:
            raise ValueError(f"InferApp.max_loaded_models must be a whole number from 1; got {self.max_loaded_models!r}.")
        if not self.switches_per_minute > 0:
            raise ValueError(f"InferApp.switches_per_minute must be above 0; got {self.switches_per_minute!r}.")

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
        _set(self, "model_dirs", tuple(self.model_dirs))
        _set(self, "serve_args", tuple(self.serve_args))
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
        for name in ("max_queue_size", "max_prompt_tokens", "max_prefill_tokens",
                     "keep_records", "max_event_subscribers", "event_buffer"):
            if getattr(self, name) < 1:
                fail(name, "at least 1")
        for name in ("owner_max_running", "owner_max_queued", "owner_tokens_per_minute", "max_new_tokens",
                     "max_model_len"):
            if getattr(self, name) < 0:
                fail(name, "0 (no limit) or more")
        self._check_models()
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
        for name in _NON_NEGATIVE:
            if not getattr(self, name) >= 0 or math.isinf(getattr(self, name)):  # NaN fails too
                fail(name, "0 or more")
        low_high = self.simulated_token_delay_ms
        if len(low_high) != 2 or not 0 <= low_high[0] <= low_high[1]:
            fail("simulated_token_delay_ms", "two numbers [low, high] with 0 <= low <= high")
        if not self.upstream_timeout_s > 0 or math.isinf(self.upstream_timeout_s):
            fail("upstream_timeout_s", "above 0")
        if self.upstream_retries < 0:
            fail("upstream_retries", "0 or more")
        if self.engine == "command" and not self.serve_command.strip():
            raise ValueError("InferApp.engine = 'command' needs InferApp.serve_command: the command that starts "
                             "the server, with {model}, {port} and {token} in it.")
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


SECRET_OPTIONS = frozenset({"upstream_api_key"})


def given_options(options: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` (ServiceConfig's names) as status shows them: engine and model, and every
    other that differs from its default; a secret only as set or not."""
    defaults = {f.name: ServiceConfig.default(f.name) for f in fields(ServiceConfig)}
    out = {"engine": options.get("engine", defaults["engine"]), "model": options.get("model", defaults["model"])}
    for name, value in options.items():
        if name in out or (name in defaults and _same(value, defaults[name])):
            continue
        out[name] = "(set)" if name in SECRET_OPTIONS and value else value
    return out


def _same(value: Any, default: Any) -> bool:
    if isinstance(default, (tuple, list)) and isinstance(value, (tuple, list)):
        return list(value) == list(default)
    return value == default
