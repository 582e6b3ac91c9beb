"""What an agent keeps in the runtime's store, and how it is encoded.

An agent's **state** is its persistent sections: summary (with how many turns it
covers), buffer and messages (user turns and final answers). Never the execution
buffer: tool calls and tool results live only while an execution runs. Each
execution's **trace** is a separate record (see ``_observation._traces``).

Both are JSON (msgspec): readable with any SQLite client, the same format as a
trace export, and as fast to encode as MessagePack for these small documents. New
fields get defaults, so older states keep loading.

Which agents keep a state: a top-level agent (spawned by ``Runtime.spawn``, not by
another agent) with an id of its own: ``await rt.spawn(agent, id="support")``. It
loads its state when it starts and saves it after every execution that returns,
so it resumes its conversation in a later process. An id given at spawn is the
agent's whatever its shape (``id="photographer-1"`` too): the runtime knows which
ids it made up (``ActorContext.named``), not guessing from their form. Ids the
runtime makes up (``<name>-<number>``) are reused by every process, and a subagent
lives for one task: both start fresh and save only their traces.
"""

from __future__ import annotations

import msgspec

from fractor.runtime import StoreError

from .._messages import Message

__all__ = ["AgentState", "decode_state", "encode_state"]

#: The version of ``AgentState`` this code writes.
STATE_VERSION = 1


class AgentState(msgspec.Struct, frozen=True, kw_only=True):
    """An agent's persistent sections, as a store keeps them."""

    version: int = STATE_VERSION
    summary: tuple[Message, ...] = ()
    buffer: tuple[Message, ...] = ()
    messages: tuple[Message, ...] = ()
    #: How many turns the summary covers (folded out of ``messages``).
    summarized: int = 0


_encode = msgspec.json.Encoder().encode
_decode = msgspec.json.Decoder(AgentState).decode


def encode_state(state: AgentState) -> bytes:
    return _encode(state)


def decode_state(data: bytes, *, store: str, actor_id: str) -> AgentState:
    """The state in ``data``; ``StoreError`` naming the store and actor if unreadable."""
    operation = f"restore the conversation of agent {actor_id!r}"
    try:
        state = _decode(data)
    except msgspec.DecodeError as exc:
        raise StoreError(store, operation, f"the stored state is not valid: {exc}") from None
    if state.version > STATE_VERSION:
        raise StoreError(
            store,
            operation,
            f"the stored state is version {state.version}, written by a newer fractor; "
            f"this one reads version {STATE_VERSION}",
        )
    return state
