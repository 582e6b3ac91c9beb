"""One end path: every execution, top-level or delegated, restarted or not, answered or
cancelled, ends through ``Execution.end`` exactly once (DESIGN.md invariant 2).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from fractor.actors import (
    Agent,
    AssistantMessage,
    FunctionModel,
    ModelRequest,
    RestartPolicy,
    Result,
    ScriptedModel,
    UserMessage,
    call,
    calls,
    fail,
    reply,
)
from fractor.actors._execution._execution import Execution
from fractor.actors._models._turns import Turn
from fractor.runtime import BudgetExceeded, MemoryStore, Runtime

from ..sample_tools import hanging, stepped


@dataclass(frozen=True)
class Ended:
    agent: str
    execution_id: str
    cancelled: bool
    #: What the end left: the buffer, the node's status, the conversation's last message.
    buffer: tuple[Any, ...]
    node_status: str
    last: Any
    #: Whether its trace was built by then (an agent that lives on keeps it).
    traced: bool


@pytest.fixture
def ends(monkeypatch: pytest.MonkeyPatch) -> list[Ended]:
    """Every call of ``Execution.end``, with what it left behind."""
    seen: list[Ended] = []
    original = Execution.end

    def end(self: Execution, *, cancelled: bool = False) -> Result | None:
        result = original(self, cancelled=cancelled)
        seen.append(
            Ended(
                agent=self.agent.name,
                execution_id=self.execution_id,
                cancelled=cancelled,
                buffer=tuple(self.buffer),
                node_status=self.node.status,
                last=self.conversation[-1] if self.conversation else None,
                traced=self.built is not None,
            )
        )
        return result

    monkeypatch.setattr(Execution, "end", end)
    return seen


def once_each(ends: list[Ended]) -> dict[str, Ended]:
    by_agent = {ended.agent: ended for ended in ends}
    assert len(by_agent) == len(ends), [ended.agent for ended in ends]
    return by_agent


async def test_every_execution_ends_once_top_level_or_delegated_restarted_or_not(
    ends: list[Ended],
) -> None:
    plain = Agent("plain", ScriptedModel([reply("plain answer")]))
    retried = Agent(
        "retried",
        ScriptedModel([fail(ValueError("first try")), reply("retried answer")]),
        restart=RestartPolicy(max_restarts=1),
    )
    lead = Agent(
        "lead",
        ScriptedModel(
            [
                calls(call("plain", task="a"), call("retried", task="b")),
                fail(RuntimeError("boom")),
                reply("done"),
            ]
        ),
        subagents=[plain, retried],
        restart=RestartPolicy(max_restarts=1),
    )
    store = MemoryStore()
    async with Runtime(store=store) as rt:
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        conversation = await ref.conversation()
        traces = await ref.trace()
    assert (result.status, result.text) == ("completed", "done")
    ended = once_each(ends)  # the last attempt ends, and it alone
    assert set(ended) == {"lead", "plain", "retried"}
    for each in ended.values():
        assert not each.cancelled
        assert each.buffer == ()
        assert each.node_status == "completed"
        assert isinstance(each.last, AssistantMessage)
    assert ended["lead"].execution_id == result.execution_id
    # Only the top's actor lives on and keeps its trace; a child's actor stops with
    # its one task, so its trace is built by the store's save, after the ends.
    assert [name for name, each in sorted(ended.items()) if each.traced] == ["lead"]
    assert ended["retried"].execution_id.startswith("retried")
    assert "~" not in ended["retried"].execution_id  # its node's id: the last attempt
    assert conversation.messages == (
        UserMessage(content="go"),
        AssistantMessage(content="done"),
    )
    assert conversation.execution == ()
    # The top keeps its attempts' traces; the store holds them first, then the tree's.
    assert [trace.execution_id for trace in traces] == [
        f"{result.execution_id}~1",
        result.execution_id,
    ]
    records = await store.records(limit=None)
    assert [record.id for record in records[:2]] == [
        f"{result.execution_id}~1",
        result.execution_id,
    ]
    stored = {record.id for record in records[2:]}
    assert len(stored) == 3  # plain, and the two attempts of retried
    assert ended["retried"].execution_id in stored
    assert f"{ended['retried'].execution_id}~1" in stored


@pytest.mark.parametrize("restarts", [0, 1], ids=["ends-itself", "restartable"])
async def test_a_cancelled_tree_ends_each_execution_once(restarts: int, ends: list[Ended]) -> None:
    # A child with no restarts to try ends itself (``run``); one with a restart
    # policy is ended by its actor: the same end either way.
    hang, entered = hanging()
    policy = RestartPolicy(max_restarts=restarts)
    child = Agent("child", stepped(call("hang"), reply("never")), tools=[hang], restart=policy)
    lead = Agent(
        "lead",
        ScriptedModel([call("child", task="x"), reply("never")]),
        subagents=[child],
        restart=policy,
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        actor = rt._cells[ref.id].actor  # white box: the actor is gone after cancel
        await ref.tell("go")
        await entered.wait()
        ref.cancel()
        await ref.actor.wait_stopped()
        after = rt.tree()
    ended = once_each(ends)
    assert set(ended) == {"lead", "child"}
    assert all(each.cancelled and each.buffer == () for each in ended.values())
    assert {n.status for n in after.nodes if n.id != "root"} == {"cancelled"}
    # The top-level turn gets its synthesized answer; the child's actor ended with
    # the cancellation, so nothing was built for a conversation nobody reads.
    assert isinstance(ended["lead"].last, AssistantMessage)
    assert ended["lead"].last.content.startswith("[cancelled]")
    assert isinstance(ended["child"].last, UserMessage)
    assert actor.execution == []  # type: ignore[attr-defined]
    assert [trace.status for trace in actor.traces] == ["cancelled"]  # type: ignore[attr-defined]


class Abort(BaseException):
    """A user's exception that is not an ``Exception``."""


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(lambda: BudgetExceeded("tokens", 10, "elsewhere", "other"), id="budget"),
        pytest.param(lambda: Abort("the model gave up"), id="base-exception"),
    ],
)
async def test_a_model_raising_a_budget_error_or_a_base_exception_itself_fails(
    error: Callable[[], BaseException],
) -> None:
    # Issue 40 item 19: the model's own failure, not a stop of the supervisor: the
    # execution fails saying so (not "cancelled"), and the runtime goes on.
    def raising(request: ModelRequest) -> Turn:
        raise error()

    async with Runtime() as rt:
        ref = await rt.spawn(Agent("a", FunctionModel(raising)))
        result = await ref.ask("go")
        again = await (await rt.spawn(Agent("b", ScriptedModel([reply("fine")])))).ask("go")
    assert result.status == "failed", result.stop_reason
    assert result.stop_reason.startswith("model request failed: ")
    assert again.status == "completed"
