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

Here: the execution's state, its loop of steps, and how it begins and ends. It holds
the parts that do the rest, each given what it needs:

- ``Recorder`` (``_recording.py``): its step records, the step in flight, what the
  step's requests were charged and streamed, and its events (``emit``);
- ``ToolRunner`` (``_calling.py``): each step's tool calls (approval, direct and
  awaited calls, subagents through ``Delegation``);
- ``Answers`` (``_answering.py``): the typed answer of an agent with an
  ``output_type``;
- ``Summarizer`` (``_memory/_summarizer.py``): the compaction it begins with, if its agent folds
  old turns;
- ``run_reusing`` (``_memory/_digest.py``): earlier attempts' results answering the same
  calls again.

Each model request goes through ``send`` (``_requests.py``).
"""

from __future__ import annotations

import contextvars
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import anyio
import msgspec

from fractor.runtime import (
    ActorContext,
    BudgetExceeded,
    Node,
    NodeSnapshot,
    Supervisor,
    Usage,
)

from .._agent._definition import StopCondition
from .._memory._digest import Reuse, reusable, run_reusing
from .._memory._summarizer import Fold, Summarizer, clear_results
from .._messages import (
    AssistantMessage,
    DigestMessage,
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
    parts_in,
    safe_text,
)
from .._observation._events import (
    DeadlineReached,
    ExecutionEnd,
    ExecutionStart,
    LimitReached,
    ModelText,
    StepStart,
)
from .._observation._subtree import subtree
from .._parts import Media, describe_part, size_text
from .._requests import bind_calls
from .._tools._tool import EXECUTION_ORIGIN, own_failure
from ._answering import Answers
from ._calling import Interrupted, ToolRunner
from ._recording import NOT_RUN, Recorder, bind_log_context, synthesize

if TYPE_CHECKING:
    from .._agent._definition import AgentDefinition
    from ._calling import Direct
    from ._children import NewActor
    from ._recording import Emit

__all__ = ["Execution", "StopCondition", "synthesize"]


class Execution:
    """The state and the loop of one execution of one agent.

    ``buffer`` is the agent's execution buffer (a list the agent owns and this
    execution fills); ``history`` compiles everything before it (system prompt,
    summary, buffer section, conversation) and is fixed for the whole execution
    (but for a compaction it begins with). ``node`` is this execution's place in the
    supervisor's tree: every step, request and tool call is charged there, and its
    cancel scope is what the supervisor cancels when a limit (or the deadline) stops
    this subtree.

    Its parts: ``recorder``, ``tools``, ``answers`` (None without an
    ``output_type``), ``summarizer`` (None without a fold to do); see the module.
    """

    __slots__ = (
        "agent",
        "agent_id",
        "answers",
        "attempt",
        "buffer",
        "built",
        "bus",
        "caller",
        "cleared",
        "context",
        "conversation",
        "delegated",
        "digested",
        "earlier",
        "emit",
        "ended",
        "ends_itself",
        "execution_id",
        "final_parts",
        "final_text",
        "history",
        "kept",
        "last_text",
        "node",
        "own_scope",
        "parent_attempt",
        "reason",
        "recorder",
        "resumed",
        "reuse",
        "specs",
        "started",
        "started_at",
        "status",
        "summarizer",
        "supervisor",
        "task",
        "task_parts",
        "tools",
        "via",
    )

    def __init__(
        self,
        *,
        agent: AgentDefinition,
        agent_id: str,
        node: Node,
        supervisor: Supervisor,
        task: str,
        history: tuple[Message, ...],
        buffer: list[Message],
        context: ActorContext,
        new_actor: NewActor,
        conversation: list[Message],
        delegated: bool = False,
        ends_itself: bool = False,
        kept: list[ExecutionTrace] | None = None,
        fold: Fold | None = None,
        compacted: Callable[[Fold, str], tuple[Message, ...]] | None = None,
        digest: DigestMessage | None = None,
        reuse: Reuse | None = None,
        task_parts: tuple[Media, ...] = (),
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
        #: The images and documents of the task (its user message carries them).
        self.task_parts = task_parts
        self.history = history
        # A fresh buffer: an earlier execution (or attempt) never carries its over.
        buffer.clear()
        self.buffer = buffer
        self.context = context
        bus = self.bus = context.runtime.event_bus  # read at every event site
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
        #: How it ended (``_stop``): "cancelled" until something else is known; the
        #: model's final response, if it gave one, and the last text it said.
        self.status: Status = "cancelled"
        self.reason = "cancelled before it finished"
        self.final_text = ""
        #: The images and documents of the model's final answer (``Result.parts``).
        self.final_parts: tuple[Media, ...] = ()
        self.last_text = ""
        #: When it began: the clock its durations are measured on (and the origin of
        #: its steps' and tool calls' ``started``), and the wall clock's reading then
        #: (its trace's ``started``: executions on any host on one axis).
        self.started = time.perf_counter()
        self.started_at = time.time()
        self.ended = 0.0
        #: The trace, once built (see ``final_trace``).
        self.built: ExecutionTrace | None = None
        #: Whether it runs in a cancel scope of its own (see ``run``).
        self.own_scope = not delegated or node.limits is not None or node.deadline_owner is node
        recorder = self.recorder = Recorder(
            agent.name, agent_id, node, supervisor, bus, self.started
        )
        self.emit: Emit = recorder.emit
        adapter = callable(getattr(agent.model, "request_via", None))
        if not adapter and getattr(agent.model, "streaming", False):
            # A streaming model hands its text to the recorder (an adapter's text is
            # its own format, never streamed).
            recorder.sink = recorder.streamed_text
        self.tools = ToolRunner(
            agent.toolbox,
            agent.subagents_by_name,
            agent.tool_concurrency,
            agent.approve,
            recorder,
            context,
            new_actor,
        )
        self.tools.visible = (history, buffer)
        output = agent.output_spec
        self.answers = None if output is None else Answers(output, recorder)
        #: The tools the model is offered (a typed answer's tool among them).
        self.specs = agent.specs if output is None else output.specs(agent.specs)
        #: Tool steps whose results are cleared so far (see ``Compaction``).
        self.cleared = 0
        #: A compaction to begin with (its fold, and what does it).
        self.summarizer = None
        if fold is not None:
            memory = agent.memory
            assert memory is not None
            assert compacted is not None
            self.summarizer = Summarizer(fold, memory, agent.model, compacted)
        #: Earlier attempts behind this one: their digest opens the buffer, their
        #: completed calls answer the same calls again (see ``run_reusing``).
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
        return self.bus.active or self.recorder.watch is not None

    # -- how it begins and ends ----------------------------------------------------------

    async def run(self) -> Result | None:
        """Run steps until a final answer or a stop; never raises an ``Exception``.

        Cancellation from outside (the actor, the runtime) propagates, and ``status``
        stays "cancelled". A stop from the supervisor (a limit of this node or an
        ancestor, the deadline) ends the steps and becomes this execution's status.

        An execution that ``ends_itself`` also ends, on every path (see ``end``), and
        returns its ``Result``.
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

    def _begin(self) -> tuple[contextvars.Token[Any], ...]:
        """Bind the log context (and the origin of its tool calls' ``started``: see
        ``EXECUTION_ORIGIN``) and say the execution starts."""
        node = self.node
        parent = node.parent
        tokens = (
            *bind_log_context(
                self.agent_id, parent.id if parent is not None else None, node.depth, node.id
            ),
            EXECUTION_ORIGIN.set(self.started),
            bind_calls(self.recorder),
        )
        if self.observed:
            parts = tuple(map(describe_part, self.task_parts))
            self.emit(ExecutionStart(task=self.task[:200], caller=self.caller, parts=parts))
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
           the agent's kept traces if it lives on, and ``Subtree.traces`` if the tree's
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
        # (Its sink is its own bound method: let it go, so that the recorder is
        # freed as soon as nothing refers to it, not by the garbage collector.)
        self.recorder.sink = None
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
        traces = subtree(node).traces
        if traces is not None:
            if self.earlier:
                traces.extend(self.earlier)
            traces.append(self)
        return None if text is None or cancelled else self.result(text)

    def _stop(self, status: Status, reason: str) -> None:
        self.status = status
        self.reason = reason

    def _emit_end(self) -> None:
        """The events of the execution's end: how a limit or the deadline stopped it,
        if one did, then its status."""
        node = self.node
        if self.status in ("budget_exceeded", "timed_out"):
            limit = LimitReached if self.status == "budget_exceeded" else DeadlineReached
            self.emit(limit(reason=self.reason))
        self.emit(
            ExecutionEnd(
                status=self.status,
                reason=self.reason,
                steps=len(self.recorder.steps),
                tokens=node.input_tokens + node.output_tokens,
                answer=self.answer()[:200],  # the task's answer, as execution_start its task
                parts=tuple(map(describe_part, self.final_parts))
                if self.status == "completed"
                else (),
            )
        )

    # -- the steps ---------------------------------------------------------------------

    async def _steps(self) -> None:
        """The steps, until an answer or a stop; never raises an ``Exception``: a
        refusal or an interrupted step means the supervisor stopped this subtree
        (``run`` reads why), anything else fails the execution.

        A step: charged; its model request sent; the answer, which ends the steps
        (``_reply``), or the tool calls, whose results join what the model sees
        next (``_results``). The usual step's one call (a tool this loop may await
        itself, nothing observing: ``_direct``) is awaited right here, with no frame
        between the tool and this loop; every other step's calls run through
        ``_outcomes``.
        """
        recorder = self.recorder
        supervisor = self.supervisor
        node = self.node
        retry = self.agent.retry
        requests = self.agent.requests
        try:
            if node.stop_status is not None:
                raise Interrupted
            summarizer = self.summarizer
            if summarizer is not None:
                history = await summarizer.run(
                    recorder, self.history, self.buffer, self.agent.specs, retry
                )
                if history is not None:  # compacted: the summary replaces the old turns
                    self.history = history
            context = self._context()
            while True:
                if not supervisor.try_step(node):  # leased elsewhere: wait
                    await supervisor.charge_waiting(node, steps=1)
                request = self._request(context)
                try:
                    response = await requests.send(recorder, request)
                except BudgetExceeded as exc:
                    recorder.record_failed_request(exc)
                    if node.stop_status is not None:
                        raise  # the supervisor stopped this subtree: run reads why
                    # No limit stopped it: the model raised it itself, its failure.
                    self._stop("failed", f"model request failed: {exception_text(exc)}")
                    return
                except Exception as exc:
                    recorder.record_failed_request(exc)
                    self._stop("failed", f"model request failed: {exception_text(exc)}")
                    return
                except BaseException as exc:
                    if not own_failure(exc):
                        raise  # a cancellation, or the program's end
                    recorder.record_failed_request(exc)
                    self._stop("failed", f"model request failed: {exception_text(exc)}")
                    return
                usage = recorder.charged
                model_seconds = time.perf_counter() - recorder.step_began
                response = self._checked(response)
                calls = response.tool_calls
                if not calls:
                    said = self._reply(response, usage, len(context), model_seconds)
                    if said is None:
                        return
                    self.buffer.extend(said)
                    context = context + said
                    continue
                asked = self._asked(response, usage, model_seconds)
                direct = self._direct(calls)
                outcomes: Sequence[ToolOutcome]
                if direct is None:
                    outcomes = await self._outcomes(calls)
                elif isinstance(direct, ToolOutcome):
                    outcomes = (direct,)
                else:  # awaited here, not through the tool's invoke: one frame less
                    tool, args, kwargs, start = direct
                    try:
                        if kwargs is None:
                            value = await tool.fn(*args)
                        else:
                            value = await tool.fn(**kwargs)
                    except Exception as exc:
                        outcomes = (tool.failed(calls[0], exc, start, 1),)
                    except BaseException as exc:
                        if not own_failure(exc):
                            raise  # a cancellation, or the program's end
                        outcomes = (tool.failed(calls[0], exc, start, 1),)
                    else:
                        outcomes = (tool.succeeded(calls[0], value, start, 1),)
                following = self._results(context, asked, outcomes)
                if following is None:
                    return
                context = following
        except (BudgetExceeded, Interrupted):
            pass  # the supervisor has stopped this subtree and says why (see run)
        except Exception as exc:
            self._stop("failed", exception_text(exc))

    def _context(self) -> tuple[Message, ...]:
        """What the model sees at the first step: the history, then this execution's
        buffer. Grown by one concatenation per step (the buffer list is kept for
        snapshots)."""
        answers = self.answers
        if answers is None:
            return self.history + tuple(self.buffer)
        # A typed answer: its instructions, if it asks for them (see ``Answers``).
        return answers.spec.history(self.history) + tuple(self.buffer)

    def _request(self, context: tuple[Message, ...]) -> ModelRequest:
        """The step's model request, whose step begins now."""
        recorder = self.recorder
        if self.observed:
            self.emit(StepStart(step=len(recorder.steps)))
        recorder.begin(len(context))
        answers = self.answers
        if answers is None:
            return ModelRequest(
                messages=context, tools=self.specs, max_tokens=self.agent.max_tokens
            )
        return answers.spec.request(context, self.specs, self.agent.max_tokens)

    def _checked(self, response: ModelResponse) -> ModelResponse:
        """The model's answer, its text made safe and each call with an id of its own;
        its text kept (the last useful text) and shown when it came in one piece."""
        if not response.text.isascii() or (
            response.tool_calls and not _ascii_arguments(response.tool_calls)
        ):
            response = _safe_response(response)
        if response.text:
            self.last_text = response.text
            if self.recorder.sink is None and self.observed:  # it came in one piece
                self.emit(ModelText(text=response.text, step=len(self.recorder.steps)))
        calls = response.tool_calls
        if calls and not self.tools.ids_unique(calls):
            response = msgspec.structs.replace(response, tool_calls=self.tools.unique(calls))
        return response

    def _reply(
        self, response: ModelResponse, usage: Usage, input_messages: int, model_seconds: float
    ) -> tuple[Message, ...] | None:
        """A step with no tool calls, recorded: None when the steps end (its text is
        the answer, or the model stopped without one), else the messages that go
        back to the model (a typed answer that was wrong, and what was wrong)."""
        answers = self.answers
        if answers is not None:
            said = answers.reply(response, usage, input_messages, model_seconds)
            if said is None:
                self._conclude(answers)
            return said
        self.recorder.record(input_messages, response, usage, (), model_seconds, 0.0)
        if response.text or response.parts:
            self.final_text = response.text
            self.final_parts = response.parts
            self._stop("completed", "final answer")
        else:
            self._stop("completed", f"the model stopped ({response.finish_reason}) without text")
        return None

    def _conclude(self, answers: Answers) -> None:
        """The typed answer ends the execution: taken, or failed past its corrections."""
        if answers.failure:
            self._stop("failed", answers.failure)
        else:
            self.final_text = answers.text
            self._stop("completed", "final answer")

    def _asked(
        self, response: ModelResponse, usage: Usage, model_seconds: float
    ) -> AssistantMessage:
        """The step's tool calls join the buffer (text that comes with them is trace,
        never the answer), and their step is in flight from now."""
        asked = AssistantMessage(content=response.text, tool_calls=response.tool_calls)
        self.buffer.append(asked)
        self.recorder.step_asked = (response, usage, model_seconds, time.perf_counter())
        return asked

    def _direct(self, calls: tuple[ToolCall, ...]) -> Direct | ToolOutcome | None:
        """For the usual step (one call of a tool, no typed answer or earlier result
        for it), what ``ToolRunner.direct`` says: the tool to await here, charged,
        with its arguments, or the outcome that answers the call at once; None for
        any other step, whose calls run through ``_outcomes``.

        A fast path that pays: W2 per step at S = 50 is about 5 % slower without it
        (16.5 against 15.6 us a step); ``tests/actors/execution/test_direct_calls.py``
        checks it gives what ``_outcomes`` gives, call for call."""
        if len(calls) != 1:
            return None
        answers = self.answers
        if answers is not None and answers.in_calls(calls):
            return None
        reuse = self.reuse
        if reuse is not None and reusable(reuse, calls):
            return None
        tools = self.tools
        if calls[0].name in tools.subagents:
            return None
        self.recorder.step_outcomes = None  # the usual step: no task group
        return tools.direct(calls[0])

    async def _outcomes(self, calls: tuple[ToolCall, ...]) -> list[ToolOutcome]:
        """The outcomes of a step's tool calls (but those ``_direct`` answers): a
        typed answer among them, earlier attempts' results, one call, or several
        run concurrently (subagents among them)."""
        recorder = self.recorder
        tools = self.tools
        answers = self.answers
        if answers is not None and answers.in_calls(calls):
            return await answers.answer_calls(calls, tools.run_tools)
        reuse = self.reuse
        if reuse is not None and reusable(reuse, calls):
            outcomes = recorder.step_outcomes = [NOT_RUN] * len(calls)
            emit = recorder.emit if recorder.observed else None
            await run_reusing(reuse, calls, outcomes, tools.run_tools, emit)
            return outcomes
        if len(calls) == 1 and calls[0].name not in tools.subagents:
            recorder.step_outcomes = None  # the usual step: no task group
            return [await tools.run_call(calls[0])]
        outcomes = recorder.step_outcomes = [NOT_RUN] * len(calls)
        await tools.run_tools(calls, outcomes)
        return outcomes

    def _results(
        self,
        context: tuple[Message, ...],
        asked: AssistantMessage,
        outcomes: Sequence[ToolOutcome],
    ) -> tuple[Message, ...] | None:
        """The step's tool results join the buffer and the step is recorded: what the
        model sees at the next step, or None when the steps end here (a typed answer,
        a subagent that escalated its failure, the agent's stop condition)."""
        recorder = self.recorder
        step = recorder.step_asked
        assert step is not None  # set by ``_asked``
        response, usage, model_seconds, began = step
        tools_seconds = time.perf_counter() - began
        if len(outcomes) == 1:  # the usual step: no generator, no list built
            if outcomes[0].parts:
                outcomes = self._within_limits(outcomes)
            results: tuple[ToolResultMessage, ...] = (_result_message(outcomes[0]),)
        else:
            if any(outcome.parts for outcome in outcomes):
                outcomes = self._within_limits(outcomes)
            results = tuple(map(_result_message, outcomes))
        buffer = self.buffer
        buffer.extend(results)
        record = recorder.record(
            len(context), response, usage, outcomes, model_seconds, tools_seconds
        )
        answers = self.answers
        if answers is not None and answers.concluded:
            self._conclude(answers)
            return None
        if self.tools.escalation:
            self._stop("failed", self.tools.escalation)
            return None
        stop_when = self.agent.stop_when
        if stop_when is not None and stop_when(record):
            self._stop("completed", "the agent's stop condition was met")
            return None
        if len(results) == 1:  # (one copy, not two)
            context = context + (asked, results[0])  # noqa: RUF005
        else:
            context = context + (asked, *results)  # noqa: RUF005
        memory = self.agent.memory
        clearing = memory.clear_results if memory is not None else None
        if clearing is not None and (done := clear_results(buffer, clearing, self.cleared)):
            context, self.cleared = context[: len(context) - len(buffer)] + tuple(buffer), done
        return context

    def _within_limits(self, outcomes: Sequence[ToolOutcome]) -> list[ToolOutcome]:
        """Leave out the parts of tool results that would take the requests of this
        execution past the agent's ``content_limits.request`` (the bytes of every
        image and document in its context), each result saying what was left out:
        nothing over the limit is ever sent. Returns the outcomes in a list: the
        list given, changed in place (the step's outcomes in flight), or one made
        of the outcome the usual step gives."""
        if not isinstance(outcomes, list):
            outcomes = list(outcomes)
        limit = self.agent.content_limits.request
        if limit is None:
            return outcomes
        total = sum(part.size for part in parts_in(self.history, self.buffer))
        for index, outcome in enumerate(outcomes):
            size = sum(part.size for part in outcome.parts)
            if not size:
                continue
            if total + size <= limit:
                total += size
                continue
            left_out = " ".join(describe_part(part) for part in outcome.parts)
            note = (
                f"[left out: {left_out}: with them the request would carry "
                f"{size_text(total + size)} of images and documents, more than the "
                f"{size_text(limit)} allowed (content_limits.request)]"
            )
            content = f"{outcome.content}\n{note}" if outcome.content else note
            outcomes[index] = msgspec.structs.replace(outcome, content=content, parts=())
        return outcomes

    # -- what it says of itself ----------------------------------------------------------

    def all_steps(self) -> list[StepRecord]:
        """The steps recorded, then the step that was in flight when the execution
        stopped, if one was, marked as interrupted."""
        return self.recorder.all_steps(self.reason, self.ended)

    def answer(self, steps: list[StepRecord] | None = None) -> str:
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
        answers = self.answers
        recorder = self.recorder
        return Result(
            text=text,
            status=self.status,
            stop_reason=self.reason,
            usage=self.usage,
            agent_id=self.agent_id,
            execution_id=self.execution_id,
            steps=len(recorder.steps) + (1 if recorder.step_began else 0),
            output=answers.value if answers is not None and self.status == "completed" else None,
            parts=self.final_parts if self.status == "completed" else (),
        )

    def progress(self, *, queued: int, turns: int) -> Progress:
        """A snapshot of this execution as it runs (see ``AgentActor.control``)."""
        node = self.node
        recorder = self.recorder
        summarizer = self.summarizer
        calls = recorder.in_flight()
        phase: Literal["summary", "model", "tools"] = "model"
        in_flight: tuple[ToolCall, ...] = ()
        if summarizer is not None and summarizer.record is None:
            phase = "summary"  # its compaction's request is out
        elif calls is not None:
            phase, in_flight = "tools", calls
        return Progress(
            agent_id=self.agent_id,
            running=True,
            execution_id=self.execution_id,
            task=self.task,
            attempt=self.attempt,
            steps=tuple(recorder.steps),
            phase=phase,
            in_flight=in_flight,
            streamed="".join(recorder.streamed) if phase == "model" else "",
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
        """The trace of this ended execution, with its final response (built once;
        its links again if an attempt of its parent has been renamed meanwhile)."""
        built = self.built
        parent_id = self._parent_link()
        attempt_of = "" if self.execution_id == self.node.id else self.node.id
        if built is None:
            steps = self.all_steps()
            summarizer = self.summarizer
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
                summarization=summarizer.record if summarizer is not None else None,
                digest=self.digested,
                resumed=self.resumed,
                task_parts=self.task_parts,
                parts=self.final_parts if self.status == "completed" else (),
                started=self.started_at,
            )
        elif built.parent_id != parent_id or built.execution_id != self.execution_id:
            built = self.built = msgspec.structs.replace(
                built, parent_id=parent_id, execution_id=self.execution_id, attempt_of=attempt_of
            )
        return built

    def _parent_link(self) -> str:
        """The execution that delegated this one: its parent node's, or when that
        node's task was attempted again since, the attempt that delegated it."""
        parent = self.node.parent
        if parent is None or parent.parent is None:
            return ""
        if self.parent_attempt == parent.attempt:
            return parent.id
        return f"{parent.id}~{self.parent_attempt}"


def _result_message(outcome: ToolOutcome) -> ToolResultMessage:
    """The tool result the model reads for ``outcome``."""
    call = outcome.call
    return ToolResultMessage(
        call_id=call.id,
        name=call.name,
        content=outcome.content,
        is_error=outcome.is_error,
        parts=outcome.parts,
    )


def _ascii_arguments(calls: tuple[ToolCall, ...]) -> bool:
    if len(calls) == 1:  # the usual step: no generator
        return calls[0].arguments.isascii()
    return all(tool_call.arguments.isascii() for tool_call in calls)


def _safe_response(response: ModelResponse) -> ModelResponse:
    """A model's reply with its text made safe for every store and provider."""
    calls = tuple(
        c if c.arguments.isascii() else msgspec.structs.replace(c, arguments=safe_text(c.arguments))
        for c in response.tool_calls
    )
    return msgspec.structs.replace(response, text=safe_text(response.text), tool_calls=calls)
