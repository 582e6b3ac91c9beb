"""Measure one tool under the runtime: throughput, latency, errors, peak concurrency.

``measure`` runs a user's tool the way an agent runs it. A lean scripted model asks,
at each step, for ``fanout`` calls of the tool with the same JSON arguments; the
agent runs them with ``tool_concurrency=concurrency``; executions follow one another
until ``calls`` calls ran. Every call goes through the whole path: the model request
under the supervisor, the tool-call charge, JSON decoding against the tool's schema,
the task group of the step, the trace.

The function is wrapped in a counting wrapper before it is made a tool (``counted``),
so the report says how many calls really ran at once: a sync tool, for one, runs in
worker threads and shares anyio's thread limiter. Latencies are the ``seconds`` of
each ``ToolOutcome`` in the traces (decoding, attempts and retries included, waiting
for a free slot not).

``load_target`` and ``prepare`` check what the user gave and raise ``BenchInputError``
with a message naming what was wrong and what was expected.
"""

from __future__ import annotations

import inspect
import math
import threading
import time
import typing
from collections.abc import Callable, Sequence
from typing import Any

import anyio
import msgspec

from fractor.runtime import Runtime

from .._agent._agent import Agent
from .._messages import ModelResponse, ToolCall, Usage
from .._models._protocol import CycleModel
from .._tools._schema import describe, introspect
from .._tools._tool import Tool, ToolDefinitionError, tool
from ._imports import SpecError, import_spec, is_function_of

__all__ = ["BenchInputError", "Gauge", "ToolReport", "load_target", "measure", "prepare"]

#: Calls one execution runs at most (more steps would only grow its buffer).
CALLS_PER_EXECUTION = 1_000
#: Steps one execution runs at most.
STEPS_PER_EXECUTION = 50
#: How often progress is reported, in seconds.
PROGRESS_INTERVAL = 0.1

_USAGE = Usage(input_tokens=1, output_tokens=1, requests=1)


class BenchInputError(ValueError):
    """What the user asked to measure cannot be measured; the message says why."""


class ToolReport(msgspec.Struct, frozen=True, kw_only=True):
    """What ``measure`` found. Latencies and wall time are in seconds."""

    tool: str
    kind: typing.Literal["async", "sync"]
    arguments: str
    fanout: int
    concurrency: int
    #: Tool calls that ran (equal to the calls asked for, unless an execution stopped).
    calls: int
    errors: int
    first_error: str
    wall_seconds: float
    throughput: float
    p50: float
    p95: float
    p99: float
    max: float
    peak_concurrency: int
    executions: int
    #: Why an execution ended without completing; empty when every one completed.
    incomplete: str = ""


class Gauge:
    """Calls of the measured function: in flight now, the most at once, finished."""

    __slots__ = ("_lock", "finished", "in_flight", "peak")

    def __init__(self) -> None:
        # A lock because sync tools run in worker threads; it is never held across
        # an await, so taking it on the event loop thread only waits for a counter.
        self._lock = threading.Lock()
        self.in_flight = 0
        self.peak = 0
        self.finished = 0

    def enter(self) -> None:
        with self._lock:
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def leave(self) -> None:
        with self._lock:
            self.in_flight -= 1
            self.finished += 1


def load_target(target: str) -> object:
    """The callable named by ``MODULE:FUNCTION`` (``_imports.import_spec``: the current
    directory is searched too)."""
    try:
        found = import_spec(
            target,
            option="--tool",
            form="MODULE:FUNCTION",
            example="mypackage.tools:search",
            fits=is_function_of,
            kind="functions",
        )
    except SpecError as exc:
        raise BenchInputError(str(exc)) from None
    if not callable(found):
        raise BenchInputError(
            f"--tool {target!r} is not callable: it is {describe(found)}; give a function, "
            "async or sync, or a @tool"
        )
    return found


def prepare(target: object, arguments: str) -> tuple[Tool[..., Any], Gauge]:
    """The tool to measure, counted by the returned ``Gauge``, once ``arguments`` fit it."""
    try:
        original = target if isinstance(target, Tool) else tool(typing.cast(Any, target))
    except ToolDefinitionError as exc:
        raise BenchInputError(str(exc)) from None
    check_arguments(original, arguments)
    gauge = Gauge()
    return counted(original, gauge), gauge


def check_arguments(subject: Tool[..., Any], arguments: str) -> None:
    """Raise ``BenchInputError`` unless ``arguments`` is a JSON object the tool accepts."""
    try:
        value = msgspec.json.decode(arguments)
    except msgspec.DecodeError as exc:
        raise BenchInputError(f"--args is not valid JSON ({exc}): {arguments!r}") from None
    if not isinstance(value, dict):
        raise BenchInputError(
            f"--args must be a JSON object of the tool's arguments, e.g. '{{\"x\": 1}}', "
            f"got {arguments!r}"
        )
    expected = msgspec.json.encode(subject.spec.parameters).decode()
    try:
        msgspec.json.decode(arguments, type=subject.arguments_type)
    except Exception as exc:  # ValidationError, or a __post_init__ of a nested type
        raise BenchInputError(
            f"--args do not fit the arguments of tool {subject.name!r}: {exc}. "
            f"Expected arguments: {expected}"
        ) from None


def counted(original: Tool[..., Any], gauge: Gauge) -> Tool[..., Any]:
    """``original`` with its function wrapped so ``gauge`` counts the calls in flight."""
    fn: Callable[..., Any] = original.fn
    wrapper: Callable[..., Any]
    if original.is_async:

        async def wrapper(**kwargs: Any) -> Any:
            gauge.enter()
            try:
                return await fn(**kwargs)
            finally:
                gauge.leave()

    else:

        def wrapper(**kwargs: Any) -> Any:
            gauge.enter()
            try:
                return fn(**kwargs)
            finally:
                gauge.leave()

    # The same schema as the original: its signature and its resolved annotations.
    hints_source, doc, _ = introspect(fn)
    setattr(wrapper, "__signature__", inspect.signature(fn))  # noqa: B010
    wrapper.__annotations__ = typing.get_type_hints(hints_source, include_extras=True)
    wrapper.__doc__ = doc
    return original.with_function(wrapper)


def plan(name: str, arguments: str, fanout: int, calls: int) -> list[tuple[ModelResponse, ...]]:
    """The turns of each execution: ``fanout`` calls per step, ``calls`` in all."""
    steps_each = max(1, min(STEPS_PER_EXECUTION, CALLS_PER_EXECUTION // fanout))
    per_execution = steps_each * fanout
    sizes = [per_execution] * (calls // per_execution)
    if calls % per_execution:
        sizes.append(calls % per_execution)
    cache: dict[int, tuple[ModelResponse, ...]] = {}
    for size in set(sizes):
        turns = [
            ModelResponse(
                tool_calls=tuple(
                    ToolCall(id=f"call_{step}_{i}", name=name, arguments=arguments)
                    for i in range(min(fanout, size - step * fanout))
                ),
                usage=_USAGE,
                finish_reason="tool_calls",
            )
            for step in range(math.ceil(size / fanout))
        ]
        turns.append(ModelResponse(text="done", usage=_USAGE))
        cache[size] = tuple(turns)
    return [cache[size] for size in sizes]


def percentile(ordered: Sequence[float], fraction: float) -> float:
    """The nearest-rank percentile of sorted ``ordered`` (0.0 when empty)."""
    if not ordered:
        return 0.0
    return ordered[max(0, math.ceil(fraction * len(ordered)) - 1)]


async def measure(
    subject: Tool[..., Any],
    gauge: Gauge,
    arguments: str,
    *,
    fanout: int,
    concurrency: int,
    calls: int,
    progress: Callable[[int, int], None] | None = None,
) -> ToolReport:
    """Run ``calls`` calls of ``subject`` under an agent; ``progress(done, total)``."""
    for option, value in (("fanout", fanout), ("concurrency", concurrency), ("calls", calls)):
        if value < 1:
            raise BenchInputError(f"{option} must be a whole number >= 1, got {value}")
    executions = plan(subject.name, arguments, fanout, calls)
    latencies: list[float] = []
    errors = 0
    first_error = ""
    incomplete = ""
    ran = 0
    agents: dict[int, Agent] = {}
    async with Runtime() as runtime, anyio.create_task_group() as tg:
        if progress is not None:
            tg.start_soon(_report_progress, gauge, calls, progress)
        began = time.perf_counter()
        for turns in executions:
            agent = agents.get(id(turns))
            if agent is None:  # one definition per plan: a full execution, the remainder
                agent = agents[id(turns)] = Agent(
                    "bench",
                    CycleModel(turns, name="bench"),
                    tools=[subject],
                    tool_concurrency=concurrency,
                    trace_limit=1,
                )
            # A fresh actor each time, so no execution carries the conversation of others.
            ref = await runtime.spawn(agent)
            result = await ref.ask("run the tool")
            (trace,) = await ref.trace()
            await ref.stop()
            ran += 1
            for step in trace.steps:
                for outcome in step.outcomes:
                    latencies.append(outcome.seconds)
                    if outcome.is_error:
                        errors += 1
                        first_error = first_error or outcome.content
            if not result.ok:
                incomplete = f"an execution ended {result.status}: {result.stop_reason}"
                break
        wall = time.perf_counter() - began
        tg.cancel_scope.cancel()
    if progress is not None:
        progress(len(latencies), calls)
    latencies.sort()
    return ToolReport(
        tool=subject.name,
        kind="async" if subject.is_async else "sync",
        arguments=arguments,
        fanout=fanout,
        concurrency=concurrency,
        calls=len(latencies),
        errors=errors,
        first_error=first_error,
        wall_seconds=wall,
        throughput=len(latencies) / wall if wall > 0 else 0.0,
        p50=percentile(latencies, 0.50),
        p95=percentile(latencies, 0.95),
        p99=percentile(latencies, 0.99),
        max=latencies[-1] if latencies else 0.0,
        peak_concurrency=gauge.peak,
        executions=ran,
        incomplete=incomplete,
    )


async def _report_progress(gauge: Gauge, total: int, progress: Callable[[int, int], None]) -> None:
    while True:
        progress(min(gauge.finished, total), total)
        await anyio.sleep(PROGRESS_INTERVAL)
