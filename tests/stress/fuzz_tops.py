"""The top-level agents of a fuzz tree, as the driver sees them and checks them.

``spawn`` spawns one (again, after a cancellation: from the store, if it persists)
and checks the conversation it starts from; ``look`` checks a snapshot taken while
asks run; ``check_top``, once nothing runs, checks its conversation against its
traces in the compacted form (``fuzz_memory.check_conversation``) and its stored
state (``check_stored``: summary, count of turns summarized and messages, exactly);
``respawn`` brings back each cancelled one, which resumes what it last saved: its
last check, folded further or not, plus whole turns since.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from fractor.actors import (
    Agent,
    AgentRef,
    AgentState,
    Conversation,
    ExecutionTrace,
    Message,
    Result,
)
from fractor.runtime import ActorStopped

from .fuzz_checks import round_trip
from .fuzz_faults import _hit as hit
from .fuzz_final import decode_struct
from .fuzz_memory import check_conversation, check_pairs, check_sections, continues
from .fuzz_plan import Spec

if TYPE_CHECKING:
    from .fuzz_tree import TreeRun

__all__ = ["Top", "check_stored", "check_top", "look", "respawn", "spawn"]


@dataclass
class Top:
    """A top-level agent as the driver sees it."""

    spec: Spec
    agent: Agent
    ref: AgentRef
    actor_id: str | None
    #: The conversation it started from (a persistent agent resumes its stored one).
    start: Conversation
    #: Its conversation at the last check: (summarized turns, messages).
    last: tuple[int, tuple[Message, ...]]
    #: The Results of its current incarnation, by execution id.
    results: dict[str, Result] = field(default_factory=dict)
    cancelled: bool = False
    #: The tasks asked of it with ``resume=True``.
    resumes: set[str] = field(default_factory=set)


async def spawn(run: TreeRun, index: int, spec: Spec) -> Top:
    """Spawn top-level agent ``index`` (again, after a cancellation) and check the
    conversation it starts from."""
    assert run.rt is not None
    actor_id = f"{spec.name}_keeper" if index == 0 and run.plan.persistent else None
    agent = run.build(spec) if index >= len(run.tops) else run.tops[index].agent
    ref = await run.rt.spawn(agent, id=actor_id)
    conversation = await ref.conversation()
    run.violate(round_trip(conversation, Conversation, "a conversation"))
    if conversation.execution:
        run.violate([f"2: {spec.name} starts with a buffer of {conversation.execution}"])
    where = f"the resumed conversation of {spec.name}"
    run.violate(check_pairs(where, conversation.messages))
    summarized = conversation.summarized
    run.violate(check_sections(where, conversation.summary, summarized, bool(spec.memory)))
    last = (summarized, conversation.messages)
    return Top(spec=spec, agent=agent, ref=ref, actor_id=actor_id, start=conversation, last=last)


async def look(run: TreeRun, top: Top) -> None:
    """A snapshot taken while asks run: it is taken between executions."""
    hit("look")
    try:
        conversation = await top.ref.conversation()
    except ActorStopped:
        if not top.cancelled:
            run.violate([f"5: a look at the live {top.spec.name} raised ActorStopped"])
        return
    where = f"a look at {top.spec.name}"
    run.violate(round_trip(conversation, Conversation, "a conversation"))
    if conversation.execution:
        run.violate([f"2: {where} saw a buffer of {len(conversation.execution)}"])
    summarized = conversation.summarized
    run.violate(continues(where, top.last, (summarized, conversation.messages)))
    run.violate(check_sections(where, conversation.summary, summarized, bool(top.spec.memory)))
    run.violate(check_pairs(where, conversation.messages))


async def check_top(run: TreeRun, top: Top) -> None:
    """2, 5 and 6 on a live top-level agent once nothing runs: its conversation
    against its traces, and its stored state."""
    conversation = await top.ref.conversation()
    traces = await top.ref.trace()
    run.violate(round_trip(conversation, Conversation, "a conversation"))
    run.violate(round_trip(traces, tuple[ExecutionTrace, ...], "traces"))
    run.seen.update((trace.execution_id, trace) for trace in traces)
    run.violate(
        check_conversation(
            top.spec.name,
            conversation,
            traces,
            start=top.start,
            system=top.agent.instructions,
            results=top.results,
            memory=top.spec.memory,
            resumes=top.resumes,
        )
    )
    now = (conversation.summarized, conversation.messages)
    run.violate(continues(f"the conversation of {top.spec.name}", top.last, now))
    top.last = now
    if top.actor_id is not None:
        await check_stored(run, top, conversation)


async def check_stored(run: TreeRun, top: Top, conversation: Conversation) -> None:
    """2 and 6: the stored state decodes and holds ``conversation``'s summary and
    messages exactly."""
    messages = conversation.messages
    assert run.store is not None
    assert top.actor_id is not None
    where = f"the stored state of {top.actor_id}"
    data = await run.store.load(top.actor_id)
    if data is None:
        if messages:
            run.violate([f"2: nothing is stored for {top.actor_id}"])
        return
    run.violate(decode_struct(data, AgentState, where))
    try:
        state = msgspec.json.decode(data, type=AgentState)
    except Exception:
        return
    run.violate(check_pairs(where, state.messages))
    run.violate(check_sections(where, state.summary, state.summarized, bool(top.spec.memory)))
    stored = (state.summarized, state.summary, state.messages)
    if stored != (conversation.summarized, conversation.summary, messages):
        run.violate(
            [
                f"2: {where} is not its conversation: {len(state.messages)} messages, "
                f"{state.summarized} turns summarized"
            ]
        )


async def respawn(run: TreeRun) -> None:
    """Respawn each cancelled top-level agent, from the store if it persists: it
    resumes what it last saved (its last check, plus whole turns since)."""
    for index, top in enumerate(run.tops):
        if not top.cancelled:
            continue
        await top.ref.actor.wait_stopped()
        hit("respawn")
        fresh = await spawn(run, index, top.spec)
        if top.actor_id is not None:
            await check_stored(run, fresh, fresh.start)
            where = f"{top.actor_id} respawned"
            run.violate(continues(where, top.last, fresh.last))
        run.tops[index] = fresh
