"""Budget utilization: a lead and N concurrent workers under a token budget.

The tree: a lead agent whose model, in its first step, calls N ``worker`` subagents at
once (one turn of N ``call("worker", task="part i")``), then answers. Worker i makes
2 or 3 model requests (1 or 2 ``lookup`` tool calls, then its answer), each after 1 to
5 ms of simulated latency, varied per worker and request, deterministically. Every
reply reports its usage: the input tokens are the model's own estimate of the request
(so the estimate the supervisor checks is exact, and any overshoot is the
supervisor's), the output 20 to 60 tokens for a tool call, 60 to 200 for an answer.
No agent sets ``max_tokens``: the default reservation path is what is measured.

The demand D is what the lead's node spends with no budget at all (``rt.tree()``, the
lead node's ``usage.total_tokens``), measured in the same process before anything is
judged: about 130,000 tokens for 100 workers. Every budget is the lead agent's own
(``Agent("lead", ..., budget=Budget(...))``): it covers one execution of the lead and
all of its workers. Each run has a fresh ``Runtime``, agents and models.

- Utilization: under ``Budget(tokens=int(0.6 * D))``, what the lead's node spent when
  the tree stopped, over the limit (median of several runs; the baseline column is
  1.00, the whole budget). Target at least 0.95.
- Overshoot: over those runs, the largest ``max(0, spent - limit) / limit``. Target 0.
- Wall with a budget that fits: 1.5 x D on tokens, output tokens and requests, against
  the same tree with no budget (medians of interleaved runs, the ask alone timed).
  Target at most 1.2 x, and every run under that budget completes, spending D.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import anyio
import msgspec

from fractor.actors import (
    Agent,
    FunctionModel,
    ModelRequest,
    ModelResponse,
    Status,
    ToolResultMessage,
    Usage,
    UserMessage,
    call,
    calls,
    estimate_tokens,
    reply,
    tool,
)
from fractor.runtime import Budget, Runtime

from ._harness import Row, judged, summarize

__all__ = ["TreeRun", "demand", "run", "run_tree"]

#: What the budgeted tree may spend, as a share of its demand, and the target.
UTILIZATION_SHARE = 0.6
UTILIZATION_TARGET = 0.95
#: A budget that fits, as a multiple of the demand, and the wall-time target.
FITS_SHARE = 1.5
WALL_TARGET = 1.2

_INSTRUCTIONS = (
    "You are one worker of a research team. Look the part you are given up with the "
    "lookup tool, once or twice, then answer in one paragraph with what you found. "
) * 6  # about 250 tokens of context on every worker request
_FACT = "a measured fact about the subject, with its source and its date; " * 6


@tool
async def lookup(topic: str) -> str:
    """Look a topic up in the team's notes."""
    return f"{topic}: {_FACT}"


def _part(request: ModelRequest) -> int:
    """The worker's index, from its task ("part 17")."""
    task = next(m for m in request.messages if isinstance(m, UserMessage))
    return int(task.content.rsplit(" ", 1)[-1])


def _usage(request: ModelRequest, output_tokens: int) -> Usage:
    return Usage(input_tokens=estimate_tokens(request), output_tokens=output_tokens, requests=1)


async def _worker_turn(request: ModelRequest) -> ModelResponse:
    """Worker i: ``1 + i % 2`` lookups, then an answer of 60 to 200 tokens."""
    i = _part(request)
    done = sum(1 for m in request.messages if isinstance(m, ToolResultMessage))
    await anyio.sleep(0.001 * (1 + (3 * i + done) % 5))
    if done < 1 + i % 2:
        turn = call("lookup", topic=f"part {i}, angle {done}")
        return msgspec.structs.replace(turn, usage=_usage(request, 20 + 10 * ((i + done) % 5)))
    output = 60 + (37 * i) % 141
    text = f"Part {i}: " + "found " * (output * 4 // 6)
    return reply(text, usage=_usage(request, output))


def _lead_turn(children: int) -> FunctionModel:
    async def turn(request: ModelRequest) -> ModelResponse:
        await anyio.sleep(0.001)
        if not any(isinstance(m, ToolResultMessage) for m in request.messages):
            fan_out = calls(*(call("worker", task=f"part {i}") for i in range(children)))
            return msgspec.structs.replace(fan_out, usage=_usage(request, 12 * children))
        return reply("Every part is covered.", usage=_usage(request, 150))

    return FunctionModel(turn, name="lead")


def _tree(children: int, budget: Budget | None) -> Agent:
    """A fresh lead and worker (fresh models too: a model keeps its requests)."""
    worker = Agent(
        "worker",
        FunctionModel(_worker_turn, name="worker"),
        tools=[lookup],
        instructions=_INSTRUCTIONS,
        description="Researches one part.",
    )
    return Agent(
        "lead",
        _lead_turn(children),
        subagents=[worker],
        tool_concurrency=max(children, 1),
        budget=budget,
    )


@dataclass(frozen=True, slots=True)
class TreeRun:
    """One run of the tree: how the lead's ask ended and what its node spent."""

    status: Status
    spent: Usage
    seconds: float


async def run_tree(children: int, budget: Budget | None = None) -> TreeRun:
    """Run the tree once in a fresh runtime; ``seconds`` times the lead's ask alone.

    ``spent`` is the lead node's usage (the lead and every worker), read from
    ``rt.tree()`` once the runtime has closed: every request has settled by then.
    """
    with anyio.fail_after(120):
        async with Runtime() as rt:
            ref = await rt.spawn(_tree(children, budget))
            began = time.perf_counter()
            result = await ref.ask("Cover every part.")
            seconds = time.perf_counter() - began
        lead = next(node for node in rt.tree().nodes if node.name == "lead")
    return TreeRun(status=result.status, spent=lead.usage, seconds=seconds)


async def demand(children: int) -> Usage:
    """What the tree spends with no budget (it must complete): its demand."""
    unbudgeted = await run_tree(children)
    if unbudgeted.status != "completed":
        raise RuntimeError(f"the tree without a budget ended {unbudgeted.status!r}")
    return unbudgeted.spent


async def _utilization(children: int, needs: Usage, repeats: int) -> list[Row]:
    limit = int(UTILIZATION_SHARE * needs.total_tokens)
    spent = [
        (await run_tree(children, Budget(tokens=limit))).spent.total_tokens for _ in range(repeats)
    ]
    share = f"{UTILIZATION_SHARE:.0%} of demand, K={children}"
    used = summarize(
        f"Budget: utilization at {share}",
        "x",
        [s / limit for s in spent],
        [1.0] * repeats,
        better="higher",
    )
    used = judged(
        used, f">= {UTILIZATION_TARGET:g} of the budget", used.ratio >= UTILIZATION_TARGET
    )
    over = [max(0, s - limit) / limit for s in spent]
    worst = max(over)
    overshoot = Row(
        workload=f"Budget: overshoot at {share}",
        unit="x",
        fractor=worst,
        baseline=0.0,
        fractor_min=min(over),
        fractor_max=worst,
        baseline_min=0.0,
        baseline_max=0.0,
        ratio=1.0 if worst == 0 else 0.0,
        target="== 0",
        holds=worst == 0,
    )
    return [used, overshoot]


async def _wall(children: int, needs: Usage, repeats: int) -> Row:
    """The tree under a budget that fits against no budget, runs interleaved (the
    order alternating) so a machine whose speed drifts does not decide the verdict."""
    fits = Budget(
        tokens=int(FITS_SHARE * needs.total_tokens),
        output_tokens=int(FITS_SHARE * needs.output_tokens),
        requests=int(FITS_SHARE * needs.requests),
    )
    ours: list[float] = []
    raw: list[float] = []
    completed = True
    for index in range(repeats + 1):  # the first pair is a warm-up
        if index % 2:
            budgeted = await run_tree(children, fits)
            bare = await run_tree(children)
        else:
            bare = await run_tree(children)
            budgeted = await run_tree(children, fits)
        if bare.status != "completed" or bare.spent != needs:
            raise RuntimeError(
                f"the tree without a budget ended {bare.status!r} having spent "
                f"{bare.spent}, not its demand of {needs}"
            )
        completed &= budgeted.status == "completed" and budgeted.spent == needs
        if index:
            ours.append(budgeted.seconds)
            raw.append(bare.seconds)
    row = summarize(
        f"Budget: wall, {FITS_SHARE:g} x demand / none, K={children}",
        "s",
        ours,
        raw,
        better="lower",
    )
    target = f"<= {WALL_TARGET:g} x none, completes"
    return judged(row, target, completed and row.ratio >= 1 / WALL_TARGET)


async def run(*, quick: bool = False, children: int | None = None) -> list[Row]:
    """The three rows; ``children`` overrides the tree's width (100, 20 when quick)."""
    width = children if children is not None else 20 if quick else 100
    needs = await demand(width)
    rows = await _utilization(width, needs, 3 if quick else 5)
    rows.append(await _wall(width, needs, 5 if quick else 15))
    return rows
