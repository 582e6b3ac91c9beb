"""``fractor demo``: the scripted research team, its live view, its report and its traces."""

from __future__ import annotations

import argparse
import importlib.metadata
import io
import itertools
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from rich.console import Console

from fractor.actors.cli import _parser, main
from fractor.actors.cli._demo import demo_command
from fractor.actors.cli._scenario import DEFAULT_BUDGET_TOKENS, DemoOptions, DemoRun, run_demo
from fractor.actors.cli._trace import trace_command
from fractor.runtime import NodeSnapshot

#: Latencies shrunk 50 times: a run takes a few dozen milliseconds.
FAST = "50"
ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def by_name(run: DemoRun) -> dict[str, NodeSnapshot]:
    nodes = {node.name: node for node in run.tree.nodes}
    assert len(nodes) == len(run.tree.nodes), "one execution per agent"
    return nodes


def console() -> Console:
    return Console(file=io.StringIO(), width=120)


def output(of: Console) -> str:
    file = of.file
    assert isinstance(file, io.StringIO)
    return ANSI.sub("", file.getvalue())


async def test_the_scenario_on_both_backends(tmp_path: Path) -> None:
    db = tmp_path / "demo.db"
    run = await run_demo(DemoOptions(speed=50, db=str(db)), console=console())
    result = run.result
    assert result.status == "completed", result.text
    nodes = by_name(run)
    lead = nodes["lead"]
    assert lead.status == "completed"
    assert run.researchers == (
        "researcher-solar",
        "researcher-batteries",
        "researcher-heat-pumps",
    )
    statuses = {name: nodes[name].status for name in run.researchers}
    assert statuses == {
        "researcher-solar": "completed",
        "researcher-batteries": "completed",
        "researcher-heat-pumps": "budget_exceeded",  # its own budget, not an ancestor's
    }
    tight = nodes["researcher-heat-pumps"]
    assert tight.stop_reason.startswith(f"tokens limit of {DEFAULT_BUDGET_TOKENS:,} reached: ")
    # It says why: what the next request needed, and what was left.
    assert re.search(
        r"the next request needs about [\d,]+ \([\d,]+ input \+ 256 output\), [\d,]+ left",
        tight.stop_reason,
    )
    assert tight.id in tight.stop_reason
    assert tight.usage.total_tokens <= DEFAULT_BUDGET_TOKENS  # hard: never past it
    assert all(nodes[name].parent_id == lead.id for name in run.researchers)
    checker = nodes["fact-checker"]
    assert checker.parent_id == nodes["researcher-solar"].id
    assert checker.depth == lead.depth + 2
    assert checker.status == "completed"
    # Each researcher used several tools; the lead delegated and wrote one answer.
    assert all(nodes[name].own_usage.tool_calls >= 3 for name in run.researchers)
    assert lead.own_usage.tool_calls == 1  # plan_research; subagents are not tool calls
    assert run.tree.node("root").usage.cost > 0  # priced models show costs
    # The lead read its tool results: the missing topic is named, with the reason.
    assert "Findings from 2 of 3 topics" in result.text
    assert "Rooftop solar (fact-checked)" in result.text
    assert "Heat pumps: no finding. Its researcher stopped (budget_exceeded: tokens limit" in (
        result.text
    )
    # Every execution is stored, and the trace command draws all of them.
    assert run.stored_traces == len(run.tree.nodes) - 1  # all but the runtime's root
    args = _parser().parse_args(["trace", result.execution_id, "--db", str(db)])
    assert await trace_command(args) == 0


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_command_end_to_end(
    backend: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "traces.db"
    code = main(["demo", "--speed", FAST, "--db", str(db), "--backend", backend])
    out = capsys.readouterr().out
    assert code == 0, out
    # Not a terminal: plain progress lines instead of the live tree.
    assert "fractor demo: a lead and 3 researchers in parallel" in out
    assert re.search(r"^\[ *\d+\.\d\ds\] lead: started: ", out, re.M)
    assert re.search(r"^\[ *\d+\.\d\ds\] lead: spawned researcher-solar$", out, re.M)
    assert re.search(r"\]     fact-checker: completed after 2 steps", out)
    assert re.search(
        r"\]   researcher-heat-pumps: budget exceeded: tokens limit of 4,000 reached: "
        r"the next request needs about",
        out,
    )
    assert "fetch_page" not in out.split("== the lead's answer")[0]  # no line per tool call
    assert "== the lead's answer (completed) ==" in out
    # The usage table, aligned plain text: one row per agent and a total.
    table = out.split("== usage per agent")[1].split("== trace ==")[0]
    rows = {line.split()[0]: line.split() for line in table.splitlines()[1:] if line.strip()}
    assert rows["researcher-heat-pumps"][1] == "budget_exceeded"
    assert rows["fact-checker"][1] == "completed"
    assert {"lead", "researcher-solar", "researcher-batteries", "total"} <= set(rows)
    assert "cost" in table
    # Where the trace went, and the exact command that shows it.
    assert "trace saved: 5 executions in " in out
    command = re.search(r"view it with: (fractor trace .*)$", out, re.M)
    assert command is not None
    argv = shlex.split(command.group(1))
    assert argv[2].startswith("lead#")
    assert argv[3:] == ["--db", str(db)]
    assert main(argv[1:]) == 0
    tree = capsys.readouterr().out
    for name in ("lead", "researcher-solar", "researcher-batteries", "researcher-heat-pumps"):
        assert f"{name} [{name}#" in tree
    assert "fact-checker [fact-checker#" in tree
    assert "budget_exceeded: tokens limit of 4,000 reached: the next request needs" in tree


def test_wider_and_deeper(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = ["demo", "--fanout", "5", "--depth", "2", "--speed", FAST, "--no-store"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "Findings from 4 of 5 topics" in out
    assert "- Demand response: no finding." in out  # the last researcher is the tight one
    assert re.search(r"\]       fact-checker-2: completed", out)  # researcher > 1 > 2
    assert "traces not stored (--no-store)" in out
    assert not (tmp_path / "fractor.db").exists()


async def test_fanout_and_depth_shape_the_tree() -> None:
    run = await run_demo(DemoOptions(fanout=5, depth=3, speed=50, db=None), console=console())
    nodes = by_name(run)
    assert len(run.researchers) == 5
    stopped = [name for name in run.researchers if nodes[name].status == "budget_exceeded"]
    assert stopped == ["researcher-demand"]
    chain = ["researcher-solar", "fact-checker", "fact-checker-2", "fact-checker-3"]
    for parent, child in itertools.pairwise(chain):
        assert nodes[child].parent_id == nodes[parent].id
        assert nodes[child].status == "completed"
    assert run.stored_traces == 0


async def test_a_roomy_budget_lets_every_researcher_finish() -> None:
    of = console()
    args = _parser().parse_args(
        ["demo", "--budget-tokens", "50000", "--speed", FAST, "--no-store", "--depth", "0"]
    )
    assert await demo_command(args, console=of) == 0
    out = output(of)
    assert "Findings from 3 of 3 topics" in out
    assert "Not covered" not in out
    assert "fact-checker" not in out
    assert "(no researcher ran out of budget: --budget-tokens 50,000" in out


async def test_on_a_terminal_it_draws_the_live_tree_and_a_table(tmp_path: Path) -> None:
    of = Console(force_terminal=True, file=io.StringIO(), width=130)
    args = _parser().parse_args(["demo", "--speed", FAST, "--db", str(tmp_path / "t.db")])
    assert await demo_command(args, console=of) == 0
    out = output(of)
    last_frame = out[out.rindex("fractor demo  0 running") : out.index("the lead's answer")]
    assert "└── lead  ✔ completed  3 steps" in last_frame
    assert "researcher-heat-pumps  ⊘ budget_exceeded" in last_frame
    assert "/4,000 tokens" in last_frame  # tokens against the researcher's own limit
    assert "fact-checker  ✔ completed" in last_frame
    assert "╭─ the lead's answer · completed · 3 steps" in out
    assert "┃ agent" in out
    assert "│ total" in out
    assert "[  " not in out  # no plain progress lines
    assert "view it with: fractor trace 'lead#" in out


async def test_the_demo_streams_each_agents_latest_line_into_the_tree() -> None:
    of = Console(force_terminal=True, file=io.StringIO(), width=130)
    args = _parser().parse_args(["demo", "--speed", "5", "--no-store"])
    assert await demo_command(args, console=of) == 0
    out = output(of)
    # While they ran, frames showed what the models were streaming, under their agent.
    streamed = re.findall(r"“([^”]+)”", out)
    assert streamed
    # Lines the demo's models write: what a step says with its tool calls (shown while
    # its tools run) or a final answer (shown while it streams: a frame may miss a
    # short one on a loaded machine, so any of them will do).
    said = ("Searching for", "Looking for primary", "Splitting the", "One researcher per")
    answered = ("Findings", "Sources", "Verified")
    assert any(line.startswith(said) or any(w in line for w in answered) for line in streamed)


def test_the_default_database_is_fractor_db_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("FRACTOR_DB", raising=False)
    assert main(["demo", "--speed", FAST, "--fanout", "2", "--depth", "0"]) == 0
    assert (tmp_path / "fractor.db").is_file()
    assert "--db fractor.db" in capsys.readouterr().out
    monkeypatch.setenv("FRACTOR_DB", str(tmp_path / "env.db"))
    assert main(["demo", "--speed", FAST, "--fanout", "2"]) == 0
    assert (tmp_path / "env.db").is_file()


@pytest.mark.parametrize(
    ("options", "says"),
    [
        (["--fanout", "1"], "--fanout must be between 2 and 50, got 1"),
        (["--fanout", "51"], "--fanout must be between 2 and 50"),
        (["--depth", "-1"], "--depth must be between 0 and 8, got -1"),
        (["--depth", "9"], "--depth must be between 0 and 8"),
        (["--budget-tokens", "0"], "--budget-tokens must be >= 1, got 0"),
        (["--speed", "0"], "--speed must be between 0.1 and 1000"),
        (["--speed", "nan"], "--speed must be between 0.1 and 1000"),
        (["--db", "/no/such/folder/x.db"], "the folder /no/such/folder does not exist"),
        (["--db", "x.db", "--no-store"], "--db and --no-store contradict each other"),
    ],
)
def test_bad_options_exit_2(
    options: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["demo", *options]) == 2
    captured = capsys.readouterr()
    assert says in captured.err
    assert captured.out == ""  # nothing ran


def test_unparsable_options_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as raised:
        main(["demo", "--fanout", "many"])
    assert raised.value.code == 2
    assert "invalid int value: 'many'" in capsys.readouterr().err


def test_a_database_that_is_not_one_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not a database" * 100)
    assert main(["demo", "--speed", FAST, "--db", str(garbage)]) == 2
    assert "fractor demo: cannot use the database:" in capsys.readouterr().err


async def test_run_demo_refuses_bad_options() -> None:
    with pytest.raises(ValueError, match="--fanout must be between 2 and 50"):
        await run_demo(DemoOptions(fanout=0, db=None))


def test_the_console_script_runs_the_demo_in_a_pipe() -> None:
    (script,) = importlib.metadata.entry_points(group="console_scripts", name="fractor")
    assert script.value == "fractor.actors.cli:main"
    done = subprocess.run(
        [sys.executable, "-m", "fractor.actors.cli", "demo", "--speed", FAST, "--no-store"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "] lead: completed after 3 steps" in done.stdout
    assert "== the lead's answer (completed) ==" in done.stdout


def test_a_reader_that_goes_away_stops_it_quietly() -> None:
    demo = subprocess.Popen(
        [sys.executable, "-m", "fractor.actors.cli", "demo", "--speed", "2", "--no-store"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert demo.stdout is not None
    assert demo.stdout.readline().startswith(b"fractor demo: ")
    demo.stdout.close()  # as `fractor demo | head -1` does
    _, err = demo.communicate(timeout=60)
    assert demo.returncode == 1
    assert err == b""


def test_demo_options_namespace_defaults() -> None:
    args: argparse.Namespace = _parser().parse_args(["demo"])
    assert (args.fanout, args.depth, args.budget_tokens) == (3, 1, DEFAULT_BUDGET_TOKENS)
    assert (args.speed, args.db, args.no_store, args.plain) == (1.0, None, False, False)


async def test_the_demo_with_ui_serves_its_tree_while_it_runs(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # ``fractor demo --ui``: the URL, with its token, once on stderr; the page's JSON
    # has the demo's tree while it runs; once it ended, nothing listens there.
    found: list[str] = []
    seen: list[set[str]] = []

    async def look() -> None:
        while not found:
            await anyio.sleep(0.02)
            found.extend(
                re.findall(r"http://127\.0\.0\.1:\d+/\?token=\S+", capsys.readouterr().err)
            )
        url = found[0]
        async with httpx2.AsyncClient() as client:
            for _ in range(100):
                response = await client.get(url.replace("/?token=", "/api/tree?token="))
                names = {node["agent"] for node in response.json()["nodes"]}
                if "lead" in names:
                    seen.append(names)
                    return
                await anyio.sleep(0.05)

    async with anyio.create_task_group() as group:
        group.start_soon(look)
        run = await run_demo(DemoOptions(speed=5, db=None), console=console(), ui=True)
        group.cancel_scope.cancel()  # (found and seen, or not: the asserts say)
    assert run.result.status == "completed"
    assert len(found) == 1
    assert seen
    assert "lead" in seen[0]
    port = int(found[0].split(":")[2].split("/")[0])
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
