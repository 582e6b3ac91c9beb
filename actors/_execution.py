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

import contextvars
import time
from collections.abc import Awaitable, Callable, Collection, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

import anyio
import msgspec
import structlog

from runtime import (
    ActorContext,
    BudgetExceeded,
    EventKind,
    Node,
    NodeSnapshot,
    Supervisor,
    Usage,
)
from runtime.lowlevel import HeldUp

from ._delegation import Delegation, refused
from ._messages import (
    AssistantMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    ModelResponse,
    Progress,
    Result,
    Status,
    StepRecord,
    ToolCall,
    ToolOutcome,
    ToolResultMessage,
    exception_text,
)
from ._requests import EMPTY_USAGE, ascii_arguments, safe_response, send

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from ._agent import Agent
    from ._models import ModelAdapter, Send
    from ._tools import Tool

__all__ = ["Execution", "StopCondition", "synthesize"]

#: A user stop condition: called after each step that ran tools; True ends the execution.
StopCondition = Callable[[StepRecord], bool]


class _Interrupted(Exception):
    """A step's task group was cancelled by the supervisor (see ``_run_with_subagents``)."""


#: structlog's context variables for the four keys every execution binds, found by
#: the first bind (``Token.var``): later binds set them directly.
_LOG_VARS: list[contextvars.ContextVar[Any]] = []


def _bind_log_context(
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


class Execution:
    """The state and the loop of one execution of one agent.

    ``buffer`` is the agent's execution buffer (a list the agent owns and this
    execution fills); ``history`` compiles everything before it (system prompt,
    summary, buffer section, conversation) and is fixed for the whole execution.
    ``node`` is this execution's place in the supervisor's tree: every step, request
    and tool call is charged there, and its cancel scope is what the supervisor
    cancels when a limit (or the deadline) stops this subtree.
    """

    __slots__ = (
        "agent",
        "agent_id",
        "attempt",
        "buffer",
        "built",
        "call_ids",
        "charged",
        "context",
        "conversation",
        "ended",
        "escalation",
        "execution_id",
        "final_text",
        "history",
        "last_text",
        "node",
        "own_scope",
        "reason",
        "sink",
        "started",
        "status",
        "step_asked",
        "step_began",
        "step_input",
        "step_outcomes",
        "steps",
        "streamed",
        "supervisor",
        "task",
        "via",
    )

    def __init__(
        self,
        *,
        agent: Agent,
        agent_id: str,
        node: Node,
        supervisor: Supervisor,
        task: str,
        history: tuple[Message, ...],
        buffer: list[Message],
        context: ActorContext,
        delegated: bool = False,
        conversation: list[Message] | None = None,
    ) -> None:
        self.agent = agent
        self.agent_id = agent_id
        self.node = node
        self.supervisor = supervisor
        self.execution_id = node.id
        #: Which attempt of the task this is (see ``ExecutionTrace.attempt``).
        self.attempt = 1
        self.task = task
        self.history = history
        self.buffer = buffer
        self.context = context
        #: The conversation of an execution that ends itself (see ``run``): a
        #: delegated child's, whose actor ends with this one task.
        self.conversation = conversation
        self.steps: list[StepRecord] = []
        self.status: Status = "cancelled"
        self.reason = "cancelled before it finished"
        self.final_text = ""
        self.last_text = ""
        self.escalation = ""
        self.started = time.perf_counter()
        self.ended = 0.0
        #: The step in flight, kept so that an interrupted execution's trace shows it
        #: (see ``all_steps``): when its request began (0.0 once the step is
        #: recorded), its input, then the model's answer, its usage, the model's
        #: seconds and when the tools began, and the tool outcomes so far.
        self.step_began = 0.0
        self.step_input = 0
        self.step_asked: tuple[ModelResponse, Usage, float, float] | None = None
        self.step_outcomes: list[ToolOutcome] | None = None
        #: The trace, once built (see ``final_trace``).
        self.built: ExecutionTrace | None = None
        #: The tool call ids of this execution so far (see ``_unique``).
        self.call_ids: set[str] = set()
        #: Whether it runs in a cancel scope of its own (see ``run``).
        self.own_scope = not delegated or node.limits is not None or node.deadline_owner is node
        #: What the current step's model requests were charged, all attempts included.
        self.charged = EMPTY_USAGE
        #: A model built on another (ReAct) sends each of its requests through ours.
        self.via: Callable[[ModelRequest, Send], Awaitable[ModelResponse]] | None = getattr(
            agent.model, "request_via", None
        )
        #: The text the model has streamed so far in the current request, in pieces.
        self.streamed: list[str] = []
        #: Where a streaming model hands its text (None: the model does not stream;
        #: an adapter's text is its own format, never streamed).
        self.sink: Callable[[str], None] | None = None
        if self.via is None and getattr(agent.model, "streaming", False):
            self.sink = self._streamed_text

    @property
    def usage(self) -> Usage:
        """This execution's usage, all descendants included."""
        return self.node.usage()

    @property
    def observed(self) -> bool:
        """Whether anyone sees this execution's events: the runtime's subscribers (or
        its log), or the watcher of a streamed ask above it."""
        return self.context.runtime.event_bus.active or self.node.watch is not None

    def _streamed_text(self, text: str) -> None:
        """The sink of a streaming model: keep the piece (for a snapshot, and for the
        trace if the request is cut) and show it to whoever watches."""
        self.streamed.append(text)
        if self.context.runtime.event_bus.active or self.node.watch is not None:
            self.emit("text", text=text, step=len(self.steps))

    async def run(self) -> Result | None:
        """Run steps until a final answer or a stop; never raises an ``Exception``.

        Cancellation from outside (the actor, the runtime) propagates, and ``status``
        stays "cancelled". A stop from the supervisor (a limit of this node or an
        ancestor, the deadline) ends the steps and becomes this execution's status.

        With a ``conversation``, the execution also ends itself, on every path (see
        ``_end``), and returns its ``Result``. A delegated child with no cancel scope
        of its own runs ``_steps(alone=True)`` instead, which does all of this in one
        frame: a cancellation unwinds every frame of every agent in the tree.
        """
        tokens = self._begin()
        node = self.node
        # A subagent with no budget or deadline of its own needs no cancel scope of
        # its own: its parent's deadline and stops reach it through the parent's
        # step, and a stop of its node alone cancels its actor's task (its parent
        # then reads the node's status). One scope less per child to cancel.
        scope = None
        try:
            if self.own_scope:
                with anyio.CancelScope(deadline=node.deadline) as scope:
                    node.scope = scope
                    await self._steps()
            else:
                node.scope = self.context.ref
                await self._steps()
        except self.context.runtime.cancelled_exc:
            self._cancelled()
            raise
        return self._finish(tokens, scope is not None and scope.cancelled_caught)

    def start(self) -> Coroutine[Any, Any, Result | None]:
        """``run()``, or for an execution that ends itself with no cancel scope of its
        own (a delegated child's), the same in one frame (``_steps(alone=True)``)."""
        if self.own_scope or self.conversation is None:
            return self.run()
        return self._steps(alone=True)

    def _begin(self) -> tuple[contextvars.Token[Any], ...]:
        """Bind the log context and say the execution starts."""
        node = self.node
        parent = node.parent
        tokens = _bind_log_context(
            self.agent_id, parent.id if parent is not None else None, node.depth, node.id
        )
        if self.observed:
            self.emit("execution_start", task=self.task[:200])
        return tokens

    def _cancelled(self) -> None:
        """Cancelled from outside (the actor, its parent actor, the runtime): a stop or
        deadline of the tree may still be the reason, which the answer names. The
        actor's task ends with this cancellation, and the log context with it: nothing
        to reset (a cancelled tree does no more per child than it must)."""
        node = self.node
        node.scope = None
        self.ended = time.perf_counter()
        supervisor = self.supervisor
        self.status, self.reason = supervisor.why_stopped(node)
        if self.observed:  # whoever watched it start sees it end
            self._emit_end()
        if self.conversation is not None:  # ends itself: see _end (no answer to build)
            self.buffer.clear()
            supervisor.close(node, self.status, self.reason)
            if node.traces is not None:
                node.traces.append(self)

    def _finish(self, tokens: tuple[contextvars.Token[Any], ...], stopped: bool) -> Result | None:
        """The steps ended (an answer, a failure, a stop: ``stopped`` if its own scope
        caught the supervisor's cancellation): the status, the events, and for an
        execution that ends itself, its end and its ``Result``."""
        node = self.node
        node.scope = None
        self.ended = time.perf_counter()
        for token in tokens:
            token.var.reset(token)
        if stopped or node.stop_status is not None:
            self._stop(*self.supervisor.why_stopped(node))
        if self.observed:
            self._emit_end()
        if self.conversation is not None:
            return self.result(self._end())
        return None

    def _emit_end(self) -> None:
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
        )

    def _end(self) -> str:
        """End a delegated child's execution: empty buffer; the final response joins
        its conversation; its node closes; its execution goes to the top-level one's
        save (``Node.traces``), which builds its trace then. The actor ends with this
        task: nobody reads its conversation or traces again, so a cancelled one
        (``_cancelled``) builds no answer at all."""
        node = self.node
        self.buffer.clear()
        text = self.answer()
        if self.conversation is not None:
            self.conversation.append(AssistantMessage(content=text))
        self.supervisor.close(node, self.status, self.reason)
        if node.traces is not None:
            node.traces.append(self)
        return text

    def emit(self, kind: EventKind, **detail: Any) -> None:
        """One event of this execution: to the runtime's subscribers when it has any,
        and to the watcher of the streamed ask above it, if there is one."""
        node = self.node
        parent = node.parent
        bus = self.context.runtime.event_bus
        event = bus.make(
            kind,
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

    async def _steps(self, *, alone: bool = False) -> Result | None:
        """The steps, until an answer or a stop; never raises an ``Exception``: a
        refusal or an interrupted step means the supervisor stopped this subtree
        (``run`` reads why), anything else fails the execution.

        ``alone``: all of ``run`` in this one frame, for an execution that ends itself
        and has no cancel scope of its own (a delegated child's: see ``run``).
        """
        if alone:
            tokens = self._begin()
            self.node.scope = self.context.ref
        try:
            if self.node.stop_status is not None:
                raise _Interrupted
            agent = self.agent
            supervisor = self.supervisor
            node = self.node
            specs = agent.specs
            max_tokens = agent.max_tokens
            buffer = self.buffer
            # What the model sees: the history, then this execution's buffer. Grown by
            # one concatenation per step (the buffer list is kept for snapshots).
            context = self.history + tuple(buffer)
            while True:
                try:
                    supervisor.charge(node, steps=1)
                except HeldUp:  # headroom leased to a subtree on another host
                    await supervisor.charge_waiting(node, steps=1)
                if self.observed:
                    self.emit("step_start", step=len(self.steps))
                request = ModelRequest(messages=context, tools=specs, max_tokens=max_tokens)
                began = self.step_began = time.perf_counter()
                self.step_input = len(context)
                self.step_asked = None
                self.charged = EMPTY_USAGE
                try:
                    if self.via is None:
                        response = await send(self, agent.model, request)
                    else:
                        response = await self.via(request, self._send_inner)
                except BudgetExceeded as exc:
                    self._record_failed_request(len(context), began, exc)
                    raise
                except Exception as exc:
                    self._record_failed_request(len(context), began, exc)
                    self._stop("failed", f"model request failed: {exception_text(exc)}")
                    break
                usage = self.charged
                model_seconds = time.perf_counter() - began
                if not response.text.isascii() or (
                    response.tool_calls and not ascii_arguments(response.tool_calls)
                ):
                    response = safe_response(response)
                if response.text:
                    self.last_text = response.text
                calls = response.tool_calls
                if calls and not self._ids_unique(calls):
                    response = msgspec.structs.replace(response, tool_calls=self._unique(calls))
                    calls = response.tool_calls
                if not calls:
                    self._record(len(context), response, usage, (), model_seconds, 0.0)
                    if response.text:
                        self.final_text = response.text
                        self._stop("completed", "final answer")
                    else:
                        reason = f"the model stopped ({response.finish_reason}) without text"
                        self._stop("completed", reason)
                    break
                # Text that comes with tool calls is trace, never the answer.
                asked = AssistantMessage(content=response.text, tool_calls=calls)
                buffer.append(asked)
                began = time.perf_counter()
                self.step_asked = (response, usage, model_seconds, began)
                if len(calls) == 1 and calls[0].name not in agent.subagents_by_name:
                    self.step_outcomes = None  # the usual step: no task group
                    only = calls[0]
                    direct = self._direct(only)
                    if direct is None:
                        outcome = await self._run_call(only)
                    elif isinstance(direct, ToolOutcome):
                        outcome = direct
                    else:  # awaited here, not through the tool's invoke: one frame less
                        tool, kwargs, start = direct
                        try:
                            value = await tool.fn(**kwargs)
                        except Exception as exc:
                            outcome = tool.failed(only, exc, start, 1)
                        else:
                            outcome = tool.succeeded(only, value, start, 1)
                    outcomes = [outcome]
                else:
                    outcomes = self.step_outcomes = [_NOT_RUN] * len(calls)
                    await self._run_tools(calls, outcomes)
                tools_seconds = time.perf_counter() - began
                results = [
                    ToolResultMessage(
                        call_id=outcome.call.id,
                        name=outcome.call.name,
                        content=outcome.content,
                        is_error=outcome.is_error,
                    )
                    for outcome in outcomes
                ]
                buffer.extend(results)
                record = self._record(
                    len(context), response, usage, outcomes, model_seconds, tools_seconds
                )
                if self.escalation:
                    self._stop("failed", self.escalation)
                    break
                stop_when = agent.stop_when
                if stop_when is not None and stop_when(record):
                    self._stop("completed", "the agent's stop condition was met")
                    break
                context = context + (asked, *results)  # noqa: RUF005 (one copy, not two)
        except (BudgetExceeded, _Interrupted):
            pass  # the supervisor has stopped this subtree and says why (see run)
        except Exception as exc:
            self._stop("failed", exception_text(exc))
        except self.context.runtime.cancelled_exc:
            if alone:
                self._cancelled()
            raise
        return self._finish(tokens, False) if alone else None

    def _ids_unique(self, calls: tuple[ToolCall, ...]) -> bool:
        """Whether every call has an id not used before in this execution (and
        remember them): each tool result must name the one call it answers."""
        seen = self.call_ids
        if len(calls) == 1:  # the usual step: one look-up, no set built
            call_id = calls[0].id
            if call_id and call_id not in seen:
                seen.add(call_id)
                return True
            return False
        ids = {tool_call.id for tool_call in calls}
        if len(ids) == len(calls) and "" not in ids and seen.isdisjoint(ids):
            seen.update(ids)
            return True
        return False

    def _unique(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
        """``calls`` with a missing or repeated id replaced by a new one (a model's
        slip: providers need every result to follow its own call)."""
        seen = self.call_ids
        fixed: list[ToolCall] = []
        for tool_call in calls:
            call_id = tool_call.id
            if not call_id or call_id in seen:
                number = len(seen)
                while (new := f"{call_id or 'call'}~{number}") in seen:
                    number += 1
                tool_call = msgspec.structs.replace(tool_call, id=new)
            seen.add(tool_call.id)
            fixed.append(tool_call)
        return tuple(fixed)

    def _send_inner(self, request: ModelRequest) -> Awaitable[ModelResponse]:
        """How a model built on another (ReAct) sends each of its own requests: every
        one, corrections included, is checked and charged like any other."""
        adapter = cast("ModelAdapter", self.agent.model)  # it has request_via: see run
        return send(self, adapter.inner, request)

    async def _run_tools(self, calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]) -> None:
        """Run every call of one step concurrently, each outcome at its call's index.

        Tool calls run on at most ``tool_concurrency`` workers that share one
        iterator over them (taking the next call never awaits), so the bound costs no
        lock and no more tasks than it allows. Subagent calls need no worker: each is
        a child actor in this step's task group (see ``Delegation``), at most
        ``tool_concurrency`` of them at once.
        """
        subagents = self.agent.subagents_by_name
        if subagents and any(call.name in subagents for call in calls):
            await self._run_with_subagents(calls, outcomes)
            return
        async with anyio.create_task_group() as tg:
            self._start_workers(tg, list(enumerate(calls)), outcomes)

    def _start_workers(
        self, tg: TaskGroup, calls: list[tuple[int, ToolCall]], outcomes: list[ToolOutcome]
    ) -> None:
        pending = iter(calls)
        run_call = self._run_call

        async def worker() -> None:
            for index, call in pending:
                outcomes[index] = await run_call(call)

        for _ in range(min(len(calls), self.agent.tool_concurrency)):
            tg.start_soon(worker)

    async def _run_with_subagents(
        self, calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]
    ) -> None:
        subagents = self.agent.subagents_by_name
        tools = [(i, call) for i, call in enumerate(calls) if call.name not in subagents]
        delegated = [(i, call) for i, call in enumerate(calls) if call.name in subagents]
        # The children live in this block: whatever interrupts the step (a stop of
        # the tree, a deadline, a cancellation) cancels them with it, in one delivery.
        # While it runs, the block's own scope is the one the supervisor cancels: from
        # the execution's, the cancellation would reach every child twice (once from
        # there, once more from the task group as it sees its body cancelled).
        node = self.node
        outer = node.scope
        delegation: Delegation | None = None
        try:
            async with anyio.create_task_group() as tg:
                node.scope = tg.cancel_scope
                if tools:
                    self._start_workers(tg, tools, outcomes)
                delegation = Delegation(self, tg, delegated, outcomes)
                await delegation.run()
        finally:
            node.scope = outer
            if delegation is not None and delegation.interrupted:
                delegation.close_abandoned()
        if tg.cancel_scope.cancelled_caught:
            raise _Interrupted  # the supervisor stopped this node: the step ends here

    def _direct(
        self, call: ToolCall
    ) -> tuple[Tool[..., Any], dict[str, Any], float] | ToolOutcome | None:
        """For a tool the step may await itself (``Tool.direct``) when nothing observes
        the tree: the call charged and its arguments validated, or the outcome that
        answers it at once (refused, invalid arguments); None for any other call."""
        tool = self.agent.toolbox.direct.get(call.name)
        if tool is None or self.observed:
            return None
        try:
            self.supervisor.charge(self.node, tool_calls=1)
        except BudgetExceeded as exc:
            return refused(call, f"tool call refused: {exc}")
        except HeldUp:
            return None  # ``_run_call`` waits for the headroom
        start = time.perf_counter()
        kwargs = tool.arguments(call, start)
        if isinstance(kwargs, ToolOutcome):
            return kwargs
        return tool, kwargs, start

    def _run_call(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        """Charge and run one tool call. Not a coroutine of its own when nothing
        observes the tree: it hands back the tool's, one frame less per call."""
        try:
            self.supervisor.charge(self.node, tool_calls=1)
        except BudgetExceeded as exc:
            return _ready(refused(call, f"tool call refused: {exc}"))
        except HeldUp:
            return self._run_call_held_up(call)
        if not self.observed:
            return self.agent.toolbox.run(call)
        return self._run_call_observed(call)

    async def _run_call_held_up(self, call: ToolCall) -> ToolOutcome:
        """A call whose charge waits for headroom leased to a subtree elsewhere."""
        try:
            await self.supervisor.charge_waiting(self.node, tool_calls=1)
        except BudgetExceeded as exc:
            return refused(call, f"tool call refused: {exc}")
        if not self.observed:
            return await self.agent.toolbox.run(call)
        return await self._run_call_observed(call)

    async def _run_call_observed(self, call: ToolCall) -> ToolOutcome:
        self.emit("tool_start", tool=call.name, call_id=call.id, arguments=call.arguments[:200])
        outcome = await self.agent.toolbox.run(call)
        self.emit(
            "tool_end",
            tool=call.name,
            call_id=call.id,
            is_error=outcome.is_error,
            seconds=outcome.seconds,
            result=outcome.content[:200],
        )
        return outcome

    def _record(
        self,
        input_messages: int,
        response: ModelResponse,
        usage: Usage,
        outcomes: Sequence[ToolOutcome],
        model_seconds: float,
        tools_seconds: float,
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

    def _record_failed_request(self, input_messages: int, began: float, exc: Exception) -> None:
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

    def _stop(self, status: Status, reason: str) -> None:
        self.status = status
        self.reason = reason

    def all_steps(self) -> list[StepRecord]:
        """The steps recorded, then the step that was in flight when the execution
        stopped, if one was, marked as interrupted."""
        if not self.step_began:
            return self.steps
        return [*self.steps, self._interrupted_step()]

    def _interrupted_step(self) -> StepRecord:
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
            outcomes = (_interrupted_call(calls[0], seconds),)
        else:
            outcomes = tuple(
                [
                    _interrupted_call(call, seconds) if outcome is _NOT_RUN else outcome
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

    def answer(self, steps: Sequence[StepRecord] | None = None) -> str:
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

    def result(self, text: str) -> Result:
        return Result(
            text=text,
            status=self.status,
            stop_reason=self.reason,
            usage=self.usage,
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            steps=len(self.steps) + (1 if self.step_began else 0),
        )

    def progress(self, *, queued: int, turns: int) -> Progress:
        """A snapshot of this execution as it runs (see ``AgentActor.control``)."""
        node = self.node
        asked = self.step_asked
        phase: Literal["model", "tools"] = "model"
        in_flight: tuple[ToolCall, ...] = ()
        if self.step_began and asked is not None:
            phase = "tools"
            calls = asked[0].tool_calls
            done = self.step_outcomes
            if done is None:  # the step's one tool call
                in_flight = calls
            else:
                in_flight = tuple(
                    [call for call, outcome in zip(calls, done, strict=True) if outcome is _NOT_RUN]
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

    def _nodes(self) -> tuple[NodeSnapshot, ...]:
        """This execution's node and its subtree's, as the supervisor sees them now."""
        supervisor = self.supervisor
        nodes: list[NodeSnapshot] = []
        supervisor.snapshot_nodes(nodes, self.node, supervisor.now())
        return (*nodes, *supervisor.subtree(self.node))

    def final_trace(self) -> ExecutionTrace:
        """The trace of this ended execution, with its final response (built once)."""
        built = self.built
        if built is None:
            steps = self.all_steps()
            parent = self.node.parent
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
                parent_id=parent.id if parent is not None and parent.parent else "",
                agent_name=self.agent.name,
                attempt=self.attempt,
            )
        return built


async def _ready(outcome: ToolOutcome) -> ToolOutcome:
    return outcome


def _interrupted_call(call: ToolCall, seconds: float) -> ToolOutcome:
    return ToolOutcome(
        call=call,
        content="[interrupted] still running when the execution stopped",
        is_error=True,
        seconds=seconds,
        interrupted=True,
    )


_NOT_RUN = ToolOutcome(
    call=ToolCall(id="", name=""), content="not run", is_error=True, seconds=0.0, attempts=0
)
