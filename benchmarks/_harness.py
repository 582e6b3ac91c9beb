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

__all__ = ["Row", "compare", "print_rows", "write_results"]

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
    seconds per run. The target holds when the ratio is at least ``min_ratio``.
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
        ours_fig, raw_fig, unit = ours, raw, "s"
    ours_med = statistics.median(ours_fig)
    raw_med = statistics.median(raw_fig)
    ratio = ours_med / raw_med if better == "higher" else raw_med / ours_med
    return Row(
        workload=workload,
        unit=unit,
        fractor=ours_med,
        baseline=raw_med,
        fractor_min=min(ours_fig),
        fractor_max=max(ours_fig),
        baseline_min=min(raw_fig),
        baseline_max=max(raw_fig),
        ratio=ratio,
        target=f">= {min_ratio:g} x raw",
        holds=ratio >= min_ratio,
    )


def _fmt(value: float, unit: str) -> str:
    return f"{value:,.0f} {unit}" if unit == "ops/s" else f"{value * 1000:,.2f} ms"


def print_rows(rows: list[Row]) -> None:
    header = f"{'workload':<34} {'fractor':>16} {'raw anyio':>16} {'ratio':>7}  target"
    print(header)
    print("-" * len(header))
    for row in rows:
        verdict = "ok" if row.holds else "MISSED"
        print(
            f"{row.workload:<34} {_fmt(row.fractor, row.unit):>16} "
            f"{_fmt(row.baseline, row.unit):>16} {row.ratio:>7.2f}  {row.target} {verdict}"
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
