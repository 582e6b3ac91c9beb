"""The throughput sweep (``fractor.actors.ui._sweep``): levels, the knee, the chart."""

from __future__ import annotations

import time
import xml.etree.ElementTree as ET

import anyio
import pytest

from fractor.actors import tool
from fractor.actors.ui._sweep import (
    KNEE_GAIN,
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


#: How long the process may be kept from running (by other processes on a loaded
#: machine) while levels 8 and 16 are measured, for the knee test to judge them.
STALL = 0.03
#: How many sweeps the knee test may run to get one the machine did not stall.
SWEEPS = 3


async def _watched_sweep(
    target: object, levels: list[int], calls: int
) -> tuple[SweepReport, dict[int, float]]:
    """``sweep(target, levels, calls=calls)``, and for each level the longest the
    process was kept from running while it was measured: how late a task asking to
    wake every 5 ms woke.

    A level's throughput is its calls over its wall time: a stall of the whole
    process adds to it. On two cores at load ~6-10 stalls of 30-150 ms were seen (a
    118 ms one made a 0.82 s level take 0.95 s); with 50 ms calls (0.4 s a level)
    one in level 8 made it look 10 % slower than 16: knee at 16. Calls of 100 ms
    make a level 0.8 s, and levels 8 and 16 are judged only when neither stalled
    over ``STALL`` (the p95 at 8 would be off by as much)."""
    lags: list[tuple[float, float]] = []
    spans: dict[int, tuple[float, float]] = {}

    async def watch() -> None:
        while True:
            asked = time.perf_counter()
            await anyio.sleep(0.005)
            woke = time.perf_counter()
            lags.append((woke, woke - asked - 0.005))

    def measured(level: SweepLevel) -> None:
        now = time.perf_counter()
        spans[level.concurrency] = (now - level.wall_seconds, now)

    async with anyio.create_task_group() as tg:
        tg.start_soon(watch)
        report = await sweep(target, levels, calls=calls, arguments='{"x": 1}', on_level=measured)
        tg.cancel_scope.cancel()
    stalls = {
        level: max((lag for at, lag in lags if start <= at <= end), default=0.0)
        for level, (start, end) in spans.items()
    }
    return report, stalls


async def test_a_tool_behind_a_semaphore_of_8_has_its_knee_at_8() -> None:
    gate = anyio.Semaphore(8)

    async def pooled(x: int) -> int:
        """Answer ``x`` after 100 ms, at most 8 at once."""
        async with gate:
            await anyio.sleep(0.1)
        return x

    seen: list[dict[int, float]] = []
    for _ in range(SWEEPS):
        with anyio.fail_after(30):
            report, stalls = await _watched_sweep(pooled, [2, 4, 8, 16, 32], calls=64)
        if max(stalls[8], stalls[16]) < STALL:
            break
        seen.append({level: round(lag, 3) for level, lag in stalls.items()})
    else:
        pytest.fail(f"levels 8 or 16 stalled in each of {SWEEPS} sweeps (s by level): {seen}")
    by = {level.concurrency: level for level in report.levels}
    assert report.tool == "pooled"
    assert report.knee == 8, format_sweep_table(report)
    assert all(level.errors == 0 and level.calls == 64 for level in report.levels)
    # Throughput grows up to 8 (about 20, 40, 80 calls/s), then stays flat ...
    assert by[4].throughput > 1.5 * by[2].throughput
    assert by[8].throughput > 1.5 * by[4].throughput
    for level in (16, 32):
        assert by[level].throughput < by[8].throughput * (1 + KNEE_GAIN)
    # ... while the calls wait longer for the semaphore.
    assert by[16].p95 > 1.5 * by[8].p95
    assert by[32].p95 > 1.5 * by[16].p95
    assert 0.095 < by[8].p50 < 0.18
    table = format_sweep_table(report)
    assert "knee at concurrency 8" in table
    (knee_row,) = [line for line in table.splitlines() if line.endswith("<- knee")]
    assert knee_row.split()[0] == "8"
    svg = render_sweep_svg(report)
    root = ET.fromstring(svg.encode())
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
