"""``python -m benchmarks``: ``jupyter infer bench`` with the other servers and libraries beside
ours (``make bench``). The same options, and llama.cpp's."""

from __future__ import annotations

import argparse
import sys

from benchmarks.suite import PeerSuite
from jupyter_infer.commands import bench

WORKLOADS = (*bench.WORKLOADS, "cpu", "real_size", "embeddings")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__.splitlines()[0])
    bench.add_arguments(parser, WORKLOADS)
    bench.add_peer_arguments(parser)
    parser.set_defaults(workloads=WORKLOADS)
    args = parser.parse_args(argv)

    def quality(results: dict) -> str:
        from benchmarks.cpu import format_quality

        return format_quality(results["cpu_quality"]) if "cpu_quality" in results else ""

    return bench.run(args, PeerSuite, quality)


if __name__ == "__main__":
    sys.exit(main())
