"""``FIELDS`` describes every field of ``Budget`` once; each part that handles budgets
derives from it. These tests fail when a field is not handled by one of them: a new
field is one entry in ``FIELDS`` plus its charge site."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from fractor.actors.integrations import otel
from fractor.runtime import Budget, BudgetExceeded, Supervisor, Usage
from fractor.runtime._budget import CHARGED, COUNTED, FIELDS, LEASED, OWN, Field
from fractor.runtime._lease import Held, Lease, Tally, Want, zero
from fractor.runtime._tree import Node

BY_NAME = {field.name: field for field in FIELDS}
IN_USAGE = [field.name for field in FIELDS if field.usage]


def started(budget: Budget | None = None) -> Supervisor:
    sup = Supervisor(budget)
    sup.now = lambda: 0.0
    return sup


def test_every_budget_field_is_described_once_in_its_order() -> None:
    assert [field.name for field in FIELDS] == list(Budget.__struct_fields__)
    for field in FIELDS:
        assert all(part in BY_NAME and BY_NAME[part].usage for part in field.parts)
        assert not (field.usage and field.parts), field.name
        if field.reserved:
            assert field.charged in ("reserve", "charge"), field.name


def budget(name: str, value: float) -> Budget:
    fields: dict[str, Any] = {name: value}
    return Budget(**fields)


@pytest.mark.parametrize("field", FIELDS, ids=lambda field: field.name)
def test_budget_checks_each_field_as_its_kind_says(field: Field) -> None:
    name = field.name
    with pytest.raises(ValueError, match=rf"Budget\.{name} must be"):
        budget(name, -1)
    if field.whole:
        with pytest.raises(ValueError, match=rf"Budget\.{name} must be a whole number"):
            budget(name, 1.5)
    else:
        budget(name, 1.5)
    if field.kind == "seconds":
        with pytest.raises(ValueError, match=r"> 0"):
            budget(name, 0)
    else:
        budget(name, 0)


def test_usage_carries_every_field_marked_so_and_adds_each() -> None:
    assert set(IN_USAGE) | {"cached_tokens"} == set(Usage.__struct_fields__)
    one = Usage(**{name: i + 1 for i, name in enumerate(Usage.__struct_fields__)})
    two = one + one
    for name in Usage.__struct_fields__:
        assert getattr(two, name) == 2 * getattr(one, name), name


def test_a_node_counts_every_field_for_its_subtree_and_itself() -> None:
    node = Node("n", "n", None, None, 0.0, None, 0.0)
    for name in COUNTED:
        assert getattr(node, name) == zero(name), name
    for name in OWN:
        assert getattr(node, f"own_{name}") == zero(name), name
    assert set(CHARGED) <= set(OWN)
    assert {field.name for field in FIELDS if field.leased and not field.parts} <= set(COUNTED)
    for i, name in enumerate(Usage.__struct_fields__):
        setattr(node, name, i + 1)
        setattr(node, f"own_{name}", 10 * (i + 1))
    for i, name in enumerate(Usage.__struct_fields__):
        assert getattr(node.usage(), name) == i + 1, name
        assert getattr(node.own_usage(), name) == 10 * (i + 1), name


def test_leases_want_hold_and_tally_every_leased_field() -> None:
    assert tuple(field.name for field in FIELDS if field.leased) == LEASED
    assert set(Want.__struct_fields__) == {*LEASED, "detail", "wanted_output", "fair_output"}
    held = Held()
    lease = Lease(LEASED, None)
    limits = lease.limits()
    for name in LEASED:
        assert getattr(held, name) == zero(name), name
        assert getattr(limits, name) == zero(name), name
        assert type(getattr(limits, name)) is type(zero(name)), name
        assert getattr(Want.of(name, 3), name) == 3
        assert Tally().used(name) == 0
    usage = Usage(**{name: i + 1 for i, name in enumerate(Usage.__struct_fields__)})
    tally = Tally(usage=usage, steps=7, agents=8)
    for name in LEASED:
        field = BY_NAME[name]
        if field.parts:
            expected = sum(getattr(usage, part) for part in field.parts)
        elif field.usage:
            expected = getattr(usage, name)
        else:
            expected = getattr(tally, name)
        assert tally.used(name) == expected, name


def test_a_report_charges_every_counted_field_on_the_chain_and_the_node() -> None:
    sup = started()
    top = sup.open(sup.root, name="top", limits=None)
    remote = sup.open(top, name="remote", limits=None)
    sup.ledger.open(remote)
    usage = Usage(**{name: i + 1 for i, name in enumerate(Usage.__struct_fields__)})
    own = Usage(**dict.fromkeys(Usage.__struct_fields__, 1))
    before = {name: getattr(top, name) for name in COUNTED}
    sup.ledger.report(remote, Tally(usage=usage, own=own, steps=4, own_steps=1, agents=2))
    on_tally = {"steps": 4, "agents": 2}
    for name in COUNTED:
        added = on_tally[name] if name in on_tally else getattr(usage, name)
        assert getattr(top, name) - before[name] == added, name
        assert getattr(remote, name) == added, name
    assert remote.own_usage() == own


@pytest.mark.parametrize("name", sorted(CHARGED))
def test_charge_checks_and_counts_each_counter_it_takes(name: str) -> None:
    sup = started(Budget(**{name: 2}))
    node = sup.open(sup.root, name="n", limits=None)
    sup.charge(node, **{name: 2})
    assert getattr(node, name) == getattr(sup.root, name) == 2
    assert getattr(node, f"own_{name}") == 2
    with pytest.raises(BudgetExceeded, match=rf"^{name} limit of 2 reached"):
        sup.charge(node, **{name: 1})
    assert getattr(node, name) == 2  # zero overshoot


def test_charge_takes_no_other_field() -> None:
    sup = started(Budget(agents=5))
    node = sup.open(sup.root, name="n", limits=None)
    for name in ("agents", "tokens", "nothing"):
        with pytest.raises(TypeError, match="charge\\(\\) takes the counters"):
            sup.charge(node, **{name: 1})
    assert node.agents == 0


def test_counters_are_charged_where_the_table_says() -> None:
    charged = {field.name for field in FIELDS if field.charged == "charge"}
    assert charged == CHARGED
    for name in CHARGED:
        assert BY_NAME[name].kind == "count"


def test_opentelemetry_records_every_budget_field() -> None:
    assert set(otel._LIMITS) == set(Budget.__struct_fields__)


def test_budget_crosses_hosts_as_before() -> None:
    budget = Budget(**{field.name: 1 for field in FIELDS})
    data = msgspec.msgpack.encode(budget)
    assert msgspec.msgpack.decode(data, type=Budget) == budget
    assert list(msgspec.json.decode(msgspec.json.encode(budget))) == list(Budget.__struct_fields__)
