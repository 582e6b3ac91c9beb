"""Stored execution traces as a timeline: a row per execution, a bar per step, per tool
call and per subagent call, on one time axis, drawn as self-contained SVG.

``build_timeline(traces)`` lays the traces out (a ``Timeline``); ``render_timeline_svg``
draws one as an SVG document (no script, no external asset: a ``<title>`` in each bar
is its tooltip); ``render_timeline_html`` wraps it in a page of its own. The traces are
those ``collect_trace_tree`` reads from a store (or ``load_traces`` from an export).

**Time.** The axis is in seconds from the start of the earliest execution (the first
top-level one, unless a host's clock runs behind). A trace says when things began:
each execution's ``started`` (the wall clock, ``time.time()``, so executions on any
host share the axis), and each step's and tool call's ``started`` (seconds after its
execution's start), beside their durations (each step's ``model_seconds`` and
``tools_seconds``, each tool call's ``seconds`` and ``waited`` for an approval, each
execution's ``seconds``). Every bar is laid out from them:

- an execution's row starts at its own ``started``, a subagent's and an earlier
  attempt's too (so a subagent's row starts once its parent's step has delegated
  it); a step at its ``started``, its tool calls after ``model_seconds``;
- a tool call at its ``started`` (a call approved by a person: from when it began
  waiting for the decision, ``waited`` before); calls of one step that overlap in
  time go on lanes of their own, side by side, each on the first lane free when it
  began; calls that ran one after another (``tool_concurrency`` made them wait for a
  slot) share a lane. A call that never ran (refused, answered at once, reused from
  an earlier attempt) sits at the start of its step's tools, with its duration;
- a compaction's summarization starts its execution's row.

**Traces written before start times were kept** (``started`` is None) are laid out
from their durations alone, as follows (and so is any one trace, step or call of a
mixed set that lacks its ``started``):

- an execution's steps follow one another: a step is its model request, then its
  tool calls; a compaction's summarization comes before the first step;
- the tool calls of a step start together when the step's tools phase begins; when
  they could not all have run at once (their durations do not fit in the phase), they
  are laid on the fewest lanes, each call on the lane that frees first, in call order,
  so that they fit (``tool_concurrency`` made them wait for a slot). Calls that ran at
  once sit side by side, on lanes of their own, over the same span of time;
- a subagent's execution starts with the tool call that delegated it (paired with it
  as ``fractor trace`` pairs them) and is the row right under its parent's; one whose
  call is not in its parent's trace starts with its parent;
- the earlier attempts of a task (a restart) ran one after another before the last
  attempt: each is a row under the task's, marked ``attempt N`` with how it ended, and
  the task's own steps start after them.

A resumed execution is marked ``resumes [ID]``, one that read a digest of its earlier
attempts ``digest``, as ``fractor trace`` says them.

**Secrets.** Only what the traces hold is drawn, and the traces hold no secret: the
providers redact API keys and URL credentials out of every error before it reaches a
trace (``fractor.actors.providers.redact``), and images and documents are named by
``describe_part``, never by their bytes.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal
from xml.sax.saxutils import escape, quoteattr

import msgspec

from .._messages import ExecutionTrace, StepRecord, SummaryRecord, ToolOutcome
from .._observation._traces import _match_children, seconds_text, usage_text
from .._parts import describe_part

__all__ = [
    "Bar",
    "BarKind",
    "Row",
    "Timeline",
    "build_timeline",
    "render_timeline_html",
    "render_timeline_svg",
]

BarKind = Literal["summarization", "step", "model", "tool", "subagent"]

#: How much longer than its step's tools phase a lane may run (the phase's own timer
#: and each call's differ by scheduling): 5 %, and 2 ms.
_SLACK_RATIO = 1.05
_SLACK_SECONDS = 0.002
#: Characters of a request, result or error a tooltip shows.
_TOOLTIP = 600


class Bar(msgspec.Struct, frozen=True, kw_only=True):
    """One span of a row: ``start`` and ``end`` in seconds on the shared axis.

    ``lane`` 0 holds the row's steps (a ``step`` bar with its ``model`` request inside)
    and its summarization; tool and subagent calls take lanes 1 and up.
    ``title`` is the tooltip: the request, the usage and the error, if any.
    """

    kind: BarKind
    label: str
    start: float
    end: float
    lane: int
    title: str
    error: bool = False
    #: For a ``subagent`` bar: the execution id of the row it delegated to ("" if none).
    child: str = ""


class Row(msgspec.Struct, frozen=True, kw_only=True):
    """One execution (or an earlier attempt of one) and its bars."""

    execution_id: str
    #: The row it sits under: the delegating execution, or for an attempt, its task's.
    parent: str
    depth: int
    label: str
    #: How it ended and what marks it: attempt, resumed, digest.
    status: str
    failed: bool
    attempt: bool
    start: float
    end: float
    lanes: int
    bars: tuple[Bar, ...]
    title: str


class Timeline(msgspec.Struct, frozen=True, kw_only=True):
    """The rows in drawing order (each parent before its children) and the axis' end."""

    rows: tuple[Row, ...]
    end: float


def build_timeline(traces: Sequence[ExecutionTrace]) -> Timeline:
    """Lay ``traces`` out on one time axis (see the module's docstring)."""
    by_id = {trace.execution_id: trace for trace in traces}
    children: dict[str, list[ExecutionTrace]] = {}
    attempts: dict[str, list[ExecutionTrace]] = {}
    roots: list[ExecutionTrace] = []
    for trace in traces:
        if trace.attempt_of and trace.attempt_of in by_id:
            attempts.setdefault(trace.attempt_of, []).append(trace)
        elif trace.parent_id and trace.parent_id in by_id and trace.parent_id != trace.execution_id:
            children.setdefault(trace.parent_id, []).append(trace)
        else:
            roots.append(trace)
    starts = [trace.started for trace in traces if trace.started is not None]
    layout = _Layout(children, attempts, min(starts) if starts else None)
    origin = 0.0
    for root in roots:
        origin = max(origin, layout.execution(root, origin, "", 0, attempt=False))
    end = max((row.end for row in layout.rows), default=0.0)
    return Timeline(rows=tuple(layout.rows), end=end)


class _Layout:
    __slots__ = ("attempts", "base", "children", "drawn", "rows")

    def __init__(
        self,
        children: dict[str, list[ExecutionTrace]],
        attempts: dict[str, list[ExecutionTrace]],
        base: float | None,
    ) -> None:
        self.children = children
        self.attempts = attempts
        #: The wall-clock start of the earliest execution (the axis' 0), or None
        #: when no trace says when it started.
        self.base = base
        self.rows: list[Row] = []
        self.drawn: set[str] = set()

    def place(self, trace: ExecutionTrace) -> float | None:
        """Where ``trace`` starts on the axis, from its ``started``; None without it."""
        base = self.base
        if base is None or trace.started is None:
            return None
        return trace.started - base

    def execution(
        self, trace: ExecutionTrace, start: float, parent: str, depth: int, *, attempt: bool
    ) -> float:
        """Add the rows of ``trace`` (starting at its ``started``, or without one at
        ``start``, where its durations place it); where it ends."""
        self.drawn.add(trace.execution_id)
        index = len(self.rows)
        self.rows.append(_placeholder(trace))  # its own row comes before those under it
        placed = self.place(trace)
        cursor = start
        earlier = sorted(self.attempts.get(trace.execution_id, ()), key=lambda t: t.attempt)
        for before in earlier:
            cursor = self.execution(before, cursor, trace.execution_id, depth + 1, attempt=True)
        if placed is not None:
            # Timed: it starts at its own start, its earlier attempts at theirs.
            own_start = placed
            start = min([placed, *(self.rows[i].start for i in self._rows_of(earlier))])
            cursor = placed
        else:
            own_start = cursor
        bars: list[Bar] = []
        matches = _match_children(trace, list(self.children.get(trace.execution_id, ())))
        delegated: list[tuple[ExecutionTrace, float]] = []
        if trace.summarization is not None:
            record = trace.summarization
            bars.append(_summary_bar(record, cursor))
            cursor += record.seconds
        lanes = 1
        for step in trace.steps:
            if placed is not None and step.started is not None:
                cursor = placed + step.started
            step_bars, used = _step_bars(step, cursor, placed)
            for bar in step_bars:
                if bar.kind == "tool":
                    outcome = _outcome_of(step, bar)
                    child = matches.by_call.get(id(outcome)) if outcome is not None else None
                    if child is not None:
                        bar = msgspec.structs.replace(
                            bar, kind="subagent", child=child.execution_id
                        )
                        delegated.append((child, bar.start))
                bars.append(bar)
            lanes = max(lanes, used)
            cursor += step.model_seconds + step.tools_seconds
        delegated.extend((orphan, own_start) for orphan in matches.orphans)
        end = max([cursor, own_start + trace.seconds, *(bar.end for bar in bars)])
        for child, child_start in delegated:
            if child.execution_id not in self.drawn:
                end = max(
                    end,
                    self.execution(
                        child, child_start, trace.execution_id, depth + 1, attempt=False
                    ),
                )
        self.rows[index] = _row(trace, parent, depth, attempt, start, end, lanes, bars, earlier)
        return end

    def _rows_of(self, traces: Sequence[ExecutionTrace]) -> list[int]:
        """The indexes of the rows drawn for ``traces``."""
        ids = {trace.execution_id for trace in traces}
        return [i for i, row in enumerate(self.rows) if row.execution_id in ids]


def _placeholder(trace: ExecutionTrace) -> Row:
    return Row(
        execution_id=trace.execution_id,
        parent="",
        depth=0,
        label="",
        status="",
        failed=False,
        attempt=False,
        start=0.0,
        end=0.0,
        lanes=1,
        bars=(),
        title="",
    )


def _row(
    trace: ExecutionTrace,
    parent: str,
    depth: int,
    attempt: bool,
    start: float,
    end: float,
    lanes: int,
    bars: list[Bar],
    earlier: list[ExecutionTrace],
) -> Row:
    name = trace.agent_name or trace.agent_id
    status = f"{trace.status}: {trace.stop_reason}" if trace.stop_reason else trace.status
    marks = [
        f"attempt {trace.attempt}" if attempt or earlier else "",
        f"resumes [{trace.resumed}]" if trace.resumed else "",
        "digest" if trace.digest else "",
    ]
    status = " · ".join(part for part in (*marks, status) if part)
    title_lines = [
        f"{name} [{trace.execution_id}]",
        status,
        f"task: {_cut(trace.task)}" if not attempt else "",
        *(f"part: {describe_part(part)}" for part in trace.task_parts),
        f"{len(trace.steps)} step{'' if len(trace.steps) == 1 else 's'}"
        f" · {seconds_text(trace.seconds)}",
        f"usage: {usage_text(trace.usage)}",
        f"answer: {_cut(trace.final_text)}" if trace.final_text else "",
        "read a digest of the attempts before" if trace.digest else "",
    ]
    return Row(
        execution_id=trace.execution_id,
        parent=parent,
        depth=depth,
        label=f"attempt {trace.attempt}" if attempt else name,
        status=status,
        failed=trace.status != "completed",
        attempt=attempt,
        start=start,
        end=end,
        lanes=lanes,
        bars=tuple(bars),
        title="\n".join(line for line in title_lines if line),
    )


def _summary_bar(record: SummaryRecord, start: float) -> Bar:
    turns = f"{record.turns} turn{'' if record.turns == 1 else 's'}"
    lines = [
        f"summarized {turns}" if record.ok else f"summarization of {turns} failed, nothing folded",
        f"model: {record.model}" if record.model else "",
        f"request: {record.input_messages} messages · {seconds_text(record.seconds)}",
        f"usage: {usage_text(record.usage)}",
        f"summary: {_cut(record.summary)}" if record.summary else "",
        f"error: {_cut(record.error)}" if record.error else "",
    ]
    return Bar(
        kind="summarization",
        label="summarized" if record.ok else "summarization failed",
        start=start,
        end=start + record.seconds,
        lane=0,
        title="\n".join(line for line in lines if line),
        error=not record.ok,
    )


def _step_bars(step: StepRecord, start: float, origin: float | None) -> tuple[list[Bar], int]:
    """The bars of one step from ``start``, and the lanes its row needs (1 + tools'):
    its tool calls placed from their ``started`` after ``origin`` (its execution's
    start on the axis), or, when ``origin`` is None, inferred from their durations."""
    model_end = start + step.model_seconds
    end = model_end + step.tools_seconds
    number = step.index + 1
    lines = [
        f"step {number} · {'interrupted' if step.interrupted else step.finish_reason}",
        f"model: {step.model}" if step.model else "",
        f"request: {step.input_messages} messages · model {seconds_text(step.model_seconds)}"
        + (f" · tools {seconds_text(step.tools_seconds)}" if step.outcomes else ""),
        f"usage: {usage_text(step.usage)}",
        f"said: {_cut(step.response_text)}" if step.response_text else "",
        f"error: {_cut(step.error)}" if step.error else "",
    ]
    title = "\n".join(line for line in lines if line)
    bars = [
        Bar(
            kind="step",
            label=f"step {number}",
            start=start,
            end=end,
            lane=0,
            title=title,
            error=bool(step.error) or step.interrupted,
        ),
        Bar(
            kind="model",
            label=f"model {number}",
            start=start,
            end=model_end,
            lane=0,
            title=title,
            error=bool(step.error),
        ),
    ]
    outcomes = step.outcomes
    if origin is None:
        spans = [_span(outcome) for outcome in outcomes]
        placed = [
            (lane, model_end + offset, model_end + offset + span)
            for (lane, offset), span in zip(_lanes(spans, step.tools_seconds), spans, strict=True)
        ]
    else:
        placed = _timed_lanes([_timed(outcome, origin, model_end) for outcome in outcomes])
    for position, (outcome, (lane, begin, finish)) in enumerate(zip(outcomes, placed, strict=True)):
        bars.append(
            Bar(
                kind="tool",
                label=outcome.call.name,
                start=begin,
                end=finish,
                lane=1 + lane,
                title=_tool_title(outcome),
                error=outcome.is_error,
                child=f"#{position}",  # which outcome: replaced below by the child's id
            )
        )
    used = 1 + (max((lane for lane, _, _ in placed), default=-1) + 1)
    return bars, used


def _denied(outcome: ToolOutcome) -> bool:
    return outcome.approval.startswith("denied")


def _span(outcome: ToolOutcome) -> float:
    """How long a call's bar is: its wait for a person's decision, then its run (a
    denied call's ``seconds`` is its wait: it never ran)."""
    if _denied(outcome):
        return outcome.seconds
    return outcome.waited + outcome.seconds


def _timed(outcome: ToolOutcome, origin: float, fallback: float) -> tuple[float, float]:
    """Where a call's bar begins and ends on the axis, from its ``started`` after
    ``origin``; a call with none (it never ran, or was reused from an earlier
    attempt, whose clock was another's) from ``fallback``, its step's tools' start."""
    started = outcome.started
    if started is None or outcome.reused:
        return fallback, fallback + _span(outcome)
    begin = origin + started
    if _denied(outcome):  # started when its wait for the decision began
        return begin, begin + outcome.seconds
    return begin - outcome.waited, begin + outcome.seconds


def _timed_lanes(spans: Sequence[tuple[float, float]]) -> list[tuple[int, float, float]]:
    """Each call's lane with its span: the calls taken in the order they began, each
    on the first lane free by then (a lane frees as its call ends), so that calls
    that overlapped in time sit side by side and calls that ran one after another
    share a lane."""
    free: list[float] = []  # when each lane's last call ended
    placed: list[tuple[int, float, float]] = [(0, 0.0, 0.0)] * len(spans)
    for index in sorted(range(len(spans)), key=lambda i: (spans[i][0], i)):
        begin, end = spans[index]
        lane = next((n for n, ended in enumerate(free) if ended <= begin + 1e-9), len(free))
        if lane == len(free):
            free.append(end)
        else:
            free[lane] = end
        placed[index] = (lane, begin, max(begin, end))
    return placed


def _outcome_of(step: StepRecord, bar: Bar) -> ToolOutcome | None:
    if not bar.child.startswith("#"):
        return None
    return step.outcomes[int(bar.child[1:])]


def _lanes(spans: Sequence[float], phase: float) -> list[tuple[int, float]]:
    """Each call's lane and its start within the tools phase: the fewest lanes on
    which, each call taking the lane that frees first in call order, all fit in
    ``phase`` (all at once, on a lane each, when none fewer do)."""
    count = len(spans)
    limit = phase * _SLACK_RATIO + _SLACK_SECONDS
    for lanes in range(1, count + 1):
        free = [0.0] * lanes
        placed: list[tuple[int, float]] = []
        for span in spans:
            lane = min(range(lanes), key=free.__getitem__)
            placed.append((lane, free[lane]))
            free[lane] += span
        if max(free) <= limit or lanes == count:
            return placed
    return []


def _tool_title(outcome: ToolOutcome) -> str:
    call = outcome.call
    if outcome.reused:
        verdict = f"reused from an earlier attempt: {_cut(outcome.content)}"
    elif outcome.attempts == 0 and not outcome.content:
        verdict = "no result"
    elif outcome.is_error:
        verdict = f"error: {_cut(outcome.content)}"
    else:
        verdict = f"ok: {_cut(outcome.content)}"
    lines = [
        f"{call.name} [{call.id}]",
        f"request: {_cut(call.arguments)}",
        f"{seconds_text(outcome.seconds)}"
        + (f" · {outcome.attempts} attempts" if outcome.attempts > 1 else "")
        + (" · interrupted" if outcome.interrupted else ""),
        f"approval: {outcome.approval} after {seconds_text(outcome.waited)}"
        if outcome.approval
        else "",
        verdict,
        *(f"part: {describe_part(part)}" for part in outcome.parts),
    ]
    return "\n".join(line for line in lines if line)


def _cut(text: str, limit: int = _TOOLTIP) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- drawing ---------------------------------------------------------------------------

_WIDTH = 1200
_LABELS = 280
_LANE = 16
_GAP = 8
_TOP = 40
_COLOURS = {
    "summarization": "#b39ddb",
    "step": "#cfd8dc",
    "model": "#64b5f6",
    "tool": "#81c784",
    "subagent": "#ffb74d",
}
_ERROR = "#e57373"
_STYLE = (
    "text{font-family:sans-serif;font-size:11px;fill:#263238}"
    ".axis line{stroke:#b0bec5}.bar rect{stroke:#37474f;stroke-width:.5}"
    ".attempt>rect.band{fill:#fff3e0}.failed text.name{fill:#c62828}"
)


def render_timeline_svg(timeline: Timeline | Sequence[ExecutionTrace]) -> str:
    """``timeline`` (or the timeline of these traces) as a standalone SVG document."""
    if not isinstance(timeline, Timeline):
        timeline = build_timeline(timeline)
    span = timeline.end or 1.0
    plot = _WIDTH - _LABELS - 20
    scale = plot / span

    def x(seconds: float) -> float:
        return round(_LABELS + seconds * scale, 2)

    body: list[str] = []
    y = _TOP
    for row in timeline.rows:
        height = row.lanes * _LANE
        classes = "row" + (" attempt" if row.attempt else "") + (" failed" if row.failed else "")
        body.append(f'<g class="{classes}" data-execution={quoteattr(row.execution_id)}>')
        body.append(f"<title>{escape(row.title)}</title>")
        body.append(
            f'<rect class="band" x="0" y="{y - 2}" width="{_WIDTH}" height="{height + 4}" '
            f'fill="{"#fff3e0" if row.attempt else "#fafafa"}"/>'
        )
        body.append(
            f'<text class="name" x="{4 + 12 * row.depth}" y="{y + 12}">{escape(row.label)}</text>'
        )
        body.append(
            f'<text class="status" x="{4 + 12 * row.depth}" y="{y + _LANE + 12}" '
            f'font-size="9">{escape(_cut(row.status, 40))}</text>'
            if row.lanes > 1
            else ""
        )
        for bar in row.bars:
            top = y + bar.lane * _LANE + (3 if bar.kind == "model" else 1)
            tall = _LANE - (6 if bar.kind == "model" else 2)
            width = max(x(bar.end) - x(bar.start), 1.0)
            fill = _ERROR if bar.error and bar.kind != "step" else _COLOURS[bar.kind]
            stroke = ' stroke="#c62828" stroke-width="1.5"' if bar.error else ""
            body.append(
                f'<g class="bar {bar.kind}" data-lane="{bar.lane}" data-start="{bar.start:.6f}" '
                f'data-end="{bar.end:.6f}"><title>{escape(bar.title)}</title>'
                f'<rect x="{x(bar.start)}" y="{top}" width="{width:.2f}" height="{tall}" '
                f'fill="{fill}"{stroke}/>'
                + (
                    f'<text x="{x(bar.start) + 2}" y="{top + tall - 3}" font-size="9">'
                    f"{escape(_cut(bar.label, int(width // 6)))}</text>"
                    if width > 30 and bar.kind != "step"
                    else ""
                )
                + "</g>"
            )
        body.append("</g>")
        y += height + _GAP
    height = y + 10
    axis = [
        f'<g class="axis"><line x1="{_LABELS}" y1="{_TOP - 8}" x2="{_WIDTH - 20}" y2="{_TOP - 8}"/>'
    ]
    axis.extend(
        f'<line x1="{x(tick)}" y1="{_TOP - 12}" x2="{x(tick)}" y2="{height}" '
        'stroke-dasharray="2,4"/>'
        f'<text x="{x(tick)}" y="{_TOP - 16}" text-anchor="middle">{seconds_text(tick)}</text>'
        for tick in _ticks(span)
    )
    axis.append(f'<text x="4" y="{_TOP - 16}">execution</text></g>')
    return (
        '<?xml version="1.0" encoding="UTF-8"?>\n'
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{_WIDTH}" height="{height}" '
        f'viewBox="0 0 {_WIDTH} {height}" class="fractor-timeline">'
        f"<title>fractor timeline</title><style>{_STYLE}</style>"
        + "".join(axis)
        + "".join(body)
        + "</svg>\n"
    )


def render_timeline_html(timeline: Timeline | Sequence[ExecutionTrace], title: str = "") -> str:
    """A self-contained HTML page holding the timeline's SVG (no script, no asset)."""
    svg = render_timeline_svg(timeline).split("\n", 1)[1]  # without the XML declaration
    heading = escape(title or "fractor timeline")
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f"<title>{heading}</title></head><body><h1>{heading}</h1>"
        "<p>Hover a bar for its request, usage and error. Lane 0 of a row: its steps "
        "(the model request darker); below: its tool calls, side by side when they ran "
        "at once; orange: a subagent call, its execution the row under.</p>"
        f"{svg}</body></html>\n"
    )


def _ticks(span: float) -> list[float]:
    """About eight round ticks from 0 to ``span``."""
    raw = span / 8
    step = 10 ** _floor_log10(raw)
    for factor in (1, 2, 5, 10):
        if raw <= step * factor:
            step *= factor
            break
    count = int(span / step) + 1
    return [round(i * step, 9) for i in range(count)]


def _floor_log10(value: float) -> int:
    exponent = 0
    if value <= 0:
        return 0
    while value >= 10:
        value /= 10
        exponent += 1
    while value < 1:
        value *= 10
        exponent -= 1
    return exponent
