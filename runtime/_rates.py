"""Rate limits: budgets over time that the whole runtime shares, one lane a model.

A provider limits what one key may send: requests per minute, tokens per minute
(input, output, or both together), requests at once. A tree of a thousand agents
meets those long before any budget, and a thousand agents each retrying its own
429 multiply the storm. So every model request of the runtime passes through the
**lane** of its model (``Rates.lane``; the limits a user declared for that model,
``Runtime(rate_limits={name: RateLimit(...)})``, or none), and:

- **waits** while the lane has no room for it (first come, first served per lane,
  ended by deadlines, stops and cancellation like any wait), and is not sent to
  fail. Its cost is one request, its input estimate and its output cap (what a
  provider draws a token bucket down by), taken when it is admitted (``acquire``)
  and settled with its real usage when it answers (``settle``: what it did not use
  comes back at once);
- a lane **pauses** for everyone when the server says so (``pause``: a 429's
  Retry-After, or the headers saying nothing is left until a reset), not only for
  the request that was told;
- a lane with no declared concurrency **adapts** once the server refuses one
  (``refused``): its concurrency drops to 0.7 of what was in flight, and grows by one
  each time as many requests succeed (additive increase, multiplicative decrease).

Per-minute limits are sliding windows, as servers count them: at most the limit
charged in any minute (``RateLimit.period``, shorter in tests), a charge settled
to the real usage when its request answers. A lane whose model has no declared limits and
was never refused costs a request one dictionary lookup and two counters.

Nothing here knows a model or a provider: the agents layer names the lane, says
what a request costs, and hands over what the server said.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable

import anyio
import msgspec

from ._waiter import Waiter, new_waiter, park, wake

__all__ = [
    "DIMENSIONS",
    "TOOL_LANE",
    "Dimension",
    "Lane",
    "LaneStatistics",
    "Pass",
    "RateLimit",
    "Rates",
]

#: What a lane's concurrency is cut to, of what was in flight, when the server
#: refuses a request and no concurrency was declared.
DECREASE = 0.7
#: The lanes of tools the runtime caps (``Runtime(tool_limits=...)``) are named with
#: this before the tool's name: ``tool:browser``.
TOOL_LANE = "tool:"
#: How much longer than its period a charge is counted (the clocks here and there).
SKEW = 0.02


class Dimension(msgspec.Struct, frozen=True, gc=False):
    """One thing a provider counts per minute, defined once (``DIMENSIONS``): what a
    lane's window of it is called (``name``, as a wait says it), the key of its
    fields (``RateLimit.<key>_per_minute``, a server's ``ServerLimits.<key>_limit``,
    ``_remaining`` and ``_reset``), and what one request draws from it: one request,
    or tokens (its input, its output, or both: ``input`` and ``output`` say which).
    """

    name: str
    key: str
    input: bool = False
    output: bool = False

    @property
    def field(self) -> str:
        """Its ``RateLimit`` field."""
        return f"{self.key}_per_minute"

    @property
    def tokens(self) -> bool:
        """Whether it counts tokens (a request then needs an input estimate)."""
        return self.input or self.output

    def cost(self, input: int, output: int) -> int:
        """What a request of ``input`` and ``output`` tokens draws from it."""
        if not (self.input or self.output):
            return 1
        return (input if self.input else 0) + (output if self.output else 0)


#: Every dimension a lane counts, in the order of ``RateLimit``'s fields. A new one is
#: a row here and its fields: ``RateLimit.<key>_per_minute`` and ``ServerLimits``'s
#: three (``tests/runtime/test_rates.py`` sends each through every consumer).
DIMENSIONS = (
    Dimension("requests", "requests"),
    Dimension("tokens", "tokens", input=True, output=True),
    Dimension("input tokens", "input_tokens", input=True),
    Dimension("output tokens", "output_tokens", output=True),
)


class RateLimit(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What one model (one lane) may be sent: per minute and at once. Every limit is
    optional; ``period`` is the minute's length in seconds (shorter to scale a test
    down)."""

    requests_per_minute: int | None = None
    tokens_per_minute: int | None = None
    input_tokens_per_minute: int | None = None
    output_tokens_per_minute: int | None = None
    concurrent: int | None = None
    period: float = 60.0

    def __post_init__(self) -> None:
        for name in _LIMITS:
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"RateLimit.{name} must be a whole number >= 1, got {value!r}")
        period = self.period
        if (
            isinstance(period, bool)
            or not isinstance(period, int | float)
            or not math.isfinite(period)
            or period <= 0
        ):
            raise ValueError(
                f"RateLimit.period must be a finite number of seconds > 0, got {period!r}"
            )


class LaneStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """One lane as it is now, and what it saw since the runtime started."""

    #: Requests in flight, waiting, and the lane's concurrency (None: no limit).
    in_flight: int
    waiting: int
    concurrency: int | None
    #: Whether the concurrency is the adaptive one (no ``concurrent`` declared).
    adaptive: bool
    #: Seconds until the lane's pause ends (0: not paused).
    paused_for: float
    #: Requests that waited, seconds they waited in all, requests the server refused
    #: (429s), pauses the server asked for.
    waits: int
    wait_seconds: float
    refused: int
    pauses: int


class _Window:
    """A per-minute limit: at most ``capacity`` charged in any ``period`` (a sliding
    window, as servers count). A charge is made when its request is admitted; the
    server saw the request later (a busy process can send it seconds late), and
    before it answered: once it answers (``settle``), the charge is counted from
    then, or from when its first streamed text arrived (the server had it by then).
    And a charge leaves the window ``SKEW`` of the period late, for the clocks."""

    __slots__ = ("capacity", "charges", "dimension", "period", "used")

    def __init__(self, dimension: Dimension, capacity: int, period: float) -> None:
        self.dimension = dimension
        self.capacity = capacity
        self.period = period * (1 + SKEW)
        #: The charges in the window, oldest first: [when, amount] (settled in place).
        self.charges: deque[list[float]] = deque()
        self.used = 0.0

    def prune(self, now: float) -> None:
        charges = self.charges
        limit = now - self.period
        while charges and charges[0][0] <= limit:
            self.used -= charges.popleft()[1]

    def wait(self, cost: float, now: float) -> float:
        """Seconds until there is room for ``cost`` (for a cost larger than the whole
        limit: until the window is empty, then it goes through alone, rather than
        never)."""
        self.prune(now)
        over = self.used + min(cost, self.capacity) - self.capacity
        if over <= 0:
            return 0.0
        freed = 0.0
        for when, amount in self.charges:
            freed += amount
            if freed >= over:
                return when + self.period - now
        return self.period  # (settles lowered charges: check again then)

    def charge(self, amount: float, now: float) -> list[float]:
        entry = [now, amount]
        self.charges.append(entry)
        self.used += amount
        return entry

    def amend(self, entry: list[float], amount: float, now: float | None) -> None:
        """Make a charge still in the window ``amount`` (its real usage), counted from
        ``now`` (when its request was answered; None: from when it was made)."""
        charges = self.charges
        if not charges or entry[0] < charges[0][0]:
            return  # it left the window already
        self.used += amount - entry[1]
        entry[1] = amount
        if now is None or now <= entry[0]:
            return
        if charges[-1] is not entry:
            charges.remove(entry)  # (kept in order: the oldest leaves first)
            now = max(now, charges[-1][0])
            charges.append(entry)
        entry[0] = now


_LIMITS = (*(dimension.field for dimension in DIMENSIONS), "concurrent")


class Pass:
    """What one request took of its lane (``Rates.acquire``): given back or settled
    once (``Rates.settle``, ``Rates.refund``, ``Rates.refused``)."""

    __slots__ = ("charges", "epoch", "lane", "open")

    def __init__(self, lane: Lane, charges: tuple[list[float], ...] = ()) -> None:
        self.lane = lane
        #: Its charge in each of the lane's windows, in their order.
        self.charges = charges
        self.open = True
        #: The lane's adaptive cuts so far when it was taken: a refusal of a request
        #: sent before the last cut does not cut again.
        self.epoch = lane.epoch


class _Wait:
    __slots__ = ("waiter",)

    def __init__(self) -> None:
        self.waiter: Waiter = new_waiter()


class Lane:
    """The limits of one model and the requests waiting for them (see the module)."""

    __slots__ = (
        "adaptive",
        "buckets",
        "cap",
        "counts",
        "epoch",
        "in_flight",
        "name",
        "paused_until",
        "pauses",
        "queue",
        "refused",
        "successes",
        "tokens",
        "wait_seconds",
        "waits",
    )

    def __init__(self, name: str, limit: RateLimit | None, now: float) -> None:
        self.name = name
        self.buckets: tuple[_Window, ...] = ()
        #: What its windows count ("requests", "tokens", "input tokens", "output
        #: tokens"): what a server's headers need not tell it; and whether that is
        #: tokens (its requests then need an input estimate).
        self.counts: frozenset[str] = frozenset()
        self.tokens = False
        self.cap: int | None = None
        if limit is not None:
            period = limit.period
            self.buckets = tuple(
                _Window(dimension, capacity, period)
                for dimension in DIMENSIONS
                if (capacity := getattr(limit, dimension.field)) is not None
            )
            self.cap = limit.concurrent
            self.counts = frozenset(bucket.dimension.name for bucket in self.buckets)
            self.tokens = any(bucket.dimension.tokens for bucket in self.buckets)
        #: Whether ``cap`` is the adaptive one (set after the server refused one).
        self.adaptive = False
        self.in_flight = 0
        self.paused_until = -math.inf
        self.queue: deque[_Wait] = deque()
        #: Successes since the adaptive concurrency last grew, and its cuts so far.
        self.successes = 0
        self.epoch = 0
        self.waits = 0
        self.wait_seconds = 0.0
        self.refused = 0
        self.pauses = 0

    @property
    def free(self) -> bool:
        """No limit, no pause, no one waiting: a request goes through at once."""
        return not (self.buckets or self.queue) and self.cap is None and self.paused_until < 0

    def delay(self, input: int, output: int, now: float) -> float:
        """Seconds until a request of this cost could go (inf: a slot must free)."""
        wait = self.paused_until - now
        if wait <= 0:
            self.paused_until = -math.inf  # (over: the lane may be free again)
        if self.cap is not None and self.in_flight >= self.cap:
            return math.inf
        for bucket in self.buckets:
            wait = max(wait, bucket.wait(bucket.dimension.cost(input, output), now))
        return max(wait, 0.0)

    def take(self, input: int, output: int, now: float) -> Pass:
        self.in_flight += 1
        charges = tuple(
            bucket.charge(bucket.dimension.cost(input, output), now) for bucket in self.buckets
        )
        return Pass(self, charges)


class Rates:
    """The lanes of one runtime (see the module's docstring)."""

    def __init__(
        self,
        limits: dict[str, RateLimit] | None,
        now: Callable[[], float] = anyio.current_time,
        *,
        count_refused: bool = False,
    ) -> None:
        for name, limit in (limits or {}).items():
            if not isinstance(name, str) or not name:
                raise ValueError(f"a rate limit's model name must be a non-empty string: {name!r}")
            if not isinstance(limit, RateLimit):
                raise TypeError(
                    f"rate_limits[{name!r}] must be a fractor.RateLimit, "
                    f"got {type(limit).__qualname__}"
                )
        self.limits = dict(limits or {})
        #: The tools the runtime caps (``tool_limits``: lanes ``tool:<name>``).
        self.tools = frozenset(
            name[len(TOOL_LANE) :] for name in self.limits if name.startswith(TOOL_LANE)
        )
        self.now = now
        #: Whether a request the server refused (not billed) counts against budgets'
        #: ``requests`` limits (as an attempt), or not at all.
        self.count_refused = count_refused
        self.lanes: dict[str, Lane] = {}

    def lane(self, name: str) -> Lane:
        """The lane of model ``name`` (made at its first request)."""
        lane = self.lanes.get(name)
        if lane is None:
            lane = self.lanes[name] = Lane(name, self.limits.get(name), self.now())
        return lane

    # -- taking and giving back -------------------------------------------------------

    def try_acquire(self, lane: Lane, input: int, output: int) -> Pass | None:
        """Take a request's cost now, or None when it must wait (``acquire``)."""
        if lane.free:
            lane.in_flight += 1
            return Pass(lane)
        now = self.now()
        if lane.queue or lane.delay(input, output, now) > 0:
            return None
        return lane.take(input, output, now)

    async def acquire(
        self,
        lane: Lane,
        input: int,
        output: int,
        on_wait: Callable[[str], None] | None = None,
    ) -> Pass:
        """Take a request's cost, waiting in line while the lane has no room."""
        taken = self.try_acquire(lane, input, output)
        if taken is not None:
            return taken
        wait = _Wait()
        lane.queue.append(wait)
        lane.waits += 1
        began = self.now()
        if on_wait is not None:
            on_wait(self.why(lane, input, output))
        try:
            while True:
                if lane.queue[0] is wait:
                    now = self.now()
                    delay = lane.delay(input, output, now)
                    if delay <= 0:
                        lane.queue.popleft()
                        taken = lane.take(input, output, now)
                        self._wake_head(lane)
                        return taken
                    if delay != math.inf:
                        with anyio.move_on_after(delay):
                            await park(wait.waiter)
                    else:
                        await park(wait.waiter)
                else:
                    await park(wait.waiter)
                wait.waiter = new_waiter()
        except BaseException:
            head = lane.queue and lane.queue[0] is wait
            lane.queue.remove(wait)
            if head:
                self._wake_head(lane)
            raise
        finally:
            lane.wait_seconds += self.now() - began

    def settle(self, taken: Pass, input: int, output: int, answered: float | None = None) -> None:
        """A request answered, having used ``input`` and ``output`` tokens: what it
        took beyond them comes back (what it used beyond its estimate is drawn), and
        its slot is free; the adaptive concurrency grows. Its charges are counted
        from ``answered`` (on this clock: when its answer began to arrive, its first
        streamed text) or from now."""
        if not taken.open:
            return
        lane = taken.lane
        self._close(taken)
        if lane.buckets:
            now = self.now() if answered is None else answered
            for bucket, entry in zip(lane.buckets, taken.charges, strict=False):
                bucket.amend(entry, bucket.dimension.cost(input, output), now)
        if lane.adaptive and lane.cap is not None:
            lane.successes += 1
            if lane.successes >= lane.cap:
                lane.successes = 0
                lane.cap += 1
        self._wake_head(lane)

    def refund(self, taken: Pass) -> None:
        """A request that was never billed (refused, cut off before it was sent): all
        it took comes back."""
        if not taken.open:
            return
        lane = taken.lane
        self._close(taken)
        for bucket, entry in zip(lane.buckets, taken.charges, strict=False):
            bucket.amend(entry, 0, None)
        self._wake_head(lane)

    def _close(self, taken: Pass) -> None:
        taken.open = False
        taken.lane.in_flight -= 1

    # -- what the server says -------------------------------------------------------

    def pause(self, lane: Lane, seconds: float) -> None:
        """The server asked to wait ``seconds``: nobody on the lane is sent before."""
        if seconds <= 0:
            return
        until = self.now() + seconds
        if until > lane.paused_until:
            lane.paused_until = until
            lane.pauses += 1

    def refused(self, taken: Pass, retry_after: float | None) -> None:
        """The server refused the request of ``taken`` (a 429; not billed): all it took
        comes back, the lane pauses for ``retry_after`` if the server said, and a lane
        with no declared concurrency adapts (at most once per pause)."""
        lane = taken.lane
        lane.refused += 1
        in_flight = lane.in_flight
        self.refund(taken)
        if retry_after is not None:
            self.pause(lane, retry_after)
        if (lane.cap is None or lane.adaptive) and taken.epoch == lane.epoch:
            lane.adaptive = True
            lane.cap = max(1, math.floor(min(in_flight, lane.cap or in_flight) * DECREASE))
            lane.successes = 0
            lane.epoch += 1

    def spent(self, lane: Lane, reset: float) -> None:
        """The server said nothing is left until ``reset`` seconds from now (its
        remaining count is 0): the lane pauses until then."""
        self.pause(lane, reset)

    # -- seeing it ---------------------------------------------------------------------

    def why(self, lane: Lane, input: int, output: int) -> str:
        """Why a request of this cost waits on ``lane``, in words."""
        now = self.now()
        head = f"rate limit of {lane.name}"
        if lane.paused_until > now:
            return f"{head}: paused {lane.paused_until - now:.3g} s, as the server asked"
        if lane.cap is not None and lane.in_flight >= lane.cap:
            kind = "adaptive " if lane.adaptive else ""
            return f"{head}: {lane.in_flight} requests in flight ({kind}concurrency {lane.cap})"
        for bucket in lane.buckets:
            if bucket.wait(bucket.dimension.cost(input, output), now) > 0:
                return f"{head}: {bucket.dimension.name} per minute ({bucket.capacity:,})"
        return f"{head}: in line behind {len(lane.queue) - 1} requests"

    def statistics(self) -> dict[str, LaneStatistics]:
        now = self.now()
        return {
            name: LaneStatistics(
                in_flight=lane.in_flight,
                waiting=len(lane.queue),
                concurrency=lane.cap,
                adaptive=lane.adaptive,
                paused_for=max(lane.paused_until - now, 0.0),
                waits=lane.waits,
                wait_seconds=lane.wait_seconds,
                refused=lane.refused,
                pauses=lane.pauses,
            )
            for name, lane in self.lanes.items()
        }

    @staticmethod
    def _wake_head(lane: Lane) -> None:
        if lane.queue:
            wake(lane.queue[0].waiter)
