"""The ``fractor`` command line."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import anyio

from ._bench import add_bench_parser, bench_command
from ._demo import add_demo_parser, demo_command
from ._run import add_run_parser, run_command
from ._trace import add_trace_parser, trace_command

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fractor", description="An actor runtime for nested LLM agents."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_demo_parser(commands)
    add_trace_parser(commands)
    add_run_parser(commands)
    add_bench_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except BrokenPipeError:
        # The reader went away (`fractor demo | head`): stop quietly, as a pipe expects,
        # and let nothing write to the closed stdout again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _run(args: argparse.Namespace) -> int:
    if args.command == "demo":
        return anyio.run(demo_command, args, backend=args.backend)
    if args.command == "trace":
        return anyio.run(trace_command, args)
    if args.command == "run":
        return anyio.run(run_command, args, backend=args.backend)
    if args.command == "bench":
        return bench_command(args)  # starts its own event loop
    return 2  # pragma: no cover - argparse rejects unknown commands
