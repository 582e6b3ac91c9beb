"""An agent host: one event loop running many subtrees of other processes' trees.

A host is where ``Runtime(hosts=...)`` places subtrees (a Ray actor with
``RayHosts``; an object in this process with ``LocalHosts``). It runs one
``Runtime`` of its own, with no budget, no store and no caps on depth or agents (the
tree above enforces those through leases). Each lease is a node under its root,
with the lease's limits: the subtrees a node above placed here open below it (each
top with its own limits), so this runtime's admission shares the lease among them,
and where it runs out the lease asks the tree above for more, once for all of them
(``runtime._ledger``). It speaks only bytes: ``start`` and ``down`` take messages,
``drain`` hands back what goes up (asks, snapshots, answers), batched.
"""

from __future__ import annotations

import contextlib
import math
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog

from fractor.runtime import (
    Budget,
    Caps,
    Event,
    Node,
    NodeSnapshot,
    OutputSharing,
    Price,
    RateLimit,
    Runtime,
    Usage,
)
from fractor.runtime.lowlevel import Tally, Want, new_waiter, park, wake

from .._blobs import detach_trace
from .._messages import ExecutionTrace, Result, Task, exception_text
from .._observation._subtree import subtree, with_traces
from .._tools._approval import ApprovalRequest, approvals_of
from ._lanes import HostRates, Taken
from ._remote import (
    Ask,
    Asking,
    Close,
    Decided,
    Deny,
    Done,
    Events,
    Grant,
    Kept,
    Nodes,
    Reclaim,
    Room,
    Start,
    Stop,
    Up,
    Withdrawn,
    attach_parts,
    decode_down,
    detach_parts,
    encode,
    tally,
)

if TYPE_CHECKING:
    from .._agent._agent import Agent

__all__ = ["AgentHost", "HostConfig"]

log = structlog.get_logger("fractor.actors.host")

#: How many stops for subtrees not started (or already ended) a host remembers.
EARLY_KEPT = 10_000
#: How often a host sends the snapshots of its running subtrees' nodes.
SNAPSHOT_PERIOD = 0.25


class HostConfig(msgspec.Struct, frozen=True, kw_only=True):
    """What a host's runtime needs of the driver's: prices and request sizes, the
    one cap that is per execution (steps), and the lanes the driver keeps."""

    name: str
    prices: dict[str, Price] = {}
    steps: int | None = 200
    min_output_tokens: int = 256
    default_max_tokens: int = 4_096
    output_sharing: OutputSharing = "fair"
    #: The driver's declared lanes (its rate and tool limits): the host's requests
    #: of those wait in the driver's (``_lanes``).
    rate_limits: dict[str, RateLimit] = {}
    count_refused: bool = False


class _Run:
    __slots__ = ("above", "depth", "node", "offset", "parent_id", "pool", "run_id", "sent")

    def __init__(
        self, run_id: int, node: Node, pool: _Pool, depth: int, above: tuple[str, ...] = ()
    ) -> None:
        self.run_id = run_id
        self.node = node
        self.pool = pool
        #: The top node's depth in the whole tree, and the agents above it there;
        #: what to add to a depth here to make it one there.
        self.depth = depth
        self.above = above
        self.offset = depth - node.depth
        #: The last tally sent up in a snapshot.
        self.sent: Any = None
        #: Its top node's parent in the whole tree (set when its events are observed).
        self.parent_id = ""


class _Pool:
    """A lease of the tree above, shared by its subtrees here: a node under the
    root with the lease's limits, above their top nodes, so that this runtime's
    admission shares it among them, and they ask the tree above as one."""

    __slots__ = ("asking", "node", "opened", "pool_id", "runs")

    def __init__(self, pool_id: int, node: Node) -> None:
        self.pool_id = pool_id
        self.node = node
        self.asking = False
        #: Its subtrees running now, and how many it opened (each an agent of its
        #: node here, counted by the tree above on its own node there).
        self.runs: dict[int, _Run] = {}
        self.opened = 0

    def limits(self, budget: Budget) -> Budget:
        """The node's limits for the lease's ``budget``: agents it opened count here
        besides those the lease grants for what they open."""
        if budget.agents is None or not self.opened:
            return budget
        return msgspec.structs.replace(budget, agents=budget.agents + self.opened)


class _Lender:
    """A lease's way to ask the tree above for more headroom: one ask at a time
    (an operation still short after the answer asks again)."""

    __slots__ = ("fresh", "hint", "host", "pool")

    def __init__(self, host: AgentHost, pool: _Pool) -> None:
        self.host = host
        self.pool = pool
        self.fresh: dict[str, float] = {}
        self.hint: dict[str, float] = {}

    @property
    def asking(self) -> bool:
        return self.pool.asking

    def want(self, node: Node, want: Want) -> None:
        pool = self.pool
        if pool.asking:
            return
        pool.asking = True
        runtime = self.host.runtime
        assert runtime is not None
        runtime.supervisor.ledger.freeze(node)  # what the tallies say is all it holds
        tallies = tuple((run.run_id, tally(run.node)) for run in pool.runs.values())
        self.host.post(Ask(pool=pool.pool_id, tallies=tallies, want=want))


class _Forwarder:
    """How a subtree's tool calls ask the driver for a person's approval, and where
    the subtree sits in the whole tree (``Forwarder``)."""

    __slots__ = ("host", "run")

    def __init__(self, host: AgentHost, run: _Run) -> None:
        self.host = host
        self.run = run

    @property
    def above(self) -> tuple[str, ...]:
        return self.run.above

    @property
    def depth(self) -> int:
        return self.run.depth

    def ask(self, request: ApprovalRequest) -> None:
        self.host.post(Asking(run=self.run.run_id, request=request))

    def withdraw(self, request_id: str) -> None:
        self.host.post(Withdrawn(run=self.run.run_id, id=request_id))


class AgentHost:
    """Runs subtrees for other processes' trees (see the module's docstring)."""

    def __init__(self, config: HostConfig) -> None:
        self.config = config
        self.name = config.name
        self.runtime: Runtime | None = None
        self._runs: dict[int, _Run] = {}
        self._pools: dict[int, _Pool] = {}
        self._outbox: list[Up] = []
        self._waiter: Any = None
        self._ready = anyio.Event()
        self._closed = False
        self._task_group: Any = None
        #: Stops that came before their subtree started (a transport may reorder).
        self._early: dict[int, Stop] = {}
        #: Subtrees whose trees observe their events (forwarded while any does), by
        #: their top node's id.
        self._observed: dict[str, _Run] = {}
        self._events: list[Event] = []
        #: Subtrees run so far.
        self.started = 0

    @property
    def load(self) -> int:
        """Subtrees running now."""
        return len(self._runs)

    async def serve(self) -> None:
        """Run the host's runtime until cancelled (its subtrees are cancelled with it)."""
        config = self.config
        async with (
            Runtime(
                prices=config.prices or None,
                caps=Caps(depth=None, agents=None, steps=config.steps),
                min_output_tokens=config.min_output_tokens,
                default_max_tokens=config.default_max_tokens,
                output_sharing=config.output_sharing,
                grace=0,
            ) as runtime,
            anyio.create_task_group() as tg,
        ):
            self.runtime = runtime
            if config.rate_limits:
                supervisor = runtime.supervisor
                supervisor.rates = HostRates(
                    dict(config.rate_limits),
                    self.post,
                    lambda: supervisor.now(),
                    count_refused=config.count_refused,
                )
            approvals_of(runtime).prefix = f"{self.name}/"  # unique on the driver too
            self._task_group = tg
            tg.start_soon(self._snapshots)
            self._ready.set()
            await anyio.sleep_forever()

    async def ready(self) -> None:
        await self._ready.wait()

    def start(self, data: bytes, agent: Agent) -> None:
        """Start the subtree of one ``Start`` message (bytes) with ``agent``."""
        for message in decode_down(data):
            assert isinstance(message, Start)
            self.started += 1
            self._open_pool(message)
            self._task_group.start_soon(self._run, message, agent)

    def refuse(self, data: bytes, why: str) -> None:
        """Answer the subtree of each ``Start`` message (bytes) ``failed`` at once: its
        agent's definition could not be rebuilt here (``why``)."""
        for message in decode_down(data):
            assert isinstance(message, Start)
            self._open_pool(message)
            reason = f"the host {self.name!r} could not rebuild agent {message.name!r}: {why}"
            log.warning("agent not rebuilt", host=self.name, node_id=message.node_id, error=why)
            self._refused(message, reason)

    def _refused(self, start: Start, reason: str) -> None:
        """The answer of a subtree that never started here: ``failed``, with why."""
        failed = _failed(reason, start.node_id, Usage())
        self.post(Done(run=start.run, result=failed, tally=Tally()))

    def down(self, data: bytes) -> None:
        """Apply grants, refusals and stops from the tree above."""
        runtime = self.runtime
        assert runtime is not None
        ledger = runtime.supervisor.ledger
        supervisor = runtime.supervisor
        for message in decode_down(data):
            if isinstance(message, (Grant, Deny, Room, Reclaim, Close)):
                self._to_pool(message)
                continue
            if isinstance(message, Taken):
                rates = supervisor.rates
                if isinstance(rates, HostRates):
                    rates.taken(message.id)
                continue
            run = self._runs.get(message.run)
            if run is None:
                if isinstance(message, Stop):
                    self._early[message.run] = message
                    while len(self._early) > EARLY_KEPT:
                        del self._early[next(iter(self._early))]
                continue
            if run.node.status != "running":
                continue  # it answered already
            node = run.node
            if isinstance(message, Stop):
                error = message.refusal.error() if message.refusal is not None else None
                supervisor.stop_subtree(node, message.status, message.reason, error)
                ledger.changed_at(node)
            elif isinstance(message, Decided):
                approvals_of(runtime).settle(
                    message.id, approved=message.approved, reason=message.reason
                )

    def _to_pool(self, message: Grant | Deny | Room | Reclaim | Close) -> None:
        """Apply a lease's grant, refusal, news, reclaim or end to its node."""
        runtime = self.runtime
        assert runtime is not None
        supervisor = runtime.supervisor
        pool = self._pools.get(message.pool)
        if pool is None:
            return
        node = pool.node
        if isinstance(message, Close):
            del self._pools[message.pool]
            supervisor.close(node, "completed")
        elif isinstance(message, Grant):
            pool.asking = False
            if message.worth and node.lender is not None:
                node.lender.hint = {**node.lender.hint, **message.worth}
            supervisor.ledger.extend(node, pool.limits(message.limits))
        elif isinstance(message, Deny):
            pool.asking = False
            supervisor.ledger.refuse(node, message.refusal.error())
        elif isinstance(message, Reclaim):
            # Asking, it gave back all it does not hold in flight (a grant may be on
            # its way here): it keeps its limits, and says so.
            kept = {} if pool.asking else supervisor.ledger.keep(node, message.free)
            self.post(Kept(pool=message.pool, limits=kept))
        elif node.lender is not None:
            node.lender.hint = {**node.lender.hint, **message.worth}

    def post(self, message: Up) -> None:
        self._outbox.append(message)
        if self._waiter is not None:
            wake(self._waiter)

    async def drain(self, timeout: float = math.inf) -> bytes:
        """What goes up, batched; waits up to ``timeout`` for something to send."""
        if not self._outbox and not self._events:
            self._waiter = new_waiter()
            try:
                with anyio.move_on_after(timeout):
                    await park(self._waiter)
            finally:
                self._waiter = None
        self._flush_events()
        batch, self._outbox = self._outbox, []
        return encode(batch)

    async def _run(self, start: Start, agent: Agent) -> None:
        runtime = self.runtime
        assert runtime is not None
        supervisor = runtime.supervisor
        try:
            if start.node_id in supervisor.nodes:
                raise ValueError(f"a subtree with node id {start.node_id!r} runs here already")
            pool = self._pools.get(start.pool)
            if pool is None:
                pool = self._pool(start)  # (to say why it could not be opened)
            pool.opened += 1
            if pool.node.limits is not None and pool.node.limits.agents is not None:
                pool.node.limits = msgspec.structs.replace(
                    pool.node.limits, agents=pool.node.limits.agents + 1
                )
            node = supervisor.open(
                pool.node, name=start.name, limits=start.limits, node_id=start.node_id
            )
        except Exception as exc:  # it answers all the same: nothing waits for it forever
            self._refused(start, f"the host {self.name!r} could not run it: {exception_text(exc)}")
            return
        run = self._runs[start.run] = _Run(start.run, node, pool, start.depth, start.above)
        pool.runs[start.run] = run
        forwarders = approvals_of(runtime).forwarders
        forwarders[node.id] = _Forwarder(self, run)
        if start.events:
            self._observe(run, start.parent_id)
        if start.traces:
            with_traces(node, [])
        early = self._early.pop(start.run, None)
        if early is not None:
            self.down(encode([early]))
        try:
            ref = await runtime.spawn(agent, id=node.id)
            parts = attach_parts(start.parts, start.blobs)
            reply = ref.actor.ask_nowait(Task(text=start.text, node=node.id, parts=parts))
            ref.actor.stop_nowait()
            result: Result = await reply.wait()
        except Exception as exc:
            reason = f"the host {self.name!r} could not run it: {exception_text(exc)}"
            log.warning("subtree failed on its host", host=self.name, node_id=node.id, error=reason)
            supervisor.close(node, "failed", reason)
            result = _failed(reason, node.id, node.usage())
        finally:
            del self._runs[start.run]
            del pool.runs[start.run]
            forwarders.pop(node.id, None)
            if self._observed.pop(node.id, None) is not None and not self._observed:
                runtime.event_bus.tap = None
                runtime.event_bus.active = runtime.event_bus.log_events
            self._flush_events()
        # The images and documents of its answer and traces go up as their bytes,
        # each once, beside what names them (not those its task came with).
        blobs: dict[str, bytes] = {}
        if result.parts:
            result = msgspec.structs.replace(result, parts=detach_parts(result.parts, blobs))
        traces: tuple[ExecutionTrace, ...] = ()
        shipped = subtree(node).traces
        if shipped:
            # The top's executions hang from the parent in the whole tree (here, from
            # the lease's node).
            here = ("", pool.node.id)
            traces = tuple(
                msgspec.structs.replace(
                    trace,
                    parent_id=start.parent_id if trace.parent_id in here else trace.parent_id,
                )
                for trace in (detach_trace(execution.final_trace(), blobs) for execution in shipped)
            )
            with_traces(node, None)
        for key in start.blobs:  # the driver sent these: it has them
            blobs.pop(key, None)
        nodes = _marked(supervisor.subtree(node), self.name, run.offset)
        self.post(
            Done(
                run=start.run,
                result=result,
                tally=tally(node),
                traces=traces,
                nodes=nodes,
                blobs=blobs,
            )
        )

    def _open_pool(self, start: Start) -> None:
        """Open the lease of ``start`` if it is new, at once, in the order the
        subtrees came (their tasks may start in another: a later subtree of the
        lease finds it). If it cannot be opened, its subtree answers why."""
        with contextlib.suppress(Exception):
            self._pool(start)

    def _pool(self, start: Start) -> _Pool:
        """The lease ``start``'s subtree draws from: its node here, opened with the
        first subtree of the lease (whose ``Start`` carries its limits)."""
        pool = self._pools.get(start.pool)
        if pool is not None:
            if start.pool_limits is not None:  # it was idle: its new limits
                pool.asking = False  # (an ask of its last subtrees was not answered)
                runtime = self.runtime
                assert runtime is not None
                runtime.supervisor.ledger.extend(pool.node, pool.limits(start.pool_limits))
            return pool
        if start.pool_limits is None:
            raise ValueError(f"lease {start.pool} is not known here")
        runtime = self.runtime
        assert runtime is not None
        supervisor = runtime.supervisor
        node = supervisor.open(
            supervisor.root,
            name="lease",
            limits=start.pool_limits,
            node_id=f"{self.name}/lease-{start.pool}.{start.node_id}",
        )
        pool = self._pools[start.pool] = _Pool(start.pool, node)
        node.lender = _Lender(self, pool)
        return pool

    def _observe(self, run: _Run, parent_id: str) -> None:
        """Forward the events of ``run``'s subtree, at their place in the whole tree."""
        run.parent_id = parent_id
        self._observed[run.node.id] = run
        runtime = self.runtime
        assert runtime is not None
        runtime.event_bus.tap = self._tap
        runtime.event_bus.active = True

    def _tap(self, event: Event) -> None:
        run = self._observed.get(event.execution_id)
        if run is None:  # below a top: find it
            runtime = self.runtime
            assert runtime is not None
            node = runtime.supervisor.nodes.get(event.execution_id)
            while node is not None and node.id not in self._observed:
                node = node.parent
            if node is None:
                return  # not of an observed subtree
            run = self._observed[node.id]
        else:  # the top's own: its parent is the lease's node here
            event = msgspec.structs.replace(event, parent_id=run.parent_id)
        event = msgspec.structs.replace(event, depth=event.depth + run.offset)
        if not self._events:
            self.post_soon()
        self._events.append(event)

    def post_soon(self) -> None:
        """Send the events gathered so far with the next batch up."""
        if self._waiter is not None:
            wake(self._waiter)

    def _flush_events(self) -> None:
        if self._events:
            events, self._events = tuple(self._events), []
            self._outbox.append(Events(events=events))

    async def _snapshots(self) -> None:
        """Every ``SNAPSHOT_PERIOD``, the nodes of each running subtree that changed."""
        while True:
            await anyio.sleep(SNAPSHOT_PERIOD)
            runtime = self.runtime
            if runtime is None or not self._runs:
                continue
            supervisor = runtime.supervisor
            for run in list(self._runs.values()):
                now = tally(run.node)
                if now == run.sent and not run.node.children:
                    continue
                run.sent = now
                nodes = _marked(supervisor.subtree(run.node), self.name, run.offset)
                self.post(Nodes(run=run.run_id, tally=now, nodes=nodes))


def _failed(reason: str, node_id: str, usage: Usage) -> Result:
    """The answer of a subtree this host could not run."""
    return Result(
        text=f"[failed] {reason}",
        status="failed",
        stop_reason=reason,
        usage=usage,
        agent_id=node_id,
        execution_id=node_id,
    )


def _marked(nodes: list[NodeSnapshot], host: str, offset: int) -> tuple[NodeSnapshot, ...]:
    """Snapshots of a subtree's nodes, each marked with its host, at their depth in the
    whole tree (``offset`` deeper there than here)."""
    replace = msgspec.structs.replace
    return tuple(replace(node, host=host, depth=node.depth + offset) for node in nodes)
