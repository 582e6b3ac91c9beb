"""Provider path: 1,000 agents, one request each, through ``OpenAIModel``, beside the
bare ``AsyncOpenAI`` client making the same 1,000 calls.

The workload starts an OpenAI-compatible chat completions server of its own in a
separate process (this module, ``python -m benchmarks.provider --serve``), on
127.0.0.1 at a free port, and kills it when it is done. The server is a raw HTTP/1.1
loop with keep-alive on anyio's TCP streams: ``POST /v1/chat/completions`` answers
``LATENCY`` seconds after the request with a JSON completion (usage included), or,
when the body says ``"stream": true``, with server-sent events in chunked transfer
encoding: a role chunk, five content deltas ``STREAM_GAP`` seconds apart, a finish
chunk, a usage chunk (``choices: []``, when ``stream_options.include_usage`` asks for
it) and ``data: [DONE]``. ``GET /stats`` says how many completions it served and
the last request's body, which the workload uses to check that both sides sent the
same request.

- fractor: ``Runtime()`` entered; 1,000 tasks in a task group each spawn an
  ``Agent`` (instructions, ``max_tokens``, no tools) and ask it the same task once;
  every agent shares one ``OpenAIModel`` (one SDK client, with its connection pool),
  built with ``stream=False`` for the first row and ``stream=True`` for the second.
  Every ``Result`` must be completed, with the server's text.
- The bare client: one ``AsyncOpenAI`` configured as ``OpenAIModel`` configures its
  own (no retries, the same timeout); 1,000 tasks in a task group each call
  ``chat.completions.create`` with the same messages and ``max_tokens`` (streamed:
  ``stream=True, stream_options={"include_usage": True}``, the chunks consumed and
  their text joined), checking the text.

Before the rounds, one request of each side is compared as the server received it:
the bodies must be the same JSON. Throughput (requests per second) of each, medians
of interleaved rounds after a warm-up; target (DESIGN.md section 6): fractor at
least 0.9 x the bare client, streamed and not. With 1,000 requests in flight the
server's latency is hidden and the server (on the other core) is idle most of the
time: what is measured is the client side's work per request. Most of it is the
SDK's, on both sides (building the request, and its connection pool, which looks at
every connection each time a request comes or goes); fractor adds the agent (spawn,
the supervisor's reserve and settle, the execution's records) and reads the response
with msgspec where the SDK builds pydantic objects (one per chunk when streamed).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import pathlib
import sys
import urllib.request
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any

import anyio
import anyio.abc
import msgspec
from anyio.streams.buffered import BufferedByteReceiveStream

from fractor.actors import Agent
from fractor.actors.providers import OpenAIModel
from fractor.runtime import Runtime

from ._harness import Row, compare, judged

if TYPE_CHECKING:  # the SDK is imported by the benchmark, never by its server
    from openai import AsyncOpenAI
    from openai.types.chat import ChatCompletionMessageParam

__all__ = ["run", "serve"]

#: Throughput target against the bare client (DESIGN.md section 6).
TARGET = 0.9
#: Seconds the server waits before it answers a request (its first byte).
LATENCY = 0.003
#: Seconds between a streamed reply's content deltas.
STREAM_GAP = 0.0005
#: What both sides send.
MODEL = "bench"
INSTRUCTIONS = "You are a terse assistant."
TASK = "Say hello."
MAX_TOKENS = 64
#: Seconds a request may take, on both sides (OpenAIModel's default).
TIMEOUT = 60.0
_MESSAGES: list[ChatCompletionMessageParam] = [
    {"role": "system", "content": INSTRUCTIONS},
    {"role": "user", "content": TASK},
]
#: The server's answer, and how a streamed one is cut into deltas.
PIECES = ("Hello!", " How", " can I", " help you", " today?")
ANSWER = "".join(PIECES)
#: How long the server may take to start, and a whole run to finish.
START_SECONDS = 30.0
RUN_SECONDS = 600.0
#: The folder holding the benchmarks package (a checkout, or site-packages).
_HOME = pathlib.Path(__file__).resolve().parent.parent


# -- the server (its own process) ----------------------------------------------------


class _Asked(msgspec.Struct):
    """What the server reads of a request body."""

    model: str = ""
    stream: bool = False
    stream_options: dict[str, Any] | None = None


_decode_asked = msgspec.json.Decoder(_Asked).decode
_USAGE = {
    "prompt_tokens": 19,
    "completion_tokens": 8,
    "total_tokens": 27,
    "prompt_tokens_details": {"cached_tokens": 0, "audio_tokens": 0},
    "completion_tokens_details": {"reasoning_tokens": 0, "audio_tokens": 0},
}
_CREATED = 1_700_000_000


def _completion(model: str) -> bytes:
    """A whole JSON response, head included."""
    body = json.dumps(
        {
            "id": "chatcmpl-bench",
            "object": "chat.completion",
            "created": _CREATED,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": ANSWER, "refusal": None},
                    "logprobs": None,
                    "finish_reason": "stop",
                }
            ],
            "usage": _USAGE,
            "system_fingerprint": "fp_bench",
        }
    ).encode()
    head = (
        f"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


def _chunk(data: bytes) -> bytes:
    """One chunk of a chunked body."""
    return b"%x\r\n%s\r\n" % (len(data), data)


def _event(model: str, choices: list[Any], **extra: Any) -> bytes:
    """One server-sent event of a streamed completion, as one chunk of the body."""
    payload = {
        "id": "chatcmpl-bench",
        "object": "chat.completion.chunk",
        "created": _CREATED,
        "model": model,
        "system_fingerprint": "fp_bench",
        "choices": choices,
        **extra,
    }
    return _chunk(b"data: " + json.dumps(payload).encode() + b"\n\n")


def _delta(delta: dict[str, Any], finish: str | None = None) -> list[Any]:
    return [{"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}]


def _streamed(model: str, usage: bool) -> tuple[bytes, list[bytes], bytes]:
    """A streamed response: the head with the role chunk, the content deltas (sent
    ``STREAM_GAP`` apart), and the rest (finish, usage, ``[DONE]``, the last chunk)."""
    head = (
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream; charset=utf-8\r\n"
        b"cache-control: no-cache\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    first = head + _event(model, _delta({"role": "assistant", "content": "", "refusal": None}))
    deltas = [_event(model, _delta({"content": piece})) for piece in PIECES]
    rest = _event(model, _delta({}, "stop"))
    if usage:
        rest += _event(model, [], usage=_USAGE)
    rest += _chunk(b"data: [DONE]\n\n") + b"0\r\n\r\n"
    return first, deltas, rest


class _Server:
    """The loopback server: what it has served, and its prepared replies."""

    def __init__(self, latency: float, gap: float) -> None:
        self.latency = latency
        self.gap = gap
        self.served = 0
        self.last = b"null"
        self._replies: dict[tuple[str, bool, bool], Any] = {}

    def _reply(self, asked: _Asked) -> Any:
        usage = bool((asked.stream_options or {}).get("include_usage"))
        key = (asked.model, asked.stream, usage)
        reply = self._replies.get(key)
        if reply is None:
            made = _streamed(asked.model, usage) if asked.stream else _completion(asked.model)
            reply = self._replies[key] = made
        return reply

    async def connection(self, stream: anyio.abc.SocketStream) -> None:
        """Serve one keep-alive connection until the client closes it."""
        buffer = b""
        async with stream:
            with contextlib.suppress(anyio.EndOfStream, anyio.BrokenResourceError, OSError):
                while True:
                    while (end := buffer.find(b"\r\n\r\n")) < 0:
                        buffer += await stream.receive()
                    head, buffer = buffer[:end], buffer[end + 4 :]
                    length = _content_length(head)
                    while len(buffer) < length:
                        buffer += await stream.receive()
                    body, buffer = buffer[:length], buffer[length:]
                    await self._answer(stream, head, body)

    async def _answer(self, stream: anyio.abc.SocketStream, head: bytes, body: bytes) -> None:
        target = head.split(b" ", 2)[1] if b" " in head else b""
        if head.startswith(b"GET ") and target == b"/stats":
            stats = b'{"served": %d, "last": %s}' % (self.served, self.last)
            await stream.send(_head(200, len(stats)) + stats)
            return
        if not (head.startswith(b"POST ") and target == b"/v1/chat/completions"):
            message = b'{"error": {"message": "not found", "type": "invalid_request_error"}}'
            await stream.send(_head(404, len(message)) + message)
            return
        asked = _decode_asked(body)
        self.served += 1
        self.last = body
        await anyio.sleep(self.latency)
        reply = self._reply(asked)
        if not asked.stream:
            await stream.send(reply)
            return
        first, deltas, rest = reply
        await stream.send(first)
        for delta in deltas:
            if self.gap:
                await anyio.sleep(self.gap)
            await stream.send(delta)
        await stream.send(rest)


def _content_length(head: bytes) -> int:
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"content-length":
            return int(value)
    return 0


def _head(status: int, length: int) -> bytes:
    reason = b"OK" if status == 200 else b"Not Found"
    return b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n" % (
        status,
        reason,
        length,
    )


async def _serve(latency: float, gap: float) -> None:
    server = _Server(latency, gap)
    listener = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
    port = listener.extra(anyio.abc.SocketAttribute.local_port)
    print(f"listening on {port}", flush=True)
    async with anyio.create_task_group() as tg:
        tg.start_soon(listener.serve, server.connection)
        # Until the parent goes: it closes our stdin (or kills us first).
        await anyio.to_thread.run_sync(sys.stdin.buffer.read)
        tg.cancel_scope.cancel()


def serve(latency: float = LATENCY, gap: float = STREAM_GAP) -> None:
    """Run the loopback server until stdin closes; its first line of output is
    ``listening on PORT``. On asyncio, whatever backend the benchmark runs on."""
    anyio.run(_serve, latency, gap, backend="asyncio")


@contextlib.asynccontextmanager
async def _server(latency: float = LATENCY, gap: float = STREAM_GAP) -> AsyncIterator[str]:
    """The server in a process of its own, killed on the way out; yields its URL."""
    command = [sys.executable, "-m", "fractor.benchmarks.provider", "--serve"]
    command += ["--latency", repr(latency), "--gap", repr(gap)]
    process = await anyio.open_process(command, cwd=_HOME, stderr=None)
    try:
        assert process.stdout is not None
        with anyio.fail_after(START_SECONDS):
            line = await BufferedByteReceiveStream(process.stdout).receive_until(b"\n", 200)
        port = int(line.decode().rsplit(" ", 1)[1])
        yield f"http://127.0.0.1:{port}"
    finally:
        with anyio.CancelScope(shield=True):
            process.kill()
            await process.aclose()


async def _stats(url: str) -> dict[str, Any]:
    def fetch() -> dict[str, Any]:
        with urllib.request.urlopen(f"{url}/stats", timeout=10) as answer:
            stats: dict[str, Any] = json.loads(answer.read())
            return stats

    return await anyio.to_thread.run_sync(fetch)


# -- both sides ----------------------------------------------------------------------


async def _ask(rt: Runtime, agent: Agent, results: list[str], index: int) -> None:
    ref = await rt.spawn(agent)
    result = await ref.ask(TASK)
    if result.status != "completed":
        raise RuntimeError(f"agent {ref.id} ended {result.status!r}: {result.stop_reason}")
    results[index] = result.text


async def _fractor(model: OpenAIModel, agents: int) -> None:
    agent = Agent(MODEL, model, instructions=INSTRUCTIONS, max_tokens=MAX_TOKENS)
    texts = [""] * agents
    async with Runtime() as rt, anyio.create_task_group() as tg:
        for index in range(agents):
            tg.start_soon(_ask, rt, agent, texts, index)
    _check(texts, "fractor")


async def _create(client: AsyncOpenAI, stream: bool, texts: list[str], index: int) -> None:
    if not stream:
        completion = await client.chat.completions.create(
            model=MODEL, messages=_MESSAGES, max_tokens=MAX_TOKENS
        )
        texts[index] = completion.choices[0].message.content or ""
        return
    chunks = await client.chat.completions.create(
        model=MODEL,
        messages=_MESSAGES,
        max_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    texts[index] = "".join(
        [chunk.choices[0].delta.content or "" async for chunk in chunks if chunk.choices]
    )


async def _bare(client: AsyncOpenAI, stream: bool, requests: int) -> None:
    texts = [""] * requests
    async with anyio.create_task_group() as tg:
        for index in range(requests):
            tg.start_soon(_create, client, stream, texts, index)
    _check(texts, "the bare client")


def _check(texts: list[str], side: str) -> None:
    wrong = [text for text in texts if text != ANSWER]
    if wrong:
        raise RuntimeError(f"{side} read {len(wrong)} wrong answers, e.g. {wrong[0]!r}")


async def _same_requests(
    url: str, fractor: Callable[[int], Awaitable[None]], baseline: Callable[[int], Awaitable[None]]
) -> None:
    """Both sides send the same request body (compared as JSON), or a RuntimeError."""
    await fractor(1)
    ours = (await _stats(url))["last"]
    await baseline(1)
    theirs = (await _stats(url))["last"]
    if ours != theirs:
        raise RuntimeError(f"fractor sent {ours!r}, the bare client {theirs!r}")


async def _row(url: str, *, stream: bool, agents: int, repeats: int) -> Row:
    model = OpenAIModel(MODEL, base_url=f"{url}/v1", api_key="x", stream=stream, timeout=TIMEOUT)
    from openai import AsyncOpenAI

    # The client OpenAIModel makes for itself: the same timeout, no retries.
    client = AsyncOpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=TIMEOUT)
    try:
        await _same_requests(
            url,
            lambda n: _fractor(model, n),
            lambda n: _bare(client, stream, n),
        )
        row = await compare(
            f"Provider path: {agents:,} agents, {'streamed' if stream else 'not streamed'}",
            fractor=lambda: _fractor(model, agents),
            baseline=lambda: _bare(client, stream, agents),
            operations=agents,
            repeats=repeats,
            min_ratio=TARGET,
        )
    finally:
        await model.aclose()
        await client.close()
    return judged(row, f">= {TARGET:g} x bare AsyncOpenAI", row.ratio >= TARGET)


async def run(
    *, quick: bool = False, agents: int | None = None, repeats: int | None = None
) -> list[Row]:
    """Two rows: not streamed, and streamed; 1,000 agents (50 when quick), each side
    timed 5 times (3 when quick)."""
    if agents is None:
        agents = 50 if quick else 1000
    if repeats is None:
        repeats = 3 if quick else 5
    with anyio.fail_after(RUN_SECONDS):
        async with _server() as url:
            return [
                await _row(url, stream=stream, agents=agents, repeats=repeats)
                for stream in (False, True)
            ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.provider")
    parser.add_argument("--serve", action="store_true", help="run the loopback server")
    parser.add_argument("--latency", type=float, default=LATENCY)
    parser.add_argument("--gap", type=float, default=STREAM_GAP)
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.latency, args.gap)
    else:
        parser.error("use python -m benchmarks --only 'Provider path' to run the workload")


if __name__ == "__main__":
    main()
