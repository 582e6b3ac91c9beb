"""Hosts: where a runtime places subtrees besides its own process.

``Runtime(hosts=...)`` takes hosts, which the core asks ``place`` (a ``Placer``,
``_placing``), never their class. ``RemoteHosts`` is one: ``LocalHosts`` (hosts in this
process, each with a runtime of its own: for tests, and to see a placement work
before there is a cluster) or ``fractor.actors.integrations.ray.RayHosts`` (each host a Ray
actor, on this machine or a cluster). Both speak the same bytes (``_remote``) to the
same ``AgentHost`` (``_host``); only the transport differs. This module builds on
both: a ``HostLink`` and the ``RemoteChild`` standing in for a placed subtree are
``_remote``'s, told what they need of their hosts, never importing them.

**Placement.** A subagent call is placed on a host when its agent names a pool
(``Agent(host="gpu")``: a host of that pool, wherever its parent runs here), or when
its parent is a top-level execution (the children of a top-level agent spread over
the ``"default"`` pool, round-robin or least-loaded). A placed subtree stays whole
on its host: its own subagents run there, next to it. Everything else runs here.

**Lost hosts.** A host whose transport fails (its process died) is lost: each of
its subtrees answers ``failed`` with the reason, what their leases held is counted
as spent, and nothing more is placed on it; a placement that finds no live host in
the default pool runs the child here, one that names a pool with none refuses it.
"""

from __future__ import annotations

import functools
import itertools
import math
from typing import TYPE_CHECKING, Literal

import anyio
import msgspec
import structlog

from fractor.runtime import BudgetExceeded, Node, Runtime, Supervisor
from fractor.runtime.lowlevel import Lease, Ledger, Refusal, Want

from .._messages import exception_text
from .._observation._events import Restart
from .._observation._subtree import subtree
from ._host import AgentHost, HostConfig
from ._lanes import Give, Lanes, Take, Taken
from ._placing import HostUnavailable, Placement
from ._remote import (
    Ask,
    Deny,
    Events,
    Grant,
    HostLink,
    Kept,
    Lost,
    Reclaim,
    RemoteChild,
    RemoteReply,
    Room,
    Start,
    decode_up,
    detach_parts,
    encode,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from anyio.abc import TaskGroup

    from fractor.runtime import Event

    from .._agent._agent import Agent
    from .._parts import Media

__all__ = [
    "DEFAULT_POOL",
    "HostLink",
    "HostUnavailable",
    "LocalHosts",
    "PlacementStrategy",
    "RemoteHosts",
]

log = structlog.get_logger("fractor.actors.hosts")

#: How ``RemoteHosts`` picks a host among the live ones of a pool.
PlacementStrategy = Literal["round_robin", "least_loaded"]
_PLACEMENTS = ("round_robin", "least_loaded")
#: The pool the children of top-level executions are placed in.
DEFAULT_POOL = "default"


class RemoteHosts:
    """Places subtrees on hosts and follows them (a ``fractor.Hosts``, and a
    ``Placer``: the core asks it ``place``). A transport subclasses it: ``_open``
    makes the links (``HostLink`` subclasses), ``_receive`` waits for a host's next
    batch of messages (raising when the host is lost), ``_shutdown`` lets go. On the
    other side of a link, an ``AgentHost`` runs the subtrees."""

    def __init__(self, *, placement: PlacementStrategy = "round_robin") -> None:
        if placement not in _PLACEMENTS:
            raise ValueError(f"placement must be one of {_PLACEMENTS}, got {placement!r}")
        self.placement = placement
        self.links: list[HostLink] = []
        self.runtime: Runtime | None = None
        self._runs = itertools.count(1)
        self._pools = itertools.count(1)
        self._turn: dict[str, int] = {}
        #: Watchers of streamed asks (``Subtree.watch``) of the executions running on
        #: hosts, by execution id: a remote subtree's events reach them too.
        self._watched: dict[str, Callable[[Event], None]] = {}
        self._task_group: TaskGroup | None = None
        #: Its hosts' requests in this runtime's lanes (made at the first).
        self._lanes: Lanes | None = None

    # -- transport ----------------------------------------------------------------

    async def _open(self, runtime: Runtime, task_group: TaskGroup) -> list[HostLink]:
        """Start the hosts (any task of theirs in ``task_group``) and link them."""
        raise NotImplementedError

    async def _receive(self, link: HostLink) -> bytes:
        raise NotImplementedError

    def _dead(self, link: HostLink, error: Exception) -> bool:
        """Whether ``error``, which lost ``link``, says its host is gone for good (its
        process ended): then what its leases held beyond their requests in flight
        comes back. False unless the transport knows."""
        return False

    async def _shutdown(self) -> None:
        """Let go of the hosts (every subtree has answered)."""

    # -- runtime.Hosts ----------------------------------------------------------------

    async def start(self, runtime: Runtime) -> None:
        if self.runtime is not None:
            raise RuntimeError("these hosts already serve a runtime")
        self.runtime = runtime
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        try:
            self.links = await self._open(runtime, task_group)
        except BaseException as exc:
            task_group.cancel_scope.cancel()
            await task_group.__aexit__(type(exc), exc, exc.__traceback__)
            await self._shutdown()
            raise
        for link in self.links:
            task_group.start_soon(self._pump, link)

    async def aclose(self) -> None:
        task_group = self._task_group
        self._task_group = None
        try:
            if task_group is not None:
                task_group.cancel_scope.cancel()
                await task_group.__aexit__(None, None, None)
        finally:
            await self._shutdown()

    # -- placing ----------------------------------------------------------------------

    @staticmethod
    def config(runtime: Runtime, name: str) -> HostConfig:
        """A host's configuration, from the driver's runtime."""
        supervisor = runtime.supervisor
        caps = supervisor.caps
        return HostConfig(
            name=name,
            prices=supervisor.prices,
            steps=caps.steps if caps is not None else None,
            min_output_tokens=supervisor.min_output_tokens,
            default_max_tokens=supervisor.default_max_tokens,
            output_sharing=supervisor.output_sharing,
            rate_limits=supervisor.rates.limits,
            count_refused=supervisor.rates.count_refused,
        )

    def place(self, parent: Node, agent: Agent, supervisor: Supervisor) -> Placement | None:
        """Where a subagent call of ``agent`` under ``parent`` runs (``Placer``): on
        the host ``pick`` chooses, or here (None)."""
        link = self.pick(parent, agent, supervisor)
        return _OnLink(self, link) if link is not None else None

    def pick(self, parent: Node, agent: Agent, supervisor: Supervisor) -> HostLink | None:
        """The host for a subagent call of ``agent`` under ``parent`` (None: here)."""
        pool = agent.host
        if pool is None:
            if parent.parent is not supervisor.root:
                return None  # not a child of a top-level execution
            pool = DEFAULT_POOL
        live = [link for link in self.links if link.pool == pool and not link.lost]
        if not live:
            if agent.host is None:
                return None
            pools = sorted({link.pool for link in self.links})
            raise HostUnavailable(
                f"agent {agent.name!r} runs on a host of pool {pool!r}, and none is "
                f"{'alive' if pool in pools else 'known'} (pools: {', '.join(pools) or 'none'})"
            )
        if self.placement == "least_loaded":
            return min(live, key=lambda link: (len(link.runs), link.placed))
        turn = self._turn.get(pool, 0)
        self._turn[pool] = turn + 1
        return live[turn % len(live)]

    def launch(
        self,
        link: HostLink,
        agent: Agent,
        text: str,
        node: Node,
        supervisor: Supervisor,
        task_group: TaskGroup,
        parts: tuple[Media, ...] = (),
    ) -> RemoteReply:
        """Run ``agent`` on ``text`` (and the images and documents ``parts``) on
        ``link``'s host as the subtree of ``node`` (just opened here), followed by a
        ``RemoteChild`` in ``task_group``."""
        child = RemoteChild(
            agent,
            text,
            node,
            supervisor,
            runtime=self.runtime,
            place_again=self.place_again,
            parts=parts,
        )
        self.start_on(child, link)
        task_group.start_soon(child.run, name=f"remote {node.id}")
        return child.reply

    def start_on(self, child: RemoteChild, link: HostLink) -> None:
        """Start ``child``'s subtree on ``link``'s host, under a new lease of its node
        (a subtree placed again after its host was lost starts afresh)."""
        node = child.node
        supervisor = child.supervisor
        ledger = supervisor.ledger
        if child.link is not None:
            child.link.finished(child.run_id)
        lease = ledger.open(node, key=link)
        pool_limits = None
        if not lease.ref:  # a new lease: the host opens its node with the first subtree
            lease.ref = next(self._pools)
            lease.host = link.name
            link.pools[lease.ref] = lease
            pool_limits = lease.limits()
            ref = lease.ref

            def tell(worth: dict[str, float]) -> None:
                if not link.lost:
                    link.send(encode([Room(pool=ref, worth=worth)]))

            def reclaim(free: dict[str, float]) -> None:
                if not link.lost:
                    link.send(encode([Reclaim(pool=ref, free=free)]))

            lease.tell = tell
            lease.reclaim = reclaim
            lease.close = lambda: link.close(lease)
        elif lease.count == 1:  # it was idle: the host's node of it gets its new limits
            pool_limits = lease.limits()
        limits = ledger.own_limits(node)
        if node.deadline != math.inf:
            remaining = max(node.deadline - supervisor.now(), 1e-6)
            limits = msgspec.structs.replace(limits, seconds=remaining)
        run_id = next(self._runs)
        blobs: dict[str, bytes] = {}
        parts = detach_parts(child.parts, blobs)
        kept = subtree(node)
        start = Start(
            run=run_id,
            text=child.text,
            node_id=node.id,
            name=child.agent.name,
            depth=node.depth,
            parent_id=node.parent.id if node.parent is not None else "",
            limits=limits,
            pool=lease.ref,
            pool_limits=pool_limits,
            traces=kept.traces is not None,
            events=kept.watch is not None
            or (self.runtime is not None and self.runtime.event_bus.active),
            above=tuple(above.name for above in reversed(list(node.chain())[1:-1])),
            parts=parts,
            blobs=blobs,
        )
        if kept.watch is not None:
            self._watched[node.id] = kept.watch
        try:
            link.start(run_id, child.agent, encode([start]))
        except BaseException:
            ledger.end(node, None)
            if not lease.live:  # the host never heard of it
                link.pools.pop(lease.ref, None)
            raise
        child.link, child.run_id = link, run_id
        link.runs[run_id] = child
        link.placed += 1

    def place_again(self, child: RemoteChild, lost: Lost) -> bool:
        """``child``'s host was lost: run its subtree again on another host if its
        agent's restart policy allows (``max_restarts`` placements at most); what the
        lost one held stays counted as spent. True if it was placed again."""
        node = child.node
        agent = child.agent
        if child.placed_again >= agent.restart.max_restarts or node.stop_status is not None:
            return False
        parent = node.parent
        assert parent is not None
        try:
            link = self.pick(parent, agent, child.supervisor)
        except HostUnavailable:
            return False
        if link is None:
            return False
        child.placed_again += 1
        runtime = self.runtime
        if runtime is not None and runtime.event_bus.active:
            runtime.event_bus.emit(
                Restart(reason=lost.reason, restarts=child.placed_again, host=link.name),
                agent=agent.name,
                agent_id=node.id,
                execution_id=node.id,
                parent_id=parent.id,
                depth=node.depth,
            )
        self.start_on(child, link)
        return True

    async def _pump(self, link: HostLink) -> None:
        """Hand each message of ``link``'s host to its subtree's stand-in, until the
        runtime closes or the host is lost."""
        try:
            while True:
                data = await self._receive(link)
                for message in decode_up(data):
                    if isinstance(message, Events):
                        self._publish(link, message)
                        continue
                    if isinstance(message, Ask):
                        self._ask(link, message)
                        continue
                    if isinstance(message, Kept):
                        self._kept(link, message)
                        continue
                    if isinstance(message, Take):
                        self._lanes_of().take(link.name, message, functools.partial(_answer, link))
                        continue
                    if isinstance(message, Give):
                        self._lanes_of().give(link.name, message)
                        continue
                    child = link.runs.get(message.run)
                    if child is not None:
                        child.deliver(message)
        except Exception as exc:
            reason = f"host {link.name!r} lost: {exception_text(exc)}"
            link.lost = reason
            dead = self._dead(link, exc)
            log.warning(
                "host lost", host=link.name, error=reason, running=len(link.runs), dead=dead
            )
            for child in list(link.runs.values()):
                child.deliver(Lost(reason, dead=dead))
            if self._lanes is not None:
                self._lanes.lost(link.name)

    def _lanes_of(self) -> Lanes:
        lanes = self._lanes
        if lanes is None:
            runtime, task_group = self.runtime, self._task_group
            assert runtime is not None
            assert task_group is not None
            lanes = self._lanes = Lanes(runtime.supervisor.rates, task_group)
        return lanes

    def _ask(self, link: HostLink, message: Ask) -> None:
        """A lease of ``link``'s host ran out: charge what its subtrees used (before
        any message of theirs that came later), then ask the ledger for more, and
        send its answer down when it comes."""
        lease = link.pools.get(message.pool)
        if lease is None:
            return  # it ended: nothing there waits for an answer
        asker: RemoteChild | None = None
        for run_id, tally in message.tallies:
            child = link.runs.get(run_id)
            if child is None or child.node.lease is not lease:
                continue
            child.supervisor.ledger.report(child.node, tally)
            if asker is None and lease.members[child.node].live:
                asker = child
        task_group = self._task_group
        if asker is not None and task_group is not None:
            ledger = asker.supervisor.ledger
            task_group.start_soon(self._answer, link, lease, ledger, asker.node, message.want)

    def _kept(self, link: HostLink, message: Kept) -> None:
        """A lease of ``link``'s host gave back what a reclaim asked."""
        lease = link.pools.get(message.pool)
        runtime = self.runtime
        if lease is not None and runtime is not None:
            runtime.supervisor.ledger.kept(lease, message.limits)

    @staticmethod
    async def _answer(link: HostLink, lease: Lease, ledger: Ledger, node: Node, want: Want) -> None:
        try:
            limits = await ledger.ask(node, lease.members[node].tally, want)
        except BudgetExceeded as exc:
            answer: Grant | Deny = Deny(pool=lease.ref, refusal=Refusal.of(exc))
        else:
            answer = Grant(pool=lease.ref, limits=limits, worth=dict(lease.hinted))
        if lease.live and not link.lost and link.pools.get(lease.ref) is lease:
            link.send(encode([answer]))  # (an idle or ended lease asks for nothing)

    def _publish(self, link: HostLink, message: Events) -> None:
        """A host's events, into this runtime's: marked with the host, at this
        runtime's time."""
        runtime = self.runtime
        if runtime is None:
            return
        bus = runtime.event_bus
        now = bus.now()
        replace = msgspec.structs.replace
        watched = self._watched
        for event in message.events:
            event = replace(event, at=now, detail=replace(event.detail, host=link.name))
            if bus.active:
                bus.publish(event)
            if not watched:
                continue
            key = event.execution_id
            watch = watched.get(key)
            if watch is None and event.kind == "execution_start":
                watch = watched.get(event.parent_id)  # a subagent of a watched one
                if watch is not None:
                    watched[key] = watch
            if watch is not None:
                watch(event)
                if event.kind == "execution_end":
                    del watched[key]


def _answer(link: HostLink, taken: Taken) -> None:
    """A host's request was admitted in a lane of this runtime: say so, if the host is
    still there."""
    if not link.lost:
        link.send(encode([taken]))


class _OnLink:
    """A subagent call placed on one host of ``hosts`` (a ``Placement``)."""

    __slots__ = ("hosts", "link")

    def __init__(self, hosts: RemoteHosts, link: HostLink) -> None:
        self.hosts = hosts
        self.link = link

    @property
    def host(self) -> str:
        return self.link.name

    def launch(
        self,
        agent: Agent,
        text: str,
        node: Node,
        supervisor: Supervisor,
        task_group: TaskGroup,
        *,
        parts: tuple[Media, ...] = (),
    ) -> RemoteReply:
        return self.hosts.launch(self.link, agent, text, node, supervisor, task_group, parts)


class _LocalLink(HostLink):
    def __init__(self, host: AgentHost, pool: str) -> None:
        super().__init__(host.name, pool)
        self.host = host
        #: The host's life: cancelled, it dies as a killed process would.
        self.scope = anyio.CancelScope()
        #: The wait for its next messages, cancelled too when it dies.
        self.receiving: anyio.CancelScope | None = None

    def start(self, run_id: int, agent: Agent, data: bytes) -> None:
        if not self.scope.cancel_called:
            self.host.start(data, agent)

    def send(self, data: bytes) -> None:
        if not self.scope.cancel_called:
            self.host.down(data)


class LocalHosts(RemoteHosts):
    """Hosts in this process: each an ``AgentHost`` with a runtime of its own, spoken
    to in bytes as a remote one is. ``pools`` maps a pool name to its number of hosts
    (``count`` hosts in the default pool by default)."""

    def __init__(
        self,
        count: int = 2,
        *,
        pools: dict[str, int] | None = None,
        placement: PlacementStrategy = "round_robin",
    ) -> None:
        super().__init__(placement=placement)
        self.pools = _pools(count, pools)

    async def _open(self, runtime: Runtime, task_group: TaskGroup) -> list[HostLink]:
        links: list[HostLink] = []
        for pool, count in self.pools.items():
            for index in range(count):
                host = AgentHost(self.config(runtime, f"{pool}-{index}"))
                link = _LocalLink(host, pool)
                task_group.start_soon(self._serve, link)
                await host.ready()
                links.append(link)
        return links

    @staticmethod
    async def _serve(link: _LocalLink) -> None:
        with link.scope:
            await link.host.serve()

    async def _receive(self, link: HostLink) -> bytes:
        assert isinstance(link, _LocalLink)
        if not link.scope.cancel_called:
            with anyio.CancelScope() as scope:
                link.receiving = scope
                return await link.host.drain()
        raise ConnectionError("the host process died")

    def _dead(self, link: HostLink, error: Exception) -> bool:
        assert isinstance(link, _LocalLink)
        return link.scope.cancel_called  # killed: its tasks are cancelled with it

    def kill(self, name: str) -> None:
        """Kill one host at once, as a process dies: its subtrees end with it."""
        for link in self.links:
            if link.name == name:
                assert isinstance(link, _LocalLink)
                link.scope.cancel()
                if link.receiving is not None:
                    link.receiving.cancel()
                return
        raise KeyError(f"no host {name!r}")


def _pools(count: int, pools: dict[str, int] | None) -> dict[str, int]:
    if pools is None:
        pools = {DEFAULT_POOL: count}
    for name, number in pools.items():
        if not isinstance(name, str) or not name:
            raise ValueError(f"a pool's name must be a non-empty string, got {name!r}")
        if isinstance(number, bool) or not isinstance(number, int) or number < 1:
            raise ValueError(f"pool {name!r} needs a whole number of hosts >= 1, got {number!r}")
    return dict(pools)
