"""The subagent calls of one step: each a child actor whose one ``Result`` comes back as
the call's tool result (DESIGN.md section 1, "Subagents").

A parent execution's tool runner hands the subagent calls of a step to a
``Delegation``: it opens each child's node in the supervisor's tree, spawns the
child with ``spawn_soon`` in the step's task group (the actor of its definition,
which the agent's actor hands down: a ``NewActor``; or a host's ``Placement``
launches it, see ``actors._execution._children``) and parks until the children have answered.
Only final responses come back; a child's internals never reach its parent.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING

import msgspec

from fractor.runtime import ActorContext, BudgetExceeded, Node
from fractor.runtime.lowlevel import Waiter, new_waiter, park, wake

from .._messages import Result, Task, ToolCall, ToolOutcome, exception_text
from .._observation._events import Spawn
from .._parts import ContentError, Media, named_parts
from ._children import HostUnavailable, placer_of

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from .._agent._definition import AgentDefinition
    from ._children import ChildReply, NewActor
    from ._recording import Recorder

__all__ = ["Delegation", "refused"]


class Delegation:
    """The subagent calls of one step: each one a child actor, and no task of ours.

    A call opens the child's node in the supervisor's tree (its budget is checked
    there), spawns the child in the step's task group with ``spawn_soon``, queues
    its task and closes its mailbox at once (the task is its only message: it
    answers, then stops). Its reply settles through a callback that records the
    outcome; the parent's task parks once and is woken when every child has
    answered or a slot frees for a call still waiting (at most ``tool_concurrency``
    children run at once). Only final responses come back. The parts a task names
    (see ``_parts.named_parts``) are checked against the child's own
    ``content_limits`` first: a call handing a child more than it takes is refused
    before the child starts, saying which limit.

    If the step is interrupted, the task group cancels the children; ``run`` then
    marks the nodes of those that have not answered with the parent's reason (no
    second cancellation: one delivery from the top reached the whole subtree).
    """

    __slots__ = (
        "context",
        "escalation",
        "interrupted",
        "limit",
        "new_actor",
        "node",
        "outcomes",
        "pending",
        "recorder",
        "running",
        "stopped",
        "subagents",
        "supervisor",
        "task_group",
        "visible",
        "waiter",
    )

    def __init__(
        self,
        recorder: Recorder,
        context: ActorContext,
        new_actor: NewActor,
        subagents: Mapping[str, AgentDefinition],
        limit: int,
        task_group: TaskGroup,
        calls: list[tuple[int, ToolCall]],
        outcomes: list[ToolOutcome],
        visible: Callable[[], Iterable[Media]] | None = None,
    ) -> None:
        #: The parent execution's records (its node, supervisor and events), its
        #: actor's context (which spawns the children) and the actor of a child run
        #: here, its subagents by name, and how many children may run at once.
        self.recorder = recorder
        self.node = recorder.node
        self.supervisor = recorder.supervisor
        self.context = context
        self.new_actor = new_actor
        self.subagents = subagents
        self.limit = limit
        self.task_group = task_group
        self.pending = collections.deque(calls)
        self.outcomes = outcomes
        #: The parts of the parent's context, which a task may name (see ``_parts``).
        self.visible = visible
        self.running: dict[int, Node] = {}
        # Children that stopped without answering (failed to start, cancelled), with
        # why: their nodes are closed by ``run``, which knows whether the step goes on.
        self.stopped: list[tuple[Node, str]] = []
        self.waiter: Waiter | None = None
        #: Set once the step is interrupted: replies that settle later are not read.
        self.interrupted = False
        #: Why the parent fails after this step: a subagent that escalates failed.
        self.escalation = ""

    async def run(self) -> None:
        supervisor = self.supervisor
        limit = self.limit
        running = self.running
        try:
            while True:
                held_up = False
                while self.pending and len(running) < limit:
                    call = self.pending.popleft()
                    if not self._launch(*call):
                        # Its node waits for headroom leased to a subtree elsewhere.
                        self.pending.appendleft(call)
                        held_up = True
                        break
                while self.stopped:
                    node, reason = self.stopped.pop()
                    supervisor.close(node, "failed", reason)
                if not running and not held_up:
                    return
                self.waiter = new_waiter()
                if held_up:
                    supervisor.ledger.notify(self.waiter)
                await park(self.waiter)
                self.waiter = None
        except BaseException:
            # Interrupted: the task group cancels the children. Their subtrees are
            # marked with this execution's reason now, before they see the
            # cancellation (a stop of this node marked them already); each closes its
            # own node as it ends, and ``close_abandoned`` closes what did not run.
            self.interrupted = True
            status, reason = supervisor.why_stopped(self.node)
            for node in self.abandoned():
                if node.stop_status is None:
                    supervisor.stop_subtree(node, status, reason, cancel=False)
            raise

    def abandoned(self) -> list[Node]:
        return [*self.running.values(), *(node for node, _ in self.stopped)]

    def close_abandoned(self) -> None:
        """After an interrupted step: close the nodes of children that never ran."""
        supervisor = self.supervisor
        for node in self.abandoned():
            if node.status == "running":
                supervisor.close(node, *supervisor.why_stopped(node))

    def _launch(self, index: int, call: ToolCall) -> bool:
        """Start one child (or answer the call at once); False when its node must
        wait for headroom leased to a subtree elsewhere (nothing was started)."""
        subagent = self.subagents[call.name]
        try:
            task = _decode_task(call.arguments).task
        except (msgspec.ValidationError, msgspec.DecodeError) as exc:
            self.outcomes[index] = refused(
                call,
                f"invalid arguments for subagent {call.name!r}: {exc}. "
                'Expected arguments: {"task": "<what the subagent should do>"}',
            )
            return True
        parts = named_parts(task, self.visible()) if self.visible is not None else ()
        if parts:
            # The child's own limits, at its door (as ``AgentRef.ask`` checks a task's):
            # the parts are handed by reference, so this is their one check here.
            try:
                subagent.content_limits.check(parts, f"the task for subagent {call.name!r}")
            except ContentError as exc:
                self.outcomes[index] = refused(call, f"subagent {call.name!r} not started: {exc}")
                return True
        supervisor = self.supervisor
        parent = self.node
        try:
            opened = supervisor.try_open(parent, name=subagent.name, limits=subagent.budget)
        except BudgetExceeded as exc:
            self.outcomes[index] = refused(call, f"subagent {call.name!r} not started: {exc}")
            return True
        if opened is None:
            return False  # headroom leased to a subtree elsewhere: ``run`` waits for it
        node = opened
        node.actor_id = node.id  # the child actor takes its node's id
        began = time.perf_counter()
        recorder = self.recorder
        place = placer_of(self.context.runtime.hosts)  # None: everything runs here
        if place is not None:
            try:
                placement = place(parent, subagent, supervisor)
            except HostUnavailable as exc:
                supervisor.close(node, "failed", str(exc))
                self.outcomes[index] = refused(call, f"subagent {call.name!r} not started: {exc}")
                return True
            if placement is not None:
                try:
                    # The parts go as a keyword only when there are some: a placement
                    # written before parts existed still takes every text-only call.
                    if parts:
                        remote = placement.launch(
                            subagent, task, node, supervisor, self.task_group, parts=parts
                        )
                    else:
                        remote = placement.launch(subagent, task, node, supervisor, self.task_group)
                except Exception as exc:
                    reason = f"not started on host {placement.host!r}: {exception_text(exc)}"
                    supervisor.close(node, "failed", reason)
                    self.outcomes[index] = refused(call, f"subagent {call.name!r} {reason}")
                    return True
                if recorder.observed:
                    recorder.emit(
                        Spawn(
                            child=subagent.name,
                            child_id=node.id,
                            call_id=call.id,
                            task=task[:200],
                            host=placement.host,
                        )
                    )
                self.running[index] = node
                remote.add_done_callback(
                    functools.partial(self._answered, index, call, subagent, node, began)
                )
                return True
        try:
            child = self.context.spawn_soon(
                self.new_actor(subagent), task_group=self.task_group, id=node.id, name=subagent.name
            )
            reply = child.ask_nowait(Task(text=task, node=node.id, parts=parts))
            child.stop_nowait()  # the task is its only message
        except Exception as exc:
            supervisor.close(node, "failed", exception_text(exc))
            self.outcomes[index] = refused(
                call, f"subagent {call.name!r} failed: {exception_text(exc)}"
            )
            return True
        if recorder.observed:
            recorder.emit(
                Spawn(child=subagent.name, child_id=node.id, call_id=call.id, task=task[:200])
            )
        self.running[index] = node
        reply.add_done_callback(
            functools.partial(self._answered, index, call, subagent, node, began)
        )
        return True

    def _answered(
        self,
        index: int,
        call: ToolCall,
        subagent: AgentDefinition,
        node: Node,
        began: float,
        reply: ChildReply,
    ) -> None:
        """The child's reply (or its stop) has settled: record the outcome."""
        if self.interrupted:
            return  # nobody reads the outcomes of an interrupted step
        del self.running[index]
        error = reply.error
        if error is not None and node.status != "running":
            # Its execution ended and its actor's task was cancelled (a stop of its
            # node alone, or of the tree): the node says how it ended.
            outcome = ToolOutcome(
                call=call,
                content=f"[{node.status}] subagent {call.name!r} stopped before a final "
                f"answer: {node.stop_reason}",
                is_error=True,
                seconds=time.perf_counter() - began,
                interrupted=True,
                started=began - self.recorder.origin,
            )
        elif error is not None:
            # The child stopped before answering (it failed to start, say).
            self.stopped.append((node, exception_text(error)))
            outcome = refused(call, f"subagent {call.name!r} failed: {exception_text(error)}")
        else:
            result: Result = reply.result()
            if result.status == "failed" and subagent.escalate:
                self.escalation = (
                    f"subagent {call.name!r} failed and escalated: {result.stop_reason}"
                )
            outcome = ToolOutcome(
                call=call,
                content=result.text,
                is_error=result.status != "completed",
                seconds=time.perf_counter() - began,
                parts=result.parts,
                started=began - self.recorder.origin,
            )
        self.outcomes[index] = outcome
        if self.waiter is not None and (not self.running or self.pending):
            wake(self.waiter)


class _TaskArguments(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    task: str


_decode_task = msgspec.json.Decoder(_TaskArguments).decode


def refused(call: ToolCall, content: str) -> ToolOutcome:
    """The error outcome of a call that never ran (refused, invalid, not started)."""
    return ToolOutcome(call=call, content=content, is_error=True, seconds=0.0, attempts=0)
