"""A process for the crash test of ``test_persistence.py``.

``python crash_agent.py DB MODE BACKEND``, with MODE ``crash``, ``compact`` or
``resume``.

``crash``: the agent ``support`` answers a first task, then in a second task calls a
tool that prints ``BLOCKED`` and waits forever (the test kills the process there).
``compact``: the same, with ``Agent(memory=...)``: the second task first folds the
first turn into the summary (a successful summarization), then blocks.
``resume``: the agent ``support`` is spawned again on the same database, answers
one task, and prints the first request its model received as JSON.
"""

from __future__ import annotations

import sys

import anyio

from fractor.actors import Agent, Compaction, ScriptedModel, call, reply, tool
from fractor.runtime import Event, Runtime, SQLiteStore, encode_json


@tool
async def wait_forever() -> str:
    """Never returns."""
    print("BLOCKED", flush=True)
    await anyio.sleep_forever()
    raise AssertionError("unreachable")  # pragma: no cover


async def crash(db: str, compact: bool = False) -> None:
    turns = [reply("First answer."), call("wait_forever", text="thinking in the buffer")]
    if compact:
        turns.insert(1, reply("The user asked a first question."))  # the summary
    model = ScriptedModel(turns)
    memory = Compaction(threshold=1, keep=0) if compact else None
    agent = Agent("support", model, tools=[wait_forever], memory=memory)
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(agent, id="support")
        first = await ref.ask("First question?")
        print("FIRST", first.status, first.execution_id, flush=True)
        rt.event_bus.listen(folded)  # where it happens: before the tool blocks
        await ref.ask("Second question?")


def folded(event: Event) -> None:
    if event.kind == "compaction":
        print("FOLDED", event.detail["ok"], flush=True)


async def resume(db: str) -> None:
    model = ScriptedModel([reply("Resumed answer.")])
    agent = Agent("support", model)
    async with SQLiteStore(db) as store, Runtime(store=store) as rt:
        ref = await rt.spawn(agent, id="support")
        result = await ref.ask("Third question?")
    print("RESULT", result.status, result.text, flush=True)
    print("REQUEST", encode_json(model.requests[0].messages).decode(), flush=True)


def main() -> None:
    db, mode, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    if mode == "resume":
        anyio.run(resume, db, backend=backend)
    else:
        anyio.run(crash, db, mode == "compact", backend=backend)


if __name__ == "__main__":
    main()
