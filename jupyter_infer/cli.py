"""``jupyter infer <command>``: each command lives in its own module, which provides
``add_arguments(parser)`` and ``run(args) -> int``."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = {
    "demo": ("jupyter_infer.demo", "run the server and show requests being grouped into batches"),
    "loadgen": ("jupyter_infer.loadgen", "Poisson arrivals against the engine; latency percentiles"),
    "bench": ("jupyter_infer.bench", "benchmark our batching against the alternatives"),
    "make-model": ("jupyter_infer.engine.model_builder", "build a small random-weight model locally"),
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="jupyter infer", description="jupyter_infer command line")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, (module, help_text) in COMMANDS.items():
        command = sub.add_parser(name, help=help_text, description=help_text)
        command.set_defaults(_module=module)
        importlib.import_module(module).add_arguments(command)
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 2
    return importlib.import_module(args._module).run(args) or 0


if __name__ == "__main__":
    sys.exit(main())
