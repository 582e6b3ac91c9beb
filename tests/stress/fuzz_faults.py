"""The faults of the fuzz: tools that fail, and models that answer from the seed.

Tools take the calling agent's marker (``tag``), so whatever they answer is that
agent's text. They raise, time out (20 and 30 ms, with and without a retry), hang
for good (``stall``: offered only under a deadline), block a worker thread (and past
its timeout), answer with a lone surrogate, raise an error that cannot be shown, or
answer past their result cap.

``Script`` is the function of an agent's ``FunctionModel``: its answer to a request
is drawn from ``random.Random`` seeded with the tree's seed, the agent, the task,
the step and how many times that step was asked (a retry draws anew), never from
the order of requests, so concurrent agents never take each other's turns. It is
a final answer, tool calls, subagent calls, a model error or garbage, with 0 to
10 ms of latency. ``FaultyModel`` wraps the fake to break what the fake itself
would have made right (blank call ids, output past ``max_tokens``).

``Hosts`` are ``LocalHosts`` that tell the fuzz each placement, so that it can
kill a host right when a subtree was placed there (``LocalHosts.kill``: as a
crash would).

Each fault counts itself in the ``Counter`` of the running tree (``faults``), a
context variable: actors run in tasks that copy the context of the one that spawned
them, and worker threads get a copy too.
"""

from __future__ import annotations

import contextvars
import math
import random
import time
import zlib
from collections import Counter
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import msgspec

from fractor.actors import (
    AssistantMessage,
    FinishReason,
    FunctionModel,
    LocalHosts,
    ModelRequest,
    ModelResponse,
    ProviderError,
    ToolCall,
    UserMessage,
    call,
    calls,
    estimate_tokens,
    reply,
    tool,
)
from fractor.runtime import Usage

from .fuzz_checks import marker
from .fuzz_memory import digest_calls, summarize
from .fuzz_plan import GARBAGE, Plan, Spec

if TYPE_CHECKING:
    from fractor.actors._hosts._hosts import HostLink
    from fractor.actors._hosts._remote import RemoteChild

__all__ = [
    "LATENCIES",
    "MODEL",
    "PROBE",
    "TOOLS",
    "FaultyModel",
    "Hosts",
    "Script",
    "faults",
]

#: The name of every fake model (its price is set on the runtime).
MODEL = "fuzz"
#: A task with this word is answered at once (the asks after the rounds).
PROBE = "probe"
LATENCIES = (0.0, 0.0, 0.0, 0.001, 0.002, 0.005, 0.01)

#: The fault counts of the tree running in this context.
faults: contextvars.ContextVar[Counter[str]] = contextvars.ContextVar("fuzz_faults")


def _hit(kind: str) -> None:
    """Count one fault of ``kind`` for the tree running in this context."""
    counter = faults.get(None)
    if counter is not None:
        counter[kind] += 1


# -- tools: each takes the caller's marker, so its text is the caller's -----------------------


@tool
async def work(tag: str, delay_ms: int = 0) -> str:
    """Do one piece of work for the agent ``tag`` names."""
    if delay_ms:
        await anyio.sleep(delay_ms / 1000)
    return f"{tag} work done"


@tool
async def broken(tag: str) -> str:
    """Always fails."""
    _hit("tool_raises")
    raise ValueError(f"{tag} broken tool")


@tool(retries=1, retry_delay=0.001)
async def broken_twice(tag: str) -> str:
    """Fails on every attempt, retried once."""
    _hit("tool_retry")
    raise ValueError(f"{tag} broken again")


@tool(timeout=0.02)
async def slow(tag: str) -> str:
    """Hangs past its timeout."""
    _hit("tool_timeout")
    await anyio.sleep(5)
    return f"{tag} too late"  # pragma: no cover


@tool(timeout=0.03, retries=1)
async def slow_retry(tag: str) -> str:
    """Hangs past its timeout on every attempt."""
    _hit("tool_timeout_retry")
    await anyio.sleep(5)
    return f"{tag} too late"  # pragma: no cover


@tool
async def stall(tag: str) -> str:
    """Hangs for good: offered only where a deadline applies."""
    _hit("tool_stall")
    await anyio.sleep(60)
    return f"{tag} too late"  # pragma: no cover


@tool
def blocking(tag: str, ms: int = 0) -> str:
    """Blocks a worker thread a little."""
    _hit("sync_tool")
    time.sleep(ms / 1000)
    return f"{tag} blocked {ms} ms"


@tool(timeout=0.02)
def blocking_slow(tag: str) -> str:
    """Blocks a worker thread past its timeout (the thread is abandoned)."""
    _hit("sync_tool_timeout")
    time.sleep(0.05)
    return f"{tag} too late"


@tool
async def odd_text(tag: str) -> str:
    """Answers with a lone surrogate."""
    _hit("tool_surrogate")
    return f"{tag} odd \ud800 text"


class _Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("this error cannot be shown")


@tool
async def unprintable(tag: str) -> str:
    """Raises an error whose text cannot be made."""
    _hit("tool_unprintable")
    raise _Unprintable


@tool(max_result_chars=200)
async def big(tag: str) -> str:
    """Answers with more than its result cap."""
    _hit("tool_big")
    return f"{tag} " + "x" * 5_000


TOOLS = {
    t.name: t
    for t in (
        work,
        broken,
        broken_twice,
        slow,
        slow_retry,
        stall,
        blocking,
        blocking_slow,
        odd_text,
        unprintable,
        big,
    )
}


# -- the models ----------------------------------------------------------------------------


class _ErrorWithUsage(Exception):
    """A failed request that reports what it used (true or not)."""

    def __init__(self, usage: Usage) -> None:
        super().__init__("the model failed after reading the request")
        self.usage = usage


def _digest(text: str) -> str:
    return f"{zlib.crc32(text.encode('utf-8', 'surrogatepass')) & 0xFFFF:04x}"


def _raw(name: str, arguments: str, call_id: str = "", text: str = "") -> ModelResponse:
    """A tool call exactly as given: no encoding, no id filled in here."""
    return ModelResponse(
        text=text,
        tool_calls=(ToolCall(id=call_id, name=name, arguments=arguments),),
        finish_reason="tool_calls",
    )


class Script:
    """The model function of one agent: its answer to each request, drawn from the seed."""

    def __init__(
        self,
        spec: Spec,
        plan: Plan,
        *,
        skip: frozenset[str] = frozenset(),
        on_request: Callable[[], None] | None = None,
    ) -> None:
        self.spec = spec
        self.plan = plan
        #: Model and garbage faults not to inject.
        self.skip = skip
        #: Called as each request arrives (the fuzz checks the tree's snapshot there).
        self.on_request = on_request
        self.me = marker(spec.name)
        #: How many times each (task, step) was asked: retries get new draws.
        self.attempts: dict[tuple[str, int], int] = {}

    async def __call__(self, request: ModelRequest) -> ModelResponse:
        if self.on_request is not None:
            self.on_request()
        if request.purpose == "summary":  # its agent compacts, with this model
            spec = self.spec
            return await summarize(
                self.plan.seed, spec.name, request, self.attempts, separate=False, deadline=False
            )
        messages = request.messages
        last_task = max(i for i, m in enumerate(messages) if isinstance(m, UserMessage))
        task = messages[last_task].content
        # The buffer's length tells the steps apart; a retry sends the same request.
        key = (task, len(messages) - last_task)
        attempt = self.attempts.get(key, 0)
        self.attempts[key] = attempt + 1
        rng = random.Random(f"{self.plan.seed}|{self.spec.name}|{key}|{attempt}")
        latency = rng.choice(LATENCIES)
        if latency:
            await anyio.sleep(latency)
        if PROBE in task:
            return reply(f"{self.me} probe answer")
        steps = sum(isinstance(m, AssistantMessage) for m in messages[last_task + 1 :])
        kinds = ["final", "tools", "delegate", "error", "garbage"]
        focus = self.plan.focus
        weights = [0.1 + 0.25 * steps, 0.3, 0.45 if self.spec.children else 0.0, 0.1, 0.2]
        weights[3 if focus.startswith("model_") else 4] += 0.3
        kind = "final" if steps >= self.spec.max_steps else rng.choices(kinds, weights)[0]
        again = digest_calls(request, last_task)  # an attempt after others: their calls
        if again and rng.random() < 0.6:
            response = ModelResponse(tool_calls=tuple(again), finish_reason="tool_calls")
            return self._usage(rng, request, response)
        if kind == "tools":
            turns = [self._tool_call(rng) for _ in range(rng.randint(1, 4))]
            return self._usage(rng, request, calls(*turns, text=f"{self.me} step {steps}"))
        if kind == "delegate":
            turns = [
                call(
                    rng.choice(self.spec.children).name,
                    task=f"{self.me} {_digest(task)} {steps}.{i}",
                )
                for i in range(rng.randint(1, 3))
            ]
            if self.spec.tools and rng.random() < 0.3:
                turns.append(self._tool_call(rng))
            return self._usage(rng, request, calls(*turns, text=f"{self.me} delegates"))
        if kind == "error":
            return await self._error(rng, request)
        if kind == "garbage":
            return self._garbage(rng, request, steps)
        return self._usage(rng, request, reply(f"{self.me} final {_digest(task)}.{steps}"))

    def _tool_call(self, rng: random.Random) -> ModelResponse:
        if not self.spec.tools:
            return call("work", tag=self.me)  # not offered: an unknown tool
        name = rng.choice(self.spec.tools)
        if name == "work":
            return call(name, tag=self.me, delay_ms=rng.choice([0, 0, 1, 3, 8]))
        if name == "blocking":
            return call(name, tag=self.me, ms=rng.choice([0, 1, 2]))
        return call(name, tag=self.me)

    def _usage(
        self, rng: random.Random, request: ModelRequest, response: ModelResponse
    ) -> ModelResponse:
        """Estimated usage, or explicit usage that a real provider could report: input
        at most the estimate the budget checked (more would be an estimate that fell
        short, which the design lets overshoot)."""
        if rng.random() < 0.5:
            return response
        estimate = estimate_tokens(request)
        usage = Usage(
            input_tokens=math.floor(estimate * rng.random()),
            output_tokens=rng.randint(1, 60),
            cached_tokens=rng.choice([0, 0, rng.randint(0, 10)]),
            requests=1,
        )
        return msgspec.structs.replace(response, usage=usage)

    async def _error(self, rng: random.Random, request: ModelRequest) -> ModelResponse:
        kinds = ["retryable", "fatal", "plain", "connection", "usage", "surrogate", "stall"]
        if not self.spec.deadline:
            kinds.remove("stall")
        kinds = [k for k in kinds if f"model_{k}" not in self.skip] or ["plain"]
        focus = self.plan.focus.removeprefix("model_")
        kind = focus if focus in kinds and rng.random() < 0.7 else rng.choice(kinds)
        _hit(f"model_{kind}")
        if kind == "retryable":
            raise ProviderError("fuzz", "rate limited", model=MODEL, status=429, retryable=True)
        if kind == "fatal":
            raise ProviderError("fuzz", "the request was refused", model=MODEL, status=400)
        if kind == "plain":
            raise RuntimeError("the model blew up")
        if kind == "connection":
            raise ConnectionError("connection reset by peer")
        if kind == "usage":
            estimate = estimate_tokens(request)
            reported = rng.choice(
                [Usage(input_tokens=estimate // 2, requests=1), Usage(input_tokens=-1, requests=1)]
            )
            raise _ErrorWithUsage(reported)
        if kind == "surrogate":
            raise RuntimeError("the model sent \ud800 half a character")
        await anyio.sleep(60)  # a hang that only a deadline ends
        return reply(f"{self.me} too late")  # pragma: no cover

    def _garbage(self, rng: random.Random, request: ModelRequest, steps: int) -> ModelResponse:
        me = self.me
        kinds = [k for k in GARBAGE if f"garbage_{k}" not in self.skip]
        focus = self.plan.focus.removeprefix("garbage_")
        kind = focus if focus in kinds and rng.random() < 0.7 else rng.choice(kinds)
        if kind == "bad_subagent_args" and not self.spec.children:
            kind = "unknown_tool"
        _hit(f"garbage_{kind}")
        name = rng.choice(self.spec.tools) if self.spec.tools else "work"
        text = f"{me} step {steps}"
        if kind == "unknown_tool":
            return call("no_such_tool", tag=me, text=text)
        if kind == "bad_json":
            return _raw(name, '{"tag": "' + me + '", not json', text=text)
        if kind == "bad_args":
            return call(name, tag=7, text=text)
        if kind == "empty_args":
            return _raw(name, "", text=text)
        if kind == "dup_ids":
            duplicated = ToolCall(
                id="dup", name=name, arguments=msgspec.json.encode({"tag": me}).decode()
            )
            return ModelResponse(
                text=text, tool_calls=(duplicated, duplicated), finish_reason="tool_calls"
            )
        if kind == "reused_id":
            return call(name, tag=me, id="again", text=text)
        if kind == "missing_ids":
            response = calls(*(call(name, tag=me) for _ in range(rng.randint(1, 3))), text=text)
            return msgspec.structs.replace(response, model=f"{MODEL}+blank")
        if kind == "negative_usage":
            usage = Usage(input_tokens=-3, output_tokens=2, requests=1)
            return msgspec.structs.replace(reply(f"{me} final"), usage=usage)
        if kind == "huge_usage":
            usage = Usage(input_tokens=2 * 10**8, output_tokens=1, requests=1)
            return msgspec.structs.replace(call(name, tag=me, text=text), usage=usage)
        if kind == "over_max_tokens":
            return msgspec.structs.replace(reply(f"{me} final"), model=f"{MODEL}+overflow")
        if kind == "empty_reply":
            return ModelResponse(text="", finish_reason="stop")
        if kind == "finish_reason":
            reasons: list[FinishReason] = ["length", "content_filter", "error"]
            reason = rng.choice(reasons)
            return ModelResponse(text=f"{me} cut short", finish_reason=reason)
        if kind == "surrogate_text":
            if rng.random() < 0.5:
                return reply(f"{me} final \ud800 answer")
            return call(name, tag=me, text=f"{me} \udc00 thinking")
        if kind == "surrogate_args":
            return _raw(name, '{"tag": "' + me + ' \udc00"}', text=text)
        # bad_subagent_args
        child = rng.choice(self.spec.children).name
        arguments = rng.choice(
            ['{"what": "x"}', '{"task": 3}', "{not json", '{"task": "x", "y": 1}']
        )
        return _raw(child, arguments, text=text)


class FaultyModel:
    """A ``FunctionModel`` behind a layer that breaks what the fake would have made
    right: call ids blanked (``+blank``), output past ``max_tokens`` (``+overflow``).
    The script asks for it in the response's ``model`` field."""

    def __init__(self, inner: FunctionModel) -> None:
        self.fake = inner
        self.name = inner.name

    async def request(self, request: ModelRequest) -> ModelResponse:
        response = await self.fake.request(request)
        _, _, flag = response.model.partition("+")
        if not flag:
            return response
        response = msgspec.structs.replace(response, model=self.name)
        if flag == "blank":
            blank = tuple(msgspec.structs.replace(c, id="") for c in response.tool_calls)
            return msgspec.structs.replace(response, tool_calls=blank)
        cap = request.max_tokens
        output = cap + 5 if cap is not None else 2 * 10**8
        usage = msgspec.structs.replace(response.usage, output_tokens=output)
        return msgspec.structs.replace(response, usage=usage)

    def estimate_tokens(self, request: ModelRequest) -> int:
        return self.fake.estimate_tokens(request)

    async def aclose(self) -> None:
        await self.fake.aclose()


# -- hosts that die ----------------------------------------------------------------------------


class Hosts(LocalHosts):
    """``LocalHosts`` that tell each placement (``wait_placed``)."""

    def __init__(self, count: int) -> None:
        super().__init__(count)
        self._placed = anyio.Event()

    def start_on(self, child: RemoteChild, link: HostLink) -> None:
        super().start_on(child, link)
        self._placed.set()
        self._placed = anyio.Event()

    async def wait_placed(self, name: str, count: int) -> HostLink:
        """Wait until ``count`` subtrees were placed on host ``name``; its link."""
        link = next(link for link in self.links if link.name == name)
        while link.placed < count:
            await self._placed.wait()
        return link
