"""``fractor bench``: a user's tool measured under the runtime, and the suite.

``bench_command`` starts its own event loop, so the async tests run it in a worker
thread, on the same backend as the test. Nothing asserts on absolute timings.
"""

from __future__ import annotations

import argparse
import itertools
import json
import pathlib
from typing import Any

import anyio
import anyio.to_thread
import pytest

from fractor.actors.cli import _bench, _tool_bench
from fractor.actors.cli._bench import add_bench_parser, bench_command
from fractor.actors.cli._tool_bench import percentile, plan

from . import bench_tools

TOOLS = "tests.actors.cli.bench_tools"


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="fractor")
    add_bench_parser(parser.add_subparsers(dest="command"))
    return parser.parse_args(["bench", *argv])


async def bench(backend: str, *argv: str) -> int:
    args = parse(*argv, "--backend", backend)
    return await anyio.to_thread.run_sync(bench_command, args)


async def measure_tool(
    backend: str, tmp_path: pathlib.Path, name: str, *argv: str
) -> tuple[int, dict[str, Any]]:
    out = tmp_path / "report.json"
    code = await bench(backend, "--tool", f"{TOOLS}:{name}", *argv, "--json", str(out))
    report: dict[str, Any] = json.loads(out.read_text())
    return code, report


def assert_ordered_latencies(report: dict[str, Any]) -> None:
    assert 0 < report["p50"] <= report["p95"] <= report["p99"] <= report["max"]


# -- your tool ----------------------------------------------------------------------------


async def test_an_async_tool_reaches_its_concurrency(
    anyio_backend: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ("--args", '{"x": 1}', "--fanout", "4", "--concurrency", "4", "--calls", "16")
    code, report = await measure_tool(anyio_backend, tmp_path, "slow_echo", *argv)
    assert code == 0
    assert report["backend"] == anyio_backend
    assert (report["tool"], report["kind"]) == ("slow_echo", "async")
    assert report["calls"] == 16
    assert (report["errors"], report["first_error"]) == (0, "")
    assert report["peak_concurrency"] == 4
    assert report["executions"] == 1
    assert report["throughput"] > 0
    assert_ordered_latencies(report)
    out, err = capsys.readouterr()
    assert "tool 'slow_echo' (async)" in out
    assert "errors            0 of 16" in out
    assert "peak concurrency  4 " in out
    # Not a terminal: plain progress lines on stderr, the last one complete.
    assert err.splitlines()[-1] == "bench slow_echo: 16/16 calls"


async def test_concurrency_bounds_a_wider_fanout_across_executions(
    anyio_backend: str, tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_tool_bench, "STEPS_PER_EXECUTION", 2)  # 16 calls per execution
    argv = ("--args", '{"x": 1}', "--fanout", "8", "--concurrency", "3", "--calls", "41")
    code, report = await measure_tool(anyio_backend, tmp_path, "slow_echo", *argv)
    assert code == 0
    assert report["calls"] == 41
    assert report["executions"] == 3  # 16 + 16 + 9: two steps each
    assert report["peak_concurrency"] == 3
    assert_ordered_latencies(report)


async def test_a_sync_tool_runs_in_worker_threads(
    anyio_backend: str, tmp_path: pathlib.Path
) -> None:
    argv = ("--args", '{"x": 2}', "--fanout", "4", "--calls", "12")
    code, report = await measure_tool(anyio_backend, tmp_path, "sync_echo", *argv)
    assert code == 0
    assert (report["kind"], report["concurrency"]) == ("sync", 4)  # C defaults to K
    assert report["calls"] == 12
    assert report["errors"] == 0
    assert 1 <= report["peak_concurrency"] <= 4
    assert_ordered_latencies(report)


async def test_errors_are_counted_exactly(
    anyio_backend: str,
    tmp_path: pathlib.Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(bench_tools, "_calls", itertools.count(1))
    argv = ("--args", '{"x": 1}', "--fanout", "5", "--concurrency", "2", "--calls", "20")
    code, report = await measure_tool(anyio_backend, tmp_path, "every_fourth_fails", *argv)
    assert code == 1
    assert report["calls"] == 20
    assert report["errors"] == 5
    expected = "tool 'every_fourth_fails' failed: RuntimeError: every fourth call fails"
    assert report["first_error"] == expected
    assert report["peak_concurrency"] <= 2
    out = capsys.readouterr().out
    assert "errors            5 of 20" in out
    assert f"first error       {expected}" in out


async def test_arguments_the_tool_rejects_fail_every_call(
    anyio_backend: str, tmp_path: pathlib.Path
) -> None:
    argv = ("--args", '{"x": -1}', "--fanout", "3", "--calls", "7")
    code, report = await measure_tool(anyio_backend, tmp_path, "picky", *argv)
    assert code == 1
    assert (report["calls"], report["errors"]) == (7, 7)
    assert "ValueError: x must be >= 0, got -1" in report["first_error"]


async def test_an_existing_tool_keeps_its_name(anyio_backend: str, tmp_path: pathlib.Path) -> None:
    argv = ("--args", '{"x": 2, "label": "n"}', "--fanout", "2", "--calls", "5")
    code, report = await measure_tool(anyio_backend, tmp_path, "echo_tool", *argv)
    assert code == 0
    assert (report["tool"], report["calls"], report["errors"]) == ("echo_tool", 5, 0)
    assert report["peak_concurrency"] <= 2


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--tool", "no_colon"], "--tool 'no_colon': expected MODULE:FUNCTION"),
        (["--tool", f"{TOOLS}:"], "expected MODULE:FUNCTION, e.g. mypackage.tools:search"),
        (["--tool", "tests.actors.cli.no_such_module:f"], "cannot import module"),
        (["--tool", f"{TOOLS}:missing"], "has no attribute 'missing'; its functions: echo_tool"),
        (["--tool", f"{TOOLS}:NOT_CALLABLE"], "is not callable: it is 3 (int)"),
        (["--tool", "pathlib:Path"], "it is a class"),
        (["--tool", f"{TOOLS}:slow_echo", "--args", "{x"], "--args is not valid JSON"),
        (["--tool", f"{TOOLS}:slow_echo", "--args", "[1]"], "--args must be a JSON object"),
        (["--tool", f"{TOOLS}:slow_echo", "--args", '{"x": "a"}'], "Expected `int`, got `str`"),
        (["--tool", f"{TOOLS}:slow_echo"], "missing required field `x`"),
        (["--tool", f"{TOOLS}:slow_echo", "--fanout", "0"], "--fanout must be a whole number >= 1"),
        (["--tool", f"{TOOLS}:slow_echo", "--concurrency", "-2"], "--concurrency must be"),
        (["--tool", f"{TOOLS}:slow_echo", "--calls", "0"], "--calls must be a whole number >= 1"),
        (["--tool", f"{TOOLS}:slow_echo", "--quick"], "--quick only apply to the suite"),
        (["--fanout", "3"], "--fanout only apply with --tool"),
        (["--only", "Z"], "--only 'Z' matches no workload; the workloads: W1 fan-out"),
        (["--json", "no/such/dir/out.json"], "the directory 'no/such/dir' does not exist"),
    ],
)
def test_bad_input_exits_2_before_anything_runs(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert bench_command(parse(*argv)) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("fractor bench: ")
    assert message in err


def test_trio_must_be_installed_to_run_on_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(_bench, "_trio_installed", lambda: False)
    assert bench_command(parse("--backend", "trio", "--only", "W4")) == 2
    assert "needs the trio package" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fanout", "calls"), [(1, 1), (1, 120), (3, 10), (4, 16), (7, 3000), (1000, 2500), (2000, 1)]
)
def test_the_plan_runs_exactly_the_calls_asked_for(fanout: int, calls: int) -> None:
    executions = plan("t", "{}", fanout, calls)
    steps = [turn.tool_calls for turns in executions for turn in turns[:-1]]
    assert sum(len(step) for step in steps) == calls
    assert all(1 <= len(step) <= fanout for step in steps)
    assert all(turns[-1].text == "done" and not turns[-1].tool_calls for turns in executions)
    assert all(len(turns) - 1 <= _tool_bench.STEPS_PER_EXECUTION for turns in executions)


def test_percentiles_are_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert [percentile(values, q) for q in (0.5, 0.95, 0.99)] == [50.0, 95.0, 99.0]
    assert percentile([3.0], 0.99) == 3.0
    assert percentile([], 0.5) == 0.0


# -- the suite ----------------------------------------------------------------------------


async def test_the_quick_suite_runs_and_writes_json(
    anyio_backend: str, tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "suite.json"
    code = await bench(anyio_backend, "--quick", "--only", "W4", "--json", str(out))
    document = json.loads(out.read_text())
    assert document["backend"] == anyio_backend
    rows = document["rows"]
    assert rows
    assert all(row["workload"].startswith("W4") for row in rows)
    assert code == (0 if all(row["holds"] for row in rows) else 1)
    printed = capsys.readouterr().out
    assert "[1/1] W4 mailbox round trips" in printed
    assert f"results written to {out}" in printed
