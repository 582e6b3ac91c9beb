"""What the stored traces' pages show, as pure values read from a store.

``fractor ui --db FILE`` serves a SQLite store's executions (``_server.serve_stored``):
a list of the top-level ones (``list_executions``: agent, task, status, usage,
seconds, when), and for each a timeline (``charts.render_timeline_svg`` of the traces
``collect_trace_tree`` reads, as ``fractor trace`` reads them) beside the details of
every step (``execution_details``: its model request, usage, error and tool calls),
shown when the step's bar is clicked, and the text ``fractor trace`` prints
(``render_trace_tree``), where attempts, summarizations and resumed executions read
as they do there.

Nothing here holds a secret: traces are written redacted (the providers take API keys
and URL credentials out of every error before it reaches one), and the server passes
every JSON document through ``redact`` once more.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from fractor.runtime import Store, Usage

from .._messages import ExecutionTrace, StepRecord, SummaryRecord, ToolOutcome
from .._observation._traces import (
    TRACE_KIND,
    seconds_text,
    trace_from_record,
    usage_text,
)
from .._parts import describe_part

__all__ = [
    "CallDetail",
    "ExecutionDetail",
    "ExecutionSummary",
    "StepDetail",
    "SummaryDetail",
    "execution_details",
    "list_executions",
]

#: Characters of a task shown in the list.
TASK_SHOWN = 120


class ExecutionSummary(msgspec.Struct, frozen=True, kw_only=True):
    """One top-level execution of the list."""

    execution_id: str
    agent: str
    task: str
    status: str
    stop_reason: str
    usage: Usage
    usage_text: str
    seconds: float
    seconds_text: str
    #: When it was saved (Unix time).
    saved_at: float
    steps: int
    #: Its attempt (2 and up: earlier attempts failed before it).
    attempt: int
    #: The execution it resumed ("" if none).
    resumed: str


class CallDetail(msgspec.Struct, frozen=True, kw_only=True):
    """A tool call of a step: what was asked and what came back."""

    id: str
    name: str
    arguments: str
    content: str = ""
    is_error: bool = False
    seconds: float = 0.0
    #: 0: asked for, never run (the execution stopped first).
    attempts: int = 1
    interrupted: bool = False
    approval: str = ""
    waited: float = 0.0
    reused: bool = False
    parts: tuple[str, ...] = ()


class StepDetail(msgspec.Struct, frozen=True, kw_only=True):
    """A step: its model request (the model, how many messages it sent, what it
    answered), its usage, its error, its tool calls."""

    index: int
    model: str
    input_messages: int
    finish_reason: str
    interrupted: bool
    response_text: str
    usage: Usage
    usage_text: str
    model_seconds: float
    tools_seconds: float
    error: str
    calls: tuple[CallDetail, ...]


class SummaryDetail(msgspec.Struct, frozen=True, kw_only=True):
    """A compaction's summarization request, before the first step."""

    turns: int
    covered: int
    input_messages: int
    summary: str
    model: str
    usage: Usage
    usage_text: str
    seconds: float
    error: str


class ExecutionDetail(msgspec.Struct, frozen=True, kw_only=True):
    """One execution of a tree (or an earlier attempt of one) with its steps."""

    execution_id: str
    agent: str
    task: str
    status: str
    stop_reason: str
    parent_id: str
    attempt: int
    attempt_of: str
    resumed: str
    digest: bool
    usage: Usage
    usage_text: str
    seconds: float
    final_text: str
    summarization: SummaryDetail | None
    steps: tuple[StepDetail, ...]


async def list_executions(store: Store) -> tuple[ExecutionSummary, ...]:
    """The top-level executions ``store`` keeps (those no execution delegated, and
    not an earlier attempt of another), the latest saved first."""
    records = await store.records(parent_id="", kind=TRACE_KIND, limit=None)
    found: list[ExecutionSummary] = []
    for record in reversed(records):
        trace = trace_from_record(record)
        found.append(
            ExecutionSummary(
                execution_id=trace.execution_id,
                agent=trace.agent_name or trace.agent_id,
                task=_cut(trace.task, TASK_SHOWN),
                status=trace.status,
                stop_reason=trace.stop_reason,
                usage=trace.usage,
                usage_text=usage_text(trace.usage),
                seconds=trace.seconds,
                seconds_text=seconds_text(trace.seconds),
                saved_at=record.saved_at,
                steps=len(trace.steps),
                attempt=trace.attempt,
                resumed=trace.resumed,
            )
        )
    return tuple(found)


def execution_details(traces: Sequence[ExecutionTrace]) -> tuple[ExecutionDetail, ...]:
    """Each trace of a tree with its steps' details, in the order given."""
    return tuple(_execution(trace) for trace in traces)


def _execution(trace: ExecutionTrace) -> ExecutionDetail:
    return ExecutionDetail(
        execution_id=trace.execution_id,
        agent=trace.agent_name or trace.agent_id,
        task=trace.task,
        status=trace.status,
        stop_reason=trace.stop_reason,
        parent_id=trace.parent_id,
        attempt=trace.attempt,
        attempt_of=trace.attempt_of,
        resumed=trace.resumed,
        digest=trace.digest,
        usage=trace.usage,
        usage_text=usage_text(trace.usage),
        seconds=trace.seconds,
        final_text=trace.final_text,
        summarization=None if trace.summarization is None else _summary(trace.summarization),
        steps=tuple(_step(step) for step in trace.steps),
    )


def _summary(record: SummaryRecord) -> SummaryDetail:
    return SummaryDetail(
        turns=record.turns,
        covered=record.covered,
        input_messages=record.input_messages,
        summary=record.summary,
        model=record.model,
        usage=record.usage,
        usage_text=usage_text(record.usage),
        seconds=record.seconds,
        error=record.error,
    )


def _step(step: StepRecord) -> StepDetail:
    ran = {outcome.call.id for outcome in step.outcomes}
    calls = [_call(outcome) for outcome in step.outcomes]
    calls += [  # asked for, never run (the execution stopped first)
        CallDetail(id=call.id, name=call.name, arguments=call.arguments, attempts=0)
        for call in step.tool_calls
        if call.id not in ran
    ]
    return StepDetail(
        index=step.index,
        model=step.model,
        input_messages=step.input_messages,
        finish_reason=step.finish_reason,
        interrupted=step.interrupted,
        response_text=step.response_text,
        usage=step.usage,
        usage_text=usage_text(step.usage),
        model_seconds=step.model_seconds,
        tools_seconds=step.tools_seconds,
        error=step.error,
        calls=tuple(calls),
    )


def _call(outcome: ToolOutcome) -> CallDetail:
    return CallDetail(
        id=outcome.call.id,
        name=outcome.call.name,
        arguments=outcome.call.arguments,
        content=outcome.content,
        is_error=outcome.is_error,
        seconds=outcome.seconds,
        attempts=outcome.attempts,
        interrupted=outcome.interrupted,
        approval=outcome.approval,
        waited=outcome.waited,
        reused=outcome.reused,
        parts=tuple(describe_part(part) for part in outcome.parts),
    )


def _cut(text: str, limit: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"
