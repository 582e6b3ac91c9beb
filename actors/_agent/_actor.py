"""``AgentActor``: an ``Agent`` definition running, one task at a time.

An agent actor owns its context sections: the system prompt (the agent's
instructions), a **summary** and a **buffer** section (room for compaction of old
turns), the persistent **messages** (user turns and final answers only) and the
ephemeral **execution buffer**. It handles one task at a time; each task is one
``Execution``. Snapshots of the conversation and the traces are asked through the
mailbox like everything else (``actors._agent._ref``): nobody reaches into the
actor's state. With a store, the runtime keeps the traces of every top-level
execution (its subtree's included) and, for a top-level agent with an id of its own,
the persistent sections (``actors._agent._persistence``).

The runtime owns the models its agents use (``models_of``): each is closed when the
runtime exits, after every actor ended (``Runtime.close_on_exit``); a provider's
client never outlives the event loop it was made in.
"""

from __future__ import annotations

from collections.abc import Coroutine, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast

import anyio
import structlog

from fractor.runtime import (
    Actor,
    Budget,
    BudgetExceeded,
    Node,
    Price,
    Record,
    Store,
    StoreError,
    Usage,
)

from .._blobs import (
    attach_messages,
    attach_trace,
    detach_messages,
    keeps_blobs,
    load_blobs,
    stored_keys,
)
from .._execution._execution import Execution
from .._memory._digest import completed, digest, resumable
from .._memory._summarizer import Fold, Tally, summary_section
from .._messages import (
    Conversation,
    DigestMessage,
    ExecutionTrace,
    Message,
    Progress,
    Result,
    SystemMessage,
    Task,
    UserMessage,
    exception_text,
)
from .._models._fallback import FallbackModel
from .._observation._events import Refused, Restart
from .._observation._stream import withdrawn
from .._observation._subtree import subtree, with_traces, with_watch
from .._observation._traces import TRACE_KIND, trace_from_record, trace_record
from .._tools._approval import approvals_of
from .._tools._toolbox import ToolsUnavailable
from ._definition import AgentDefinition, with_toolsets
from ._persistence import AgentState, decode_state, encode_state
from ._ref import Decide, GetApprovals, GetConversation, GetProgress, GetTrace

if TYPE_CHECKING:
    from fractor.runtime import BlobStore

    from .._models._protocol import Model

__all__ = ["AgentActor"]

#: How long saving an execution to the store may take (shielded from cancellation).
SAVE_TIMEOUT = 10.0

log = structlog.get_logger("fractor.actors")


class AgentActor(Actor):
    """The running agent: owns its conversation, execution buffer and traces."""

    accepts = (Task, GetConversation, GetTrace)
    controls = (GetProgress, GetApprovals, Decide)

    def __init__(self, agent: AgentDefinition) -> None:
        self.agent = agent
        self.mailbox_size = agent.mailbox_size
        # Subagents run in a task group of the step that calls them (spawn_soon), not
        # in one of the actor's own: it needs none.
        self.spawns_children = False
        self.system = agent.instructions
        self.summary: list[Message] = []
        self.buffer: list[Message] = []
        self.messages: list[Message] = []
        #: How many turns (user/answer pairs) the summary covers (see ``_memory._summarizer``),
        #: and the conversation's estimated tokens, for an agent that compacts.
        self.summarized = 0
        self.tally = Tally() if agent.memory is not None else None
        self.execution: list[Message] = []
        # Plain lists, not deques: an idle agent's footprint counts (10,000 of them).
        self.traces: list[ExecutionTrace] = []
        self.restarts: list[float] = []
        #: Whether this agent keeps its state in the runtime's store (set on start).
        self.persistent = False
        #: Saves to the store that failed (each one logged as a warning).
        self.store_failures = 0
        # Trace records whose save failed, a group per execution (with its subtree's):
        # retried with the next save.
        self._unsaved: list[list[Record]] = []
        #: The blobs (images, documents) the unsaved traces refer to.
        self._unsaved_blobs: dict[str, bytes] = {}
        #: The execution running now, if one is (read by ``control``).
        self.running: Execution | None = None

    async def on_start(self) -> None:
        """Resume the persistent sections from the runtime's store, if it has them.

        Only a top-level agent with an id of its own keeps a state (see
        ``actors._agent._persistence``). A stored state that cannot be read fails the spawn
        with ``StoreError``: starting over would overwrite it at the next save. A cost
        limit over models with no price fails it too, before any request. The
        agent's toolsets (``Toolset``: an MCP server's tools) are resolved first; one
        that cannot list its tools now (``ToolsUnavailable``) does not fail the spawn:
        each execution lists them again first (``_unlisted``).
        """
        context = self.context
        if self.agent.toolsets:
            await self._list_tools()
        budget = context.runtime.budget
        _check_prices(self.agent, context.runtime.supervisor.prices, budget)
        for model in models_of(self.agent):  # the runtime closes them as it exits
            context.runtime.close_on_exit(model)
        store = context.runtime.store
        self.persistent = store is not None and context.parent_id is None and context.named
        if store is None or not self.persistent:
            return
        data = await store.load(context.id)
        if data is not None:
            state = decode_state(data, store=repr(store), actor_id=context.id)
            summary, buffer, messages = state.summary, state.buffer, state.messages
            keys = stored_keys((*summary, *buffer, *messages))
            if keys:  # its images and documents: their bytes from the store's blobs
                blobs = await load_blobs(store, keys)
                summary = attach_messages(summary, blobs)
                buffer = attach_messages(buffer, blobs)
                messages = attach_messages(messages, blobs)
            self.summary[:] = summary
            self.buffer[:] = buffer
            self.messages[:] = messages
            self.summarized = state.summarized

    async def _list_tools(self) -> str:
        """Resolve the agent's toolsets: "", or why their tools cannot be listed now
        (they stay unresolved, and are listed again at the next execution)."""
        try:
            self.agent = await with_toolsets(self.agent, self.context.runtime)
        except ToolsUnavailable as exc:
            log.warning("tools_unavailable", agent_id=self.context.id, error=str(exc))
            return str(exc)
        return ""

    async def _unlisted(self, task: Task) -> Result | None:
        """Before an execution, the toolsets the spawn could not list, listed again:
        None once they are; else the task's answer, ``failed`` with the reason (its
        node, a parent's, closed so), kept out of the conversation."""
        reason = await self._list_tools()
        if not reason:
            return None
        if task.node:
            supervisor = self.context.runtime.supervisor
            supervisor.close(supervisor.get(task.node), "failed", reason)
        return Result(
            text=f"[failed] The task was not started: {reason}.",
            status="failed",
            stop_reason=reason,
            usage=Usage(),
            agent_id=self.context.id,
        )

    def receive(self, message: Task | GetConversation | GetTrace) -> Coroutine[Any, Any, Any]:
        """Handle one message. Not a coroutine of its own: a task hands back
        ``execute``'s, one frame less for every agent a cancellation unwinds."""
        if isinstance(message, Task):
            if message.node and not self.agent.restart.max_restarts and not self.agent.toolsets:
                return self._delegated(message).run()
            return self.execute(message)
        return self._look(message)

    def control(self, message: GetProgress | GetApprovals | Decide) -> Any:
        """Answered past the mailbox: what this agent is doing now
        (``AgentRef.progress``), which calls of its tree wait for approval, and the
        decisions on them (``AgentRef.approvals``, ``approve``, ``deny``)."""
        context = self.context
        if isinstance(message, GetApprovals):
            return approvals_of(context.runtime).pending(context.id)
        if isinstance(message, Decide):
            approvals_of(context.runtime).decide(
                message.id, context.id, approved=message.approved, reason=message.reason
            )
            return None
        execution = self.running
        queued = context.statistics().queued
        turns = len(self.messages)
        if execution is None:
            return Progress(
                agent_id=context.id, running=False, queued=queued, conversation_turns=turns
            )
        return execution.progress(queued=queued, turns=turns)

    async def _look(self, message: GetConversation | GetTrace) -> Any:
        if isinstance(message, GetConversation):
            return self.snapshot()
        return tuple(self.traces)

    def snapshot(self) -> Conversation:
        return Conversation(
            system=self.system,
            summary=tuple(self.summary),
            buffer=tuple(self.buffer),
            messages=tuple(self.messages),
            execution=tuple(self.execution),
            summarized=self.summarized,
        )

    def _delegated(self, task: Task) -> Execution:
        """The execution of a subagent call (its node opened by the parent): one that
        ends itself (``Execution.run``), this actor's only task."""
        node = self.context.runtime.supervisor.get(task.node)
        node.actor_id = self.context.id
        execution = self.running = self._new_execution(
            node, task, self._history(task), ends_itself=True
        )
        return execution

    def _history(self, task: Task) -> tuple[Message, ...]:
        """The conversation with ``task`` as its new user turn, and everything the model
        sees before it: the context of the execution that answers it."""
        self.messages.append(UserMessage(content=task.text, parts=task.parts))
        return self._sections()

    def _sections(self) -> tuple[Message, ...]:
        """Instructions, summary, buffer section and conversation, in that order."""
        head: tuple[Message, ...] = (SystemMessage(content=self.system),) if self.system else ()
        if head or self.summary or self.buffer:
            return (*head, *self.summary, *self.buffer, *self.messages)
        return tuple(self.messages)  # one copy, not a list and then a tuple

    def _compacted(self, fold: Fold, text: str) -> tuple[Message, ...]:
        """Fold the oldest turns into the summary (its summarization succeeded): the
        context of the execution from now on."""
        del self.messages[: 2 * fold.turns]
        if self.tally is not None:
            self.tally.restart()
        self.summarized = fold.covered + fold.turns
        self.summary[:] = [summary_section(text, self.summarized)]
        return self._sections()

    async def execute(self, task: Task) -> Result:
        if self.agent.toolsets and (unlisted := await self._unlisted(task)) is not None:
            return unlisted
        agent = self.agent
        context = self.context
        supervisor = context.runtime.supervisor
        watch = None
        if task.watch:  # a streamed ask: take its watcher, which says it is taken
            watch = context.runtime.event_bus.watchers.pop(task.watch, None)
            if watch is None:  # its consumer left before: it never starts
                return withdrawn(context.id)
        if task.budget is not None and task.budget.cost is not None:
            _check_prices(agent, supervisor.prices, task.budget)
        # Read before the node opens: nothing awaits between its opening and the
        # block that closes it on every path.
        behind = await self._resumed(task) if task.resume else ()
        if task.node:
            node = supervisor.get(task.node)  # opened by the parent that delegated
        else:
            budget = agent.budget.merge(task.budget) if agent.budget else task.budget
            try:
                opened = supervisor.try_open(supervisor.root, name=agent.name, limits=budget)
                if opened is None:  # headroom leased to subtrees on other hosts: wait
                    opened = await supervisor.open_waiting(
                        supervisor.root, name=agent.name, limits=budget
                    )
                node = opened
            except BudgetExceeded as exc:
                # Nothing ran: the turn joins neither the live nor the stored conversation.
                bus = context.runtime.event_bus
                if bus.active:
                    bus.emit(
                        Refused(reason=str(exc), caller=task.caller),
                        agent=agent.name,
                        agent_id=context.id,
                    )
                return self._refused(str(exc))
        memory = agent.memory
        fold = None
        if memory is not None and self.tally is not None:
            fold = memory.plan(self.messages, self.tally, task.text, self.summary, self.summarized)
        history = self._history(task)
        node.actor_id = context.id
        if watch is not None:
            with_watch(node, watch)
        store = context.runtime.store
        if store is not None and not task.node:
            with_traces(node, [])  # the subtree's executions leave themselves here
        execution = self.running = self._new_execution(
            node, task, history, fold=fold, behind=behind
        )
        resumed = execution.resumed = behind[-1].execution_id if behind else ""
        execution.caller = task.caller
        try:
            await execution.run()
            while execution.status == "failed" and self._may_restart():
                self.restarts.append(anyio.current_time())
                if execution.observed:  # subscribers, and a streamed ask's watcher
                    execution.emit(
                        Restart(
                            reason=execution.reason,
                            restarts=len(self.restarts),
                            digest=agent.restart.digest,
                        )
                    )
                # Every attempt's trace is kept and stored: the last one has the
                # node's id (the Result's), each earlier one an id of its own. Its
                # trace is built now, with the usage so far; it ends with the last
                # attempt (``Execution.end``).
                execution.execution_id = f"{node.id}~{execution.attempt}"
                trace = execution.final_trace()
                if agent.restart.digest:
                    behind = (*behind, trace)
                earlier = (*execution.earlier, execution)
                node.attempt = len(earlier) + 1
                execution = self.running = self._new_execution(  # fresh buffer
                    node, task, execution.history, behind=behind
                )
                execution.earlier = earlier
                execution.attempt = node.attempt
                execution.resumed = resumed
                await execution.run()
        except BaseException:
            # Cancelled: the execution ends all the same (invariant 2 holds on this
            # path too: for a top-level ask, the turn and its synthesized answer
            # join the conversation, the live one and the stored one alike).
            self.running = None
            execution.end(cancelled=True)
            if store is not None and not task.node:
                await self._save(store, execution)
            raise
        self.running = None
        result = execution.end()
        assert result is not None  # not cancelled: it has its answer
        if store is not None and not task.node:
            await self._save(store, execution)
        return result

    async def _save(self, store: Store, execution: Execution) -> None:
        """Save the persistent sections and the traces the tree of ``execution`` (a
        top-level one, ended) handed on to its node as its executions ended
        (``Execution.end``): its attempts and every execution of their subtree, in
        one transaction: no trace is stored without its parent's.

        Shielded: once an execution has ended, its turn is stored even if the actor
        is cancelled meanwhile, and a cancelled execution's turn and traces are
        stored as the actor ends. A failure never loses the ``Result``: it is logged
        as a warning and counted in ``store_failures``; the next save writes the
        whole state again and retries the traces that were not saved.
        """
        node = execution.node
        ended: list[Any] = subtree(node).traces or []
        with_traces(node, None)
        # The top's attempts, handed on last (after their subtree), are stored first.
        top = len(execution.earlier) + 1
        ordered = [*ended[-top:], *ended[:-top]]
        groups = self._unsaved
        # A store that keeps blobs gets each image's and document's bytes once.
        blobs = dict(self._unsaved_blobs) if keeps_blobs(store) else None
        try:  # encoding too: whatever fails, the Result is returned
            group = [trace_record(each.final_trace(), blobs) for each in ordered]
            groups = [*self._unsaved, group]
            records = [record for each in groups for record in each]
            state = None
            if self.persistent:
                summary, buffer, messages = (
                    tuple(self.summary),
                    tuple(self.buffer),
                    tuple(self.messages),
                )
                if blobs is not None:
                    summary = detach_messages(summary, blobs)
                    buffer = detach_messages(buffer, blobs)
                    messages = detach_messages(messages, blobs)
                state = encode_state(
                    AgentState(
                        summary=summary,
                        buffer=buffer,
                        messages=messages,
                        summarized=self.summarized,
                    )
                )
            with anyio.fail_after(SAVE_TIMEOUT, shield=True):
                if blobs:
                    await cast("BlobStore", store).save(
                        self.context.id, state, records=records, blobs=blobs
                    )
                else:
                    await store.save(self.context.id, state, records=records)
        except Exception as exc:
            self.store_failures += 1
            self._unsaved = groups[-self.agent.trace_limit :]
            self._unsaved_blobs = blobs or {}
            log.warning(
                "agent state not saved",
                agent_id=self.context.id,
                execution_id=execution.execution_id,
                store=repr(store),
                error=exception_text(exc),
                unsaved_traces=sum(len(each) for each in self._unsaved),
                failures=self.store_failures,
            )
        else:
            self._unsaved.clear()
            self._unsaved_blobs = {}
        finally:
            ended.clear()  # the subtree's nodes may outlive this: let go of them

    def _new_execution(
        self,
        node: Node,
        task: Task,
        history: tuple[Message, ...],
        *,
        ends_itself: bool = False,
        fold: Fold | None = None,
        behind: tuple[ExecutionTrace, ...] = (),
    ) -> Execution:
        context = self.context
        note: DigestMessage | None = None
        if behind:  # earlier attempts: their digest, and their completed calls
            note = digest(behind, task.text)
        return Execution(
            agent=self.agent,
            agent_id=context.id,
            node=node,
            supervisor=context.runtime.supervisor,
            task=task.text,
            task_parts=task.parts,
            history=history,
            buffer=self.execution,
            context=context,
            new_actor=AgentActor,
            conversation=self.messages,
            delegated=bool(task.node),
            ends_itself=ends_itself,
            kept=None if task.node else self.traces,
            fold=fold,
            compacted=self._compacted if fold is not None else None,
            digest=note,
            reuse=completed(behind) if behind else None,
        )

    async def _resumed(self, task: Task) -> tuple[ExecutionTrace, ...]:
        """The attempts of this agent's last execution, for an ask that resumes it
        (``resume=True``): empty if it completed. A persistent agent that has
        none in memory (a new process) reads them from the store."""
        traces: list[ExecutionTrace] | tuple[ExecutionTrace, ...] = self.traces
        store = self.context.runtime.store
        if not traces and self.persistent and store is not None:
            try:
                records = await store.records(actor_id=self.context.id, kind=TRACE_KIND, limit=50)
                traces = tuple(trace_from_record(record) for record in records)
                keys = stored_keys(traces=traces)
                if keys:  # what the traces' parts were, to send them again
                    blobs = await load_blobs(store, keys)
                    traces = tuple(attach_trace(trace, blobs) for trace in traces)
            except StoreError as exc:  # the task runs all the same, from scratch
                log.warning(
                    "the last execution could not be read to resume it",
                    agent_id=self.context.id,
                    store=repr(store),
                    error=exception_text(exc),
                )
                return ()
            traces = tuple(trace for trace in traces if not trace.parent_id)
        return resumable(traces)

    def _may_restart(self) -> bool:
        policy = self.agent.restart
        if policy.max_restarts == 0:
            return False
        now = anyio.current_time()
        self.restarts = [at for at in self.restarts if now - at <= policy.window]
        return len(self.restarts) < policy.max_restarts

    def _refused(self, reason: str) -> Result:
        """A task the supervisor would not start (depth or agents limit): its answer,
        kept out of the conversation (live and stored alike)."""
        text = f"[budget_exceeded] The task was not started: {reason}."
        return Result(
            text=text,
            status="budget_exceeded",
            stop_reason=reason,
            usage=Usage(),
            agent_id=self.context.id,
        )


def _check_prices(
    agent: AgentDefinition, prices: Mapping[str, Price], budget: Budget | None
) -> None:
    """Refuse a cost limit (``budget``'s or one in ``agent``'s tree) over a model with
    no price, naming the models: a cost cannot be counted, so it cannot be limited."""
    if not (budget is not None and budget.cost is not None) and not _limits_cost(agent):
        return
    missing = sorted({name for name in _priced_names(agent) if name not in prices})
    if missing:
        names = ", ".join(map(repr, missing))
        raise ValueError(
            f"a cost limit applies to agent {agent.name!r} but no price is known for model "
            f"{names}: pass Runtime(prices={{{missing[0]!r}: Price(...)}})"
        )


def _limits_cost(agent: AgentDefinition) -> bool:
    budget = agent.budget
    if budget is not None and budget.cost is not None:
        return True
    return any(_limits_cost(subagent) for subagent in agent.subagents)


def _priced_names(agent: AgentDefinition) -> Iterator[str]:
    """The names prices are looked up by, for every model in ``agent``'s tree (an
    adapter's requests are its inner model's, a fallback chain's each of its links')."""
    model = agent.model
    inner = getattr(model, "inner", None)
    if inner is not None:
        model = inner
    if isinstance(model, FallbackModel):
        yield from (link.name for link in model.models)
    else:
        yield model.name
    if agent.memory is not None and agent.memory.model is not None:
        yield agent.memory.model.name  # the summarizer
    for subagent in agent.subagents:
        yield from _priced_names(subagent)


# -- the models a runtime owns ------------------------------------------------------------


def models_of(agent: AgentDefinition) -> Iterator[Model]:
    """The models an agent's executions use: its own, its memory's summarizer, and
    the inner ones of adapters (``ReActModel``), outermost first. Its subagents'
    are theirs: each is handed over as its actor starts."""
    memory = agent.memory
    for model in (agent.model, memory.model if memory is not None else None):
        seen: set[int] = set()
        while model is not None and id(model) not in seen:
            seen.add(id(model))
            yield model
            model = getattr(model, "inner", None)
