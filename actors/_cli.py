"""The ``fractor`` command line."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from ._cli_run import add_run_parser, run_command
from ._cli_trace import add_trace_parser, trace_command

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="fractor", description="An actor runtime for nested LLM agents."
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    demo = commands.add_parser("demo", help="run the built-in demo (no network, no API key)")
    demo.add_argument("--workers", type=int, default=4, help="worker actors (default 4)")
    demo.add_argument("--jobs", type=int, default=200, help="jobs to hand out (default 200)")
    demo.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop to run on"
    )
    add_trace_parser(commands)
    add_run_parser(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "demo":
        from ._demo import run_kernel_demo

        if args.workers < 1 or args.jobs < 0:
            print("fractor demo: --workers must be >= 1 and --jobs >= 0", file=sys.stderr)
            return 2
        anyio.run(run_kernel_demo, args.workers, args.jobs, backend=args.backend)
        return 0
    if args.command == "trace":
        return anyio.run(trace_command, args)
    if args.command == "run":
        return anyio.run(run_command, args, backend=args.backend)
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
