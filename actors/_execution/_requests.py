"""One model request of an execution, under the supervisor: reserve (waiting for
headroom that requests in flight hold), send, settle, with the agent's retries
(DESIGN.md section 3, "Budgets"). Every attempt is checked and charged.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar, Token
from typing import TYPE_CHECKING, Literal, Protocol, cast

import anyio
import msgspec

from fractor.runtime import InvalidUsage, Node, Reservation, Supervisor, Usage
from fractor.runtime.lowlevel import DIMENSIONS

from .._agent._policy import is_retryable, retry_after
from .._messages import ModelRequest, ModelResponse, ToolCall, exception_text, safe_text
from .._models._fallback import FallbackModel, falls_back
from .._observation._events import (
    BudgetResume,
    BudgetWait,
    RateResume,
    RateWait,
    RequestEnd,
    RequestStart,
    Retry,
)
from ._recording import EMPTY_USAGE, Recorder

if TYPE_CHECKING:
    from fractor.runtime.lowlevel import Lane, Pass, Rates

    from .._agent._policy import RetryPolicy
    from .._models._protocol import Model, Send, StreamingModel

__all__ = [
    "EMPTY_USAGE",
    "admitting",
    "ascii_arguments",
    "bind_calls",
    "safe_response",
    "send",
    "sender",
    "wait_for_rate",
]

#: Characters per output token, for the estimate of a stream that was cut.
_CHARS_PER_TOKEN = 4
#: What a request the server refused is charged when refusals count: one request.
_ATTEMPT = Usage(requests=1)


class Sender(Protocol):
    """``send`` for one model (``sender``)."""

    def __call__(
        self, recorder: Recorder, model: Model, request: ModelRequest, retry: RetryPolicy, /
    ) -> Awaitable[ModelResponse]: ...


def sender(model: Model) -> Sender:
    """``send`` for the requests of ``model``, chosen once (an execution's loop sends
    each step's through it): ``_send`` itself but for a ``FallbackModel``."""
    if isinstance(model, FallbackModel):
        return send
    return _send


def send(
    recorder: Recorder,
    model: Model,
    request: ModelRequest,
    retry: RetryPolicy,
    *,
    once: bool = False,
) -> Awaitable[ModelResponse]:
    """One model request of an execution (``_send``), or, for a ``FallbackModel``,
    one to each model of its chain in turn until one answers: each its own request
    (its own lane, reservation, price and events), the chain moving on when the
    one before cannot answer (``falls_back``; a rate limit that would make it wait
    longer than the chain's ``max_wait`` or the deadline leaves).

    Not a coroutine of its own: it hands back ``_send``'s (or the chain's), one
    frame less between the execution's loop and the model at every step."""
    if not isinstance(model, FallbackModel):
        return _send(recorder, model, request, retry, once)
    return _fall_back(recorder, model, request, retry, once)


async def _fall_back(
    recorder: Recorder,
    model: FallbackModel,
    request: ModelRequest,
    retry: RetryPolicy,
    once: bool,
) -> ModelResponse:
    """``send`` to a ``FallbackModel``: each model of its chain in turn."""
    chain = model.models
    last = len(chain) - 1
    for index, link in enumerate(chain):
        if index == last:
            return await _named(_send(recorder, link, request, retry, once=once), link)
        try:
            return await _named(
                _send(recorder, link, request, retry, once=once, wait=model.max_wait), link
            )
        except Exception as exc:
            if not falls_back(exc, retried=True):
                raise
            if recorder.observed:
                recorder.emit(
                    Retry(
                        attempt=index + 1,
                        error=f"{link.name} did not answer ({exception_text(exc)[:200]}); "
                        f"falling back to {chain[index + 1].name}",
                        delay=0.0,
                    )
                )
    raise AssertionError("unreachable: the last model answers or raises")


async def _named(sending: Awaitable[ModelResponse], model: Model) -> ModelResponse:
    """A fallback chain's answer, naming the model that gave it."""
    response = await sending
    if not response.model:
        response = msgspec.structs.replace(response, model=model.name)
    return response


class _Paused(Exception):
    """A model's rate limit would make a request wait longer than its fallback chain
    waits (or than the deadline leaves): the next model is asked."""

    kind = "rate_limited"

    def __init__(self, why: str, patience: float, seconds: float | None = None) -> None:
        waits = f"the {max(patience, 0.0):.3g} s the fallback chain waits"
        if seconds is None:
            super().__init__(f"{why}: no room within {waits}")
        else:
            super().__init__(f"{why}: it would wait {seconds:.3g} s, longer than {waits}")


async def _send(
    recorder: Recorder,
    model: Model,
    request: ModelRequest,
    retry: RetryPolicy,
    once: bool = False,
    wait: float | None = math.inf,
) -> ModelResponse:
    """One model request of an execution (whose ``recorder`` knows its node and
    keeps its step in flight) under the budget: reserve (waiting for headroom if
    others hold it), send, settle; with the agent's ``retry`` policy.

    Every attempt is charged (``recorder.charged`` adds them up): a failed one what
    the error reported or its input estimate, a cancelled one its input estimate.
    A reply cut at a cap that the budget set (its sharing, or the default reserved
    for a request that names no cap: ``Reservation.again``), not the request's own,
    is asked again with room for at least twice as much, waiting for it if needed;
    if the settled usage has no room for that, the budget is spent and says so.

    ``once``: one attempt and no more, for optional work (a summarization, sent only
    with room for itself and the step it is done for): no retry and no second ask;
    its error, or its reply as it came, is the caller's to take.
    """
    supervisor = recorder.supervisor
    node = recorder.node
    wanted = request.max_tokens
    name = model.name
    rates = supervisor.rates
    lane = rates.lanes.get(name)  # (made at the model's first request)
    if lane is None:
        lane = rates.lane(name)
    # The input estimate is the budget's pre-check (and a token rate limit's): with
    # neither it is made only if the request fails (what it is charged then), never
    # per request (it reads the whole context: a long conversation would pay for it
    # every step).
    estimated = node.limited or lane.tokens
    estimate = model.estimate_tokens(request) if estimated else 0
    # What a request charged as its estimate (failed, cut, impossible usage) charges
    # when it was reserved without one.
    # (A partial, not a closure: the model and the request stay plain locals here.)
    lazy = None if estimated else functools.partial(model.estimate_tokens, request)
    attempt = 0
    at_least: int | None = None
    # A model of a fallback chain with one after it waits at most ``wait`` (or what
    # the deadline leaves) for its rate limit: past that, the next one is asked.
    falling = wait is None or wait != math.inf
    while True:
        admitted = _try_admit(supervisor, rates, node, lane, estimate, wanted, name, at_least)
        if isinstance(admitted, str):  # the lane or the budget has no room now: wait
            admitted = await _admit(
                recorder, lane, estimate, wanted, name, at_least, admitted, wait
            )
        reservation, taken = admitted
        sent = request
        if reservation.max_tokens != wanted:
            sent = msgspec.structs.replace(request, max_tokens=reservation.max_tokens)
        error: Exception
        sink = recorder.sink
        observed = recorder.observed
        if observed:
            # An observer recording contents gets the messages (a reference: no copy).
            recorder.emit(
                RequestStart(
                    step=len(recorder.steps),
                    attempt=attempt + 1,
                    model=name,
                    purpose=request.purpose,
                    messages=request.messages if recorder.bus.contents else None,
                )
            )
        # A model built on another, inside this call, has its requests admitted: the
        # call in progress in this task is kept in the execution's slot (bound as it
        # began; the context variable is set for a request outside one), its
        # ``_Call`` made only if such a model asks for it (``admitting``).
        slot = _CALL.get()
        if slot is not None and slot.recorder is recorder:
            calling = None
            outer, outer_call = slot.reservation, slot.call
        else:
            slot = _InCall(recorder)
            calling = _CALL.set(slot)
            outer = outer_call = None
        slot.reservation = reservation
        slot.call = None
        try:
            try:
                if sink is None:
                    response = await model.request(sent)
                else:
                    recorder.streamed.clear()  # each attempt streams from its start
                    response = await cast("StreamingModel", model).stream(sent, sink)
            finally:
                call = slot.call  # (None: no request of its own went through it)
                slot.reservation, slot.call = outer, outer_call
                if calling is not None:
                    _CALL.reset(calling)
        except Exception as exc:
            error = exc
            used = call.used if call is not None else None
            refused = _refused(exc)
            if used is None and (refused or _unsent(exc)):
                # The server refused it (a rate limit), or it never reached a server
                # (no connection was made): not billed, not counted. A refusal pauses
                # the lane as the server asked, for every request of the model.
                if refused:
                    rates.refused(taken, retry_after(exc) or None)
                else:
                    rates.refund(taken)
                if rates.count_refused:  # an attempt, if the user counts them
                    _charge(recorder, reservation, _ATTEMPT, name, lazy)
                else:
                    supervisor.release(node, reservation)
                if observed:
                    _request_end(recorder, name, None, error=exception_text(exc))
            else:
                reported = _reported(exc) or used
                rates.settle(taken, *_tokens(reported, reservation))
                _charge(recorder, reservation, reported, name, lazy)
                if observed:
                    _request_end(recorder, name, reported, error=exception_text(exc))
            _heard(rates, lane, getattr(exc, "limits", None))
        except BaseException:
            # Cut off (a deadline, a stop): what it read was spent, and what it streamed.
            spent = _cut(recorder, reservation, lazy) or (call.used if call is not None else None)
            rates.settle(taken, *_tokens(spent, reservation))
            _charge(recorder, reservation, spent, name, lazy)
            if observed:
                _request_end(recorder, name, None, error="cut off before the model answered")
            raise
        else:
            usage = response.usage
            rates.settle(
                taken,
                usage.input_tokens,
                usage.output_tokens,
                recorder.first_text if sink is not None and recorder.streamed else None,
            )
            if response.limits is not None:
                _heard(rates, lane, response.limits)
            if observed:
                _request_end(recorder, name, response.usage, response=response)
            try:
                charged = supervisor.settle(
                    node, reservation, response.usage, model=name, estimate=lazy
                )
            except InvalidUsage as exc:
                error = exc
                recorder.charged = recorder.charged + exc.charged
            else:
                spent = recorder.charged
                recorder.charged = charged if spent is EMPTY_USAGE else spent + charged
                if once or response.finish_reason != "length":
                    return response
                # Cut by the budget (its sharing, or the default reserved for a request
                # that names no cap), not by its own cap: ask again with more room.
                grown = reservation.again(response.usage.output_tokens, wanted is not None)
                if grown is None:
                    return response
                at_least = grown
                if recorder.observed:
                    why = (
                        "by the budget shared with requests in flight"
                        if reservation.limited_by is not None
                        else "reserved for a request that names no max_tokens"
                    )
                    recorder.emit(
                        Retry(
                            attempt=attempt + 1,
                            error=f"reply cut at {reservation.output} tokens {why}; "
                            f"asking again with room for {at_least}",
                            delay=0.0,
                        )
                    )
                continue
        asked = retry_after(error)
        if falling and asked > _patience(wait, node.deadline - supervisor.now()):
            raise error  # (the next model of the chain is asked)
        said = asked > 0 or getattr(error, "retry_after", None) == 0
        if said and not once and _refused(error) and is_retryable(error):
            # Refused for the model's rate limits, with a time to wait (0 too: "try
            # again in 0ms", a window about to free): the lane is paused that long for
            # every request of the model, and this one waits in line there with them
            # (flow, not failure: no attempt of its retries).
            if supervisor.now() + asked >= node.deadline:
                _no_time_to_retry(recorder, asked, asked)
                raise error
            if recorder.observed:
                recorder.emit(Retry(attempt=attempt + 1, error=f"{error!r}"[:300], delay=asked))
            continue
        attempt += 1
        if once or attempt > retry.retries or not is_retryable(error):
            raise error
        delay = retry.delay(attempt, at_least=asked)
        if supervisor.now() + delay >= node.deadline:
            # No sleep that the deadline would cut: the execution times out now.
            _no_time_to_retry(recorder, delay, asked)
            raise error
        if recorder.observed:
            recorder.emit(Retry(attempt=attempt, error=f"{error!r}"[:300], delay=delay))
        await anyio.sleep(delay)


def _patience(wait: float | None, left: float) -> float:
    """How long a model of a fallback chain waits for its rate limit: its chain's
    ``max_wait`` (None: as long as the deadline leaves), within the deadline."""
    return left if wait is None else min(wait, left)


def _request_end(
    recorder: Recorder,
    model: str,
    usage: Usage | None,
    *,
    response: ModelResponse | None = None,
    error: str = "",
) -> None:
    """The event of one model request's end: its model, usage and finish reason (the
    tool calls it asked for, by id and name), or its error; the response itself for
    an observer that records contents."""
    if response is None:
        recorder.emit(
            RequestEnd(
                model=model,
                input_tokens=usage.input_tokens if usage is not None else 0,
                output_tokens=usage.output_tokens if usage is not None else 0,
                finish_reason="error",
                error=error[:300],
            )
        )
        return
    recorder.emit(
        RequestEnd(
            model=model,
            response_model=response.model,
            input_tokens=response.usage.input_tokens,
            output_tokens=response.usage.output_tokens,
            finish_reason=response.finish_reason,
            tool_calls=tuple((call.id, call.name) for call in response.tool_calls),
            response=response if recorder.bus.contents else None,
        )
    )


def _charge(
    recorder: Recorder,
    reservation: Reservation,
    usage: Usage | None,
    model: str,
    estimate: Callable[[], int] | None,
) -> None:
    """Settle a request that failed or was cut off: what its error reported (if
    that cannot be true, the whole reservation), or its input estimate."""
    try:
        charged = recorder.supervisor.settle(
            recorder.node, reservation, usage, model=model, estimate=estimate
        )
    except InvalidUsage as exc:  # the request failed already: that error stands
        charged = exc.charged
    recorder.charged = recorder.charged + charged


class _Call:
    """One model call of an execution in progress (``send``): a model built on
    another that sends requests of its own inside it (a ``ReActModel`` a user's model
    calls directly) has each one after the first admitted before it is sent."""

    __slots__ = ("recorder", "reservation", "sent", "used")

    def __init__(self, recorder: Recorder, reservation: Reservation) -> None:
        self.recorder = recorder
        self.reservation = reservation
        #: Requests sent through ``send`` so far: the first is the reservation's own.
        self.sent = 0
        #: What the answers to them reported: the call's usage if it fails after.
        self.used: Usage | None = None

    async def send(self, model: Model, request: ModelRequest) -> ModelResponse:
        if self.sent:  # one more request: a counter, checked and charged at once
            recorder = self.recorder  # (waits only while leased elsewhere)
            await recorder.supervisor.charge_waiting(recorder.node, requests=1)
            self.reservation.requests += 1
        self.sent += 1
        response = await model.request(request)
        used = self.used
        self.used = response.usage if used is None else used + response.usage
        return response


class _InCall:
    """Where the model call in progress in a task is kept (see ``admitting``): one
    for each execution, bound to its task's context as it begins (``bind_calls``),
    so that a request sets its fields, not the context variable, as it is sent."""

    __slots__ = ("call", "recorder", "reservation")

    def __init__(self, recorder: Recorder) -> None:
        #: The execution whose requests it keeps: a task that inherited the slot of
        #: the execution that started it (a child actor's) never uses that one.
        self.recorder = recorder
        #: The reservation of the call in progress (None: no call in progress).
        self.reservation: Reservation | None = None
        #: Its ``_Call``, made when a model built on another first asks for it.
        self.call: _Call | None = None

    def current(self) -> _Call | None:
        """The model call in progress, if one is (made at the first ask)."""
        reservation = self.reservation
        if reservation is None:
            return None
        call = self.call
        if call is None:
            call = self.call = _Call(self.recorder, reservation)
        return call


#: The model call in progress in this context, if any, in its slot (see ``admitting``).
_CALL: ContextVar[_InCall | None] = ContextVar("fractor_model_call", default=None)


def bind_calls(recorder: Recorder) -> Token[_InCall | None]:
    """Bind the slot of an execution's model calls (the ``recorder``'s) to the
    context of the task it runs in, until it ends: reset with the token."""
    return _CALL.set(_InCall(recorder))


def admitting(model: Model) -> Send:
    """How a model built on another sends its own requests to ``model`` when it is
    not given a ``send`` (``ReActModel.request``).

    Inside an agent's model call (a user's model that calls a ``ReActModel``
    directly), each request after the first is admitted by the agent's supervisor
    before it is sent: one more request, checked and charged at once (its output is
    within the call's reservation), so one that a ``requests`` limit has no room for
    is refused and never sent. Anywhere else, ``model.request``.
    """
    slot = _CALL.get()
    call = slot.current() if slot is not None else None
    if call is None:
        return model.request
    return functools.partial(call.send, model)


def _no_time_to_retry(recorder: Recorder, delay: float, asked: float) -> None:
    """The retry of a failed request would come after the execution's deadline:
    stop its node ``timed_out`` now, saying why (the request's error ends the step,
    and the execution reads its status from the node)."""
    node = recorder.node
    owner = node.deadline_owner or node
    seconds = owner.limits.seconds if owner.limits is not None else None
    shown = f"{seconds:g} s " if seconds is not None else ""
    why = f"the server's Retry-After of {asked:g} s" if asked >= delay else "its backoff"
    reason = (
        f"deadline of {shown}would pass before the retry of a failed model request "
        f"({delay:.3g} s away: {why}; budget of {owner.name} {owner.id!r})"
    )
    recorder.supervisor.stop_subtree(node, "timed_out", reason, cancel=False)


def _try_admit(
    supervisor: Supervisor,
    rates: Rates,
    node: Node,
    lane: Lane,
    estimate: int,
    wanted: int | None,
    model: str,
    at_least: int | None,
) -> tuple[Reservation, Pass] | Literal["lane", "budget"]:
    """``_admit`` when neither the rate limit nor the budget makes the request wait
    (the usual request), with no coroutine of its own; else which one would first
    (nothing is held then: ``_admit`` waits, from there)."""
    output = wanted if wanted is not None else supervisor.admission.default_max_tokens
    taken = rates.try_acquire(lane, estimate, output)
    if taken is None:
        return "lane"
    reservation = _reserve(supervisor, rates, node, taken, estimate, wanted, model, at_least)
    return "budget" if reservation is None else (reservation, taken)


def _reserve(
    supervisor: Supervisor,
    rates: Rates,
    node: Node,
    taken: Pass,
    estimate: int,
    wanted: int | None,
    model: str,
    at_least: int | None,
) -> Reservation | None:
    """The budget's reservation for a request that holds ``taken`` in its lane, or
    None when it must wait for budget: its place in the lane is given back then."""
    try:
        return supervisor.reserve_nowait(
            node, input_estimate=estimate, max_tokens=wanted, model=model, at_least=at_least
        )
    except anyio.WouldBlock:
        rates.refund(taken)
        return None
    except BaseException:
        rates.refund(taken)
        raise


async def _admit(
    recorder: Recorder,
    lane: Lane,
    estimate: int,
    wanted: int | None,
    model: str,
    at_least: int | None,
    blocked: Literal["lane", "budget"],
    wait: float | None = math.inf,
) -> tuple[Reservation, Pass]:
    """Room for one request in its model's rate limits, then in the budget: waiting
    for either, and never holding budget while it waits for the rate limit (a
    request that must wait for budget gives its place in the lane back, and takes
    one again once it has the budget, or lets the budget go and waits in line).
    ``blocked``: what ``_try_admit`` found without room (nothing held), where the
    wait begins. ``wait``: how long a model of a fallback chain waits for its rate
    limit (``_patience``; inf: as long as it takes), past which ``_Paused``."""
    supervisor = recorder.supervisor
    rates = supervisor.rates
    node = recorder.node
    output = wanted if wanted is not None else supervisor.default_max_tokens
    while True:
        if blocked == "lane":
            if wait is None or wait != math.inf:
                taken = await _wait_for_rate_within(recorder, lane, estimate, output, wait)
            else:
                taken = await wait_for_rate(recorder, lane, estimate, output)
            reservation = _reserve(
                supervisor, rates, node, taken, estimate, wanted, model, at_least
            )
            if reservation is not None:
                return reservation, taken
        reservation = await _wait_for_budget(recorder, estimate, wanted, model, at_least)
        again = rates.try_acquire(lane, estimate, output)
        if again is not None:
            return reservation, again
        supervisor.release(node, reservation)  # (nothing charged: not sent)
        admitted = _try_admit(supervisor, rates, node, lane, estimate, wanted, model, at_least)
        if not isinstance(admitted, str):
            return admitted
        blocked = admitted


async def _wait_for_rate_within(
    recorder: Recorder, lane: Lane, estimate: int, output: int, wait: float | None
) -> Pass:
    """``wait_for_rate`` for a model of a fallback chain, which waits for its rate
    limit no longer than the chain does (``_patience``): at once ``_Paused`` when
    the lane says the request could not go before then (a pause the server asked
    for, a declared window with no room until later), and when a wait it could not
    tell the end of (a slot to free, requests ahead in line) outlasts it."""
    supervisor = recorder.supervisor
    now = supervisor.now()
    patience = _patience(wait, recorder.node.deadline - now)
    delay = lane.delay(estimate, output, now)
    if delay != math.inf and delay > patience:
        raise _Paused(supervisor.rates.why(lane, estimate, output), patience, delay)
    with anyio.move_on_after(max(patience, 0.0)):
        return await wait_for_rate(recorder, lane, estimate, output)
    raise _Paused(supervisor.rates.why(lane, estimate, output), patience)


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


def _refused(error: Exception) -> bool:
    """Whether the server refused the request for its rate limits (429, or 503 with a
    Retry-After): nothing was billed."""
    status = getattr(error, "status", None)
    return status == 429 or (status in (503, 529) and bool(retry_after(error)))


def _unsent(error: Exception) -> bool:
    """Whether the request never reached a server (a provider error of kind
    "unreachable": no connection was made): nothing was sent, nothing billed."""
    return getattr(error, "kind", "") == "unreachable"


def _tokens(usage: Usage | None, reservation: Reservation) -> tuple[int, int]:
    """What a request that did not answer used of a rate limit's tokens: what it
    reported, or its input as reserved."""
    if usage is None:
        return reservation.input, 0
    return usage.input_tokens, usage.output_tokens


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


async def _wait_for_budget(
    recorder: Recorder, estimate: int, max_tokens: int | None, model: str, at_least: int | None
) -> Reservation:
    """Wait for headroom that requests in flight hold; visible as events, in the
    tree (the node's ``waiting``) and in the runtime's statistics."""
    observed = recorder.observed
    began = time.perf_counter()
    on_wait = (lambda why: recorder.emit(BudgetWait(reason=why))) if observed else None
    try:
        return await recorder.supervisor.reserve(
            recorder.node,
            input_estimate=estimate,
            max_tokens=max_tokens,
            model=model,
            at_least=at_least,
            on_wait=on_wait,
        )
    finally:
        if observed:
            recorder.emit(BudgetResume(seconds=time.perf_counter() - began))


def ascii_arguments(calls: tuple[ToolCall, ...]) -> bool:
    if len(calls) == 1:  # the usual step: no generator
        return calls[0].arguments.isascii()
    return all(tool_call.arguments.isascii() for tool_call in calls)


def safe_response(response: ModelResponse) -> ModelResponse:
    """A model's reply with its text made safe for every store and provider."""
    calls = tuple(
        c if c.arguments.isascii() else msgspec.structs.replace(c, arguments=safe_text(c.arguments))
        for c in response.tool_calls
    )
    return msgspec.structs.replace(response, text=safe_text(response.text), tool_calls=calls)


def _cut(
    recorder: Recorder, reservation: Reservation, estimate: Callable[[], int] | None
) -> Usage | None:
    """What a request cut off mid-stream spent: its input estimate and an estimate
    of the text received (within the request's output cap); ``None`` (the input
    estimate) when nothing was streamed."""
    streamed = recorder.streamed
    if not streamed:
        return None
    read = reservation.input or (estimate() if estimate is not None else 0)
    chars = sum(len(piece) for piece in streamed)
    # Each piece streamed is at least a token, however few characters it holds.
    output = max(-(-chars // _CHARS_PER_TOKEN), len(streamed))
    cap = reservation.max_tokens
    if cap is not None:
        output = min(output, cap)
    return Usage(input_tokens=read, output_tokens=output, requests=1)


def _reported(error: Exception) -> Usage | None:
    """The usage a failed request's error reports, if it reports one."""
    usage = getattr(error, "usage", None)
    return usage if isinstance(usage, Usage) else None
