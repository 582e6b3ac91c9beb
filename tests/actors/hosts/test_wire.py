"""What crosses between hosts is fractor's messages as msgspec bytes (invariant 6):
each one round-trips through MessagePack (the wire) and JSON, and bad bytes are
refused, never half read."""

from __future__ import annotations

import msgspec
import pytest

from fractor.actors import ExecutionTrace, Result, ToolStart
from fractor.actors._hosts._lanes import Give, Take, Taken
from fractor.actors._hosts._remote import (
    Ask,
    Close,
    Deny,
    Done,
    Down,
    Events,
    Grant,
    Nodes,
    Room,
    Start,
    Stop,
    decode_down,
    decode_up,
    encode,
)
from fractor.runtime import Budget, BudgetExceeded, Event, NodeSnapshot, Usage
from fractor.runtime.lowlevel import Refusal, Tally, Want

USAGE = Usage(input_tokens=120, output_tokens=30, requests=2, tool_calls=1, cost=0.25)
TALLY = Tally(usage=USAGE, own=USAGE, steps=2, own_steps=2, agents=1, reserved_output=64)
NODE = NodeSnapshot(
    id="helper#4.ab",
    parent_id="worker#2.cd",
    depth=3,
    name="helper",
    actor_id="helper#4.ab",
    status="completed",
    stop_reason="final answer",
    usage=USAGE,
    own_usage=USAGE,
    steps=2,
    agents=0,
    limits=None,
    started=0.5,
    seconds=0.01,
    host="default-1",
)
RESULT = Result(
    text="found it", status="completed", stop_reason="final answer", usage=USAGE, agent_id="w"
)
TRACE = ExecutionTrace(
    execution_id="worker#2.cd",
    agent_id="worker#2.cd",
    task="t",
    steps=(),
    status="completed",
    stop_reason="final answer",
    final_text="found it",
    usage=USAGE,
    seconds=0.02,
    parent_id="lead#1.ef",
)
REFUSAL = Refusal.of(
    BudgetExceeded("tokens", 1_000, "lead#1.ef", "lead", need=300, left=120, need_detail="x")
)
DOWN = [
    Start(
        run=1,
        text="a task",
        node_id="worker#2.cd",
        name="worker",
        depth=2,
        parent_id="lead#1.ef",
        limits=Budget(tokens=500, depth=6, seconds=2.5),
        pool=3,
        pool_limits=Budget(tokens=0, tool_calls=0, cost=0.0),
        traces=True,
        events=True,
    ),
    Grant(pool=3, limits=Budget(tokens=2_000, tool_calls=4)),
    Room(pool=3, worth={"tokens": 1_500.0}),
    Deny(pool=3, refusal=REFUSAL),
    Close(pool=3),
    Taken(id=7),
    Stop(run=1, status="budget_exceeded", reason=str(REFUSAL.error()), refusal=REFUSAL),
]
UP = [
    Ask(
        pool=3,
        tallies=((1, TALLY), (2, Tally())),
        want=Want(tokens=300, requests=1, detail="284 input + 16 output"),
    ),
    Nodes(run=1, tally=TALLY, nodes=(NODE,)),
    Events(events=(Event(at=1.5, agent="helper", detail=ToolStart(tool="x", call_id="c")),)),
    Done(run=1, result=RESULT, tally=TALLY, traces=(TRACE,), nodes=(NODE,)),
    Take(id=7, lane="gpt-4.1-mini", input=1_200, output=4_096),
    Give(id=7, input=1_180, output=230, used=True),
    Give(id=8, refused=True, pause=1.5),
    Give(id=0, lane="tool:browser", pause=30.0),
]


def test_every_message_down_round_trips_through_the_wire_and_json() -> None:
    assert decode_down(encode(DOWN)) == DOWN
    assert msgspec.json.decode(msgspec.json.encode(DOWN), type=list[Down]) == DOWN


def test_every_message_up_round_trips_through_the_wire_and_json() -> None:
    assert decode_up(encode(UP)) == UP
    assert (
        msgspec.json.decode(
            msgspec.json.encode(UP), type=list[Ask | Nodes | Events | Done | Take | Give]
        )
        == UP
    )


def test_a_refusal_crosses_whole() -> None:
    error = decode_down(encode([DOWN[3]]))[0].refusal.error()  # type: ignore[union-attr]
    assert str(error) == (
        "tokens limit of 1,000 reached: the next request needs about 300 (x), 120 left "
        "(budget of lead 'lead#1.ef')"
    )


@pytest.mark.parametrize(
    "data",
    [b"", b"\x91\x81\xa4type\xa5Bogus", msgspec.msgpack.encode([{"type": "Grant", "run": "x"}])],
)
def test_bad_bytes_are_refused_whole(data: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_down(data)
