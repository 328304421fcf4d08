"""The ``adaptive`` command line: one module per group of commands, each adding its subcommands.

* :mod:`lab.cli.decoding`: ``exactness``, ``costmodel``, ``generate``, ``demo``
* :mod:`lab.cli.data`: ``profile``, ``record``, ``distill``, ...
* :mod:`lab.cli.experiments`: ``train``, ``evaluate``, ``retarget``, ``sweep``
* :mod:`lab.cli.serving`: ``loadtest``, ``train-batch``

:data:`lab.cli.commands.COMMANDS` names each command's module: only the module of the command being run is
imported (torch, transformers and stable-baselines3 with it), so ``adaptive --help`` and ``--version`` are instant.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version

from lab.cli.commands import COMMANDS

USAGE_ERROR = 2
"""The exit status of a refused input, as argparse's own for a bad argument."""


def package_version() -> str:
    """The installed adaptive-draft's version."""
    try:
        return version("adaptive-draft")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown (not installed)"


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The argument parser of the ``adaptive`` command: every command listed by its summary, and the full parsers of
    ``command``'s module (None: of every module)."""
    parser = argparse.ArgumentParser(prog="adaptive", description="Exact speculative decoding with draft policies judged by wall-clock throughput.")
    parser.add_argument("--version", action="version", version=f"adaptive-draft {package_version()}")
    parser.add_argument("--debug", action="store_true", help="on an error, show the full traceback instead of one line")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {module for module, _ in COMMANDS.values()} if command is None else {COMMANDS[command][0]} if command in COMMANDS else set()
    registered = set()
    for module in sorted(modules):
        importlib.import_module(module).register(commands)
        registered |= {name for name, (owner, _) in COMMANDS.items() if owner == module}
    for name, (_, summary) in COMMANDS.items():
        if name not in registered:
            commands.add_parser(name, help=summary)  # listed only: this run does not parse its arguments
    return parser


def _command_of(argv: Sequence[str]) -> str | None:
    """The subcommand ``argv`` names (its first argument that is not an option), if any."""
    return next((argument for argument in argv if not argument.startswith("-")), None)


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
    parser = build_parser(_command_of(argv) or "")
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
