"""``fractor trace ID|FILE``: render a stored or exported execution as a tree.

``FILE`` is a JSON export (``export_traces``, or ``--export`` of this command);
otherwise the argument is an execution id (``lead#1``, the ``execution_id`` of a
``Result``), looked up with all of its descendants in the SQLite database given by
``--db`` (default: ``$FRACTOR_DB``, else ``fractor.db`` in the current directory).
``--export OUT.json`` also writes the traces shown to a file. Exit code 2 with a
message on stderr for an unknown id or an unreadable file or database.
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any

import anyio

from fractor.runtime import SQLiteStore, StoreError

from .._messages import ExecutionTrace
from .._observation._traces import (
    TRACE_KIND,
    collect_trace_tree,
    export_traces,
    load_traces,
    render_trace_tree,
)

__all__ = ["DEFAULT_DB", "add_trace_parser", "default_db", "trace_command"]

#: The database ``fractor trace`` reads when neither ``--db`` nor ``$FRACTOR_DB`` is set.
DEFAULT_DB = "fractor.db"


def default_db() -> str:
    """``$FRACTOR_DB`` if set, else ``fractor.db``."""
    return os.environ.get("FRACTOR_DB") or DEFAULT_DB


def add_trace_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``trace`` command to the ``fractor`` command's subparsers."""
    parser: argparse.ArgumentParser = subparsers.add_parser(
        "trace",
        help="render a stored or exported execution as a tree",
        description="Render an execution and all its subagents as a tree: steps, tool "
        "calls, durations, usage and stop reasons.",
    )
    parser.add_argument(
        "target", metavar="ID|FILE", help="an execution id stored in --db, or a JSON export"
    )
    parser.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help=f"SQLite store to look ID up in (default: $FRACTOR_DB, else {DEFAULT_DB})",
    )
    parser.add_argument(
        "--export", metavar="OUT.json", default=None, help="also write the traces to OUT.json"
    )
    return parser


async def trace_command(args: argparse.Namespace) -> int:
    """Run ``fractor trace``; the exit code."""
    target: str = args.target
    if await anyio.Path(target).is_file():
        try:
            traces = load_traces(await anyio.Path(target).read_bytes())
        except (OSError, ValueError) as exc:
            return _fail(f"cannot read trace file {target!r}: {exc}")
    else:
        db: str = args.db or default_db()
        found = await _from_store(target, db)
        if isinstance(found, str):
            return _fail(found)
        traces = found
    sys.stdout.write(render_trace_tree(traces))
    if args.export:
        try:
            await anyio.Path(args.export).write_bytes(export_traces(traces))
        except OSError as exc:
            return _fail(f"cannot write {args.export!r}: {exc}")
        print(f"exported {len(traces)} trace(s) to {args.export}", file=sys.stderr)
    return 0


async def _from_store(execution_id: str, db: str) -> tuple[ExecutionTrace, ...] | str:
    """The traces of ``execution_id`` in ``db``, or why there are none."""
    if not await anyio.Path(db).is_file():
        return (
            f"{execution_id!r} is not a trace file, and there is no database at {db!r} "
            "to look it up in as an execution id (give one with --db PATH)"
        )
    try:
        async with SQLiteStore(db) as store:
            traces = await collect_trace_tree(store, execution_id)
            if traces:
                return traces
            recent = await store.records(parent_id="", kind=TRACE_KIND, limit=5)
    except StoreError as exc:
        return str(exc)
    hint = (
        "; recent executions: " + ", ".join(record.id for record in reversed(recent))
        if recent
        else "; it holds no traces"
    )
    return f"no execution {execution_id!r} in {db!r} (nor a file of that name){hint}"


def _fail(message: str) -> int:
    print(f"fractor trace: {message}", file=sys.stderr)
    return 2
