"""The stages of one model's requests, built once per agent and model (``build``):
retries above the budget, the budget above the rate lane, the wire at the bottom,
and observation just above the wire for an execution someone observes.

    [Retry ->] Budget -> Rate -> [Observe ->] Wire

The order is the policy: a retry is a new attempt, reserved and charged anew; the
budget is held only while the request has its place in the lane (``MustWait``);
what is observed is what went to the model. A stage with nothing to do is left
out as the stack is built: the retries when the policy has none, observation for
an execution nobody observes (two stacks, one chosen per request). Optional work
sent once (a summarization) has no retry stage, and takes a refusal or a reply cut
by the budget as it came.

The budget and rate stages are always there: every request is counted in the
tree's budget (a tree with no limit still counts its usage, for its parents and its
trace), and every model's lane carries the pauses its server asks for (a 429's
Retry-After), declared limits or none.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._budget import Budget
from ._call import Call
from ._observe import Observe
from ._rate import Rate
from ._retry import Retry
from ._wire import Wire

if TYPE_CHECKING:
    from collections.abc import Awaitable

    from .._agent._policy import RetryPolicy
    from .._execution._recording import Recorder
    from .._messages import ModelRequest, ModelResponse
    from .._models._protocol import Model
    from ._call import Next

__all__ = ["Chain"]


class Chain:
    """The stages of one model's requests (see the module's docstring)."""

    __slots__ = ("model", "observed", "plain")

    def __init__(self, model: Model, retry: RetryPolicy, *, once: bool = False) -> None:
        self.model = model
        wire = Wire(model).send
        #: The stack for an unobserved execution, and for an observed one.
        again = not once
        self.plain = _stack(Rate(wire, again=again).send, retry, again)
        self.observed = _stack(Rate(Observe(wire).send, again=again).send, retry, again)

    def send(
        self, recorder: Recorder, request: ModelRequest, patience: float | None = None
    ) -> Awaitable[ModelResponse]:
        """Send ``request`` for the execution whose ``recorder`` it is, down the
        stages. ``patience``: how long a model of a fallback chain with one after
        it waits for its rate limit (see ``Call.patience``).

        Not a coroutine of its own: it hands back the top stage's."""
        model = self.model
        name = model.name
        rates = recorder.supervisor.rates
        lane = rates.lanes.get(name)  # (made at the model's first request)
        if lane is None:
            lane = rates.lane(name)
        # The input estimate is the budget's pre-check (and a token rate limit's):
        # with neither it is made only if the request is charged it (failed, cut),
        # never per request (it reads the whole context).
        estimated = recorder.node.limited or lane.tokens
        estimate = model.estimate_tokens(request) if estimated else 0
        call = Call(recorder, model, name, request, lane, estimate, estimated, patience)
        return (self.observed if recorder.observed else self.plain)(call)


def _stack(rate: Next, retry: RetryPolicy, again: bool) -> Next:
    """The stages above the rate stage: the budget, and the retries if any."""
    budget = Budget(rate, again=again).send
    return Retry(budget, retry).send if again and retry.retries else budget
