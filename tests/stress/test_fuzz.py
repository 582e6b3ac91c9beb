"""The fault-injection fuzz in the suite: a bounded number of trees on each backend.

``python -m tests.stress.fuzz --trees 2000`` runs thousands (see ``fuzz.py``). Here:
88 fixed seeds (four trees favouring each fault a model draws), which must break
no invariant and hit every fault kind at least once, so the fuzz cannot silently
stop injecting one; a few seeds drawn by hypothesis; and checks that the checks
themselves catch what they look for.
"""

from __future__ import annotations

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from actors import (
    Agent,
    AssistantMessage,
    Conversation,
    Message,
    ModelRequest,
    Result,
    ScriptedModel,
    SystemMessage,
    ToolCall,
    ToolResultMessage,
    UserMessage,
    fail,
)
from runtime import (
    Budget,
    MemoryStore,
    NodeSnapshot,
    Runtime,
    TreeSnapshot,
    Usage,
    decode_json,
    encode_json,
)

from .fuzz import FAULT_KINDS, Summary, render, run_tree, run_trees
from .fuzz_checks import check_conversation, check_request, check_tree, round_trip
from .fuzz_faults import TOOLS
from .fuzz_plan import DRAWN, TOOL_POOL, make_plan

SEEDS = range(4 * len(DRAWN))


def failures(summary: Summary) -> str:
    rerun = f"python -m tests.stress.fuzz --seed SEED --trees 1 --backend {summary.backend}"
    return f"rerun one tree with: {rerun}\n{render(summary)}"


async def test_fixed_trees_keep_every_invariant_and_hit_every_fault() -> None:
    summary = await run_trees(SEEDS)
    assert summary.violations == [], failures(summary)
    missed = [kind for kind in FAULT_KINDS if not summary.faults[kind]]
    assert missed == [], f"faults never injected: {missed}\n{render(summary)}"
    assert summary.trees == len(SEEDS)
    assert summary.asks > summary.trees


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


def test_the_conversation_check_catches_a_half_written_turn() -> None:
    conversation = Conversation(
        system="s",
        summary=(),
        buffer=(),
        messages=(UserMessage(content="<t0> task"),),
        execution=(AssistantMessage(tool_calls=(ToolCall(id="c1", name="work"),)),),
    )
    found = check_conversation("t0", conversation, (), base=(), system="s", results={})
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
