"""The benchmark harness runs and reports coherent rows (never a timing assertion)."""

from __future__ import annotations

import json
import pathlib

from benchmarks import w4_mailbox
from benchmarks._harness import print_rows, write_results


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
