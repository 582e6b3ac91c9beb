"""A tool's throughput and latency against concurrency, its knee, and their chart.

``sweep(target, levels, calls=N)`` calls the tool (a ``@tool``, or a plain function,
async or sync, made one with ``tool``) ``N`` times at each concurrency level: ``level``
workers, in one anyio task group, take calls one after another until ``N`` ran. Each
call goes through ``Tool.invoke`` (arguments decoded against the tool's schema, its
timeout and retries); its latency is the wall time of that call, so waiting on
whatever the tool itself waits for (a pool, a semaphore, a rate limit) counts.
A level's throughput is ``N`` over the level's wall time.

**The knee** (``find_knee``): the first level, in increasing order, after which more
concurrency stops paying: going to the next level, throughput grows by less than
``KNEE_GAIN`` (10 %) while p95 latency grows (by more than ``KNEE_GAIN`` too). None
when throughput keeps growing (or latency stays flat) up to the last level.

``render_sweep_svg(report)`` draws throughput and p95 latency against concurrency
(a log-2 axis) as a self-contained SVG, the knee marked; ``format_sweep_table``
prints the levels as a table. ``parse_levels`` reads ``1,2,4,...,64``.
"""

from __future__ import annotations

import itertools
import math
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any
from xml.sax.saxutils import escape

import anyio
import msgspec

from .._messages import ToolCall
from .._tools._tool import Tool, ToolDefinitionError, tool

__all__ = [
    "KNEE_GAIN",
    "SweepInputError",
    "SweepLevel",
    "SweepReport",
    "as_tool",
    "find_knee",
    "format_sweep_table",
    "parse_levels",
    "render_sweep_svg",
    "sweep",
]

#: Throughput must grow by at least this fraction from one level to the next to pay.
KNEE_GAIN = 0.10


class SweepInputError(ValueError):
    """A sweep cannot run as asked; the message says what was wrong and what is expected."""


class SweepLevel(msgspec.Struct, frozen=True, kw_only=True):
    """One concurrency level: calls/s, latency percentiles (seconds), errors."""

    concurrency: int
    calls: int
    errors: int
    wall_seconds: float
    throughput: float
    p50: float
    p95: float
    p99: float


class SweepReport(msgspec.Struct, frozen=True, kw_only=True):
    tool: str
    levels: tuple[SweepLevel, ...]
    #: The knee's concurrency (``find_knee``), or None.
    knee: int | None


def parse_levels(text: str) -> tuple[int, ...]:
    """``"1,2,4,...,64"`` as levels: integers >= 1, increasing; ``...`` between two
    levels doubles from the one before up to the one after."""
    items = [item.strip() for item in text.split(",")]
    levels: list[int] = []
    pending = False
    for item in items:
        if item == "...":
            if not levels or pending:
                raise SweepInputError(_bad(text, "'...' must stand between two levels"))
            pending = True
            continue
        try:
            level = int(item)
        except ValueError:
            raise SweepInputError(_bad(text, f"{item!r} is not an integer")) from None
        if level < 1:
            raise SweepInputError(_bad(text, f"a level must be >= 1, got {level}"))
        if levels and level <= levels[-1]:
            raise SweepInputError(_bad(text, "levels must increase"))
        if pending:
            step = levels[-1] * 2
            while step < level:
                levels.append(step)
                step *= 2
            pending = False
        levels.append(level)
    if pending or not levels:
        raise SweepInputError(_bad(text, "give at least one level, '...' between two"))
    return tuple(levels)


def _bad(text: str, why: str) -> str:
    return f"--sweep {text!r}: {why}; expected concurrency levels like 1,2,4,...,64"


def as_tool(target: object) -> Tool[..., Any]:
    """``target`` as a ``Tool``: itself if it is one, else ``tool(target)``."""
    if isinstance(target, Tool):
        return target
    if not callable(target):
        raise SweepInputError(f"{target!r} is not a function, async or sync, nor a @tool")
    try:
        return tool(typing.cast(Any, target))
    except ToolDefinitionError as exc:
        raise SweepInputError(str(exc)) from None


async def sweep(
    target: object,
    levels: Sequence[int],
    *,
    calls: int,
    arguments: str = "{}",
    on_call: Callable[[int, int], None] | None = None,
    on_level: Callable[[SweepLevel], None] | None = None,
) -> SweepReport:
    """Measure ``target`` at each of ``levels`` (see the module's docstring).

    ``on_call(concurrency, done)`` is called as each call ends (how many of the
    level's calls ended so far) and ``on_level(level)`` as each level is measured:
    what a page showing the sweep as it runs reads (``fractor bench --sweep --ui``).
    """
    if calls < 1:
        raise SweepInputError(f"--calls must be >= 1, got {calls}")
    subject = as_tool(target)
    measured: list[SweepLevel] = []
    for level in levels:
        measured.append(await _level(subject, level, calls, arguments, on_call))
        if on_level is not None:
            on_level(measured[-1])
    return SweepReport(tool=subject.name, levels=tuple(measured), knee=find_knee(measured))


async def _level(
    subject: Tool[..., Any],
    level: int,
    calls: int,
    arguments: str,
    on_call: Callable[[int, int], None] | None,
) -> SweepLevel:
    latencies: list[float] = []
    errors = 0
    taken = 0

    async def worker() -> None:
        nonlocal errors, taken
        while taken < calls:
            taken += 1
            call = ToolCall(id=f"sweep-{level}-{taken}", name=subject.name, arguments=arguments)
            start = time.perf_counter()
            outcome = await subject.invoke(call)
            latencies.append(time.perf_counter() - start)
            errors += outcome.is_error
            if on_call is not None:
                on_call(level, len(latencies))

    began = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for _ in range(min(level, calls)):
            tg.start_soon(worker)
    wall = time.perf_counter() - began
    latencies.sort()
    return SweepLevel(
        concurrency=level,
        calls=calls,
        errors=errors,
        wall_seconds=wall,
        throughput=calls / wall if wall > 0 else math.inf,
        p50=_rank(latencies, 0.50),
        p95=_rank(latencies, 0.95),
        p99=_rank(latencies, 0.99),
    )


def _rank(ordered: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted values."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


def find_knee(levels: Sequence[SweepLevel]) -> int | None:
    """The first level after which throughput grows by less than ``KNEE_GAIN`` while
    p95 latency grows by more than ``KNEE_GAIN``; None if there is none."""
    ordered = sorted(levels, key=lambda level: level.concurrency)
    for here, after in itertools.pairwise(ordered):
        flat = after.throughput < here.throughput * (1 + KNEE_GAIN)
        slower = after.p95 > here.p95 * (1 + KNEE_GAIN)
        if flat and slower:
            return here.concurrency
    return None


def format_sweep_table(report: SweepReport) -> str:
    """The levels as a plain-text table, the knee's row marked, and the rule."""
    lines = [
        f"tool {report.tool}: {report.levels[0].calls if report.levels else 0} calls per level",
        f"{'concurrency':>11}  {'calls/s':>10}  {'p50 ms':>9}  {'p95 ms':>9}  {'p99 ms':>9}"
        f"  {'errors':>6}",
    ]
    for level in report.levels:
        mark = "  <- knee" if level.concurrency == report.knee else ""
        lines.append(
            f"{level.concurrency:>11}  {level.throughput:>10.1f}  {level.p50 * 1000:>9.1f}  "
            f"{level.p95 * 1000:>9.1f}  {level.p99 * 1000:>9.1f}  {level.errors:>6}{mark}"
        )
    if report.knee is None:
        lines.append("no knee: throughput still grows, or p95 latency stays flat, to the end")
    else:
        lines.append(
            f"knee at concurrency {report.knee}: past it throughput grows less than "
            f"{KNEE_GAIN:.0%} while p95 latency rises"
        )
    return "\n".join(lines) + "\n"


# -- the chart -----------------------------------------------------------------------

_W, _H = 720, 420
_LEFT, _RIGHT, _TOP, _BOTTOM = 70, 70, 40, 60


def render_sweep_svg(report: SweepReport) -> str:
    """Throughput (left axis) and p95 latency (right axis) against concurrency (log 2),
    the knee marked with a vertical line; a standalone SVG document."""
    levels = sorted(report.levels, key=lambda level: level.concurrency)
    width = _W - _LEFT - _RIGHT
    height = _H - _TOP - _BOTTOM
    logs = [math.log2(level.concurrency) for level in levels] or [0.0]
    low, high = min(logs), max(logs)
    best = max((level.throughput for level in levels), default=1.0) or 1.0
    slowest = max((level.p95 for level in levels), default=1.0) or 1.0

    def x(concurrency: int) -> float:
        if high == low:
            return _LEFT + width / 2
        return round(_LEFT + (math.log2(concurrency) - low) / (high - low) * width, 2)

    def y(value: float, top: float) -> float:
        return round(_TOP + height - value / top * height, 2)

    out = [
        '<?xml version="1.0" encoding="UTF-8"?>\n',
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_W}" height="{_H}" '
        f'viewBox="0 0 {_W} {_H}" class="fractor-sweep" font-family="sans-serif" '
        'font-size="11">',
        f"<title>{escape(report.tool)}: throughput and p95 latency against concurrency</title>",
        f'<text x="{_W / 2}" y="20" text-anchor="middle" font-size="13">'
        f"{escape(report.tool)}: throughput and p95 latency</text>",
        f'<rect x="{_LEFT}" y="{_TOP}" width="{width}" height="{height}" fill="#fafafa" '
        'stroke="#b0bec5"/>',
        f'<text x="{_W / 2}" y="{_H - 15}" text-anchor="middle" class="x-label">'
        "concurrency (calls in flight)</text>",
        f'<text x="18" y="{_TOP + height / 2}" text-anchor="middle" class="y-label" '
        f'fill="#1565c0" transform="rotate(-90 18 {_TOP + height / 2})">throughput (calls/s)'
        "</text>",
        f'<text x="{_W - 14}" y="{_TOP + height / 2}" text-anchor="middle" class="y-label" '
        f'fill="#c62828" transform="rotate(90 {_W - 14} {_TOP + height / 2})">'
        "p95 latency (ms)</text>",
    ]
    out.extend(
        f'<text x="{x(level.concurrency)}" y="{_TOP + height + 16}" '
        f'text-anchor="middle">{level.concurrency}</text>'
        for level in levels
    )
    for fraction in (0.0, 0.25, 0.5, 0.75, 1.0):
        ty = _TOP + height - fraction * height
        out.append(
            f'<text x="{_LEFT - 6}" y="{ty + 4}" text-anchor="end" fill="#1565c0">'
            f"{best * fraction:.0f}</text>"
            f'<text x="{_LEFT + width + 6}" y="{ty + 4}" fill="#c62828">'
            f"{slowest * fraction * 1000:.0f}</text>"
        )
    if report.knee is not None:
        kx = x(report.knee)
        out.append(
            f'<g class="knee"><title>knee at concurrency {report.knee}</title>'
            f'<line x1="{kx}" y1="{_TOP}" x2="{kx}" y2="{_TOP + height}" stroke="#6a1b9a" '
            f'stroke-dasharray="5,3" stroke-width="1.5"/>'
            f'<text x="{kx + 4}" y="{_TOP + 14}" fill="#6a1b9a">knee: {report.knee}</text></g>'
        )
    series: tuple[tuple[str, str, float, Callable[[SweepLevel], float]], ...] = (
        ("throughput", "#1565c0", best, _throughput),
        ("p95", "#c62828", slowest, _p95),
    )
    for name, colour, top, value in series:
        points = " ".join(f"{x(level.concurrency)},{y(value(level), top)}" for level in levels)
        out.append(
            f'<polyline class="{name}" points="{points}" fill="none" stroke="{colour}" '
            'stroke-width="2"/>'
        )
        for level in levels:
            shown = (
                f"{level.throughput:.1f} calls/s"
                if name == "throughput"
                else f"p95 {level.p95 * 1000:.1f} ms"
            )
            out.append(
                f'<circle cx="{x(level.concurrency)}" cy="{y(value(level), top)}" r="3" '
                f'fill="{colour}"><title>concurrency {level.concurrency}: {shown} '
                f"(p50 {level.p50 * 1000:.1f} ms, p99 {level.p99 * 1000:.1f} ms, "
                f"{level.errors} errors)</title></circle>"
            )
    out.append(
        f'<text x="{_LEFT + 8}" y="{_TOP + height - 8}" fill="#1565c0">— throughput</text>'
        f'<text x="{_LEFT + 110}" y="{_TOP + height - 8}" fill="#c62828">— p95 latency</text>'
    )
    out.append("</svg>\n")
    return "".join(out)


def _throughput(level: SweepLevel) -> float:
    return level.throughput


def _p95(level: SweepLevel) -> float:
    return level.p95
