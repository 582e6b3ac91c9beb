"""Execution traces outside the actor: export, load, collect from a store, render.

- ``export_traces(traces)`` gives JSON (msgspec, indented) in a small envelope that
  names the format and its version; ``load_traces(data)`` reads it back (or a bare
  JSON list of traces) and validates every field.
- In a ``fractor.Store``, each trace is one record of kind ``"trace"`` under its
  execution id, with its ``parent_id`` (the execution that delegated it) as the
  record's parent, or for an earlier attempt of a task, the task's execution
  (``attempt_of``): ``collect_trace_tree(store, execution_id)`` fetches one
  execution, its earlier attempts and all of their descendants.
- ``render_trace_tree(traces)`` draws them as plain text: each agent's execution,
  its steps, their tool calls (arguments cut short), durations, usage and stop
  reasons, with each subagent's execution nested under the tool call that
  delegated it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Literal

import msgspec

from fractor.runtime import Record, Store, StoreError, Usage

from .._blobs import detach_trace
from .._messages import ExecutionTrace, StepRecord, SummaryRecord, ToolCall, ToolOutcome
from .._parts import describe_part

__all__ = [
    "TRACE_KIND",
    "collect_trace_tree",
    "export_traces",
    "load_traces",
    "render_trace_tree",
    "seconds_text",
    "trace_from_record",
    "trace_record",
    "usage_text",
]

#: The ``kind`` of the store records that hold execution traces.
TRACE_KIND = "trace"
#: How many characters of tool arguments, results and texts a rendered line shows.
SHORT = 60


class TraceExport(msgspec.Struct, frozen=True, kw_only=True):
    """The JSON document ``export_traces`` writes."""

    format: Literal["fractor.traces"] = "fractor.traces"
    version: int = 1
    traces: tuple[ExecutionTrace, ...]


_encode = msgspec.json.Encoder().encode
_decode_export = msgspec.json.Decoder(TraceExport).decode
_decode_list = msgspec.json.Decoder(tuple[ExecutionTrace, ...]).decode
_decode_trace = msgspec.json.Decoder(ExecutionTrace).decode


def export_traces(traces: Iterable[ExecutionTrace]) -> bytes:
    """The traces as an indented JSON document that ``load_traces`` reads back."""
    return msgspec.json.format(_encode(TraceExport(traces=tuple(traces))), indent=2)


def load_traces(data: bytes | str) -> tuple[ExecutionTrace, ...]:
    """The traces of a JSON export (or of a bare JSON list of traces).

    Raises ``ValueError`` naming what is wrong when ``data`` is not such a document.
    """
    stripped = data.lstrip()
    try:
        if stripped[:1] in ("[", b"["):
            return _decode_list(data)
        export = _decode_export(data)
    except msgspec.DecodeError as exc:
        raise ValueError(f"not a fractor trace export: {exc}") from None
    if export.version > 1:
        raise ValueError(
            f"this trace export is version {export.version}, written by a newer fractor; "
            "this one reads version 1"
        )
    return export.traces


def trace_record(trace: ExecutionTrace, blobs: dict[str, bytes] | None = None) -> Record:
    """The store record of one trace: JSON, under its execution id and parent.
    With ``blobs`` (a store that keeps them), its images' and documents' bytes go
    there, and the record keeps each part without them (``actors._blobs``)."""
    if blobs is not None:
        trace = detach_trace(trace, blobs)
    return Record(
        id=trace.execution_id,
        kind=TRACE_KIND,
        parent_id=trace.attempt_of or trace.parent_id,
        actor_id=trace.agent_id,
        data=_encode(trace),
    )


def trace_from_record(record: Record) -> ExecutionTrace:
    """The trace a store record holds; ``StoreError`` if it holds something else."""
    if record.kind != TRACE_KIND:
        raise StoreError(
            "store", f"read record {record.id!r} as a trace", f"its kind is {record.kind!r}"
        )
    try:
        return _decode_trace(record.data)
    except msgspec.DecodeError as exc:
        raise StoreError("store", f"read record {record.id!r} as a trace", str(exc)) from None


async def collect_trace_tree(store: Store, execution_id: str) -> tuple[ExecutionTrace, ...]:
    """The stored trace of ``execution_id`` and those of all its descendants.

    Parents come before their children (breadth first, each level in save order);
    empty if ``execution_id`` is not stored.
    """
    record = await store.record(execution_id)
    if record is None:
        return ()
    found = [trace_from_record(record)]
    seen = {execution_id}
    level = [execution_id]
    while level:
        below: list[str] = []
        for parent_id in level:
            for child in await store.records(parent_id=parent_id, kind=TRACE_KIND, limit=None):
                if child.id not in seen:
                    seen.add(child.id)
                    found.append(trace_from_record(child))
                    below.append(child.id)
        level = below
    return tuple(found)


# -- rendering ------------------------------------------------------------------------


def render_trace_tree(traces: Sequence[ExecutionTrace]) -> str:
    """A plain-text tree of ``traces``: executions, steps, tool calls and subagents.

    A trace whose ``parent_id`` names another trace of ``traces`` is drawn under the
    tool call of that parent which delegated to it: the call to a subagent of its
    name whose ``task`` argument and result match it best, else the first such call
    still free. Traces without a parent among ``traces`` are drawn at the top level.
    An earlier attempt of a task is drawn inside the task's execution, before its
    steps, with what it delegated; a compaction's summarization comes first.
    """
    by_id = {trace.execution_id: trace for trace in traces}
    children: dict[str, list[ExecutionTrace]] = {}
    roots: list[ExecutionTrace] = []
    for trace in traces:
        if trace.attempt_of and trace.attempt_of in by_id:
            continue  # drawn inside its task's execution
        if trace.parent_id and trace.parent_id in by_id and trace.parent_id != trace.execution_id:
            children.setdefault(trace.parent_id, []).append(trace)
        else:
            roots.append(trace)
    attempts: dict[str, list[ExecutionTrace]] = {}
    for trace in traces:
        if trace.attempt_of and trace.attempt_of in by_id:
            attempts.setdefault(trace.attempt_of, []).append(trace)
    lines: list[str] = []
    drawn: set[str] = set()
    tree = _Tree(children, attempts, drawn, lines)
    for index, root in enumerate(roots):
        if index:
            lines.append("")
        _draw_execution(root, "", "", tree)
    return "\n".join(lines) + "\n" if lines else "(no traces)\n"


class _Tree:
    """What a rendering draws from: children and earlier attempts of each execution."""

    __slots__ = ("attempts", "children", "drawn", "lines")

    def __init__(
        self,
        children: dict[str, list[ExecutionTrace]],
        attempts: dict[str, list[ExecutionTrace]],
        drawn: set[str],
        lines: list[str],
    ) -> None:
        self.children = children
        self.attempts = attempts
        self.drawn = drawn
        self.lines = lines


def _draw_execution(
    trace: ExecutionTrace, first: str, rest: str, tree: _Tree, *, attempt: bool = False
) -> None:
    tree.drawn.add(trace.execution_id)
    lines = tree.lines
    name = trace.agent_name or trace.agent_id
    status = f"{trace.status}: {trace.stop_reason}" if trace.stop_reason else trace.status
    earlier = sorted(tree.attempts.get(trace.execution_id, ()), key=lambda t: t.attempt)
    header = [
        f"attempt {trace.attempt} [{trace.execution_id}] {status}"
        if attempt
        else f"{name} [{trace.execution_id}] {status}",
        f"attempt {trace.attempt}" if earlier else "",
        f"resumes [{trace.resumed}]" if trace.resumed else "",
        "read a digest of the attempts before" if trace.digest else "",
        f"{len(trace.steps)} step{'' if len(trace.steps) == 1 else 's'}",
        seconds_text(trace.seconds),
        usage_text(trace.usage),
    ]
    lines.append(first + " · ".join(part for part in header if part))
    if not attempt:
        lines.append(f"{rest}│ task: {_quote(trace.task)}")
        lines.extend(f"{rest}│ part: {describe_part(part)}" for part in trace.task_parts)
    matches = _match_children(trace, list(tree.children.get(trace.execution_id, ())))
    summary = trace.summarization
    items = (summary is not None) + len(earlier)
    count = items + len(trace.steps) + len(matches.orphans) + (not attempt)
    index = 0
    if summary is not None:
        branch, _ = _branches(index == count - 1)
        lines.append(rest + branch + _summarized(summary))
        index += 1
    for before in earlier:
        branch, below = _branches(index == count - 1)
        _draw_execution(before, rest + branch, rest + below, tree, attempt=True)
        index += 1
    for step in trace.steps:
        branch, below = _branches(index == count - 1)
        _draw_step(step, rest + branch, rest + below, matches, tree)
        index += 1
    for orphan in matches.orphans:
        branch, below = _branches(index == count - 1)
        lines.append(f"{rest}{branch}delegated (the call is not in this trace)")
        _draw_execution(orphan, rest + below + "└── ", rest + below + "    ", tree)
        index += 1
    if not attempt:
        lines.append(f"{rest}└── answer: {_quote(trace.final_text)}")
        lines.extend(f"{rest}    part: {describe_part(part)}" for part in trace.parts)


def _summarized(record: SummaryRecord) -> str:
    """The line of a compaction's summarization request."""
    usage = record.usage
    parts = [
        f"summarized {record.turns} turn{'' if record.turns == 1 else 's'}"
        + (f" (the summary covers {record.covered})" if record.ok else ""),
        record.model,
        seconds_text(record.seconds),
        f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens",
    ]
    if not record.ok:
        parts[0] = f"summarization of {record.turns} turn{'' if record.turns == 1 else 's'} "
        parts[0] += f"failed, nothing folded: {_cut(record.error)}"
    elif record.summary:
        parts.append(f"summary: {_quote(record.summary)}")
    return " · ".join(part for part in parts if part)


def _branches(last: bool) -> tuple[str, str]:
    return ("└── ", "    ") if last else ("├── ", "│   ")


def _draw_step(step: StepRecord, first: str, rest: str, pending: _Matches, tree: _Tree) -> None:
    lines = tree.lines
    usage = step.usage
    parts = [
        f"step {step.index + 1}",
        "interrupted" if step.interrupted else step.finish_reason,
        f"model {seconds_text(step.model_seconds)}",
        f"tools {seconds_text(step.tools_seconds)}" if step.outcomes else "",
        f"{usage.input_tokens:,} in / {usage.output_tokens:,} out tokens",
    ]
    lines.append(first + " · ".join(part for part in parts if part))
    items: list[str | tuple[ToolOutcome, ExecutionTrace | None]] = []
    if step.error:
        items.append(f"error: {_cut(step.error)}")
    if step.response_text and step.tool_calls:
        items.append(f"said: {_quote(step.response_text)}")
    outcomes = step.outcomes or tuple(_unfinished(call) for call in step.tool_calls)
    items += [(outcome, pending.by_call.get(id(outcome))) for outcome in outcomes]
    for index, item in enumerate(items):
        branch, below = _branches(index == len(items) - 1)
        if isinstance(item, str):
            lines.append(rest + branch + item)
            continue
        outcome, child = item
        lines.append(rest + branch + _outcome(outcome))
        if child is not None and child.execution_id not in tree.drawn:
            _draw_execution(child, rest + below + "└── ", rest + below + "    ", tree)


class _Matches:
    __slots__ = ("by_call", "orphans")

    def __init__(self) -> None:
        self.by_call: dict[int, ExecutionTrace] = {}
        self.orphans: list[ExecutionTrace] = []


def _match_children(trace: ExecutionTrace, candidates: list[ExecutionTrace]) -> _Matches:
    """Pair each child execution with the tool call of ``trace`` that delegated it.

    Best first: same subagent name, same task and same result text; then name and
    task; then name and result; then name alone, in call order and execution order.
    """
    matches = _Matches()
    if not candidates:
        return matches
    candidates.sort(key=_execution_order)
    calls = [
        outcome
        for step in trace.steps
        for outcome in step.outcomes
        if any(child.agent_name == outcome.call.name for child in candidates)
    ]
    free = list(candidates)
    for strength in (3, 2, 1, 0):
        for outcome in calls:
            if id(outcome) in matches.by_call:
                continue
            task = _task_argument(outcome.call)
            for child in free:
                if child.agent_name != outcome.call.name:
                    continue
                same_task = task is not None and child.task == task
                same_text = child.final_text == outcome.content
                score = {(True, True): 3, (True, False): 2, (False, True): 1}.get(
                    (same_task, same_text), 0
                )
                if score >= strength:
                    matches.by_call[id(outcome)] = child
                    free.remove(child)
                    break
    matches.orphans = free
    return matches


_NUMBER = re.compile(r"(\d+)$")


def _execution_order(trace: ExecutionTrace) -> tuple[int, str]:
    found = _NUMBER.search(trace.execution_id)
    return (int(found.group(1)) if found else 0, trace.execution_id)


def _task_argument(call: ToolCall) -> str | None:
    try:
        arguments = msgspec.json.decode(call.arguments)
    except msgspec.DecodeError:
        return None
    task = arguments.get("task") if isinstance(arguments, dict) else None
    return task if isinstance(task, str) else None


def _unfinished(call: ToolCall) -> ToolOutcome:
    return ToolOutcome(call=call, content="", is_error=True, seconds=0.0, attempts=0)


def _outcome(outcome: ToolOutcome) -> str:
    parts = [_call(outcome.call)]
    if outcome.reused:
        parts.append(f"reused from an earlier attempt: {_quote(outcome.content)}")
    elif outcome.attempts == 0 and not outcome.content:
        parts.append("no result")
    else:
        parts.append(seconds_text(outcome.seconds))
        if outcome.attempts > 1:
            parts.append(f"{outcome.attempts} attempts")
        verdict = "error" if outcome.is_error else "ok"
        parts.append(f"{verdict}: {_quote(outcome.content)}")
    parts.extend(describe_part(part) for part in outcome.parts)
    return " · ".join(parts)


def _call(call: ToolCall) -> str:
    """``name(key=value, ...)`` with the arguments cut short."""
    try:
        arguments = msgspec.json.decode(call.arguments)
    except msgspec.DecodeError:
        shown = call.arguments
    else:
        if isinstance(arguments, dict):
            shown = ", ".join(
                f"{key}={_encode(value).decode()}" for key, value in arguments.items()
            )
        else:
            shown = call.arguments
    return f"{call.name}({_cut(shown)})"


def usage_text(usage: Usage) -> str:
    """A usage in one line of words (tokens, requests, tool calls, cost)."""
    parts = [
        f"{usage.total_tokens:,} tokens ({usage.input_tokens:,} in / {usage.output_tokens:,} out)",
        f"{usage.requests} request{'' if usage.requests == 1 else 's'}",
        f"{usage.tool_calls} tool call{'' if usage.tool_calls == 1 else 's'}",
    ]
    if usage.cost:
        parts.append(f"cost {usage.cost:.4g}")
    return " · ".join(parts)


def seconds_text(seconds: float) -> str:
    """A duration in words: milliseconds under a second, else seconds."""
    if seconds < 1:
        return f"{seconds * 1000:.1f} ms"
    return f"{seconds:.2f} s"


def _cut(text: str, limit: int = SHORT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _quote(text: str) -> str:
    return _encode(_cut(text)).decode()
