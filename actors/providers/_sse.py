"""Server-sent events, as both providers' streams send them, and what reads them.

- ``sse_events``: the (event name, data) pairs of a streamed body's bytes, read in
  linear time, no event held past a bound (``EventTooLarge``).
- ``StreamReader``: what a provider implements to read its wire format's events.
- ``finish_stream``: finishing the generators a stream was read through once its
  connection is closed (see its docstring: trio warns about any left suspended).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Protocol

import anyio

from .._messages import ModelResponse, Usage
from ._errors import ProviderError

__all__ = [
    "MAX_EVENT",
    "EventTooLarge",
    "SinkFailed",
    "StreamReader",
    "finish_stream",
    "sse_events",
]

#: The most bytes ``sse_events`` holds of one event (its lines) unless told otherwise:
#: far more than any event of a provider's stream, far less than a server gone wrong
#: can send without a line break.
MAX_EVENT = 4 * 1024 * 1024


async def finish_stream(
    events: AsyncGenerator[tuple[str, str], None],
    chunks: AsyncGenerator[bytes, None],
    *,
    started: bool,
) -> None:
    """Finish the generators a stream was read through, once its connection is closed.

    A generator left suspended is finalized by the garbage collector, and trio warns
    (``ResourceWarning``) for each. Closing the outer one is not enough: httpx's
    transport stream never closes the httpcore generator it iterates. So the chain is
    driven one more step in a cancelled scope: the innermost read fails (the
    connection is closed, or the scope cancels it) and the error runs out through
    every generator, each finishing on its way. ``chunks`` is driven too, on its
    own: ``events`` may have finished already by raising (``EventTooLarge``), which
    leaves the generators below it suspended.
    """
    if started:
        for generator in (events, chunks):
            with anyio.CancelScope() as scope:
                scope.cancel()
                with contextlib.suppress(Exception):
                    async for _ in generator:
                        pass
    await events.aclose()
    await chunks.aclose()


class StreamReader(Protocol):
    """What a provider reads a streamed response with, one server-sent event at a time.

    ``feed`` takes an event's name (``""`` when it has none) and its data, hands any
    text to the sink, and says whether the stream is complete; it raises
    ``ProviderError`` for an error event or data that cannot be read. ``received``
    counts the characters of output so far (text, tool arguments, reasoning: what
    ``max_tokens`` caps). ``response``
    is the ``ModelResponse`` read (a ``ProviderError`` from ``broken`` if the stream
    ended before it was complete); ``broken`` the error of a body that ended, or
    that the server dropped, before the response was complete (``detail`` says how:
    the one door for what such a stream means); ``usage`` what the request spent so
    far: the server's figures if it sent them, else estimates of the input and of
    the output received.
    """

    received: int

    def feed(self, event: str, data: str) -> bool: ...

    def response(self, status: int) -> ModelResponse: ...

    def broken(self, status: int, detail: str) -> ProviderError: ...

    def usage(self) -> Usage: ...


class EventTooLarge(Exception):
    """An event of a stream (one line, or the lines of one event) ran past ``limit``
    bytes: ``sse_events`` refuses it as it crosses the bound, before holding more."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"an event of the stream (its lines) of more than {limit} bytes")
        self.limit = limit


async def sse_events(
    chunks: AsyncIterator[bytes], *, max_event: int = MAX_EVENT
) -> AsyncGenerator[tuple[str, str], None]:
    """The server-sent events in a body's ``chunks`` of bytes: (event name, data) pairs.

    As the SSE format says: lines end with CRLF, LF or CR (and nothing else: U+2028,
    NEL and the other breaks ``str.splitlines`` knows are text, as they are inside a
    JSON string of a server that writes raw UTF-8); ``data:`` lines join with
    newlines, an ``event:`` line names the event, a blank line ends it, a line
    starting with ``:`` is a comment (a keep-alive), other fields are ignored. One
    exception: older llama.cpp servers send their error as an ``error: {...}`` line,
    read here as the data of an event named ``error``. An event left open when the
    body ends (no blank line after it) is still yielded.

    Each chunk is scanned once: the head of an unfinished line waits in a buffer that
    grows by appending, and only the new chunk is searched for line breaks (joined to
    the line so far and split again, each chunk of a long line would cost as much as
    the whole line before it). An event whose lines (the one unfinished included)
    hold more than ``max_event`` bytes is ``EventTooLarge``, raised as it crosses
    the bound: a line of 40 MB is never held whole.
    """
    name = ""
    data: list[str] = []
    held = 0  # the bytes of the event so far: its data lines and the unfinished line
    pending = bytearray()  # the head of a line that no chunk has ended yet
    after_cr = False  # the last chunk ended with CR: a LF opening the next one is its pair
    async for chunk in chunks:
        if after_cr and chunk:
            after_cr = False
            if chunk[:1] == b"\n":
                chunk = chunk[1:]
        if not chunk:
            continue
        after_cr = chunk[-1:] == b"\r"
        lines = chunk.splitlines()  # on bytes: CRLF, LF and CR only; this chunk alone
        tail = None if chunk[-1:] in (b"\n", b"\r") else lines.pop()
        for line in lines:
            if pending:
                pending += line
                line, pending = bytes(pending), bytearray()
            held += len(line)
            if held > max_event:
                raise EventTooLarge(max_event)
            if line:
                name, data = _sse_field(line, name, data)
            elif data:
                yield name, "\n".join(data)
                name, data, held = "", [], 0
            else:
                name, held = "", 0
        if tail:
            if held + len(pending) + len(tail) > max_event:
                raise EventTooLarge(max_event)
            pending += tail
    if pending:
        name, data = _sse_field(bytes(pending), name, data)
    if data:
        yield name, "\n".join(data)


def _sse_field(raw: bytes, name: str, data: list[str]) -> tuple[str, list[str]]:
    """The event's name and data lines after one line of it."""
    line = raw.decode("utf-8", "replace")
    if line.startswith("data:"):
        data.append(line[6:] if line.startswith("data: ") else line[5:])
    elif line.startswith("event:"):
        name = line[6:].strip()
    elif line.startswith("error:") and not data:  # older llama.cpp: see sse_events
        name = "error"
        data.append(line[7:] if line.startswith("error: ") else line[6:])
    # ":" comments, "id:", "retry:" and anything else are not data
    return name, data


class SinkFailed(Exception):
    """The caller's sink raised ``error``: ``ProviderModel.stream`` raises it as it is
    (the caller's bug, never a provider's failure to retry)."""

    def __init__(self, error: Exception) -> None:
        super().__init__(error)
        self.error = error
