"""``Budget`` (hard limits), ``Usage`` (what was consumed) and ``Price`` (what it costs).

Every field is optional; ``None`` means unlimited. A budget on the ``Runtime`` covers
everything it runs; one on an agent (or passed to ``ask``) covers one execution of
that agent including all of its descendants.
"""

from __future__ import annotations

import msgspec

__all__ = ["Budget", "Caps", "Price", "Usage"]

#: The largest value a limit may take: what msgspec (and a store) can encode.
_LARGEST = 2**63 - 1
_COUNTERS = ("depth", "tokens", "input_tokens", "output_tokens", "requests", "tool_calls")
_MORE_COUNTERS = ("steps", "agents")


def _check(owner: msgspec.Struct, names: tuple[str, ...], *, whole: bool, positive: bool) -> None:
    """Each named field is None or a finite number (whole if asked), > 0 or >= 0."""
    for name in names:
        value = getattr(owner, name)
        if value is None:
            continue
        kinds = int if whole else int | float
        if (
            isinstance(value, bool)
            or not isinstance(value, kinds)
            or not 0 <= value <= _LARGEST  # NaN and infinities fail this too
            or (positive and value == 0)
        ):
            kind = "a whole number" if whole else "a finite number"
            bound = "> 0" if positive else ">= 0"
            shown = repr(value) if len(repr(value)) <= 40 else f"{repr(value)[:37]}..."
            raise ValueError(
                f"{type(owner).__name__}.{name} must be {kind} {bound} and at most "
                f"2**63 - 1, or None for no limit; got {shown}"
            )


class Budget(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Hard limits. Counts and ``cost`` are >= 0 (0: none at all); ``seconds`` is > 0."""

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
        _check(self, _COUNTERS + _MORE_COUNTERS, whole=True, positive=False)
        _check(self, ("seconds",), whole=False, positive=True)
        _check(self, ("cost",), whole=False, positive=False)

    def merge(self, other: Budget | None) -> Budget:
        """The tighter of two budgets, field by field."""
        if other is None:
            return self
        fields = {}
        for name in self.__struct_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            fields[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return Budget(**fields)


class Caps(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Default bounds that hold even with no budget anywhere: a model that never stops
    calling subagents or tools still ends, with a stop reason naming the cap.

    ``depth``: how deep a tree of executions may grow below the runtime (a top-level
    execution is at depth 1). ``agents``: how many executions one top-level execution
    may open below it, in all. ``steps``: how many steps one execution may take
    itself (its subagents' steps are theirs). ``Runtime(caps=Caps(steps=1_000))``
    raises one, ``Caps(depth=None)`` removes one, ``Runtime(caps=None)`` all of them.
    """

    depth: int | None = 8
    agents: int | None = 10_000
    steps: int | None = 200

    def __post_init__(self) -> None:
        _check(self, ("depth", "agents", "steps"), whole=True, positive=True)


class Usage(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What an execution (or one model request) consumed."""

    input_tokens: int = 0
    output_tokens: int = 0
    cached_tokens: int = 0
    requests: int = 0
    tool_calls: int = 0
    cost: float = 0.0

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_tokens=self.cached_tokens + other.cached_tokens,
            requests=self.requests + other.requests,
            tool_calls=self.tool_calls + other.tool_calls,
            cost=self.cost + other.cost,
        )


class Price(msgspec.Struct, frozen=True, kw_only=True):
    """What one model costs, in any currency unit, per million tokens."""

    input_per_million: float
    output_per_million: float
    cached_input_per_million: float | None = None

    def __post_init__(self) -> None:
        _check(self, self.__struct_fields__, whole=False, positive=False)

    def cost(self, input_tokens: int, output_tokens: int, cached_tokens: int = 0) -> float:
        """The cost of one request; cached input tokens at their own price if given."""
        cached_price = self.cached_input_per_million
        if cached_price is None:
            cached_price = self.input_per_million
        fresh = max(input_tokens - cached_tokens, 0)
        return (
            fresh * self.input_per_million
            + min(cached_tokens, input_tokens) * cached_price
            + output_tokens * self.output_per_million
        ) / 1_000_000
