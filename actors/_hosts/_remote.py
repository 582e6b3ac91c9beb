"""A subagent whose subtree runs on another host: its messages, the link to its host,
and its stand-in here.

When the runtime has hosts (``Runtime(hosts=...)``, see ``_hosts``) and places a
subagent call on one, the call's node is opened here as for any child (its budget
checked here), and then a ``RemoteChild`` stands in for the child actor: it starts
the subtree on its host (through a ``HostLink``) and follows it until its one
``Result`` comes back. What crosses is fractor's own messages as msgspec bytes
(``Down``: the task, lease grants and refusals, a stop, approval decisions; ``Up``:
lease asks, snapshots, approval requests, the ``Result`` with its traces), never a
pickled conversation. Images and documents cross as the bytes of their blobs, each
once per message (``Start.blobs``, ``Done.blobs``, by SHA-256), beside the parts,
traces and result that name them without their bytes. The hosts (``_hosts``) build
on this module, never the reverse: they hand a stand-in what it needs of them (the
driver's runtime, and how to place its subtree again when its host is lost).

The stand-in keeps every promise of a local child:

- **One ledger**: the subtree draws from a lease of its parent's headroom here,
  shared with its parent's other subtrees on the same host (``runtime._ledger``);
  the lease's asks are admitted here like requests (wait for headroom, stop only
  when a limit is spent); the subtree's usage is charged on its node as it is
  reported.
- **One cancellation**: a stop of the node or of an ancestor, a deadline, or the
  parent's interruption sends a stop to the host, which stops the subtree with the
  same status and reason; its answer (with its usage and traces) is awaited
  briefly, shielded, so nothing it used is lost.
- **One answer**: exactly one ``Result`` per call; a lost host answers ``failed``
  with the reason, and what its lease held is counted as spent.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import anyio
import msgspec

from fractor.runtime import Budget, Node, NodeSnapshot, Usage
from fractor.runtime.lowlevel import Lease, Refusal, Tally, Want, new_waiter, park, wake

from .._blobs import attach_parts, attach_trace, detach_parts
from .._messages import ExecutionTrace, Result
from .._observation._events import WireEvent
from .._observation._subtree import subtree
from .._parts import Media
from .._tools._approval import ApprovalRequest, approvals_of
from ._lanes import Give, Take, Taken
from ._placing import HostUnavailable

if TYPE_CHECKING:
    from fractor.runtime import Runtime, Supervisor

    from .._agent._agent import Agent

__all__ = [
    "Ask",
    "Asking",
    "Close",
    "Decided",
    "Deny",
    "Done",
    "Down",
    "Events",
    "Grant",
    "HostLink",
    "HostUnavailable",
    "Kept",
    "Nodes",
    "Reclaim",
    "RemoteChild",
    "RemoteReply",
    "Room",
    "Start",
    "Stop",
    "Up",
    "Withdrawn",
    "attach_parts",
    "decode_down",
    "decode_up",
    "detach_parts",
    "encode",
    "tally",
]

#: How long a stopped remote subtree's answer is awaited (shielded) before its node
#: is closed without it.
STOP_WAIT = 5.0


# -- the messages ---------------------------------------------------------------------


class Start(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: run one task as the top of a subtree (the agent travels beside it)."""

    run: int
    text: str
    node_id: str
    name: str
    #: The top node's depth in the whole tree, and its parent's id there.
    depth: int
    parent_id: str
    #: The subtree's own limits (its budget, the depth left, the seconds left).
    limits: Budget
    #: The lease it draws from with the other subtrees of its parent on this host
    #: (its number on the link), and the lease's limits when it is new here: the
    #: host opens the lease's node with them.
    pool: int = 0
    pool_limits: Budget | None = None
    #: Send the subtree's traces back with its ``Result`` (the driver stores them).
    traces: bool = False
    #: Send the subtree's events up as they happen (the driver's are observed).
    events: bool = False
    #: The names of the agents above the top in the whole tree, from the top-level
    #: agent down: an approval request of the subtree names its whole path.
    above: tuple[str, ...] = ()
    #: The images and documents the task names (``Task.parts``), without their
    #: bytes: those are in ``blobs``, by SHA-256, each once.
    parts: tuple[Media, ...] = ()
    blobs: dict[str, bytes] = {}


class Grant(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: a lease grew; these are its limits now, and what a part of the budgets
    above is worth now (as ``Room`` says it)."""

    pool: int
    limits: Budget
    worth: dict[str, float] = {}


class Room(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: what a part of the budgets above is worth now, field by field (siblings
    gave headroom back): the lease's subtrees ask for more before they cut a reply
    short at what it has left. Changes no limit."""

    pool: int
    worth: dict[str, float]


class Reclaim(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: the lease holds more than its fair share while another asks: keep at
    most ``free`` headroom of each of these fields beyond what its subtrees used
    and hold in flight (answered with ``Kept``; while it asks it keeps its limits:
    its ask gives back all of it)."""

    pool: int
    free: dict[str, float]


class Deny(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: a lease's ask was refused: a limit of the tree above is spent."""

    pool: int
    refusal: Refusal


class Close(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: a lease ended (its last subtree answered): close its node there."""

    pool: int


class Stop(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: stop the subtree; it answers with this status and reason."""

    run: int
    status: Literal["budget_exceeded", "timed_out", "cancelled", "failed"]
    reason: str
    refusal: Refusal | None = None


class Decided(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: a person's decision on a tool call the subtree asked approval for."""

    run: int
    id: str
    approved: bool
    reason: str = ""


Down = Start | Grant | Room | Reclaim | Deny | Close | Stop | Decided | Taken


class Ask(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: a lease ran out: what each of its live subtrees used (by run), and what
    the waiting operation needs."""

    pool: int
    tallies: tuple[tuple[int, Tally], ...]
    want: Want


class Kept(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: a lease gave back what a ``Reclaim`` asked: its limits of those fields now
    (none: it was asking, and keeps its limits)."""

    pool: int
    limits: dict[str, float]


class Nodes(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: the subtree's nodes below its top as they are now, and its usage so far."""

    run: int
    tally: Tally
    nodes: tuple[NodeSnapshot, ...] = ()


class Done(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: the subtree answered: its ``Result``, its last usage, its traces."""

    run: int
    result: Result
    tally: Tally
    traces: tuple[ExecutionTrace, ...] = ()
    #: The subtree's nodes below its top as they ended.
    nodes: tuple[NodeSnapshot, ...] = ()
    #: The bytes of the images and documents that ``result`` and ``traces`` name
    #: (theirs are left out), by SHA-256, each once; not those of ``Start.blobs``
    #: (the driver has them).
    blobs: dict[str, bytes] = {}


class Events(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: events of the host's subtrees whose trees observe theirs, in order."""

    events: tuple[WireEvent, ...]  # each detail decoded as its kind's class
    run: int = 0


class Asking(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: a tool call of the subtree waits for a person's approval."""

    run: int
    request: ApprovalRequest


class Withdrawn(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: that wait ended before a decision (a deadline, a stop): forget it."""

    run: int
    id: str


Up = Ask | Kept | Nodes | Done | Events | Asking | Withdrawn | Take | Give

_encoder = msgspec.msgpack.Encoder()
_up = msgspec.msgpack.Decoder(list[Up])
_down = msgspec.msgpack.Decoder(list[Down])


def encode(messages: list[Any]) -> bytes:
    """A batch of messages, as the bytes that cross between hosts."""
    return _encoder.encode(messages)


def decode_up(data: bytes) -> list[Up]:
    return _up.decode(data)


def decode_down(data: bytes) -> list[Down]:
    return _down.decode(data)


def tally(node: Node) -> Tally:
    """What the subtree under ``node`` used so far, and holds in flight."""
    return Tally(
        usage=node.usage(),
        own=node.own_usage(),
        steps=node.steps,
        own_steps=node.own_steps,
        agents=node.agents,
        reserved_input=node.reserved_input,
        reserved_output=node.reserved_output,
        reserved_cost=node.reserved_cost,
        leaves=node.leaves,
    )


# -- the link and the stand-in ---------------------------------------------------------


class HostLink:
    """One host as the driver sees it: its subtrees running there, and how to reach
    it (the transport's subclass starts subtrees and sends messages)."""

    def __init__(self, name: str, pool: str) -> None:
        self.name = name
        self.pool = pool
        #: Its subtrees still running, by run id.
        self.runs: dict[int, RemoteChild] = {}
        #: Why it was lost ("" while it is alive).
        self.lost = ""
        #: Subtrees placed on it so far.
        self.placed = 0
        #: The live leases its subtrees draw from, by their numbers here.
        self.pools: dict[int, Lease] = {}

    def start(self, run_id: int, agent: Agent, data: bytes) -> None:
        raise NotImplementedError

    def send(self, data: bytes) -> None:
        raise NotImplementedError

    def finished(self, run_id: int) -> None:
        self.runs.pop(run_id, None)

    def ended(self, lease: Lease) -> None:
        """If ``lease`` ended (its last subtree here answered or was lost, and it does
        not wait idle for another), forget it and have the host close its node."""
        if not lease.live and not lease.idle:
            self.close(lease)

    def close(self, lease: Lease) -> None:
        """Forget ``lease`` and have the host close its node."""
        if self.pools.get(lease.ref) is not lease:
            return
        del self.pools[lease.ref]
        if not self.lost:
            self.send(encode([Close(pool=lease.ref)]))

    def __repr__(self) -> str:
        state = f" lost: {self.lost}" if self.lost else ""
        return f"<host {self.name!r} pool={self.pool!r} running={len(self.runs)}{state}>"


class Lost(msgspec.Struct, frozen=True):
    """(Here only) the subtree's host was lost: why, and whether it is known dead (its
    process is gone, so nothing of its subtrees can be used or settled any more)."""

    reason: str
    dead: bool = False


class RemoteReply:
    """The one reply of a remote child, settled once with its ``Result`` (the same
    surface ``Delegation`` reads of an actor's ``PendingReply``)."""

    __slots__ = ("_callback", "_result")

    def __init__(self) -> None:
        self._result: Result | None = None
        self._callback: Callable[[Any], None] | None = None

    error: BaseException | None = None

    def result(self) -> Result:
        assert self._result is not None
        return self._result

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        self._callback = callback

    def set_result(self, result: Result) -> None:
        if self._result is not None:
            return
        self._result = result
        if self._callback is not None:
            self._callback(self)


class _Shipped:
    """A remote execution's trace, as the top-level execution's store expects it,
    linked to the attempt of the task on ``parent`` that delegated it."""

    __slots__ = ("attempt", "parent", "trace")

    def __init__(self, trace: ExecutionTrace, parent: Node | None, attempt: int) -> None:
        self.trace = trace
        self.parent = parent
        self.attempt = attempt

    def final_trace(self) -> ExecutionTrace:
        trace, parent = self.trace, self.parent
        if parent is not None and trace.parent_id == parent.id and self.attempt != parent.attempt:
            return msgspec.structs.replace(trace, parent_id=f"{parent.id}~{self.attempt}")
        return trace


#: How a stand-in whose host was lost asks its hosts to place its subtree again:
#: True if they did (``RemoteHosts.place_again``).
PlaceAgain = Callable[["RemoteChild", "Lost"], bool]


class RemoteChild:
    """Stands in for a child actor whose subtree runs on ``link``'s host.

    Its hosts start it (``link`` and ``run_id`` are theirs to set) and give it what
    it needs of them: ``runtime``, the driver's (the approvals its subtree asks
    for wait there), and ``place_again``, asked when its host is lost."""

    __slots__ = (
        "agent",
        "asked",
        "done",
        "inbox",
        "link",
        "lost",
        "node",
        "parent_attempt",
        "parts",
        "place_again",
        "placed_again",
        "reply",
        "run_id",
        "runtime",
        "supervisor",
        "text",
        "waiter",
    )

    def __init__(
        self,
        agent: Agent,
        text: str,
        node: Node,
        supervisor: Supervisor,
        *,
        runtime: Runtime | None,
        place_again: PlaceAgain,
        parts: tuple[Media, ...] = (),
    ) -> None:
        self.runtime = runtime
        self.place_again = place_again
        self.agent = agent
        self.text = text
        #: The images and documents its task names (sent with each start).
        self.parts = parts
        self.link: HostLink | None = None
        self.run_id = 0
        self.node = node
        parent = node.parent
        #: Which attempt of its parent's task delegated it.
        self.parent_attempt = parent.attempt if parent is not None else 1
        self.supervisor = supervisor
        #: How many times its subtree was placed again after its host was lost.
        self.placed_again = 0
        self.reply = RemoteReply()
        self.inbox: collections.deque[Up | Lost] = collections.deque()
        self.waiter: Any = None
        self.done: Done | None = None
        self.lost: Lost | None = None
        #: Approvals its subtree asked for that wait on the driver (their ids).
        self.asked: set[str] = set()

    def deliver(self, message: Up | Lost) -> None:
        """A message from the host (or the news that it was lost), from its pump."""
        if isinstance(message, Asking):  # here, before the events after it are shown
            self._adopt(message.request)
            return
        if isinstance(message, Withdrawn):
            self._withdraw(message.id)
            return
        ledger = self.supervisor.ledger
        node = self.node
        lease = node.lease
        assert lease is not None
        if isinstance(message, Nodes):
            # Charged at once, in the order the host sent them (its lease's asks
            # report its subtrees too, in the same order).
            member = lease.members[node]
            if member.live:
                member.nodes = message.nodes
            ledger.report(node, message.tally)
            return
        if isinstance(message, Done):
            # Settle the ledger at once: an ask of the lease may still wait here.
            member = lease.members[node]
            if message.nodes and member.live:
                member.nodes = message.nodes
            ledger.end(node, message.tally)
            self._ended(lease)
        elif isinstance(message, Lost):
            ledger.end(node, None, lost=True, dead=message.dead)
            self._ended(lease)
            for request_id in list(self.asked):  # nobody there waits for them now
                self._withdraw(request_id)
        self.inbox.append(message)
        if self.waiter is not None:
            wake(self.waiter)

    async def run(self) -> None:
        """Follow the subtree until its answer; stop it if this node is stopped."""
        node = self.node
        supervisor = self.supervisor
        try:
            with anyio.CancelScope(deadline=node.deadline) as scope:
                node.scope = scope
                await self._follow()
            node.scope = None
            if self.done is None and self.lost is None:
                # Stopped here (a limit, a deadline, a cancellation of this node or of
                # an ancestor): the subtree answers with the same status and reason.
                self._stop(*supervisor.why_stopped(node))
                await self._follow_shielded()
        except BaseException:
            # The parent's step was interrupted: stop the subtree, and wait (shielded,
            # briefly) for what it used and traced before letting go of it.
            node.scope = None
            if self.done is None and self.lost is None:
                stopper = node if node.stop_status is not None else (node.parent or node)
                self._stop(*supervisor.why_stopped(stopper))
                await self._follow_shielded()
            self._finish()
            raise
        self.reply.set_result(self._finish())

    def _stop(self, status: str, reason: str) -> None:
        error = self.node.stop_error
        refusal = Refusal.of(error) if error is not None else None
        stop = Stop(run=self.run_id, status=status, reason=reason, refusal=refusal)  # type: ignore[arg-type]
        assert self.link is not None
        self.link.send(encode([stop]))

    async def _follow_shielded(self) -> None:
        with anyio.CancelScope(shield=True) as scope:
            scope.deadline = anyio.current_time() + STOP_WAIT
            await self._follow()

    async def _follow(self) -> None:
        """Serve the host's messages until the subtree answers (or its host is lost)."""
        inbox = self.inbox
        while self.done is None and self.lost is None:
            if not inbox:
                self.waiter = new_waiter()
                try:
                    await park(self.waiter)
                finally:
                    self.waiter = None
                continue
            message = inbox.popleft()
            if isinstance(message, Done):
                self.done = message
            elif isinstance(message, Lost) and not self.place_again(self, message):
                self.lost = message

    def _ended(self, lease: Lease) -> None:
        link = self.link
        if link is not None:
            link.ended(lease)

    def _adopt(self, request: ApprovalRequest) -> None:
        """List an approval the subtree asked for under the top-level agent above it
        (the host named its place in the whole tree: ``Start.above``); its decision
        goes down to the host."""
        runtime = self.runtime
        if runtime is None:
            return
        chain = list(self.node.chain())[:-1]  # up to the top-level agent's node
        run_id, link = self.run_id, self.link

        def answer(approved: bool, reason: str) -> None:
            self.asked.discard(request.id)
            if link is not None and self.run_id == run_id:
                decided = Decided(run=run_id, id=request.id, approved=approved, reason=reason)
                link.send(encode([decided]))

        self.asked.add(request.id)
        approvals_of(runtime).adopt(request, chain[-1].actor_id, answer)

    def _withdraw(self, request_id: str) -> None:
        self.asked.discard(request_id)
        if self.runtime is not None:
            approvals_of(self.runtime).withdraw(request_id)

    def _finish(self) -> Result:
        """Close the node with how the subtree ended, and keep its traces."""
        node = self.node
        supervisor = self.supervisor
        done = self.done
        link = self.link
        assert link is not None
        link.finished(self.run_id)
        for request_id in list(self.asked):  # the subtree answered
            self._withdraw(request_id)
        if done is not None:
            result = done.result
            blobs = done.blobs
            if self.parts:  # what the host did not send back: the driver has them
                sent = {p.sha256: p.data for p in self.parts if p.data is not None}
                blobs = {**sent, **blobs}
            if blobs and result.parts:
                result = msgspec.structs.replace(result, parts=attach_parts(result.parts, blobs))
            ended = subtree(node).traces
            if ended is not None and done.traces:
                parent, attempt = node.parent, self.parent_attempt
                traces = [attach_trace(trace, blobs) if blobs else trace for trace in done.traces]
                ended.extend(_Shipped(trace, parent, attempt) for trace in traces)
        else:
            lease = node.lease
            assert lease is not None
            if self.lost is not None:
                status, reason = "failed", self.lost.reason
                supervisor.ledger.end(node, None, lost=True, dead=self.lost.dead)
            else:  # its answer did not come in time: what its lease holds stays held
                status, reason = supervisor.why_stopped(node)
                reason = f"{reason}; the host {link.name!r} did not answer the stop"
                supervisor.ledger.end(node, None, lost=True)
            self._ended(lease)
            result = Result(
                text=f"[{status}] {reason}",
                status=status,  # type: ignore[arg-type]
                stop_reason=reason,
                usage=node.usage() if node.lease is not None else Usage(),
                agent_id=node.id,
                execution_id=node.id,
            )
        supervisor.close(node, result.status, result.stop_reason)
        return result
