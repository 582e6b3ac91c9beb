"""What an execution keeps of itself as it runs (``Recorder``, a part the
``Execution`` holds): its step records, the step in flight (for the trace of an
execution cut short, and for a snapshot of it as it runs), what that step's model
requests were charged and streamed, and its events; and the answer synthesized when
an execution stopped without one (``synthesize``).

The recorder builds frozen values (``StepRecord``) from what it is given and what it
keeps; the execution builds its trace, its ``Result`` and its ``Progress`` from it.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from fractor.runtime import EventDetail, Node, Supervisor, Usage

from .._messages import (
    ModelResponse,
    Status,
    StepRecord,
    ToolCall,
    ToolOutcome,
    exception_text,
)
from .._observation._events import ModelText, StepEnd, agent_event
from .._observation._subtree import subtree

if TYPE_CHECKING:
    from fractor.runtime import EventBus

__all__ = ["EMPTY_USAGE", "NOT_RUN", "Emit", "Recorder", "bind_log_context", "synthesize"]

#: What a step's requests were charged before its first one (compared by identity).
EMPTY_USAGE = Usage()


class Emit(Protocol):
    """How a part says an event of its execution: ``emit(ToolStart(...))``, the
    detail of its kind made where it happens (``Recorder.emit``)."""

    def __call__(self, detail: EventDetail, /) -> None: ...


def synthesize(
    status: Status,
    reason: str,
    steps: Sequence[StepRecord],
    last_text: str,
    subagents: Collection[str] = (),
) -> str:
    """The final response of an execution that ended without one from the model: how
    it ended, what it did (its tool calls and subagent calls apart, as ``subagents``
    names them) and the last useful text."""
    if status == "completed":  # a stop condition, or a model that stopped silently
        head = f"[completed] The task ended without a final answer: {reason}."
    else:
        head = f"[{status}] The task stopped before a final answer: {reason}."
    ran = [step for step in steps if step.usage.requests]  # not refused by the budget
    outcomes = [outcome for step in ran for outcome in step.outcomes]
    done = f"Done so far: {len(ran)} step(s)"
    if ran and ran[-1].interrupted:  # only the last step can be
        done += " (the last one interrupted)"
    done += ", " + _counted([o for o in outcomes if o.call.name not in subagents], "tool call(s)")
    delegated = [o for o in outcomes if o.call.name in subagents]
    if delegated:
        done += ", " + _counted(delegated, "subagent call(s)")
    interrupted = len([outcome for outcome in outcomes if outcome.interrupted])
    failed = len([outcome for outcome in outcomes if outcome.is_error]) - interrupted
    if failed:
        done += f", {failed} of them failed"
    if interrupted:
        done += f", {interrupted} interrupted"
    tail = f" Last text from the model: {last_text}" if last_text else ""
    return f"{head} {done}.{tail}"


def _counted(outcomes: Sequence[ToolOutcome], what: str) -> str:
    """``3 tool call(s) (add, lookup)``: how many, and the names used."""
    names = sorted({outcome.call.name for outcome in outcomes})
    return f"{len(outcomes)} {what}" + (f" ({', '.join(names)})" if names else "")


#: the first bind (``Token.var``): later binds set them directly.
_LOG_VARS: list[contextvars.ContextVar[Any]] = []


def bind_log_context(
    agent_id: str, parent_id: str | None, depth: int, execution_id: str
) -> tuple[contextvars.Token[Any], ...]:
    """Bind ``agent_id``, ``parent_id``, ``depth`` and ``execution_id`` for structlog,
    as ``structlog.contextvars.bind_contextvars`` does, minus its per-key lookups
    (bind + reset, not ``bound_contextvars()``, which first snapshots every context
    variable: a cost paid per execution, per subagent call)."""
    if _LOG_VARS:
        agent_var, parent_var, depth_var, execution_var = _LOG_VARS
        return (
            agent_var.set(agent_id),
            parent_var.set(parent_id),
            depth_var.set(depth),
            execution_var.set(execution_id),
        )
    bound = structlog.contextvars.bind_contextvars(
        agent_id=agent_id, parent_id=parent_id, depth=depth, execution_id=execution_id
    )
    _LOG_VARS.extend(token.var for token in bound.values())
    return tuple(bound.values())


class Recorder:
    """The records of one execution as it runs: its steps, the step in flight, what
    that step's model requests were charged and what its model streamed, and its
    events (see the module).

    A part the ``Execution`` holds (and hands to its other parts: the tool runner,
    the typed answer, the summarization, each model request's ``send``). It knows
    its execution's place (``node``, under ``supervisor``) and name, never the
    execution itself: how the execution ended (``reason``, ``ended``) is passed to
    what reads it.
    """

    __slots__ = (
        "agent_id",
        "agent_name",
        "bus",
        "charged",
        "first_text",
        "node",
        "origin",
        "sink",
        "step_asked",
        "step_began",
        "step_input",
        "step_outcomes",
        "steps",
        "streamed",
        "supervisor",
        "watch",
    )

    def __init__(
        self,
        agent_name: str,
        agent_id: str,
        node: Node,
        supervisor: Supervisor,
        bus: EventBus,
        origin: float,
    ) -> None:
        #: The agent's name and the actor's id, as every event says them.
        self.agent_name = agent_name
        self.agent_id = agent_id
        #: When the execution began (``perf_counter`` seconds): its steps' and tool
        #: calls' ``started`` are seconds after it.
        self.origin = origin
        self.node = node
        self.supervisor = supervisor
        self.bus = bus  # read at every event site
        #: The watcher of the streamed ask above, if there is one.
        self.watch = subtree(node).watch
        self.steps: list[StepRecord] = []
        #: The step in flight, kept so that an interrupted execution's trace shows it
        #: (see ``all_steps``): when its request began (0.0 once the step is
        #: recorded), its input, then the model's answer, its usage, the model's
        #: seconds and when the tools began, and the tool outcomes so far (None: the
        #: step's one tool call, run with no list of outcomes).
        self.step_began = 0.0
        self.step_input = 0
        self.step_asked: tuple[ModelResponse, Usage, float, float] | None = None
        self.step_outcomes: list[ToolOutcome] | None = None
        #: What the current step's model requests were charged, all attempts included
        #: (``send`` adds each up; compared by identity with ``EMPTY_USAGE``).
        self.charged = EMPTY_USAGE
        #: The text the model has streamed so far in the current request, in pieces.
        self.streamed: list[str] = []
        #: When its first piece arrived (on the rate lanes' clock): the server had the
        #: request by then, so its rate limits count it from there.
        self.first_text = 0.0
        #: Where a streaming model hands its text (``streamed_text``; None: the model
        #: does not stream, or its text is not the agent's, as a summary's is not).
        self.sink: Callable[[str], None] | None = None

    @property
    def observed(self) -> bool:
        """Whether anyone sees the execution's events: the runtime's subscribers (or
        its log), or the watcher of a streamed ask above it."""
        return self.bus.active or self.watch is not None

    def emit(self, detail: EventDetail, /) -> None:
        """One event of the execution: to the runtime's subscribers when it has any,
        and to the watcher of the streamed ask above it, if there is one."""
        node = self.node
        parent = node.parent
        bus = self.bus
        event = agent_event(
            detail,
            at=bus.now(),
            agent=self.agent_name,
            agent_id=self.agent_id,
            execution_id=node.id,
            parent_id=parent.id if parent is not None else "",
            depth=node.depth,
        )
        if bus.active:
            bus.deliver(event)
        watch = self.watch
        if watch is not None:
            watch(event)

    def streamed_text(self, text: str) -> None:
        """The sink of a streaming model: keep the piece (for a snapshot, and for the
        trace if the request is cut) and show it to whoever watches."""
        if not self.streamed:
            self.first_text = self.supervisor.rates.now()
        self.streamed.append(text)
        if self.bus.active or self.watch is not None:
            self.emit(ModelText(text=text, step=len(self.steps)))

    def begin(self, input_messages: int) -> None:
        """A step's model request is about to be sent, with ``input_messages``."""
        self.step_began = time.perf_counter()
        self.step_input = input_messages
        self.step_asked = None
        self.charged = EMPTY_USAGE

    def record(
        self,
        input_messages: int,
        response: ModelResponse,
        usage: Usage,
        outcomes: Sequence[ToolOutcome],
        model_seconds: float,
        tools_seconds: float,
        error: str = "",
    ) -> StepRecord:
        """Record the step in flight, which ended, and say so."""
        record = StepRecord(
            index=len(self.steps),
            input_messages=input_messages,
            response_text=response.text,
            tool_calls=response.tool_calls,
            outcomes=tuple(outcomes),
            usage=usage,
            model_seconds=model_seconds,
            tools_seconds=tools_seconds,
            finish_reason=response.finish_reason,
            error=error,
            model=response.model,
            started=self.step_began - self.origin,
        )
        self.steps.append(record)
        self.step_began = 0.0
        if self.bus.active or self.watch is not None:
            self.emit(
                StepEnd(
                    step=record.index,
                    tool_calls=tuple(call.name for call in record.tool_calls),
                    tokens=usage.input_tokens + usage.output_tokens,
                    seconds=model_seconds + tools_seconds,
                )
            )
        return record

    def record_failed_request(self, exc: BaseException) -> None:
        """Record the step in flight, whose model request failed with ``exc``."""
        self.steps.append(
            StepRecord(
                index=len(self.steps),
                input_messages=self.step_input,
                response_text="".join(self.streamed),  # what came before it failed
                tool_calls=(),
                outcomes=(),
                usage=self.charged,
                model_seconds=time.perf_counter() - self.step_began,
                tools_seconds=0.0,
                finish_reason="error",
                error=exception_text(exc),
                started=self.step_began - self.origin,
            )
        )
        self.step_began = 0.0

    def all_steps(self, reason: str, ended: float) -> list[StepRecord]:
        """The steps recorded, then the step that was in flight when the execution
        stopped (``ended``, for ``reason``), if one was, marked as interrupted."""
        if not self.step_began:
            return self.steps
        return [*self.steps, self._interrupted_step(reason, ended)]

    def _interrupted_step(self, reason: str, ended: float) -> StepRecord:
        ended = ended or time.perf_counter()
        asked = self.step_asked
        if asked is None:  # the model had not answered (or the budget was awaited)
            return StepRecord(
                index=len(self.steps),
                input_messages=self.step_input,
                response_text="".join(self.streamed),  # what it streamed before the cut
                tool_calls=(),
                outcomes=(),
                usage=self.charged,
                model_seconds=ended - self.step_began,
                tools_seconds=0.0,
                finish_reason="error",
                error=f"interrupted before the model answered: {reason}",
                interrupted=True,
                started=self.step_began - self.origin,
            )
        response, usage, model_seconds, tools_began = asked
        seconds = ended - tools_began
        began = tools_began - self.origin
        done = self.step_outcomes
        calls = response.tool_calls
        outcomes: tuple[ToolOutcome, ...]
        if done is None:  # the step's one tool call
            outcomes = (interrupted_call(calls[0], seconds, began),)
        else:
            outcomes = tuple(
                [
                    interrupted_call(call, seconds, began) if outcome is NOT_RUN else outcome
                    for call, outcome in zip(calls, done, strict=True)
                ]
            )
        return StepRecord(
            index=len(self.steps),
            input_messages=self.step_input,
            response_text=response.text,
            tool_calls=response.tool_calls,
            outcomes=outcomes,
            usage=usage,
            model_seconds=model_seconds,
            tools_seconds=seconds,
            finish_reason=response.finish_reason,
            error=f"interrupted while its tool calls ran: {reason}",
            interrupted=True,
            started=self.step_began - self.origin,
        )

    def in_flight(self) -> tuple[ToolCall, ...] | None:
        """The tool calls of the step in flight not answered yet, or None when no
        step's tools are running (its model request is out, or no step is)."""
        asked = self.step_asked
        if not self.step_began or asked is None:
            return None
        calls = asked[0].tool_calls
        done = self.step_outcomes
        if done is None:  # the step's one tool call
            return calls
        return tuple(
            [call for call, outcome in zip(calls, done, strict=True) if outcome is NOT_RUN]
        )


def interrupted_call(call: ToolCall, seconds: float, started: float | None) -> ToolOutcome:
    """A call still running when its execution stopped, ``seconds`` after its step's
    tools began (``started``: when, after the execution's start)."""
    return ToolOutcome(
        call=call,
        content="[interrupted] still running when the execution stopped",
        is_error=True,
        seconds=seconds,
        interrupted=True,
        started=started,
    )


#: The outcome slot of a call not run yet (compared by identity).
NOT_RUN = ToolOutcome(
    call=ToolCall(id="", name=""), content="not run", is_error=True, seconds=0.0, attempts=0
)
