"""``fractor ui --db FILE [--port N]``: the executions of a SQLite store as pages.

It serves, on 127.0.0.1, the list of the store's top-level executions (agent, task,
status, usage, time, when) and for each a timeline of its whole tree, with each
step's request, usage and error on click (``fractor.actors.ui.serve_stored``). Every
request needs the token of the URL, printed once on stderr; Ctrl-C (or SIGTERM)
stops it. A missing file, or one that is no store, exits with status 2 and a
message before anything is served. It needs the ``ui`` extra (Starlette, uvicorn).
"""

from __future__ import annotations

import argparse
import signal
import sys
from typing import Any

import anyio

from fractor.runtime import StoreError

from ._trace import DEFAULT_DB, default_db
from ._ui import check_ui

__all__ = ["add_ui_parser", "ui_command"]


def add_ui_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``ui`` command to the ``fractor`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "ui",
        help="serve a store's executions as timelines in the browser",
        description="Serve the executions of a SQLite store on 127.0.0.1: a list, and a "
        "timeline of each (steps, tool calls side by side, subagents, attempts), with each "
        "step's request, usage and error on click. Ctrl-C stops it.",
    )
    parser.add_argument(
        "--db",
        metavar="FILE",
        default=None,
        help=f"the SQLite store to serve (default: $FRACTOR_DB, else {DEFAULT_DB})",
    )
    parser.add_argument(
        "--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)"
    )
    return parser


async def ui_command(args: argparse.Namespace) -> int:
    """Run ``fractor ui``; the exit code (0 once stopped by Ctrl-C or SIGTERM)."""
    db: str = args.db or default_db()
    try:
        check_ui()
        from ..ui import serve_stored

        served = serve_stored(db, port=args.port)
    except ValueError as exc:
        return _fail(str(exc))
    with anyio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        try:
            async with served:
                print("serving until Ctrl-C", file=sys.stderr, flush=True)
                async for _ in signals:
                    break
        except FileNotFoundError as exc:
            return _fail(str(exc))
        except (StoreError, OSError) as exc:
            return _fail(f"cannot serve {db!r}: {exc}")
    print("stopped", file=sys.stderr, flush=True)
    return 0


def _fail(message: str) -> int:
    print(f"fractor ui: {message}", file=sys.stderr)
    return 2
