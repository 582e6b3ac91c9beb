"""One set of rate limits for a runtime and its hosts: a host's requests wait in the
driver's lanes.

A runtime's declared lanes (``Runtime(rate_limits=...)`` and ``tool_limits``) bound
everything the runtime runs, subtrees on other hosts included: four hosts must not
each send the full rate. So a host's runtime keeps no limits of its own for them:
its ``Rates`` is a ``HostRates``, which forwards each request of a declared lane to
the driver (``Take``: wait in line there, ``Taken``: admitted), and what came of it
(``Give``: settled with its usage, given back, or refused by the server with the
pause it asked for; a pause then holds every request of the lane, on every host).
Lanes that were not declared (a model with no limits) stay local to the host, and
cost nothing.

One round trip a request of a declared lane: a model request that a rate limit
bounds takes far longer than that. The driver's side is ``Lanes``, one per
``RemoteHosts``: the passes its hosts hold, given back whole when a host is lost.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from typing import TYPE_CHECKING

import anyio
import msgspec

from fractor.runtime import RateLimit
from fractor.runtime.lowlevel import Lane, Pass, Rates, Waiter, new_waiter, park, wake

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

__all__ = ["Give", "HostRates", "Lanes", "Take", "Taken"]


class Take(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: a request of the host waits for room in the driver's ``lane``."""

    id: int
    lane: str
    input: int
    output: int


class Give(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Up: what came of a request taken (or still waiting) in a driver's lane: its
    ``usage`` (input and output tokens: settled), or nothing (given back whole:
    cut off, never sent), or ``refused`` by the server (with the ``pause`` it
    asked, if it said). ``pause`` alone (``id`` 0): the server said nothing is left
    until then."""

    id: int
    lane: str = ""
    input: int = 0
    output: int = 0
    used: bool = False
    refused: bool = False
    pause: float | None = None


class Taken(msgspec.Struct, frozen=True, kw_only=True, tag=True):
    """Down: the request ``id`` of the host was admitted in its lane."""

    id: int


class _RemotePass(Pass):
    """A pass of a lane the driver keeps: its id there."""

    __slots__ = ("id",)

    def __init__(self, lane: Lane, id: int) -> None:
        super().__init__(lane)
        self.id = id


class HostRates(Rates):
    """A host runtime's lanes: those the driver declared are the driver's (see the
    module), the others are the host's own, as in any runtime."""

    def __init__(
        self,
        limits: dict[str, RateLimit],
        post: Callable[[Take | Give], None],
        now: Callable[[], float],
        *,
        count_refused: bool = False,
    ) -> None:
        super().__init__(limits, now, count_refused=count_refused)
        self._post = post
        self._ids = itertools.count(1)
        #: Requests waiting for the driver's answer, by id.
        self._waiting: dict[int, Waiter] = {}

    def taken(self, id: int) -> None:
        """The driver admitted request ``id``."""
        waiter = self._waiting.pop(id, None)
        if waiter is not None:
            wake(waiter)

    def _remote(self, lane: Lane) -> bool:
        return lane.name in self.limits

    def try_acquire(self, lane: Lane, input: int, output: int) -> Pass | None:
        if self._remote(lane):
            return None  # (the driver answers: ``acquire``)
        return super().try_acquire(lane, input, output)

    async def acquire(
        self,
        lane: Lane,
        input: int,
        output: int,
        on_wait: Callable[[str], None] | None = None,
    ) -> Pass:
        if not self._remote(lane):
            return await super().acquire(lane, input, output, on_wait)
        id = next(self._ids)
        waiter = self._waiting[id] = new_waiter()
        self._post(Take(id=id, lane=lane.name, input=input, output=output))
        try:
            await park(waiter)
        except BaseException:
            # Cut off in line (or as it was admitted): the driver lets it go.
            self._waiting.pop(id, None)
            self._post(Give(id=id, lane=lane.name))
            raise
        lane.in_flight += 1
        return _RemotePass(lane, id)

    def settle(self, taken: Pass, input: int, output: int, answered: float | None = None) -> None:
        if not isinstance(taken, _RemotePass):
            super().settle(taken, input, output, answered)
        elif taken.open:
            self._close(taken)
            self._post(Give(id=taken.id, input=input, output=output, used=True))

    def refund(self, taken: Pass) -> None:
        if not isinstance(taken, _RemotePass):
            super().refund(taken)
        elif taken.open:
            self._close(taken)
            self._post(Give(id=taken.id))

    def refused(self, taken: Pass, retry_after: float | None) -> None:
        if not isinstance(taken, _RemotePass):
            super().refused(taken, retry_after)
        elif taken.open:
            self._close(taken)
            taken.lane.refused += 1
            self._post(Give(id=taken.id, refused=True, pause=retry_after))

    def spent(self, lane: Lane, reset: float) -> None:
        if self._remote(lane):
            self._post(Give(id=0, lane=lane.name, pause=reset))
            return
        super().spent(lane, reset)


class Lanes:
    """The driver's side: its hosts' requests in its lanes (see the module)."""

    def __init__(self, rates: Rates, task_group: TaskGroup) -> None:
        self.rates = rates
        self.task_group = task_group
        #: Per host (its link's name): passes held (with what each took), and
        #: requests still in line (the scope that ends their wait).
        self._held: dict[str, dict[int, tuple[Pass, int, int]]] = {}
        self._waiting: dict[str, dict[int, anyio.CancelScope]] = {}

    def take(self, host: str, message: Take, answer: Callable[[Taken], None]) -> None:
        """A host's request waits in ``message.lane``: admitted, it is answered."""
        rates = self.rates
        lane = rates.lane(message.lane)
        taken = rates.try_acquire(lane, message.input, message.output)
        held = (message.input, message.output)
        if taken is not None:
            self._held.setdefault(host, {})[message.id] = (taken, *held)
            answer(Taken(id=message.id))
            return
        scope = anyio.CancelScope()
        self._waiting.setdefault(host, {})[message.id] = scope

        async def wait() -> None:
            with scope:
                got = await rates.acquire(lane, message.input, message.output)
                self._held.setdefault(host, {})[message.id] = (got, *held)
                answer(Taken(id=message.id))
            self._waiting.get(host, {}).pop(message.id, None)

        self.task_group.start_soon(wait)

    def give(self, host: str, message: Give) -> None:
        """What came of a host's request in a lane."""
        rates = self.rates
        if not message.id:  # the server said a lane is spent until a reset
            if message.pause:
                rates.spent(rates.lane(message.lane), message.pause)
            return
        scope = self._waiting.get(host, {}).pop(message.id, None)
        if scope is not None:
            scope.cancel()  # still in line: it leaves it
        entry = self._held.get(host, {}).pop(message.id, None)
        if entry is None:
            return
        taken = entry[0]
        if message.refused:
            rates.refused(taken, message.pause)
        elif message.used:
            rates.settle(taken, message.input, message.output)
        else:
            rates.refund(taken)

    def lost(self, host: str) -> None:
        """``host`` was lost: its requests in line leave it, and what it held comes back
        (a request in flight there may have been billed: its charges stay)."""
        for scope in self._waiting.pop(host, {}).values():
            scope.cancel()
        for taken, input, output in self._held.pop(host, {}).values():
            self.rates.settle(taken, input, output)
