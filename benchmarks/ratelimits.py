"""Rate limits: 1,000 agents against a server whose bucket admits 20% of their demand.

The server is the tests' bucket server (``tests/actors/providers/bucket_server.py``,
loaded from the source tree: a real HTTP server on 127.0.0.1 in a thread, speaking
OpenAI's chat completions) enforcing, over a sliding window of ``WINDOW`` seconds
(a minute scaled down), ``B = N / 5`` requests and the tokens of ``B`` requests (each
charged its input and its output cap up front, settled to its real usage), and
answering 429 with ``retry-after`` / ``retry-after-ms`` and the rate-limit headers
past them. ``N`` one-request agents asked at once would send five windows' worth.

- fractor: ``Runtime(rate_limits={model: RateLimit(requests_per_minute=B,
  tokens_per_minute=..., period=WINDOW)})``, the bucket declared; ``N`` agents of one
  ``OpenAIModel`` (whole answers), each spawned and asked once, all at once.
- The bare SDK: one ``AsyncOpenAI`` with its own retries (``max_retries`` high
  enough that every request ends answered; it honours ``retry-after-ms``), ``N``
  tasks each calling ``chat.completions.create`` once with the same messages and
  ``max_tokens``.

Each side runs against a fresh server. Goodput is the requests completed beyond the
bucket's first fill (the ``B`` a full bucket lets through at once) per second of the
run: ``(N - B) / wall``, which is the bucket's rate ``B / WINDOW`` for a client that
keeps it full and never waits longer than it must. Rows: fractor's goodput against
the bucket's rate (target >= 0.9); the 429s each side received (fractor's target 0:
no overshoot of the bucket); the SDK's goodput against fractor's.
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import time
from types import ModuleType
from typing import Any

import anyio

from fractor.actors import Agent
from fractor.actors.providers import OpenAIModel
from fractor.runtime import RateLimit, Runtime

from ._harness import Row, single

__all__ = ["run"]

#: A minute, scaled down to 6 seconds (at 1 s, 200 requests a second of the OpenAI
#: SDK are more than this 2-core machine's client does: the run measured the CPU).
WINDOW = 6.0
#: The share of the agents' demand the bucket admits in a window.
SHARE = 0.2
#: Every request's output cap (what it is charged up front, besides its input).
MAX_TOKENS = 20
TARGET = 0.9
#: What a request's charge is: the bucket server's count of this task's input, and
#: the cap.
TASK = "Say ok."
#: Retries of the bare SDK: enough that none of its requests gives up.
SDK_RETRIES = 1_000
RUN_SECONDS = 120


def _bucket_server() -> ModuleType:
    """The tests' bucket server, loaded from the source tree (the suite does not
    import the tests as a package)."""
    here = pathlib.Path(__file__).resolve().parent
    path = here.parent / "tests" / "actors" / "providers" / "bucket_server.py"
    spec = importlib.util.spec_from_file_location("_fractor_bench_bucket_server", path)
    if spec is None or spec.loader is None:  # pragma: no cover - a broken checkout
        raise RuntimeError(f"no bucket server at {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # (its dataclasses look their module up)
    spec.loader.exec_module(module)
    # A thousand connections at once: a listen queue that takes them (the standard
    # library's default of 5 would reset most).
    module._Server.request_queue_size = 2048
    return module


def _server(module: ModuleType, requests: int, tokens: int) -> Any:
    return module.BucketServer(
        requests=requests, tokens=tokens, window=WINDOW, latency=0.005, output_tokens=5
    )


async def _fractor(
    module: ModuleType, agents: int, requests: int, tokens: int
) -> tuple[float, int]:
    """fractor with the bucket declared: (wall seconds, 429s the server sent)."""
    with _server(module, requests, tokens) as server:
        model = OpenAIModel(
            "test-model", base_url=server.base_url("openai"), api_key="x", stream=False
        )
        limits = {
            model.name: RateLimit(
                requests_per_minute=requests, tokens_per_minute=tokens, period=WINDOW
            )
        }
        async with model, Runtime(rate_limits=limits) as rt:
            failed = 0

            async def one(index: int) -> None:
                nonlocal failed
                ref = await rt.spawn(Agent(f"agent-{index}", model, max_tokens=MAX_TOKENS))
                result = await ref.ask(TASK)
                if not result.ok or result.text != "ok":
                    failed += 1

            began = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for index in range(agents):
                    tg.start_soon(one, index)
            wall = time.perf_counter() - began
        seen = server.statistics()
    if failed or seen.served != agents:
        raise RuntimeError(f"fractor: {failed} asks failed, {seen.served} of {agents} served")
    return wall, seen.refused


async def _bare(module: ModuleType, agents: int, requests: int, tokens: int) -> tuple[float, int]:
    """The bare SDK with its own retries: (wall seconds, 429s the server sent)."""
    from openai import AsyncOpenAI

    with _server(module, requests, tokens) as server:
        client = AsyncOpenAI(
            base_url=server.base_url("openai"),
            api_key="x",
            max_retries=SDK_RETRIES,
            timeout=60.0,
        )
        failed = 0

        async def one() -> None:
            nonlocal failed
            answer = await client.chat.completions.create(
                model="test-model",
                messages=[{"role": "user", "content": TASK}],
                max_tokens=MAX_TOKENS,
            )
            if answer.choices[0].message.content != "ok":
                failed += 1

        try:
            began = time.perf_counter()
            async with anyio.create_task_group() as tg:
                for _ in range(agents):
                    tg.start_soon(one)
            wall = time.perf_counter() - began
        finally:
            await client.close()
        seen = server.statistics()
    if failed or seen.served != agents:
        raise RuntimeError(f"bare SDK: {failed} failed, {seen.served} of {agents} served")
    return wall, seen.refused


async def run(*, quick: bool = False) -> list[Row]:
    """Three rows: fractor's goodput against the bucket's rate, the 429s each side
    received, the SDK's goodput against fractor's."""
    agents = 300 if quick else 1_000
    module = _bucket_server()
    requests = int(agents * SHARE)
    # The tokens of ``requests`` requests, each charged its input (the server counts
    # this task as 3 tokens) and its output cap up front.
    tokens = requests * (3 + MAX_TOKENS)
    rate = requests / WINDOW
    label = f"Rate limits: {agents:,} agents, server bucket at {SHARE:.0%} of demand"
    with anyio.fail_after(RUN_SECONDS):
        ours, ours_refused = await _fractor(module, agents, requests, tokens)
        theirs, theirs_refused = await _bare(module, agents, requests, tokens)
    ours_goodput = (agents - requests) / ours
    theirs_goodput = (agents - requests) / theirs
    goodput = single(
        f"{label}: goodput / bucket rate",
        "ops/s",
        ours_goodput,
        rate,
        ratio=ours_goodput / rate,
        target=f">= {TARGET:g} x the bucket's rate",
        holds=ours_goodput >= TARGET * rate,
    )
    refused = single(
        "  429s received (fractor | bare SDK retrying)",
        "count",
        float(ours_refused),
        float(theirs_refused),
        ratio=1.0 if ours_refused == 0 else 0.0,
        target="fractor == 0",
        holds=ours_refused == 0,
    )
    sdk = single(
        "  goodput, fractor | bare SDK retrying",
        "ops/s",
        ours_goodput,
        theirs_goodput,
        ratio=ours_goodput / theirs_goodput,
        target="reported",
        holds=True,
    )
    print(
        f"(fractor {ours:.2f} s, {ours_refused} 429s; bare SDK {theirs:.2f} s, "
        f"{theirs_refused} 429s)",
        end=" ",
    )
    return [goodput, refused, sdk]
