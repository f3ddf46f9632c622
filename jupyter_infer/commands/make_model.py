"""``jupyter infer make-model DIR``: a small model built here, with random weights
(``model_builder``) or trained for a while on local text (``model_training``, ``--train``)."""

from __future__ import annotations

import argparse

from .model_builder import SIZE_HELP, SIZES, make_model
from .model_training import train_model


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("directory", help="where to save the model (save_pretrained layout)")
    parser.add_argument("--size", choices=SIZES, default="tiny", metavar="SIZE",
                        help="the model's shape (random weights unless --train; default: tiny): "
                             + "; ".join(f"{name}: {SIZE_HELP[name]}" for name in SIZES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--context", type=int, default=None, metavar="TOKENS",
                        help="positions the model takes (default: the size's, 512 for tiny); more leaves room "
                             "for tool schemas in the prompt")
    parser.add_argument("--train", type=float, default=0, metavar="SECONDS",
                        help="train it for this long on local text instead of leaving its weights random")
    parser.add_argument("--text", action="append", metavar="PATH",
                        help="with --train: text files or folders to train on (default: Python's standard library)")


def run(args: argparse.Namespace) -> int:
    if args.context is not None and not 16 <= args.context <= 131072:
        raise SystemExit("make-model: --context is a number of positions from 16 to 131072")
    if args.train and args.context:
        raise SystemExit("make-model: --context is for a random-weight model; a trained one keeps its size's")
    if args.text and not args.train:
        raise SystemExit("make-model: --text is what --train SECONDS trains on; give --train too")
    if args.train:
        path = train_model(args.directory, args.size, seconds=args.train, texts=args.text, seed=args.seed)
        print(f"trained {args.size!r} model in {path}; serve it with: jupyter infer serve --model {path}")
        return 0
    path = make_model(args.directory, args.size, seed=args.seed, context=args.context)
    print(f"built {args.size!r} model in {path}; serve it with: jupyter infer serve --model {path}")
    return 0
