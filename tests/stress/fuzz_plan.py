"""The plan of one fuzz tree: everything its seed decides before it runs.

``make_plan(seed)`` draws, from one ``random.Random(seed)``: one or two top-level
agents (``Spec``), each the root of up to twelve more, three levels deep at most and
up to five subagents per agent, each with its tools, budget, output cap, retry and
restart policies, escalation, tool concurrency, stop condition and number of steps;
the runtime's budget, caps, token settings and store; and the rounds of things done
from outside (``Op``). Whether the tree runs across hosts (``Plan.hosts``: its
top-level executions' children placed on ``LocalHosts``) and whether, and when, one
of them is killed (``Kill``) is drawn from a generator of its own, seeded apart, so
that every other draw of a seed is the same with hosts or without. What each model
answers is drawn later, per request, from the seed too (``tests.stress.fuzz_faults``).
``FAULT_KINDS`` names every fault the fuzz counts; each tree favours one of the
faults a model draws (``Plan.focus``) so that a few dozen trees hit them all.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from dataclasses import replace as replace_spec
from typing import Any, Literal

from msgspec.structs import replace

from fractor.runtime import Budget, Caps

__all__ = [
    "ASKS",
    "DRAWN",
    "FAULT_KINDS",
    "GARBAGE",
    "HOSTS",
    "HOST_KINDS",
    "TOOL_POOL",
    "HostsMode",
    "Kill",
    "Memory",
    "Op",
    "OpKind",
    "Plan",
    "Spec",
    "make_plan",
]

#: Every fault the fuzz injects; the suite checks each was hit.
FAULT_KINDS = (
    "tool_raises",
    "tool_retry",
    "tool_timeout",
    "tool_timeout_retry",
    "tool_stall",
    "sync_tool",
    "sync_tool_timeout",
    "tool_surrogate",
    "tool_unprintable",
    "tool_big",
    "model_retryable",
    "model_fatal",
    "model_plain",
    "model_connection",
    "model_usage",
    "model_surrogate",
    "model_stall",
    "garbage_unknown_tool",
    "garbage_bad_json",
    "garbage_bad_args",
    "garbage_empty_args",
    "garbage_dup_ids",
    "garbage_reused_id",
    "garbage_missing_ids",
    "garbage_negative_usage",
    "garbage_huge_usage",
    "garbage_over_max_tokens",
    "garbage_empty_reply",
    "garbage_finish_reason",
    "garbage_surrogate_text",
    "garbage_surrogate_args",
    "garbage_bad_subagent_args",
    "ask_cancel_scope",
    "ask_timeout",
    "ask_surrogate",
    "tell",
    "concurrent_asks",
    "look",
    "node_cancel",
    "actor_cancel",
    "respawn",
    "store_memory",
    "store_sqlite",
    "events",
    "budget_exceeded",
    "timed_out",
    "cancelled",
    "failed",
    "refused_turn",
    "hosts",
    "remote_subtree",
    "host_kill",
    "host_lost",
    "placed_again",
    "compaction_ok",
    "compaction_failed",
    "compaction_empty",
    "compaction_cut_off",
    "resume",
    "restart_digest",
    "reused_call",
    "results_cleared",
)
GARBAGE = tuple(kind.removeprefix("garbage_") for kind in FAULT_KINDS if "garbage_" in kind)
#: What only a tree across hosts hits: a subtree placed on a host, a kill, a subtree
#: lost with its host, and one placed again on the other host.
HOST_KINDS = ("hosts", "remote_subtree", "host_kill", "host_lost", "placed_again")
#: The faults a model draws per request; each tree favours one of them (``Plan.focus``).
DRAWN = tuple(kind for kind in FAULT_KINDS if kind.startswith(("model_", "garbage_")))

#: What an agent's toolbox is drawn from, besides ``work`` (most agents have it) and
#: ``stall`` (a tool that hangs: only where a deadline applies).
TOOL_POOL = (
    "broken",
    "broken_twice",
    "slow",
    "slow_retry",
    "blocking",
    "blocking_slow",
    "odd_text",
    "unprintable",
    "big",
)


@dataclass(frozen=True)
class Memory:
    """A top-level agent's ``Compaction``: small thresholds, so that it folds often."""

    threshold: int
    keep: int
    #: Its summarizer: the agent's own model, or one of its own (which may fail,
    #: stall where a deadline applies, or answer no text).
    separate: bool
    #: Tool results of all but this many last steps cleared within an execution.
    clear: int | None = None


@dataclass(frozen=True)
class Spec:
    """One agent of the tree and how its model behaves."""

    name: str
    depth: int
    children: tuple[Spec, ...]
    tools: tuple[str, ...]
    budget: Budget | None
    max_tokens: int | None
    retries: int
    restarts: int
    escalate: bool
    tool_concurrency: int
    stop_after: int | None
    max_steps: int
    #: A deadline surely applies to its executions (its own, an ancestor's, the runtime's).
    deadline: bool
    #: Compaction of its conversation (top-level agents only).
    memory: Memory | None = None
    #: Its restarts read a digest of the attempts before (``RestartPolicy.digest``).
    digest: bool = False

    def walk(self) -> list[Spec]:
        found = [self]
        for child in self.children:
            found.extend(child.walk())
        return found


OpKind = Literal["ask", "scope", "timeout", "tell", "look", "cancel_node", "cancel_actor"]
ASKS = ("ask", "scope", "timeout")


@dataclass(frozen=True)
class Op:
    """One thing done from outside in a round: an ask, a look, a cancellation."""

    kind: OpKind
    top: int
    delay: float = 0.0
    budget: Budget | None = None
    surrogate: bool = False
    #: Which running node a ``cancel_node`` picks, as a fraction of the running ones.
    pick: float = 0.0
    #: An ask that resumes the agent's last execution if it stopped before its answer.
    resume: bool = False


#: How many hosts a tree that runs across hosts has (``LocalHosts(HOSTS)``).
HOSTS = 2
#: Which trees run across hosts: as each seed's plan draws (one in three), all, none.
HostsMode = Literal["plan", "always", "never"]


@dataclass(frozen=True)
class Kill:
    """One host killed mid-run, as a crash would (``LocalHosts.kill``)."""

    #: Its index in the default pool (``default-<host>``).
    host: int
    #: The kill waits until this many subtrees were placed on that host (0: it does
    #: not wait; no kill if that never happens).
    placed: int
    #: Seconds after that (or after the runtime started).
    delay: float


@dataclass(frozen=True)
class Plan:
    seed: int
    tops: tuple[Spec, ...]
    runtime_budget: Budget | None
    caps: Caps | None
    min_output: int
    default_max_tokens: int
    store: Literal["none", "memory", "sqlite"]
    #: Whether the first top-level agent keeps its state in the store (an id of its own).
    persistent: bool
    observe: bool
    rounds: tuple[tuple[Op, ...], ...]
    #: The model or garbage fault this tree draws more often than the others, so that
    #: a few dozen trees hit every one of them.
    focus: str
    #: Hosts the children of top-level executions are placed on (0: none, all here).
    hosts: int = 0
    #: The host killed mid-run, if one is.
    kill: Kill | None = None


def _budget(rng: random.Random, *, top: bool = False) -> Budget:
    """One to three random limits, sized so that they sometimes trip."""
    names = ["tokens", "input_tokens", "output_tokens", "requests", "tool_calls", "steps"]
    names += ["agents", "depth", "cost", "seconds"]
    whole = {
        "tokens": (300, 6_000),
        "input_tokens": (200, 5_000),
        "output_tokens": (10, 600),
        "requests": (0, 10),
        "tool_calls": (0, 10),
        "steps": (0, 8),
        "agents": (0, 6),
        "depth": (0, 2),
    }
    seconds = (0.1, 0.4) if top else (0.02, 0.25)
    limits: dict[str, Any] = {}
    for name in rng.sample(names, rng.randint(1, 3)):
        if name in whole:
            limits[name] = rng.randint(*whole[name])
        else:
            limits[name] = rng.uniform(*(seconds if name == "seconds" else (0.0003, 0.01)))
    return Budget(**limits)


def _spec(
    rng: random.Random,
    name: str,
    depth: int,
    levels: int,
    room: list[int],
    deadline: bool,
    *,
    wide: bool = False,
) -> Spec:
    """Agent ``name`` and the agents below it: at most ``room[0]`` more of them, down to
    depth ``levels``; ``wide``: at least one subagent."""
    budget = _budget(rng) if rng.random() < 0.3 else None
    if rng.random() < 0.12:  # a deadline of its own: hangs become possible below it
        seconds = rng.uniform(0.02, 0.25)
        budget = Budget(seconds=seconds) if budget is None else replace(budget, seconds=seconds)
    deadline = deadline or (budget is not None and budget.seconds is not None)
    children: list[Spec] = []
    if depth < levels:
        fan_out = min(max(rng.choice([0, 1, 2, 2, 3, 4, 5]), wide), room[0])
        room[0] -= fan_out
        children = [
            _spec(rng, f"{name}s{index}", depth + 1, levels, room, deadline)
            for index in range(fan_out)
        ]
    tools = rng.sample(TOOL_POOL, rng.randint(0, 3))
    if rng.random() < 0.7 or not (tools or children):
        tools.append("work")
    if deadline and rng.random() < 0.4:
        tools.append("stall")
    return Spec(
        name=name,
        depth=depth,
        children=tuple(children),
        tools=tuple(tools),
        budget=budget,
        max_tokens=rng.choice([None, None, None, rng.randint(8, 200)]),
        retries=rng.choice([0, 0, 1, 2]),
        restarts=rng.choice([0, 0, 0, 1]),
        escalate=depth > 0 and rng.random() < 0.15,
        tool_concurrency=rng.choice([256, 256, 1, 2, 3]),
        stop_after=rng.choice([None, None, None, None, 1, 2]),
        max_steps=rng.randint(1, 4) if depth < 2 else rng.randint(1, 2),
        deadline=deadline,
    )


def _rounds(rng: random.Random, tops: int) -> tuple[tuple[Op, ...], ...]:
    rounds = []
    for _ in range(rng.randint(1, 3)):
        ops: list[Op] = []
        for _ in range(rng.choice([1, 2, 2, 3, 4])):
            kinds: list[OpKind] = ["ask", "scope", "timeout", "tell"]
            kind = rng.choices(kinds, [6, 2, 2, 1])[0]
            ops.append(
                Op(
                    kind=kind,
                    top=rng.randrange(tops),
                    delay=rng.uniform(0.0, 0.03),
                    budget=_budget(rng, top=True) if rng.random() < 0.25 else None,
                    surrogate=kind != "timeout" and rng.random() < 0.1,
                )
            )
        if rng.random() < 0.3:
            ops.append(Op(kind="look", top=rng.randrange(tops), delay=rng.uniform(0, 0.03)))
        if rng.random() < 0.35:
            ops.append(Op(kind="cancel_node", top=0, delay=rng.uniform(0, 0.04), pick=rng.random()))
        if rng.random() < 0.06:
            ops.append(Op(kind="cancel_actor", top=rng.randrange(tops), delay=rng.uniform(0, 0.04)))
        rounds.append(tuple(ops))
    return tuple(rounds)


def _hosts(seed: int, mode: HostsMode) -> tuple[int, Kill | None]:
    """Whether tree ``seed`` runs across hosts, and the kill of one, if any: drawn
    apart from the rest of its plan."""
    rng = random.Random(f"{seed}|hosts")
    drawn = rng.random() < 1 / 3
    if mode == "never" or (mode == "plan" and not drawn):
        return 0, None
    if rng.random() < 0.5:
        return HOSTS, None
    placed = rng.choice([0, 1, 1, 1, 2, 3])
    delay = rng.choice([0.0, rng.uniform(0.0, 0.01)]) if placed else rng.uniform(0.0, 0.2)
    return HOSTS, Kill(host=rng.randrange(HOSTS), placed=placed, delay=delay)


def _memory(
    seed: int, tops: tuple[Spec, ...], rounds: tuple[tuple[Op, ...], ...]
) -> tuple[tuple[Spec, ...], tuple[tuple[Op, ...], ...]]:
    """The memory features of tree ``seed``, drawn apart from the rest of its plan:
    compaction on half the top-level agents, digests on some restart policies (and
    restarts on some top-level agents that had none), resumed asks."""
    rng = random.Random(f"{seed}|memory")

    def digest(spec: Spec) -> Spec:
        children = tuple(digest(child) for child in spec.children)
        restarts = spec.restarts
        if spec.depth == 0 and not restarts and rng.random() < 0.3:
            restarts = rng.choice([1, 2])
        on = bool(restarts) and rng.random() < 0.7
        return replace_spec(spec, children=children, restarts=restarts, digest=on)

    drawn = []
    for top in tops:
        memory = None
        if rng.random() < 0.5:
            threshold = rng.choice([1, 8, 20, 40, 80, 160])
            keep = rng.randint(0, 3)
            separate = rng.random() < 0.4
            clear = rng.choice([None, None, 1, 2])
            memory = Memory(threshold=threshold, keep=keep, separate=separate, clear=clear)
        drawn.append(replace_spec(digest(top), memory=memory))
    resumed = tuple(
        tuple(
            replace_spec(op, resume=True) if op.kind in ASKS and rng.random() < 0.3 else op
            for op in ops
        )
        for ops in rounds
    )
    return tuple(drawn), resumed


def make_plan(seed: int, hosts: HostsMode = "plan") -> Plan:
    """Everything about tree ``seed`` that is decided before it runs; ``hosts``: which
    trees run across hosts (as drawn, or all, or none)."""
    rng = random.Random(seed)
    focus = DRAWN[seed % len(DRAWN)]
    runtime_budget = _budget(rng, top=True) if rng.random() < 0.25 else None
    if focus == "model_stall":  # a model hangs only where a deadline ends the hang
        seconds = rng.uniform(0.1, 0.4)
        runtime_budget = replace(runtime_budget or Budget(), seconds=seconds)
    deadline = runtime_budget is not None and runtime_budget.seconds is not None
    count = rng.choice([1, 1, 2])
    wide = focus == "garbage_bad_subagent_args"  # bad subagent calls need a subagent
    tops = tuple(
        _spec(rng, f"t{i}", 0, rng.choice([1, 2, 2, 3]), [rng.randint(3, 12)], deadline, wide=wide)
        for i in range(count)
    )
    stores: list[Literal["none", "memory", "sqlite"]] = ["none", "memory", "sqlite"]
    store = rng.choices(stores, [6, 3, 1])[0]
    caps = Caps()
    if rng.random() < 0.15:
        caps = Caps(depth=rng.randint(1, 3), agents=rng.randint(1, 20), steps=rng.randint(1, 5))
    host_count, kill = _hosts(seed, hosts)
    min_output = rng.choice([16, 32, 64, 256])
    default_max_tokens = rng.choice([64, 256, 4_096])
    persistent = store != "none" and rng.random() < 0.7
    observe = rng.random() < 0.5
    tops, rounds = _memory(seed, tops, _rounds(rng, count))
    return Plan(
        seed=seed,
        tops=tops,
        runtime_budget=runtime_budget,
        caps=caps,
        min_output=min_output,
        default_max_tokens=default_max_tokens,
        store=store,
        persistent=persistent,
        observe=observe,
        rounds=rounds,
        focus=focus,
        hosts=host_count,
        kill=kill,
    )
