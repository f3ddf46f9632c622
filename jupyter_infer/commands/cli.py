"""``jupyter infer <command>``: each command lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``. A command whose parser has a
``server_args`` default gets the options it does not know there, in order."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("jupyter_infer.commands.demo", "run the server and show requests being grouped into batches"),
    "loadgen": ("jupyter_infer.commands.loadgen", "Poisson arrivals against the engine; latency percentiles"),
    "bench": ("jupyter_infer.commands.bench", "benchmark our batching against the alternatives"),
    "make-model": ("jupyter_infer.commands.make_model", "build a small model locally (random weights, or --train)"),
    "serve": ("jupyter_infer.commands.serve", "run the inference server alone (no notebook UI), or as a JupyterHub service"),
}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(prog="jupyter infer", description="jupyter_infer command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    # Only the named command's module is imported: make-model's brings torch and transformers
    # (~290 MB, 2-3 s), bench's its peers' clients. `serve` then holds just what it serves.
    named = next((arg for arg in argv if not arg.startswith("-")), None)
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        if name == named:
            importlib.import_module(module).add_arguments(command)
    args, rest = parser.parse_known_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    # A command that passes options on (serve: to the Jupyter server) has a server_args default.
    if rest and not hasattr(args, "server_args"):
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    if rest:
        args.server_args = rest
    return importlib.import_module(args._module).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
