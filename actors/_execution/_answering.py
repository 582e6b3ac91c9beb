"""How an execution of an agent with an ``output_type`` takes its answer
(``Answers``, a part the ``Execution`` holds; the definition's side is ``OutputSpec``
in ``actors._execution._output``).

- A step with no tool calls: its text is the answer (``Answers.reply``). A bad one
  (not JSON, the wrong shape) joins the execution buffer with a user message that
  says what was wrong, and the steps go on.
- A step whose calls include the final-answer tool (``output_mode="tool"``,
  ``Answers.answer_calls``): the first call whose arguments match is the answer, and the
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

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

from .._messages import (
    AssistantMessage,
    Message,
    ModelResponse,
    ToolCall,
    ToolOutcome,
    Usage,
    UserMessage,
)
from .._observation._events import Retry
from ._output import FINAL_ANSWER, answers
from ._recording import NOT_RUN

if TYPE_CHECKING:
    from ._output import OutputSpec
    from ._recording import Recorder

__all__ = ["Answers"]

#: How the step's other calls run (``ToolRunner.run_tools``): each outcome at its index.
RunTools = Callable[[tuple[ToolCall, ...], list[ToolOutcome]], Awaitable[None]]


class Answers:
    """The typed answer of one execution (see the module): what ``spec`` asks for,
    the answer once taken (``value``, and ``text``, its JSON) or why there is none
    (``failure``), and how many bad answers were sent back (``corrections``).

    ``concluded`` is set once the answer (or the last bad one) ends the execution:
    the execution then reads ``failure`` (its stop reason if not empty), ``value``
    and ``text``. Steps are recorded through ``recorder``, which says the events.
    """

    __slots__ = ("concluded", "corrections", "failure", "recorder", "spec", "text", "value")

    def __init__(self, spec: OutputSpec, recorder: Recorder) -> None:
        self.spec = spec
        self.recorder = recorder
        self.value: Any = None
        self.text = ""
        self.failure = ""
        self.corrections = 0
        self.concluded = False

    def in_calls(self, calls: tuple[ToolCall, ...]) -> bool:
        """Whether a step's calls include the final-answer tool's (``mode="tool"``)."""
        return self.spec.tool is not None and answers(calls)

    def reply(
        self,
        response: ModelResponse,
        usage: Usage,
        input_messages: int,
        model_seconds: float,
    ) -> tuple[Message, ...] | None:
        """A step with no tool calls, recorded: None when the execution ends (the
        answer is taken, or the last correction was spent), else the messages that
        go back to the model (its reply and what was wrong with it)."""
        spec = self.spec
        value, problem = spec.parse_text(response.text)
        self.recorder.record(input_messages, response, usage, (), model_seconds, 0.0, problem)
        if not problem:
            self._answered(value)
            return None
        said = AssistantMessage(content=response.text)
        return self._correct(problem, (said, UserMessage(content=spec.correction(problem))))

    async def answer_calls(
        self, calls: tuple[ToolCall, ...], run_tools: RunTools
    ) -> list[ToolOutcome]:
        """The outcomes of a step whose calls include the final-answer tool (see the
        module), the others run with ``run_tools`` if the step goes on;
        ``concluded`` says whether the execution ends with it."""
        spec = self.spec
        outcomes = self.recorder.step_outcomes = [NOT_RUN] * len(calls)
        first = ""
        for index, call in enumerate(calls):
            if call.name != FINAL_ANSWER:
                continue
            value, problem = spec.parse_arguments(call.arguments)
            if not problem:
                outcomes[index] = _outcome(call, "accepted as the final answer", False)
                _not_run(calls, outcomes, "the final answer was given in the same step")
                self._answered(value)
                return outcomes
            outcomes[index] = _outcome(call, spec.tool_error(problem), True)
            first = first or problem
        if self._correct(first, ()) is None:
            _not_run(calls, outcomes, "the execution failed: its answer did not match")
            return outcomes
        others = [(index, call) for index, call in enumerate(calls) if outcomes[index] is NOT_RUN]
        if others:
            done = [NOT_RUN] * len(others)
            await run_tools(tuple(call for _, call in others), done)
            for (index, _), outcome in zip(others, done, strict=True):
                outcomes[index] = outcome
        return outcomes

    def _answered(self, value: Any) -> None:
        self.value = value
        self.text = self.spec.encode(value)
        self.concluded = True

    def _correct(self, problem: str, messages: tuple[Message, ...]) -> tuple[Message, ...] | None:
        """``messages`` for the model to read, or None past the last correction (the
        execution fails, saying why: ``failure``)."""
        reason = self.spec.failure(problem)
        if self.corrections >= self.spec.retries:
            self.concluded = True
            self.failure = reason
            return None
        self.corrections += 1
        recorder = self.recorder
        if recorder.observed:
            recorder.emit(Retry(attempt=self.corrections, error=reason[:300], delay=0.0))
        return messages


def _outcome(call: ToolCall, content: str, is_error: bool) -> ToolOutcome:
    return ToolOutcome(call=call, content=content, is_error=is_error, seconds=0.0, attempts=0)


def _not_run(calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome], why: str) -> None:
    for index, outcome in enumerate(outcomes):
        if outcome is NOT_RUN:
            outcomes[index] = _outcome(calls[index], f"not run: {why}", True)
