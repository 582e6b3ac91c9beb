"""What the agent layer keeps with a subtree rides in one slot of the kernel's ``Node``
(``Node.layer``, a ``Subtree``): the kernel's own slots hold no object of the agent
layer, and every node of a subtree shares its top's watcher and trace list."""

from __future__ import annotations

from fractor.actors import Agent, ScriptedModel, call, reply, tool
from fractor.actors._observation._subtree import Subtree, subtree, with_traces, with_watch
from fractor.runtime import MemoryStore, Node, Runtime


def _agent_layer(value: object) -> bool:
    """Whether ``value`` is, or holds, an object of the agent layer (``fractor.actors``),
    a bound method of one included."""
    if isinstance(value, list | tuple | set | frozenset):
        return any(_agent_layer(item) for item in value)
    if isinstance(value, dict):
        return any(_agent_layer(item) for item in (*value, *value.values()))
    owner = getattr(value, "__self__", value)
    return (getattr(type(owner), "__module__", "") or "").startswith("fractor.actors")


async def test_a_streamed_tree_with_a_store_keeps_its_subtree_in_the_layer_slot_only() -> None:
    seen: list[tuple[Node, Subtree]] = []
    async with Runtime(store=MemoryStore()) as rt:

        async def look() -> str:
            # The tree as it is while the child runs: the lead's node and the child's.
            nodes = [n for n in rt.supervisor.nodes.values() if n.parent is not None]
            seen.extend((node, subtree(node)) for node in nodes)
            return "seen"

        child = Agent(
            "child", ScriptedModel([call("look"), reply("child done")]), tools=[tool(look)]
        )
        lead = Agent(
            "lead",
            ScriptedModel([call("child", task="dig"), reply("lead done")]),
            subagents=[child],
        )
        ref = await rt.spawn(lead)
        async with ref.stream("go", subagents=True) as run:
            events = [event async for event in run]
        assert run.result.text == "lead done"
    (top, kept), (below, kept_below) = sorted(seen, key=lambda pair: pair[0].depth)
    assert below.parent is top
    # The kernel's own slots hold nothing of the agent layer; its layer slot does.
    for node in (top, below):
        for slot in Node.__slots__:
            if slot != "layer":
                assert not _agent_layer(getattr(node, slot, None)), (node, slot)
    assert _agent_layer(top.layer)
    # One Subtree for both: the stream's watcher, and the list their executions join.
    assert kept_below is kept
    assert kept.watch is not None
    assert isinstance(kept.traces, list)
    assert subtree(top).traces is None  # handed to the store as the top ended
    assert {e.agent for e in events} == {"lead", "child"}


async def test_a_subtree_that_sets_its_own_watcher_leaves_its_parents_be() -> None:
    async with Runtime() as rt:
        top = rt.supervisor.open(rt.supervisor.root, name="top", limits=None)
        below = rt.supervisor.open(top, name="below", limits=None)

        with_traces(top, [])
        before = subtree(top)
        assert subtree(below) is not before  # opened before: it kept what it was given
        with_watch(below, print)
        assert subtree(below).watch is print
        assert subtree(top) is before
        assert subtree(top).watch is None
        deeper = rt.supervisor.open(below, name="deeper", limits=None)
        assert subtree(deeper) is subtree(below)  # handed down as it opens
        assert rt.supervisor.root.layer is None
