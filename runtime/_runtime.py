"""The ``Runtime``: the one task group every actor lives in.

::

    async with Runtime() as rt:
        ref = await rt.spawn(Echo())
        print(await ref.ask("hi"))

Leaving the block stops every actor gracefully: mailboxes refuse new messages,
actors handle what is already queued, and whatever still runs after ``grace``
seconds is cancelled. An exception or a cancellation from the body cancels them at
once. No task started by the runtime outlives the ``async with`` block.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Hashable, Mapping
from contextlib import AbstractAsyncContextManager
from types import TracebackType
from typing import Any, Literal, Protocol, TypeVar

import anyio
import structlog
from anyio.abc import TaskGroup, TaskStatus

from ._actor import Spawnable
from ._admission import OutputSharing
from ._budget import Budget, Caps, Price
from ._cell import TASK_HANDLES, ActorGroup, Cell
from ._events import EventBus, Subscription
from ._exceptions import DuplicateActor, RuntimeClosed
from ._messages import RuntimeStatistics
from ._rates import RateLimit
from ._ref import ActorRef
from ._store import Store
from ._supervisor import DEFAULT_MAX_TOKENS, MIN_OUTPUT_TOKENS, Supervisor
from ._tree import TreeSnapshot

__all__ = ["Hosts", "Runtime"]

R = TypeVar("R")
log = structlog.get_logger("fractor.runtime")

State = Literal["not started", "running", "closing", "closed"]


#: The default caps of every runtime (see ``Caps``).
DEFAULT_CAPS = Caps()
#: How long closing the runtime waits for its shared resources (``Runtime.enter``)
#: to exit, all together, before cancelling what is left.
RESOURCE_CLOSE_TIMEOUT = 5.0


class _Resource:
    """One context entered by ``Runtime.enter``: held open by a task of its own."""

    __slots__ = ("done", "error", "ready", "release", "scope", "value")

    def __init__(self) -> None:
        self.ready = anyio.Event()
        self.release = anyio.Event()
        self.done = anyio.Event()
        self.scope = anyio.CancelScope(shield=True)
        self.value: Any = None
        self.error: BaseException | None = None


class Hosts(Protocol):
    """Other processes where a layer above the kernel runs subtrees of the tree (the
    agents layer's ``RayHosts``, for one): ``Runtime(hosts=...)`` starts them as it
    is entered, before any actor, and closes them as it is left, after every actor
    ended (their subtrees answered through them)."""

    async def start(self, runtime: Runtime) -> None: ...

    async def aclose(self) -> None: ...


class Closeable(Protocol):
    """Something the runtime closes as it exits (``Runtime.close_on_exit``)."""

    async def aclose(self) -> None: ...


#: The key ``enter`` holds ``Runtime(ui=...)``'s context under.
_UI_KEY = ("fractor.runtime", "ui")


class _NotRunning(BaseException):
    """Never raised: ``Runtime.cancelled`` until the runtime runs."""


class Runtime:
    """Owns every actor in one task group. Use it as an async context manager.

    ``budget`` limits everything the runtime runs; ``prices`` (per model name) let
    the supervisor compute cost. ``grace`` is how long leaving the
    block waits for actors to finish their queued messages before cancelling them;
    ``mailbox_size`` is the default capacity of a new actor's mailbox when its class
    does not set one. ``store`` is where actors that persist keep their state and
    records (agents resume their conversation from it); the caller owns it: the
    runtime never opens or closes it, so close it after leaving the runtime's block.
    ``log_events`` writes every event of the tree through structlog; observers can
    subscribe with ``rt.events()`` either way. ``min_output_tokens`` is the least
    output a model request is sent with under a budget (capped by the request's own
    ``max_tokens``): a budget whose settled usage leaves less than that plus the
    input estimate is spent; ``default_max_tokens`` is what a request that names no
    ``max_tokens`` reserves first (a reply cut there is asked again with room for
    twice as much; see ``Supervisor``). ``caps`` bound any tree,
    budget or not (depth 8, 10,000 executions per top-level execution, 200 steps per
    execution by default; see ``Caps``): ``caps=None`` removes them. ``hosts`` are
    other processes where subtrees of the tree may run (see ``Hosts`` and
    ``fractor.actors.integrations.ray.RayHosts``): started on entering, closed on leaving.
    ``output_sharing`` is how requests in flight under one output-capping limit
    (tokens, output tokens, cost) share its headroom: ``"fair"`` (a fair share each:
    they run together, and a reply longer than its share is cut and asked again) or
    ``"whole"`` (each reserves all it wants or waits for requests in flight: a reply
    is cut only when the budget itself is short; requests serialize under a tight
    limit). ``rate_limits`` are what each model (by name, as ``prices``) may be sent
    per minute and at once (``RateLimit``): every request of the runtime waits in its
    model's lane for room rather than be refused; a model with none declared still
    pauses as a server asks and adapts its concurrency once refused (see
    ``Supervisor.rates``). A request a server refused for its rate limits (a 429: not
    billed) is charged nothing, and counts against ``requests`` limits only with
    ``count_refused=True``. ``tool_limits`` cap the calls of a tool (by name) in
    flight at once in the whole runtime, whatever agent makes them (a call waits for
    a slot, in line; its lane is ``tool:<name>``).
    """

    def __init__(
        self,
        *,
        budget: Budget | None = None,
        prices: dict[str, Price] | None = None,
        grace: float = 5.0,
        mailbox_size: int | None = None,
        store: Store | None = None,
        log_events: bool = False,
        min_output_tokens: int = MIN_OUTPUT_TOKENS,
        default_max_tokens: int = DEFAULT_MAX_TOKENS,
        caps: Caps | None = DEFAULT_CAPS,
        hosts: Hosts | None = None,
        output_sharing: OutputSharing = "fair",
        rate_limits: dict[str, RateLimit] | None = None,
        count_refused: bool = False,
        tool_limits: dict[str, int] | None = None,
        ui: Callable[[Runtime], AbstractAsyncContextManager[Any]] | None = None,
    ) -> None:
        if (
            isinstance(grace, bool)
            or not isinstance(grace, int | float)
            or not math.isfinite(grace)
            or grace < 0
        ):
            raise ValueError(f"grace must be a finite number of seconds >= 0, got {grace!r}")
        _check_mailbox_size(mailbox_size)
        if budget is not None and not isinstance(budget, Budget):
            raise TypeError(f"budget must be a fractor.Budget, got {type(budget).__qualname__}")
        _check_prices(prices)
        if store is not None and not all(
            callable(getattr(store, method, None)) for method in ("load", "save")
        ):
            raise TypeError(
                "store must implement fractor.Store (async load() and save(), like "
                f"MemoryStore or SQLiteStore) or be None, got {type(store).__qualname__}"
            )
        if hosts is not None and not all(
            callable(getattr(hosts, method, None)) for method in ("start", "aclose")
        ):
            raise TypeError(
                "hosts must implement fractor.Hosts (async start() and aclose(), like "
                "fractor.actors.integrations.ray.RayHosts) or be None, got "
                f"{type(hosts).__qualname__}"
            )
        if not isinstance(log_events, bool):
            raise TypeError(f"log_events must be a bool, got {log_events!r}")
        #: Limits over everything this runtime runs.
        self.budget = budget
        #: The tree of executions and their budgets.
        self.supervisor = Supervisor(
            budget,
            prices,
            min_output_tokens=min_output_tokens,
            default_max_tokens=default_max_tokens,
            caps=caps,
            output_sharing=output_sharing,
            rate_limits=rate_limits,
            count_refused=count_refused,
            tool_limits=tool_limits,
        )
        self.grace = grace
        #: Where subtrees may run besides this process (None: only here).
        self.hosts = hosts
        if ui is not None and not callable(ui):
            raise TypeError(
                "ui must be a callable taking the runtime and returning an async context "
                f"manager (fractor.serve_ui), got {type(ui).__qualname__}"
            )
        self._ui_factory = ui
        #: What ``ui`` gave once entered (``serve_ui``'s ``UI``: its ``url``); None
        #: without one, or until the runtime runs.
        self.ui: Any = None
        self.mailbox_size = mailbox_size
        #: Where actors persist their state; None keeps everything in memory.
        self.store = store
        #: The tree's events (see ``events``); off unless observed or logged.
        self.event_bus = EventBus(log_events=log_events)
        self.cancelled_exc: type[BaseException] = _NotRunning  # set on entering
        self._state: State = "not started"
        self._task_group: TaskGroup | None = None
        self._resource_group: TaskGroup | None = None
        self._resources: dict[Hashable, _Resource] = {}
        self._held: list[_Resource] = []  # every one started, in order, to release
        #: What ``close_on_exit`` was given, by identity, in order (closed in reverse).
        self._closing: dict[int, Closeable] = {}
        self._root = ActorGroup()
        self._cells: dict[str, Cell] = {}
        self._ids = itertools.count(1)
        self._spawned = 0
        self._stopped = 0
        self._handled_by_stopped = 0
        self._failed_by_stopped = 0

    @property
    def state(self) -> State:
        return self._state

    async def __aenter__(self) -> Runtime:
        if self._state != "not started":
            raise RuntimeClosed(self._state)
        #: The backend's cancellation exception, looked up once (each lookup asks
        #: which backend runs; a cancelled tree of 1,000 agents would ask 1,000 times).
        self.cancelled_exc = anyio.get_cancelled_exc_class()
        if self.hosts is not None:
            await self.hosts.start(self)
        resource_group = anyio.create_task_group()
        await resource_group.__aenter__()
        self._resource_group = resource_group
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        self._task_group = task_group
        self._root.task_group = task_group
        self.supervisor.start()
        self.event_bus.start()
        self._state = "running"
        factory = self._ui_factory
        if factory is not None:
            try:
                self.ui = await self.enter(_UI_KEY, lambda: factory(self))
            except BaseException as exc:
                # Not entered: leave as a failed body would, then say why.
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        task_group = self._task_group
        assert task_group is not None
        self._state = "closing"
        self.event_bus.close()
        self._root.close_all("runtime closed")
        if exc_type is None:
            task_group.cancel_scope.deadline = anyio.current_time() + self.grace
        try:
            return await task_group.__aexit__(exc_type, exc, tb)
        except BaseExceptionGroup as group:
            # The body's own exception, alone: let it through as it was raised.
            if exc is not None and len(group.exceptions) == 1 and group.exceptions[0] is exc:
                return False
            raise
        finally:
            self._state = "closed"
            self._task_group = None
            try:
                await self._close_owned()
                await self._close_resources()
            finally:
                if self.hosts is not None:
                    await self.hosts.aclose()

    def close_on_exit(self, resource: Closeable) -> None:
        """Have ``resource.aclose()`` awaited once when the runtime exits: after every
        actor ended, before the contexts of ``enter`` are exited, in the reverse order
        of the first call for each (a resource given again, the same object, is not
        added twice). Never waits, so an actor can hand over what it uses as it
        starts; each close is shielded and bounded by ``RESOURCE_CLOSE_TIMEOUT``, and
        an error in one is logged, not raised, so the others are closed too.
        """
        if self._state == "closed":
            raise RuntimeClosed(self._state)
        self._closing.setdefault(id(resource), resource)

    async def _close_owned(self) -> None:
        owned, self._closing = self._closing, {}
        with anyio.CancelScope(shield=True):
            for resource in reversed(owned.values()):
                with anyio.move_on_after(RESOURCE_CLOSE_TIMEOUT):
                    try:
                        await resource.aclose()
                    except Exception as exc:
                        log.warning(
                            "not closed", resource=type(resource).__qualname__, error=repr(exc)
                        )

    async def enter(
        self, key: Hashable, factory: Callable[[], AbstractAsyncContextManager[R]]
    ) -> R:
        """The value of the context ``factory()`` makes, entered once per ``key`` and
        shared: later calls with the same key get the same value (concurrent first
        calls wait for the one that enters it). Each context is held open by a task of
        the runtime and exited when the runtime closes, after its actors stopped, in
        the reverse order of entering, on every path (shielded, bounded by
        ``RESOURCE_CLOSE_TIMEOUT``). A context that fails to enter raises here, to
        every waiter, and is not kept: the next call tries again.
        """
        while True:
            group = self._resource_group
            if group is None or self._state == "closed":
                raise RuntimeClosed(self._state)
            resource = self._resources.get(key)
            if resource is None:
                resource = self._resources[key] = _Resource()
                self._held.append(resource)
                try:
                    resource.value = await group.start(self._hold, resource, factory)
                except BaseException as exc:
                    resource.error = exc
                    del self._resources[key]
                    raise
                finally:
                    resource.ready.set()
                return resource.value  # type: ignore[no-any-return]
            await resource.ready.wait()
            if resource.error is None:
                return resource.value  # type: ignore[no-any-return]
            if isinstance(resource.error, Exception):
                raise resource.error
            # The first caller was cancelled while entering: try again.

    async def _hold(
        self,
        resource: _Resource,
        factory: Callable[[], AbstractAsyncContextManager[Any]],
        *,
        task_status: TaskStatus[Any] = anyio.TASK_STATUS_IGNORED,
    ) -> None:
        started = False
        try:
            # Shielded from entering to exiting: a cancellation of the runtime's body
            # must not cut the context's exit short; the runtime releases it when it
            # closes (and cancels this scope past RESOURCE_CLOSE_TIMEOUT).
            with resource.scope:
                async with factory() as value:
                    started = True
                    task_status.started(value)
                    await resource.release.wait()
        except Exception:
            if not started:
                raise
            # A context that fails on exit is closed all the same; nothing to report to.
        finally:
            resource.done.set()

    async def _close_resources(self) -> None:
        group = self._resource_group
        if group is None:
            return
        self._resource_group = None
        resources, self._held = self._held, []
        self._resources.clear()
        with anyio.CancelScope(shield=True):
            with anyio.move_on_after(RESOURCE_CLOSE_TIMEOUT):
                for resource in reversed(resources):
                    resource.release.set()
                    await resource.done.wait()
            for resource in resources:
                resource.scope.cancel()
        group.cancel_scope.cancel()
        # Outside the shield: a task group exits in the cancel scope it was entered in.
        await group.__aexit__(None, None, None)

    async def spawn(
        self,
        spawnable: Spawnable[R],
        *,
        id: str | None = None,
        name: str | None = None,
        mailbox_size: int | None = None,
    ) -> R:
        """Start an actor and return its reference once it is ready.

        ``spawnable`` is an ``Actor`` instance (giving an ``ActorRef``) or a
        definition such as ``actors.Agent`` (giving its own kind of reference).
        ``id`` must be unique among live actors; by default it is ``name-N``.
        """
        _check_spawn(spawnable, name, mailbox_size)
        if self._state != "running":
            raise RuntimeClosed(self._state)
        return await self._spawn_in(self._root, None, spawnable, id, name, mailbox_size)

    async def spawn_child(
        self,
        parent: Cell,
        spawnable: Spawnable[R],
        *,
        id: str | None = None,
        name: str | None = None,
        mailbox_size: int | None = None,
    ) -> R:
        """Start an actor in ``parent``'s own task group (used by ``ActorContext.spawn``)."""
        _check_spawn(spawnable, name, mailbox_size)
        if parent.children.task_group is None:
            if not parent.actor.spawns_children:
                raise RuntimeError(
                    f"actor {parent.id!r} was declared with spawns_children = False; "
                    "set it to True to spawn children"
                )
            raise RuntimeClosed(f"stopping actor {parent.id!r}")
        return await self._spawn_in(parent.children, parent.id, spawnable, id, name, mailbox_size)

    def spawn_soon(
        self,
        parent: Cell,
        spawnable: Spawnable[R],
        *,
        task_group: TaskGroup,
        id: str | None = None,
        name: str | None = None,
        mailbox_size: int | None = None,
    ) -> R:
        """Start an actor in ``task_group`` without waiting for it to be ready (used
        by ``ActorContext.spawn_soon``)."""
        if self._state != "running":
            raise RuntimeClosed(self._state)
        cell = self._new_cell(
            None, parent.id, spawnable, id, name, mailbox_size, own_scope=not TASK_HANDLES
        )
        # The task's handle cancels the child: no cancel scope of the cell's own.
        cell.handle = task_group.start_soon(cell.run, name=cell.id)
        return spawnable.make_ref(cell.ref)

    async def _spawn_in(
        self,
        group: ActorGroup,
        parent_id: str | None,
        spawnable: Spawnable[R],
        id: str | None,
        name: str | None,
        mailbox_size: int | None,
    ) -> R:
        cell = self._new_cell(group, parent_id, spawnable, id, name, mailbox_size)
        ref = await group.start(cell)
        return spawnable.make_ref(ref)

    def _new_cell(
        self,
        group: ActorGroup | None,
        parent_id: str | None,
        spawnable: Spawnable[object],
        id: str | None,
        name: str | None,
        mailbox_size: int | None,
        *,
        own_scope: bool = True,
    ) -> Cell:
        actor = spawnable.new_actor()
        spawnable_name = getattr(spawnable, "name", None)
        if not isinstance(spawnable_name, str):
            spawnable_name = type(actor).__name__.lower()
        name = name or spawnable_name
        named = id is not None
        if id is None:  # past the ids given at spawn that have this shape
            id = f"{name}-{next(self._ids)}"
            while id in self._cells:
                id = f"{name}-{next(self._ids)}"
        elif not isinstance(id, str) or not id:
            raise ValueError(f"actor id must be a non-empty string, got {id!r}")
        else:
            _check_text(id, "actor id")
        if id in self._cells:
            raise DuplicateActor(id)
        parent = self._cells.get(parent_id) if parent_id is not None else None
        cell = Cell(
            actor,
            id=id,
            name=name,
            parent_id=parent_id,
            mailbox_size=mailbox_size or self.mailbox_size or actor.mailbox_size,
            runtime=self,
            group=group,
            own_scope=own_scope,
            depth=parent.depth + 1 if parent is not None else 1,
            named=named,
        )
        self._cells[id] = cell
        self._spawned += 1
        return cell

    def cell_finished(self, cell: Cell) -> None:
        """Called by a cell as it stops (synchronously, from its own task)."""
        if self._cells.get(cell.id) is cell:
            del self._cells[cell.id]
            self._stopped += 1
            self._handled_by_stopped += cell.mailbox.handled
            self._failed_by_stopped += cell.mailbox.failed

    def ref(self, actor_id: str) -> ActorRef:
        """The reference of the live actor ``actor_id``; ``KeyError`` if there is none."""
        try:
            return self._cells[actor_id].ref
        except KeyError:
            raise KeyError(f"no live actor with id {actor_id!r}") from None

    def statistics(self) -> RuntimeStatistics:
        """A snapshot of the whole runtime; never waits, stops nothing."""
        cells = self._cells.values()
        ledger = self.supervisor.ledger
        lanes = self.supervisor.rates.statistics()
        return RuntimeStatistics(
            live_actors=len(self._cells),
            spawned=self._spawned,
            stopped=self._stopped,
            handled=self._handled_by_stopped + sum(c.mailbox.handled for c in cells),
            failed=self._failed_by_stopped + sum(c.mailbox.failed for c in cells),
            pending_asks=sum(len(c.pending) for c in cells),
            budget_waiting=self.supervisor.waiting,
            budget_waits=self.supervisor.waits,
            budget_wait_seconds=self.supervisor.wait_seconds,
            lease_asks=ledger.asks,
            lease_refusals=ledger.refusals,
            lease_waits=ledger.waits,
            rate_waits=sum(lane.waits for lane in lanes.values()),
            rate_wait_seconds=sum(lane.wait_seconds for lane in lanes.values()),
            rate_refused=sum(lane.refused for lane in lanes.values()),
            lanes=lanes,
        )

    def events(self, buffer: int = 1_000) -> AbstractAsyncContextManager[Subscription]:
        """Subscribe to the tree's events: ``async with rt.events() as events: ...``.

        ``buffer`` bounds what waits for a slow observer; past it, events are dropped
        for that observer only and counted (``Subscription.missed``, ``Event.missed``).
        """
        return self.event_bus.subscribe(buffer)

    def tree(self) -> TreeSnapshot:
        """A live snapshot of the supervisor's tree; never waits, stops nothing."""
        return self.supervisor.snapshot()


def _check_mailbox_size(mailbox_size: object) -> None:
    if mailbox_size is not None and (
        isinstance(mailbox_size, bool) or not isinstance(mailbox_size, int) or mailbox_size < 1
    ):
        raise ValueError(f"mailbox_size must be a whole number >= 1 or None, got {mailbox_size!r}")


def _check_prices(prices: object) -> None:
    """``prices`` is None or a mapping of model names to ``Price``."""
    if prices is None:
        return
    if not isinstance(prices, Mapping):
        raise TypeError(
            "prices must be a mapping of model names to fractor.Price, "
            f"got {type(prices).__qualname__}"
        )
    for model, price in prices.items():
        if not isinstance(model, str) or not isinstance(price, Price):
            raise TypeError(
                "prices must map model names (str) to fractor.Price, "
                f"got {model!r}: {type(price).__qualname__}"
            )


def _check_text(text: str, what: str) -> None:
    """``text`` encodes as UTF-8: a lone surrogate (``"\\udc80"``, from a bytes name
    decoded with ``surrogateescape``, say) cannot be stored, logged or sent to a host,
    so it is refused where it comes in rather than deep in a store's SQL."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"{what} must encode as UTF-8, got {text!r} (a lone surrogate at {exc.start})"
        ) from None


def _check_spawn(spawnable: object, name: object, mailbox_size: object) -> None:
    """What ``spawn`` takes, checked before any actor is made (``id`` is checked as
    the cell is made: its default depends on the name)."""
    if isinstance(spawnable, type) or not callable(getattr(spawnable, "new_actor", None)):
        shown = (
            f"the class {spawnable.__qualname__}"
            if isinstance(spawnable, type)
            else (type(spawnable).__qualname__)
        )
        raise TypeError(
            f"spawn takes an Actor instance or a definition such as fractor.Agent, got {shown}"
        )
    if name is not None and (not isinstance(name, str) or not name):
        raise ValueError(f"actor name must be a non-empty string or None, got {name!r}")
    if name is not None:
        _check_text(name, "actor name")
    _check_mailbox_size(mailbox_size)
