"""Supervision policies of an agent (DESIGN.md section 4).

- ``RetryPolicy``: retries of a failed model request, with exponential backoff and
  jitter. Only errors that may pass are retried: connection and timeout errors, and
  any exception with a true ``retryable`` attribute (providers set it on rate
  limits and server errors). Budget refusals and programming errors never are. A
  retry waits at least what the server asked (a ``retry_after`` attribute: a
  provider's ``Retry-After``); one that the execution's deadline leaves no time
  for is not waited for (``actors._requests._retry.Retry``: the execution ends timed out).
- ``RestartPolicy``: a failed execution is run again (fresh execution buffer, same
  conversation) up to ``max_restarts`` times within ``window`` seconds; then the
  execution ends ``failed``. With ``digest=True`` each attempt reads a digest of
  the ones before it.
- Escalation (``Agent(escalate=True)``): when the agent runs as a subagent and fails,
  its parent's execution fails too, instead of reading the failure as a tool result.
"""

from __future__ import annotations

import math
import random

import msgspec

from fractor.runtime import BudgetExceeded

__all__ = ["RestartPolicy", "RetryPolicy", "is_retryable", "retry_after"]


def _check(owner: str, name: str, value: float, *, minimum: float, whole: bool = False) -> None:
    bad = (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value < minimum
        or (whole and not isinstance(value, int))
    )
    if bad:
        kind = "a whole number" if whole else "a number"
        raise ValueError(f"{owner}.{name} must be {kind} >= {minimum:g}, got {value!r}")


class RetryPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Retries of model requests: ``retries`` extra attempts, exponential backoff."""

    retries: int = 0
    initial_delay: float = 0.5
    max_delay: float = 8.0
    multiplier: float = 2.0
    #: Each delay is moved by up to this fraction, at random, so retries spread out.
    jitter: float = 0.1

    def __post_init__(self) -> None:
        _check("RetryPolicy", "retries", self.retries, minimum=0, whole=True)
        _check("RetryPolicy", "initial_delay", self.initial_delay, minimum=0)
        _check("RetryPolicy", "max_delay", self.max_delay, minimum=0)
        _check("RetryPolicy", "multiplier", self.multiplier, minimum=1)
        _check("RetryPolicy", "jitter", self.jitter, minimum=0)

    def delay(self, attempt: int, *, at_least: float = 0.0) -> float:
        """Seconds to wait before retry number ``attempt`` (1 for the first retry):
        the backoff, and never less than ``at_least``: what the server asked
        (``retry_after``), which ``max_delay`` does not cut."""
        base = min(self.max_delay, self.initial_delay * self.multiplier ** (attempt - 1))
        spread = base * self.jitter
        return max(0.0, at_least, base + random.uniform(-spread, spread))


class RestartPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """Restarts of a failed execution: at most ``max_restarts`` within ``window`` s.

    ``digest=True``: each restart learns from the attempts before it: their digest
    opens its execution buffer and the tool calls that completed there are not run
    again (see ``actors._memory._digest``). Off, a restart starts blind.
    """

    max_restarts: int = 0
    window: float = 60.0
    digest: bool = False

    def __post_init__(self) -> None:
        _check("RestartPolicy", "max_restarts", self.max_restarts, minimum=0, whole=True)
        _check("RestartPolicy", "window", self.window, minimum=0)
        if not isinstance(self.digest, bool):
            raise TypeError(f"RestartPolicy.digest must be a bool, got {self.digest!r}")


def retry_after(error: BaseException) -> float:
    """The seconds the server asked to wait before the request is sent again (a
    provider error's ``retry_after``, from ``Retry-After``); 0.0 when it asked none."""
    asked = getattr(error, "retry_after", None)
    if isinstance(asked, int | float) and not isinstance(asked, bool) and asked > 0:
        return float(asked) if math.isfinite(asked) else 0.0
    return 0.0


def is_retryable(error: BaseException) -> bool:
    """Whether a failed model request may succeed if sent again."""
    if isinstance(error, BudgetExceeded):
        return False
    flag = getattr(error, "retryable", None)
    if flag is not None:
        return bool(flag)
    return isinstance(error, ConnectionError | TimeoutError)
