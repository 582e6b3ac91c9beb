"""``Budget`` (hard limits), ``Usage`` (what was consumed) and ``Price`` (what it costs).

Every field is optional; ``None`` means unlimited. A budget on the ``Runtime`` covers
everything it runs; one on an agent (or passed to ``ask``) covers one execution of
that agent including all of its descendants.
"""

from __future__ import annotations

from typing import Any, Literal, NamedTuple

import msgspec

__all__ = [
    "CHARGED",
    "COUNTED",
    "FIELDS",
    "LEASED",
    "OWN",
    "Budget",
    "Caps",
    "Field",
    "Price",
    "Usage",
    "derived",
]

#: The largest value a limit may take: what msgspec (and a store) can encode.
_LARGEST = 2**63 - 1


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


class Field(NamedTuple):
    """One field of ``Budget``: what it limits, and how every part that handles
    budgets treats it (they read ``FIELDS``; a test fails when one does not).

    ``kind``: ``count`` and ``tokens`` are whole numbers, ``cost`` a finite number,
    ``seconds`` a duration (> 0). ``charged``: where usage of it is checked and
    charged: ``open`` (opening a node: depth, agents), ``charge`` (the atomic
    check-and-charge of ``Supervisor.charge(node, <name>=n)``), ``reserve`` (held
    before a model request, settled after it), ``deadline`` (time). ``reserved``:
    whether a model request in flight holds it. ``leased``: whether a lease of a
    subtree on another host grants it (depth and seconds travel as they are).
    ``usage``: whether ``Usage`` carries it (a node then counts it as ``<name>`` for
    its subtree and ``own_<name>`` for itself, and a remote subtree's ``Tally``
    reports it); else the node counts it beside its usage. ``parts``: the fields it
    is the sum of (``tokens``), for a field no one counts itself.

    A new counter is this entry and its field in ``Budget`` and in ``Usage``, here;
    its field in ``Want`` (what a lease asks for), which a test asks for; and its
    charge site, ``supervisor.charge(node, <name>=1)``. A refusal names the field
    as it is spelled (``"tool_calls limit of 3 reached"``); OpenTelemetry records a
    limit as ``fractor.budget.<name>``.
    """

    name: str
    kind: Literal["count", "tokens", "cost", "seconds"]
    charged: Literal["open", "charge", "reserve", "deadline"]
    reserved: bool = False
    leased: bool = True
    usage: bool = False
    parts: tuple[str, ...] = ()

    @property
    def whole(self) -> bool:
        """Whether its values are whole numbers."""
        return self.kind in ("count", "tokens")


#: Every field of ``Budget``, in its order: the one description the supervisor, the
#: ledger, the leases, the remote tally and the telemetry derive from.
FIELDS: tuple[Field, ...] = (
    Field("depth", "count", "open", leased=False),
    Field("tokens", "tokens", "reserve", reserved=True, parts=("input_tokens", "output_tokens")),
    Field("input_tokens", "tokens", "reserve", reserved=True, usage=True),
    Field("output_tokens", "tokens", "reserve", reserved=True, usage=True),
    # Counted as each request is admitted; ``charge`` counts those a model sends
    # beyond the admitted one.
    Field("requests", "count", "charge", reserved=True, usage=True),
    Field("tool_calls", "count", "charge", usage=True),
    Field("steps", "count", "charge"),
    Field("agents", "count", "open"),
    Field("seconds", "seconds", "deadline", leased=False),
    Field("cost", "cost", "reserve", reserved=True, usage=True),
)
#: The fields a lease grants; depth and seconds travel as they are.
LEASED: tuple[str, ...] = tuple(field.name for field in FIELDS if field.leased)
#: The counters ``Supervisor.charge`` takes.
CHARGED: frozenset[str] = frozenset(field.name for field in FIELDS if field.charged == "charge")


class Budget(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """Hard limits. Counts and ``cost`` are >= 0 (0: none at all); ``seconds`` is > 0.

    Each field is described in ``FIELDS`` (how it is charged, leased and shown).
    """

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
        _check(self, _WHOLE, whole=True, positive=False)
        _check(self, _POSITIVE, whole=False, positive=True)
        _check(self, _FRACTIONAL, whole=False, positive=False)

    def merge(self, other: Budget | None) -> Budget:
        """The tighter of two budgets, field by field."""
        if other is None:
            return self
        fields = {}
        for name in self.__struct_fields__:
            mine, theirs = getattr(self, name), getattr(other, name)
            fields[name] = theirs if mine is None else mine if theirs is None else min(mine, theirs)
        return Budget(**fields)


_WHOLE = tuple(field.name for field in FIELDS if field.whole)
_POSITIVE = tuple(field.name for field in FIELDS if field.kind == "seconds")
_FRACTIONAL = tuple(field.name for field in FIELDS if field.kind == "cost")


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
        added: Usage = _add(self, other)
        return added


#: What a node counts of its subtree (as ``<name>``): every field ``Usage`` carries,
#: then every other leased field but sums of others (steps, agents).
COUNTED: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            *Usage.__struct_fields__,
            *(field.name for field in FIELDS if field.leased and not field.parts),
        )
    )
)
#: What a node counts of itself alone (as ``own_<name>``): every field ``Usage``
#: carries, and every counter ``charge`` takes.
OWN: tuple[str, ...] = tuple(
    dict.fromkeys(
        (
            *Usage.__struct_fields__,
            *(field.name for field in FIELDS if field.charged == "charge"),
        )
    )
)


def derived(source: str, **names: object) -> Any:
    """The function ``source`` defines (its one ``def``), compiled once: code that
    handles each field of a table (``FIELDS``, ``COUNTED``) written out field by
    field, so that a hot path derived from the table costs what one written by hand
    does (``dataclasses`` compile a class's ``__init__`` so). ``names`` are the
    globals it uses. Field names come from the tables only, never from input."""
    namespace: dict[str, Any] = dict(names)
    exec(source, namespace)
    functions = [value for key, value in namespace.items() if key not in names and callable(value)]
    assert len(functions) == 1, source
    return functions[0]


#: ``Usage.__add__``: field by field.
_add = derived(
    "def add(one, other):\n    return Usage("
    + ", ".join(f"{name}=one.{name} + other.{name}" for name in Usage.__struct_fields__)
    + ")\n",
    Usage=Usage,
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
