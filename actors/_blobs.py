"""Images and documents stored once: parts in states and traces refer to blobs.

An agent's state and its traces are JSON documents; the bytes of their images and
documents would be base64 in each (a 5 MB image in a conversation, its trace and a
resumed agent's: three copies, each a third larger). With a store that keeps blobs
(``fractor.runtime.BlobStore``: ``MemoryStore`` and ``SQLiteStore``), what is
written is each part without its bytes (``data=None``: its hash, size, media type
and header facts stay), and the bytes go to the store's blobs under the part's
SHA-256, each once. Loading a state, or traces to run again (a resumed ask),
asks the store for the blobs its parts name and restores the bytes.

A store that keeps no blobs gets the parts whole, as before (``detaching`` is
False for it). Nothing here runs for states and traces without parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import msgspec

from fractor.runtime import Store

from ._messages import ExecutionTrace, Message, StepRecord, ToolResultMessage, UserMessage
from ._parts import Media, MediaPart, with_data

__all__ = [
    "attach_messages",
    "attach_parts",
    "attach_trace",
    "detach_messages",
    "detach_parts",
    "detach_trace",
    "keeps_blobs",
    "load_blobs",
    "stored_keys",
]

Blobs = dict[str, bytes]


def keeps_blobs(store: Store) -> bool:
    """Whether ``store`` keeps blobs (a ``BlobStore``): asked of what it can do."""
    return callable(getattr(store, "load_blobs", None))


def detach_parts(parts: tuple[Media, ...], blobs: Blobs) -> tuple[Media, ...]:
    """``parts`` without their bytes, which go to ``blobs`` (each SHA-256 once): as a
    store keeps them, and as they cross to another host."""
    if not parts:
        return parts
    out: list[Media] = []
    for part in parts:
        if isinstance(part, MediaPart) and part.data is not None:
            blobs.setdefault(part.sha256, part.data)
            part = msgspec.structs.replace(part, data=None)
        out.append(part)
    return tuple(out)


def attach_parts(parts: tuple[Media, ...], blobs: Blobs) -> tuple[Media, ...]:
    """``parts`` stored or sent without their bytes, with them from ``blobs`` (a part
    named twice gets the same bytes object). The bytes are not checked again: they
    were when the part was made, and are kept by its hash (``with_data``)."""
    if not parts or not blobs:
        return parts
    out: list[Media] = []
    for part in parts:
        if isinstance(part, MediaPart) and part.stored:
            data = blobs.get(part.sha256)
            if data is not None:
                part = with_data(part, data)
        out.append(part)
    return tuple(out)


def _message_parts(
    messages: tuple[Message, ...], blobs: Blobs, change: object
) -> tuple[Message, ...]:
    if not any(
        (type(m) is UserMessage or type(m) is ToolResultMessage) and m.parts for m in messages
    ):
        return messages
    out: list[Message] = []
    for message in messages:
        if (type(message) is UserMessage or type(message) is ToolResultMessage) and message.parts:
            parts = (
                detach_parts(message.parts, blobs)
                if change is detach_parts
                else attach_parts(message.parts, blobs)
            )
            message = msgspec.structs.replace(message, parts=parts)
        out.append(message)
    return tuple(out)


def detach_messages(messages: tuple[Message, ...], blobs: Blobs) -> tuple[Message, ...]:
    """``messages`` with their parts' bytes moved to ``blobs`` (the same tuple if none)."""
    return _message_parts(messages, blobs, detach_parts)


def attach_messages(messages: tuple[Message, ...], blobs: Blobs) -> tuple[Message, ...]:
    """``messages`` with their stored parts' bytes taken from ``blobs``."""
    return _message_parts(messages, blobs, attach_parts)


def _has_parts(trace: ExecutionTrace) -> bool:
    if trace.task_parts or trace.parts:
        return True
    return any(outcome.parts for step in trace.steps for outcome in step.outcomes)


def _trace_parts(trace: ExecutionTrace, blobs: Blobs, change: object) -> ExecutionTrace:
    if not _has_parts(trace):
        return trace
    fix = detach_parts if change is detach_parts else attach_parts
    steps: list[StepRecord] = []
    for step in trace.steps:
        if any(outcome.parts for outcome in step.outcomes):
            outcomes = tuple(
                msgspec.structs.replace(o, parts=fix(o.parts, blobs)) if o.parts else o
                for o in step.outcomes
            )
            step = msgspec.structs.replace(step, outcomes=outcomes)
        steps.append(step)
    return msgspec.structs.replace(
        trace,
        steps=tuple(steps),
        task_parts=fix(trace.task_parts, blobs),
        parts=fix(trace.parts, blobs),
    )


def detach_trace(trace: ExecutionTrace, blobs: Blobs) -> ExecutionTrace:
    """``trace`` with its parts' bytes moved to ``blobs`` (the same trace if none)."""
    return _trace_parts(trace, blobs, detach_parts)


def attach_trace(trace: ExecutionTrace, blobs: Blobs) -> ExecutionTrace:
    """``trace`` with its stored parts' bytes taken from ``blobs``."""
    return _trace_parts(trace, blobs, attach_parts)


def _stored(parts: Iterable[Media]) -> Iterator[str]:
    for part in parts:
        if isinstance(part, MediaPart) and part.stored:
            yield part.sha256


def stored_keys(
    messages: Iterable[Message] = (), traces: Iterable[ExecutionTrace] = ()
) -> set[str]:
    """The blob keys the stored parts of ``messages`` and ``traces`` name."""
    keys: set[str] = set()
    for message in messages:
        if (type(message) is UserMessage or type(message) is ToolResultMessage) and message.parts:
            keys.update(_stored(message.parts))
    for trace in traces:
        if _has_parts(trace):
            keys.update(_stored(trace.task_parts))
            keys.update(_stored(trace.parts))
            for step in trace.steps:
                for outcome in step.outcomes:
                    keys.update(_stored(outcome.parts))
    return keys


async def load_blobs(store: Store, keys: set[str]) -> Blobs:
    """The blobs of ``keys`` from ``store`` (none from a store that keeps none)."""
    if not keys or not keeps_blobs(store):
        return {}
    loaded: Blobs = await store.load_blobs(keys)  # type: ignore[attr-defined]
    return loaded
