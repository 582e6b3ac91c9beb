"""One execution: a task in, steps of model requests and parallel tool calls, one
``Result`` out (DESIGN.md section 1, "One execution").

The execution owns the agent's **execution buffer** while it runs: the assistant
messages that asked for tools and the tool results, in call order. The model sees
them (providers require every result to follow its call), nothing else keeps them:
when the execution ends, on any path (answer, limit, error, cancellation), the
buffer is emptied and only the final response joins the conversation. If there is
no final response, one is synthesized from the status, what was done and the last
useful text, so a caller always gets an answer.

Every execution, top-level or delegated, ends through one method, ``Execution.end``
(DESIGN.md invariant 2 is enforced there and nowhere else): called by ``run`` for
an execution that ends itself (a delegated child's, its actor's only task), by the
agent actor for the others (after their restarts).

Here: the loop of steps and how an execution begins and ends. Its other parts are
mixins of ``Execution``: ``Calling`` (``_calling.py``) runs each step's tool calls,
``Recording`` (``_recording.py``) keeps its step records and events and builds its
trace, its ``Result`` and a snapshot of it as it runs, ``Answering``
(``_answering.py``) takes the typed answer of an agent with an ``output_type``.
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, cast

import anyio
import msgspec

from fractor.runtime import (
    ActorContext,
    BudgetExceeded,
    Node,
    Supervisor,
    Usage,
)

from ._answering import Answering
from ._calling import Calling, Interrupted
from ._digest import Resuming, Reuse
from ._memory import Fold, Summarizing, clear_results
from ._messages import (
    AssistantMessage,
    DigestMessage,
    ExecutionTrace,
    Message,
    ModelRequest,
    ModelResponse,
    Result,
    Status,
    StepRecord,
    SummaryRecord,
    ToolOutcome,
    ToolResultMessage,
    exception_text,
)
from ._output import answers
from ._recording import NOT_RUN, Recording, bind_log_context, synthesize
from ._requests import EMPTY_USAGE, ascii_arguments, safe_response, send

if TYPE_CHECKING:
    from ._agent import Agent
    from ._models import ModelAdapter, Send

__all__ = ["Execution", "StopCondition", "synthesize"]

#: A user stop condition: called after each step that ran tools; True ends the execution.
StopCondition = Callable[[StepRecord], bool]


class Execution(Calling, Recording, Answering, Summarizing, Resuming):
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
        "bus",
        "call_ids",
        "caller",
        "charged",
        "compacted",
        "concluded",
        "context",
        "conversation",
        "corrections",
        "delegated",
        "digested",
        "earlier",
        "ended",
        "ends_itself",
        "escalation",
        "execution_id",
        "final_text",
        "fold",
        "history",
        "kept",
        "last_text",
        "node",
        "output",
        "own_scope",
        "parent_attempt",
        "reason",
        "resumed",
        "reuse",
        "sink",
        "started",
        "status",
        "step_asked",
        "step_began",
        "step_input",
        "step_outcomes",
        "steps",
        "streamed",
        "summarization",
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
        conversation: list[Message],
        delegated: bool = False,
        ends_itself: bool = False,
        kept: list[ExecutionTrace] | None = None,
        fold: Fold | None = None,
        compacted: Callable[[Fold, str], tuple[Message, ...]] | None = None,
        digest: DigestMessage | None = None,
        reuse: Reuse | None = None,
    ) -> None:
        self.agent = agent
        self.agent_id = agent_id
        self.node = node
        self.supervisor = supervisor
        self.execution_id = node.id
        #: Which attempt of the task this is (see ``ExecutionTrace.attempt``), and
        #: which attempt of its parent's task delegated it.
        self.attempt = 1
        parent = node.parent
        self.parent_attempt = parent.attempt if parent is not None else 1
        self.task = task
        self.history = history
        # A fresh buffer: an earlier execution (or attempt) never carries its over.
        buffer.clear()
        self.buffer = buffer
        self.context = context
        self.bus = context.runtime.event_bus  # read at every event site
        #: The agent's conversation, which the final response joins (see ``end``).
        self.conversation = conversation
        #: A subagent call's execution (its node opened by the parent): its actor
        #: ends with this one task, and nobody reads the actor's state after it.
        self.delegated = delegated
        #: Whether ``run`` ends it (a delegated child with no restarts to try);
        #: otherwise its agent does, after its restarts (see ``end``).
        self.ends_itself = ends_itself
        #: The agent's kept traces, which this execution's joins as it ends (an
        #: agent that lives on after it; None for a delegated one).
        self.kept = kept
        #: The earlier attempts of the same task (restarts), oldest first: they end
        #: with this one (see ``end``).
        self.earlier: tuple[Execution, ...] = ()
        self.steps: list[StepRecord] = []
        self.status: Status = "cancelled"
        self.reason = "cancelled before it finished"
        self.final_text = ""
        self.last_text = ""
        self.escalation = ""
        #: A typed answer (see ``Answering``): its value, the bad answers sent back,
        #: and whether the answer (or the last bad one) ends the steps.
        self.output: Any = None
        self.corrections = 0
        self.concluded = False
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
        #: A compaction to begin with, what does it, its record (``Summarizing``).
        self.fold = fold
        self.compacted = compacted
        self.summarization: SummaryRecord | None = None
        #: Earlier attempts behind this one: their digest opens the buffer, their
        #: completed calls answer the same calls again (see ``Resuming``).
        self.digested = digest is not None
        if digest is not None:
            buffer.append(digest)
        self.reuse = reuse
        #: The execution a resumed ask picks up from; ``Task.caller`` (set by the agent).
        self.resumed = ""
        self.caller = ""

    @property
    def usage(self) -> Usage:
        """This execution's usage, all descendants included."""
        return self.node.usage()

    @property
    def observed(self) -> bool:
        """Whether anyone sees this execution's events: the runtime's subscribers (or
        its log), or the watcher of a streamed ask above it."""
        return self.bus.active or self.node.watch is not None

    def _streamed_text(self, text: str) -> None:
        """The sink of a streaming model: keep the piece (for a snapshot, and for the
        trace if the request is cut) and show it to whoever watches."""
        self.streamed.append(text)
        if self.bus.active or self.node.watch is not None:
            self.emit("text", text=text, step=len(self.steps))

    async def run(self) -> Result | None:
        """Run steps until a final answer or a stop; never raises an ``Exception``.

        Cancellation from outside (the actor, the runtime) propagates, and ``status``
        stays "cancelled". A stop from the supervisor (a limit of this node or an
        ancestor, the deadline) ends the steps and becomes this execution's status.

        An execution that ``ends_itself`` also ends, on every path (see ``end``), and
        returns its ``Result``. A delegated child with no cancel scope of its own
        runs ``_steps(alone=True)`` instead, which does all of this in one frame: a
        cancellation unwinds every frame of every agent in the tree.
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
        if self.own_scope or not self.ends_itself:
            return self.run()
        return self._steps(alone=True)

    def _begin(self) -> tuple[contextvars.Token[Any], ...]:
        """Bind the log context and say the execution starts."""
        node = self.node
        parent = node.parent
        tokens = bind_log_context(
            self.agent_id, parent.id if parent is not None else None, node.depth, node.id
        )
        if self.observed:
            caller = {"caller": self.caller} if self.caller else {}
            self.emit("execution_start", task=self.task[:200], **caller)
        return tokens

    def _cancelled(self) -> None:
        """Cancelled from outside (the actor, its parent actor, the runtime): a stop or
        deadline of the tree may still be the reason, which the answer names. The
        actor's task ends with this cancellation, and the log context with it: nothing
        to reset (a cancelled tree does no more per child than it must)."""
        node = self.node
        node.scope = None
        self.ended = time.perf_counter()
        self.status, self.reason = self.supervisor.why_stopped(node)
        if self.observed:  # whoever watched it start sees it end
            self._emit_end()
        if self.ends_itself:
            self.end(cancelled=True)

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
        if self.ends_itself:
            return self.end()
        return None

    def end(self, *, cancelled: bool = False) -> Result | None:
        """End this execution, once, on every path, top-level or delegated: the one
        place DESIGN.md invariant 2 is kept. Sync: no cancellation can cut it short
        (the store write that follows it at the top is shielded, see ``AgentActor``).

        1. The execution buffer is emptied.
        2. The final response (the model's, or one synthesized) joins the
           conversation: the turn's user message is already there, so the
           conversation grew by exactly one turn.
        3. The node closes with the execution's status.
        4. The trace is handed on: each attempt's (``earlier``, then this one) joins
           the agent's kept traces if it lives on, and ``Node.traces`` if the tree's
           traces are collected there (by the top of a tree with a store, whose
           agent saves them, or by a host for its subtree's top).
        5. The one ``Result``; None if ``cancelled``: the cancellation goes on, and
           the actor's cell answers the pending ask as the actor stops.

        A delegated execution that is cancelled builds no answer at all: its actor
        ends with this cancellation, so nothing reads its conversation again, and a
        cancelled tree of a thousand children does no more per child than it must
        (its trace is built by whoever stores it, if anyone does).
        """
        node = self.node
        self.buffer.clear()
        kept = self.kept
        text = None
        if kept is not None:  # its trace is built now, and its answer with it
            trace = self.final_trace()
            kept.extend([attempt.final_trace() for attempt in self.earlier])
            kept.append(trace)
            if len(kept) > self.agent.trace_limit:
                del kept[: len(kept) - self.agent.trace_limit]
            text = trace.final_text
        elif not (cancelled and self.delegated):
            text = self.answer()
        if text is not None:
            self.conversation.append(AssistantMessage(content=text))
        self.supervisor.close(node, self.status, self.reason)
        traces = node.traces
        if traces is not None:
            if self.earlier:
                traces.extend(self.earlier)
            traces.append(self)
        return None if text is None or cancelled else self.result(text)

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
                raise Interrupted
            if self.fold is not None:
                await self._summarize()
            agent = self.agent
            supervisor = self.supervisor
            node = self.node
            specs = agent.specs
            max_tokens = agent.max_tokens
            buffer = self.buffer
            # What the model sees: the history, then this execution's buffer. Grown by
            # one concatenation per step (the buffer list is kept for snapshots).
            output = agent.output_spec
            clearing = agent.memory.clear_results if agent.memory is not None else None
            cleared = 0  # tool steps whose results are cleared (see Compaction)
            if output is None:
                context = self.history + tuple(buffer)
            else:  # a typed answer: its tool, or its instructions (see Answering)
                specs = output.specs(specs)
                context = output.history(self.history) + tuple(buffer)
            while True:
                if not supervisor.try_charge(node, steps=1):  # leased elsewhere: wait
                    await supervisor.charge_waiting(node, steps=1)
                if self.observed:
                    self.emit("step_start", step=len(self.steps))
                if output is None:
                    request = ModelRequest(messages=context, tools=specs, max_tokens=max_tokens)
                else:
                    request = output.request(context, specs, max_tokens)
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
                    if self.sink is None and self.observed:  # it came in one piece
                        self.emit("text", text=response.text, step=len(self.steps))
                calls = response.tool_calls
                if calls and not self._ids_unique(calls):
                    response = msgspec.structs.replace(response, tool_calls=self._unique(calls))
                    calls = response.tool_calls
                if not calls:
                    if output is not None:
                        said = self._typed_reply(
                            output, response, usage, len(context), model_seconds
                        )
                        if said is None:
                            break
                        buffer.extend(said)
                        context = context + said
                        continue
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
                if output is not None and output.tool is not None and answers(calls):
                    outcomes = await self._answer_calls(output, calls)
                elif self.reuse is not None and self._reusable(calls):
                    outcomes = self.step_outcomes = [NOT_RUN] * len(calls)
                    await self._run_reusing(calls, outcomes)
                elif len(calls) == 1 and calls[0].name not in agent.subagents_by_name:
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
                    outcomes = self.step_outcomes = [NOT_RUN] * len(calls)
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
                if self.concluded:
                    break
                if self.escalation:
                    self._stop("failed", self.escalation)
                    break
                stop_when = agent.stop_when
                if stop_when is not None and stop_when(record):
                    self._stop("completed", "the agent's stop condition was met")
                    break
                context = context + (asked, *results)  # noqa: RUF005 (one copy, not two)
                if clearing is not None and (done := clear_results(buffer, clearing, cleared)):
                    context, cleared = context[: len(context) - len(buffer)] + tuple(buffer), done
        except (BudgetExceeded, Interrupted):
            pass  # the supervisor has stopped this subtree and says why (see run)
        except Exception as exc:
            self._stop("failed", exception_text(exc))
        except self.context.runtime.cancelled_exc:
            if alone:
                self._cancelled()
            raise
        return self._finish(tokens, False) if alone else None

    def _send_inner(self, request: ModelRequest) -> Awaitable[ModelResponse]:
        """How a model built on another (ReAct) sends each of its own requests: every
        one, corrections included, is checked and charged like any other."""
        adapter = cast("ModelAdapter", self.agent.model)  # it has request_via: see run
        return send(self, adapter.inner, request)
