"""``InferApp``: the Jupyter server extension. Its traits are the configuration
(``c.InferApp.<name>``); it holds one ``InferenceService`` for the handlers."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Dict, Float, Int, List, Unicode

from .._version import __version__
from ..engine import Engine
from ..service.inference import InferenceService
from ..service.service_factory import make_service
from ..values.config import DTYPES, ENGINES, MODES, ServiceConfig, normalize_url
from . import prometheus
from .handler_base import SERVICE_KEY
from .handlers import routes
from .startup_heap import freeze_when_ready, thaw

D = ServiceConfig.default  # every default comes from ServiceConfig


class InferApp(ExtensionApp):
    """LLM inference inside the Jupyter server: JSON, SSE and OpenAI-compatible endpoints."""

    name = "jupyter_infer"
    version = __version__
    description = __doc__
    load_other_extensions = True

    engine = Unicode(
        D("engine"),
        help=f"""One of {', '.join(ENGINES)}. Which engine generates tokens: 'hf' (a Hugging Face causal LM through
        transformers), 'simulated' (offline, deterministic, realistic timing), 'auto'
        ('hf' with the configured model; 'simulated' if it cannot load, and status says why),
        'openai' (an upstream OpenAI-compatible server at upstream_url: vLLM, TGI, SGLang,
        llama.cpp, another jupyter_infer) or 'router' (the backends of router_backends and a
        rule per request; docs/scale-out.md).""",
    ).tag(config=True)
    model = Unicode(
        D("model"),
        help="Hugging Face model id or local directory of the model the 'hf' engine serves.",
    ).tag(config=True)
    device = Unicode(
        D("device"), help="Device for the 'hf' engine: auto (CUDA > MPS > CPU), cpu, cuda, cuda:N or mps."
    ).tag(config=True)
    dtype = Unicode(
        D("dtype"),
        help=f"""One of {', '.join(DTYPES)}. Weights dtype for the 'hf' engine; auto: bfloat16/float16 on GPUs; on
        a CPU bfloat16 where it has bf16 instructions (AVX512-BF16, AMX), else float32.""",
    ).tag(config=True)
    mode = Unicode(
        D("mode"),
        help=f"""One of {', '.join(MODES)}. Batching: 'continuous' (newcomers join the running batch at the next step) or
        'window' (the first request opens a batch_window_ms window; the batch then runs to
        completion).""",
    ).tag(config=True)
    batch_window_ms = Float(
        D("batch_window_ms"), help="How long a 'window' batch waits for more requests after the first one (ms)."
    ).tag(config=True)
    max_batch_size = Int(
        D("max_batch_size"), help="""Most requests that run together in one batch; 0 picks for the mode: 16 in
        'window' mode (the classic batcher), 32 in 'continuous' mode (measured best on CPU:
        docs/benchmark.md).""",
    ).tag(config=True)
    max_queue_size = Int(
        D("max_queue_size"), help="Most requests that may wait; more are refused with 429 and Retry-After."
    ).tag(config=True)
    max_new_tokens = Int(
        D("max_new_tokens"), help="Largest max_tokens a request may ask for."
    ).tag(config=True)
    max_prompt_tokens = Int(
        D("max_prompt_tokens"), help="Longest prompt (in tokens) a request may send."
    ).tag(config=True)
    max_prefill_tokens = Int(
        D("max_prefill_tokens"), help="Prompt tokens that one step may run (newcomers together); bounds a step's cost."
    ).tag(config=True)
    idle_admit_delay_ms = Float(
        D("idle_admit_delay_ms"), help="""Continuous mode: an idle engine starts its first prefill once no request
        arrived for this long (at most 10x this after the first), so that a burst of requests
        shares one prefill (ms)."""
    ).tag(config=True)
    prefill_chunk_tokens = Int(
        D("prefill_chunk_tokens"), allow_none=True,
        help="""Continuous mode: a prompt longer than this is prefilled in chunks of this many
        tokens, with a decode step of the running requests between two chunks, so a long
        prompt never freezes the streams already running for its whole prefill; while requests
        run, a group prefill of short prompts is bounded by it too. 0 prefills every prompt
        whole. Unset: the engine's choice, 64 on a CPU (measured: docs/engine.md), 512 on a GPU."""
    ).tag(config=True)
    speculative = Unicode(
        D("speculative"), help="""Speculative decoding for the 'hf' engine: draft tokens that the
        decode step verifies in the same forward; a row keeps those its model agrees with, so
        its answer is the same, several tokens a step where the guesses land. 'ngram': a row
        proposes the tokens that followed its latest tokens earlier in its prompt or answer
        (prompt lookup: pays where it quotes tool results, code, documents, JSON keys; a row
        with no match proposes nothing and pays nothing). 'draft': draft_model guesses.
        'auto' (default): 'draft' when draft_model is set, else 'ngram'. 'off'."""
    ).tag(config=True)
    draft_model = Unicode(
        D("draft_model"), help="""A smaller causal LM with the model's tokenizer (a Hugging Face id or a
        directory) whose greedy guesses the model verifies (speculative = 'draft' or 'auto').
        It pays where it is ~10x cheaper than the model and agrees with it often."""
    ).tag(config=True)
    speculative_tokens = Int(
        D("speculative_tokens"), help="Most draft tokens a row proposes a step (it follows the row's recent acceptance)."
    ).tag(config=True)
    speculative_max_rows = Int(
        D("speculative_max_rows"), help="""No drafts while more rows than this decode: a step of many rows is
        busy enough that verifying guesses costs more than it saves (docs/engine.md)."""
    ).tag(config=True)
    fair_share = Bool(
        D("fair_share"), help="""Share the batch's rows between users (the Jupyter or hub users who send
        the requests): the next row goes to the user holding the fewest, and a user with none
        takes a row from one holding more than their share, whose request is parked (its KV
        kept) and resumes where it was. So on a shared server nobody waits for another's burst.
        Priorities order each user's own requests. False: priority + FIFO for everyone. A
        single-user server has one user: nothing changes there."""
    ).tag(config=True)
    fair_share_weights = Dict(
        D("fair_share_weights"), help="""Users' weights against each other in fair share (default 1):
        {"alice": 2} or, for a JupyterHub group, {"group:staff": 4}; a user's own weight wins
        over their groups', else their groups' highest."""
    ).tag(config=True)
    owner_max_running = Int(
        D("owner_max_running"), help="""The most rows one user holds at once (the rest of their
        requests wait in the queue). 0: no cap."""
    ).tag(config=True)
    owner_max_queued = Int(
        D("owner_max_queued"), help="""The most requests one user may have waiting; more are refused
        with 429 and Retry-After. 0: only max_queue_size bounds them."""
    ).tag(config=True)
    owner_tokens_per_minute = Int(
        D("owner_tokens_per_minute"), help="""Tokens per user per minute: a request reserves its prompt
        and max_tokens when queued (what it really cost once it ends); over the budget it is
        refused with 429 and a Retry-After of when enough has aged out. 0: no limit."""
    ).tag(config=True)
    admin_users = List(
        Unicode(), default_value=list(D("admin_users")), help="""Users who see everyone's requests in full
        in infer/batches, infer/events, infer/metrics and the panels (hub admins do too); others
        see their own, and everyone else's only as anonymous rows."""
    ).tag(config=True)
    prefix_cache_mb = Float(
        D("prefix_cache_mb"), help="""Memory (MB) for the 'hf' engine's prefix cache: the KV of recent prompts, in
        blocks of 16 tokens, so that a prompt starting like an earlier one (a shared system
        prompt, an agent's growing history) prefills only what is new. Least recently used
        blocks go first. 0 turns it off."""
    ).tag(config=True)
    num_threads = Int(
        D("num_threads"), help="CPU threads for the 'hf' engine; 0 picks for this machine."
    ).tag(config=True)
    prepack_weights = Bool(
        D("prepack_weights"), help="""'hf' engine on a CPU: reorder each linear weight once at load into a
        blocked layout: float32 and bfloat16 for our own kernel, oneDNN's where it cannot build
        (docs/engine.md). False keeps PyTorch's eager linears."""
    ).tag(config=True)
    quantize = Unicode(
        D("quantize"), help="""'hf' engine on a CPU: 'none'; 'int8' for int8 linears (groups of 32 with a
        scale, llama.cpp's q8_0 form, our kernel; fbgemm's where it cannot build);
        'int4' for 4-bit linears in groups of 32 (a scale each, 4.5 bits a weight: llama.cpp's
        q4_0 form, a seventh of float32's), loaded without a float32 copy of the model. x86 CPUs with AVX2;
        speed, memory and quality in docs/engine.md."""
    ).tag(config=True)
    generation_defaults = Bool(
        D("generation_defaults"), help="""'hf' engine: where an OpenAI request leaves out temperature,
        top_p, top_k or repetition_penalty, use the checkpoint's own (its generation_config.json;
        shown in infer/status as sampling_defaults). Off: OpenAI's defaults. The native
        infer/generate route is greedy unless asked, either way."""
    ).tag(config=True)
    split_reasoning = Bool(
        D("split_reasoning"), help="""'hf' engine, a reasoning model (Qwen3, DeepSeek-R1's distills: its
        chat template and vocabulary have <think> and </think>): the OpenAI chat answer's <think>
        section comes as message.reasoning_content (streamed as delta.reasoning_content), the rest
        as content. Off: all in content."""
    ).tag(config=True)
    tool_call_format = Unicode(
        D("tool_call_format"), help="""'hf' engine: how the model writes tool calls, where its chat
        template does not tell: 'hermes' (<tool_call>{...}</tool_call>: Qwen, Hermes), 'llama3_json'
        ({"name": ..., "parameters": ...}: Llama 3.1-3.3), 'mistral' ([TOOL_CALLS][...]), 'granite'
        (<|tool_call|>[...]). Empty: read from the chat template (hermes when it shows none).
        Shown in infer/status as tool_calls."""
    ).tag(config=True)
    simulated_token_delay_ms = List(
        Float(), default_value=list(D("simulated_token_delay_ms")),
        help="The simulated engine's per-step decode delay, drawn uniformly from [low, high] ms.",
    ).tag(config=True)
    simulated_prefill_ms_per_token = Float(
        D("simulated_prefill_ms_per_token"), help="The simulated engine's prefill cost per prompt token (ms)."
    ).tag(config=True)
    # -- engine = "openai" ------------------------------------------------------------------
    upstream_url = Unicode(
        D("upstream_url"), help="""engine='openai': the upstream server's OpenAI-compatible base URL, ending in
        /v1 (e.g. http://vllm:8000/v1, or http://host:8888/infer/v1 for another jupyter_infer).""",
    ).tag(config=True)
    upstream_model = Unicode(
        D("upstream_model"), help="engine='openai': the upstream model to use; empty: the first id of its v1/models.",
    ).tag(config=True)
    upstream_api_key = Unicode(
        D("upstream_api_key"), help="""engine='openai': the upstream's API key, sent as a Bearer token; never logged
        nor shown in status. Prefer upstream_api_key_env, which keeps it out of config files.""",
    ).tag(config=True)
    upstream_api_key_env = Unicode(
        D("upstream_api_key_env"), help="engine='openai': the environment variable that holds the upstream's API key.",
    ).tag(config=True)
    upstream_timeout_s = Float(
        D("upstream_timeout_s"), help="""engine='openai': seconds to wait for the upstream's first token (retries
        included) and then between two chunks; past it the request fails with 504.""",
    ).tag(config=True)
    upstream_retries = Int(
        D("upstream_retries"), help="""engine='openai': how often a request is retried (with backoff) while the
        upstream is unreachable or overloaded, before its first token only.""",
    ).tag(config=True)
    # -- engine = "router" ------------------------------------------------------------------
    router_backends = Dict(
        D("router_backends"), help="""engine='router': the backends by name, each a dict of InferApp options with
        an 'engine', e.g. {'local': {'engine': 'hf', 'model': 'Qwen/Qwen2.5-0.5B-Instruct'},
        'cluster': {'engine': 'openai', 'upstream_url': 'http://vllm:8000/v1',
        'upstream_api_key_env': 'VLLM_KEY'}}. Options not given are the router's own.""",
    ).tag(config=True)
    router_default = Unicode(
        D("router_default"), help="engine='router': the backend for requests no policy decides; empty: the first.",
    ).tag(config=True)
    router_policies = List(
        Unicode(), default_value=list(D("router_policies")),
        help="""engine='router': the policies asked in order, after the model a request names; the
        first that picks a backend wins: 'sensitivity', 'complexity', or 'module:function' (a
        callable f(request, prompt_tokens) returning a backend name or None).""",
    ).tag(config=True)
    router_sensitive_patterns = List(
        Unicode(), default_value=list(D("router_sensitive_patterns")),
        help="""engine='router', policy 'sensitivity': regular expressions (case-insensitive); a
        request whose text matches one stays on router_private_backend.""",
    ).tag(config=True)
    router_private_backend = Unicode(
        D("router_private_backend"), help="""engine='router': where sensitive requests go; empty: the first backend that
        runs in this process.""",
    ).tag(config=True)
    router_complex_backend = Unicode(
        D("router_complex_backend"), help="engine='router': where complex requests go; empty: the first 'openai' backend.",
    ).tag(config=True)
    router_complex_prompt_tokens = Int(
        D("router_complex_prompt_tokens"), help="""engine='router', policy 'complexity': prompts of at least this many tokens
        (estimated, 4 characters a token) are complex.""",
    ).tag(config=True)
    router_complex_max_tokens = Int(
        D("router_complex_max_tokens"), help="engine='router', policy 'complexity': requests for at least this many tokens are complex.",
    ).tag(config=True)
    router_fallback = Dict(
        D("router_fallback"), help="""engine='router': where a request goes when its backend fails before the first
        token (unreachable, overloaded, queue full), e.g. {'cluster': 'local'}.""",
    ).tag(config=True)

    max_body_bytes = Int(
        1024 * 1024, help="""Largest request body accepted; a larger one is refused with 413 as soon as its
        Content-Length (or, chunked, its first bytes past the limit) arrives, before it is read."""
    ).tag(config=True)
    body_timeout_s = Float(
        30.0, help="""Seconds a client may take to send a request body; a slower one (e.g. a byte a
        second) is answered 408 Request Timeout and disconnected."""
    ).tag(config=True)
    grammar_timeout_s = Float(
        D("grammar_timeout_s"), help="""Seconds a structured-output constraint (JSON schema, regex, grammar,
        tools) may take to compile; a slower one is refused with 400. Compiled constraints are cached."""
    ).tag(config=True)
    grammar_fast_forward = Bool(
        D("grammar_fast_forward"), help="""Append the tokens a constrained answer's grammar allows no
        alternative to (a schema's keys and punctuation, a tool's name) without sampling them: several
        tokens per step. Off: one token per step, as unconstrained rows."""
    ).tag(config=True)
    max_event_subscribers = Int(
        D("max_event_subscribers"), help="Most live infer/events subscribers at once; more are refused with 429."
    ).tag(config=True)
    event_buffer = Int(
        D("event_buffer"), help="""Events an infer/events subscriber may fall behind (one log shared by all
        subscribers); one further behind loses the oldest and is told how many (a 'dropped' event)."""
    ).tag(config=True)
    max_choices = Int(
        128, help="""Most choices one OpenAI call may ask for (prompts x n); each is its own request
        in the queue, so they batch together.""",
    ).tag(config=True)
    health_without_auth = Bool(
        False, help="""Answer GET infer/health without authentication (for load balancers and
        probes that cannot send the token). It tells only whether the engine is ready.""",
    ).tag(config=True)
    sse_keepalive_s = Float(
        15.0, help="Seconds between ': keepalive' comments on an event stream with nothing to say."
    ).tag(config=True)

    # -- lifecycle --------------------------------------------------------------------------
    config_error: str | None = None
    prometheus_collector: prometheus.ServiceCollector | None = None  # the service's part of /metrics
    _heap_frozen: asyncio.Task | None = None  # True once the startup heap is frozen

    def service_config(self) -> ServiceConfig:
        """The traits as a ``ServiceConfig``; raises ``ValueError`` saying what to fix."""
        if self.max_body_bytes < 1:
            raise ValueError(f"InferApp.max_body_bytes must be at least 1; got {self.max_body_bytes}.")
        if not self.body_timeout_s > 0:
            raise ValueError(f"InferApp.body_timeout_s must be above 0; got {self.body_timeout_s}.")
        if self.max_choices < 1:
            raise ValueError(f"InferApp.max_choices must be at least 1; got {self.max_choices}.")
        if not 0 < self.sse_keepalive_s <= 15:
            raise ValueError(
                f"InferApp.sse_keepalive_s must be above 0 and at most 15; got {self.sse_keepalive_s}."
            )
        names = [f.name for f in fields(ServiceConfig) if self.has_trait(f.name)]
        options = {name: getattr(self, name) for name in names}
        if "engine" not in self.config.get("InferApp", {}):
            options.update(hub_shared_service(os.environ))
        return ServiceConfig(**options)

    def initialize_settings(self) -> None:
        self._routed_log_handlers = route_package_logs(self.log)
        # A bad value does not run on silent defaults: the service reports the error
        # (status "failed", 503 on requests) until the configuration is fixed.
        try:
            self.service = make_service(self.service_config())
        except ValueError as err:
            self.config_error = str(err)
            self.log.error(
                "jupyter_infer | invalid configuration: %s The inference service will not start.",
                self.config_error,
            )
            self.service = InferenceService(engine_loader=_refuse(self.config_error))
        else:
            config = self.service.config
            what = {"openai": config.upstream_url,  # never the key
                    "router": ", ".join(config.router_backends)}.get(config.engine, config.model)
            self.log.info(
                "jupyter_infer | engine=%s (%s) mode=%s max_batch_size=%d: loading in the background",
                config.engine, what, config.mode, config.batch_size,
            )
        self.prometheus_collector = prometheus.ServiceCollector(self.service)
        self.prometheus_collector.attach()
        self.settings[SERVICE_KEY] = self.service
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # the usual case: the loop starts later; _start_jupyter_server_extension starts us
        self._start_service()  # already on the server's loop (e.g. under pytest-jupyter)

    def initialize_handlers(self) -> None:
        self.handlers.extend(routes())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Start loading the engine on the server's running loop."""
        self._start_service()

    def _start_service(self) -> None:
        """Start loading the engine (a no-op if it started already); once it is ready, the
        heap is frozen so that full garbage collections stay short (``startup_heap``)."""
        self.service.start()
        if self._heap_frozen is None:
            self._heap_frozen = asyncio.get_running_loop().create_task(
                freeze_when_ready(self.service), name="jupyter-infer-freeze-heap")

    async def stop_extension(self) -> None:
        """Stop the service: running requests end with an error event. Never raises."""
        service = getattr(self, "service", None)
        if service is None:
            return
        try:
            service.events.publish({"type": "shutdown"})
            service.events.flush()
            await asyncio.wait_for(service.stop(), timeout=10)
            # Let the open event streams write their error event before the loop stops.
            await asyncio.sleep(0.1)
        except (Exception, asyncio.CancelledError):
            self.log.exception("jupyter_infer | error while stopping the inference service")
        if self.prometheus_collector is not None:
            self.prometheus_collector.detach()
            self.prometheus_collector = None
        frozen, self._heap_frozen = self._heap_frozen, None
        if frozen is not None and frozen.done() and not frozen.cancelled() and frozen.result():
            thaw()
        elif frozen is not None:
            frozen.cancel()
        self.log.info("jupyter_infer | inference service stopped")
        unroute_package_logs(getattr(self, "_routed_log_handlers", []))


def route_package_logs(log: logging.Logger) -> list[logging.Handler]:
    """Send the package's own loggers (``jupyter_infer.*``: ignored fields, engine warnings)
    to the server's log, in its format and at its level; left alone, Python printed their
    warnings bare on stderr (no time, no level) and dropped the rest. Returns the handlers
    added (removed when the extension stops: a later server in this process brings its own)."""
    package = logging.getLogger("jupyter_infer")
    if package.handlers:
        return []  # routed already, or configured by the user: theirs stands
    added = list(log.handlers)
    for handler in added:
        package.addHandler(handler)
    if package.level == logging.NOTSET:
        package.setLevel(log.getEffectiveLevel())
    return added


def unroute_package_logs(added: list[logging.Handler]) -> None:
    """Undo ``route_package_logs`` (its handlers and the level it set)."""
    package = logging.getLogger("jupyter_infer")
    for handler in added:
        package.removeHandler(handler)
    if added:
        package.setLevel(logging.NOTSET)


class ConfigurationError(Exception):
    """The extension's configuration is invalid; nothing can be served until it is fixed."""


def hub_shared_service(env: Mapping[str, str]) -> dict[str, str]:
    """In a user's server on a JupyterHub whose admin set ``JUPYTER_INFER_URL`` (the shared
    service, docs/deployment.md) for the users: the options that send this server's requests
    there, with the server's hub token (the service sees the user). ``{}`` elsewhere, and in
    the shared service itself."""
    url = env.get("JUPYTER_INFER_URL", "").strip()
    if not url or "JUPYTERHUB_API_TOKEN" not in env or "JUPYTERHUB_SERVICE_NAME" in env:
        return {}
    return {"engine": "openai", "upstream_url": normalize_url(url) + "infer/v1",
            "upstream_api_key_env": "JUPYTERHUB_API_TOKEN"}


def _refuse(message: str) -> Callable[[], Engine]:
    def load() -> Engine:
        raise ConfigurationError(
            f"invalid configuration: {message} Fix it in jupyter_server_config.py or on the command line"
        )

    return load


main = launch_new_instance = InferApp.launch_instance
