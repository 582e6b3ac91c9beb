"""The admission of model requests as a part: it runs on a tree of nodes with only
what it is handed (how to stop, how to serve the asks of leases, a clock), and the
supervisor hands its methods on as its own, bound (no frame more per request)."""

from __future__ import annotations

import math

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from fractor.runtime import Budget, BudgetExceeded, Node, Reservation, Supervisor, Usage
from fractor.runtime._admission import Admission
from fractor.runtime.lowlevel import Want


class Tree:
    """A root with a budget and what the admission calls, recorded."""

    def __init__(self, budget: Budget) -> None:
        self.root = Node("root", "runtime", None, budget, math.inf, None, 0.0)
        self.stops: list[tuple[str, str, BudgetExceeded]] = []
        self.asks_served = 0
        self.admission = Admission(
            {},
            default_max_tokens=100,
            min_output_tokens=10,
            stop=self.stop,
            serve_asks=self.serve_asks,
            leases_changed=anyio.sleep_forever,
            now=anyio.current_time,
        )

    def stop(self, node: Node, status: str, reason: str, error: BudgetExceeded) -> None:
        node.stop_status, node.stop_reason, node.stop_error = "budget_exceeded", reason, error
        self.stops.append((node.id, status, error))

    def serve_asks(self) -> None:
        self.asks_served += 1


async def test_admission_reserves_waits_and_stops_with_what_it_is_handed() -> None:
    tree = Tree(Budget(tokens=300))
    admission, root = tree.admission, tree.root
    first = admission.reserve_nowait(root, input_estimate=50, max_tokens=None)
    assert (first.output, root.in_flight, root.reserved_input) == (100, 1, 50)
    second = admission.reserve_nowait(root, input_estimate=50, max_tokens=None)
    assert second.output == 100  # what is left: 300 - 150 held - 50 input
    got: list[Reservation] = []
    whys: list[str] = []
    async with anyio.create_task_group() as tg:

        async def third() -> None:
            reservation = await admission.reserve(
                root, input_estimate=50, max_tokens=None, on_wait=whys.append
            )
            got.append(reservation)

        tg.start_soon(third)
        await wait_all_tasks_blocked()
        assert (admission.waiting, admission.waits, got) == (1, 1, [])
        assert whys == [root.waiting]
        assert root.waiting.startswith("waiting for budget")
        charged = admission.settle(root, first, Usage(input_tokens=50, output_tokens=20))
        assert (charged.input_tokens, charged.output_tokens, charged.requests) == (50, 20, 1)
    (third_reservation,) = got
    assert third_reservation.output == 30  # 300 - 70 settled - 150 held - 50 input
    assert (admission.waiting, root.waiting, tree.stops) == (0, "", [])
    assert admission.wait_seconds >= 0
    admission.settle(root, second, Usage(input_tokens=50, output_tokens=100))
    admission.settle(root, third_reservation, Usage(input_tokens=50, output_tokens=30))
    assert tree.asks_served >= 2  # every settle lets the asks of leases try
    # 300 settled: nothing could ever come back, so the next request is refused and
    # the budget's node stopped through the stop the admission was handed.
    with pytest.raises(BudgetExceeded) as caught:
        admission.reserve_nowait(root, input_estimate=1, max_tokens=None)
    assert tree.stops == [("root", "budget_exceeded", caught.value)]
    assert caught.value.limit == "tokens"


async def test_the_supervisor_hands_the_admission_methods_on_bound() -> None:
    sup = Supervisor(Budget(tokens=1_000), default_max_tokens=64, min_output_tokens=8)
    admission = sup.admission
    for name in (
        "need",
        "would_refuse",
        "reserve_nowait",
        "reserve",
        "settle",
        "release",
        "stop_over",
    ):
        method = getattr(sup, name)
        assert method.__self__ is admission
        assert method.__func__ is getattr(Admission, name)
    assert admission.stop == sup.stop_subtree
    assert (sup.default_max_tokens, sup.min_output_tokens) == (64, 8)
    sup.start()
    reservation = sup.reserve_nowait(sup.root, input_estimate=10, max_tokens=None)
    assert reservation.output == 64
    sup.settle(sup.root, reservation, Usage(input_tokens=10, output_tokens=5))
    assert (sup.root.input_tokens, sup.root.output_tokens, sup.waits) == (10, 5, 0)


def test_output_sizes_are_whole_numbers() -> None:
    with pytest.raises(ValueError, match="default_max_tokens must be a whole number >= 1, got 0"):
        Supervisor(None, default_max_tokens=0)
    with pytest.raises(ValueError, match="min_output_tokens must be a whole number >= 1, got True"):
        Supervisor(None, min_output_tokens=True)


class _Lender:
    """A host's lender, recording what its subtree asks for."""

    def __init__(self) -> None:
        self.fresh: dict[str, float] = {}
        self.hint: dict[str, float] = {}
        self.wants: list[int] = []

    @property
    def asking(self) -> bool:
        return False  # (answered at once: the test admits again)

    def want(self, node: Node, want: Want) -> None:
        self.wants.append(want.output_tokens)


@pytest.mark.parametrize(
    ("fresh", "hint", "asks"),
    [
        (1_000, 0.0, False),  # a fresh lease: its cut is its share
        (2_100, 0.0, True),  # spent past half of what it had
        (1_000, 1_300.0, False),  # a part above is worth less than its cut / DEEP
        (1_000, 1_400.0, True),  # cut deeper than DEEP x its fair part: ask for it
        (1_000, 1_600.0, True),  # worth more: siblings gave back, ask for it
    ],
)
async def test_a_request_cut_by_what_is_left_of_a_lease_asks_when_more_is_there(
    fresh: float, hint: float, asks: bool
) -> None:
    tree = Tree(Budget(output_tokens=1_000))  # the lease, as the host sees it
    admission, root = tree.admission, tree.root
    lender = _Lender()
    lender.fresh = {"output_tokens": fresh}
    lender.hint = {"output_tokens": hint}
    root.lender = lender
    need = admission.need(input_estimate=10, max_tokens=4_000)
    got = admission.admit(root, need, 4_000, 0)
    if asks:  # it waits for the answer, then takes what the lease has then
        assert got is root
        assert lender.wants == [10]
        again = admission.admit(root, need, 4_000, 0)
        assert isinstance(again, Reservation)
        assert (again.max_tokens, lender.wants) == (1_000, [10])
    else:
        assert isinstance(got, Reservation)
        assert (got.max_tokens, lender.wants) == (1_000, [])
