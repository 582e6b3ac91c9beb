"""Timing, ratios and the results file shared by every benchmark."""

from __future__ import annotations

import json
import pathlib
import platform
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Literal

import msgspec

__all__ = ["Row", "compare", "judged", "print_rows", "summarize", "write_results"]

RESULTS = pathlib.Path(__file__).parent / "results.json"


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One benchmark figure, fractor beside its raw anyio baseline."""

    workload: str
    unit: str
    fractor: float
    baseline: float
    fractor_min: float
    fractor_max: float
    baseline_min: float
    baseline_max: float
    #: fractor / baseline for "higher is better" units, baseline / fractor otherwise,
    #: so a ratio of 1.0 means "as fast as the raw loop" and less is slower.
    ratio: float
    target: str
    holds: bool


async def _time(run: Callable[[], Awaitable[None]]) -> float:
    start = time.perf_counter()
    await run()
    return time.perf_counter() - start


async def compare(
    workload: str,
    *,
    fractor: Callable[[], Awaitable[None]],
    baseline: Callable[[], Awaitable[None]],
    operations: int,
    repeats: int = 5,
    better: Literal["higher", "lower"] = "higher",
    min_ratio: float,
) -> Row:
    """Time both sides ``repeats`` times, interleaved, after one warm-up each.

    With ``better="higher"`` the figure is operations per second; with "lower" it is
    seconds per operation. The target holds when the ratio is at least ``min_ratio``.
    """
    await fractor()
    await baseline()
    ours: list[float] = []
    raw: list[float] = []
    for _ in range(repeats):
        ours.append(await _time(fractor))
        raw.append(await _time(baseline))
    if better == "higher":
        ours_fig = [operations / t for t in ours]
        raw_fig = [operations / t for t in raw]
        unit = "ops/s"
    else:
        ours_fig = [t / operations for t in ours]
        raw_fig = [t / operations for t in raw]
        unit = "s"
    row = summarize(workload, unit, ours_fig, raw_fig, better=better)
    return judged(row, f">= {min_ratio:g} x raw", row.ratio >= min_ratio)


def summarize(
    workload: str,
    unit: str,
    ours: list[float],
    raw: list[float],
    *,
    better: Literal["higher", "lower"],
) -> Row:
    """A row from both sides' samples: medians, min and max, and the ratio (not
    judged yet: its target reads "unjudged" until ``judged`` sets one)."""
    ours_med = statistics.median(ours)
    raw_med = statistics.median(raw)
    return Row(
        workload=workload,
        unit=unit,
        fractor=ours_med,
        baseline=raw_med,
        fractor_min=min(ours),
        fractor_max=max(ours),
        baseline_min=min(raw),
        baseline_max=max(raw),
        ratio=ours_med / raw_med if better == "higher" else raw_med / ours_med,
        target="unjudged",
        holds=False,
    )


def _fmt(value: float, unit: str) -> str:
    if unit == "ops/s":
        return f"{value:,.0f} /s"
    if unit == "x":
        return f"{value:.2f} x"
    if unit == "MiB":
        return f"{value:,.1f} MiB"
    if unit == "tokens":
        return f"{value:,.0f} tok"
    if unit == "count":
        return f"{value:,.0f}"
    if value < 0.001:
        return f"{value * 1e6:,.1f} us"
    return f"{value * 1000:,.2f} ms"


def single(
    workload: str,
    unit: str,
    ours: float,
    raw: float,
    *,
    ratio: float,
    target: str = "unjudged",
    holds: bool = False,
) -> Row:
    """A row of one figure a side (min and max are that figure)."""
    return Row(
        workload=workload,
        unit=unit,
        fractor=ours,
        baseline=raw,
        fractor_min=ours,
        fractor_max=ours,
        baseline_min=raw,
        baseline_max=raw,
        ratio=ratio,
        target=target,
        holds=holds,
    )


def judged(row: Row, target: str, holds: bool) -> Row:
    """The same figures, judged against an absolute target instead of the ratio."""
    return msgspec.structs.replace(row, target=target, holds=holds)


def print_rows(rows: list[Row]) -> None:
    header = f"{'workload':<44} {'fractor':>14} {'raw anyio':>14} {'ratio':>6}  target"
    print(header)
    print("-" * len(header))
    for row in rows:
        verdict = "ok" if row.holds else "MISSED"
        print(
            f"{row.workload:<44} {_fmt(row.fractor, row.unit):>14} "
            f"{_fmt(row.baseline, row.unit):>14} {row.ratio:>6.2f}  {row.target}: {verdict}"
        )


def write_results(rows: list[Row], backend: str, path: pathlib.Path = RESULTS) -> None:
    document = {
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
        },
        "backend": backend,
        "rows": msgspec.to_builtins(rows),
    }
    path.write_text(json.dumps(document, indent=2) + "\n")
