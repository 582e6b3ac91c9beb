"""Reading server-sent events: each line in linear time, however the body is cut into
chunks, and no line or event held past a bound.

``sse_events`` is driven directly with bodies cut every way (a line break split
across chunks, CR LF split between two), and through the real providers against
servers on 127.0.0.1 that send one line of 12 MB, or 40 MB with no line break at
all: each request fails at once with a clear error, having held a few megabytes.
"""

from __future__ import annotations

import json
import tracemalloc
from collections.abc import AsyncGenerator, Iterable, Iterator
from contextlib import aclosing, contextmanager
from typing import Any

import anyio
import anyio.lowlevel
import pytest

from fractor.actors import ModelRequest, ProviderError, UserMessage
from fractor.actors.providers._sse import EventTooLarge, sse_events

from ..loopback import LoopbackServer, Reply
from .wires import Wire

MiB = 1024 * 1024


async def body(chunks: Iterable[bytes]) -> AsyncGenerator[bytes, None]:
    """A body's chunks as a connection yields them (a checkpoint between each)."""
    for chunk in chunks:
        await anyio.lowlevel.checkpoint()
        yield chunk


async def events_of(chunks: Iterable[bytes], **options: int) -> list[tuple[str, str]]:
    source = body(chunks)
    try:
        async with aclosing(sse_events(source, **options)) as events:
            return [event async for event in events]
    finally:
        await source.aclose()


# -- the format, however it is cut -----------------------------------------------------

STREAM = (
    b": a comment\r\n"
    b"event: first\r\ndata: one\r\ndata: two\r\n\r\n"
    b"data: three\r\r"
    b"id: 7\nretry: 10\ndata:four\n\n"
    b'error: {"message": "late"}\n\n'
    b"data: \xe2\x80\xa8 stays text\n\n"
    b"data: open at the end"
)
EVENTS = [
    ("first", "one\ntwo"),
    ("", "three"),
    ("", "four"),
    ("error", '{"message": "late"}'),
    ("", "\u2028 stays text"),
    ("", "open at the end"),
]


def cuts(data: bytes, size: int) -> list[bytes]:
    return [data[i : i + size] for i in range(0, len(data), size)]


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 13, 64, 4096])
async def test_events_read_the_same_however_the_body_is_cut(size: int) -> None:
    assert await events_of(cuts(STREAM, size)) == EVENTS


async def test_a_cr_lf_split_between_chunks_is_one_line_break() -> None:
    chunks = [b"data: a\r", b"\n", b"\r", b"\ndata: b\r", b"\n\r\n"]
    assert await events_of(chunks) == [("", "a"), ("", "b")]


# -- linear time, bounded memory --------------------------------------------------------


async def test_a_long_unfinished_line_is_read_in_linear_time() -> None:
    """40 MB of one line in 10 kB chunks: each chunk is scanned once, never the whole
    line again (joined to it and split again, each chunk cost as much as all the line
    before it: minutes for this body)."""
    piece = b"x" * 10_000
    chunks = [b"data: ", *[piece] * 4_000, b"\n\n"]
    with anyio.fail_after(20):
        events = await events_of(chunks, max_event=64 * MiB)
    assert [(name, len(data)) for name, data in events] == [("", 40_000_000)]


@pytest.mark.parametrize("end", [b"", b"\n\n"], ids=["unfinished", "finished"])
async def test_a_line_past_the_bound_is_refused_before_it_is_held(end: bytes) -> None:
    piece = b"x" * 65_536
    sent: list[int] = []

    def chunks() -> Iterator[bytes]:
        yield b"data: "
        for _ in range(200):  # 12.5 MiB
            sent.append(len(piece))
            yield piece
        yield end

    with pytest.raises(EventTooLarge) as caught:
        await events_of(chunks(), max_event=MiB)
    assert caught.value.limit == MiB
    assert "more than 1048576 bytes" in str(caught.value)
    assert sum(sent) <= MiB + len(piece)  # refused as it crossed the bound, not at the end


async def test_an_event_of_many_data_lines_past_the_bound_is_refused() -> None:
    line = b"data: " + b"y" * 1_000 + b"\n"
    with pytest.raises(EventTooLarge):
        await events_of([line] * 2_000, max_event=MiB)  # 2 MB, no blank line
    # The same lines as events of their own pass: the bound is per event.
    events = await events_of([line + b"\n"] * 2_000, max_event=MiB)
    assert len(events) == 2_000


# -- through the providers, from a server ----------------------------------------------

REQUEST = ModelRequest(messages=(UserMessage(content="x"),), max_tokens=100)


def streamed(parts: Iterable[bytes]) -> Reply:
    return Reply(content_type="text/event-stream", events=tuple(parts))


@contextmanager
def peak_memory() -> Iterator[list[int]]:
    """The most memory Python allocated in the block (traced), in bytes."""
    peak: list[int] = []
    tracemalloc.start()
    try:
        yield peak
    finally:
        peak.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()


def one_line(wire: Wire, size: int) -> list[bytes]:
    """A streamed answer whose first event is one line of ``size`` bytes of text."""
    text = "z" * size
    event: dict[str, Any]
    if wire.provider == "openai":
        chunk = {"id": "c", "object": "chat.completion.chunk", "model": "m"}
        event = {**chunk, "choices": [{"index": 0, "delta": {"content": text}}]}
        line = b"data: " + json.dumps(event).encode() + b"\n\n"
    else:
        usage = {"input_tokens": 40, "output_tokens": 1}
        started = {"id": "m", "type": "message", "role": "assistant", "model": "claude-test"}
        start = {"type": "message_start", "message": {**started, "content": [], "usage": usage}}
        block = {"type": "content_block_start", "index": 0, "content_block": {"type": "text"}}
        delta = {"type": "text_delta", "text": text}
        event = {"type": "content_block_delta", "index": 0, "delta": delta}
        line = (
            f"event: message_start\ndata: {json.dumps(start)}\n\n"
            f"event: content_block_start\ndata: {json.dumps(block)}\n\n"
            f"event: content_block_delta\ndata: {json.dumps(event)}\n\n"
        ).encode()
    return cuts(line, 65_536)


async def test_a_body_of_40_mb_with_no_line_break_fails_at_once_holding_little(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(streamed([b"data: "] + [b"x" * 65_536] * 640))  # 40 MiB, never a line end
    async with wire.model(server, timeout=60) as model:
        with anyio.fail_after(20), peak_memory() as peak, pytest.raises(ProviderError) as caught:
            await model.stream(REQUEST, lambda text: None)
    error = caught.value
    assert "more than" in str(error)
    assert "an output cap of 100 tokens" in str(error)
    assert not error.retryable
    assert error.status == 200
    assert peak[0] < 16 * MiB


async def test_a_line_of_12_mb_is_refused_without_holding_it_whole(
    wire: Wire, server: LoopbackServer
) -> None:
    server.queue(streamed(one_line(wire, 12_000_000)))
    sunk: list[str] = []
    async with wire.model(server, timeout=60) as model:
        with anyio.fail_after(20), peak_memory() as peak, pytest.raises(ProviderError) as caught:
            await model.stream(REQUEST, sunk.append)
    assert "more than" in str(caught.value)
    assert sunk == []  # nothing of it reached the caller
    assert peak[0] < 8 * MiB
