"""``Agent`` (an immutable definition), its actor, and ``AgentRef`` (the handle).

An agent actor owns its context sections: the system prompt (the agent's
instructions), a **summary** and a **buffer** section (room for compaction of old
turns), the persistent **messages** (user turns and final answers only) and the
ephemeral **execution buffer**. It handles one task at a time; each task is one
``Execution``. Snapshots of the conversation and the traces are asked through the
mailbox like everything else: nobody reaches into the actor's state.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import anyio
import msgspec
import structlog

from runtime import (
    Actor,
    ActorRef,
    Budget,
    BudgetExceeded,
    MailboxStatistics,
    Node,
    Price,
    Record,
    Store,
    Usage,
)
from runtime.lowlevel import HeldUp

from ._execution import Execution, StopCondition
from ._messages import (
    AssistantMessage,
    Conversation,
    ExecutionTrace,
    Message,
    Progress,
    Result,
    SystemMessage,
    Task,
    ToolSpec,
    UserMessage,
    exception_text,
    safe_text,
)
from ._models import Model
from ._persistence import AgentState, decode_state, encode_state, is_automatic_id
from ._policy import RestartPolicy, RetryPolicy
from ._streaming import AgentStream
from ._tools import Tool, Toolbox, tool
from ._traces import trace_record

__all__ = [
    "Agent",
    "AgentActor",
    "AgentRef",
    "GetConversation",
    "GetProgress",
    "GetTrace",
    "Task",
]

_NAME = re.compile(r"[a-zA-Z0-9_-]{1,64}")
#: How long saving an execution to the store may take (shielded from cancellation).
SAVE_TIMEOUT = 10.0

log = structlog.get_logger("fractor.actors")


class GetConversation(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent for a snapshot of its context sections."""


class GetTrace(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent for the traces of its recent executions."""


class GetProgress(msgspec.Struct, frozen=True, kw_only=True):
    """Ask an agent, past its mailbox, what it is doing now (a control question)."""


@dataclass(frozen=True, slots=True)
class Agent:
    """An immutable agent definition; ``Runtime.spawn`` turns it into a running actor.

    ``tools`` are ``@tool`` functions (a plain function is wrapped with ``tool``).
    ``subagents`` are other agents offered to the model as tools (name, description,
    one ``task`` argument); each call runs the subagent as a child actor and returns
    only its final response. ``budget`` limits each execution, descendants included.
    ``tool_concurrency`` bounds how many tool calls of one step run at once, and
    how many subagents (counted apart: a step may run that many of each).
    ``stop_when`` is called with each step's record after its tools ran; returning
    True ends the execution. ``max_tokens`` caps each model request's output (the
    supervisor may cap it lower). ``retry`` and ``restart`` are the supervision
    policies; ``escalate`` makes a failure of this agent, run as a subagent, fail its
    parent too. ``trace_limit`` is how many execution traces the actor keeps.
    ``host`` names a pool of the runtime's hosts (``Runtime(hosts=...)``): each
    execution of this agent as a subagent runs there, with its whole subtree (by
    default the runtime's placement decides: see ``actors._hosts``).
    """

    name: str
    model: Model
    tools: Sequence[Tool[..., Any] | Callable[..., Any]] = ()
    instructions: str = ""
    subagents: Sequence[Agent] = ()
    budget: Budget | None = None
    description: str = ""
    tool_concurrency: int = 256
    stop_when: StopCondition | None = None
    max_tokens: int | None = None
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
    escalate: bool = False
    mailbox_size: int = 16
    trace_limit: int = 100
    host: str | None = None
    toolbox: Toolbox = field(init=False, repr=False, compare=False)
    specs: tuple[ToolSpec, ...] = field(init=False, repr=False, compare=False)
    subagents_by_name: dict[str, Agent] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"Agent name must be 1 to 64 letters, digits, '_' or '-', got {self.name!r}"
            )
        if not callable(getattr(self.model, "request", None)):
            raise TypeError(
                f"Agent {self.name!r}: model must implement the Model protocol "
                f"(an async request() method), got {type(self.model).__qualname__}"
            )
        if self.budget is not None and not isinstance(self.budget, Budget):
            raise TypeError(f"Agent {self.name!r}: budget must be a runtime.Budget")
        for option in ("tool_concurrency", "mailbox_size", "trace_limit"):
            value = getattr(self, option)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"Agent {self.name!r}: {option} must be >= 1, got {value!r}")
        if self.host is not None and (not isinstance(self.host, str) or not self.host):
            raise ValueError(
                f"Agent {self.name!r}: host must name a pool of hosts, got {self.host!r}"
            )
        if self.max_tokens is not None and (
            not isinstance(self.max_tokens, int)
            or isinstance(self.max_tokens, bool)
            or self.max_tokens < 1
        ):
            raise ValueError(
                f"Agent {self.name!r}: max_tokens must be >= 1, got {self.max_tokens!r}"
            )
        self._check_types()
        tools = tuple(t if isinstance(t, Tool) else tool(t) for t in self.tools)
        toolbox = Toolbox(tools)
        subagents = tuple(self.subagents)
        by_name: dict[str, Agent] = {}
        for subagent in subagents:
            if not isinstance(subagent, Agent):
                raise TypeError(
                    f"Agent {self.name!r}: subagents are Agent definitions, "
                    f"got {type(subagent).__qualname__}"
                )
            if subagent.name in toolbox or subagent.name in by_name:
                raise ValueError(
                    f"Agent {self.name!r}: the name {subagent.name!r} is used twice among "
                    "its tools and subagents; the model tells them apart by name"
                )
            by_name[subagent.name] = subagent
        object.__setattr__(self, "tools", tools)
        object.__setattr__(self, "subagents", subagents)
        object.__setattr__(self, "toolbox", toolbox)
        object.__setattr__(self, "subagents_by_name", by_name)
        object.__setattr__(
            self, "specs", toolbox.specs + tuple(_subagent_spec(s) for s in subagents)
        )

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the arguments it was made with (for an agent shipped to another
        host, as Ray ships code): what ``__post_init__`` derives is derived again."""
        arguments = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return (_rebuilt_agent, (arguments,))

    def _check_types(self) -> None:
        """The options whose type alone can be wrong, each named with what it takes."""
        prefix = f"Agent {self.name!r}:"
        for option in ("instructions", "description"):
            value = getattr(self, option)
            if not isinstance(value, str):
                raise TypeError(f"{prefix} {option} must be a str, got {type(value).__qualname__}")
        if self.stop_when is not None and not callable(self.stop_when):
            raise TypeError(
                f"{prefix} stop_when must be a function of a step's record or None, "
                f"got {type(self.stop_when).__qualname__}"
            )
        for option, kind in (("retry", RetryPolicy), ("restart", RestartPolicy)):
            value = getattr(self, option)
            if not isinstance(value, kind):
                raise TypeError(
                    f"{prefix} {option} must be an actors.{kind.__name__}, "
                    f"got {type(value).__qualname__}"
                )
        if not isinstance(self.escalate, bool):
            raise TypeError(f"{prefix} escalate must be a bool, got {self.escalate!r}")
        for option in ("tools", "subagents"):
            value = getattr(self, option)
            if isinstance(value, str | Agent) or callable(value) or not isinstance(value, Iterable):
                raise TypeError(
                    f"{prefix} {option} must be a sequence (a list or a tuple), "
                    f"got {type(value).__qualname__}; write {option}=[...]"
                )

    # Spawnable
    def new_actor(self) -> AgentActor:
        return AgentActor(self)

    def make_ref(self, ref: ActorRef) -> AgentRef:
        return AgentRef(ref, self)


def _rebuilt_agent(arguments: dict[str, Any]) -> Agent:
    """An agent again, from what ``Agent.__reduce__`` kept."""
    return Agent(**arguments)


class AgentActor(Actor):
    """The running agent: owns its conversation, execution buffer and traces."""

    accepts = (Task, GetConversation, GetTrace)
    controls = (GetProgress,)

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.mailbox_size = agent.mailbox_size
        # Subagents run in a task group of the step that calls them (spawn_soon), not
        # in one of the actor's own: it needs none.
        self.spawns_children = False
        self.system = agent.instructions
        self.summary: list[Message] = []
        self.buffer: list[Message] = []
        self.messages: list[Message] = []
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
        #: The execution running now, if one is (read by ``control``).
        self.running: Execution | None = None

    async def on_start(self) -> None:
        """Resume the persistent sections from the runtime's store, if it has them.

        Only a top-level agent with an id of its own keeps a state (see
        ``actors._persistence``). A stored state that cannot be read fails the spawn
        with ``StoreError``: starting over would overwrite it at the next save. A cost
        limit over models with no price fails it too, before any request.
        """
        context = self.context
        budget = context.runtime.budget
        _check_prices(self.agent, context.runtime.supervisor.prices, budget)
        store = context.runtime.store
        self.persistent = (
            store is not None
            and context.parent_id is None
            and not is_automatic_id(context.id, context.name)
        )
        if store is None or not self.persistent:
            return
        data = await store.load(context.id)
        if data is not None:
            state = decode_state(data, store=repr(store), actor_id=context.id)
            self.summary[:] = state.summary
            self.buffer[:] = state.buffer
            self.messages[:] = state.messages

    def receive(self, message: Task | GetConversation | GetTrace) -> Coroutine[Any, Any, Any]:
        """Handle one message. Not a coroutine of its own: a task hands back
        ``execute``'s, one frame less for every agent a cancellation unwinds."""
        if isinstance(message, Task):
            if message.node and not self.agent.restart.max_restarts:
                return self._delegated(message).start()
            return self.execute(message)
        return self._look(message)

    def control(self, message: GetProgress) -> Progress:
        """What this agent is doing now, answered past the mailbox (``AgentRef.progress``)."""
        context = self.context
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
        )

    def _delegated(self, task: Task) -> Execution:
        """The execution of a subagent call (its node opened by the parent): one that
        ends itself (``Execution.run``), this actor's only task."""
        self.execution.clear()
        node = self.context.runtime.supervisor.get(task.node)
        node.actor_id = self.context.id
        execution = self.running = self._new_execution(
            node, task, self._history(task), conversation=self.messages
        )
        return execution

    def _history(self, task: Task) -> tuple[Message, ...]:
        """The conversation with ``task`` as its new user turn, and everything the model
        sees before it: the context of the execution that answers it."""
        self.messages.append(UserMessage(content=task.text))
        head: tuple[Message, ...] = (SystemMessage(content=self.system),) if self.system else ()
        if head or self.summary or self.buffer:
            return (*head, *self.summary, *self.buffer, *self.messages)
        return tuple(self.messages)  # one copy, not a list and then a tuple

    async def execute(self, task: Task) -> Result:
        agent = self.agent
        context = self.context
        supervisor = context.runtime.supervisor
        if task.budget is not None and task.budget.cost is not None:
            _check_prices(agent, supervisor.prices, task.budget)
        # An earlier execution may have died mid-way: never carry its buffer over.
        self.execution.clear()
        if task.node:
            node = supervisor.get(task.node)  # opened by the parent that delegated
        else:
            budget = agent.budget.merge(task.budget) if agent.budget else task.budget
            try:
                try:
                    node = supervisor.open(supervisor.root, name=agent.name, limits=budget)
                except HeldUp:  # headroom leased to subtrees on other hosts
                    node = await supervisor.open_waiting(
                        supervisor.root, name=agent.name, limits=budget
                    )
            except BudgetExceeded as exc:
                # Nothing ran: the turn joins neither the live nor the stored conversation.
                return self._refused(str(exc))
        history = self._history(task)
        node.actor_id = context.id
        if task.watch:
            node.watch = context.runtime.event_bus.watchers.get(task.watch)
        store = context.runtime.store
        if store is not None and not task.node:
            node.traces = []  # the subtree's executions leave themselves here
        execution = self.running = self._new_execution(node, task, history)
        earlier: list[Execution] = []  # attempts before a restart
        try:
            await execution.run()
            while execution.status == "failed" and self._may_restart():
                self.restarts.append(anyio.current_time())
                if context.runtime.event_bus.active:
                    context.runtime.event_bus.emit(
                        "restart",
                        agent=agent.name,
                        agent_id=context.id,
                        execution_id=node.id,
                        reason=execution.reason,
                        restarts=len(self.restarts),
                    )
                # Every attempt's trace is kept and stored: the last one has the
                # node's id (the Result's), each earlier one an id of its own.
                execution.execution_id = f"{node.id}~{execution.attempt}"
                self._keep(execution.final_trace())
                earlier.append(execution)
                self.execution.clear()  # fresh buffer, same conversation
                execution = self.running = self._new_execution(node, task, history)
                execution.attempt = len(earlier) + 1
                await execution.run()
        except BaseException:
            self.running = None
            # Cancelled: the buffer is emptied all the same. A delegated child's actor
            # ends with this cancellation (it has no other task) and nothing reads its
            # conversation or traces again: its execution is handed to the top-level
            # one, whose save builds its trace (a cancelled tree of a thousand
            # children does no more per child than it must).
            self.execution.clear()
            if task.node:
                supervisor.close(node, execution.status, execution.reason)
                if node.traces is not None:
                    node.traces += (*earlier, execution)
                raise
            # Invariant 2 holds on this path too: the turn and its synthesized answer
            # join the conversation, the live one and the stored one alike.
            self._conclude(execution)
            supervisor.close(node, execution.status, execution.reason)
            if store is not None:
                await self._save(store, [*earlier, execution], node)
            raise
        # Every other path: empty buffer, one final response.
        self.running = None
        self.execution.clear()
        text = self._conclude(execution)
        supervisor.close(node, execution.status, execution.reason)
        if task.node:
            if node.traces is not None:
                node.traces += (*earlier, execution)
        elif store is not None:
            await self._save(store, [*earlier, execution], node)
        return execution.result(text)

    def _conclude(self, execution: Execution) -> str:
        """The final response joins the conversation and the trace is kept."""
        trace = execution.final_trace()
        self.messages.append(AssistantMessage(content=trace.final_text))
        self._keep(trace)
        return trace.final_text

    async def _save(self, store: Store, executions: list[Execution], node: Node) -> None:
        """Save the persistent sections and the traces of ``executions`` (an ask's
        attempts) and of every execution of their subtree, in one transaction: no
        trace is stored without its parent's.

        Shielded: once an execution has ended, its turn is stored even if the actor
        is cancelled meanwhile, and a cancelled execution's turn and traces are
        stored as the actor ends. A failure never loses the ``Result``: it is logged
        as a warning and counted in ``store_failures``; the next save writes the
        whole state again and retries the traces that were not saved.
        """
        below, node.traces = node.traces, None
        groups = self._unsaved
        try:  # encoding too: whatever fails, the Result is returned
            group = [trace_record(execution.final_trace()) for execution in executions]
            if below:
                group += [trace_record(execution.final_trace()) for execution in below]
            groups = [*self._unsaved, group]
            records = [record for each in groups for record in each]
            state = None
            if self.persistent:
                state = encode_state(
                    AgentState(
                        summary=tuple(self.summary),
                        buffer=tuple(self.buffer),
                        messages=tuple(self.messages),
                    )
                )
            with anyio.fail_after(SAVE_TIMEOUT, shield=True):
                await store.save(self.context.id, state, records=records)
        except Exception as exc:
            self.store_failures += 1
            self._unsaved = groups[-self.agent.trace_limit :]
            log.warning(
                "agent state not saved",
                agent_id=self.context.id,
                execution_id=executions[-1].execution_id,
                store=repr(store),
                error=exception_text(exc),
                unsaved_traces=sum(len(each) for each in self._unsaved),
                failures=self.store_failures,
            )
        else:
            self._unsaved.clear()
        finally:
            if below:
                below.clear()  # the subtree's nodes may outlive this: let go of them

    def _new_execution(
        self,
        node: Node,
        task: Task,
        history: tuple[Message, ...],
        conversation: list[Message] | None = None,
    ) -> Execution:
        context = self.context
        return Execution(
            agent=self.agent,
            agent_id=context.id,
            node=node,
            supervisor=context.runtime.supervisor,
            task=task.text,
            history=history,
            buffer=self.execution,
            context=context,
            delegated=bool(task.node),
            conversation=conversation,
        )

    def _keep(self, trace: ExecutionTrace) -> None:
        """Keep ``trace``, and at most ``trace_limit`` traces in all."""
        self.traces.append(trace)
        if len(self.traces) > self.agent.trace_limit:
            del self.traces[0]

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


class AgentRef:
    """The handle to a running agent."""

    __slots__ = ("_ref", "agent")

    def __init__(self, ref: ActorRef, agent: Agent) -> None:
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

    async def ask(self, text: str, *, budget: Budget | None = None) -> Result:
        """Give the agent a task and wait for its one ``Result``."""
        result: Result = await self._ref.ask(_task(text, budget))
        return result

    async def tell(self, text: str, *, budget: Budget | None = None) -> None:
        """Give the agent a task without waiting; its answer joins its conversation."""
        await self._ref.tell(_task(text, budget))

    def stream(
        self,
        text: str,
        *,
        budget: Budget | None = None,
        subagents: bool = False,
        buffer: int = 1_000,
    ) -> AgentStream:
        """Give the agent a task and watch it run: ``async with ref.stream(text) as
        run: async for event in run: ...``, then ``run.result`` (the ``Result`` that
        ``ask`` would return). ``subagents=True`` also streams what subagents do
        (their text, tool calls, waits), not only their start and finish. At most
        ``buffer`` events wait for a slow consumer (see ``actors._streaming``).
        Leaving the block before the answer stops the execution."""
        return AgentStream(self._ref, _task(text, budget), subagents=subagents, buffer=buffer)

    def progress(self) -> Progress:
        """What the agent is doing now, answered at once even while it runs a task
        (past the mailbox: see ``Progress``). ``conversation`` and ``trace`` queue
        behind the tasks sent before them; this never waits."""
        progress: Progress = self._ref.inspect(GetProgress())
        return progress

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


def _check_prices(agent: Agent, prices: Mapping[str, Price], budget: Budget | None) -> None:
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


def _limits_cost(agent: Agent) -> bool:
    budget = agent.budget
    if budget is not None and budget.cost is not None:
        return True
    return any(_limits_cost(subagent) for subagent in agent.subagents)


def _priced_names(agent: Agent) -> Iterator[str]:
    """The names prices are looked up by, for every model in ``agent``'s tree (an
    adapter's requests are its inner model's)."""
    model = agent.model
    inner = getattr(model, "inner", None)
    yield inner.name if inner is not None else model.name
    for subagent in agent.subagents:
        yield from _priced_names(subagent)


def _subagent_spec(agent: Agent) -> ToolSpec:
    description = agent.description or agent.instructions or f"The {agent.name} agent."
    return ToolSpec(
        name=agent.name,
        description=f"Delegate a task to the {agent.name} subagent: {description}",
        parameters={
            "type": "object",
            "properties": {
                "task": {"type": "string", "description": "What the subagent should do."}
            },
            "required": ["task"],
            "additionalProperties": False,
        },
    )


def _task(text: str, budget: Budget | None) -> Task:
    """The task to send, checked before anything reaches the agent."""
    if not isinstance(text, str):
        raise TypeError(f"a task is text (str), got {type(text).__qualname__}")
    if budget is not None and not isinstance(budget, Budget):
        raise TypeError(f"budget must be a runtime.Budget or None, got {type(budget).__qualname__}")
    return Task(text=safe_text(text), budget=budget)
