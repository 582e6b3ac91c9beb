"""Budget, Price and Usage: validation of bad input, merging, arithmetic."""

from __future__ import annotations

import math
import pathlib

import pytest

from fractor.runtime import Budget, Caps, Price, Usage

README = pathlib.Path(__file__).parent.parent.parent / "README.md"

WHOLE = r"must be a whole number >= 0 and at most 2\*\*63 - 1, or None for no limit; got"
FINITE = r"must be a finite number > 0 and at most 2\*\*63 - 1, or None for no limit; got"
FINITE_OR_0 = r"must be a finite number >= 0 and at most 2\*\*63 - 1, or None for no limit; got"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"tokens": -1}, rf"Budget\.tokens {WHOLE} -1$"),
        ({"steps": 2.5}, rf"Budget\.steps {WHOLE} 2\.5$"),
        ({"depth": True}, rf"Budget\.depth {WHOLE} True$"),
        ({"seconds": 0}, rf"Budget\.seconds {FINITE} 0$"),
        ({"cost": math.inf}, rf"Budget\.cost {FINITE_OR_0} inf$"),
        ({"cost": math.nan}, rf"Budget\.cost {FINITE_OR_0} nan$"),
        ({"cost": -0.5}, rf"Budget\.cost {FINITE_OR_0} -0\.5$"),
        ({"seconds": -3.0}, rf"Budget\.seconds {FINITE} -3\.0$"),
        # Past what a store can encode: refused, not an OverflowError later.
        (
            {"tokens": 10**400},
            rf"Budget\.tokens {WHOLE} 1000000000000000000000000000000000000\.\.\.$",
        ),
        ({"seconds": 10**30}, rf"Budget\.seconds {FINITE} 10{{30}}"),
    ],
)
def test_budget_rejects_bad_limits_naming_the_field(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        Budget(**fields)  # type: ignore[arg-type]


def test_budget_accepts_zero_counts_and_fractional_seconds() -> None:
    budget = Budget(tool_calls=0, seconds=0.25, cost=1)
    assert (budget.tool_calls, budget.seconds, budget.cost) == (0, 0.25, 1)
    # No cost at all: only free models may run (a lease with nothing left is one).
    assert Budget(cost=0).cost == 0


def test_the_readme_states_the_rule_the_code_applies_at_the_door() -> None:
    """The README's row for budgets ("What is checked at the door") and the checks
    agree: counts and ``cost`` may be 0 (none at all: a cost of 0 lets only free
    models run, as a host's lease with nothing granted does), ``seconds`` may not,
    and neither may a ``Caps`` field."""
    row = next(
        line
        for line in README.read_text().splitlines()
        if line.startswith("| `Budget`, `Caps`, `Price` |")
    )
    for rule in ("counts whole >= 0", "`seconds` finite > 0", "`cost` finite >= 0"):
        assert rule in row, (rule, row)
    assert "`Caps` fields > 0" in row
    assert Budget(tokens=0, requests=0, cost=0).cost == 0
    assert Budget(cost=0.0).cost == 0.0
    with pytest.raises(ValueError, match=rf"Budget\.seconds {FINITE} 0$"):
        Budget(seconds=0)
    with pytest.raises(ValueError, match=r"Caps\.steps must be a whole number > 0"):
        Caps(steps=0)
    assert Price(input_per_million=0, output_per_million=0).cost(10, 10) == 0


def test_merge_takes_the_tighter_limit_field_by_field() -> None:
    agent = Budget(tokens=1_000, steps=10, seconds=30)
    task = Budget(tokens=500, requests=3, seconds=60)
    assert agent.merge(task) == Budget(tokens=500, steps=10, requests=3, seconds=30)
    assert agent.merge(None) is agent


@pytest.mark.parametrize(
    "fields",
    [
        {"input_per_million": -1.0, "output_per_million": 1.0},
        {"input_per_million": 1.0, "output_per_million": math.nan},
        {"input_per_million": 1.0, "output_per_million": 1.0, "cached_input_per_million": -0.1},
    ],
)
def test_price_rejects_negative_or_non_finite_prices(fields: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=r"Price\.\w+ must be a finite number >= 0"):
        Price(**fields)


def test_price_costs_cached_input_at_its_own_price() -> None:
    price = Price(input_per_million=2.0, output_per_million=8.0, cached_input_per_million=0.5)
    # 600 fresh input, 400 cached, 100 output.
    assert price.cost(1_000, 100, cached_tokens=400) == pytest.approx(
        (600 * 2.0 + 400 * 0.5 + 100 * 8.0) / 1_000_000
    )
    free = Price(input_per_million=0, output_per_million=0)
    assert free.cost(10**6, 10**6) == 0


def test_usage_adds_field_by_field() -> None:
    total = Usage(input_tokens=3, requests=1, cost=0.5) + Usage(output_tokens=4, tool_calls=2)
    assert total == Usage(input_tokens=3, output_tokens=4, requests=1, tool_calls=2, cost=0.5)
    assert total.total_tokens == 7
