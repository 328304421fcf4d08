"""The ``adaptive`` command line: one module per group of commands, each adding its subcommands.

* :mod:`lab.cli.decoding`: ``exactness``, ``costmodel``, ``generate``, ``demo``
* :mod:`lab.cli.data`: ``profile``, ``record``, ``distill``
* :mod:`lab.cli.experiments`: ``train``, ``evaluate``, ``retarget``
* :mod:`lab.cli.serving`: ``loadtest``, ``train-batch``
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from lab.cli import data, decoding, experiments, serving


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``adaptive`` command."""
    parser = argparse.ArgumentParser(prog="adaptive", description="Exact speculative decoding with draft policies judged by wall-clock throughput.")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (decoding, data, experiments, serving):
        group.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adaptive`` console script."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ValueError as error:
        print(f"adaptive {args.command}: error: {error}", file=sys.stderr)
        return 2
