"""``fractor demo``: the scripted research team of ``_scenario.py``, watched live.

::

    fractor demo                        # 3 researchers, a fact-checker, one tight budget
    fractor demo --fanout 5 --depth 2   # wider and deeper
    fractor demo --budget-tokens 20000  # the tight researcher has room to finish
    fractor demo --db /tmp/demo.db      # where the traces go (--no-store: nowhere)

It draws the live tree on a terminal (progress lines elsewhere, or with
``--plain``), then prints the lead's final answer, a usage table per agent, and the
``fractor trace`` command that shows the stored execution. Exit status: 0 when the
lead completed, 1 otherwise, 2 for bad options or a database that cannot be opened.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from typing import Any

from rich.console import Console
from rich.panel import Panel
from rich.text import Text

from fractor.runtime import StoreError

from ._draw import PipeConsole
from ._scenario import DEFAULT_BUDGET_TOKENS, QUESTION, DemoOptions, DemoRun, describe, run_demo
from ._trace import DEFAULT_DB, default_db
from ._ui import check_ui
from ._usage import print_usage

__all__ = ["add_demo_parser", "demo_command", "print_report"]

_USAGE = "usage per agent (each its own; the total covers everything)"


def add_demo_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``demo`` to the ``fractor`` subcommands (``parser.add_subparsers()``)."""
    demo: argparse.ArgumentParser = subparsers.add_parser(
        "demo",
        help="watch a scripted team of nested agents work (no network, no API key)",
        description=(
            "A lead agent spawns researcher subagents in parallel; they search, fetch pages "
            "and take notes; one delegates to a nested fact-checker; one runs out of its own "
            "token budget while the others complete; the lead merges what came back. Every "
            "model is scripted: no network, no API key."
        ),
    )
    demo.add_argument(
        "--fanout", type=int, default=3, metavar="N", help="researchers, 2 to 50 (default 3)"
    )
    demo.add_argument(
        "--depth",
        type=int,
        default=1,
        metavar="N",
        help="levels of nested fact-checkers under the first researcher, 0 to 8 (default 1)",
    )
    demo.add_argument(
        "--budget-tokens",
        type=int,
        default=DEFAULT_BUDGET_TOKENS,
        metavar="N",
        help=f"token budget of the last researcher (default {DEFAULT_BUDGET_TOKENS:,})",
    )
    demo.add_argument(
        "--db",
        metavar="PATH",
        default=None,
        help=f"SQLite store for the traces (default: $FRACTOR_DB, else {DEFAULT_DB})",
    )
    demo.add_argument("--no-store", action="store_true", help="do not store the traces")
    demo.add_argument(
        "--speed",
        type=float,
        default=1.0,
        metavar="X",
        help="divide every simulated latency by X, 0.1 to 1000 (default 1)",
    )
    demo.add_argument(
        "--plain", action="store_true", help="progress lines instead of the live tree"
    )
    demo.add_argument(
        "--ui",
        action="store_true",
        help="serve the web view of the tree on 127.0.0.1 while it runs "
        "(its URL, with its token, on stderr; --speed 0.1 to watch it longer)",
    )
    demo.add_argument(
        "--backend", choices=("asyncio", "trio"), default="asyncio", help="event loop to run on"
    )
    return demo


def options_from(args: argparse.Namespace) -> tuple[DemoOptions, list[str]]:
    """The options ``args`` ask for, and what is wrong with them."""
    db: str | None = None if args.no_store else (args.db or default_db())
    options = DemoOptions(
        fanout=args.fanout,
        depth=args.depth,
        budget_tokens=args.budget_tokens,
        speed=args.speed,
        db=db,
    )
    problems = options.check()
    if args.no_store and args.db:
        problems.append("--db and --no-store contradict each other: give one of them")
    if db is not None:
        folder = os.path.dirname(os.path.abspath(db))
        if not os.path.isdir(folder):
            problems.append(f"--db {db}: the folder {folder} does not exist")
        elif os.path.isdir(db):
            problems.append(f"--db {db} is a folder; give the path of a database file")
    return options, problems


async def demo_command(args: argparse.Namespace, *, console: Console | None = None) -> int:
    """Run ``fractor demo``; the exit status."""
    options, problems = options_from(args)
    if args.ui:
        try:
            check_ui()
        except ValueError as exc:
            problems.append(str(exc))
    if problems:
        for problem in problems:
            print(f"fractor demo: {problem}", file=sys.stderr)
        return 2
    console = PipeConsole(highlight=False) if console is None else console
    plain = True if args.plain else None
    first, second = describe(options)
    intro = (f"fractor demo: {first}", second, f"question: {QUESTION}")
    if args.plain or not console.is_terminal:
        console.out(*intro, sep="\n", highlight=False)
    else:
        console.print(intro[0], style="bold", markup=False, highlight=False)
        console.print(*intro[1:], sep="\n", style="dim", markup=False, highlight=False)
    try:
        run = await run_demo(options, console=console, plain=plain, ui=args.ui)
    except StoreError as exc:
        print(f"fractor demo: cannot use the database: {exc}", file=sys.stderr)
        return 2
    print_report(run, console, plain=args.plain or not console.is_terminal)
    return 0 if run.result.status == "completed" else 1


def print_report(run: DemoRun, console: Console, *, plain: bool) -> None:
    """The lead's answer, the usage per agent and where the trace is."""
    result = run.result
    stopped = [
        node
        for node in run.tree.nodes
        if node.name in run.researchers and node.status == "budget_exceeded"
    ]
    where = _where(run)
    if plain:
        out = console.out
        out(
            "", f"== the lead's answer ({result.status}) ==", result.text, sep="\n", highlight=False
        )
        out("")
        print_usage(run.tree, console, plain=True, title=_USAGE)
        out("", "== trace ==", *where, sep="\n", highlight=False)
        if not stopped:
            out(_no_stop_note(run), highlight=False)
        return
    title = f"the lead's answer · {result.status} · {result.steps} steps"
    console.print()
    console.print(Panel(Text(result.text), title=title, title_align="left", border_style="green"))
    print_usage(run.tree, console, plain=False, title=_USAGE)
    for line in where:
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    if not stopped:
        console.print(_no_stop_note(run), style="dim")


def _where(run: DemoRun) -> list[str]:
    db = run.options.db
    if db is None:
        return ["traces not stored (--no-store)"]
    command = shlex.join(["fractor", "trace", run.result.execution_id, "--db", db])
    return [
        f"trace saved: {run.stored_traces} executions in {db}",
        f"view it with: {command}",
    ]


def _no_stop_note(run: DemoRun) -> str:
    return (
        f"(no researcher ran out of budget: --budget-tokens {run.options.budget_tokens:,} "
        "left the last one enough room)"
    )
