"""The runtime owns the models its agents use: it closes each one when it exits.

Every model an agent spawned in a runtime uses (its own, its memory's summarizer, a
``ReActModel``'s inner one), at any depth, is closed after every actor ended: a
provider's client never outlives the event loop it was made in. A model closed so is
still usable: the next runtime that uses it opens a new client.
"""

from __future__ import annotations

import gc
import warnings

import anyio

from fractor.actors import (
    Agent,
    AgentRef,
    Compaction,
    FunctionModel,
    LocalHosts,
    ModelRequest,
    ReActModel,
    ScriptedModel,
    ToolResultMessage,
    call,
    calls,
    reply,
)
from fractor.actors._models._protocol import Turn
from fractor.runtime import Runtime

from ..loopback import LoopbackServer, json_reply
from ..providers.wires import completion, openai_model


class Closing(FunctionModel):
    """A model that writes down each ``aclose``, and whether any actor still ran."""

    def __init__(
        self, name: str, closed: list[str], runtime: list[Runtime], answer: str = ""
    ) -> None:
        super().__init__(lambda request: reply(answer) if answer else _answer(request), name=name)
        self.closed = closed
        self.runtime = runtime

    async def aclose(self) -> None:
        live = self.runtime[0].statistics().live_actors if self.runtime else 0
        self.closed.append(f"{self.name} (live actors: {live})")


def _answer(request: ModelRequest) -> Turn:
    """A lead asks its subagents at once (two workers), then answers; a worker
    answers at once."""
    if request.tools and not isinstance(request.messages[-1], ToolResultMessage):
        return calls(
            call("worker", task="a"),
            call("worker", task="b"),
            call("reasoner", task="c"),
            call("plain", task="d"),
        )
    return reply("ok")


async def test_every_model_of_the_tree_is_closed_once_when_the_runtime_exits() -> None:
    closed: list[str] = []
    running: list[Runtime] = []
    shared = Closing("shared", closed, running)  # the lead's and both workers'
    # Inside the reasoner's ReActModel, and the plain agent's own.
    inner = Closing("inner", closed, running, '{"thought": "easy", "final": "c"}')
    summarizer = Closing("summarizer", closed, running)  # the lead's memory
    worker = Agent("worker", shared)
    reasoner = Agent("reasoner", ReActModel(inner))
    plain = Agent("plain", inner)
    lead = Agent(
        "lead",
        shared,
        subagents=[worker, reasoner, plain],
        memory=Compaction(threshold=100_000, model=summarizer),
    )
    async with Runtime() as rt:
        running.append(rt)
        ref = await rt.spawn(lead)
        result = await ref.ask("go")
        nodes = [(n.name, n.status) for n in rt.tree().nodes if n.depth > 1]
        assert closed == []  # not while the runtime runs
    assert (result.status, result.text) == ("completed", "ok"), result.stop_reason
    assert sorted(nodes) == [
        ("plain", "completed"),
        ("reasoner", "completed"),
        ("worker", "completed"),
        ("worker", "completed"),
    ]
    # Each one, after every actor ended (the inner one by the runtime and by its
    # ReActModel too: closing is idempotent).
    assert set(closed) == {
        "inner (live actors: 0)",
        "shared (live actors: 0)",
        "summarizer (live actors: 0)",
    }
    assert closed.count("shared (live actors: 0)") == 1  # one runtime: once however shared


async def test_a_model_closed_by_one_runtime_serves_the_next() -> None:
    closed: list[str] = []
    model = Closing("shared", closed, [])
    for round in range(2):
        async with Runtime() as rt:
            result = await (await rt.spawn(Agent("a", model))).ask("go")
        assert result.text == "ok"
        assert len(closed) == round + 1


async def test_models_of_hosts_in_this_process_are_closed_too() -> None:
    closed: list[str] = []
    shared = Closing("shared", closed, [])
    worker = Agent("worker", shared)
    lead = Agent(
        "lead",
        ScriptedModel([calls(call("worker", task="a"), call("worker", task="b")), reply("ok")]),
        subagents=[worker],
    )
    async with Runtime(hosts=LocalHosts(2)) as rt:
        result = await (await rt.spawn(lead)).ask("go")
    assert result.status == "completed", result.stop_reason
    # By each host's runtime that ran the worker, as it exits.
    assert 1 <= len(closed) <= 2
    assert set(closed) == {"shared (live actors: 0)"}


def test_a_provider_model_is_closed_in_its_event_loop_and_opens_again_in_the_next() -> None:
    # On asyncio, a client left open when its loop closes is collected later, in
    # unrelated code: an unclosed transport, or "Event loop is closed" when used.
    with LoopbackServer() as server:
        server.queue(json_reply(completion("first")), json_reply(completion("second")))
        model = openai_model(server, stream=False)
        texts: list[str] = []

        async def main() -> None:
            async with Runtime() as rt:
                texts.append((await (await rt.spawn(Agent("a", model))).ask("go")).text)

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            anyio.run(main, backend="asyncio")
            gc.collect()
            anyio.run(main, backend="asyncio")
            gc.collect()
    assert texts == ["first", "second"]
    assert [str(w.message) for w in caught] == []


async def test_a_model_closed_by_one_runtime_does_not_cut_another_ones_request() -> None:
    # Two runtimes alive at once share a provider model: the first to exit closes it
    # while the other's request is in flight; that request ends as it would have.
    with LoopbackServer() as server:
        server.queue(json_reply(completion("late"), delay=0.5))
        model = openai_model(server, stream=False)
        texts: list[str] = []
        async with Runtime() as other, other.events() as events:
            ref = await other.spawn(Agent("a", model))
            async with anyio.create_task_group() as tg:
                tg.start_soon(lambda: _ask_into(ref, texts))
                with anyio.fail_after(5):
                    async for event in events:  # the request is on its way
                        if event.kind == "request_start":
                            break
                async with Runtime() as first:
                    await first.spawn(Agent("b", model))
                # ``first`` closed the model: the request in flight goes on.
        assert texts == ["late"]
        # And the model serves again with a new client.
        server.queue(json_reply(completion("again")))
        async with Runtime() as rt:
            again = await (await rt.spawn(Agent("c", model))).ask("go")
        assert again.text == "again"


async def _ask_into(ref: AgentRef, texts: list[str]) -> None:
    texts.append((await ref.ask("go")).text)


#: Where the objects of a running tree are defined: the kernel, the agent, its
#: executions, their requests and tools, the events.
TREE_MODULES = tuple(
    f"fractor.{name}"
    for name in (
        "runtime.",
        "actors._agent.",
        "actors._execution.",
        "actors._requests.",
        "actors._tools.",
        "actors._models.",
        "actors._observation.",
    )
)


async def test_an_ended_tree_is_freed_without_the_garbage_collector() -> None:
    """An actor that ended (and its executions, recorders, cells and children) is
    freed as soon as nothing refers to it: no reference cycle is left for the
    garbage collector, whose passes over thousands of short-lived actors would cost
    more than the actors do."""
    import weakref

    from fractor.actors import tool

    async def echo(x: int) -> int:
        return x

    worker = Agent("worker", ScriptedModel([reply("w")] * 12))
    lead = Agent(
        "lead",
        ScriptedModel(
            [calls(call("worker", {"task": "a"}), call("echo", {"x": 1})), reply("done")] * 6
        ),
        tools=[tool(echo)],
        subagents=[worker],
    )
    async with Runtime() as rt:
        ref = await rt.spawn(lead)
        assert (await ref.ask("go")).status == "completed"
        cell = rt._cells[ref.id]  # white box: the actor, kept only by its cell
        actor = weakref.ref(cell.actor)
        await ref.stop()
        assert actor() is None  # (the cell let it go as it ended)
        del cell, ref
        gc.collect()
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds, kept to be seen
        try:
            for _ in range(5):
                ref = await rt.spawn(lead)
                assert (await ref.ask("go")).status == "completed"
                await ref.stop()
            del ref
            gc.collect()
            # (Only the objects a tree is made of: whatever else of the process
            # became garbage meanwhile, an earlier test's, is not this test's.)
            left = sorted(
                {
                    type(o).__qualname__
                    for o in gc.garbage
                    if type(o).__module__.startswith(TREE_MODULES)
                }
            )
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
    assert left == []
