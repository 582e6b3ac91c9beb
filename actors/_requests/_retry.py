"""The retry stage: a request that failed is sent again by the agent's
``RetryPolicy`` (exponential backoff, at least what the server asked); a retry
the deadline leaves no time for is not waited for (the execution ends
``timed_out``). In the stack only when the policy retries (``retries`` > 0): a
refusal the server said how long to wait for is the rate stage's (flow, not
failure), whatever the policy.

A failure before the request was sent (the budget refused it, a model of a
fallback chain would wait too long for its rate limit) is no attempt, nor one of a
node the supervisor has stopped: it goes up as it came.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio

from .._agent._policy import is_retryable, retry_after
from .._observation._events import Retry as RetryEvent
from ._call import Call, Next, no_time_to_retry, outwaits

if TYPE_CHECKING:
    from .._agent._policy import RetryPolicy
    from .._messages import ModelResponse

__all__ = ["Retry"]


class Retry:
    """The retry stage (see the module's docstring)."""

    __slots__ = ("next", "policy")

    def __init__(self, next: Next, policy: RetryPolicy) -> None:
        self.next = next
        self.policy = policy

    async def send(self, call: Call) -> ModelResponse:
        while True:
            try:
                return await self.next(call)
            except Exception as error:
                delay = self._delay(call, error)
                if delay is None:
                    raise
            await anyio.sleep(delay)

    def _delay(self, call: Call, error: Exception) -> float | None:
        """How long to wait before ``call`` goes again after ``error``: None when
        it does not (the error is the answer)."""
        recorder = call.recorder
        node = recorder.node
        if not call.sent or node.stop_status is not None:
            return None
        left = node.deadline - recorder.supervisor.now()
        asked = retry_after(error)
        if outwaits(call, asked, left):
            return None  # (the next model of the chain is asked)
        call.attempt += 1
        attempt = call.attempt
        if attempt > self.policy.retries or not is_retryable(error):
            return None
        delay = self.policy.delay(attempt, at_least=asked)
        if delay >= left:
            # No sleep that the deadline would cut: the execution times out now.
            no_time_to_retry(recorder, delay, asked)
            return None
        if recorder.observed:
            recorder.emit(RetryEvent(attempt=attempt, error=f"{error!r}"[:300], delay=delay))
        return delay
