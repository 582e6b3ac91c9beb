"""Leases: one ledger for a tree whose subtrees run on other hosts.

A subtree placed on another host (another process, another machine) runs under a
supervisor of its own there, which cannot see the budgets of the tree it belongs to.
So its top node there runs under a **lease**: limits of its own, made of headroom
granted by the node it hangs from here, field by field, for every limit of that
node's chain (tokens, input and output tokens, cost, requests, tool calls, steps,
agents; depth travels as it is, time as a deadline in seconds).

Here, what a lease grants and its subtree has not used yet is **held**: it counts
on every node of the chain like a request in flight, so nobody else spends it, and
a request or a charge that only held headroom stands in the way of **waits** for it
(it never stops: admission stays honest). A lease ends in one of three ways:

- **Reports** (``report``): the remote subtree's usage so far, charged here on the
  whole chain; the hold shrinks by as much (the subtree never overshoots its lease).
- **Asks** (``ask``): the remote subtree ran out (an operation there needs more
  than its lease has left). It reports, gives back what it does not hold in flight
  of the fields it asks for, and asks for at least what it needs of them. The ask is
  admitted exactly like a request here: **spent** (the settled usage of a node of
  the chain leaves no room for what it needs: that node stops with its subtree and
  the ask is refused with the same ``BudgetExceeded``), or **waits** (first come,
  first served, while held headroom stands in the way), or is **granted** what it
  needs or, when more, its share of the free headroom: the parts it stands for (the
  executions of its subtree that may ask next, ``Tally.leaves``) of all the parts
  under the budget (every such execution, here or on any host). A lease thus grows
  with what is free and shrinks geometrically as the budget runs out: a subtree
  asks again after spending a share, not after a few operations, so round trips
  grow with the log of budget over request, not with the work.
- **Ends** (``end``): the subtree answered; its last report is charged and the rest of
  its hold comes back. Or the host was lost (``end(..., lost=True)``): what it was
  granted and never reported is **counted as spent**, never refunded on a guess.

On the host, the top node of the subtree has a ``lender``: where its own admission
would stop the subtree because the lease ran out, it asks the lender (once nothing
of its own in flight there could come back) and waits; ``extend`` applies the new
limits, and a refusal stops the subtree with the reason given here.

The ledger is a part of the supervisor that knows nothing of it: it is handed the
root of the tree, the runtime's caps, and what to call to serve the requests waiting
on a chain whose holds changed (``serve``) and to stop a subtree (``stop``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

from ._admission import overshoot
from ._budget import FIELDS, LEASED, Budget, Caps, Usage
from ._exceptions import BudgetExceeded
from ._lease import HINT, LOST_WHY, Held, Lease, Tally, Want, reserved, zero
from ._snapshots import EndStatus
from ._tree import Node, stopped
from ._waiter import Waiter, new_waiter, park, wake

__all__ = ["GROWTH", "Ledger"]

#: A grant is at most this many times what a whole operation of the ask takes for
#: each of the lease's parts (a model request with all the output it wants), or what
#: the lease used so far: a fresh lease holds a few whole requests.
GROWTH = 4

#: Relative slack for comparing costs (floating point sums), as in admission.
_COST_EPSILON = 1e-9


class _Ask:
    __slots__ = ("answer", "fields", "node", "waiter", "want")

    def __init__(self, node: Node, want: Want, waiter: Waiter, fields: tuple[str, ...]) -> None:
        self.node = node
        self.want = want
        self.waiter = waiter
        #: The leased fields it asks for.
        self.fields = tuple(name for name in fields if getattr(want, name))
        self.answer: Budget | BudgetExceeded | None = None


class Ledger:
    """The leases of one supervisor's tree (see the module's docstring)."""

    def __init__(
        self,
        root: Node,
        caps: Caps | None,
        *,
        serve: Callable[[Node], None],
        stop: Callable[[Node, EndStatus, str, BudgetExceeded], None],
        whole: bool = False,
    ) -> None:
        #: Whether requests reserve all they want or wait (``OutputSharing``): an
        #: ask is then granted all a request wants of output-capping fields, or waits.
        self._whole = whole
        #: The root of the tree, and the runtime's bounds on any tree (the cap on
        #: the agents under one top-level execution is a limit a lease grants).
        self._root = root
        self._caps = caps
        #: Serve the requests (and the asks) waiting on a node's chain.
        self._serve_chain = serve
        #: Stop a node's subtree: ``stop(node, status, reason, error)``.
        self._stop = stop
        self._asks: deque[_Ask] = deque()
        #: The ask each lease waits on, if any.
        self._asking: dict[Lease, _Ask] = {}
        self._serving = False
        self._freed: list[Node] = []
        self._changed: list[Waiter] = []
        #: The live leases, with their nodes (to tell them of headroom given back).
        self._live: dict[Lease, Node] = {}
        #: Of them, those whose hosts are told what a part is worth (``hint``).
        self._told: set[Lease] = set()
        #: Asks answered so far (granted or refused: each a round trip from a host),
        #: those of them refused, and asks that waited.
        self.asks = 0
        self.refusals = 0
        self.waits = 0

    # -- here: the node of a remote subtree ---------------------------------------

    def open(self, node: Node) -> Lease:
        """Make ``node`` (just opened, with no execution here) the top of a remote
        subtree: its lease starts empty but for one step (what its first operation
        needs, when one is free); the subtree asks for what it needs."""
        fields = tuple(
            name
            for name in LEASED
            if any(self._limit(current, name) is not None for current in node.chain())
        )
        depth: int | None = None
        for current in node.chain():
            budget = current.limits
            if budget is not None and budget.depth is not None:
                room = current.depth + budget.depth - node.depth
                depth = room if depth is None else min(depth, room)
        caps = self._caps
        if caps is not None and caps.depth is not None:
            room = caps.depth - node.depth
            depth = room if depth is None else min(depth, room)
        lease = Lease(fields, None if depth is None else max(depth, 0))
        node.lease = lease
        self._count(node, lease, "live", 1)
        self._live[lease] = node
        if "steps" in fields and all(
            self._free(current, "steps") >= 1
            for current in node.chain()
            if self._limit(current, "steps") is not None
        ):
            # What its first operation, a step, needs: its first round trip is then
            # its first request's, which tops every other field up.
            lease.granted["steps"] = 1
            self._hold(node, lease)
            self._count(node, lease, "holding", 1)
        return lease

    async def ask(self, node: Node, tally: Tally, want: Want) -> Budget:
        """The remote subtree of ``node`` ran out: charge its ``tally``, take back what
        it does not hold in flight, and grant at least ``want`` (waiting for held
        headroom if need be). Returns its new limits; raises ``BudgetExceeded`` when
        a limit of the chain is spent (that node is stopped with its subtree)."""
        got = self.ask_nowait(node, tally, want)
        if isinstance(got, Budget):
            return got
        try:
            await park(got.waiter)
        except BaseException:
            if got.answer is None:
                got.answer = BudgetExceeded("no new work", 0, node.id, node.name)
                lease = node.lease
                if lease is not None and self._asking.get(lease) is got:
                    del self._asking[lease]
                self.serve()
            raise
        answer = got.answer
        if isinstance(answer, BudgetExceeded):
            raise answer
        assert answer is not None
        return answer

    def ask_nowait(self, node: Node, tally: Tally, want: Want) -> Budget | _Ask:
        """``ask`` without waiting: the new limits, or the queued ask to wait for."""
        lease = node.lease
        assert lease is not None, f"{node!r} has no lease"
        self.report(node, tally)
        # It gives back what it does not hold in flight of the fields it asks for.
        for name in lease.fields:
            if getattr(want, name):
                lease.granted[name] = tally.used(name) + tally.reserved(name)
        self._hold(node, lease)
        self._count(node, lease, "holding", 0)
        ask = _Ask(node, want, new_waiter(), lease.fields)
        if not lease.live:
            raise BudgetExceeded("no new work", 0, node.id, node.name)
        self._asking[lease] = ask
        self._asks.append(ask)
        self.changed_at(node)  # what it gave back may serve others; and it is served
        answer = ask.answer
        if answer is None:
            self.waits += 1
            return ask
        if isinstance(answer, BudgetExceeded):
            raise answer
        return answer

    def report(self, node: Node, tally: Tally) -> None:
        """Charge what the remote subtree of ``node`` used since its last report."""
        lease = node.lease
        assert lease is not None
        last = lease.tally
        if tally == last or not lease.live:
            return  # (a report that comes after the end is older than the end's)
        lease.tally = tally
        # What it used since, field by field: the subtree's totals, and its own.
        usage, was = tally.usage, last.usage
        deltas = [(name, getattr(usage, name) - getattr(was, name)) for name in _USAGE]
        deltas += [(name, getattr(tally, name) - getattr(last, name)) for name in _ON_TALLY]
        deltas = [(name, delta) for name, delta in deltas if delta]
        over = None
        current: Node | None = node
        while current is not None:
            for name, delta in deltas:
                setattr(current, name, getattr(current, name) + delta)
            if current.limits is not None:
                over = _over(current) or over
            current = current.parent
        # Its own usage grows by as much (a subtree placed again after its host was
        # lost reports from zero under a new lease: what the lost one reported stays).
        own, was = tally.own, last.own
        for name in _USAGE:
            delta = getattr(own, name) - getattr(was, name)
            if delta:
                setattr(node, _OWN[name], getattr(node, _OWN[name]) + delta)
        node.own_steps += tally.own_steps - last.own_steps
        self._weigh(node, lease, max(tally.leaves, 1))
        self._hold(node, lease)
        if over is not None:  # a remote estimate fell short
            error = overshoot(over)
            self._stop(over[0], "budget_exceeded", str(error), error)
        self.changed_at(node)

    def end(
        self, node: Node, tally: Tally | None, *, lost: bool = False, dead: bool = False
    ) -> None:
        """The remote subtree of ``node`` ended: charge its last ``tally`` and take back
        its hold. When its host was ``lost``, what it was granted and did not report
        stays held for good (counted as spent, never refunded on a guess), unless the
        host is known ``dead`` (its process is gone: its work cannot settle any more):
        then only what its requests in flight held at its last report stays (the
        provider may have billed them), and the rest comes back."""
        lease = node.lease
        if lease is None or lease.lost:
            return
        if tally is not None:
            self.report(node, tally)
        ask = self._asking.pop(lease, None)
        if ask is not None and ask.answer is None:
            ask.answer = BudgetExceeded("no new work", 0, node.id, node.name)
            wake(ask.waiter)
        if lost:
            if dead:  # nothing more can be used: keep what may have been billed
                last = lease.tally
                for name in lease.fields:
                    kept = min(lease.hold[name], last.reserved(name))
                    lease.granted[name] = last.used(name) + kept
                self._hold(node, lease)
            lease.lost = True
            for current in node.chain():  # what it holds stays held: spent
                held = current.held
                assert held is not None
                if held.lost is None:
                    held.lost = Held()
                for name in lease.fields:
                    setattr(held.lost, name, getattr(held.lost, name) + lease.hold[name])
        else:
            for name in lease.fields:
                lease.granted[name] = lease.tally.used(name)
            self._hold(node, lease)
        self._weigh(node, lease, 1)
        self._count(node, lease, "holding", 0)
        self._count(node, lease, "live", 0)
        self._live.pop(lease, None)
        self._told.discard(lease)
        self.changed_at(node)

    def hint(self) -> None:
        """Tell each live lease whose budget's parts grew worth more than ``HINT``
        times what they were when it last grew (or was told) what a part is worth
        now: its host asks for more before cutting a reply short at what its lease
        has left (one message down, no round trip, and few: a part's worth grows
        geometrically from one message to the next). Called when a node under a
        budget closes (a remote subtree's, after its lease ended, included): its
        part and what it held come back to the others."""
        worths: dict[tuple[Node, str], float] = {}
        for lease in list(self._told):  # (a tell may end a lease)
            tell = lease.tell
            node = self._live.get(lease)
            if tell is None or node is None:
                continue
            worth = {}
            for name, was in lease.hinted.items():
                parent = node.parent
                key = (parent if parent is not None else node, name)
                now = worths.get(key)
                if now is None:
                    now = worths[key] = self._per_part(node, name)
                if now > HINT * was:
                    worth[name] = now
            if worth:
                lease.hinted.update(worth)
                tell(worth)

    def _per_part(self, node: Node, name: str) -> float:
        """What one part of the budgets above ``node`` is worth of field ``name``: the
        least, over its chain, of what settled usage leaves in each budget's parts."""
        worth = math.inf
        for current in node.chain():
            limit = self._limit(current, name)
            if limit is not None:
                worth = min(worth, (limit - _used(current, name)) / _parts(current))
        return worth

    # -- waiting for a change -------------------------------------------------------

    async def changed(self) -> None:
        """Wait until some lease's holds change (or, on a host, its limits grow)."""
        waiter = new_waiter()
        self._changed.append(waiter)
        await park(waiter)

    def notify(self, waiter: Waiter) -> None:
        """Wake ``waiter`` at the next change (as ``changed`` would)."""
        self._changed.append(waiter)

    def changed_at(self, node: Node) -> None:
        """Holds or limits on ``node``'s chain changed: serve whoever waits for them."""
        self._wake_changed()
        self._serve_chain(node)  # its requests, then the asks

    def _wake_changed(self) -> None:
        waiters, self._changed = self._changed, []
        for waiter in waiters:
            wake(waiter)

    # -- on a host: the top node of a leased subtree -------------------------------

    def extend(self, node: Node, limits: Budget) -> None:
        """The lease of ``node`` (a host's top node) grew to ``limits``."""
        node.limits = limits
        node.limited = True
        lender = node.lender
        if lender is not None:
            lender.fresh = {
                name: getattr(limits, name) - _used(node, name) - _reserved(node, name)
                for name in LEASED
                if getattr(limits, name) is not None
            }
        self.changed_at(node)

    def refuse(self, node: Node, error: BudgetExceeded) -> None:
        """The tree above refused ``node``'s ask: stop its subtree with that reason."""
        self._stop(node, "budget_exceeded", str(error), error)
        self.changed_at(node)

    # -- the arithmetic -----------------------------------------------------------

    @property
    def telling(self) -> bool:
        """Whether some live lease's host is told what a part is worth (``hint``)."""
        return bool(self._told)

    @property
    def asks_waiting(self) -> int:
        """Asks waiting for headroom now."""
        return len(self._asks)

    def serve(self) -> None:
        """Answer the waiting asks that can be answered now, in order: an ask waits
        behind an earlier one waiting for the same field on a node of its chain
        (first come, first served per budget and field), never behind others.

        An ask that waits gives back everything it does not hold in flight, of every
        field: a waiting lease holds nothing another ask could wait for, so two asks
        never wait for each other. (What it gives back may serve an ask before it in
        line: the pass is repeated until nothing changes.)"""
        if self._serving or not self._asks:
            return
        self._serving = True
        try:
            again = True
            while again:
                again = False
                blocked: set[tuple[Node, str]] = set()
                waiting: deque[_Ask] = deque()
                for ask in self._asks:
                    if ask.answer is not None:
                        continue
                    if blocked and any(
                        (current, name) in blocked
                        for current in ask.node.chain()
                        for name in ask.fields
                    ):
                        again = self._give_back(ask) or again
                        waiting.append(ask)
                        continue
                    got = self._grant(ask)
                    if isinstance(got, (Budget, BudgetExceeded)):
                        wake(ask.waiter)
                    else:
                        blocked.add(got)
                        again = self._give_back(ask) or again
                        waiting.append(ask)
                self._asks = waiting
        finally:
            self._serving = False
        freed, self._freed = self._freed, []
        if freed:  # what waiting asks gave back may serve requests and charges here
            self._wake_changed()
            for node in freed:
                self._serve_chain(node)

    def _give_back(self, ask: _Ask) -> bool:
        """A waiting ask's lease gives back what it does not hold in flight, of every
        field; True if that freed anything."""
        node = ask.node
        lease = node.lease
        assert lease is not None
        tally = lease.tally
        freed = False
        for name in lease.fields:
            kept = tally.used(name) + tally.reserved(name)
            if lease.granted[name] > kept:
                lease.granted[name] = kept
                freed = True
        if freed:
            self._hold(node, lease)
            self._freed.append(node)
        return freed

    def _grant(self, ask: _Ask) -> Budget | BudgetExceeded | tuple[Node, str]:
        """Grant ``ask`` at least what it wants, or the node (and field) it must wait
        for. A spent limit answers it with the refusal (and stops that node)."""
        node = ask.node
        lease = node.lease
        assert lease is not None
        want = ask.want
        try:
            if node.stop_status is not None:
                raise stopped(node)
            if not lease.live:
                raise BudgetExceeded("no new work", 0, node.id, node.name)
            grants = {}
            wait: tuple[Node, str] | None = None
            for name in lease.fields:
                need: float = getattr(want, name)
                if not need:
                    top = self._top_up(node, lease, name)
                    if top:
                        grants[name] = top
                    continue
                grant = math.inf
                for current in node.chain():
                    limit = self._limit(current, name)
                    if limit is None:
                        continue
                    settled = limit - _used(current, name)
                    if need > settled + (_COST_EPSILON * limit if name in _FRACTIONAL else 0):
                        error = BudgetExceeded(
                            name,
                            limit,
                            current.id,
                            current.name,
                            need=need if name in _MEASURED else None,
                            left=settled if name in _MEASURED else None,
                            need_detail=want.detail if name in _MEASURED else "",
                        )
                        self._stop(current, "budget_exceeded", str(error), error)
                        raise error
                    free = settled - _reserved(current, name) - _held(current, name)
                    if free + (_COST_EPSILON * limit if name in _FRACTIONAL else 0) < need:
                        held = current.held
                        # Held by others that may give it back (not by this lease,
                        # not by lost hosts), or by requests in flight here: wait.
                        others = held.alive(name) - lease.hold[name] if held else 0
                        if (current.in_flight and name in _RESERVED) or others > 0:
                            wait = wait or (current, name)
                            continue
                        lost = held is not None and held.lost and getattr(held.lost, name)
                        why = LOST_WHY if lost else "no room left"
                        error = BudgetExceeded(name, limit, current.id, current.name, why=why)
                        self._stop(current, "budget_exceeded", str(error), error)
                        raise error
                    whole = want.whole(name)
                    if self._whole and name in _SHARED and free < whole:
                        held = current.held
                        others = held.alive(name) - lease.hold[name] if held else 0
                        if (current.in_flight and name in _RESERVED) or others > 0:
                            wait = wait or (current, name)  # all it wants, once free
                            continue
                    share = self._share(current, lease, name, settled, free, whole)
                    grant = min(grant, max(need, share))
                grants[name] = grant
        except BudgetExceeded as error:
            ask.answer = error
            self._asking.pop(lease, None)
            self.asks += 1
            self.refusals += 1
            return error
        if wait is not None:
            return wait
        for name, grant in grants.items():
            if grant != math.inf:
                lease.granted[name] += grant
                if name in _SHARED and lease.tell is not None:
                    lease.hinted[name] = self._per_part(node, name)
                    self._told.add(lease)
        self._hold(node, lease)
        self._count(node, lease, "holding", 1)
        self._asking.pop(lease, None)
        limits = lease.limits()
        ask.answer = limits
        self.asks += 1
        return limits

    def _share(
        self, node: Node, lease: Lease, name: str, settled: float, free: float, need: float
    ) -> float:
        """What ``lease`` may be granted of ``free`` headroom of field ``name`` on
        ``node`` (whose settled usage leaves ``settled``): its parts of all the parts
        under the budget (every execution that may ask, here or elsewhere, holding
        or not) of what settled usage leaves, less what it holds already, and at most
        ``GROWTH`` times what a whole operation (``need``) takes for each of its
        parts, or what it used so far (a lease grows geometrically from what it
        needs, so the first to ask never takes what siblings about to start need).
        With whole sharing, an output-capping field's share is all that is free."""
        if self._whole and name in _SHARED:
            share = max(free, 0)
        else:
            share = settled * min(lease.weight / _parts(node), 1) - lease.hold[name]
            share = min(max(share, 0), max(free, 0))
        share = min(share, GROWTH * max(lease.weight * need, lease.tally.used(name)))
        return share if name in _FRACTIONAL else math.floor(share)

    def _free(self, node: Node, name: str) -> float:
        """What ``node`` has free of field ``name``: neither used, nor reserved by
        requests in flight, nor held by leases."""
        limit = self._limit(node, name)
        assert limit is not None
        return limit - _used(node, name) - _reserved(node, name) - _held(node, name)

    def _top_up(self, node: Node, lease: Lease, name: str) -> float:
        """What to add to a field an ask does not ask for, so that one round trip
        serves every field: up to its share, from what is free now (never waiting,
        never refusing). Counters get at least one each while one is free; token
        and cost fields are topped up only once a request asked for them."""
        seed = 0 if name in _MEASURED or name in _SUMS else 1
        if not seed and not lease.granted[name]:
            return 0
        extra = math.inf
        for current in node.chain():
            limit = self._limit(current, name)
            if limit is None:
                continue
            settled = limit - _used(current, name)
            free = settled - _reserved(current, name) - _held(current, name)
            more = self._share(current, lease, name, settled, free, seed)
            if lease.hold[name] < seed:
                # At least one of each counter while one is free: the subtree's next
                # step and tool call need no round trip of their own, even when
                # shares of a scarce budget round down to nothing.
                more = max(more, min(seed - lease.hold[name], max(free, 0)))
            extra = min(extra, more)
        return 0 if extra == math.inf else extra

    def _hold(self, node: Node, lease: Lease) -> None:
        """Make the chain's holds match what ``lease`` was granted and not used."""
        if lease.lost:
            return
        deltas = {}
        for name in lease.fields:
            new = max(lease.granted[name] - lease.tally.used(name), zero(name))
            delta = new - lease.hold[name]
            if delta:
                deltas[name] = delta
                lease.hold[name] = new
        if not deltas:
            return
        for current in node.chain():
            held = current.held
            if held is None:
                held = current.held = Held()
            for name, delta in deltas.items():
                setattr(held, name, getattr(held, name) + delta)

    def _limit(self, node: Node, name: str) -> float | None:
        """``node``'s limit on field ``name`` (a runtime cap counts for agents)."""
        budget = node.limits
        value: float | None = getattr(budget, name) if budget is not None else None
        if name == "agents":
            caps = self._caps
            if (
                caps is not None
                and caps.agents is not None
                and node.parent is self._root
                and (value is None or caps.agents < value)
            ):
                value = caps.agents
        return value

    @staticmethod
    def _weigh(node: Node, lease: Lease, weight: int) -> None:
        """Make ``lease`` stand for ``weight`` parts of its chain's headroom."""
        delta = weight - lease.weight
        if not delta or lease.lost:
            return
        lease.weight = weight
        for current in node.chain():
            held = current.held
            if held is None:
                held = current.held = Held()
            held.parts += delta

    @staticmethod
    def _count(node: Node, lease: Lease, flag: str, on: int) -> None:
        """Set ``lease``'s flag (``live``, ``holding``) and its count on the chain."""
        if getattr(lease, flag) == bool(on):
            return
        setattr(lease, flag, bool(on))
        counter = "leases" if flag == "live" else "holding"
        step = 1 if on else -1
        for current in node.chain():
            held = current.held
            if held is None:
                held = current.held = Held()
            setattr(held, counter, getattr(held, counter) + step)


#: Fields that requests in flight here hold (and may give back when they settle).
_RESERVED = frozenset(field.name for field in FIELDS if field.reserved)
#: Fields whose headroom caps a request's output (what a lease's host is told of).
_SHARED = frozenset(("tokens", "output_tokens", "cost"))  # (as ``free_output`` reads them)
#: Fields whose refusal says what was needed and what was left.
_MEASURED = frozenset(field.name for field in FIELDS if field.kind in ("tokens", "cost"))
#: What a ``Tally``'s usage carries (with cached tokens), and what it counts beside it.
_USAGE = tuple(Usage.__struct_fields__)
_ON_TALLY = tuple(
    field.name for field in FIELDS if field.leased and not field.usage and not field.parts
)
#: Fields whose values are not whole numbers (compared with a relative slack).
_FRACTIONAL = frozenset(field.name for field in FIELDS if not field.whole)
#: Fields that are sums of others (tokens), with their parts.
_SUMS = {field.name: field.parts for field in FIELDS if field.parts}
#: Where a node counts its own usage of each field ``Usage`` carries.
_OWN = {name: f"own_{name}" for name in _USAGE}


def _reserved(node: Node, name: str) -> float:
    """What requests in flight on ``node`` hold of field ``name``."""
    return reserved(name, node.reserved_input, node.reserved_output, node.reserved_cost)


def _used(node: Node, name: str) -> float:
    parts = _SUMS.get(name)
    if parts is not None:
        total: float = sum(getattr(node, part) for part in parts)
        return total
    value: float = getattr(node, name)
    return value


def _parts(node: Node) -> int:
    """The parts of ``node``'s headroom: every execution under it that may ask next,
    here (``Node.leaves``) or on a host (each lease its subtree's ``leaves``)."""
    held = node.held
    return max(node.leaves + (held.parts if held else 0), 1)


def _held(node: Node, name: str) -> float:
    held = node.held
    if held is None:
        return 0
    value: float = getattr(held, name)
    return value


def _over(node: Node) -> tuple[Node, str, float, float] | None:
    """The first limit a report took ``node`` past (a remote estimate fell short)."""
    budget = node.limits
    assert budget is not None
    for name in LEASED:
        limit = getattr(budget, name)
        if limit is None:
            continue
        used = _used(node, name)
        slack = _COST_EPSILON * limit if name in _FRACTIONAL else 0
        if used > limit + slack:
            return node, name, limit, used
    return None
