"""``InferApp``: the Jupyter server extension. Its traits are the configuration
(``c.InferApp.<name>``); it holds one ``InferenceService`` for the handlers."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Enum, Float, Int, List, TraitError, Unicode, validate

from .. import __version__
from ..engine import DEFAULT_MODEL, ENGINES, Engine, EngineConfig
from ..scheduler import MODES, Scheduler, SchedulerConfig
from ..service import InferenceService
from . import prometheus
from .handlers import SERVICE_KEY, routes

DTYPES = ("auto", "float32", "bfloat16", "float16")
DEFAULT_BATCH_SIZE = {"window": 16, "continuous": 32}
_DEVICE = re.compile(r"auto|cpu|mps|cuda(:\d+)?")


class InferApp(ExtensionApp):
    """LLM inference inside the Jupyter server: JSON, SSE and OpenAI-compatible endpoints."""

    name = "jupyter_infer"
    version = __version__
    description = __doc__
    load_other_extensions = True

    engine = Enum(
        list(ENGINES), default_value="auto",
        help="""Which engine generates tokens: 'hf' (a Hugging Face causal LM through
        transformers), 'simulated' (offline, deterministic, realistic timing) or 'auto'
        ('hf' with the configured model; 'simulated' if it cannot load, and status says why).""",
    ).tag(config=True)
    model = Unicode(
        DEFAULT_MODEL,
        help="Hugging Face model id or local directory of the model the 'hf' engine serves.",
    ).tag(config=True)
    device = Unicode(
        "auto", help="Device for the 'hf' engine: auto (CUDA > MPS > CPU), cpu, cuda, cuda:N or mps."
    ).tag(config=True)
    dtype = Enum(
        list(DTYPES), default_value="auto",
        help="Weights dtype for the 'hf' engine; auto: bfloat16/float16 on GPUs, float32 on CPU.",
    ).tag(config=True)
    mode = Enum(
        list(MODES), default_value="continuous",
        help="""Batching: 'continuous' (newcomers join the running batch at the next step) or
        'window' (the first request opens a batch_window_ms window; the batch then runs to
        completion).""",
    ).tag(config=True)
    batch_window_ms = Float(
        50.0, help="How long a 'window' batch waits for more requests after the first one (ms)."
    ).tag(config=True)
    max_batch_size = Int(
        0, help="""Most requests that run together in one batch; 0 picks for the mode: 16 in
        'window' mode (the classic batcher), 32 in 'continuous' mode (measured best on CPU:
        docs/benchmark.md).""",
    ).tag(config=True)
    max_queue_size = Int(
        256, help="Most requests that may wait; more are refused with 429 and Retry-After."
    ).tag(config=True)
    max_new_tokens = Int(
        512, help="Largest max_tokens a request may ask for."
    ).tag(config=True)
    max_prompt_tokens = Int(
        2048, help="Longest prompt (in tokens) a request may send."
    ).tag(config=True)
    max_prefill_tokens = Int(
        4096, help="Prompt tokens (padded) that one prefill step may run; bounds a step's cost."
    ).tag(config=True)
    idle_admit_delay_ms = Float(
        5.0, help="""Continuous mode: an idle engine starts its first prefill once no request
        arrived for this long (at most 10x this after the first), so that a burst of requests
        shares one prefill (ms)."""
    ).tag(config=True)
    num_threads = Int(
        0, help="CPU threads for the 'hf' engine; 0 picks for this machine."
    ).tag(config=True)
    simulated_token_delay_ms = List(
        Float(), default_value=[10.0, 40.0],
        help="The simulated engine's per-step decode delay, drawn uniformly from [low, high] ms.",
    ).tag(config=True)
    simulated_prefill_ms_per_token = Float(
        0.2, help="The simulated engine's prefill cost per prompt token (ms)."
    ).tag(config=True)
    max_body_bytes = Int(
        1024 * 1024, help="Largest request body accepted; larger ones are refused with 413."
    ).tag(config=True)
    sse_keepalive_s = Float(
        15.0, help="Seconds between ': keepalive' comments on an event stream with nothing to say."
    ).tag(config=True)

    # -- validation: a bad value stops the extension with a message that says what to fix ---
    @validate("device")
    def _check_device(self, proposal: dict[str, Any]) -> str:
        value = proposal["value"].strip().lower()
        if not _DEVICE.fullmatch(value):
            raise TraitError(
                f"InferApp.device must be auto, cpu, cuda, cuda:N or mps; got {proposal['value']!r}."
            )
        return value

    @validate("model")
    def _check_model(self, proposal: dict[str, Any]) -> str:
        if not proposal["value"].strip():
            raise TraitError("InferApp.model is empty: give a Hugging Face model id or a directory.")
        return proposal["value"].strip()

    @validate(
        "max_queue_size", "max_new_tokens", "max_prompt_tokens", "max_prefill_tokens",
        "max_body_bytes",
    )
    def _check_positive(self, proposal: dict[str, Any]) -> int:
        name, value = proposal["trait"].name, proposal["value"]
        if value < 1:
            raise TraitError(f"InferApp.{name} must be at least 1; got {value}.")
        return value

    @validate("max_batch_size")
    def _check_batch_size(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] < 0:
            raise TraitError(
                f"InferApp.max_batch_size must be 0 (pick for the mode) or more; got {proposal['value']}."
            )
        return proposal["value"]

    @validate("num_threads")
    def _check_threads(self, proposal: dict[str, Any]) -> int:
        if proposal["value"] < 0:
            raise TraitError(f"InferApp.num_threads must be 0 (auto) or more; got {proposal['value']}.")
        return proposal["value"]

    @validate("batch_window_ms", "idle_admit_delay_ms", "simulated_prefill_ms_per_token")
    def _check_non_negative(self, proposal: dict[str, Any]) -> float:
        name, value = proposal["trait"].name, proposal["value"]
        if not value >= 0:  # NaN fails too
            raise TraitError(f"InferApp.{name} must be 0 or more; got {value}.")
        return value

    @validate("sse_keepalive_s")
    def _check_keepalive(self, proposal: dict[str, Any]) -> float:
        if not 0 < proposal["value"] <= 15:
            raise TraitError(
                f"InferApp.sse_keepalive_s must be above 0 and at most 15; got {proposal['value']}."
            )
        return proposal["value"]

    @validate("simulated_token_delay_ms")
    def _check_delays(self, proposal: dict[str, Any]) -> list[float]:
        value = list(proposal["value"])
        if len(value) != 2 or not 0 <= value[0] <= value[1]:
            raise TraitError(
                "InferApp.simulated_token_delay_ms must be two numbers [low, high] with "
                f"0 <= low <= high; got {value}."
            )
        return value

    # -- lifecycle --------------------------------------------------------------------------
    config_error: str | None = None

    def _link_jupyter_server_extension(self, serverapp: Any) -> None:
        # jupyter_server logs a failed link as a warning and then loads the extension anyway,
        # with every trait at its default: a typo would silently serve another engine. Keep
        # the error instead; the service then reports it (status "failed", 503 on requests).
        try:
            super()._link_jupyter_server_extension(serverapp)
        except TraitError as err:
            self.config_error = str(err)
            self.serverapp = serverapp
            self._linked = True

    def initialize_settings(self) -> None:
        try:
            self.service = self._build_service()
        except ValueError as err:
            self.config_error = str(err)
        if self.config_error is not None:
            self.log.error(
                "jupyter_infer | invalid configuration: %s The inference service will not start.",
                self.config_error,
            )
            self.service = InferenceService()
            self.service.scheduler = Scheduler(
                _refuse(self.config_error), self.service.scheduler_config,
                self.service.metrics, self.service.events,
            )
        prometheus.attach(self.service)
        # ExtensionApp put the app itself under its name; our handlers want the service.
        self.settings[SERVICE_KEY] = self.service
        if self.config_error is None:
            self.log.info(
                "jupyter_infer | engine=%s model=%s mode=%s max_batch_size=%d: loading in the background",
                self.engine, self.model, self.mode, self.max_batch_size or DEFAULT_BATCH_SIZE[self.mode],
            )
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return  # the usual case: the loop starts later; _start_jupyter_server_extension starts us
        self.service.start()  # already on the server's loop (e.g. under pytest-jupyter)

    def _build_service(self) -> InferenceService:
        return InferenceService(
            EngineConfig(
                engine=self.engine, model=self.model, device=self.device, dtype=self.dtype,
                num_threads=self.num_threads,
                token_delay_ms=tuple(self.simulated_token_delay_ms),
                prefill_ms_per_token=self.simulated_prefill_ms_per_token,
            ),
            SchedulerConfig(
                mode=self.mode, batch_window_ms=self.batch_window_ms,
                max_batch_size=self.max_batch_size or DEFAULT_BATCH_SIZE[self.mode],
                max_queue_size=self.max_queue_size,
                max_new_tokens=self.max_new_tokens, max_prompt_tokens=self.max_prompt_tokens,
                max_prefill_tokens=self.max_prefill_tokens,
                idle_admit_delay_ms=self.idle_admit_delay_ms,
            ),
        )

    def initialize_handlers(self) -> None:
        self.handlers.extend(routes())

    async def _start_jupyter_server_extension(self, serverapp: Any) -> None:
        """Start loading the engine and the scheduler on the server's running loop."""
        self.service.start()  # a no-op if it already started

    async def stop_extension(self) -> None:
        """Stop the scheduler: running requests end with an error event. Never raises."""
        service = getattr(self, "service", None)
        if service is None:
            return
        try:
            service.events.publish({"type": "shutdown"})
            await asyncio.wait_for(service.stop(), timeout=10)
            # Let the open event streams write their error event before the loop stops.
            await asyncio.sleep(0.1)
        except (Exception, asyncio.CancelledError):
            self.log.exception("jupyter_infer | error while stopping the inference service")
        prometheus.detach(service)
        self.log.info("jupyter_infer | inference service stopped")


class ConfigurationError(Exception):
    """The extension's configuration is invalid; nothing can be served until it is fixed."""


def _refuse(message: str) -> Callable[[], Engine]:
    def load() -> Engine:
        raise ConfigurationError(
            f"invalid configuration: {message} Fix it in jupyter_server_config.py or on the command line"
        )

    return load


main = launch_new_instance = InferApp.launch_instance
