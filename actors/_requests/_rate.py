"""The rate stage: a place in the model's rate lane (its declared limits, and the
pauses its server asks for) before the request goes on; what it used settled
after, and what the server's headers said heard (DESIGN.md section 3, "Rate
limits"). A request the server refused for its rate limits, with a time to wait,
waits in line with the model's other requests and goes again."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

import anyio

from fractor.runtime.lowlevel import DIMENSIONS

from .._agent._policy import is_retryable, retry_after
from .._observation._events import RateResume, RateWait, Retry
from ._call import (
    Call,
    Next,
    cut,
    failed_usage,
    no_time_to_retry,
    outwaits,
    refused,
    tokens,
    unsent,
)

if TYPE_CHECKING:
    from fractor.runtime.lowlevel import Lane, Pass, Rates

    from .._execution._recording import Recorder
    from .._messages import ModelResponse

__all__ = ["MustWait", "Paused", "Rate", "wait_for_rate"]


class MustWait(Exception):
    """The request must wait in the lane while it holds budget: there is no room
    for it now, or the server refused it and asked it to wait (``error``, a
    rate limit's 429 with a Retry-After, which paused the lane). The budget stage
    settles the attempt (``error``'s), lets its reservation go, waits in line
    (``Rate.wait``) and reserves again, so that no request holds budget while it
    waits for a rate limit."""

    def __init__(self, rate: Rate, error: Exception | None = None) -> None:
        super().__init__("the rate lane has no room")
        self.rate = rate
        self.error = error


class Paused(Exception):
    """A model's rate limit would make a request wait longer than its fallback chain
    waits (or than the deadline leaves): the next model is asked."""

    kind = "rate_limited"

    def __init__(self, why: str, patience: float, seconds: float | None = None) -> None:
        waits = f"the {max(patience, 0.0):.3g} s the fallback chain waits"
        if seconds is None:
            super().__init__(f"{why}: no room within {waits}")
        else:
            super().__init__(f"{why}: it would wait {seconds:.3g} s, longer than {waits}")


class Rate:
    """The rate stage (see the module's docstring). ``again``: whether a request
    the server refused with a time to wait waits in line and goes again (flow,
    not failure: no attempt of its retries); optional work sent once (a
    summarization) takes the refusal as its answer."""

    __slots__ = ("again", "next")

    def __init__(self, next: Next, *, again: bool = True) -> None:
        self.next = next
        self.again = again

    async def send(self, call: Call) -> ModelResponse:
        recorder = call.recorder
        rates = recorder.supervisor.rates
        lane = call.lane
        taken = call.taken
        if taken is None:
            taken = rates.try_acquire(lane, call.estimate, _output(call))
            if taken is None:
                raise MustWait(self)  # (the budget stage waits, holding nothing)
        call.taken = None
        try:
            response = await self.next(call)
        except Exception as exc:
            used = call.used
            if used is None and refused(exc):
                # A refusal pauses the lane as the server asked, for every request
                # of the model.
                rates.refused(taken, retry_after(exc) or None)
            elif used is None and unsent(exc):
                rates.refund(taken)
            else:
                rates.settle(taken, *tokens(failed_usage(call, exc), call))
            _heard(rates, lane, getattr(exc, "limits", None))
            if self.again and refused(exc) and self._waits(call, exc):
                raise MustWait(self, exc) from exc
            raise
        except BaseException:
            rates.settle(taken, *tokens(cut(call), call))
            raise
        usage = response.usage
        streamed = recorder.sink is not None and recorder.streamed
        rates.settle(
            taken,
            usage.input_tokens,
            usage.output_tokens,
            recorder.first_text if streamed else None,
        )
        if response.limits is not None:
            _heard(rates, lane, response.limits)
        return response

    def _waits(self, call: Call, error: Exception) -> bool:
        """Whether a request the server refused waits in line and goes again:
        when the server said how long to wait (0 too: "try again in 0 ms", a
        window about to free) and the deadline leaves time for it (else the
        execution ends ``timed_out`` now), and, for a model of a fallback chain,
        no longer than the chain waits (else the next model is asked)."""
        asked = retry_after(error)
        if not (asked > 0 or getattr(error, "retry_after", None) == 0):
            return False
        if not is_retryable(error):
            return False
        recorder = call.recorder
        left = recorder.node.deadline - recorder.supervisor.now()
        if outwaits(call, asked, left):
            return False
        if asked >= left:
            no_time_to_retry(recorder, asked, asked)
            return False
        if recorder.observed:
            recorder.emit(Retry(attempt=call.attempt + 1, error=f"{error!r}"[:300], delay=asked))
        return True

    async def wait(self, call: Call) -> Pass:
        """Wait in line for room in the lane; for a model of a fallback chain, no
        longer than the chain waits (``Call.patience``): ``Paused`` at once when the
        lane says the request could not go before then (a pause the server asked
        for, a window with no room until later), and when a wait it could not tell
        the end of (a slot to free, requests ahead in line) outlasts it."""
        recorder = call.recorder
        lane = call.lane
        output = _output(call)
        if call.patience is None:
            return await wait_for_rate(recorder, lane, call.estimate, output)
        supervisor = recorder.supervisor
        now = supervisor.now()
        patience = min(call.patience, recorder.node.deadline - now)
        delay = lane.delay(call.estimate, output, now)
        if delay != math.inf and delay > patience:
            raise Paused(supervisor.rates.why(lane, call.estimate, output), patience, delay)
        with anyio.move_on_after(max(patience, 0.0)):
            return await wait_for_rate(recorder, lane, call.estimate, output)
        raise Paused(supervisor.rates.why(lane, call.estimate, output), patience)


def _output(call: Call) -> int:
    """The output a request takes of its lane's tokens: its cap, or the default."""
    wanted = call.request.max_tokens
    return wanted if wanted is not None else call.recorder.supervisor.default_max_tokens


async def wait_for_rate(
    recorder: Recorder, lane: Lane, estimate: int, output: int, *, shown: bool = True
) -> Pass:
    """Wait in line for room in a lane (a model's rate limits, a capped tool's
    slots); visible as events and, when ``shown``, in the tree (the node's
    ``waiting``: a model request's, never one of several tool calls')."""
    observed = recorder.observed
    node = recorder.node
    began = time.perf_counter()

    def on_wait(why: str) -> None:
        if shown:
            node.waiting = why
        if observed:
            recorder.emit(RateWait(lane=lane.name, reason=why))

    try:
        return await recorder.supervisor.rates.acquire(lane, estimate, output, on_wait)
    finally:
        if shown:
            node.waiting = ""
        if observed:
            recorder.emit(RateResume(lane=lane.name, seconds=time.perf_counter() - began))


def _heard(rates: Rates, lane: Lane, limits: object) -> None:
    """What a server's rate-limit headers said (``ServerLimits``): a count with
    nothing left pauses the lane until it resets, unless the lane counts it itself
    (a limit declared for it: its window knows better when the next request fits
    than a reset, which says when the server's window is empty)."""
    if limits is None:
        return
    counts = lane.counts
    for remaining, reset, name in _HEARD:
        if name in counts:
            continue
        left = getattr(limits, remaining, None)
        if left is not None and left <= 0:
            seconds = getattr(limits, reset, None)
            if seconds:
                rates.spent(lane, seconds)


#: What the headers say of each count: (remaining, reset, the count's name).
_HEARD = tuple((f"{d.key}_remaining", f"{d.key}_reset", d.name) for d in DIMENSIONS)
