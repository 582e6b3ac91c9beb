"""What a fuzz tree checks once its runtime's block is left (``check_after``).

The final tree (invariant 4, its events, its round trip), the statistics and the
tasks left (5), every ``Result`` against the tree (4, 5), every request every model
received (1, 2, 3, 6: the step requests, and the summarization requests of agents
that compact), the stored traces (2, 6), the digests and reused calls of every trace
known (the top-level ones seen, the stored ones: ``fuzz_memory.check_reuse``), and
across hosts, placement, lost subtrees and leases (``_check_hosts``).
"""

from __future__ import annotations

import contextlib
import re
from collections import Counter
from collections.abc import Collection, Iterable
from typing import TYPE_CHECKING

import anyio
import msgspec

from fractor.actors import AssistantMessage, ExecutionTrace, ModelRequest, ToolResultMessage
from fractor.actors._memory._summarizer import DEFAULT_SUMMARY_INSTRUCTIONS as INSTRUCTIONS
from fractor.runtime import Node, Runtime, RuntimeStatistics, TreeSnapshot

from .fuzz_checks import (
    check_events,
    check_held,
    check_leases_returned,
    check_request,
    check_result,
    check_tree,
    marker,
    remote_tops,
    round_trip,
)
from .fuzz_faults import _hit as hit
from .fuzz_memory import (
    check_reuse,
    check_reuse_charges,
    check_summary_request,
)

if TYPE_CHECKING:
    from .fuzz_tree import TreeRun

__all__ = ["SECONDS_SLACK", "check_after", "check_stored_traces", "decode_struct"]

#: How late a node may end after its deadline (a loaded machine is slow to cancel).
SECONDS_SLACK = 2.0
#: How a budget's refusal names its limit.
_LIMIT = re.compile(r"^(\w+) limit of")
#: How a subtree of a lost host says so (naming its host).
_LOST = re.compile(r"host '([^']*)' lost")


async def check_after(run: TreeRun, rt: Runtime, before: set[int]) -> None:
    """Everything checked once the runtime's block is left (see the module)."""
    tree = rt.tree()
    where = "the final tree"
    # The subtrees of a lost host stay as it last sent them: their tops may be
    # ahead of their children. One placed again adds up like any other (its top
    # keeps, as its own, what the lost run reported).
    lost = {node.id for node in remote_tops(tree) if node.host == run.killed}
    below_lost = _below(tree, lost)
    run.violate(
        check_tree(
            tree,
            caps=run.plan.caps,
            seconds_slack=SECONDS_SLACK,
            where=where,
            lagging=lost,
        )
    )
    run.violate(check_events(tree, run.events, moved=run.doomed.keys()))
    if run.hosts is not None:
        _check_hosts(run, tree, rt.supervisor.root)
    run.violate(round_trip(tree, TreeSnapshot, "the final tree"))
    statistics = rt.statistics()
    run.violate(round_trip(statistics, RuntimeStatistics, "the statistics"))
    if statistics.live_actors or statistics.pending_asks or statistics.budget_waiting:
        run.violate([f"5: after the runtime: {statistics!r}"])
    leaked = [t.name for t in anyio.get_running_tasks() if t.id not in before]
    if leaked:
        run.violate([f"5: tasks outlive the runtime: {leaked}"])
    root = tree.node("root")
    if root.limits != run.plan.runtime_budget:
        run.violate([f"4: the root's limits are {root.limits}"])
    for node in tree.nodes:
        if node.id == "root":
            continue
        run.report.executions += 1
        run.report.statuses[node.status] += 1
        if node.status == "running" and node.id in below_lost:
            hit("lost_running")  # as its lost host last sent it
        elif node.status == "running":
            run.violate([f"5: {node.id} still runs after the runtime"])
        elif node.status != "completed":
            hit(node.status)
        tripped = _LIMIT.match(node.stop_reason) if node.status == "budget_exceeded" else None
        if tripped is not None:
            run.report.limits[tripped.group(1)] += 1
        if node.parent_id != "root" and node.limits != run.specs[node.name].budget:
            run.violate([f"4: {node.id} has limits {node.limits}"])
    budgets = {spec.name: spec.budget for spec in run.plan.tops}
    for spec, budget, result in run.results:
        own = budgets[spec.name]
        expected = own.merge(budget) if own is not None else budget
        run.violate(
            check_result(
                result,
                tree,
                expected=expected,
                budgets=(expected, run.plan.runtime_budget),
                where=f"a Result of {spec.name}",
            )
        )
    _check_requests(run)
    traces = dict(run.seen)
    if run.store is not None:
        stored = []
        for record in await run.store.records(kind="trace", limit=None):
            run.violate(decode_struct(record.data, ExecutionTrace, "a stored trace"))
            with contextlib.suppress(msgspec.DecodeError):  # reported just above
                stored.append(msgspec.json.decode(record.data, type=ExecutionTrace))
        # A lost subtree's traces were on its host: they are lost with it.
        run.violate(check_stored_traces(tree, stored, lost=lost | below_lost))
        traces.update((trace.execution_id, trace) for trace in stored)
    digests = {name: spec.digest for name, spec in run.specs.items()}
    run.violate(check_reuse(traces, digests))
    lagging = {node.id for node in remote_tops(tree)} | below_lost
    run.violate(check_reuse_charges(tree, traces, skip=lagging))
    count_memory(traces.values(), run.faults)


def _check_requests(run: TreeRun) -> None:
    """1, 2, 3 and 6 on every request every model received: steps, and the
    summarization requests of an agent that compacts (its own model's, or its
    summarizer's)."""
    for name, model in run.models.items():
        spec = run.specs[name]
        children = frozenset(child.name for child in spec.children)
        memory = spec.memory
        for request in model.requests:
            if request.purpose == "summary" and memory is not None and not memory.separate:
                found = check_summary_request(name, request, instructions=INSTRUCTIONS)
            else:
                found = check_request(
                    name,
                    request,
                    system=f"You are {marker(name)}.",
                    allowed=run.ancestors[name],
                    children=children,
                    fresh=spec.depth > 0,
                    summary=memory is not None,
                )
                clear = memory.clear if memory is not None else None
                found += check_cleared(name, request, clear)
                run.faults["results_cleared"] += _cleared(request)
            run.violate(found)
            run.violate(round_trip(request, ModelRequest, f"a request of {name}"))
    for name, summarizer in run.summarizers.items():
        for request in summarizer.requests:
            run.violate(check_summary_request(name, request, instructions=INSTRUCTIONS))
            run.violate(round_trip(request, ModelRequest, f"a summarization request of {name}"))


def _check_hosts(run: TreeRun, tree: TreeSnapshot, root: Node) -> None:
    """After the runtime, across hosts: placement, lost subtrees, and leases."""
    assert run.hosts is not None
    names = {link.name for link in run.hosts.links}
    by_id = {node.id: node for node in tree.nodes}
    for node in tree.nodes:
        parent = by_id.get(node.parent_id or "")
        if parent is None:
            continue
        if parent.id == "root":  # a top-level execution runs here
            wrong = node.host != ""
        elif parent.parent_id == "root":  # its children are placed on the hosts
            wrong = node.host not in names
        else:  # a placed subtree stays whole on its host
            wrong = node.host != parent.host
        if wrong:
            run.violate([f"5: {node.id} runs on {node.host!r}, its parent on {parent.host!r}"])
    tops = remote_tops(tree)
    run.faults["remote_subtree"] += len(tops)
    for node in tops:
        said = _LOST.search(node.stop_reason)
        if said is not None and said.group(1) != run.killed:
            run.violate([f"5: {node.id} answered {node.stop_reason!r:.200}, no host was lost"])
    for node_id, child in run.doomed.items():
        doomed = by_id.get(node_id)
        if doomed is None:
            run.violate([f"5: {node_id}, on the killed host, is not in the final tree"])
            continue
        if doomed.host != run.killed:
            hit("placed_again")
            if not run.specs[doomed.name].restarts:
                run.violate([f"5: {node_id} was placed again, its agent restarts none"])
        elif doomed.status == "failed" and f"host {run.killed!r} lost" in doomed.stop_reason:
            hit("host_lost")
        elif child.done is None:
            run.violate(
                [
                    f"5: {node_id} ran on the killed host {run.killed!r} and answered "
                    f"{doomed.status} ({doomed.stop_reason!r:.200})"
                ]
            )
    run.violate(check_held([root], "the root after the runtime"))
    run.violate(check_leases_returned(root, lost=bool(run.killed)))


def _below(tree: TreeSnapshot, tops: set[str]) -> set[str]:
    """The ids of the nodes below ``tops``."""
    parents = {node.id: node.parent_id for node in tree.nodes}
    found = set()
    for node in tree.nodes:
        above = node.parent_id
        while above is not None and above not in tops:
            above = parents.get(above)
        if above is not None:
            found.add(node.id)
    return found


def check_stored_traces(
    tree: TreeSnapshot, traces: Iterable[ExecutionTrace], *, lost: Collection[str] = ()
) -> list[str]:
    """2: a store holds the trace of every execution of the tree, remote ones
    included, as the execution ended (status, reason) and under its parent (or
    under the stored earlier attempt of its parent's task that delegated it); but
    for the executions in ``lost`` (of a host that was lost: their traces were
    there)."""
    found = []
    by_id = {trace.execution_id: trace for trace in traces}
    for node in tree.nodes:
        if node.parent_id is None or node.id in lost:
            continue
        trace = by_id.get(node.id)
        where = f"the stored trace of {node.id}" + (f" (host {node.host!r})" if node.host else "")
        if trace is None:
            found.append(f"2: {where} is missing ({node.status}: {node.stop_reason!r:.120})")
            continue
        parent = "" if node.parent_id == "root" else node.parent_id
        attempt = by_id.get(trace.parent_id)
        under = parent if attempt is not None and attempt.attempt_of == parent else trace.parent_id
        if (trace.status, trace.stop_reason, under) != (
            node.status,
            node.stop_reason,
            parent,
        ):
            found.append(
                f"2: {where} says {trace.status} ({trace.stop_reason!r:.120}) under "
                f"{trace.parent_id!r}; its node {node.status} ({node.stop_reason!r:.120})"
                f" under {parent!r}"
            )
    return found


def decode_struct(data: bytes, kind: type[msgspec.Struct], what: str) -> list[str]:
    """6: stored bytes decode as ``kind`` and round-trip."""
    try:
        value = msgspec.json.decode(data, type=kind)
    except Exception as exc:
        return [f"6: {what} does not decode as {kind.__name__}: {exc!r:.300}"]
    return round_trip(value, kind, what)


#: How a tool result cleared from a step request begins (``Compaction.clear_results``).
CLEARED = "[cleared: "


def _cleared(request: ModelRequest) -> int:
    return sum(
        isinstance(m, ToolResultMessage) and m.content.startswith(CLEARED) for m in request.messages
    )


def check_cleared(name: str, request: ModelRequest, keep: int | None) -> list[str]:
    """3 (in its cleared form): with ``clear_results=keep``, the results of every tool
    step of the execution but the last ``keep`` are notes (or no longer than one),
    the last ``keep`` steps' are whole; without it, none is a note."""
    where = f"a request of {name}"
    steps = [
        (i, len(m.tool_calls))
        for i, m in enumerate(request.messages)
        if isinstance(m, AssistantMessage) and m.tool_calls
    ]
    found: list[str] = []
    for number, (start, calls) in enumerate(steps):
        old = keep is not None and number < len(steps) - keep
        for result in request.messages[start + 1 : start + 1 + calls]:
            if not isinstance(result, ToolResultMessage):
                continue  # invariant 3 is check_request's
            note = result.content.startswith(CLEARED)
            if note != old and (note or len(result.content) > 80):
                state = "cleared" if note else "whole"
                found.append(f"3: {where} shows step {number + 1}'s result {state}")
    return found


def count_memory(traces: Iterable[ExecutionTrace], faults: Counter[str]) -> None:
    """Count what the memory features did, as the traces say."""
    for trace in traces:
        record = trace.summarization
        if record is not None:
            faults["compaction_ok" if record.ok else "compaction_failed"] += 1
            if "no text" in record.error:
                faults["compaction_empty"] += 1
            elif "cut off" in record.error:
                faults["compaction_cut_off"] += 1
        if trace.resumed:
            faults["resume"] += 1
        if trace.attempt > 1 and trace.digest:
            faults["restart_digest"] += 1
        faults["reused_call"] += sum(o.reused for step in trace.steps for o in step.outcomes)
