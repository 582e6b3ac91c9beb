"""The budget stage: a reservation of the tree's budget before the request goes
on, settled with what it used after (every attempt is charged), and a reply cut by
the budget asked again with more room (DESIGN.md section 3, "Budgets").

It holds no budget while the request waits for its rate limit: when the lane has
no room (``MustWait``), it lets the reservation go, waits in line and reserves
again. While the request is in flight it is the task's request in progress
(``IN_CALL``), for a model inside it that admits requests of its own.
"""

from __future__ import annotations

import time
from contextvars import Token
from typing import TYPE_CHECKING

import anyio
import msgspec

from fractor.runtime import InvalidUsage, Usage

from .._execution._recording import EMPTY_USAGE
from .._models._inside import IN_CALL, CallSlot
from .._observation._events import BudgetResume, BudgetWait, Retry
from ._call import Call, Next, cut, failed_usage, refused, unsent
from ._rate import MustWait

if TYPE_CHECKING:
    from fractor.runtime import Reservation

    from .._execution._recording import Recorder
    from .._messages import ModelResponse

__all__ = ["Budget", "bind_calls"]

#: What a request the server refused is charged when refusals count: one request.
_ATTEMPT = Usage(requests=1)


class Budget:
    """The budget stage (see the module's docstring). ``again``: whether a reply
    cut at a cap the budget set (its sharing, or the default reserved for a
    request that names no cap: ``Reservation.again``), not the request's own, is
    asked again with room for at least twice as much; optional work sent once (a
    summarization) takes its reply as it came."""

    __slots__ = ("again", "next")

    def __init__(self, next: Next, *, again: bool = True) -> None:
        self.next = next
        self.again = again

    async def send(self, call: Call) -> ModelResponse:
        recorder = call.recorder
        supervisor = recorder.supervisor
        node = recorder.node
        request = call.request
        wanted = request.max_tokens
        name = call.name
        while True:
            call.sent = False
            call.inner = 0
            call.used = None
            try:
                reservation = supervisor.reserve_nowait(
                    node,
                    input_estimate=call.estimate,
                    max_tokens=wanted,
                    model=name,
                    at_least=call.at_least,
                )
            except anyio.WouldBlock:
                _give_back(call)  # (no place in the lane held while it waits)
                reservation = await _wait_for_budget(recorder, call)
            except BaseException:
                _give_back(call)
                raise
            call.reservation = reservation
            call.outgoing = (
                request
                if reservation.max_tokens == wanted
                else msgspec.structs.replace(request, max_tokens=reservation.max_tokens)
            )
            # The task's request in flight, for a model inside it (``admitting``):
            # the execution's slot, bound as it began; a slot of its own outside one.
            slot = IN_CALL.get()
            if slot is not None and slot.owner is recorder:
                bound = None
                outer = slot.call
                slot.call = call
            else:
                slot = CallSlot(recorder, call)
                bound = IN_CALL.set(slot)
                outer = None
            try:
                response = await self.next(call)
            except MustWait as wait:
                if wait.error is None:
                    supervisor.release(node, reservation)  # (nothing sent, nothing charged)
                else:  # refused by the server, which said how long to wait
                    _failed(call, reservation, wait.error)
                call.reservation = None
                call.taken = await wait.rate.wait(call)
                continue
            except Exception as exc:
                if call.sent:
                    _failed(call, reservation, exc)
                else:
                    supervisor.release(node, reservation)
                raise
            except BaseException:
                # Cut off (a deadline, a stop): what it read was spent, and what it
                # streamed.
                if call.sent:
                    _charge(recorder, reservation, cut(call), call)
                else:
                    supervisor.release(node, reservation)
                raise
            finally:
                slot.call = outer
                if bound is not None:
                    IN_CALL.reset(bound)
            usage = response.usage
            try:
                charged = supervisor.settle(
                    node, reservation, usage, model=name, estimate=None if call.estimated else call
                )
            except InvalidUsage as exc:
                recorder.charged = recorder.charged + exc.charged
                raise
            spent = recorder.charged
            recorder.charged = charged if spent is EMPTY_USAGE else spent + charged
            if not self.again or response.finish_reason != "length":
                return response
            # Cut by the budget, not by its own cap: ask again with more room.
            grown = reservation.again(usage.output_tokens, wanted is not None)
            if grown is None:
                return response
            call.at_least = grown
            if recorder.observed:
                why = (
                    "by the budget shared with requests in flight"
                    if reservation.limited_by is not None
                    else "reserved for a request that names no max_tokens"
                )
                recorder.emit(
                    Retry(
                        attempt=call.attempt + 1,
                        error=f"reply cut at {reservation.output} tokens {why}; "
                        f"asking again with room for {grown}",
                        delay=0.0,
                    )
                )


def _failed(call: Call, reservation: Reservation, error: Exception) -> None:
    """Settle an attempt the model did not answer."""
    recorder = call.recorder
    if call.used is None and (refused(error) or unsent(error)):
        # Refused by the server, or it never reached one: not billed.
        supervisor = recorder.supervisor
        if supervisor.rates.count_refused:  # an attempt, if the user counts them
            _charge(recorder, reservation, _ATTEMPT, call)
        else:
            supervisor.release(recorder.node, reservation)
    else:
        _charge(recorder, reservation, failed_usage(call, error), call)


def _give_back(call: Call) -> None:
    """Give back the place in the lane a request took while it held no budget."""
    taken = call.taken
    if taken is not None:
        call.taken = None
        call.recorder.supervisor.rates.refund(taken)


def _charge(recorder: Recorder, reservation: Reservation, usage: Usage | None, call: Call) -> None:
    """Settle a request that failed or was cut off: what its error reported (if
    that cannot be true, the whole reservation), or its input estimate."""
    try:
        charged = recorder.supervisor.settle(
            recorder.node,
            reservation,
            usage,
            model=call.name,
            estimate=None if call.estimated else call,
        )
    except InvalidUsage as exc:  # the request failed already: that error stands
        charged = exc.charged
    recorder.charged = recorder.charged + charged


async def _wait_for_budget(recorder: Recorder, call: Call) -> Reservation:
    """Wait for headroom that requests in flight hold; visible as events, in the
    tree (the node's ``waiting``) and in the runtime's statistics."""
    observed = recorder.observed
    began = time.perf_counter()
    on_wait = (lambda why: recorder.emit(BudgetWait(reason=why))) if observed else None
    try:
        return await recorder.supervisor.reserve(
            recorder.node,
            input_estimate=call.estimate,
            max_tokens=call.request.max_tokens,
            model=call.name,
            at_least=call.at_least,
            on_wait=on_wait,
        )
    finally:
        if observed:
            recorder.emit(BudgetResume(seconds=time.perf_counter() - began))


def bind_calls(recorder: Recorder) -> Token[CallSlot | None]:
    """Bind the slot of an execution's requests in flight (the ``recorder``'s) to
    the context of the task it runs in, until it ends: reset with the token."""
    return IN_CALL.set(CallSlot(recorder))
