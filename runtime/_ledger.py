"""Leases: one ledger for a tree whose subtrees run on other hosts.

A subtree placed on another host (another process, another machine) runs under a
supervisor of its own there, which cannot see the budgets of the tree it belongs to.
So it runs under a **lease**: limits made of headroom granted by the node it hangs
from here (the lease's *anchor*), field by field, for every limit of the anchor's
chain (tokens, input and output tokens, cost, requests, tool calls, steps, agents).
Its own budget, the depth left and its deadline travel with it as limits of its
own (``own_limits``). The subtrees one anchor places on one host share one lease
(``open(node, key=host)``), a **pool** they draw from together: round trips grow
with hosts, not with subtrees.

Here, what a lease grants and its subtrees have not used yet is **held**: it counts
on every node of the anchor's chain like a request in flight, so nobody else spends
it, and a request or a charge that only held headroom stands in the way of
**waits** for it (it never stops: admission stays honest). A lease lives through:

- **Reports** (``report``): a remote subtree's usage so far, charged here on its
  node's chain; the lease's hold shrinks by as much (its subtrees never overshoot
  it).
- **Asks** (``ask``): the lease ran out on its host (an operation there needs more
  than it has left). Its subtrees report; it gives back what they do not hold in
  flight (its host spends nothing more until the answer: ``freeze``), and asks for
  at least what the operation needs. The ask is admitted exactly like a request
  here: **spent** (the settled usage of a node of the chain leaves no room for what
  it needs: that node stops with its subtree and the ask is refused with the same
  ``BudgetExceeded``), or **waits** (first come, first served, while held headroom
  stands in the way), or is **granted** what it needs or, when more, its share of
  the free headroom: the parts it stands for (the executions of its subtrees that
  may ask next, ``Tally.leaves``) of all the parts under the budget (every such
  execution, here or on any host), at most ``GROWTH`` times a whole operation for
  each part or what it used so far. A lease thus grows geometrically with what is
  free and shrinks as the budget runs out: round trips grow with the log of budget
  over request, not with the work.
- **Idleness**: its last subtree answered (``end``): its last report is charged and
  all it holds comes back; it waits, idle, for the anchor's next subtree on its
  host, which revives it with what an ask would grant, no round trip. It ends when
  the anchor closes (``closed``). Or its host was lost (``end(..., lost=True)``):
  what it was granted and never reported is **counted as spent**, never refunded on
  a guess (unless the host is known dead: then what its requests in flight held).

On the host, the lease is a node above its subtrees' top nodes with a ``lender``:
where that runtime's admission would stop a subtree because the lease ran out, it
asks the lender (once nothing of its own in flight there could come back) and
waits; ``extend`` applies the new limits, and a refusal stops its subtrees with the
reason given here.

The ledger is a part of the supervisor that knows nothing of it: it is handed the
root of the tree, the runtime's caps, and what to call to serve the requests waiting
on a chain whose holds changed (``serve``) and to stop a subtree (``stop``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import msgspec

from ._admission import overshoot, part_back
from ._budget import FIELDS, LEASED, Budget, Caps, Usage
from ._exceptions import BudgetExceeded
from ._lease import LOST_WHY, Held, Lease, Member, Tally, Want, reserved, zero
from ._snapshots import EndStatus
from ._tree import Node, stopped
from ._waiter import Waiter, new_waiter, park, wake

__all__ = ["GROWTH", "Ledger"]

#: A grant is at most this many times what a whole operation of the ask takes for
#: each of the lease's parts (a model request with all the output it wants), or what
#: the lease used so far: a fresh lease holds a few whole requests.
GROWTH = 4

#: An ask whose lease would be granted less than this share of its fair part of an
#: output-capping field (its parts of what settled usage leaves) because other
#: leases hold more than theirs has them asked to give their surplus back
#: (``reclaim``) and waits for their answers: otherwise its host would cut replies
#: short that the same tree at home would not.
RECLAIM = 0.75

#: How much more a part of the budget above must be worth than when a lease's host
#: was last told it (or granted) before it is told again (``hint``: one message
#: down, no round trip; a part's worth still grows geometrically from one to the
#: next). Lower than ``HINT``: a host whose request needs more than a part of its
#: lease compares it with a fresh worth (``DEEP``), and asks only past ``HINT``.
TELL = 1.25

#: Relative slack for comparing costs (floating point sums), as in admission.
_COST_EPSILON = 1e-9


class _Ask:
    __slots__ = ("anchor", "answer", "fields", "node", "waiter", "want")

    def __init__(self, node: Node, want: Want, waiter: Waiter, fields: tuple[str, ...]) -> None:
        #: The remote subtree's node that asks (for its lease), and its lease's anchor.
        self.node = node
        self.anchor = _anchor(node)
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
        #: The live leases, with their anchors (to tell them of headroom given back),
        #: and those that subtrees join, by anchor and key.
        self._live: dict[Lease, Node] = {}
        self._pools: dict[tuple[Node, object], Lease] = {}
        #: Idle leases, by anchor (they end when it closes).
        self._idle: dict[Node, set[Lease]] = {}
        #: Of them, those whose hosts are told what a part is worth (``hint``).
        self._told: set[Lease] = set()
        #: Asks answered so far (granted or refused: each a round trip from a host),
        #: those of them refused, and asks that waited.
        self.asks = 0
        self.refusals = 0
        self.waits = 0
        #: Leases asked to give back what they held beyond a fair share (each a
        #: message down and its answer up).
        self.reclaims = 0

    # -- here: the node of a remote subtree ---------------------------------------

    def open(self, node: Node, key: object = None) -> Lease:
        """Make ``node`` (just opened, with no execution here) the top of a remote
        subtree, and return its lease. With a ``key`` (its host), it joins the live
        lease its parent holds for that key, if there is one: the subtrees of one
        node on one host draw from one pool and ask as one. A new lease starts empty
        but for one step (what its first operation needs, when one is free); its
        subtrees ask for what they need."""
        parent = node.parent
        assert parent is not None, "the root runs here"
        part_back(node)  # (placed again after its host was lost)
        lease = self._pools.get((parent, key)) if key is not None else None
        if lease is None:
            lease = self._start(parent, key)
        lease.members[node] = Member()
        lease.weight += 1
        lease.count += 1
        node.lease = lease
        if lease.idle:
            self._revive(parent, lease)
        return lease

    def _start(self, anchor: Node, key: object) -> Lease:
        """A new lease of ``anchor``'s headroom for its children on a host."""
        fields = tuple(
            name
            for name in LEASED
            if any(self._limit(current, name) is not None for current in anchor.chain())
        )
        depth: int | None = None
        below = anchor.depth + 1  # its subtrees' tops
        for current in anchor.chain():
            budget = current.limits
            if budget is not None and budget.depth is not None:
                room = current.depth + budget.depth - below
                depth = room if depth is None else min(depth, room)
        caps = self._caps
        if caps is not None and caps.depth is not None:
            room = caps.depth - below
            depth = room if depth is None else min(depth, room)
        lease = Lease(fields, None if depth is None else max(depth, 0))
        lease.key = key
        if key is not None:
            self._pools[anchor, key] = lease
        self._count(anchor, lease, "live", 1)
        self._live[lease] = anchor
        if "steps" in fields and all(
            self._free(current, "steps") >= 1
            for current in anchor.chain()
            if self._limit(current, "steps") is not None
        ):
            # What its first operation, a step, needs: its first round trip is then
            # its first request's, which tops every other field up.
            lease.granted["steps"] = 1
            self._hold(anchor, lease)
            self._count(anchor, lease, "holding", 1)
        return lease

    def _revive(self, anchor: Node, lease: Lease) -> None:
        """An idle lease's anchor placed a subtree on its host again: it is live, and
        is granted what an ask for what it was granted while it was live last would
        be (its share of what is free, at most ``GROWTH`` times that or what it used
        so far; never waiting, never refused): no round trip for the subtree's
        first operations, and a lease keeps growing from one batch to the next."""
        lease.idle = False
        lease.base = dict(lease.used)
        lease.reclaiming.clear()
        idle = self._idle.get(anchor)
        if idle is not None:
            idle.discard(lease)
        self._count(anchor, lease, "live", 1)
        self._live[lease] = anchor
        level, lease.level = lease.level, {}
        granted = False
        for name in lease.fields:
            want = level.get(name, 0)
            if not want:
                continue
            grant = self._free_share(anchor, lease, name, want)
            if grant > 0:
                lease.granted[name] += grant
                granted = True
                if name in _SHARED and lease.tell is not None:
                    lease.hinted[name] = self._per_part(anchor, name)
                    self._told.add(lease)
        if granted:
            self._hold(anchor, lease)
            self._count(anchor, lease, "holding", 1)

    def closed(self, node: Node) -> None:
        """``node`` closed: its idle leases end (each host is told, ``Lease.close``)."""
        for lease in self._idle.pop(node, ()):
            if self._pools.get((node, lease.key)) is lease:
                del self._pools[node, lease.key]
            lease.idle = False
            if lease.close is not None:
                lease.close()

    @property
    def idle(self) -> dict[Node, set[Lease]]:
        """The anchors of idle leases, with their leases (``closed`` ends them)."""
        return self._idle

    def own_limits(self, node: Node) -> Budget:
        """The limits of the remote subtree of ``node`` on its host besides its
        lease's: its node's own budget, less what it used already (a subtree placed
        again after its host was lost), and the tightest depth of its chain."""
        lease = node.lease
        assert lease is not None, f"{node!r} has no lease"
        budget = node.limits
        depth = lease.depth
        fields: dict[str, float] = {}
        if budget is not None:
            if budget.depth is not None:
                depth = budget.depth if depth is None else min(depth, budget.depth)
            for name in LEASED:
                limit = getattr(budget, name)
                if limit is not None:
                    left = max(limit - _used(node, name), 0)
                    fields[name] = left if name in _FRACTIONAL else int(left)
        return Budget(depth=depth, **fields)  # type: ignore[arg-type]

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
        anchor = _anchor(node)
        if not lease.tainted:
            # It gives back what it does not hold in flight (its host spends nothing
            # more until the answer: ``freeze``; a reclaim it was sent before is
            # answered so: its host ignores one that comes while it asks).
            for name in lease.fields:
                lease.granted[name] = lease.used[name] + lease.reserved[name]
        lease.reclaiming.clear()
        self._hold(anchor, lease)
        self._count(anchor, lease, "holding", 0)
        ask = _Ask(node, want, new_waiter(), lease.fields)
        if not lease.live or lease.lost:
            raise BudgetExceeded("no new work", 0, node.id, node.name)
        self._asking[lease] = ask
        self._asks.append(ask)
        self.changed_at(anchor)  # what it gave back may serve others; and it is served
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
        member = lease.members[node]
        last = member.tally
        if tally == last or not member.live:
            return  # (a report that comes after the end is older than the end's)
        member.tally = tally
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
        # The pool's sums, and its parts.
        used, reserved = lease.used, lease.reserved
        for name in lease.fields:
            used[name] += tally.used(name) - last.used(name)
            reserved[name] += tally.reserved(name) - last.reserved(name)
        anchor = _anchor(node)
        self._weigh(anchor, lease, member, max(tally.leaves, 1))
        self._hold(anchor, lease)
        if over is not None:  # a remote estimate fell short
            error = overshoot(over)
            self._stop(over[0], "budget_exceeded", str(error), error)
        self.changed_at(node)

    def end(
        self, node: Node, tally: Tally | None, *, lost: bool = False, dead: bool = False
    ) -> None:
        """The remote subtree of ``node`` ended: charge its last ``tally``. When it
        was the last live one of its lease, the lease ends: what it holds comes back.

        When its host was ``lost``, what the lease was granted and its subtrees did
        not report stays held for good (counted as spent, never refunded on a
        guess), unless the host is known ``dead`` (its process is gone: its work
        cannot settle any more): then only what its requests in flight held at
        their last reports stays (the provider may have billed them), and the rest
        comes back. A subtree lost alone (its host did not answer a stop) keeps its
        lease's hold held for good when the lease ends."""
        lease = node.lease
        if lease is None:
            return
        member = lease.members.get(node)
        if member is None or not member.live:
            return
        if tally is not None and not lease.lost:
            self.report(node, tally)
        anchor = _anchor(node)
        if lost and dead:
            if not lease.lost:
                self._lose(anchor, lease, dead=True)
        elif lost:
            lease.tainted = True
        # It stands for no part from now on, though its node here closes only once
        # its answer is taken (``part_back`` then): a budget's parts are its live
        # executions, as at home (a part's worth, a lease's share and the worth its
        # hosts are told follow the subtrees that end, not their answers' travel).
        self._weigh(anchor, lease, member, 0)
        member.live = False
        member.ending = True
        lease.count -= 1
        if lease.count:
            self.changed_at(anchor)
            return
        # Its last subtree ended: the lease gives back all it holds, and waits idle
        # for the anchor's next subtree on its host (or ends, if it was lost).
        if lease.tainted and not lease.lost:
            self._lose(anchor, lease, dead=False)
        self._answer_ask(lease, node)
        if not lease.lost:
            base = lease.base
            lease.level = {name: lease.granted[name] - base.get(name, 0) for name in lease.fields}
            for name in lease.fields:
                lease.granted[name] = lease.used[name]
            self._hold(anchor, lease)
        lease.reclaiming.clear()
        self._count(anchor, lease, "holding", 0)
        self._count(anchor, lease, "live", 0)
        self._live.pop(lease, None)
        self._told.discard(lease)
        if lease.key is not None and self._pools.get((anchor, lease.key)) is lease:
            if lease.lost or anchor.status != "running":
                del self._pools[anchor, lease.key]
            else:
                lease.idle = True
                self._idle.setdefault(anchor, set()).add(lease)
        self.changed_at(anchor)

    def _answer_ask(self, lease: Lease, node: Node) -> None:
        """The lease's ask, if one waits, is answered: no new work."""
        ask = self._asking.pop(lease, None)
        if ask is not None and ask.answer is None:
            ask.answer = BudgetExceeded("no new work", 0, node.id, node.name)
            wake(ask.waiter)

    def _lose(self, anchor: Node, lease: Lease, *, dead: bool) -> None:
        """``lease``'s host was lost: what it holds stays held for good (but what its
        subtrees' requests in flight held, when the host is known ``dead``)."""
        self._answer_ask(lease, anchor)
        if dead:  # nothing more can be used: keep what may have been billed
            for name in lease.fields:
                kept = min(lease.hold[name], lease.reserved[name])
                lease.granted[name] = lease.used[name] + kept
            self._hold(anchor, lease)
        lease.lost = True
        for current in anchor.chain():  # what it holds stays held: spent
            held = current.held
            assert held is not None
            if held.lost is None:
                held.lost = Held()
            for name in lease.fields:
                setattr(held.lost, name, getattr(held.lost, name) + lease.hold[name])

    def hint(self) -> None:
        """Tell each live lease whose budget's parts grew worth more than ``TELL``
        times what they were when it last grew (or was told) what a part is worth
        now: its host asks for more before cutting a reply short at what its lease
        has left (one message down, no round trip, and few: a part's worth grows
        geometrically from one message to the next). Called when a node under a
        budget closes (a remote subtree's, after it ended, included): its part and
        what it held come back to the others."""
        worths: dict[tuple[Node, str], float] = {}
        for lease in list(self._told):  # (a tell may end a lease)
            tell = lease.tell
            anchor = self._live.get(lease)
            if tell is None or anchor is None:
                continue
            worth = {}
            for name, was in lease.hinted.items():
                key = (anchor, name)
                now = worths.get(key)
                if now is None:
                    now = worths[key] = self._per_part(anchor, name)
                if now > TELL * was:
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
            parts = max(node.leaves - node.in_flight, 1)  # (as admission's fair share)
            lender.fresh = {
                name: (getattr(limits, name) - _used(node, name) - _reserved(node, name)) / parts
                for name in LEASED
                if getattr(limits, name) is not None
            }
        self.changed_at(node)

    def freeze(self, node: Node) -> None:
        """The lease of ``node`` (a host's node of a lease) asks for more: until the
        answer, it spends nothing beyond what it used and holds in flight, on every
        field (the tree above takes the rest back while the ask waits: its other
        subtrees wait for the answer too)."""
        limits = node.limits
        if limits is None:
            return
        frozen: dict[str, float] = {}
        for name in LEASED:
            if getattr(limits, name) is not None:
                kept = _used(node, name) + _reserved(node, name)
                frozen[name] = kept if name in _FRACTIONAL else int(kept)
        node.limits = msgspec.structs.replace(limits, **frozen)

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
                        for current in ask.anchor.chain()
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
        lease = ask.node.lease
        assert lease is not None
        if lease.tainted:
            return False  # (a subtree of it was lost: what it uses is not known)
        freed = False
        for name in lease.fields:
            kept = lease.used[name] + lease.reserved[name]
            if lease.granted[name] > kept:
                lease.granted[name] = kept
                freed = True
        if freed:
            anchor = ask.anchor
            self._hold(anchor, lease)
            self._freed.append(anchor)
        return freed

    def _grant(self, ask: _Ask) -> Budget | BudgetExceeded | tuple[Node, str]:
        """Grant ``ask`` at least what it wants, or the node (and field) it must wait
        for. A spent limit answers it with the refusal (and stops that node)."""
        node = ask.anchor
        lease = ask.node.lease
        assert lease is not None
        want = ask.want
        try:
            if node.stop_status is not None:
                raise stopped(node)
            if not lease.live or lease.lost:
                raise BudgetExceeded("no new work", 0, ask.node.id, ask.node.name)
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
                            if name in _SHARED and not self._whole:  # (they may not ask)
                                self._reclaim(current, lease, name, settled, free, want)
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
                    if (
                        name in _SHARED
                        and not self._whole
                        and self._reclaim(current, lease, name, settled, free, want)
                    ):
                        wait = wait or (current, name)  # what others hold past a share
                        continue
                    share = self._share(current, lease, name, settled, free, whole)
                    if want.fair_output and name in _SHARED:
                        # A request cut deep: its fair part, or what a request would
                        # take here (a part of what is free among the parts that hold
                        # none of it: late in a run, the last ones take all).
                        part = max(want.fair(name), free / self._idle_parts(current, lease))
                        part = min(part, max(free, 0))
                        # (in whole tokens: a fraction held would be a hold that no
                        # lease gives back, and asks would wait for it for ever)
                        share = max(share, part if name in _FRACTIONAL else math.floor(part))
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
        lease.reclaiming.clear()
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
        With whole sharing, an output-capping field's share is at least the whole
        operation (the ask waited till that much is free), and beyond it the same
        parts as with fair sharing: not all that is free, which would leave the
        whole requests of every other host waiting for the first lease to ask."""
        share = settled * min(lease.weight / _parts(node), 1) - lease.hold[name]
        if self._whole and name in _SHARED:
            share = max(share, need)
        share = min(max(share, 0), max(free, 0))
        share = min(share, GROWTH * max(lease.weight * need, lease.used[name]))
        return share if name in _FRACTIONAL else math.floor(share)

    def _idle_parts(self, node: Node, lease: Lease) -> int:
        """The parts under ``node``'s budget that hold none of its headroom: neither a
        request in flight here nor a lease holding a grant (``lease``, asking, holds
        only what its requests in flight hold)."""
        busy = node.in_flight
        for other, anchor in self._live.items():
            if other.holding and other is not lease and any(c is node for c in anchor.chain()):
                busy += other.weight
        return max(_parts(node) - busy, 1)

    def _reclaim(
        self, node: Node, lease: Lease, name: str, settled: float, free: float, want: Want
    ) -> bool:
        """Whether an ask of ``lease`` waits for leases holding more than their fair
        share of field ``name`` on ``node`` (whose settled usage leaves ``settled``)
        to give it back: when ``free`` is less than ``RECLAIM`` times its own fair
        share (as ``_share`` reckons it, ``GROWTH`` included), each other live lease
        under ``node`` holding more than its share beyond its requests in flight is
        asked to keep no more than that (once per grant it had: ``Lease.reclaiming``),
        and the ask waits while one of them has not answered. Every part under a
        budget then gets what it would at home, whichever lease asked first. (A
        request cut deep asks for its own fair part, ``Want.fair``: at least that.)"""
        parts = _parts(node)
        fair = settled * min(lease.weight / parts, 1) - lease.hold[name]
        fair = min(fair, GROWTH * max(lease.weight * want.whole(name), lease.used[name]))
        if want.fair_output:
            fair = max(fair, want.fair(name))
        if free >= RECLAIM * fair:
            return False
        short = fair - free
        pending = False
        for other, anchor in self._live.items():
            if (
                other is lease
                or other.reclaim is None
                or other.lost
                or other.tainted
                or other in self._asking
                or name not in other.hold
            ):
                continue
            if not any(current is node for current in anchor.chain()):
                continue
            asked = other.reclaiming.get(name)
            if asked is not None:
                pending = pending or asked
                continue
            keep = max(settled * min(other.weight / parts, 1) - other.reserved[name], 0)
            surplus = other.hold[name] - other.reserved[name] - keep
            if surplus > short / 10 and surplus >= 1:
                other.reclaiming[name] = True
                self.reclaims += 1
                other.reclaim({name: keep})
                pending = True
        return pending

    def kept(self, lease: Lease, limits: dict[str, float]) -> None:
        """``lease``'s host answered a reclaim: its limits of those fields are now
        ``limits`` (what it holds beyond them comes back here; none, when it was
        asking as the reclaim came: its ask answered it). The ask waiting for the
        answer is served either way."""
        anchor = self._live.get(lease)
        if anchor is None or lease.lost:
            return
        for name, asked in lease.reclaiming.items():
            if asked:
                lease.reclaiming[name] = False
                value = limits.get(name)
                if value is not None:
                    lease.granted[name] = min(lease.granted[name], value)
        self._hold(anchor, lease)
        self.changed_at(anchor)

    def keep(self, node: Node, free: dict[str, float]) -> dict[str, float]:
        """On a host: the tree above asks the lease of ``node`` to keep at most
        ``free`` headroom of each of those fields beyond what it used and holds in
        flight. Lower its limits so, and return them (what to answer)."""
        limits = node.limits
        if limits is None:
            return {}
        kept: dict[str, float] = {}
        for name, most in free.items():
            limit = getattr(limits, name, None)
            if limit is None:
                continue
            value = min(limit, _used(node, name) + _reserved(node, name) + most)
            kept[name] = value if name in _FRACTIONAL else math.floor(value)
        if kept:
            self.extend(node, msgspec.structs.replace(limits, **kept))
        return kept

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
        # At least one of each counter while one is free: the subtree's next step and
        # tool call need no round trip of their own, even when shares of a scarce
        # budget round down to nothing.
        extra = self._free_share(node, lease, name, seed, floor=seed)
        return 0 if extra == math.inf else extra

    def _free_share(
        self, node: Node, lease: Lease, name: str, need: float, *, floor: float = 0
    ) -> float:
        """What ``lease`` may be granted of field ``name`` now, never waiting: the
        least, over the budgets of the chain of ``node`` (its anchor), of its share
        of what is free (``_share``, for operations of ``need``), and at least what
        takes its hold to ``floor`` while that much is free (inf: no limit)."""
        extra = math.inf
        for current in node.chain():
            limit = self._limit(current, name)
            if limit is None:
                continue
            settled = limit - _used(current, name)
            free = settled - _reserved(current, name) - _held(current, name)
            more = self._share(current, lease, name, settled, free, need)
            if lease.hold[name] < floor:
                more = max(more, min(floor - lease.hold[name], max(free, 0)))
            extra = min(extra, more)
        return extra

    def _hold(self, node: Node, lease: Lease) -> None:
        """Make the holds on the chain of ``node`` (``lease``'s anchor) match what
        ``lease`` was granted and its subtrees did not use."""
        if lease.lost:
            return
        deltas = {}
        used = lease.used
        for name in lease.fields:
            new = max(lease.granted[name] - used[name], zero(name))
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
    def _weigh(node: Node, lease: Lease, member: Member, leaves: int) -> None:
        """Make ``member`` of ``lease`` stand for ``leaves`` parts of the headroom of
        the chain of ``node`` (the lease's anchor)."""
        delta = leaves - member.leaves
        if not delta:
            return
        member.leaves = leaves
        lease.weight += delta
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


def _anchor(node: Node) -> Node:
    """The node a remote subtree's lease is of: its node's parent."""
    parent = node.parent
    assert parent is not None, "the root runs here"
    return parent


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
