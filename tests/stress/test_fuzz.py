"""The fault-injection fuzz in the suite: a bounded number of trees on each backend.

``python -m tests.stress.fuzz --trees 2000`` runs thousands (see ``fuzz.py``). Here:
88 fixed seeds (four trees favouring each fault a model draws, one in three across
hosts as their plans draw), which must break no invariant and hit every fault kind
at least once (memory's too: compactions that succeed and fail, resumed asks,
restarts with a digest, reused calls), so the fuzz cannot silently stop injecting
one; 24 more trees across hosts, each killing a host right as a subtree was placed
there, which must lose subtrees with it and place some again; a few seeds drawn by
hypothesis; and checks that the checks themselves catch what they look for.
"""

from __future__ import annotations

from itertools import islice
from typing import Any

import anyio
import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fractor.actors import (
    Agent,
    AssistantMessage,
    Conversation,
    DigestMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    Result,
    ScriptedModel,
    StepRecord,
    StepStart,
    SystemMessage,
    ToolCall,
    ToolOutcome,
    ToolResultMessage,
    UserMessage,
    fail,
)
from fractor.runtime import (
    Budget,
    Event,
    MemoryStore,
    NodeSnapshot,
    Runtime,
    TreeSnapshot,
    Usage,
    decode_json,
    encode_json,
)
from fractor.runtime.lowlevel import Tally, Want

from .fuzz import FAULT_KINDS, Summary, render, run_tree, run_trees
from .fuzz_checks import (
    check_events,
    check_held,
    check_leases_returned,
    check_request,
    check_tree,
    round_trip,
)
from .fuzz_faults import TOOLS
from .fuzz_final import check_stored_traces
from .fuzz_memory import (
    HEADING,
    check_conversation,
    check_reuse,
    check_summary_request,
    continues,
)
from .fuzz_plan import DRAWN, HOST_KINDS, TOOL_POOL, Plan, make_plan

SEEDS = range(4 * len(DRAWN))


def kills_at_a_placement(plan: Plan) -> bool:
    """The plan kills a host as soon as a subtree was placed there, and some subtree
    may be placed again (its agent restarts)."""
    kill = plan.kill
    return (
        kill is not None
        and kill.placed > 0
        and kill.delay == 0
        and any(child.restarts for top in plan.tops for child in top.children)
    )


#: Trees across hosts whose plans kill a host where it hurts: the first 24 after
#: ``SEEDS`` (drawn lazily: a plan of every seed up to 10,000 took seconds to collect).
HOST_SEEDS = list(
    islice(
        (
            seed
            for seed in range(len(SEEDS), 10_000)
            if kills_at_a_placement(make_plan(seed, hosts="always"))
        ),
        24,
    )
)


def failures(summary: Summary) -> str:
    rerun = f"python -m tests.stress.fuzz --seed SEED --trees 1 --backend {summary.backend}"
    return f"rerun one tree with: {rerun}\n{render(summary)}"


async def test_fixed_trees_keep_every_invariant_and_hit_every_fault() -> None:
    summary = await run_trees(SEEDS)
    assert summary.violations == [], failures(summary)
    missed = [kind for kind in FAULT_KINDS if not summary.faults[kind]]
    # Kills that hurt are the next test's: here, few trees across hosts kill one.
    missed = [kind for kind in missed if kind not in ("host_kill", "host_lost", "placed_again")]
    assert missed == [], f"faults never injected: {missed}\n{render(summary)}"
    assert summary.trees == len(SEEDS)
    assert summary.asks > summary.trees
    assert 0 < summary.faults["hosts"] < summary.trees


async def test_trees_across_hosts_keep_every_invariant_when_a_host_dies() -> None:
    summary = await run_trees(HOST_SEEDS, hosts="always")
    rerun = failures(summary).replace("--trees 1", "--trees 1 --hosts always")
    assert summary.violations == [], rerun
    missed = [kind for kind in HOST_KINDS if not summary.faults[kind]]
    assert missed == [], f"never happened: {missed}\n{render(summary)}"
    assert summary.faults["hosts"] == len(HOST_SEEDS)


@settings(
    max_examples=10,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(seed=st.integers(min_value=len(SEEDS), max_value=2**32 - 1))
async def test_random_trees_keep_every_invariant(seed: int) -> None:
    report = await run_tree(seed)
    assert report.violations == [], f"seed {seed} ({report.backend}):\n" + "\n".join(
        report.violations
    )


def test_a_plan_is_a_function_of_its_seed() -> None:
    assert make_plan(7) == make_plan(7)
    assert make_plan(7) != make_plan(8)
    assert {*TOOL_POOL, "work", "stall"} == set(TOOLS)
    assert {make_plan(seed).focus for seed in SEEDS} == set(DRAWN)


# -- the checks catch what they look for ---------------------------------------------------


def checked(*messages: Message) -> list[str]:
    return check_request(
        "t0s0",
        ModelRequest(messages=(SystemMessage(content="You are <t0s0>."), *messages)),
        system="You are <t0s0>.",
        allowed=frozenset({"t0"}),
        children=frozenset({"t0s0s0"}),
        fresh=True,
    )


def test_the_request_check_passes_a_clean_context() -> None:
    delegated = ToolCall(id="c1", name="t0s0s0", arguments='{"task": "<t0s0> go"}')
    assert (
        checked(
            UserMessage(content="<t0> task"),
            AssistantMessage(content="<t0s0> step", tool_calls=(delegated,)),
            ToolResultMessage(call_id="c1", name="t0s0s0", content="<t0s0s0> final"),
        )
        == []
    )


@pytest.mark.parametrize(
    ("messages", "invariant"),
    [
        # A child's text outside the result of the call that delegated to it.
        ((UserMessage(content="<t0> task <t0s0s0> leaked"),), "1"),
        # A grandchild's text in the child's answer.
        (
            (
                UserMessage(content="<t0> task"),
                AssistantMessage(tool_calls=(ToolCall(id="c1", name="t0s0s0"),)),
                ToolResultMessage(call_id="c1", name="t0s0s0", content="<t0s0s0s1> inner"),
            ),
            "1",
        ),
        # A subagent's context with history before its task.
        (
            (
                UserMessage(content="<t0> a"),
                AssistantMessage(content="x"),
                UserMessage(content="<t0> b"),
            ),
            "2",
        ),
        # A call without its result; a result without its call; a repeated id.
        (
            (
                UserMessage(content="t"),
                AssistantMessage(tool_calls=(ToolCall(id="c1", name="work"),)),
            ),
            "3",
        ),
        (
            (UserMessage(content="t"), ToolResultMessage(call_id="c1", name="work", content="r")),
            "3",
        ),
        (
            (
                UserMessage(content="t"),
                AssistantMessage(
                    tool_calls=(ToolCall(id="c1", name="work"), ToolCall(id="c1", name="work"))
                ),
                ToolResultMessage(call_id="c1", name="work", content="r"),
                ToolResultMessage(call_id="c1", name="work", content="r"),
            ),
            "3",
        ),
    ],
)
def test_the_request_check_catches_a_broken_context(
    messages: tuple[Message, ...], invariant: str
) -> None:
    found = checked(*messages)
    assert found
    assert {violation[0] for violation in found} == {invariant}, found


def node(
    node_id: str, parent: str | None, usage: Usage, own: Usage, limits: Budget | None
) -> NodeSnapshot:
    return NodeSnapshot(
        id=node_id,
        parent_id=parent,
        depth=0 if parent is None else 1,
        name=node_id,
        actor_id=node_id,
        status="completed",
        stop_reason="",
        usage=usage,
        own_usage=own,
        steps=0,
        agents=0,
        limits=limits,
        started=0.0,
        seconds=0.1,
    )


def test_the_tree_check_catches_bad_sums_and_overshoot() -> None:
    two = Usage(requests=2, tool_calls=3)
    one = Usage(requests=1, tool_calls=3)
    tree = TreeSnapshot(
        nodes=(
            node("root", None, two, Usage(), Budget(tool_calls=2)),
            node("a", "root", one, one, None),
        )
    )
    found = check_tree(tree, caps=None, seconds_slack=1.0, where="a test")
    assert any("requests=2, own + children = 1" in v for v in found), found
    assert any("over its limit of 2" in v for v in found), found


def test_the_tree_check_lets_a_remote_top_be_ahead_of_its_children_never_behind() -> None:
    three, one = Usage(requests=3), Usage(requests=1)
    replace = msgspec.structs.replace

    def tree(remote_usage: Usage) -> TreeSnapshot:
        return TreeSnapshot(
            nodes=(
                node("root", None, remote_usage, Usage(), None),
                replace(node("r", "root", remote_usage, one, None), host="h"),
                replace(node("c", "r", one, one, None), host="h", depth=2),
            )
        )

    def checked(remote_usage: Usage, lagging: set[str]) -> list[str]:
        return check_tree(
            tree(remote_usage), caps=None, seconds_slack=1.0, where="a test", lagging=lagging
        )

    # Its host reported three requests; its last snapshot of its nodes shows two.
    assert checked(three, {"r"}) == []
    found = checked(three, set())
    assert any("r has requests=3, own + children = 2" in v for v in found), found
    behind = checked(one, {"r"})
    assert any("r has requests=1, own + children = 2" in v for v in behind), behind


async def test_the_held_check_counts_what_leases_hold_as_used() -> None:
    supervisor = Runtime().supervisor
    top = supervisor.open(supervisor.root, name="top", limits=Budget(tokens=100))
    remote = supervisor.open(top, name="remote", limits=None)
    supervisor.ledger.open(remote)
    limits = supervisor.ledger.ask_nowait(remote, Tally(), Want(tokens=40))
    assert isinstance(limits, Budget)
    assert limits.tokens is not None
    assert check_held([top], "a test") == []
    top.input_tokens = 100 - limits.tokens + 1  # settled here, beside what is leased
    found = check_held([top], "a test")
    assert found == [
        f"4: a test: {top.id} used 1 tokens and leases hold {limits.tokens}, over its limit of 100"
    ]
    # A lease still live after the runtime is caught; a lost one's hold is allowed.
    root = supervisor.root
    assert any("1 leases" in v for v in check_leases_returned(root, lost=False))
    supervisor.ledger.end(remote, None, lost=True)
    assert check_leases_returned(root, lost=True) == []
    assert check_leases_returned(root, lost=False)[0] == "4: leases count as lost, and no host was"


def test_the_event_check_catches_an_execution_out_of_place() -> None:
    remote = msgspec.structs.replace(node("r", "a", Usage(), Usage(), None), host="h", depth=2)
    tree = TreeSnapshot(nodes=(node("a", "root", Usage(), Usage(), None), remote))

    def event(depth: int, parent: str, host: str) -> Event:
        return Event(
            at=0.0,
            execution_id="r",
            parent_id=parent,
            depth=depth,
            detail=StepStart(step=0, host=host),
        )

    assert check_events(tree, [event(2, "a", "h")]) == []
    assert len(check_events(tree, [event(1, "a", "h"), event(2, "", "h"), event(2, "a", "")])) == 3
    assert check_events(tree, [event(2, "a", "g")], moved={"r"}) == []


def test_the_stored_trace_check_catches_a_missing_or_different_trace() -> None:
    tree = TreeSnapshot(
        nodes=(
            node("root", None, Usage(), Usage(), None),
            node("a", "root", Usage(), Usage(), None),
            msgspec.structs.replace(node("b", "a", Usage(), Usage(), None), host="h"),
        )
    )

    def trace(execution_id: str, parent: str, status: str = "completed") -> ExecutionTrace:
        return ExecutionTrace(
            execution_id=execution_id,
            agent_id=execution_id,
            task="t",
            steps=(),
            status=status,  # type: ignore[arg-type]
            stop_reason="",
            final_text="x",
            usage=Usage(),
            seconds=0.0,
            parent_id=parent,
        )

    assert check_stored_traces(tree, [trace("a", ""), trace("b", "a")]) == []
    assert check_stored_traces(tree, [trace("a", "")], lost={"b"}) == []
    missing = check_stored_traces(tree, [trace("a", "")])
    assert missing == ["2: the stored trace of b (host 'h') is missing (completed: '')"]
    assert len(check_stored_traces(tree, [trace("a", "x"), trace("b", "a", "failed")])) == 2


def test_the_conversation_check_catches_a_half_written_turn() -> None:
    conversation = Conversation(
        system="s",
        summary=(),
        buffer=(),
        messages=(UserMessage(content="<t0> task"),),
        execution=(AssistantMessage(tool_calls=(ToolCall(id="c1", name="work"),)),),
    )
    start = msgspec.structs.replace(conversation, messages=(), execution=())
    found = check_conversation("t0", conversation, (), start=start, system="s", results={})
    assert [v[0] for v in found] == ["2", "2"], found


def test_the_round_trip_check_catches_a_lone_surrogate() -> None:
    result = Result(
        text="half \ud800", status="completed", stop_reason="", usage=Usage(), agent_id="a"
    )
    assert [v[0] for v in round_trip(result, Result, "a Result")] == ["6", "6"]


# -- what the fuzz found ---------------------------------------------------------------------


async def test_a_model_error_with_a_lone_surrogate_is_made_safe_and_stored() -> None:
    """Found by the fuzz: a model error's text went raw into the stop reason, the
    synthesized answer, the trace and the events, and a store's save raised out of
    the ask."""
    model = ScriptedModel([fail(RuntimeError("half a character: \ud800"))])
    with anyio.fail_after(5):
        async with MemoryStore() as store, Runtime(store=store) as rt:
            ref = await rt.spawn(Agent("a", model), id="keeper")
            result = await ref.ask("go")
            stored = await store.load("keeper")
    assert result.status == "failed"
    assert "half a character: \ufffd" in result.stop_reason
    assert decode_json(encode_json(result), Result) == result
    assert stored is not None


# -- the memory checks catch what they look for ----------------------------------------------


def test_the_request_check_catches_a_digest_out_of_place_and_a_bad_summary() -> None:
    digest = DigestMessage(content="<t0s0> earlier")
    assert checked(UserMessage(content="<t0> task"), digest) == []
    out_of_place = checked(
        UserMessage(content="<t0> task"),
        AssistantMessage(tool_calls=(ToolCall(id="c1", name="work"),)),
        ToolResultMessage(call_id="c1", name="work", content="r"),
        digest,
    )
    assert [v[0] for v in out_of_place] == ["2"], out_of_place
    instructions = "Summarize."
    good = ModelRequest(
        messages=(SystemMessage(content=instructions), UserMessage(content="<t0> turns")),
        purpose="summary",
    )
    assert check_summary_request("t0", good, instructions=instructions) == []
    worse = msgspec.structs.replace(good, messages=(*good.messages, digest))
    assert [v[0] for v in check_summary_request("t0", worse, instructions=instructions)] == [
        "2",
        "1",
    ]


def trace(execution_id: str, outcomes: tuple[ToolOutcome, ...], **fields: Any) -> ExecutionTrace:
    step = StepRecord(
        index=0,
        input_messages=1,
        response_text="",
        tool_calls=tuple(outcome.call for outcome in outcomes),
        outcomes=outcomes,
        usage=Usage(),
        model_seconds=0.0,
        tools_seconds=0.0,
        finish_reason="tool_calls",
    )
    return ExecutionTrace(
        execution_id=execution_id,
        agent_id="t0",
        agent_name="t0",
        task="<t0> task",
        steps=(step,),
        stop_reason="",
        final_text="x",
        usage=Usage(),
        seconds=0.0,
        **{"status": "completed", **fields},
    )


def test_the_reuse_check_catches_a_call_that_never_completed_before() -> None:
    done = ToolOutcome(
        call=ToolCall(id="a", name="work", arguments='{"x":1}'),
        content="r",
        is_error=False,
        seconds=0.0,
    )
    again = msgspec.structs.replace(
        done, call=ToolCall(id="b", name="work", arguments='{ "x": 1 }'), reused=True
    )
    first = trace("e~1", (done,), status="failed", attempt_of="e")
    second = trace("e", (again,), attempt=2, digest=True)
    traces = {t.execution_id: t for t in (first, second)}
    assert check_reuse(traces, {"t0": True}) == []
    assert [v[0] for v in check_reuse(traces, {"t0": False})] == ["2"]
    failed = msgspec.structs.replace(done, is_error=True)
    traces["e~1"] = trace("e~1", (failed,), status="failed", attempt_of="e")
    assert len(check_reuse(traces, {"t0": True})) == 1


def test_the_conversation_check_catches_a_summary_its_traces_do_not_account_for() -> None:
    start = Conversation(system="s", summary=(), buffer=(), messages=(), execution=())
    summary = (SystemMessage(content=f"{HEADING} (1 earlier turns):\nx"),)
    folded = msgspec.structs.replace(start, summary=summary, summarized=1)
    found = check_conversation("t0", folded, (), start=start, system="s", results={})
    assert found
    assert {v[0] for v in found} == {"2"}, found
    without = check_conversation(
        "t0", folded, (), start=folded, system="s", results={}, memory=None
    )
    assert any("does not compact" in v for v in without), without
    assert continues("t0", (0, ()), (1, ())) == []
    assert continues("t0", (1, ()), (0, ())) != []
