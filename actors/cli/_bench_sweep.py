"""``fractor bench --tool MODULE:FUNCTION --sweep 1,2,4,...,64 [--calls N] [--svg FILE]``.

The tool is called ``--calls`` times (default ``DEFAULT_CALLS``) at each concurrency
level of ``--sweep`` (``fractor.actors.ui._sweep``); the table of throughput and
p50/p95/p99 latency is printed with the knee, and ``--svg FILE`` writes the chart.
Bad options (an unknown module or function, a bad level list, a count below 1,
options of the other forms) exit with status 2 and a message, before anything runs.
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import anyio

from ..ui.charts import (
    SweepInputError,
    SweepReport,
    as_tool,
    format_sweep_table,
    parse_levels,
    render_sweep_svg,
    sweep,
)
from ._tool_bench import BenchInputError, check_arguments, load_target

__all__ = ["DEFAULT_CALLS", "sweep_command"]

#: Calls per level when ``--calls`` is not given.
DEFAULT_CALLS = 100


def sweep_command(args: argparse.Namespace) -> int:
    """Run a sweep; the exit status (0, or 1 when some call failed). Starts its own loop."""
    if args.sweep is None:
        return _fail("--svg only applies with --sweep LEVELS")
    stray = [f"--{name}" for name in ("fanout", "concurrency", "json") if getattr(args, name)]
    if stray:
        return _fail(f"{', '.join(stray)} do not apply with --sweep (it sets the concurrency)")
    calls: int = DEFAULT_CALLS if args.calls is None else args.calls
    if calls < 1:
        return _fail(f"--calls must be a whole number >= 1, got {calls}")
    arguments: str = "{}" if args.args is None else args.args
    svg = None if args.svg is None else pathlib.Path(args.svg)
    if svg is not None and not svg.parent.is_dir():
        return _fail(f"--svg {args.svg!r}: the directory {str(svg.parent)!r} does not exist")
    try:
        levels = parse_levels(args.sweep)
        target = load_target(args.tool)
        check_arguments(as_tool(target), arguments)
        report = anyio.run(_run, target, levels, calls, arguments, backend=args.backend)
    except (SweepInputError, BenchInputError) as exc:
        return _fail(str(exc))
    sys.stdout.write(format_sweep_table(report))
    if svg is not None:
        svg.write_text(render_sweep_svg(report), encoding="utf-8")
        print(f"wrote the chart to {svg}", file=sys.stderr)
    return 1 if any(level.errors for level in report.levels) else 0


async def _run(target: object, levels: tuple[int, ...], calls: int, arguments: str) -> SweepReport:
    return await sweep(target, levels, calls=calls, arguments=arguments)


def _fail(message: str) -> int:
    print(f"fractor bench: {message}", file=sys.stderr)
    return 2
