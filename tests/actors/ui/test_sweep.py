"""The throughput sweep (``fractor.actors.ui._sweep``): levels, the knee, the chart."""

from __future__ import annotations

import xml.etree.ElementTree as ET

import anyio
import anyio.lowlevel
import pytest

from fractor.actors import tool
from fractor.actors.ui._sweep import (
    SweepInputError,
    SweepLevel,
    SweepReport,
    find_knee,
    format_sweep_table,
    parse_levels,
    render_sweep_svg,
    sweep,
)

SVG = "{http://www.w3.org/2000/svg}"


async def test_a_sweep_measures_each_level_and_charts_its_knee() -> None:
    # Where the knee of a tool behind a semaphore falls is a timing, measured by
    # ``make bench`` (benchmarks/sweep.py): here, what a sweep reports of each level.
    gate = anyio.Semaphore(2)
    most = 0
    inside = 0

    async def pooled(x: int) -> int:
        """Answer ``x``, at most 2 at once."""
        nonlocal most, inside
        async with gate:
            inside += 1
            most = max(most, inside)
            await anyio.lowlevel.checkpoint()
            inside -= 1
        return x

    seen: list[int] = []
    with anyio.fail_after(30):
        report = await sweep(
            pooled,
            [1, 2, 4],
            calls=12,
            arguments='{"x": 1}',
            on_level=lambda level: seen.append(level.concurrency),
        )
    assert report.tool == "pooled"
    assert seen == [1, 2, 4]
    assert [level.concurrency for level in report.levels] == [1, 2, 4]
    assert all(level.errors == 0 and level.calls == 12 for level in report.levels)
    assert all(level.p50 <= level.p95 <= level.p99 for level in report.levels)
    assert most == 2
    assert report.knee == find_knee(report.levels)
    # A report with a knee marks it in the table and the chart.
    knee = SweepReport(
        tool="pooled",
        levels=(level(2, 40, 0.1), level(4, 80, 0.1), level(8, 160, 0.1), level(16, 162, 0.2)),
        knee=8,
    )
    table = format_sweep_table(knee)
    assert "knee at concurrency 8" in table
    (knee_row,) = [line for line in table.splitlines() if line.endswith("<- knee")]
    assert knee_row.split()[0] == "8"
    root = ET.fromstring(render_sweep_svg(knee).encode())
    marker = root.find(f"{SVG}g[@class='knee']")
    assert marker is not None
    assert "knee: 8" in "".join(marker.itertext())
    texts = "".join(root.itertext())
    assert "concurrency (calls in flight)" in texts
    assert "throughput (calls/s)" in texts
    assert "p95 latency (ms)" in texts
    assert root.find(f"{SVG}polyline[@class='throughput']") is not None
    assert root.find(f"{SVG}polyline[@class='p95']") is not None


async def test_a_sync_tool_and_a_tool_that_fails_are_measured_too() -> None:
    def quick(x: int) -> int:
        """Answer ``x``; refuse 0."""
        if x == 0:
            raise ValueError("zero")
        return x

    report = await sweep(quick, [1, 2], calls=5, arguments='{"x": 0}')
    assert [level.errors for level in report.levels] == [5, 5]

    @tool(name="named")
    async def named(x: int) -> int:
        """Answer ``x``."""
        return x

    report = await sweep(named, [3], calls=7, arguments='{"x": 2}')
    assert report.tool == "named"
    assert report.levels[0].errors == 0
    assert report.knee is None
    ET.fromstring(render_sweep_svg(report).encode())
    assert "no knee" in format_sweep_table(report)


def level(concurrency: int, throughput: float, p95: float) -> SweepLevel:
    return SweepLevel(
        concurrency=concurrency,
        calls=10,
        errors=0,
        wall_seconds=1.0,
        throughput=throughput,
        p50=p95,
        p95=p95,
        p99=p95,
    )


def test_the_knee_rule_needs_flat_throughput_and_rising_latency() -> None:
    # Flat throughput with flat latency is no knee; growing throughput is none either.
    assert find_knee([level(1, 100, 0.01), level(2, 105, 0.0105)]) is None
    assert find_knee([level(1, 100, 0.01), level(2, 190, 0.02)]) is None
    assert find_knee([level(1, 100, 0.01), level(2, 190, 0.01), level(4, 200, 0.02)]) == 2
    assert find_knee([level(4, 200, 0.02), level(1, 100, 0.01), level(2, 190, 0.01)]) == 2
    assert find_knee([]) is None


@pytest.mark.parametrize(
    ("text", "levels"),
    [
        ("1,2,4,...,64", (1, 2, 4, 8, 16, 32, 64)),
        ("1, 3, 5", (1, 3, 5)),
        ("8", (8,)),
        ("3,...,20", (3, 6, 12, 20)),
    ],
)
def test_levels_are_read_with_doubling_between_dots(text: str, levels: tuple[int, ...]) -> None:
    assert parse_levels(text) == levels


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("", "is not an integer"),
        ("1,a,4", "'a' is not an integer"),
        ("0,1", "a level must be >= 1"),
        ("4,2", "levels must increase"),
        ("...,4", "'...' must stand between two levels"),
        ("1,...", "'...' between two"),
    ],
)
def test_a_bad_level_list_says_what_is_wrong(text: str, why: str) -> None:
    with pytest.raises(SweepInputError, match="expected concurrency levels like 1,2,4") as caught:
        parse_levels(text)
    assert why in str(caught.value)


async def test_calls_below_one_are_refused() -> None:
    async def noop() -> None:
        """Nothing."""

    with pytest.raises(SweepInputError, match="--calls must be >= 1"):
        await sweep(noop, [1], calls=0)
