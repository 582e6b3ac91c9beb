"""How an execution of an agent with an ``output_type`` takes its answer
(``Answering``, a mixin of ``Execution``; the definition's side is ``OutputSpec`` in
``actors._output``).

- A step with no tool calls: its text is the answer (``_typed_reply``). A bad one
  (not JSON, the wrong shape) joins the execution buffer with a user message that
  says what was wrong, and the steps go on.
- A step whose calls include the final-answer tool (``output_mode="tool"``,
  ``_answer_calls``): the first call whose arguments match is the answer, and the
  step's other calls are not run (each answered so, in the trace). When none
  matches, each final-answer call is answered with what was wrong (a tool error the
  model reads) and the step's other calls run as usual. A final-answer call runs
  nothing: it is not charged as a tool call.

Each bad answer is one correction; past ``output_retries`` of them the execution
ends ``failed``, its stop reason naming the type and the last problem. A correction
is the next step: checked and charged like any other (a budget that runs out while
the model corrects its answer stops the execution as ``budget_exceeded``), recorded
(the step's ``error`` says what was wrong), and seen as a ``retry`` event. The
answer's JSON (msgspec's encoding of the value) is the final response: it is what
``Result.text`` holds, what the conversation keeps and what a parent reads of a
subagent; ``Result.output`` holds the value.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from ._messages import (
    AssistantMessage,
    Message,
    ModelResponse,
    Status,
    StepRecord,
    ToolCall,
    ToolOutcome,
    Usage,
    UserMessage,
)
from ._output import FINAL_ANSWER
from ._recording import NOT_RUN

if TYPE_CHECKING:
    from fractor.runtime import EventKind

    from ._output import OutputSpec

__all__ = ["Answering"]


class _Answering(Protocol):
    """What taking a typed answer uses of a running ``Execution``."""

    output: Any
    corrections: int
    concluded: bool
    final_text: str
    step_outcomes: list[ToolOutcome] | None

    @property
    def observed(self) -> bool: ...

    def emit(self, kind: EventKind, **detail: Any) -> None: ...

    def _record(
        self,
        input_messages: int,
        response: ModelResponse,
        usage: Usage,
        outcomes: Sequence[ToolOutcome],
        model_seconds: float,
        tools_seconds: float,
        error: str = "",
    ) -> StepRecord: ...

    def _stop(self, status: Status, reason: str) -> None: ...

    async def _run_tools(
        self, calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]
    ) -> None: ...

    def _answered(self, output: OutputSpec, value: Any) -> None: ...

    def _correct(
        self, output: OutputSpec, problem: str, messages: tuple[Message, ...]
    ) -> tuple[Message, ...] | None: ...


class Answering:
    """The typed answers of an ``Execution`` (see the module)."""

    __slots__ = ()
    #: The outcomes of the step in flight (a slot of ``Execution``).
    step_outcomes: list[ToolOutcome] | None

    def _typed_reply(
        self: _Answering,
        output: OutputSpec,
        response: ModelResponse,
        usage: Usage,
        input_messages: int,
        model_seconds: float,
    ) -> tuple[Message, ...] | None:
        """A step with no tool calls, recorded: None when the execution ends (the
        answer is taken, or the last correction was spent), else the messages that
        go back to the model (its reply and what was wrong with it)."""
        value, problem = output.parse_text(response.text)
        self._record(input_messages, response, usage, (), model_seconds, 0.0, problem)
        if not problem:
            self._answered(output, value)
            return None
        said = AssistantMessage(content=response.text)
        return self._correct(
            output, problem, (said, UserMessage(content=output.correction(problem)))
        )

    async def _answer_calls(
        self: _Answering, output: OutputSpec, calls: tuple[ToolCall, ...]
    ) -> list[ToolOutcome]:
        """The outcomes of a step whose calls include the final-answer tool (see the
        module); ``concluded`` says whether the execution ends with it."""
        outcomes = self.step_outcomes = [NOT_RUN] * len(calls)
        first = ""
        for index, call in enumerate(calls):
            if call.name != FINAL_ANSWER:
                continue
            value, problem = output.parse_arguments(call.arguments)
            if not problem:
                outcomes[index] = _outcome(call, "accepted as the final answer", False)
                _not_run(calls, outcomes, "the final answer was given in the same step")
                self._answered(output, value)
                return outcomes
            outcomes[index] = _outcome(call, output.tool_error(problem), True)
            first = first or problem
        if self._correct(output, first, ()) is None:
            _not_run(calls, outcomes, "the execution failed: its answer did not match")
            return outcomes
        others = [(index, call) for index, call in enumerate(calls) if outcomes[index] is NOT_RUN]
        if others:
            done = [NOT_RUN] * len(others)
            await self._run_tools(tuple(call for _, call in others), done)
            for (index, _), outcome in zip(others, done, strict=True):
                outcomes[index] = outcome
        return outcomes

    def _answered(self: _Answering, output: OutputSpec, value: Any) -> None:
        self.output = value
        self.final_text = output.encode(value)
        self.concluded = True
        self._stop("completed", "final answer")

    def _correct(
        self: _Answering, output: OutputSpec, problem: str, messages: tuple[Message, ...]
    ) -> tuple[Message, ...] | None:
        """``messages`` for the model to read, or None past the last correction (the
        execution fails, saying why)."""
        reason = output.failure(problem)
        if self.corrections >= output.retries:
            self.concluded = True
            self._stop("failed", reason)
            return None
        self.corrections += 1
        if self.observed:
            self.emit("retry", attempt=self.corrections, error=reason[:300], delay=0.0)
        return messages


def _outcome(call: ToolCall, content: str, is_error: bool) -> ToolOutcome:
    return ToolOutcome(call=call, content=content, is_error=is_error, seconds=0.0, attempts=0)


def _not_run(calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome], why: str) -> None:
    for index, outcome in enumerate(outcomes):
        if outcome is NOT_RUN:
            outcomes[index] = _outcome(calls[index], f"not run: {why}", True)
