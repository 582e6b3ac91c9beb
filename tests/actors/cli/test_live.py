"""The live view: a rich tree on a terminal, plain progress lines elsewhere."""

from __future__ import annotations

import io
import re

import anyio
import msgspec
import pytest
from rich.console import Console

from fractor.actors import (
    Agent,
    ApprovalAsked,
    ApprovalDecision,
    BudgetWait,
    CompactionEnd,
    ExecutionEnd,
    ExecutionStart,
    ModelText,
    RateWait,
    Restart,
    ScriptedModel,
    StepEnd,
    StepStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
    call,
    calls,
    reply,
    streamed,
    tool,
    watch,
)
from fractor.actors.cli._draw import PipeConsole, own_steps, render_tree, tree_order
from fractor.actors.cli._live import LatestLines, LiveView, ProgressLines
from fractor.actors.cli._usage import print_usage, usage_lines, usage_table
from fractor.runtime import Budget, Event, EventDetail, NodeSnapshot, Runtime, TreeSnapshot, Usage

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def terminal() -> Console:
    return Console(force_terminal=True, file=io.StringIO(), width=120)


def pipe() -> Console:
    return Console(file=io.StringIO(), width=120)


def written(console: Console) -> str:
    file = console.file
    assert isinstance(file, io.StringIO)
    return ANSI.sub("", file.getvalue())


@tool
async def lookup(word: str) -> str:
    """Look a word up."""
    return f"{word}: found"


def team() -> Agent:
    """A lead with a helper that completes and a tight one that runs out of tokens."""
    helper = Agent(
        name="helper",
        model=ScriptedModel([call("lookup", word="actor"), reply("helped")]),
        tools=[lookup],
    )
    tight = Agent(
        name="tight",
        model=ScriptedModel([call("lookup", word="x"), reply("never")]),
        tools=[lookup],
        budget=Budget(tokens=30),
    )
    lead = ScriptedModel(
        [calls(call("helper", task="help"), call("tight", task="squeeze")), reply("merged")]
    )
    return Agent(name="lead", model=lead, subagents=[helper, tight])


async def run_team(console: Console, **options: object) -> str:
    async with Runtime() as rt:
        async with watch(rt, console=console, refresh=0.01, **options):  # type: ignore[arg-type]
            result = await (await rt.spawn(team())).ask("go")
        assert result.status == "completed"
    return written(console)


async def test_watch_draws_the_tree_on_a_terminal() -> None:
    console = terminal()
    out = await run_team(console)
    last_frame = out[out.rindex("fractor") :]
    for name in ("lead", "helper", "tight"):
        assert name in last_frame
    assert "✔ completed" in last_frame
    assert "⊘ budget_exceeded" in last_frame
    assert "tokens limit of 30 reached" in last_frame  # why it stopped, under the node
    assert "0 running" in last_frame
    # The children are drawn under the lead, with the tree's guides.
    lead_line = next(line for line in last_frame.splitlines() if "lead" in line)
    assert lead_line.lstrip().startswith("└── lead")
    assert any(
        line.lstrip(" │").startswith(("├── helper", "└── helper")) for line in out.split("\n")
    )


async def test_watch_prints_plain_lines_without_a_terminal() -> None:
    console = pipe()
    out = await run_team(console)
    lines = out.splitlines()
    assert all(line.startswith("[") and "s] " in line for line in lines), lines
    text = "\n".join(line.split("s] ", 1)[1] for line in lines)
    assert "lead: started: 'go'" in text
    assert "lead: spawned helper" in text
    assert "  helper: started: 'help'" in text  # indented by depth
    assert "  tight: budget exceeded: tokens limit of 30 reached" in text
    assert "  tight: budget_exceeded after" in text
    assert "lead: completed after 2 steps" in text
    assert "lookup" not in text  # no line per tool call by default
    assert "\x1b" not in console.file.getvalue()  # type: ignore[attr-defined]


async def test_plain_lines_can_show_every_step() -> None:
    out = await run_team(pipe(), steps=True)
    assert '  helper: step 1: 1 tool call(s): lookup({"word":"actor"}) [' in out
    assert "  helper: step 2: answered [" in out
    assert "lead: step 1: 2 tool call(s): helper, tight [" in out


async def test_plain_can_be_forced_either_way() -> None:
    forced_plain = await run_team(terminal(), plain=True)
    assert "lead: started" in forced_plain
    assert "└──" not in forced_plain
    forced_live = await run_team(pipe(), plain=False)
    assert "└── lead" in forced_live


@pytest.mark.parametrize("plain", [True, False])
async def test_the_body_s_exception_comes_through_unwrapped(plain: bool) -> None:
    with pytest.raises(ValueError, match="boom"):
        async with Runtime() as rt, watch(rt, console=pipe(), plain=plain):
            raise ValueError("boom")


class ClosedPipe(io.StringIO):
    def write(self, text: str) -> int:
        raise BrokenPipeError(32, "Broken pipe")


@pytest.mark.parametrize("plain", [True, False])
async def test_a_closed_output_is_one_plain_error(plain: bool) -> None:
    console = PipeConsole(file=ClosedPipe(), force_terminal=not plain)
    with pytest.raises(BrokenPipeError, match="went away"):
        async with Runtime() as rt, watch(rt, console=console):
            await (await rt.spawn(team())).ask("go")


async def test_the_tree_is_redrawn_while_it_runs() -> None:
    console = terminal()
    async with Runtime() as rt, watch(rt, console=console, refresh=0.01, title="busy"):
        await anyio.sleep(0.1)
    assert written(console).count("busy") >= 3


def test_bad_options_are_refused() -> None:
    rt = Runtime()
    with pytest.raises(ValueError, match="refresh must be"):
        LiveView(rt, refresh=0)
    with pytest.raises(ValueError, match="max_children must be"):
        LiveView(rt, max_children=0)


# -- the pure parts, on a made-up tree ---------------------------------------------------


def node(
    id: str,
    parent: str | None,
    *,
    status: str = "completed",
    steps: int = 1,
    tokens: int = 100,
    limit: int | None = None,
    reason: str = "",
    started: float = 0.0,
) -> NodeSnapshot:
    usage = Usage(input_tokens=tokens, output_tokens=10, tool_calls=2, requests=1)
    return NodeSnapshot(
        id=id,
        parent_id=parent,
        depth=0 if parent is None else id.count("/"),
        name=id.rsplit("/", 1)[-1],
        actor_id=id,
        status=status,  # type: ignore[arg-type]
        stop_reason=reason,
        usage=usage,
        own_usage=usage,
        steps=steps,
        agents=0,
        limits=Budget(tokens=limit) if limit is not None else None,
        started=started,
        seconds=1.5,
    )


def snapshot(fanout: int = 3) -> TreeSnapshot:
    children = [
        node(f"root/lead/r{i}", "root/lead", steps=2, started=float(i)) for i in range(fanout)
    ]
    return TreeSnapshot(
        nodes=(
            node("root", None, status="running", steps=3 + 2 * fanout, limit=10_000),
            node("root/lead", "root", status="running", steps=3 + 2 * fanout),
            *children,
        )
    )


def render(tree: TreeSnapshot, max_children: int = 12) -> str:
    console = Console(file=io.StringIO(), width=120)
    console.print(render_tree(tree, title="t", max_children=max_children))
    return written(console)


def test_render_tree_shows_each_node_and_limits() -> None:
    out = render(snapshot())
    assert "t  1 running · 110/10,000 tokens" in out
    assert "lead  ⠙ running  3 steps · 110 tokens · 2 tool calls · 1.5 s" in out.replace("⠋", "⠙")
    assert out.count("r0") == out.count("r1") == out.count("r2") == 1


def test_a_node_on_another_host_shows_its_host() -> None:
    tree = snapshot(fanout=2)
    remote = msgspec.structs.replace(tree.node("root/lead/r1"), host="default-1")
    tree = TreeSnapshot(nodes=tuple(remote if n.id == remote.id else n for n in tree.nodes))
    out = render(tree)
    assert "└── r1 @default-1  ✔ completed  2 steps" in out
    assert "r0 @" not in out


def test_render_tree_counts_the_children_it_leaves_out() -> None:
    tree = snapshot(fanout=30)
    busy = msgspec.structs.replace(tree.node("root/lead/r20"), status="running")
    tree = TreeSnapshot(nodes=tuple(busy if n.id == busy.id else n for n in tree.nodes))
    out = render(tree, max_children=5)
    shown = re.findall(r"── (r\d+) ", out)
    assert shown == ["r0", "r1", "r2", "r20"]  # the unfinished first, then in start order
    assert "… 26 more: 26 completed" in out


def test_stopped_nodes_show_why() -> None:
    tree = TreeSnapshot(
        nodes=(
            node("root", None, status="running"),
            node(
                "root/x",
                "root",
                status="budget_exceeded",
                tokens=3_990,
                limit=4_000,
                reason="tokens limit of 4000 reached",
            ),
        )
    )
    out = render(tree)
    assert "x  ⊘ budget_exceeded" in out
    assert "4,000/4,000 tokens ▰▰▰▰▰▰▰▰" in out
    assert "tokens limit of 4000 reached" in out


def test_a_node_waiting_for_budget_says_so_and_why() -> None:
    why = "waiting for budget: tokens of lead (2,000 tokens held by requests in flight)"
    waiting = msgspec.structs.replace(
        node("root/lead/r0", "root/lead", status="running"), waiting=why
    )
    tree = TreeSnapshot(nodes=(*snapshot(fanout=0).nodes, waiting))
    out = render(tree)
    assert "r0  … waiting for budget  " in out
    assert why in out
    assert "lead  ⠋ running" in out  # the others run as before


def test_a_node_waiting_for_a_rate_limit_says_so_and_which_lane() -> None:
    why = "rate limit of gpt-4.1-mini: requests per minute (500)"
    waiting = msgspec.structs.replace(
        node("root/lead/r0", "root/lead", status="running"), waiting=why
    )
    tree = TreeSnapshot(nodes=(*snapshot(fanout=0).nodes, waiting))
    out = render(tree)
    assert "r0  … waiting for a rate limit  " in out
    assert why in out


def test_a_rate_wait_is_a_progress_line() -> None:
    event = Event(
        at=2.0,
        agent="worker",
        depth=1,
        detail=RateWait(lane="gpt-4.1-mini", reason="rate limit of gpt-4.1-mini: paused 3 s"),
    )
    assert ProgressLines().line(event) == (
        "[  2.00s] worker: waiting: rate limit of gpt-4.1-mini: paused 3 s"
    )


def test_a_budget_wait_is_a_progress_line() -> None:
    lines = ProgressLines()
    event = Event(
        at=1.5,
        agent="worker",
        depth=2,
        detail=BudgetWait(reason="waiting for budget: tokens of runtime"),
    )
    assert lines.line(event) == "[  1.50s]   worker: waiting for budget: tokens of runtime"


def test_own_steps_and_tree_order() -> None:
    tree = snapshot()
    assert own_steps(tree)["root/lead"] == 3
    assert own_steps(tree)["root/lead/r1"] == 2
    assert [n.id for n in tree_order(tree)][:3] == ["root", "root/lead", "root/lead/r0"]


def test_usage_lines_are_aligned_with_a_total() -> None:
    lines = usage_lines(snapshot())
    assert lines[0].split() == [
        "agent",
        "status",
        "steps",
        "tool",
        "calls",
        "input",
        "tokens",
        "output",
        "tokens",
        "seconds",
    ]
    assert lines[2].startswith("lead ")
    assert lines[3].startswith("  r0 ")  # indented by depth
    assert lines[-1].split() == ["total", "9", "2", "100", "10", "1.50"]
    rows = [line for line in lines if not line.startswith("-")]
    ends = {len(line) for line in rows}
    assert len(ends) == 1, "right-aligned numbers end in the same column"


def test_usage_table_and_print_usage() -> None:
    console = Console(file=io.StringIO(), width=120)
    console.print(usage_table(snapshot(), title="usage"))
    out = written(console)
    assert "┃ agent" in out
    assert "│ total" in out
    assert "✔ completed" in out
    plain = pipe()
    print_usage(snapshot(), plain, plain=True, title="usage")
    assert written(plain).splitlines()[0] == "== usage =="


def test_progress_lines_note_dropped_events() -> None:
    lines = ProgressLines()
    start = Event(at=1.0, agent="a", depth=1, detail=ExecutionStart(task="t"))
    assert lines.line(start) == "[  1.00s] a: started: 't'"
    assert lines.line(Event(at=1.0, agent="a", detail=ToolStart(tool="t", call_id="c"))) is None
    late = Event(at=2.0, agent="a", depth=2, missed=4, detail=StepEnd(step=0))
    assert lines.line(late) == "[  2.00s]   (4 event(s) dropped: this view fell behind)"
    assert lines.line(Event(at=2.0, agent="a", missed=4, detail=StepEnd(step=0))) is None


def text_event(execution_id: str, text: str) -> Event:
    return Event(at=0.0, execution_id=execution_id, detail=ModelText(text=text))


def an_event(execution_id: str, detail: EventDetail) -> Event:
    return Event(at=0.0, execution_id=execution_id, detail=detail)


def test_latest_lines_keep_each_executions_last_streamed_line() -> None:
    lines = LatestLines(width=12)
    for piece in ("Hello wor", "ld.\nSecond ", "line here", "\n"):
        lines.feed(text_event("a", piece))
    lines.feed(text_event("b", "x" * 40))
    assert lines.line("a") == "…d line here"
    assert lines.line("b") == "…" + "x" * 11
    assert lines.line("nobody") == ""
    lines.feed(an_event("a", StepStart(step=1)))  # a new request: a new line
    assert lines.line("a") == ""
    lines.feed(an_event("b", ExecutionEnd(status="completed", reason="", steps=1, tokens=9)))
    assert len(lines) == 0


def test_a_running_node_shows_its_latest_streamed_line() -> None:
    tree = snapshot(fanout=2)
    lines = LatestLines()
    lines.feed(text_event("root/lead", "Merging what came back:\nsolar first"))
    lines.feed(text_event("root/lead/r0", "finished text"))  # r0 has completed: not shown
    console = Console(file=io.StringIO(), width=120)
    console.print(render_tree(tree, title="t", lines=lines))
    out = written(console)
    assert "“solar first”" in out
    assert "finished text" not in out


async def test_the_live_tree_shows_what_a_running_agent_streams() -> None:
    model = ScriptedModel([streamed("thinking out loud now", chunks=4, delay=0.05)])
    console = terminal()
    async with Runtime() as rt, watch(rt, console=console, refresh=0.01):
        await (await rt.spawn(Agent(name="talker", model=model))).ask("go")
    assert "“thinking out" in written(console)


def test_an_approval_shows_in_the_lines_and_under_the_agent() -> None:
    ask = ApprovalAsked(id="approval-1", tool="send_email", call_id="c", arguments='{"to": "a"}')
    asked = Event(at=1.0, agent="mailer", execution_id="e", detail=ask)
    decided = Event(
        at=2.0,
        agent="mailer",
        execution_id="e",
        detail=ApprovalDecision(
            id="approval-1", tool="send_email", call_id="c", approved=False, reason="no"
        ),
    )
    lines = ProgressLines()
    assert lines.line(asked) == (
        '[  1.00s] mailer: waiting for approval of send_email({"to": "a"}) [approval-1]'
    )
    assert lines.line(decided) == "[  2.00s] mailer: send_email denied: no"
    latest = LatestLines()
    latest.feed(asked)
    assert latest.line("e") == "… waiting for approval: send_email [approval-1]"
    latest.feed(decided)
    assert latest.line("e") == ""


@pytest.mark.parametrize(
    ("detail", "said"),
    [
        (
            CompactionEnd(ok=True, turns=3, covered=7),
            "a: folded 3 old turns into its summary (it covers 7)",
        ),
        (
            CompactionEnd(ok=False, turns=3, covered=4, error="refused: requests limit of 1"),
            "a: summary not updated: refused: requests limit of 1",
        ),
    ],
)
def test_a_compaction_is_a_progress_line(detail: CompactionEnd, said: str) -> None:
    event = Event(at=2.0, agent="a", depth=1, detail=detail)
    assert ProgressLines().line(event) == f"[  2.00s] {said}"


def test_a_restart_with_a_digest_says_so() -> None:
    event = Event(
        at=1.0, agent="a", depth=1, detail=Restart(restarts=1, reason="boom", digest=True)
    )
    assert ProgressLines().line(event) == (
        "[  1.00s] a: restart 1 after: boom (it reads a digest of the attempts before)"
    )


def test_a_tools_progress_shows_in_the_lines_and_under_the_agent() -> None:
    """What an MCP server reports of a call's progress: a progress line, and the line
    under the running agent until the call ends."""
    progress = ToolProgress(tool="slow", call_id="s1", progress=2, total=4, message="step 2")
    event = Event(at=1.0, agent="a", depth=1, execution_id="e", detail=progress)
    assert ProgressLines().line(event) == "[  1.00s] a: slow: 2/4 (50%): step 2"
    unknown = ToolProgress(tool="slow", call_id="s1", progress=3)
    assert ProgressLines().line(Event(at=0.0, agent_id="a-1", detail=unknown)) == (
        "[  0.00s] a-1: slow: 3"
    )
    latest = LatestLines()
    latest.feed(text_event("e", "calling slow"))
    latest.feed(event)
    assert latest.line("e") == "… slow: 2/4 (50%): step 2"
    latest.feed(an_event("e", ToolEnd(tool="other", call_id="o1")))  # another call's end
    assert latest.line("e") == "… slow: 2/4 (50%): step 2"
    latest.feed(an_event("e", ToolEnd(tool="slow", call_id="s1")))
    assert latest.line("e") == ""
