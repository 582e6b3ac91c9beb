"""One model request on its way down the stages (``Call``), what a stage is
(``Stage``), what the stages read of a request that failed, and what they share
when one would go again (a fallback link's patience, a deadline too near)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Protocol

from fractor.runtime import Usage

from .._agent._policy import retry_after

if TYPE_CHECKING:
    from fractor.runtime import Reservation
    from fractor.runtime.lowlevel import Lane, Pass

    from .._execution._recording import Recorder
    from .._messages import ModelRequest, ModelResponse
    from .._models._protocol import Model

__all__ = [
    "Call",
    "Next",
    "Stage",
    "cut",
    "failed_usage",
    "no_time_to_retry",
    "outwaits",
    "refused",
    "tokens",
    "unsent",
]

#: Characters per output token, for the estimate of a stream that was cut.
_CHARS_PER_TOKEN = 4

Next = Callable[["Call"], Awaitable["ModelResponse"]]
"""What a stage sends a request on to: the ``send`` of the stage below it."""


class Stage(Protocol):
    """One policy of the request path: it takes a request on its way down
    (``send``), does its part, and hands it to ``next``, the stage below it (the
    wire, at the bottom: the model itself)."""

    next: Next

    def send(self, call: Call) -> Awaitable[ModelResponse]: ...


class Call:
    """One model request of an execution on its way down the stages: what each
    stage reads (the execution's ``recorder``, the model, the request, its lane and
    input estimate) and what each leaves for the ones below it (the budget's
    reservation, the lane's pass, the request as it is sent).

    It is also how a model built on another, called inside this request (a user's
    model that calls ``ReActModel.request`` itself), has each request of its own
    after the first admitted (``admit``)."""

    __slots__ = (
        "at_least",
        "attempt",
        "estimate",
        "estimated",
        "inner",
        "lane",
        "model",
        "name",
        "outgoing",
        "patience",
        "recorder",
        "request",
        "reservation",
        "sent",
        "taken",
        "used",
    )

    def __init__(
        self,
        recorder: Recorder,
        model: Model,
        name: str,
        request: ModelRequest,
        lane: Lane,
        estimate: int,
        estimated: bool,
        patience: float | None = None,
    ) -> None:
        self.recorder = recorder
        self.model = model
        self.name = name
        self.request = request
        #: The model's rate lane (its limits, its pauses).
        self.lane = lane
        #: The input estimate, made before the request is sent when the budget or
        #: the lane needs it (``estimated``; 0 otherwise: the call itself makes it,
        #: if it is charged it, ``__call__``).
        self.estimate = estimate
        self.estimated = estimated
        #: How long the rate limit may keep it waiting: a model of a fallback chain
        #: with one after it waits no longer than the chain does, nor than the
        #: deadline leaves (None: as long as it takes, this is no such model).
        self.patience = patience
        #: Failed attempts so far (the retries' count).
        self.attempt = 0
        #: The output room a reply cut by the budget is asked again with.
        self.at_least: int | None = None
        #: The budget's reservation while the request holds one.
        self.reservation: Reservation | None = None
        #: A place in the lane taken while no budget was held (``MustWait``).
        self.taken: Pass | None = None
        #: The request as the wire sends it (its cap the reservation's).
        self.outgoing = request
        #: Whether the wire has it: a failure before that was never the model's.
        self.sent = False
        #: Requests of a model inside this one (``admit``) and what they reported.
        self.inner = 0
        self.used: Usage | None = None

    def __call__(self) -> int:
        """The input estimate, made now: what a request reserved without one is
        charged as its input when it failed or was cut (``Supervisor.settle``'s
        ``estimate``; the call itself, so that no closure is made per request)."""
        return self.model.estimate_tokens(self.request)

    async def admit(self, model: Model, request: ModelRequest) -> ModelResponse:
        """One request of a model built on another, inside this one: the first is
        this request's own; each after it is one more request, checked and
        charged at once (its output is within this request's reservation)."""
        reservation = self.reservation
        if self.inner and reservation is not None:
            recorder = self.recorder  # (waits only while leased elsewhere)
            await recorder.supervisor.charge_waiting(recorder.node, requests=1)
            reservation.requests += 1
        self.inner += 1
        response = await model.request(request)
        used = self.used
        self.used = response.usage if used is None else used + response.usage
        return response


def refused(error: BaseException) -> bool:
    """Whether the server refused the request for its rate limits (429, or 503 with a
    Retry-After): nothing was billed."""
    status = getattr(error, "status", None)
    return status == 429 or (status in (503, 529) and bool(retry_after(error)))


def unsent(error: BaseException) -> bool:
    """Whether the request never reached a server (a provider error of kind
    "unreachable": no connection was made): nothing was sent, nothing billed."""
    return getattr(error, "kind", "") == "unreachable"


def failed_usage(call: Call, error: BaseException) -> Usage | None:
    """What a request that failed with ``error`` used: None when nothing was billed
    (refused, or never sent); else what the error reported, or what the requests
    of a model inside it reported (None: its input estimate)."""
    used = call.used
    if used is None and (refused(error) or unsent(error)):
        return None
    reported = getattr(error, "usage", None)
    return reported if isinstance(reported, Usage) else used


def cut(call: Call) -> Usage | None:
    """What a request cut off (a deadline, a stop) spent: its input estimate and an
    estimate of the text streamed (within its output cap); else what a model inside
    it reported, or None (its input estimate)."""
    streamed = call.recorder.streamed
    if not streamed or call.recorder.sink is None:
        return call.used
    reservation = call.reservation
    read = reservation.input if reservation is not None else 0
    if not read:
        read = call.estimate or (0 if call.estimated else call())
    chars = sum(len(piece) for piece in streamed)
    # Each piece streamed is at least a token, however few characters it holds.
    output = max(-(-chars // _CHARS_PER_TOKEN), len(streamed))
    cap = reservation.max_tokens if reservation is not None else call.request.max_tokens
    if cap is not None:
        output = min(output, cap)
    return Usage(input_tokens=read, output_tokens=output, requests=1)


def tokens(usage: Usage | None, call: Call) -> tuple[int, int]:
    """What a request that did not answer used of a rate limit's tokens: what it
    reported, or its input as reserved."""
    if usage is not None:
        return usage.input_tokens, usage.output_tokens
    reservation = call.reservation
    return (reservation.input if reservation is not None else call.estimate), 0


def outwaits(call: Call, asked: float, left: float) -> bool:
    """Whether waiting ``asked`` seconds (what the server said) is longer than a
    model of a fallback chain waits (its patience, within the ``left`` of the
    deadline): then the next model of the chain is asked instead."""
    return call.patience is not None and asked > min(call.patience, left)


def no_time_to_retry(recorder: Recorder, delay: float, asked: float) -> None:
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
