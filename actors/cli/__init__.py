"""The ``fractor`` command line: the edge of ``actors``, above the core and the providers.

``main`` is the console entry (``fractor = "fractor.actors.cli:main"``); ``fractor --version``
prints the installed distribution's version. Each command is a module of its own:

- ``_run.py``: ``fractor run``, one task on a real model (``fractor.actors.providers``).
- ``_demo.py``: ``fractor demo``, the scripted research team of ``_scenario.py`` in
  the scripted world of ``_world.py``, with the usage table of ``_usage.py``.
- ``_trace.py``: ``fractor trace``, a stored or exported execution as a tree.
- ``_ui_db.py``: ``fractor ui --db FILE``, a store's executions as timelines in the
  browser (``fractor.actors.ui``; the ``ui`` extra).
- ``_mcp_serve.py``: ``fractor mcp-serve``, an agent served as one MCP tool
  (``fractor.actors.integrations.mcp_serve``; the ``mcp`` extra), on asyncio.
- ``_bench.py``: ``fractor bench``, the benchmark suite (``python -m benchmarks``, in
  a subprocess: the product never imports ``benchmarks``) or one of your tools under
  the runtime (``_tool_bench.py``).

``_live.py`` is the live view the commands share; ``actors`` re-exports its ``watch``
(rich is loaded once a view is made: ``_draw.py`` draws its tree).
``_imports.py`` imports what the user names as ``MODULE:NAME`` (``run --tool``,
``bench --tool``, ``mcp-serve``), the current directory included, one way for all.
Nothing below this package (the core, the providers, the kernel) imports it.
"""

import argparse
import collections.abc
import os
import sys

import anyio

from .._version import VERSION as _VERSION

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    # The commands are imported when the command line runs, not with the package:
    # ``import fractor.actors`` (which re-exports ``watch`` from ``_live.py``) loads none of them.
    from . import _bench, _demo, _mcp_serve, _run, _trace, _ui_db

    parser = argparse.ArgumentParser(
        prog="fractor", description="An actor runtime for nested LLM agents."
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_VERSION}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    _demo.add_demo_parser(commands)
    _trace.add_trace_parser(commands)
    _ui_db.add_ui_parser(commands)
    _run.add_run_parser(commands)
    _bench.add_bench_parser(commands)
    _mcp_serve.add_mcp_serve_parser(commands)
    return parser


def main(argv: collections.abc.Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _dispatch(args)
    except BrokenPipeError:
        # The reader went away (`fractor demo | head`): stop quietly, as a pipe expects,
        # and let nothing write to the closed stdout again at exit.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _dispatch(args: argparse.Namespace) -> int:
    from . import _bench, _demo, _mcp_serve, _run, _trace, _ui_db

    if args.command == "demo":
        return anyio.run(_demo.demo_command, args, backend=args.backend)
    if args.command == "trace":
        return anyio.run(_trace.trace_command, args)
    if args.command == "ui":
        return anyio.run(_ui_db.ui_command, args)  # the server runs on asyncio anyway
    if args.command == "run":
        return anyio.run(_run.run_command, args, backend=args.backend)
    if args.command == "mcp-serve":
        # The mcp SDK's HTTP server is uvicorn, on asyncio; stdio runs there too.
        return anyio.run(_mcp_serve.mcp_serve_command, args, backend="asyncio")
    if args.command == "bench":
        return _bench.bench_command(args)  # starts its own event loop
    return 2  # pragma: no cover - argparse rejects unknown commands
