"""``AgentRef``: the handle to a running agent, and the questions it asks.

``Runtime.spawn(agent)`` returns one (``Agent.make_ref``). Tasks go through the
agent's mailbox (``ask``, ``tell``, ``stream``); so do the snapshot questions
``GetConversation`` and ``GetTrace``, which queue behind the tasks sent before them.
``GetProgress`` is a control question, answered past the mailbox even while a task
runs (``progress``). A task's text and budget are checked here, before anything
reaches the agent.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from fractor.runtime import ActorRef, Budget, MailboxStatistics

from .._messages import Conversation, ExecutionTrace, Progress, Result, Task, safe_text
from .._observation._stream import AgentStream
from .._parts import Media, Part, split_content
from .._tools._approval import ApprovalRequest

if TYPE_CHECKING:
    from ._definition import AgentDefinition

#: What a task may be: text, or a list or tuple mixing text and parts (images,
#: documents: ``actors._parts``), or one part.
TaskContent = str | Part | Sequence[str | Part]

__all__ = ["AgentRef", "Decide", "GetApprovals", "GetConversation", "GetProgress", "GetTrace"]


class GetConversation(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent for a snapshot of its context sections."""


class GetTrace(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent for the traces of its recent executions."""


class GetProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent, past its mailbox, what it is doing now (a control question)."""


class GetApprovals(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent, past its mailbox, which tool calls of its tree wait for approval."""


class Decide(msgspec.Struct, frozen=True, kw_only=True):
    """Approve or deny a tool call of an agent's tree, past its mailbox."""

    id: str
    approved: bool
    reason: str = ""


class AgentRef:
    """The handle to a running agent."""

    __slots__ = ("_ref", "agent")

    def __init__(self, ref: ActorRef, agent: AgentDefinition) -> None:
        self._ref = ref
        self.agent = agent

    @property
    def id(self) -> str:
        return self._ref.id

    @property
    def actor(self) -> ActorRef:
        """The kernel reference underneath."""
        return self._ref

    def __repr__(self) -> str:
        return f"<AgentRef {self._ref.id!r} ({self.agent.name})>"

    async def ask(
        self, text: TaskContent, *, budget: Budget | None = None, resume: bool = False
    ) -> Result:
        """Give the agent a task and wait for its one ``Result``.

        ``text`` is a str, or a list (or tuple) mixing str and parts: images and
        documents (``fractor.Image``, ``fractor.Document``), checked against the
        agent's ``content_limits`` here, before anything reaches the agent. The
        text pieces join (a blank line between them) as the user message's
        content, the parts follow it in their order.

        ``resume=True`` picks up from the agent's last execution if it stopped before
        its answer (a limit, the deadline, a failure): the new execution reads a
        digest of what it did, and its completed tool calls are answered from their
        results instead of run again (nothing to pick up after a completed one).
        """
        result: Result = await self._ref.ask(self._handed(self._task(text, budget, resume)))
        return result

    async def tell(
        self, text: TaskContent, *, budget: Budget | None = None, resume: bool = False
    ) -> None:
        """Give the agent a task without waiting; its answer joins its conversation.
        ``text`` and ``resume``: as for ``ask``."""
        await self._ref.tell(self._handed(self._task(text, budget, resume)))

    def stream(
        self,
        text: TaskContent,
        *,
        budget: Budget | None = None,
        subagents: bool = False,
        buffer: int = 1_000,
        resume: bool = False,
    ) -> AgentStream:
        """Give the agent a task and watch it run: ``async with ref.stream(text) as
        run: async for event in run: ...``, then ``run.result`` (the ``Result`` that
        ``ask`` would return). Each event is the runtime's ``Event`` of this tree (as
        ``rt.events()`` gives it: match on ``event.detail``). ``subagents=True`` also
        streams what subagents do (their text, tool calls, waits), not only their
        start and finish. At most ``buffer`` events wait for a slow consumer (see
        ``actors._observation._stream``). Leaving the block before the answer stops
        the execution. ``resume``: as for ``ask``."""
        task = self._handed(self._task(text, budget, resume))
        return AgentStream(self._ref, task, subagents=subagents, buffer=buffer)

    def _task(self, text: TaskContent, budget: Budget | None, resume: bool) -> Task:
        """``_task``, with the parts checked against this agent's content limits."""
        task = _task(text, budget, resume)
        if task.parts:
            self.agent.content_limits.check(task.parts, f"the task for agent {self.id!r}")
        return task

    def _handed(self, task: Task) -> Task:
        """A task from outside is handed over: tell the observer that asked to know
        (``EventBus.on_task``), here in the caller's task, with the key the task
        carries from now on (``Task.caller``)."""
        on_task = self._ref.runtime.event_bus.on_task
        if on_task is None:
            return task
        key = f"task-{next(_keys)}"
        on_task(self._ref.id, key)
        return msgspec.structs.replace(task, caller=key)

    def progress(self) -> Progress:
        """What the agent is doing now, answered at once even while it runs a task
        (past the mailbox: see ``Progress``). ``conversation`` and ``trace`` queue
        behind the tasks sent before them; this never waits."""
        progress: Progress = self._ref.inspect(GetProgress())
        return progress

    def approvals(self) -> tuple[ApprovalRequest, ...]:
        """The tool calls of this agent's tree (its subagents' included) that wait for
        a person's approval, oldest first; at once, past the mailbox."""
        requests: tuple[ApprovalRequest, ...] = self._ref.inspect(GetApprovals())
        return requests

    def approve(self, request_id: str | ApprovalRequest) -> None:
        """Let a held tool call run (``approvals()`` lists them). ``ApprovalError`` if
        none with this id waits in this agent's tree."""
        self._ref.inspect(Decide(id=_request_id(request_id), approved=True))

    def deny(self, request_id: str | ApprovalRequest, reason: str = "") -> None:
        """Answer a held tool call without running it: its result, which the model
        reads, says a person denied it, and ``reason`` (text from outside: made safe
        here, as a task's is)."""
        if not isinstance(reason, str):
            raise TypeError(f"reason must be a str, got {type(reason).__qualname__}")
        decision = Decide(id=_request_id(request_id), approved=False, reason=safe_text(reason))
        self._ref.inspect(decision)

    async def conversation(self) -> Conversation:
        """A snapshot of the agent's context sections, asked through its mailbox."""
        snapshot: Conversation = await self._ref.ask(GetConversation())
        return snapshot

    async def trace(self) -> tuple[ExecutionTrace, ...]:
        """The traces of the agent's recent executions, oldest first."""
        traces: tuple[ExecutionTrace, ...] = await self._ref.ask(GetTrace())
        return traces

    async def stop(self, *, grace: float | None = None) -> None:
        await self._ref.stop(grace=grace)

    def cancel(self) -> None:
        self._ref.cancel()

    def statistics(self) -> MailboxStatistics:
        return self._ref.statistics()


#: The keys of tasks handed to agents while an observer wants to know (``_handed``).
_keys = itertools.count(1)


def _task(text: object, budget: Budget | None, resume: bool = False) -> Task:
    """The task to send, checked before anything reaches the agent."""
    parts: tuple[Media, ...] = ()
    if not isinstance(text, str):
        text, parts = split_content(text, "a task")
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a fractor.Budget or None, got {type(budget).__qualname__}")
    if not isinstance(resume, bool):
        raise TypeError(f"resume must be a bool, got {resume!r}")
    return Task(text=safe_text(text), budget=budget, resume=resume, parts=parts)


def _request_id(request_id: object) -> str:
    if isinstance(request_id, ApprovalRequest):
        return request_id.id
    if not isinstance(request_id, str):
        raise TypeError(
            f"an approval is named by its id (a str, or the ApprovalRequest), got {request_id!r}"
        )
    return request_id
