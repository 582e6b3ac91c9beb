"""How an execution runs the tool calls of one step (``ToolRunner``, a part the
``Execution`` holds): each call with an id of its own (a model's slip repaired),
concurrently on a bounded number of workers, subagent calls as child
actors in the step's task group (``Delegation``), each call charged with the
supervisor first; with events when someone observes the tree, and without a frame
of its own when nobody does. A tool that learns how far along it is (an MCP server's
progress notifications) reports it through ``progress_reporter``: a ``tool_progress``
event of its call, between its ``tool_start`` and its ``tool_end``.
"""

from __future__ import annotations

import contextvars
import functools
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from fractor.runtime import ActorContext, BudgetExceeded
from fractor.runtime.lowlevel import TOOL_LANE

from .._messages import Message, ToolCall, ToolOutcome, parts_in
from .._observation._events import (
    ApprovalAsked,
    ApprovalDecision,
    ToolEnd,
    ToolProgress,
    ToolStart,
)
from .._parts import describe_part
from .._requests._rate import wait_for_rate
from .._tools._approval import approvals_of
from ._delegation import Delegation, refused

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._agent._definition import AgentDefinition
    from .._tools._tool import Tool
    from .._tools._toolbox import Toolbox
    from ._children import NewActor
    from ._recording import Emit, Recorder

    #: A call the step awaits itself (``ToolRunner.direct``): the tool, its arguments
    #: by position and by keyword (None: none), and when the call began.
    Direct = tuple[Tool[..., Any], tuple[Any, ...], dict[str, Any] | None, float]

__all__ = ["Interrupted", "ProgressReporter", "ToolRunner", "progress_reporter"]

#: Reports a tool call's progress: ``(progress, total or None, message)``.
ProgressReporter = Callable[[float, float | None, str], None]

#: The reporter of the tool call running in this task, while someone observes it.
_reporter: contextvars.ContextVar[ProgressReporter | None] = contextvars.ContextVar(
    "fractor_tool_progress", default=None
)


def progress_reporter() -> ProgressReporter | None:
    """How the tool call running in this task reports its progress: a function of
    ``(progress, total, message)`` making a ``tool_progress`` event of the call, or
    None when nobody observes its execution (there is no one to tell). A tool takes
    it when it starts and may call it from any task of the event loop until it
    returns (not from a worker thread: events are not thread-safe)."""
    return _reporter.get()


class Interrupted(Exception):
    """A step's task group was cancelled by the supervisor (see ``ToolRunner.run_tools``)."""


class ToolRunner:
    """The tool calls of an execution's steps (see the module): a part the
    ``Execution`` holds, made from its agent's ``toolbox``, ``subagents``,
    ``concurrency`` bound and ``approve`` rule, the execution's ``recorder`` (its
    node, supervisor and events), its actor's ``context`` (to spawn children, and
    the runtime's approvals) and ``new_actor`` (the actor of a child run here:
    ``AgentActor``, handed down so that this module need not import it).

    ``escalation`` is set when a subagent that escalates failed: the execution then
    fails with it, after the step.
    """

    __slots__ = (
        "approve",
        "call_ids",
        "concurrency",
        "context",
        "direct_tools",
        "escalation",
        "new_actor",
        "node",
        "recorder",
        "subagents",
        "supervisor",
        "toolbox",
        "visible",
    )

    def __init__(
        self,
        toolbox: Toolbox,
        subagents: Mapping[str, AgentDefinition],
        concurrency: int,
        approve: Callable[[ToolCall], bool] | None,
        recorder: Recorder,
        context: ActorContext,
        new_actor: NewActor,
    ) -> None:
        self.toolbox = toolbox
        self.subagents = subagents
        self.concurrency = concurrency
        self.approve = approve
        self.recorder = recorder
        self.node = recorder.node
        self.supervisor = recorder.supervisor
        self.context = context
        self.new_actor = new_actor
        #: The tools a step may await itself (``direct``): the toolbox's, but those the
        #: runtime caps (``Runtime(tool_limits=...)``), whose calls wait for a slot
        #: in their lane first (``_run_call_capped``).
        direct = toolbox.direct
        capped = self.supervisor.rates.tools
        if capped and direct:
            direct = {name: found for name, found in direct.items() if name not in capped}
        self.direct_tools = direct
        #: The sections of the context the execution's model sees (its history and
        #: its buffer), whose images and documents a subagent call's task may name
        #: (``named_parts``); set by the execution.
        self.visible: tuple[Sequence[Message], ...] = ()
        #: The tool call ids of this execution so far (see ``unique``).
        self.call_ids: set[str] = set()
        self.escalation = ""

    def ids_unique(self, calls: tuple[ToolCall, ...]) -> bool:
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

    def unique(self, calls: tuple[ToolCall, ...]) -> tuple[ToolCall, ...]:
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

    async def run_tools(self, calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]) -> None:
        """Run every call of one step concurrently, each outcome at its call's index.

        Tool calls run on at most ``concurrency`` workers that share one iterator
        over them (taking the next call never awaits), so the bound costs no lock
        and no more tasks than it allows. A call waiting for a person's approval
        holds no worker while it waits (``_start_holding``). Subagent calls need no
        worker: each is a child actor in this step's task group (see
        ``Delegation``), at most ``concurrency`` of them at once.
        """
        subagents = self.subagents
        if subagents and any(call.name in subagents for call in calls):
            await self._run_with_subagents(calls, outcomes)
            return
        async with anyio.create_task_group() as tg:
            self._start_workers(tg, list(enumerate(calls)), outcomes)

    def _start_workers(
        self,
        tg: TaskGroup,
        calls: list[tuple[int, ToolCall]],
        outcomes: list[ToolOutcome],
    ) -> None:
        approve = self.approve
        if approve is not None:
            held = [(index, call) for index, call in calls if approve(call)]
            if held:
                self._start_holding(tg, calls, held, outcomes)
                return
        pending = iter(calls)
        run_call = self.run_call

        async def worker() -> None:
            for index, call in pending:
                outcomes[index] = await run_call(call)

        for _ in range(min(len(calls), self.concurrency)):
            tg.start_soon(worker)

    def _start_holding(
        self,
        tg: TaskGroup,
        calls: list[tuple[int, ToolCall]],
        held: list[tuple[int, ToolCall]],
        outcomes: list[ToolOutcome],
    ) -> None:
        """``_start_workers`` for a step some of whose calls (``held``) wait for a
        person: a wait for a person holds no worker. Each held call waits for its
        decision in a task of its own, and once approved takes one of the
        ``concurrency`` slots the other calls' workers take for each call they run
        (a step with approvals to wait for is never a hot path: one semaphore)."""
        slots = anyio.Semaphore(self.concurrency)
        run_now = self._run_call_now
        waiting = {index for index, _ in held}
        pending = iter([(index, call) for index, call in calls if index not in waiting])
        asked = iter(held)

        async def worker() -> None:
            for index, call in pending:
                async with slots:
                    outcomes[index] = await run_now(call)

        async def holder() -> None:
            # The first holder to run takes the first held call: the requests are
            # opened in the step's order, whatever order the tasks start in.
            index, call = next(asked)
            decided = await self._decision(call)
            if isinstance(decided, ToolOutcome):  # denied: it never runs
                outcomes[index] = decided
                return
            async with slots:
                outcome = await run_now(call)
            outcomes[index] = msgspec.structs.replace(outcome, approval="approved", waited=decided)

        for _ in held:
            tg.start_soon(holder)
        for _ in range(min(len(calls) - len(held), self.concurrency)):
            tg.start_soon(worker)

    async def _run_with_subagents(
        self, calls: tuple[ToolCall, ...], outcomes: list[ToolOutcome]
    ) -> None:
        subagents = self.subagents
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
                delegation = Delegation(
                    self.recorder,
                    self.context,
                    self.new_actor,
                    subagents,
                    self.concurrency,
                    tg,
                    delegated,
                    outcomes,
                    functools.partial(parts_in, *self.visible),
                )
                await delegation.run()
        finally:
            node.scope = outer
            if delegation is not None:
                if delegation.interrupted:
                    delegation.close_abandoned()
                self.escalation = self.escalation or delegation.escalation
        if tg.cancel_scope.cancelled_caught:
            raise Interrupted  # the supervisor stopped this node: the step ends here

    def direct(self, call: ToolCall) -> Direct | ToolOutcome | None:
        """For a tool the step may await itself (``Tool.direct``, and not capped by the
        runtime: see ``direct_tools``) when nothing observes the tree: the call
        charged and its arguments validated (by position, or by keyword: see
        ``Tool.call_arguments``), or the outcome that answers it at once (refused,
        invalid arguments); None for any other call."""
        tool = self.direct_tools.get(call.name)
        if tool is None or self.approve is not None or self.recorder.observed:
            return None
        try:
            if not self.supervisor.try_tool_call(self.node):
                return None  # leased elsewhere: ``run_call`` waits for the headroom
        except BudgetExceeded as exc:
            return refused(call, f"tool call refused: {exc}")
        start = time.perf_counter()
        arguments = tool.call_arguments(call, start)
        if isinstance(arguments, ToolOutcome):
            return arguments
        return tool, *arguments, start

    def run_call(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        """Charge and run one tool call (after a person's approval, if it needs one).
        Not a coroutine of its own when nothing observes the tree and no approval is
        needed: it hands back the tool's, one frame less per call."""
        approve = self.approve
        if approve is not None and approve(call):
            return self._run_call_approved(call)
        return self._run_call_now(call)

    async def _run_call_approved(self, call: ToolCall) -> ToolOutcome:
        """Hold ``call`` until a person decides (see ``_tools._approval``): run it approved,
        answer it denied. The wait ends with the execution, as any await does."""
        decided = await self._decision(call)
        if isinstance(decided, ToolOutcome):
            return decided
        outcome = await self._run_call_now(call)
        return msgspec.structs.replace(outcome, approval="approved", waited=decided)

    async def _decision(self, call: ToolCall) -> float | ToolOutcome:
        """Ask a person about ``call`` and wait for the decision: the seconds waited
        when it is approved, or the outcome that answers it denied (it never runs).
        Everything before the wait is done at once (the request is open when the
        first await begins)."""
        recorder = self.recorder
        approvals = approvals_of(self.context.runtime)
        forwarder = None
        if any(node.lender is not None for node in self.node.chain()):
            # A subtree run for another host's tree: ask through its top.
            forwarders = approvals.forwarders
            forwarder = next(
                (forwarders[node.id] for node in self.node.chain() if node.id in forwarders),
                None,
            )
            if forwarder is None:
                return ToolOutcome(
                    call=call,
                    content="[denied] this call needs a person's approval, which this "
                    "subtree on another host has no way to ask for",
                    is_error=True,
                    seconds=0.0,
                    attempts=0,
                    approval="denied: not available on another host",
                )
        request, pending = approvals.open(
            self.node, recorder.agent_name, recorder.agent_id, call, recorder.bus.now()
        )
        if forwarder is not None:
            forwarder.ask(request)
        if recorder.observed:
            recorder.emit(
                ApprovalAsked(
                    id=request.id,
                    tool=call.name,
                    call_id=call.id,
                    arguments=call.arguments[:200],
                    path=tuple(request.path),
                )
            )
        try:
            approved, reason, waited = await approvals.wait(pending)
        finally:
            if forwarder is not None and not pending.done.is_set():
                forwarder.withdraw(request.id)  # ended first: the driver forgets it
        if recorder.observed:
            recorder.emit(
                ApprovalDecision(
                    id=request.id,
                    tool=call.name,
                    call_id=call.id,
                    approved=approved,
                    reason=reason,
                    waited=waited,
                )
            )
        if not approved:
            said = f": {reason}" if reason else ""
            return ToolOutcome(
                call=call,
                content=f"[denied] a person denied this call{said}",
                is_error=True,
                seconds=waited,
                attempts=0,
                approval=f"denied{said}",
                waited=waited,
                # It never ran: its bar is its wait for the decision.
                started=time.perf_counter() - waited - recorder.origin,
            )
        return waited

    def _run_call_now(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        """Charge and run one tool call (see ``run_call``)."""
        tools = self.supervisor.rates.tools
        if tools and call.name in tools:
            return self._run_call_capped(call)
        return self._run_call_charged(call)

    async def _run_call_capped(self, call: ToolCall) -> ToolOutcome:
        """A call of a tool the runtime caps (``Runtime(tool_limits=...)``): it waits
        for a slot among the tool's calls in flight in the whole runtime (in line,
        never dropped, holding nothing of the budget), then is charged and run."""
        rates = self.supervisor.rates
        lane = rates.lane(TOOL_LANE + call.name)
        taken = rates.try_acquire(lane, 0, 0)
        if taken is None:
            taken = await wait_for_rate(self.recorder, lane, 0, 0, shown=False)
        try:
            return await self._run_call_charged(call)
        finally:
            rates.settle(taken, 0, 0)

    def _run_call_charged(self, call: ToolCall) -> Awaitable[ToolOutcome]:
        try:
            if not self.supervisor.try_tool_call(self.node):
                return self._run_call_held_up(call)  # leased elsewhere: wait for it
        except BudgetExceeded as exc:
            return _ready(refused(call, f"tool call refused: {exc}"))
        if not self.recorder.observed:
            return self.toolbox.run(call)
        return self._run_call_observed(call)

    async def _run_call_held_up(self, call: ToolCall) -> ToolOutcome:
        """A call whose charge waits for headroom leased to a subtree elsewhere."""
        try:
            await self.supervisor.charge_waiting(self.node, tool_calls=1)
        except BudgetExceeded as exc:
            return refused(call, f"tool call refused: {exc}")
        if not self.recorder.observed:
            return await self.toolbox.run(call)
        return await self._run_call_observed(call)

    async def _run_call_observed(self, call: ToolCall) -> ToolOutcome:
        emit = self.recorder.emit
        emit(ToolStart(tool=call.name, call_id=call.id, arguments=call.arguments[:200]))
        reporting = _reporter.set(functools.partial(_report_progress, emit, call))
        try:
            outcome = await self.toolbox.run(call)
        finally:
            _reporter.reset(reporting)
        emit(
            ToolEnd(
                tool=call.name,
                call_id=call.id,
                is_error=outcome.is_error,
                seconds=outcome.seconds,
                result=outcome.content[:200],
                parts=tuple(map(describe_part, outcome.parts)),
            )
        )
        return outcome


async def _ready(outcome: ToolOutcome) -> ToolOutcome:
    return outcome


def _report_progress(
    emit: Emit, call: ToolCall, progress: float, total: float | None, message: str
) -> None:
    emit(
        ToolProgress(
            tool=call.name, call_id=call.id, progress=progress, total=total, message=message[:200]
        )
    )
