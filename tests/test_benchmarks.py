"""The benchmark harness runs and reports coherent rows (never a timing assertion)."""

from __future__ import annotations

import json
import pathlib

import pytest

from fractor.actors import Compaction
from fractor.benchmarks import budget, memory, ui, w4_mailbox, whole_path
from fractor.benchmarks._harness import print_rows, write_results


async def test_w4_reports_both_sides_and_their_ratio(tmp_path: pathlib.Path) -> None:
    rows = await w4_mailbox.run(round_trips=200)
    (row,) = rows
    assert row.unit == "ops/s"
    assert row.fractor > 0
    assert row.baseline > 0
    assert row.fractor_min <= row.fractor <= row.fractor_max
    assert abs(row.ratio - row.fractor / row.baseline) < 1e-9
    assert row.holds == (row.ratio >= 0.5)
    out = tmp_path / "results.json"
    write_results(rows, "test", out)
    document = json.loads(out.read_text())
    assert document["backend"] == "test"
    assert document["rows"][0]["workload"] == row.workload
    print_rows(rows)


async def test_the_whole_k1_path_is_timed_per_path_beside_the_raw_loop() -> None:
    (row,) = await whole_path.run(paths=20)
    assert row.workload.startswith("Whole K=1 path")
    assert row.unit == "s"
    assert row.fractor_min <= row.fractor <= row.fractor_max
    assert row.baseline_min <= row.baseline <= row.baseline_max
    assert abs(row.ratio - row.baseline / row.fractor) < 1e-9
    assert row.target == f"<= {whole_path.TARGET:g} x raw per path"
    assert row.holds == (row.ratio >= 1 / whole_path.TARGET)


async def test_w6_reports_the_web_views_cost_beside_the_same_run_without_it() -> None:
    children = 200
    wall, cpu, rate, views = await ui.w6(children, 1, interval=0.01)
    assert wall.workload == f"W6 K={children} with the page open (wall)"
    for row in (wall, cpu):
        assert row.unit == "s"
        assert row.fractor > 0
        assert row.baseline > 0
        assert abs(row.ratio - row.baseline / row.fractor) < 1e-9
    assert wall.holds == (wall.ratio >= 1 / ui.W6_TARGET)
    events = await ui.events_of(children)
    assert events > 10 * children  # spawns, steps, requests, tool calls of each child
    assert f"({events:,} events a run)" in rate.workload
    assert abs(rate.fractor - events / wall.fractor) < 1e-6 * rate.fractor
    assert abs(rate.baseline - events / wall.baseline) < 1e-6 * rate.baseline
    assert views.unit == "count"
    assert views.fractor >= 0
    print_rows([wall, cpu, rate, views])


async def test_budget_rows_are_coherent_and_never_overshoot() -> None:
    children = 5
    needs = await budget.demand(children)
    assert needs == await budget.demand(children)  # the demand is known exactly
    assert needs.requests == 2 + sum(2 + i % 2 for i in range(children))
    used, overshoot, wall = await budget.run(quick=True, children=children)

    assert used.workload == f"Budget: utilization at 60% of demand, K={children}"
    assert used.unit == "x"
    assert used.baseline == used.baseline_min == used.baseline_max == 1.0
    assert 0 <= used.fractor_min <= used.fractor <= used.fractor_max <= 1
    assert abs(used.ratio - used.fractor / used.baseline) < 1e-9
    assert used.holds == (used.ratio >= budget.UTILIZATION_TARGET)

    assert overshoot.unit == "x"
    assert overshoot.fractor == overshoot.fractor_max == overshoot.fractor_min == 0
    assert overshoot.ratio == 1.0
    assert overshoot.holds

    assert wall.unit == "s"
    assert wall.fractor > 0
    assert wall.baseline > 0
    assert wall.fractor_min <= wall.fractor <= wall.fractor_max
    assert wall.baseline_min <= wall.baseline <= wall.baseline_max
    assert abs(wall.ratio - wall.baseline / wall.fractor) < 1e-9
    assert wall.target == "<= 1.2 x none, completes"
    if wall.holds:
        assert wall.ratio >= 1 / budget.WALL_TARGET
    print_rows([used, overshoot, wall])


async def test_memory_compaction_bounds_the_context_and_the_rows_say_so() -> None:
    turns = 120
    compaction = Compaction(threshold=memory.THRESHOLD, keep=memory.KEEP)
    none = await memory.converse(turns, None)
    folded = await memory.converse(turns, compaction)
    raw = await memory.raw(turns)
    # Without memory fractor sends the raw loop's context: every turn, nothing folded.
    assert (none.messages, none.tokens) == (raw.messages, raw.tokens) == (2 * turns - 1, raw.peak)
    assert none.covered == 0
    assert not any(none.summarized)
    # With it: a summary, the turns it covers gone from the context, the rest verbatim.
    assert any(folded.summarized)
    verbatim = (folded.messages - 2) // 2  # the summary, the earlier turns, the task
    assert folded.covered > 0
    assert folded.covered + verbatim + 1 == turns
    assert folded.summary_tokens > 0
    assert folded.peak <= memory.THRESHOLD + folded.summary_tokens + 4
    assert folded.tokens < none.tokens / 2

    rows = await memory.run(turns=turns, repeats=1)
    at = f"Memory T={turns}"
    assert [row.workload for row in rows] == [
        f"{at} context, none ({2 * turns - 1} msgs)",
        f"{at} context, compaction ({folded.messages} msgs)",
        "  peak context over every turn, compaction",
        f"{at} per step, none",
        f"{at} per step, compaction",
        f"  amortized, last {memory.AMORTIZED} turns, compaction",
        "  a turn with its summarization",
        f"{at} per step / T={memory.EARLY}, compaction",
        f"{at} per step / T={memory.EARLY}, none",
    ]
    context, compacted, peak = rows[:3]
    assert context.fractor == context.baseline == raw.tokens
    assert context.holds
    assert compacted.fractor == folded.tokens < context.fractor
    assert compacted.ratio > 2
    assert peak.fractor == folded.peak
    assert peak.holds
    for row in rows[3:7]:
        assert row.unit == "s"
        assert 0 < row.fractor_min <= row.fractor <= row.fractor_max
        assert abs(row.ratio - row.baseline / row.fractor) < 1e-9
    flat = rows[7]
    assert flat.unit == "x"
    assert flat.holds == (flat.ratio <= memory.FLAT_TARGET)
    print_rows(rows)


# The bare client's streams (the SDK's, not fractor's) stop reading at "[DONE]" and
# leave their async generators to the garbage collector, which trio warns about.
@pytest.mark.filterwarnings(
    "ignore:Async generator '(openai|httpx|httpcore)[^']*' was garbage collected:ResourceWarning"
)
async def test_provider_rows_are_coherent() -> None:
    pytest.importorskip("openai")
    from fractor.benchmarks import provider

    # The rows' shape, not their figures (make bench measures those): 10 agents, once.
    rows = await provider.run(quick=True, agents=10, repeats=1)
    modes = ["not streamed", "streamed"]
    assert [row.workload for row in rows] == [f"Provider path: 10 agents, {m}" for m in modes]
    for row in rows:
        assert row.unit == "ops/s"
        assert row.fractor > 0
        assert row.baseline > 0
        assert row.fractor_min <= row.fractor <= row.fractor_max
        assert row.baseline_min <= row.baseline <= row.baseline_max
        assert abs(row.ratio - row.fractor / row.baseline) < 1e-9
        assert row.target == ">= 0.9 x bare AsyncOpenAI"
        assert row.holds == (row.ratio >= provider.TARGET)
    print_rows(rows)
