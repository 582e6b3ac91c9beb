"""``Budget``: hard limits for a runtime, an agent, or one task.

Every field is optional; ``None`` means unlimited. A budget on the ``Runtime`` covers
everything it runs; one on an agent (or passed to ``ask``) covers one execution of
that agent including all of its descendants.
"""

from __future__ import annotations

import math

import msgspec

__all__ = ["Budget"]

_COUNTERS = ("depth", "tokens", "input_tokens", "output_tokens", "requests", "tool_calls")
_MORE_COUNTERS = ("steps", "agents")


class Budget(msgspec.Struct, frozen=True, kw_only=True):
    """Hard limits. Counts are whole numbers >= 0; ``seconds`` and ``cost`` are > 0."""

    depth: int | None = None
    tokens: int | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    requests: int | None = None
    tool_calls: int | None = None
    steps: int | None = None
    agents: int | None = None
    seconds: float | None = None
    cost: float | None = None

    def __post_init__(self) -> None:
        for name in _COUNTERS + _MORE_COUNTERS:
            value = getattr(self, name)
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < 0
            ):
                raise ValueError(
                    f"Budget.{name} must be a whole number >= 0 or None, got {value!r}"
                )
        for name in ("seconds", "cost"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not math.isfinite(value)
                or value <= 0
            ):
                raise ValueError(
                    f"Budget.{name} must be a finite number > 0 or None, got {value!r}"
                )

    def merge(self, other: Budget | None) -> Budget:
        """The tighter of two budgets, field by field."""
        if other is None:
            return self
        fields = {}
        for name in self.__struct_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            fields[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return Budget(**fields)
