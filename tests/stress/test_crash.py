"""Crash safety in the suite: a few SIGKILLs of a worker process on each backend.

The long version is ``python -m tests.stress.crash --kills 100`` (``make stress``);
``tests/stress/crash.py`` describes the checks. The checker is first run on a
database written by hand with one defect of each kind, so that a clean run means
something.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import anyio

from fractor.actors import (
    AssistantMessage,
    ExecutionTrace,
    ToolCall,
    ToolResultMessage,
    UserMessage,
)
from fractor.actors._agent._persistence import AgentState, encode_state
from fractor.actors._observation._traces import trace_record
from fractor.runtime import Record, SQLiteStore, Usage

from .crash import Ack, check_database, crash_rounds
from .crash_worker import answer_to

KILLS = 5
SEED = 20_240


def trace(execution_id: str, agent_id: str, task: str, parent_id: str = "") -> Record:
    return trace_record(
        ExecutionTrace(
            execution_id=execution_id,
            agent_id=agent_id,
            task=task,
            steps=(),
            status="completed",
            stop_reason="",
            final_text=answer_to(task),
            usage=Usage(),
            seconds=0.0,
            parent_id=parent_id,
        )
    )


def turn(task: str, answer: str | None = None) -> tuple[UserMessage, AssistantMessage]:
    return UserMessage(content=task), AssistantMessage(content=answer or answer_to(task))


async def test_the_checks_find_each_kind_of_defect(tmp_path: Path) -> None:
    db = tmp_path / "defects.db"
    tool_call = ToolCall(id="c1", name="work", arguments='{"ms": 0}')
    async with SQLiteStore(db) as store:
        lead = AgentState(
            buffer=(ToolResultMessage(call_id="c1", name="work", content="worked 0 ms"),),
            messages=(*turn("task 1-1"), *turn("task 1-2"), *turn("task 1-4", "made up")),
        )
        await store.save(
            "lead",
            encode_state(lead),
            records=[
                trace("lead#1.a", "lead", "task 1-1"),
                trace("worker#2.a", "worker#2.a", "part 0 of task 1-1", parent_id="lead#1.a"),
                trace("lead#3.a", "lead", "task 1-2"),
                trace("worker#9.a", "worker#9.a", "part 0 of task 1-3", parent_id="lead#8.a"),
                trace("lead#10.a", "lead", "task 1-4"),
            ],
        )
        side = AgentState(
            summary=(AssistantMessage(content="", tool_calls=(tool_call,)),),
            messages=(*turn("side 1-1"), UserMessage(content="side 1-2")),  # half a turn
        )
        await store.save(
            "side", encode_state(side), records=[trace("side#4.a", "lead", "side 1-1")]
        )

    def ack(text: str, execution_id: str) -> Ack:
        agent_id = "side" if text.startswith("side") else "lead"
        return Ack(agent_id, text, execution_id, "completed", 1)

    acks = [
        ack("task 1-2", "lead#3.a"),
        ack("task 1-1", "lead#1.a"),  # stored, but before the turn acknowledged first
        ack("task 1-3", "lead#8.a"),  # neither its turn nor its trace is stored
        ack("task 1-4", "lead#10.a"),  # stored with another answer
        ack("side 1-1", "side#4.a"),  # its trace names another agent
    ]
    problems, _ = await check_database(db, acks, acks, round=1)
    found = Counter((v.kind, v.subject) for v in problems)
    assert found == {
        ("tool trace", "lead buffer[0]"): 1,
        ("tool trace", "side summary[0]"): 1,
        ("broken turn", "side message 2"): 1,
        ("lost turn", "task 1-1"): 1,
        ("lost turn", "task 1-3"): 1,
        ("lost turn", "task 1-4"): 1,
        ("lost trace", "lead#8.a"): 1,
        ("lost trace", "side#4.a"): 1,
        ("orphan trace", "worker#9.a"): 1,
    }, "\n".join(map(str, problems))


async def test_a_worker_killed_at_random_moments_leaves_a_sound_database(
    tmp_path: Path, anyio_backend: str
) -> None:
    with anyio.fail_after(60):
        report = await crash_rounds(
            tmp_path / "crash.db", backend=anyio_backend, kills=KILLS, seed=SEED
        )
    assert report.rounds == KILLS
    assert report.acks, "no turn was acknowledged: the worker did no work"
    assert not report.violations, "the database broke a promise:\n" + report.describe()
