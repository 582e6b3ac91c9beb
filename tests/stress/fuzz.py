"""A fault-injection fuzz: random agent trees full of faults, then DESIGN.md section 5.

``python -m tests.stress.fuzz --trees 2000 [--seed N] [--backend asyncio|trio|both]
[--hosts plan|always|never]`` runs that many trees (seeds ``N``, ``N + 1``, ...),
prints progress every 100 and a summary, and exits non-zero on any violation.
``tests/stress/test_fuzz.py`` runs a bounded number of them in the suite.

Each tree is drawn from one ``random.Random(seed)``: one or two top-level agents,
each the root of up to twelve more, three levels below it at most and up to five
subagents per agent. Every agent's model is a ``FunctionModel`` whose answer to a
request is drawn from the seed, the agent, the task, the step and the attempt (so
concurrent agents never take each other's turns): a final answer; one to four tool
calls, run in parallel; one to three subagent calls; a model error (retryable or
not, with reported usage, with a lone surrogate, a hang past the deadline); or
garbage (unknown tools, malformed or wrong arguments, repeated and missing call ids,
negative or impossible usage, output past ``max_tokens``, empty replies, lone
surrogates). Tools raise, time out (20 or 30 ms), retry, block a worker thread,
hang until a deadline, return unprintable or oversized results. Budgets on random
agents, asks and the runtime limit tokens, requests, tool calls, steps, agents,
depth, cost and seconds; smaller default caps sometimes. From outside, rounds of
concurrent asks: plain, under a cancel scope that expires, with an ask timeout, as a
``tell``; conversation snapshots taken meanwhile; a running execution cancelled
through the supervisor; a whole actor cancelled (and, when persistent in a
``MemoryStore`` or ``SQLiteStore``, respawned from the store). Then a probe ask on
every agent. Latencies are 0 to 10 ms: a tree takes a fraction of a second.

One tree in three (``--hosts always``: every tree; ``never``: none) runs across two
hosts in this process (``LocalHosts(2)``): the children of its top-level executions
run there, each subtree under a lease of the budgets above it; in half of those, one
host is killed mid-run, as a crash would. Every invariant below is checked of the
whole tree across hosts (see ``fuzz_tree`` for what a host changes).

Memory runs under the same faults (``fuzz_memory``): half the top-level agents
compact their conversations (small thresholds, ``keep`` 0 to 3; summarized by
their own model or by a summarizer of their own that fails, stalls or answers no
text), some restart policies read a digest of the attempts before, some asks
resume the last execution; a new attempt's model asks again for calls its digest
shows, so that completed ones are reused.

The modules: ``fuzz_plan`` (what a seed decides), ``fuzz_faults`` (the tools and
the models), ``fuzz_tree`` (one tree run), ``fuzz_tops`` (its top-level agents),
``fuzz_final`` (what is checked after its runtime), ``fuzz_checks`` and
``fuzz_memory`` (the checks). The invariants are checked throughout:

1. isolation: in every request every model received and in every top-level
   conversation, another agent's text appears only as the result of the tool call
   that delegated to it;
2. between executions the buffer is empty and the conversation is exactly one task
   and one final answer per execution (refused turns stay out), matching the traces
   and the ``Result``s, less a folded prefix of whole pairs that the summary section
   (one message, or none if nothing was folded) covers, as the summarizations in
   the traces say; a request holds the instructions, the summary, pairs, the task
   and its buffer, a digest first in it at most; a summarization request, the
   instructions and one user message; a reused call completed in an earlier
   attempt and is not charged; the stored state (summary included) equals the live
   conversation; a store holds the trace of every execution of the tree as it
   ended, under its parent;
3. in every request, every tool result follows its call with its id, no call lacks
   one, ids are unique;
4. usage sums and limits on every node of tree snapshots taken at every model
   request, at every ``execution_end`` event and at the end (and of each host's own
   tree, and, here, settled usage plus what leases hold within every limit); every
   ``Result``'s usage is its node's, within the budgets that were set, and its node
   carries them; every event puts its execution where the tree does;
5. every ask got exactly one reply (a ``Result``, or ``AskTimeout`` / the caller's
   cancellation / ``ActorStopped`` where those apply); nothing runs, waits or is
   pending once the asks are answered, on any host; no task outlives the ``Runtime``;
   no lease outlives its subtree, and only a lost host's leases still hold anything;
   a lost host's subtrees answer ``failed``, saying so; the probe after
   cancellations works; a tree that hangs is reported as a deadlock;
6. requests, conversations, traces, results, tasks, events, snapshots, statistics
   and stored states and traces round-trip through msgspec JSON and MessagePack.

Violations are collected as strings, never asserted, and reported with the seed.
``--skip KIND`` leaves out one model or garbage fault, to look past a known
violation; ``--log`` shows the runtime's warnings. A tree that does not end even
when cancelled kills the process after twice its timeout, naming its seed.
"""

from __future__ import annotations

import argparse
import faulthandler
import logging
import os
import re
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

import anyio
import structlog

from .fuzz_faults import faults
from .fuzz_plan import FAULT_KINDS, HostsMode, make_plan
from .fuzz_tree import TreeReport, TreeRun

__all__ = ["FAULT_KINDS", "Summary", "TreeReport", "main", "render", "run_tree", "run_trees"]

#: Seconds one tree may take before it counts as a deadlock.
TREE_TIMEOUT = 30.0


async def run_tree(
    seed: int,
    *,
    timeout: float = TREE_TIMEOUT,
    skip: frozenset[str] = frozenset(),
    hosts: HostsMode = "plan",
) -> TreeReport:
    """Run tree ``seed`` on the running backend and report what it broke; ``skip``
    names model and garbage faults not to inject; ``hosts`` which trees run across
    hosts (as the plan draws, all, none)."""
    plan = make_plan(seed, hosts)
    run = TreeRun(plan, anyio_backend_name(), skip)
    token = faults.set(run.faults)
    began = time.perf_counter()
    try:
        with anyio.fail_after(timeout) as scope:
            await run.run()
    except TimeoutError:
        if not scope.cancel_called:
            raise
        run.violations.append(f"5: deadlock: the tree did not finish within {timeout:g} s")
    except Exception as exc:
        lines = traceback.format_exception(exc)
        run.violations.append(
            f"crash: {type(exc).__name__}: {exc!r:.300}\n{''.join(lines)[-3000:]}"
        )
    finally:
        faults.reset(token)
    run.report.seconds = time.perf_counter() - began
    return run.report


def anyio_backend_name() -> str:
    """The running backend's name, asked of its cancellation exception."""
    module = anyio.get_cancelled_exc_class().__module__
    return "trio" if module.startswith("trio") else "asyncio"


# -- many trees ------------------------------------------------------------------------------


@dataclass
class Summary:
    backend: str
    trees: int = 0
    executions: int = 0
    asks: int = 0
    snapshots: int = 0
    seconds: float = 0.0
    statuses: Counter[str] = field(default_factory=Counter)
    faults: Counter[str] = field(default_factory=Counter)
    limits: Counter[str] = field(default_factory=Counter)
    #: (seed, violation)
    violations: list[tuple[int, str]] = field(default_factory=list)
    slowest: tuple[float, int] = (0.0, -1)

    def add(self, report: TreeReport) -> None:
        self.trees += 1
        self.executions += report.executions
        self.asks += report.asks
        self.snapshots += report.snapshots
        self.statuses.update(report.statuses)
        self.faults.update(report.faults)
        self.limits.update(report.limits)
        self.violations.extend((report.seed, v) for v in dict.fromkeys(report.violations))
        self.slowest = max(self.slowest, (report.seconds, report.seed))


async def run_trees(
    seeds: Sequence[int],
    *,
    timeout: float = TREE_TIMEOUT,
    progress: int = 0,
    watchdog: bool = False,
    skip: frozenset[str] = frozenset(),
    hosts: HostsMode = "plan",
) -> Summary:
    """Run every tree of ``seeds`` in turn on the running backend."""
    summary = Summary(backend=anyio_backend_name())
    began = time.perf_counter()
    for seed in seeds:
        timer = _watchdog(seed, summary.backend, 2 * timeout + 10) if watchdog else None
        try:
            report = await run_tree(seed, timeout=timeout, skip=skip, hosts=hosts)
        finally:
            if timer is not None:
                timer.cancel()
        summary.add(report)
        if progress and summary.trees % progress == 0:
            print(
                f"[{summary.backend}] {summary.trees}/{len(seeds)} trees, "
                f"{summary.executions} executions, {len(summary.violations)} violations, "
                f"{time.perf_counter() - began:.1f} s",
                flush=True,
            )
    summary.seconds = time.perf_counter() - began
    return summary


def _watchdog(seed: int, backend: str, seconds: float) -> threading.Timer:
    """Kill the process if a tree hangs beyond cancellation, naming its seed."""

    def fire() -> None:
        print(f"HANG: tree {seed} on {backend} did not end, even cancelled", flush=True)
        faulthandler.dump_traceback(all_threads=True)
        os._exit(3)

    timer = threading.Timer(seconds, fire)
    timer.daemon = True
    timer.start()
    return timer


#: What varies between two violations of one kind: agent names, node ids, numbers.
_VARYING = re.compile(r"\bt\d+(?:s\d+)*(?:_keeper|-\d+)?(?:#\d+\.[0-9a-f]+)?\b|\d+(?:\.\d+)?")


def kind_of(violation: str) -> str:
    """What tells distinct violations apart: the first line, without the values it
    shows (a repr, from the first parenthesis on) and with agent names, node ids and
    numbers as ``#``."""
    invariant, _, rest = violation.splitlines()[0].partition(": ")
    return f"{invariant}: {_VARYING.sub('#', rest.split('(', 1)[0]).strip()}"[:160]


def render(summary: Summary) -> str:
    """The summary: counts, what was hit, and each distinct violation with its seeds."""
    lines = [
        f"backend {summary.backend}: {summary.trees} trees in {summary.seconds:.1f} s "
        f"(slowest {summary.slowest[0]:.2f} s, seed {summary.slowest[1]}), "
        f"{summary.executions} executions, {summary.asks} asks, "
        f"{summary.snapshots} tree snapshots checked",
        "  statuses: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.statuses.items())),
        "  limits tripped: " + ", ".join(f"{k} {v}" for k, v in sorted(summary.limits.items())),
        "  faults hit: " + ", ".join(f"{k} {summary.faults[k]}" for k in FAULT_KINDS),
        f"  hosts: {summary.faults['hosts']} trees across hosts, "
        f"{summary.faults['remote_subtree']} subtrees placed on hosts, "
        f"{summary.faults['host_kill']} hosts killed, {summary.faults['host_lost']} subtrees "
        f"lost, {summary.faults['placed_again']} placed again, "
        f"{summary.faults['lost_running']} nodes left running as a lost host last sent them",
    ]
    missed = [kind for kind in FAULT_KINDS if not summary.faults[kind]]
    if missed:
        lines.append(f"  faults never hit: {', '.join(missed)}")
    distinct: dict[str, list[tuple[int, str]]] = {}
    for seed, violation in summary.violations:
        distinct.setdefault(kind_of(violation), []).append((seed, violation))
    trees = len({seed for seed, _ in summary.violations})
    lines.append(
        f"  violations: {len(summary.violations)} in {trees} trees, {len(distinct)} distinct"
    )
    for kind, found in distinct.items():
        seeds = sorted({seed for seed, _ in found})
        shown = ", ".join(map(str, seeds[:8])) + (", ..." if len(seeds) > 8 else "")
        lines.append(f"  - {kind}  [{len(found)}x in {len(seeds)} trees, seeds {shown}]")
        lines.append(f"      first: {found[0][1][:400]}")
    # A lone surrogate in a violation's text must not stop the report from printing.
    return "\n".join(lines).encode("utf-8", "backslashreplace").decode()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stress.fuzz", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--trees", type=int, default=2_000)
    parser.add_argument("--seed", type=int, default=0, help="the first seed")
    parser.add_argument("--backend", choices=["asyncio", "trio", "both"], default="both")
    parser.add_argument("--timeout", type=float, default=TREE_TIMEOUT, help="seconds per tree")
    parser.add_argument(
        "--skip",
        action="append",
        default=[],
        choices=[k for k in FAULT_KINDS if k.startswith(("model_", "garbage_"))],
        help="a model or garbage fault not to inject (to look past a known violation)",
    )
    parser.add_argument(
        "--hosts",
        choices=["plan", "always", "never"],
        default="plan",
        help="which trees run across hosts: one in three as drawn (plan), all, none",
    )
    parser.add_argument(
        "--log", action="store_true", help="show the runtime's warnings (hidden by default)"
    )
    args = parser.parse_args(argv)
    if not args.log:
        structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.ERROR))
    seeds = range(args.seed, args.seed + args.trees)
    backends = ["asyncio", "trio"] if args.backend == "both" else [args.backend]
    failed = False
    for backend in backends:
        summary = anyio.run(
            lambda: run_trees(
                seeds,
                timeout=args.timeout,
                progress=100,
                watchdog=True,
                skip=frozenset(args.skip),
                hosts=args.hosts,
            ),
            backend=backend,
        )
        print(render(summary), flush=True)
        failed = failed or bool(summary.violations)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
