"""Attempts that learn: a digest of what earlier attempts of a task did, and their
completed tool calls answered again without running them.

An execution can begin with earlier attempts behind it: a restart after a failure
(``RestartPolicy(digest=True)``), or an ask that resumes the agent's last execution
after it stopped before its answer (``ref.ask(text, resume=True)`` after a limit, the
deadline or a failure). Built from their traces, never from raw messages:

- ``digest(traces)``: one ``DigestMessage``, first in the new attempt's execution
  buffer (so it leaves with the buffer, never joins the conversation): for each
  attempt, how it ended, each tool call with its arguments and result or error (cut
  short), the text the model said along the way.
- ``completed(traces)``: the calls that completed (no error, not interrupted), by
  name and arguments. When the new attempt asks for one of them again, its result
  is answered from there (``ToolOutcome.reused``), as often as it completed before:
  no second run, no second charge (``run_reusing``, which an execution's step calls).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING

import msgspec

from .._messages import DigestMessage, ExecutionTrace, ToolCall, ToolOutcome
from .._observation._events import ToolEnd, ToolStart
from .._parts import describe_part

if TYPE_CHECKING:
    from .._execution._recording import Emit
    from .._messages import StepRecord

__all__ = ["Reuse", "completed", "digest", "resumable", "reusable", "run_reusing"]

#: Characters of a tool result or a text a digest shows, and of the whole digest.
_RESULT = 400
_DIGEST = 12_000

#: Completed tool calls of earlier attempts, by (name, arguments as canonical JSON).
Reuse = dict[tuple[str, str], list[ToolOutcome]]

#: How an execution may end that a resumed ask picks up from.
RESUMABLE = frozenset({"budget_exceeded", "timed_out", "failed", "cancelled"})
#: How many executions back a chain of resumed asks is followed.
RESUMED_CHAIN = 8

_encode_sorted = msgspec.json.Encoder(order="sorted").encode


def resumable(traces: Sequence[ExecutionTrace]) -> tuple[ExecutionTrace, ...]:
    """The attempts of the last execution in ``traces`` (oldest first), if it
    stopped before its answer, and those of the executions it resumed in turn (at
    most ``RESUMED_CHAIN`` of them, those still in ``traces``); empty if it
    completed (nothing to resume)."""
    if not traces or traces[-1].status not in RESUMABLE:
        return ()
    by_id = {trace.execution_id: trace for trace in traces}
    found: list[ExecutionTrace] = []
    last: ExecutionTrace | None = traces[-1]
    for _ in range(RESUMED_CHAIN):
        if last is None:
            break
        task_id = last.execution_id
        earlier = [trace for trace in traces if trace.attempt_of == task_id]
        found[:0] = [*earlier, last]
        last = by_id.get(last.resumed) if last.resumed else None
    return tuple(found)


def digest(traces: Sequence[ExecutionTrace], task: str) -> DigestMessage:
    """The digest of ``traces``, earlier attempts at ``task`` (or, for a resumed
    ask, at the task they name), oldest first."""
    parts = [
        f"Earlier attempts stopped before an answer ({len(traces)} of them). What they "
        "did is below. A tool call that completed there is answered with the same "
        "result if you ask for it again with the same arguments: use what they found. "
        "A call that was not run or was interrupted can be made again; one that failed "
        "will likely fail the same way."
    ]
    for number, trace in enumerate(traces, 1):
        parts.append(_attempt(number, trace, trace.task != task))
    text = "\n\n".join(parts)
    if len(text) > _DIGEST:  # the latest attempts matter most: cut from the front
        text = parts[0] + "\n\n[... earlier part cut ...]\n" + text[-(_DIGEST - 200) :]
    return DigestMessage(content=text, attempts=len(traces))


def _attempt(number: int, trace: ExecutionTrace, other_task: bool) -> str:
    about = f" at the task {_cut(trace.task)!r}" if other_task else ""
    lines = [f"Attempt {number}{about} ended {trace.status}: {trace.stop_reason}."]
    for step in trace.steps:
        lines.extend(_step(step))
    if not any(step.tool_calls for step in trace.steps):
        lines.append("- no tool calls")
    return "\n".join(lines)


def _step(step: StepRecord) -> list[str]:
    lines: list[str] = []
    if step.response_text:
        lines.append(f"- said: {_cut(step.response_text)}")
    if step.error:
        lines.append(f"- step {step.index + 1} failed: {_cut(step.error)}")
    done = {outcome.call.id for outcome in step.outcomes}
    for outcome in step.outcomes:
        shown = _shown(outcome.call)
        if outcome.interrupted:
            lines.append(f"- {shown}: interrupted, no result")
        elif outcome.is_error and not outcome.attempts:  # refused, or bad arguments
            lines.append(f"- {shown}: not run: {_cut(outcome.content)}")
        elif outcome.is_error:
            lines.append(f"- {shown} failed: {_cut(outcome.content)}")
        else:
            lines.append(f"- {shown} returned: {_cut(outcome.content)}")
        # Its images and documents by name, never their bytes.
        lines.extend(f"  with {describe_part(part)}" for part in outcome.parts)
    lines.extend(f"- {_shown(call)}: not run" for call in step.tool_calls if call.id not in done)
    return lines


def _shown(call: ToolCall) -> str:
    return f"{call.name}({_cut(call.arguments, 200)})"


def _cut(text: str, limit: int = _RESULT) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _key(call: ToolCall) -> tuple[str, str]:
    """A call by name and arguments, the same however its JSON was written."""
    try:
        arguments = _encode_sorted(msgspec.json.decode(call.arguments)).decode()
    except msgspec.DecodeError:
        arguments = call.arguments
    return call.name, arguments


def completed(traces: Sequence[ExecutionTrace]) -> Reuse:
    """The tool calls of ``traces`` that ran and completed, by name and arguments
    (one answered from an earlier attempt did not run: the run it came from counts,
    once)."""
    reuse: Reuse = {}
    for trace in traces:
        for step in trace.steps:
            for outcome in step.outcomes:
                if not (outcome.is_error or outcome.interrupted or outcome.reused):
                    reuse.setdefault(_key(outcome.call), []).append(outcome)
    return reuse


def reusable(reuse: Reuse, calls: tuple[ToolCall, ...]) -> bool:
    """Whether an earlier attempt's result answers one of ``calls``."""
    if not reuse:
        return False
    return any(_key(call) in reuse for call in calls)


async def run_reusing(
    reuse: Reuse,
    calls: tuple[ToolCall, ...],
    outcomes: list[ToolOutcome],
    run_tools: Callable[[tuple[ToolCall, ...], list[ToolOutcome]], Awaitable[None]],
    emit: Emit | None,
) -> None:
    """The tool calls of a step when earlier attempts' results may answer some:
    answer the calls that completed before from ``reuse`` (each result used once),
    run the rest with ``run_tools``; each outcome at its call's index. ``emit``
    says the events of the calls answered so (None: nobody observes them)."""
    rest: list[int] = []
    for index, call in enumerate(calls):
        earlier = reuse.get(_key(call))
        if not earlier:
            rest.append(index)
            continue
        found = earlier.pop(0)
        outcomes[index] = msgspec.structs.replace(
            found, call=call, seconds=0.0, attempts=0, reused=True, approval="", waited=0.0
        )
        if emit is not None:
            arguments = call.arguments[:200]
            emit(ToolStart(tool=call.name, call_id=call.id, arguments=arguments))
            emit(
                ToolEnd(
                    tool=call.name,
                    call_id=call.id,
                    is_error=False,
                    seconds=0.0,
                    result=found.content[:200],
                    reused=True,
                    parts=tuple(map(describe_part, found.parts)),
                )
            )
    if rest:
        some = [outcomes[index] for index in rest]
        try:
            await run_tools(tuple(calls[index] for index in rest), some)
        finally:  # interrupted too: the calls that completed are the step's
            for index, outcome in zip(rest, some, strict=True):
                outcomes[index] = outcome
