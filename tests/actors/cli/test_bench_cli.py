"""``fractor bench --tool MODULE:FUNCTION --sweep LEVELS [--calls N] [--svg FILE]``."""

from __future__ import annotations

import pathlib
import xml.etree.ElementTree as ET

import pytest

from fractor.actors.cli import main

TOOLS = "tests.actors.cli.sweep_tools"


def test_a_sweep_prints_the_table_and_writes_the_chart(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    chart = tmp_path / "sweep.svg"
    argv = ["bench", "--tool", f"{TOOLS}:nap", "--sweep", "1,2,...,8", "--calls", "16"]
    assert main([*argv, "--svg", str(chart)]) == 0
    out, err = capsys.readouterr()
    rows = [line.split() for line in out.splitlines() if line[:11].strip().isdigit()]
    assert [row[0] for row in rows] == ["1", "2", "4", "8"]
    assert all(float(row[1]) > 0 and row[5] == "0" for row in rows)
    assert "tool nap: 16 calls per level" in out
    assert f"wrote the chart to {chart}" in err
    root = ET.fromstring(chart.read_bytes())
    assert root.tag == "{http://www.w3.org/2000/svg}svg"
    assert "nap: throughput and p95 latency" in "".join(root.itertext())


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool", "no_such_module_here:nap", "--sweep", "1,2"], "no_such_module_here"),
        (["--tool", f"{TOOLS}:missing", "--sweep", "1,2"], "missing"),
        (["--tool", f"{TOOLS}", "--sweep", "1,2"], "MODULE:FUNCTION"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "1,x"], "--sweep '1,x': 'x' is not an integer"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "4,2"], "levels must increase"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "1", "--calls", "0"], "--calls must be"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "1", "--fanout", "2"], "--fanout do not apply"),
        (["--tool", f"{TOOLS}:nap", "--svg", "x.svg"], "--svg only applies with --sweep"),
        (["--tool", f"{TOOLS}:nap", "--sweep", "1", "--args", '{"x": "a"}'], "Expected `int`"),
        (["--sweep", "1,2"], "--sweep only apply with --tool"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["bench", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("fractor bench: ")
    assert message in err
