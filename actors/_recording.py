"""What an execution keeps of itself: its step records, its events, its trace, its
answer, a snapshot of it as it runs (``Recording``, a mixin of ``Execution``), and
the answer synthesized when it stopped without one (``synthesize``).

The methods here only read the execution's state and build frozen values from it
(``StepRecord``, ``ExecutionTrace``, ``Result``, ``Progress``), except ``_record``,
which appends the step it records, and ``emit``, which hands an event to whoever
observes the execution. They are typed by ``_Running``, the part of an
``Execution`` they use.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Collection, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec
import structlog

from fractor.runtime import ActorContext, EventKind, Node, NodeSnapshot, Supervisor, Usage

from ._events import agent_event
from ._messages import (
    ExecutionTrace,
    ModelResponse,
    Progress,
    Result,
    Status,
    StepRecord,
    SummaryRecord,
    ToolCall,
    ToolOutcome,
    exception_text,
)

if TYPE_CHECKING:
    from ._agent import Agent
    from ._memory import Fold

__all__ = ["NOT_RUN", "Recording", "bind_log_context", "synthesize"]


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


class _Running(Protocol):
    """What the records read of a running ``Execution``."""

    agent: Agent
    agent_id: str
    execution_id: str
    attempt: int
    task: str
    node: Node
    supervisor: Supervisor
    context: ActorContext
    steps: list[StepRecord]
    status: Status
    reason: str
    final_text: str
    last_text: str
    #: The typed answer (``Agent(output_type=...)``), once the model gave a valid one.
    output: Any
    started: float
    ended: float
    step_began: float
    step_input: int
    step_asked: tuple[ModelResponse, Usage, float, float] | None
    step_outcomes: list[ToolOutcome] | None
    streamed: list[str]
    charged: Usage
    built: ExecutionTrace | None
    parent_attempt: int
    summarization: SummaryRecord | None
    fold: Fold | None
    digested: bool
    resumed: str

    @property
    def usage(self) -> Usage: ...

    @property
    def observed(self) -> bool: ...

    def emit(self, kind: EventKind, **detail: Any) -> None: ...

    def all_steps(self) -> list[StepRecord]: ...

    def answer(self, steps: Sequence[StepRecord] | None = None) -> str: ...

    def _parent_link(self) -> str: ...

    def _interrupted_step(self) -> StepRecord: ...

    def _nodes(self) -> tuple[NodeSnapshot, ...]: ...


class Recording:
    """The records of an ``Execution`` (see the module)."""

    __slots__ = ()
    #: The trace, once built (see ``final_trace``): a slot of ``Execution``.
    built: ExecutionTrace | None

    def _record(
        self: _Running,
        input_messages: int,
        response: ModelResponse,
        usage: Usage,
        outcomes: Sequence[ToolOutcome],
        model_seconds: float,
        tools_seconds: float,
        error: str = "",
    ) -> StepRecord:
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
        )
        self.steps.append(record)
        self.step_began = 0.0
        if self.observed:
            self.emit(
                "step_end",
                step=record.index,
                tool_calls=[call.name for call in record.tool_calls],
                tokens=usage.input_tokens + usage.output_tokens,
                seconds=model_seconds + tools_seconds,
            )
        return record

    def _record_failed_request(
        self: _Running, input_messages: int, began: float, exc: Exception
    ) -> None:
        self.steps.append(
            StepRecord(
                index=len(self.steps),
                input_messages=input_messages,
                response_text="".join(self.streamed),  # what came before it failed
                tool_calls=(),
                outcomes=(),
                usage=self.charged,
                model_seconds=time.perf_counter() - began,
                tools_seconds=0.0,
                finish_reason="error",
                error=exception_text(exc),
            )
        )
        self.step_began = 0.0

    def emit(self: _Running, kind: EventKind, **detail: Any) -> None:
        """One event of this execution: to the runtime's subscribers when it has any,
        and to the watcher of the streamed ask above it, if there is one."""
        node = self.node
        parent = node.parent
        bus = self.context.runtime.event_bus
        event = agent_event(
            kind,
            at=bus.now(),
            agent=self.agent.name,
            agent_id=self.agent_id,
            execution_id=node.id,
            parent_id=parent.id if parent is not None else "",
            depth=node.depth,
            detail=detail,
        )
        if bus.active:
            bus.deliver(event)
        watch = node.watch
        if watch is not None:
            watch(event)

    def _emit_end(self: _Running) -> None:
        """The events of the execution's end: how a limit or the deadline stopped it,
        if one did, then its status."""
        node = self.node
        if self.status in ("budget_exceeded", "timed_out"):
            kind: EventKind = "budget_exceeded" if self.status == "budget_exceeded" else "deadline"
            self.emit(kind, reason=self.reason)
        self.emit(
            "execution_end",
            status=self.status,
            reason=self.reason,
            steps=len(self.steps),
            tokens=node.input_tokens + node.output_tokens,
            answer=self.answer()[:200],  # the task's answer, as execution_start its task
        )

    def _stop(self: _Running, status: Status, reason: str) -> None:
        self.status = status
        self.reason = reason

    def all_steps(self: _Running) -> list[StepRecord]:
        """The steps recorded, then the step that was in flight when the execution
        stopped, if one was, marked as interrupted."""
        if not self.step_began:
            return self.steps
        return [*self.steps, self._interrupted_step()]

    def _interrupted_step(self: _Running) -> StepRecord:
        ended = self.ended or time.perf_counter()
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
                error=f"interrupted before the model answered: {self.reason}",
                interrupted=True,
            )
        response, usage, model_seconds, tools_began = asked
        seconds = ended - tools_began
        done = self.step_outcomes
        calls = response.tool_calls
        outcomes: tuple[ToolOutcome, ...]
        if done is None:  # the step's one tool call
            outcomes = (interrupted_call(calls[0], seconds),)
        else:
            outcomes = tuple(
                [
                    interrupted_call(call, seconds) if outcome is NOT_RUN else outcome
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
            error=f"interrupted while its tool calls ran: {self.reason}",
            interrupted=True,
        )

    def answer(self: _Running, steps: Sequence[StepRecord] | None = None) -> str:
        """The final response: the model's, or one synthesized from ``steps`` (by
        default ``all_steps()``)."""
        if self.final_text and self.status == "completed":
            return self.final_text
        return synthesize(
            self.status,
            self.reason,
            self.all_steps() if steps is None else steps,
            self.last_text,
            self.agent.subagents_by_name,
        )

    def result(self: _Running, text: str) -> Result:
        return Result(
            text=text,
            status=self.status,
            stop_reason=self.reason,
            usage=self.usage,
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            steps=len(self.steps) + (1 if self.step_began else 0),
            output=self.output if self.status == "completed" else None,
        )

    def progress(self: _Running, *, queued: int, turns: int) -> Progress:
        """A snapshot of this execution as it runs (see ``AgentActor.control``)."""
        node = self.node
        asked = self.step_asked
        phase: Literal["summary", "model", "tools"] = "model"
        in_flight: tuple[ToolCall, ...] = ()
        if self.fold is not None and self.summarization is None:
            phase = "summary"  # its compaction's request is out
        elif self.step_began and asked is not None:
            phase = "tools"
            calls = asked[0].tool_calls
            done = self.step_outcomes
            if done is None:  # the step's one tool call
                in_flight = calls
            else:
                in_flight = tuple(
                    [call for call, outcome in zip(calls, done, strict=True) if outcome is NOT_RUN]
                )
        return Progress(
            agent_id=self.agent_id,
            running=True,
            execution_id=self.execution_id,
            task=self.task,
            attempt=self.attempt,
            steps=tuple(self.steps),
            phase=phase,
            in_flight=in_flight,
            streamed="".join(self.streamed) if phase == "model" else "",
            usage=node.usage(),
            seconds=time.perf_counter() - self.started,
            queued=queued,
            conversation_turns=turns,
            nodes=self._nodes() if node.status == "running" else (),
        )

    def _nodes(self: _Running) -> tuple[NodeSnapshot, ...]:
        """This execution's node and its subtree's, as the supervisor sees them now."""
        supervisor = self.supervisor
        nodes: list[NodeSnapshot] = []
        supervisor.snapshot_nodes(nodes, self.node, supervisor.now())
        return (*nodes, *supervisor.subtree(self.node))

    def final_trace(self: _Running) -> ExecutionTrace:
        """The trace of this ended execution, with its final response (built once;
        its links again if an attempt of its parent has been renamed meanwhile)."""
        built = self.built
        parent_id = self._parent_link()
        attempt_of = "" if self.execution_id == self.node.id else self.node.id
        if built is None:
            steps = self.all_steps()
            built = self.built = ExecutionTrace(
                execution_id=self.execution_id,
                agent_id=self.agent_id,
                task=self.task,
                steps=tuple(steps),
                status=self.status,
                stop_reason=self.reason,
                final_text=self.answer(steps),
                usage=self.usage,
                seconds=(self.ended or time.perf_counter()) - self.started,
                parent_id=parent_id,
                agent_name=self.agent.name,
                attempt=self.attempt,
                attempt_of=attempt_of,
                summarization=self.summarization,
                digest=self.digested,
                resumed=self.resumed,
            )
        elif built.parent_id != parent_id or built.execution_id != self.execution_id:
            built = self.built = msgspec.structs.replace(
                built, parent_id=parent_id, execution_id=self.execution_id, attempt_of=attempt_of
            )
        return built

    def _parent_link(self: _Running) -> str:
        """The execution that delegated this one: its parent node's, or when that
        node's task was attempted again since, the attempt that delegated it."""
        parent = self.node.parent
        if parent is None or parent.parent is None:
            return ""
        if self.parent_attempt == parent.attempt:
            return parent.id
        return f"{parent.id}~{self.parent_attempt}"


def interrupted_call(call: ToolCall, seconds: float) -> ToolOutcome:
    return ToolOutcome(
        call=call,
        content="[interrupted] still running when the execution stopped",
        is_error=True,
        seconds=seconds,
        interrupted=True,
    )


#: The outcome slot of a call not run yet (compared by identity).
NOT_RUN = ToolOutcome(
    call=ToolCall(id="", name=""), content="not run", is_error=True, seconds=0.0, attempts=0
)
