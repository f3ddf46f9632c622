"""``jupyter infer serve``: the inference server on its own, without a notebook UI.

The same ``jupyter_infer`` extension, handlers and traits as inside JupyterLab, in a Jupyter
server that loads nothing else: for a GPU node, a container, or a class's shared service on
JupyterHub. Every option it does not know goes to the Jupyter server as it is
(``--InferApp.engine=openai``, ``--port=8000``, ``--ip=0.0.0.0``,
``--IdentityProvider.token=...``, ``--help-all``), and ``jupyter_server_config.py`` applies as
usual. ``/`` lands on ``infer/``, which sends a browser without a session to log in and
then on to ``infer/status``.

Started by JupyterHub as a service (the hub gives it ``JUPYTERHUB_SERVICE_NAME``,
``JUPYTERHUB_API_TOKEN``, ``JUPYTERHUB_SERVICE_URL``, ``JUPYTERHUB_SERVICE_PREFIX``, ...), it
also loads JupyterHub's own single-user extension (``jupyterhub.singleuser.extension``), the
one ``jupyterhub-singleuser`` runs: it listens where ``JUPYTERHUB_SERVICE_URL`` says, under the
prefix ``/services/<name>/`` the hub's proxy routes to it, and every request is authenticated
by the hub (a hub token, or a browser's hub OAuth cookie) and needs the scope
``access:services!service=<name>``. The user is then the hub user (``current_user.username``).
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Mapping
from typing import Any

# The module whose server extension point is JupyterHub's single-user extension
# (``jupyterhub.singleuser.extension.JupyterHubSingleUser``).
HUB_EXTENSION = "jupyterhub"
DEFAULT_URL = "/infer/"  # a browser without a session is sent to log in from there
HUB_SERVICE_ENV = ("JUPYTERHUB_API_TOKEN", "JUPYTERHUB_SERVICE_URL")
SHORTHANDS = (
    ("model", "model", "the model to serve: a checkpoint folder, a .gguf file, a Hugging Face id, or a name "
                       "InferApp.model_dirs lists (small for ~/models/small)"),
    ("engine", "engine", "auto, hf, simulated, openai (an upstream server), router, or a serving engine "
                         "started as a child: vllm, llama.cpp, sglang, command"),
    ("quantize", "quantize", "the weights as int4, int8 or none (bfloat16: --dtype bfloat16)"),
    ("dtype", "dtype", "the compute dtype: auto, float32, bfloat16, float16"),
    ("device", "device", "auto, cpu, cuda, mps"),
    ("threads", "num_threads", "CPU threads the engine uses (0: the cores it may use)"),
    ("max-model-len", "max_model_len", "the context a request may hold, in tokens (0: the model's own)"),
)


def shorthand_args(args: argparse.Namespace) -> list[str]:
    """``--model X`` and the like as the Jupyter server's ``--InferApp.model=X``."""
    return [f"--InferApp.{trait}={getattr(args, _dest(flag))}" for flag, trait, _ in SHORTHANDS
            if getattr(args, _dest(flag), None) is not None]


def _dest(flag: str) -> str:
    return flag.replace("-", "_")  # where argparse keeps --max-model-len


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Run the inference server alone (no notebook UI). Other options go to the Jupyter "
        "server: --InferApp.<trait>=..., --port, --ip, --IdentityProvider.token, --help-all."
    )
    parser.add_argument(
        "--hub", action=argparse.BooleanOptionalAction, default=None,
        help="authenticate through JupyterHub (default: when started by the hub as a service, "
             "that is when JUPYTERHUB_SERVICE_NAME and JUPYTERHUB_API_TOKEN are set)",
    )
    # The flags every other server takes, as the traits they stand for (an unknown one would
    # reach the Jupyter server, which only warns "Unrecognized alias" and serves the default).
    for flag, trait, what in SHORTHANDS:
        parser.add_argument(f"--{flag}", metavar=_dest(flag).upper(), help=f"{what} (--InferApp.{trait})")
    parser.allow_abbrev = False  # --h… or --no… belong to the Jupyter server, not to --hub
    parser.set_defaults(server_args=[])  # filled by the cli with the options it does not know


def as_hub_service(hub: bool | None, environ: Mapping[str, str]) -> bool:
    """Whether to authenticate through the hub. Not by default inside a user's own server on
    the hub (its terminals also see ``JUPYTERHUB_API_TOKEN``, but no service name)."""
    if hub is not None:
        return hub
    return bool(environ.get("JUPYTERHUB_SERVICE_NAME") and environ.get("JUPYTERHUB_API_TOKEN"))


def server_extensions(hub: bool) -> dict[str, bool]:
    """``ServerApp.jpserver_extensions`` for this server: ours, and the hub's under a hub.

    Nothing else: the extensions installed packages enable (JupyterLab, notebook, jupyter_lsp,
    terminals: ``jupyter_server_config.d``) are not looked for (``find_extensions=False``).
    """
    return {"jupyter_infer": True, HUB_EXTENSION: True} if hub else {"jupyter_infer": True}


def run(args: argparse.Namespace) -> int:
    from jupyter_server.serverapp import ServerApp

    hub = as_hub_service(args.hub, os.environ)
    if hub:
        missing = [name for name in HUB_SERVICE_ENV if not os.environ.get(name)]
        if missing:
            print(f"error: as a JupyterHub service, serve needs {' and '.join(missing)} in the "
                  "environment. JupyterHub sets them for a managed service that has a url "
                  "(c.JupyterHub.services = [{'name': 'infer', 'url': 'http://127.0.0.1:10101', "
                  "'command': [...]}]); an external service sets them itself (docs/deployment.md).",
                  file=sys.stderr)
            return 2
        # The hub extension picks the default URL: config first, then this (c.Spawner.default_url's way).
        os.environ.setdefault("JUPYTERHUB_DEFAULT_URL", DEFAULT_URL)
    argv = shorthand_args(args) + list(args.server_args)  # given after, the long form wins
    if hasattr(os, "geteuid") and os.geteuid() == 0 and "--allow-root" not in argv:
        argv.append("--allow-root")  # containers and hub services often run as root
    # These values yield to config files and the command line, except jpserver_extensions
    # (ServerApp.initialize keeps what it was given); an extension a config file names explicitly
    # still loads, those that packages enable by being installed do not (find_extensions=False).
    app = ServerApp.instance(jpserver_extensions=server_extensions(hub), default_url=DEFAULT_URL)
    app.initialize(argv, find_extensions=False)
    error = configuration_error(app)
    if error is not None:  # a server alone that could only answer 503 is no use: say why and exit
        print(f"error: {error} Fix the option and start again.", file=sys.stderr)
        return 2
    stop_on_interrupt(app)
    app.start()
    return 0


def configuration_error(app: Any) -> str | None:
    """What is wrong with the inference service's options (``InferApp.config_error``), if anything.
    An option traitlets itself refuses (a value of the wrong type) fails the extension's linking:
    jupyter_server logs it and serves on without the extension, every option dropped."""
    manager = app.extension_manager
    if not manager.linked_extensions.get("jupyter_infer", False):
        return ("The jupyter_infer extension could not start with these options: an --InferApp option has a "
                "value of the wrong type (the log above names it; a list option takes its values as "
                "--InferApp.name=value repeated, or [a, b] in a config file).")
    extension = manager.extensions.get("jupyter_infer")
    points = extension.extension_points.values() if extension is not None else ()
    return next((p.app.config_error for p in points if getattr(p.app, "config_error", None)), None)


def stop_on_interrupt(app: Any) -> None:
    """^C (and the SIGINT a hub sends a service first) stops the server cleanly, engine
    included, without the notebook server's prompt; a second one exits at once. (Away from a
    terminal, jupyter_server leaves SIGINT to Python: the loop dies without its cleanup.)"""

    loop = app.io_loop.asyncio_loop

    def interrupted() -> None:
        app.log.critical("jupyter infer serve: interrupted, stopping (again to exit at once)")
        loop.remove_signal_handler(signal.SIGINT)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        app.stop(from_signal=True)

    # Through the loop (its wakeup fd), not signal.signal: the kernel may hand the signal to any
    # thread (the engine's, OpenMP's), and a plain handler then waited for the loop's next timer
    # to run: a CI run saw the server sit through 30 s after ^C. The wakeup fd also wakes the
    # loop for the other signals jupyter_server handles (SIGTERM).
    loop.add_signal_handler(signal.SIGINT, interrupted)
