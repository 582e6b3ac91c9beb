"""One execution: a task in, steps of model requests and parallel tool calls, one
``Result`` out (DESIGN.md section 1, "One execution").

The execution owns the agent's **execution buffer** while it runs: the assistant
messages that asked for tools and the tool results, in call order. The model sees
them (providers require every result to follow its call), nothing else keeps them:
when the execution ends, on any path (answer, limit, error, cancellation), the
buffer is emptied and only the final response joins the conversation. If there is
no final response, one is synthesized from the status, what was done and the last
useful text, so a caller always gets an answer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

import anyio

from ._messages import (
    AssistantMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    ModelResponse,
    Result,
    Status,
    StepRecord,
    ToolCall,
    ToolOutcome,
    ToolResultMessage,
    Usage,
)

if TYPE_CHECKING:
    from runtime import Budget

    from ._models import Model
    from ._tools import Toolbox

__all__ = ["Execution", "StopCondition", "synthesize"]

#: A user stop condition: called after each step that ran tools; True ends the execution.
StopCondition = Callable[[StepRecord], bool]

_EMPTY_USAGE = Usage()


def synthesize(status: Status, reason: str, steps: Sequence[StepRecord], last_text: str) -> str:
    """The final response of an execution that stopped without one."""
    calls = [outcome for step in steps for outcome in step.outcomes]
    failed = sum(outcome.is_error for outcome in calls)
    used = sorted({outcome.call.name for outcome in calls})
    parts = [f"[{status}] The task stopped before a final answer: {reason}."]
    done = f"Done so far: {len(steps)} step(s), {len(calls)} tool call(s)"
    if used:
        done += f" ({', '.join(used)})"
    if failed:
        done += f", {failed} of them failed"
    parts.append(done + ".")
    if last_text:
        parts.append(f"Last text from the model: {last_text}")
    return " ".join(parts)


class Execution:
    """The state and the loop of one execution of one agent.

    ``buffer`` is the agent's execution buffer (a list the agent owns and this
    execution fills); ``history`` compiles everything before it (system prompt,
    summary, buffer section, conversation) and is fixed for the whole execution.
    """

    __slots__ = (
        "agent_id",
        "budget",
        "buffer",
        "execution_id",
        "final_text",
        "history",
        "last_text",
        "model",
        "reason",
        "started",
        "status",
        "steps",
        "stop_when",
        "task",
        "tool_concurrency",
        "toolbox",
        "usage",
    )

    def __init__(
        self,
        *,
        agent_id: str,
        execution_id: str,
        task: str,
        history: tuple[Message, ...],
        buffer: list[Message],
        model: Model,
        toolbox: Toolbox,
        budget: Budget | None,
        tool_concurrency: int,
        stop_when: StopCondition | None,
    ) -> None:
        self.agent_id = agent_id
        self.execution_id = execution_id
        self.task = task
        self.history = history
        self.buffer = buffer
        self.model = model
        self.toolbox = toolbox
        self.budget = budget
        self.tool_concurrency = tool_concurrency
        self.stop_when = stop_when
        self.steps: list[StepRecord] = []
        self.usage = _EMPTY_USAGE
        self.status: Status = "cancelled"
        self.reason = "cancelled before it finished"
        self.final_text = ""
        self.last_text = ""
        self.started = time.perf_counter()

    async def run(self) -> None:
        """Run steps until a final answer or a stop; never raises an ``Exception``.

        Cancellation propagates; ``status`` then stays "cancelled".
        """
        budget = self.budget
        seconds = budget.seconds if budget is not None else None
        try:
            if seconds is None:
                await self._steps()
            else:
                with anyio.move_on_after(seconds) as scope:
                    await self._steps()
                if scope.cancelled_caught:
                    self._stop(
                        "timed_out", f"deadline of {seconds:g} s passed (agent {self.agent_id})"
                    )
        except Exception as exc:
            self._stop("failed", f"{type(exc).__name__}: {exc}")

    async def _steps(self) -> None:
        budget = self.budget
        step_limit = budget.steps if budget is not None else None
        specs = self.toolbox.specs
        while True:
            if step_limit is not None and len(self.steps) >= step_limit:
                self._stop(
                    "budget_exceeded", f"step limit of {step_limit} reached (agent {self.agent_id})"
                )
                return
            context = self.history + tuple(self.buffer)
            request = ModelRequest(messages=context, tools=specs)
            began = time.perf_counter()
            try:
                response = await self.model.request(request)
            except Exception as exc:
                self._record_failed_request(len(context), began, exc)
                self._stop("failed", f"model request failed: {type(exc).__name__}: {exc}")
                return
            model_seconds = time.perf_counter() - began
            self.usage += response.usage
            if response.text:
                self.last_text = response.text
            calls = response.tool_calls
            if not calls:
                self._record(len(context), response.text, (), (), response, model_seconds, 0.0)
                if response.text:
                    self.final_text = response.text
                    self._stop("completed", "final answer")
                else:
                    self._stop(
                        "completed", f"the model stopped ({response.finish_reason}) without text"
                    )
                return
            # Text that comes with tool calls is trace, never the answer.
            self.buffer.append(AssistantMessage(content=response.text, tool_calls=calls))
            began = time.perf_counter()
            outcomes = await self._run_tools(calls)
            tools_seconds = time.perf_counter() - began
            self.buffer.extend(
                ToolResultMessage(
                    call_id=outcome.call.id,
                    name=outcome.call.name,
                    content=outcome.content,
                    is_error=outcome.is_error,
                )
                for outcome in outcomes
            )
            self.usage += Usage(tool_calls=len(calls))
            record = self._record(
                len(context), response.text, calls, outcomes, response, model_seconds, tools_seconds
            )
            if self.stop_when is not None and self.stop_when(record):
                self._stop("completed", "the agent's stop condition was met")
                return

    async def _run_tools(self, calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        """Run every call of one step concurrently; outcomes keep the calls' order."""
        run = self.toolbox.run
        if len(calls) == 1:
            return [await run(calls[0])]
        outcomes: list[ToolOutcome] = [_NOT_RUN] * len(calls)
        limiter = (
            anyio.CapacityLimiter(self.tool_concurrency)
            if len(calls) > self.tool_concurrency
            else None
        )

        async def run_one(index: int, call: ToolCall) -> None:
            if limiter is None:
                outcomes[index] = await run(call)
            else:
                async with limiter:
                    outcomes[index] = await run(call)

        async with anyio.create_task_group() as tg:
            for index, call in enumerate(calls):
                tg.start_soon(run_one, index, call)
        return outcomes

    def _record(
        self,
        input_messages: int,
        text: str,
        calls: tuple[ToolCall, ...],
        outcomes: Sequence[ToolOutcome],
        response: ModelResponse,
        model_seconds: float,
        tools_seconds: float,
    ) -> StepRecord:
        record = StepRecord(
            index=len(self.steps),
            input_messages=input_messages,
            response_text=text,
            tool_calls=calls,
            outcomes=tuple(outcomes),
            usage=response.usage,
            model_seconds=model_seconds,
            tools_seconds=tools_seconds,
            finish_reason=response.finish_reason,
        )
        self.steps.append(record)
        return record

    def _record_failed_request(self, input_messages: int, began: float, exc: Exception) -> None:
        self.steps.append(
            StepRecord(
                index=len(self.steps),
                input_messages=input_messages,
                response_text="",
                tool_calls=(),
                outcomes=(),
                usage=_EMPTY_USAGE,
                model_seconds=time.perf_counter() - began,
                tools_seconds=0.0,
                finish_reason="error",
                error=f"{type(exc).__name__}: {exc}",
            )
        )

    def _stop(self, status: Status, reason: str) -> None:
        self.status = status
        self.reason = reason

    def answer(self) -> str:
        """The final response: the model's, or a synthesized one."""
        if self.final_text:
            return self.final_text
        return synthesize(self.status, self.reason, self.steps, self.last_text)

    def result(self, text: str) -> Result:
        return Result(
            text=text,
            status=self.status,
            stop_reason=self.reason,
            usage=self.usage,
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            steps=len(self.steps),
        )

    def trace(self, text: str) -> ExecutionTrace:
        return ExecutionTrace(
            execution_id=self.execution_id,
            agent_id=self.agent_id,
            task=self.task,
            steps=tuple(self.steps),
            status=self.status,
            stop_reason=self.reason,
            final_text=text,
            usage=self.usage,
            seconds=time.perf_counter() - self.started,
        )


_NOT_RUN = ToolOutcome(
    call=ToolCall(id="", name=""), content="not run", is_error=True, seconds=0.0, attempts=0
)
