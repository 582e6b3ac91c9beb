"""Agent hosts on Ray: subtrees of one tree run on other processes and machines.

::

    from fractor.actors.integrations.ray import RayHosts

    async with Runtime(hosts=RayHosts(2), budget=Budget(tokens=200_000)) as rt:
        result = await (await rt.spawn(lead)).ask("Research these 50 topics.")

Each host is **one Ray actor running one event loop with many agents** (an
``AgentHost``), never one Ray actor per agent: creating a Ray actor costs about
0.3 s and 90 MiB. The runtime places subtrees on them (see ``actors._hosts._hosts``: the
children of a top-level execution spread over the ``"default"`` pool; an agent with
``host="gpu"`` runs on a host of the pool ``"gpu"``, made with the resources its
``HostPool`` asks Ray for), and keeps its promises across them: one ledger (each
subtree runs under a lease of the budgets above it), one cancellation, one answer.

What crosses is fractor's messages as msgspec bytes; an agent definition (its model,
its tools: code) travels the way Ray ships code (cloudpickle: what the script run as
``__main__`` defines goes by value), once per host (``ray.put``, then cached there by
the driver's agent). A definition a host could not rebuild is refused before it is
sent (an object named by reference in ``__main__``, which a host's process is not; a
tool with a ``limiter``): its subagent call answers ``failed`` at once, saying what
and why. One that fails to rebuild on its host (a module the host cannot import)
makes the subtrees of that agent answer ``failed`` with the error; the others sent
with them run.

Ray is started for you on this machine when it is not running (``address=None``:
``ray.init`` with ``init`` as its keyword arguments, shut down again as the runtime
closes); ``address="ray://head:10001"`` (or ``"auto"``) joins an existing cluster,
which is left running. Ray picks each host's node (``RayHosts(scheduling=)``:
Ray's default, which lets a few small hosts share a node, ``"spread"`` or
``"strict_spread"``; see ``Scheduling``); ``RayHosts.nodes()`` says where they went.
The driver may run on asyncio or trio (hosts run asyncio
inside Ray); on trio, each host's messages are awaited in a worker thread.
"""

from __future__ import annotations

import asyncio
import math
import pickletools
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal, get_args

import anyio
import anyio.lowlevel
import msgspec
import ray
import ray.util
import sniffio
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from fractor.actors.hosts import (
    DEFAULT_POOL,
    AgentHost,
    HostConfig,
    HostLink,
    PlacementStrategy,
    RemoteHosts,
    exception_text,
)
from fractor.runtime import Runtime
from fractor.runtime.lowlevel import Waiter, new_waiter, park, wake

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from fractor.actors import Agent

__all__ = ["HostPool", "RayHosts", "Scheduling"]

#: Where Ray puts a pool's hosts among the cluster's nodes (``RayHosts(scheduling=)``):
#: ``"default"``, Ray's default (it fills a node up to about half its resources before
#: it uses another, so a few small hosts often share one node); ``"spread"``, Ray's
#: ``SPREAD`` strategy on each host (over as many nodes as can hold them, best effort:
#: hosts share a node only when the others cannot take one); ``"strict_spread"``, a
#: ``STRICT_SPREAD`` placement group per pool (each host of a pool on its own node, or
#: the runtime does not open: a pool cannot have more hosts than the cluster has nodes
#: able to hold one).
Scheduling = Literal["default", "spread", "strict_spread"]

#: How long one wait for a host's messages lasts before it is asked again (seconds):
#: bounds how long a trio worker thread outlives a closed runtime.
POLL_SECONDS = 1.0
#: What to do when a host cannot import what an agent's definition needs.
_IMPORTABLE = (
    "define it in a module the hosts can import; on a cluster, give them that module "
    "with Ray's runtime_env (RayHosts(init={'runtime_env': {'py_modules': [...]}}), "
    "or 'working_dir')"
)
#: How long a ``"strict_spread"`` pool's placement group may wait for its nodes
#: (seconds) before the runtime refuses to open.
PLACEMENT_SECONDS = 30.0


class HostPool(msgspec.Struct, frozen=True, kw_only=True):
    """``count`` hosts, each a Ray actor asking for these resources (``num_cpus`` and
    ``num_gpus`` as Ray counts them; ``resources``: custom ones, e.g. ``{"db": 1}``)."""

    count: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    resources: dict[str, float] = {}

    def __post_init__(self) -> None:
        if isinstance(self.count, bool) or not isinstance(self.count, int) or self.count < 1:
            raise ValueError(f"HostPool.count must be a whole number >= 1, got {self.count!r}")
        for name in ("num_cpus", "num_gpus"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"HostPool.{name} must be a finite number >= 0, got {value!r}")


class _Host:
    """The Ray actor: one ``AgentHost`` in the actor's event loop."""

    def __init__(self, config: bytes) -> None:
        self.config = msgspec.msgpack.decode(config, type=HostConfig)
        self.host: AgentHost | None = None
        #: Each agent shipped here by its key: rebuilt, or why it could not be.
        self.agents: dict[int, Agent | str] = {}
        self.task: asyncio.Task[None] | None = None

    async def ready(self) -> str:
        if self.host is None:
            self.host = AgentHost(self.config)
            self.task = asyncio.get_running_loop().create_task(self.host.serve())
        await self.host.ready()
        return self.config.name

    def node(self) -> str:
        """The id of the Ray node this host runs on (hex)."""
        return str(ray.get_runtime_context().get_node_id())

    async def send(self, items: list[tuple[int, bytes]], agents: dict[int, list[Any]]) -> None:
        """Messages in their order: ``(key, data)`` starts a subtree with the agent of
        ``key`` (its pickle in ``agents``, fetched and rebuilt once), ``(0, data)`` goes
        down. A subtree whose agent could not be rebuilt answers ``failed`` at once."""
        for key, boxed in agents.items():
            if key not in self.agents:
                self.agents[key] = await _rebuilt(boxed[0])
        host = self.host
        assert host is not None
        for key, data in items:
            if not key:
                host.down(data)
                continue
            agent = self.agents[key]
            if isinstance(agent, str):
                host.refuse(data, agent)
            else:
                host.start(data, agent)

    async def drain(self, timeout: float) -> bytes:
        assert self.host is not None
        return await self.host.drain(timeout)


_RayHost = ray.remote(_Host)


def _pickled(agent: Agent) -> bytes:
    """``agent``'s definition as a host rebuilds it (its model and tools travel as Ray
    ships code: cloudpickle), or a ``TypeError`` saying what a host could not rebuild."""
    try:
        data: bytes = ray.cloudpickle.dumps(agent)  # type: ignore[no-untyped-call]
    except Exception as exc:
        raise TypeError(
            f"agent {agent.name!r} cannot be sent to a host: {exception_text(exc)}"
        ) from exc
    named = sorted({name for module, name in _globals(data) if module == "__main__"})
    if named:
        raise TypeError(
            f"agent {agent.name!r} cannot be sent to a host: it refers to "
            f"{', '.join(f'__main__.{name}' for name in named)} by name, and a host's "
            f"__main__ is not this script; {_IMPORTABLE}"
        )
    return data


def _globals(data: bytes) -> set[tuple[str, str]]:
    """The ``(module, name)`` of each object a pickle names by reference (imported
    where it is loaded)."""
    named: set[tuple[str, str]] = set()
    pushed: list[Any] = []  # the last values pushed, as far as strings go
    memo: dict[int, Any] = {}
    for opcode, arg, _ in pickletools.genops(data):
        name = opcode.name
        if name in ("GLOBAL", "INST"):
            module, _, attribute = str(arg).partition(" ")
            named.add((module, attribute))
            pushed.append(None)
        elif name == "STACK_GLOBAL":
            if len(pushed) >= 2 and isinstance(pushed[-2], str) and isinstance(pushed[-1], str):
                named.add((pushed[-2], pushed[-1]))
            pushed.append(None)
        elif name == "MEMOIZE":
            memo[len(memo)] = pushed[-1] if pushed else None
        elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
            memo[int(arg)] = pushed[-1] if pushed else None  # type: ignore[arg-type]
        elif name in ("GET", "BINGET", "LONG_BINGET"):
            pushed.append(memo.get(int(arg)))  # type: ignore[arg-type]
        elif name not in ("PROTO", "FRAME", "STOP"):
            pushed.append(arg if isinstance(arg, str) and "UNICODE" in name else None)
        del pushed[:-2]
    return named


async def _rebuilt(ref: Any) -> Agent | str:
    """The agent shipped as ``ref``, rebuilt here; or why it could not be."""
    try:
        agent: Agent = ray.cloudpickle.loads(await ref)
    except Exception as exc:
        return (
            f"{exception_text(exc)}. A host imports what an agent's model and tools need: "
            f"{_IMPORTABLE}"
        )
    return agent


class _RayLink(HostLink):
    """One host: what goes to it is queued and sent by one task, in one Ray call per
    turn of the driver's loop (a step that starts 200 subtrees makes one call)."""

    def __init__(self, name: str, pool: str, actor: Any, hosts: RayHosts) -> None:
        super().__init__(name, pool)
        self.actor = actor
        self.hosts = hosts
        self.queued: list[tuple[int, bytes]] = []
        self.agents: dict[int, list[Any]] = {}
        self.waiter: Waiter | None = None

    def start(self, run_id: int, agent: Agent, data: bytes) -> None:
        key, ref = self.hosts.ship(agent)
        self.agents[key] = [ref]
        self._queue(key, data)

    def send(self, data: bytes) -> None:
        self._queue(0, data)

    def _queue(self, key: int, data: bytes) -> None:
        self.queued.append((key, data))
        if self.waiter is not None:
            wake(self.waiter)

    async def sender(self) -> None:
        while True:
            if not self.queued:
                self.waiter = new_waiter()
                try:
                    await park(self.waiter)
                finally:
                    self.waiter = None
            await anyio.lowlevel.checkpoint()  # let the step queue all it starts
            items, self.queued = self.queued, []
            agents, self.agents = self.agents, {}
            self.actor.send.remote(items, agents)


class RayHosts(RemoteHosts):
    """Hosts on Ray (see the module's docstring): ``count`` hosts in the default pool,
    or ``pools`` by name (``{"default": HostPool(count=2), "gpu": HostPool(num_gpus=1)}``).
    ``address`` joins a running Ray cluster (None: start one here, with ``init`` as
    ``ray.init``'s keyword arguments, if none runs in this process yet).
    ``scheduling`` says where Ray puts each pool's hosts among the cluster's nodes
    (``Scheduling``: ``"default"``, ``"spread"`` or ``"strict_spread"``); ``nodes()``
    says where they went."""

    def __init__(
        self,
        count: int = 2,
        *,
        pools: Mapping[str, HostPool] | None = None,
        placement: PlacementStrategy = "round_robin",
        address: str | None = None,
        init: Mapping[str, Any] | None = None,
        scheduling: Scheduling = "default",
    ) -> None:
        super().__init__(placement=placement)
        if scheduling not in get_args(Scheduling):
            raise ValueError(
                f"scheduling must be one of {', '.join(map(repr, get_args(Scheduling)))}, "
                f"got {scheduling!r}"
            )
        if pools is None:
            pools = {DEFAULT_POOL: HostPool(count=count)}
        for name, pool in pools.items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"a pool's name must be a non-empty string, got {name!r}")
            if not isinstance(pool, HostPool):
                raise TypeError(f"pool {name!r} must be a HostPool, got {type(pool).__qualname__}")
            if scheduling == "strict_spread" and not _bundle(pool):
                raise ValueError(
                    f"pool {name!r} asks Ray for no resources, so a 'strict_spread' "
                    f"placement group cannot hold its hosts: give it some "
                    f"(num_cpus, num_gpus or resources)"
                )
        self.pools = dict(pools)
        self.scheduling = scheduling
        self._groups: list[Any] = []
        self.address = address
        self.init = dict(init or {})
        self._owns_ray = False
        self._actors: list[Any] = []
        self._shipped: dict[int, tuple[Agent, Any]] = {}
        self._asyncio = True

    def ship(self, agent: Agent) -> tuple[int, Any]:
        """``agent``'s key and its pickle in Ray's store (put there once); a
        ``TypeError`` if a host could not rebuild it (nothing is sent)."""
        key = id(agent)
        shipped = self._shipped.get(key)
        if shipped is None:
            shipped = self._shipped[key] = (agent, ray.put(_pickled(agent)))
        return key, shipped[1]

    async def _open(self, runtime: Runtime, task_group: TaskGroup) -> list[HostLink]:
        self._asyncio = sniffio.current_async_library() == "asyncio"
        if not ray.is_initialized():
            options: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False}
            if self.address is None:  # a new instance, on this machine only
                options.update(address="local", _node_ip_address="127.0.0.1")
            else:
                options["address"] = self.address
            options.update(self.init)
            await anyio.to_thread.run_sync(lambda: ray.init(**options))
            self._owns_ray = True
        links: list[HostLink] = []
        for pool_name, pool in self.pools.items():
            group = await self._group(pool_name, pool)
            for index in range(pool.count):
                name = f"{pool_name}-{index}"
                config = msgspec.msgpack.encode(self.config(runtime, name))
                strategy: Any = "SPREAD" if self.scheduling == "spread" else "DEFAULT"
                if group is not None:
                    strategy = PlacementGroupSchedulingStrategy(
                        placement_group=group, placement_group_bundle_index=index
                    )
                actor = _RayHost.options(
                    num_cpus=pool.num_cpus,
                    num_gpus=pool.num_gpus,
                    resources=pool.resources or None,
                    max_concurrency=100_000,
                    scheduling_strategy=strategy,
                ).remote(config)
                self._actors.append(actor)
                links.append(_RayLink(name, pool_name, actor, self))
        for link in links:
            assert isinstance(link, _RayLink)
            await self._get(link.actor.ready.remote())
            task_group.start_soon(link.sender)
        return links

    async def _group(self, name: str, pool: HostPool) -> Any:
        """A ``"strict_spread"`` pool's placement group, ready (one bundle per host);
        None for the other schedulings."""
        if self.scheduling != "strict_spread":
            return None
        group = ray.util.placement_group([_bundle(pool)] * pool.count, strategy="STRICT_SPREAD")
        self._groups.append(group)
        if not await anyio.to_thread.run_sync(group.wait, PLACEMENT_SECONDS):
            raise RuntimeError(
                f"pool {name!r}: Ray found no {pool.count} distinct nodes each able to hold "
                f"one of its hosts ({_bundle(pool)}) within {PLACEMENT_SECONDS:g} s "
                f"(scheduling='strict_spread'); add nodes, ask for fewer hosts or "
                f"resources, or use scheduling='spread'"
            )
        return group

    async def nodes(self) -> dict[str, str]:
        """Each open host's name and the id of the Ray node it runs on (hex, as
        ``ray.nodes()`` and ``ray.get_runtime_context().get_node_id()`` give it)."""
        found: dict[str, str] = {}
        for link in self.links:
            assert isinstance(link, _RayLink)
            found[link.name] = await self._get(link.actor.node.remote())
        return found

    async def _get(self, ref: Any) -> Any:
        if self._asyncio:
            return await ref
        return await anyio.to_thread.run_sync(ray.get, ref, abandon_on_cancel=True)

    async def _receive(self, link: HostLink) -> bytes:
        assert isinstance(link, _RayLink)
        data: bytes = await self._get(link.actor.drain.remote(POLL_SECONDS))
        return data

    def _dead(self, link: HostLink, error: Exception) -> bool:
        # Ray says the actor's process ended and will not restart (a lost node, an
        # out-of-memory kill, ray.kill); a timeout or an unavailable actor may not be.
        return isinstance(error, ray.exceptions.ActorDiedError)

    def kill(self, name: str) -> None:
        """Kill one host's Ray actor at once (as a crash would): for tests and drills."""
        for link in self.links:
            if link.name == name:
                assert isinstance(link, _RayLink)
                ray.kill(link.actor, no_restart=True)
                return
        raise KeyError(f"no host {name!r}")

    async def _shutdown(self) -> None:
        actors, self._actors = self._actors, []
        groups, self._groups = self._groups, []
        self._shipped.clear()
        if not ray.is_initialized():
            return
        for actor in actors:
            ray.kill(actor, no_restart=True)
        for group in groups:
            ray.util.remove_placement_group(group)
        if self._owns_ray:
            self._owns_ray = False
            await anyio.to_thread.run_sync(ray.shutdown)


def _bundle(pool: HostPool) -> dict[str, float]:
    """What one host of ``pool`` asks Ray for, as a placement group's bundle (no zeros)."""
    bundle = {"CPU": pool.num_cpus, "GPU": pool.num_gpus, **pool.resources}
    return {name: amount for name, amount in bundle.items() if amount > 0}
