"""What the request path's tests share: a real runtime's supervisor and a node of
its tree, an execution's recorder on it, and a scripted stage below the one under
test (as httpx's ``MockTransport`` serves a client): no model, no execution."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any

import pytest

from fractor.actors._execution._recording import Recorder
from fractor.actors._messages import ModelRequest, ModelResponse, UserMessage
from fractor.actors._models._protocol import ScriptedModel, reply
from fractor.actors._requests import Call
from fractor.runtime import Budget, Event, RateLimit, Runtime, Usage


class Refused(Exception):
    """A server's 429: refused for its rate limits, not billed."""

    status = 429
    retryable = True

    def __init__(self, retry_after: float | None = None) -> None:
        super().__init__(f"429 (retry after {retry_after})")
        self.retry_after = retry_after


class ServerError(Exception):
    """A server's 500 that reported what it used."""

    status = 500
    retryable = True

    def __init__(self, usage: Usage | None = None, retry_after: float | None = None) -> None:
        super().__init__("500")
        self.usage = usage
        self.retry_after = retry_after


class Unreachable(Exception):
    """No connection was made: nothing sent."""

    kind = "unreachable"
    retryable = True


def answer(text: str = "ok", tokens: tuple[int, int] = (10, 5), **fields: Any) -> ModelResponse:
    return ModelResponse(
        text=text,
        usage=Usage(input_tokens=tokens[0], output_tokens=tokens[1], requests=1),
        **fields,
    )


@dataclass
class Below:
    """The stage below the one under test: it answers (or raises) from its script,
    in order, keeping each call and the request as it came."""

    script: list[ModelResponse | BaseException | Callable[[Call], Any]]
    seen: list[Call] = field(default_factory=list)
    requests: list[ModelRequest] = field(default_factory=list)

    async def __call__(self, call: Call) -> ModelResponse:
        call.sent = True  # (what the wire would say)
        self.seen.append(call)
        self.requests.append(call.outgoing)
        step = self.script.pop(0)
        if callable(step) and not isinstance(step, BaseException | ModelResponse):
            step = await step(call)
        if isinstance(step, BaseException):
            raise step
        assert isinstance(step, ModelResponse)
        return step


@dataclass
class Harness:
    """A runtime, a node under its root, and an execution's recorder on it."""

    rt: Runtime
    recorder: Recorder
    events: list[Event[Any]]
    model: ScriptedModel

    def call(self, request: ModelRequest | None = None, **options: Any) -> Call:
        request = request or ModelRequest(messages=(UserMessage(content="hi"),), max_tokens=64)
        supervisor = self.rt.supervisor
        lane = supervisor.rates.lane(self.model.name)
        return Call(
            self.recorder,
            self.model,
            self.model.name,
            request,
            lane,
            options.pop("estimate", self.model.estimate_tokens(request)),
            True,
            **options,
        )

    def kinds(self) -> list[str]:
        return [event.kind for event in self.events]

    @property
    def node(self) -> Any:
        return self.recorder.node


@pytest.fixture
def make_harness() -> Callable[..., AbstractAsyncContextManager[Harness]]:
    """``async with make_harness(budget=..., rate_limits=...)``: see ``Harness``."""
    import contextlib

    @contextlib.asynccontextmanager
    async def make(
        budget: Budget | None = None,
        rate_limits: dict[str, RateLimit] | None = None,
        observed: bool = True,
        **runtime: Any,
    ) -> AsyncIterator[Harness]:
        async with Runtime(rate_limits=rate_limits, **runtime) as rt:
            supervisor = rt.supervisor
            node = supervisor.open(supervisor.root, name="a", limits=budget)
            events: list[Event[Any]] = []
            stop = rt.event_bus.listen(events.append) if observed else None
            recorder = Recorder("a", "a-1", node, supervisor, rt.event_bus, time.perf_counter())
            try:
                yield Harness(rt, recorder, events, ScriptedModel([reply("unused")], name="m"))
            finally:
                if stop is not None:
                    stop()

    return make
