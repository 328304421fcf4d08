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

USAGE_ERROR = 2
"""The exit status of a refused input, as argparse's own for a bad argument."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``adaptive`` command."""
    parser = argparse.ArgumentParser(prog="adaptive", description="Exact speculative decoding with draft policies judged by wall-clock throughput.")
    parser.add_argument("--debug", action="store_true", help="on an error, show the full traceback instead of one line")
    commands = parser.add_subparsers(dest="command", required=True)
    for group in (decoding, data, experiments, serving):
        group.register(commands)
    return parser


def _undecodable(argv: Sequence[str]) -> str | None:
    """The first argument that is not valid UTF-8 (Python keeps such bytes as lone surrogates), if any."""
    for argument in argv:
        try:
            argument.encode("utf-8")
        except UnicodeEncodeError:
            return argument.encode("utf-8", "backslashreplace").decode()
    return None


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``adaptive`` console script. A refused input (a bad value, a missing or damaged file, a path
    that cannot be written) ends with one line naming it and exit status 2; ``--debug`` shows the traceback."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    bad = _undecodable(argv)
    if bad is not None:
        parser.error(f"argument {bad!r} is not valid UTF-8 text")
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (ValueError, OSError) as error:
        if args.debug:
            raise
        message = str(error) if isinstance(error, ValueError) else f"{error.strerror or error}: {error.filename or ''}".rstrip(": ")
        print(f"adaptive {args.command}: error: {message}", file=sys.stderr)
        return USAGE_ERROR
