"""``InferApp``: the Jupyter server extension. Its traits are the configuration
(``c.InferApp.<name>``): the service's knobs, made from ``ServiceConfig`` (``ServiceTraits``),
and the server's own below; it holds one ``InferenceService`` for the handlers."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

from jupyter_server.extension.application import ExtensionApp
from traitlets import Bool, Float, Int

from .._version import __version__
from ..engine import Engine
from ..formats.model_catalog import in_model_dirs, in_ollama_store
from ..service.inference import InferenceService
from ..service.service_factory import make_service
from ..values.config import ServiceConfig, given_options, normalize_url
from . import prometheus
from .config_traits import ServiceTraits
from .handler_base import SERVICE_KEY
from .handlers import routes
from .startup_heap import freeze_when_ready, thaw


class InferApp(ServiceTraits, ExtensionApp):
    """LLM inference inside the Jupyter server: JSON, SSE and OpenAI-compatible endpoints."""

    name = "jupyter_infer"
    version = __version__
    description = __doc__
    load_other_extensions = True

    # -- the server's own knobs (the service's come from ServiceConfig) -----------------------
    max_body_bytes = Int(
        1024 * 1024, help="""Largest request body accepted; a larger one is refused with 413 as soon as its
        Content-Length (or, chunked, its first bytes past the limit) arrives, before it is read."""
    ).tag(config=True)
    body_timeout_s = Float(
        30.0, help="""Seconds a client may take to send a request body; a slower one (e.g. a byte a
        second) is answered 408 Request Timeout and disconnected."""
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
        options = self._service_options()
        # A model listed under model_dirs, or in Ollama's store, may be named as the listing
        # names it (serve --model small, --model qwen2.5:0.5b, as %infer_model and the panel
        # do): the service gets its path.
        named = str(options.get("model") or "")
        in_store = in_ollama_store(named) if options.get("engine", "auto") in ("auto", "hf", "llama.cpp") else None
        listed = in_model_dirs(named, options.get("model_dirs") or ()) or (in_store.path if in_store else None)
        if listed is not None:
            options["model"] = listed
        return ServiceConfig(**options)

    def _service_options(self) -> dict[str, Any]:
        names = [f.name for f in fields(ServiceConfig) if self.has_trait(f.name)]
        options = {name: getattr(self, name) for name in names}
        if "engine" not in self.config.get("InferApp", {}):
            options.update(hub_shared_service(os.environ))
        return options

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
            self.service = InferenceService(engine_loader=_refuse(self.config_error),
                                            configured=given_options(self._service_options()))
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
