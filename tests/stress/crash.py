"""Crash safety: a process working on one SQLite file, SIGKILLed at random moments.

``python -m tests.stress.crash --kills 100 [--backend asyncio|trio|both] [--seed N]``
(from the repository's root; ``make stress`` runs it on both backends).

One **round** starts ``tests.stress.crash_worker`` on the database, waits for its
``READY`` line, lets it work for a random 0.05 to 1.5 s, kills it with ``SIGKILL``
by pid (no cleanup of any kind runs) and collects the turns it acknowledged (its
``ACK`` lines). Every round reuses the same file: the next worker resumes it.
After each kill the file is checked, with the ``sqlite3`` module and through
``SQLiteStore``; each problem found is a ``Violation`` of one kind:

- ``integrity``: ``PRAGMA integrity_check`` says something other than ``ok``;
- ``lost turn``: a turn acknowledged in any round so far is not in its agent's
  stored conversation (its user message followed by an answer, the acknowledged
  turns of each agent in the order they were acknowledged), or its answer is not
  the one its model gave;
- ``lost trace``: the trace of an acknowledged execution is not stored (it is
  saved in the same transaction as the turn), or says another agent or status;
- ``broken turn``: a stored conversation is not a sequence of whole turns (a user
  message, then one answer);
- ``tool trace``: a stored conversation (summary, buffer or messages) holds a tool
  result or an assistant message with tool calls;
- ``orphan trace``: a stored record names a ``parent_id`` that is not stored;
- ``worker``: the worker did not start, or ended before it was killed.

A violation is reported once, in the round that first shows it. The command prints
a line every 10 rounds and a summary per backend, and exits with status 1 if any
violation was found.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio
import anyio.abc
import msgspec

from fractor.actors import AssistantMessage, Message, ToolResultMessage, UserMessage
from fractor.actors._agent._persistence import decode_state
from fractor.actors._observation._traces import TRACE_KIND, trace_from_record
from fractor.runtime import SQLiteStore, StoreError

from .crash_worker import AGENT_OF_PREFIX, answer_to

__all__ = ["Ack", "Report", "Violation", "check_database", "crash_rounds", "main"]

ROOT = Path(__file__).resolve().parent.parent.parent
BACKENDS = ("asyncio", "trio")
#: How long a worker may take to print ``READY``.
START_TIMEOUT = 30.0
#: How much of a worker's stderr is kept for a report.
STDERR_KEPT = 4000


@dataclass(frozen=True, slots=True)
class Ack:
    """A turn a worker acknowledged: ``ask`` returned it, after its save."""

    agent_id: str
    text: str
    execution_id: str
    status: str
    round: int


@dataclass(frozen=True, slots=True)
class Violation:
    """One problem found in the database after a kill."""

    kind: str
    subject: str
    detail: str
    round: int

    def __str__(self) -> str:
        return f"round {self.round}: {self.kind}: {self.subject}: {self.detail}"


@dataclass(slots=True)
class Report:
    """What the rounds on one database did and found so far."""

    backend: str
    db: Path
    seed: int
    rounds: int = 0
    acks: list[Ack] = field(default_factory=list)
    records: int = 0
    orphans: int = 0
    seconds: float = 0.0
    #: Each violation under its kind and subject: reported once, when first seen.
    found: dict[tuple[str, str], Violation] = field(default_factory=dict)

    @property
    def violations(self) -> list[Violation]:
        return list(self.found.values())

    def by_kind(self) -> dict[str, int]:
        return dict(Counter(v.kind for v in self.found.values()))

    def summary(self) -> str:
        agents = Counter(ack.agent_id for ack in self.acks)
        per_agent = ", ".join(f"{count} {agent}" for agent, count in sorted(agents.items()))
        kinds = ", ".join(f"{kind} {count}" for kind, count in sorted(self.by_kind().items()))
        return (
            f"{self.backend} (seed {self.seed}): {self.rounds} rounds, {len(self.acks)} "
            f"acknowledged turns ({per_agent or 'none'}), {self.records} records, "
            f"{self.orphans} orphan traces, {self.seconds:.1f} s; "
            f"violations: {kinds or 'none'}"
        )

    def describe(self, limit: int = 20) -> str:
        """The summary and the first ``limit`` violations, one a line."""
        lines = [self.summary(), *(str(v) for v in self.violations[:limit])]
        if len(self.found) > limit:
            lines.append(f"... and {len(self.found) - limit} more")
        return "\n".join(lines)


# -- one round: start, let work, kill ---------------------------------------------------


@dataclass(slots=True)
class _Output:
    """What a worker printed: its complete stdout lines and the tail of its stderr."""

    lines: list[str] = field(default_factory=list)
    ready: bool = False
    #: Set when the worker is ready, or when its stdout ends (it died first).
    woken: anyio.Event = field(default_factory=anyio.Event)
    stderr: bytes = b""


async def _read_lines(stream: anyio.abc.ByteReceiveStream, output: _Output) -> None:
    """Collect complete lines until the end of ``stream`` (a cut last line is dropped)."""
    pending = b""
    async for chunk in stream:
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            text = line.decode()
            output.lines.append(text)
            if text == "READY":
                output.ready = True
                output.woken.set()
    output.woken.set()


async def _read_stderr(stream: anyio.abc.ByteReceiveStream, output: _Output) -> None:
    async for chunk in stream:
        output.stderr = (output.stderr + chunk)[-STDERR_KEPT:]


def _parse_ack(line: str, round: int) -> Ack | None:
    """``ACK <task text> <execution id> <status>``, or None for another line."""
    if not line.startswith("ACK "):
        return None
    text, execution_id, status = line[4:].rsplit(" ", 2)
    return Ack(AGENT_OF_PREFIX[text.split(" ", 1)[0]], text, execution_id, status, round)


async def run_round(
    db: Path, *, backend: str, seed: int, delay: float, round: int
) -> tuple[list[Ack], list[Violation]]:
    """Start a worker on ``db``, SIGKILL it ``delay`` seconds after it is ready.

    Returns the turns it acknowledged, and a ``worker`` violation if it did not
    start or ended on its own.
    """
    command = [sys.executable, "-m", "tests.stress.crash_worker", str(db), backend, str(seed)]
    output = _Output()
    problems: list[Violation] = []
    async with (
        await anyio.open_process(
            command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE
        ) as process,
        anyio.create_task_group() as tg,
    ):
        assert process.stdout is not None
        assert process.stderr is not None
        tg.start_soon(_read_lines, process.stdout, output)
        tg.start_soon(_read_stderr, process.stderr, output)
        with anyio.move_on_after(START_TIMEOUT):
            await output.woken.wait()
        if output.ready:
            await anyio.sleep(delay)
        else:
            problems.append(Violation("worker", f"seed {seed} start", "never printed READY", round))
        if process.returncode is None:
            # By pid: the process gets no chance to clean anything up.
            os.kill(process.pid, signal.SIGKILL)
        code = await process.wait()
    if code != -signal.SIGKILL:
        stderr = output.stderr.decode(errors="replace").strip()
        problems.append(
            Violation(
                "worker",
                f"seed {seed} exit",
                f"exited with {code} before the kill: {stderr}",
                round,
            )
        )
    acks = [ack for line in output.lines if (ack := _parse_ack(line, round)) is not None]
    return acks, problems


# -- the checks -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _FileFacts:
    """What the ``sqlite3`` module reads from the file."""

    integrity: list[str]
    actor_ids: list[str]
    #: Every record id, with its parent id.
    parents: dict[str, str]


def _read_file(db: Path) -> _FileFacts:
    """Integrity, the actors with a state and every record's parent (runs in a thread)."""
    connection = sqlite3.connect(db)
    try:
        integrity = [row[0] for row in connection.execute("PRAGMA integrity_check")]
        actor_ids = [row[0] for row in connection.execute("SELECT actor_id FROM states")]
        parents = dict(connection.execute("SELECT id, parent_id FROM records").fetchall())
    finally:
        connection.close()
    return _FileFacts(integrity, actor_ids, parents)


def _has_tool_trace(message: Message) -> bool:
    return isinstance(message, ToolResultMessage) or (
        isinstance(message, AssistantMessage) and bool(message.tool_calls)
    )


def _check_turns(
    actor_id: str, messages: Sequence[Message], acks: Sequence[Ack], round: int
) -> list[Violation]:
    """Whole turns only, and every acknowledged turn among them, in order."""
    problems: list[Violation] = []
    for index in range(0, len(messages), 2):
        pair = messages[index : index + 2]
        if not (
            len(pair) == 2
            and isinstance(pair[0], UserMessage)
            and isinstance(pair[1], AssistantMessage)
        ):
            kinds = ", ".join(type(m).__name__ for m in pair)
            problems.append(
                Violation("broken turn", f"{actor_id} message {index}", f"found {kinds}", round)
            )
            break  # the pairs after it are shifted: one report is enough
    position = 0
    for ack in acks:
        found = next(
            (
                index
                for index in range(position, len(messages) - 1, 2)
                if isinstance(m := messages[index], UserMessage) and m.content == ack.text
            ),
            None,
        )
        if found is None:
            where = "" if position == 0 else f" after message {position}"
            problems.append(
                Violation(
                    "lost turn",
                    ack.text,
                    f"acknowledged in round {ack.round} ({ack.execution_id}), not in the "
                    f"stored conversation of {actor_id!r}{where}",
                    round,
                )
            )
            continue
        answer = messages[found + 1]
        if ack.status == "completed" and answer != AssistantMessage(content=answer_to(ack.text)):
            problems.append(
                Violation("lost turn", ack.text, f"stored with the answer {answer!r}", round)
            )
        position = found + 2
    return problems


async def check_database(
    db: Path, acks: Sequence[Ack], new: Sequence[Ack], round: int
) -> tuple[list[Violation], _FileFacts]:
    """Every check of the module docstring on ``db``, for the acknowledged turns
    ``acks`` (all rounds so far); the traces of ``new`` are also read and decoded."""
    facts = await anyio.to_thread.run_sync(_read_file, db)
    problems: list[Violation] = []
    if facts.integrity != ["ok"]:
        problems.append(Violation("integrity", str(db), "; ".join(facts.integrity), round))
    async with SQLiteStore(db) as store:
        for actor_id in facts.actor_ids:
            data = await store.load(actor_id)
            if data is None:
                problems.append(Violation("lost turn", actor_id, "its state is gone", round))
                continue
            try:
                state = decode_state(data, store=repr(store), actor_id=actor_id)
            except StoreError as exc:
                problems.append(Violation("integrity", actor_id, str(exc), round))
                continue
            for section in ("summary", "buffer", "messages"):
                messages: tuple[Message, ...] = getattr(state, section)
                for index, message in enumerate(messages):
                    if _has_tool_trace(message):
                        problems.append(
                            Violation(
                                "tool trace",
                                f"{actor_id} {section}[{index}]",
                                msgspec.json.encode(message).decode()[:200],
                                round,
                            )
                        )
            mine = [ack for ack in acks if ack.agent_id == actor_id]
            problems += _check_turns(actor_id, state.messages, mine, round)
        stored = set(facts.actor_ids)
        for agent_id in sorted({ack.agent_id for ack in acks} - stored):
            problems.append(
                Violation(
                    "lost turn", agent_id, "turns were acknowledged, no state is stored", round
                )
            )
        for ack in acks:
            if ack.execution_id not in facts.parents:
                problems.append(
                    Violation("lost trace", ack.execution_id, f"the trace of {ack.text!r}", round)
                )
        for ack in new:
            record = await store.record(ack.execution_id)
            if record is None:
                continue  # reported above
            if record.kind != TRACE_KIND:
                problems.append(
                    Violation(
                        "lost trace", ack.execution_id, f"a record of kind {record.kind!r}", round
                    )
                )
                continue
            trace = trace_from_record(record)
            if (trace.agent_id, trace.status, trace.task, trace.parent_id) != (
                ack.agent_id,
                ack.status,
                ack.text,
                "",
            ):
                problems.append(
                    Violation(
                        "lost trace",
                        ack.execution_id,
                        f"stored as agent {trace.agent_id!r}, status {trace.status!r}, task "
                        f"{trace.task!r}, parent {trace.parent_id!r}",
                        round,
                    )
                )
        for record_id, parent_id in facts.parents.items():
            if parent_id and parent_id not in facts.parents:
                # The store agrees that the parent is not there.
                missing = await store.record(parent_id) is None
                problems.append(
                    Violation(
                        "orphan trace",
                        record_id,
                        f"its parent {parent_id} is not stored"
                        + ("" if missing else " (yet SQLiteStore.record finds it)"),
                        round,
                    )
                )
    return problems, facts


# -- many rounds ------------------------------------------------------------------------


async def crash_rounds(
    db: Path,
    *,
    backend: str,
    kills: int,
    seed: int,
    max_delay: float = 1.5,
    progress: Callable[[Report], None] | None = None,
) -> Report:
    """``kills`` rounds on ``db``, each one checked; ``progress`` is called after each."""
    rng = random.Random(seed)
    report = Report(backend=backend, db=db, seed=seed)
    started = time.perf_counter()
    for round in range(1, kills + 1):
        # A seed of its own per round: task texts never repeat on one database.
        worker_seed = seed * 100_000 + round
        delay = rng.uniform(0.05, max_delay)
        new, problems = await run_round(
            db, backend=backend, seed=worker_seed, delay=delay, round=round
        )
        report.acks += new
        found, facts = await check_database(db, report.acks, new, round)
        for violation in [*problems, *found]:
            report.found.setdefault((violation.kind, violation.subject), violation)
        report.rounds = round
        report.records = len(facts.parents)
        report.orphans = sum(
            1 for parent in facts.parents.values() if parent and parent not in facts.parents
        )
        report.seconds = time.perf_counter() - started
        if progress is not None:
            progress(report)
    return report


def _print_progress(report: Report) -> None:
    if report.rounds % 10 == 0:
        kinds = ", ".join(f"{k} {n}" for k, n in sorted(report.by_kind().items())) or "none"
        print(
            f"{report.backend}: round {report.rounds}, {len(report.acks)} acknowledged turns, "
            f"{report.orphans} orphan traces, violations: {kinds}, {report.seconds:.1f} s",
            flush=True,
        )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.stress.crash", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--kills", type=int, default=100, help="rounds per backend (100)")
    parser.add_argument("--backend", choices=[*BACKENDS, "both"], default="both")
    parser.add_argument("--seed", type=int, default=None, help="random by default")
    parser.add_argument(
        "--dir", type=Path, default=None, help="keep the databases there (default: a temp dir)"
    )
    args = parser.parse_args(argv)
    if args.kills < 1:
        parser.error("--kills must be at least 1")
    seed: int = random.randrange(1_000_000) if args.seed is None else args.seed
    backends = BACKENDS if args.backend == "both" else (args.backend,)
    started = time.perf_counter()
    reports: list[Report] = []
    with tempfile.TemporaryDirectory(prefix="fractor-crash-") as temporary:
        directory: Path = args.dir or Path(temporary)
        directory.mkdir(parents=True, exist_ok=True)
        for backend in backends:
            db = directory / f"crash-{backend}-{seed}.db"
            print(f"{backend}: {args.kills} kills on {db}, seed {seed}", flush=True)
            rounds = functools.partial(
                crash_rounds,
                db,
                backend=backend,
                kills=args.kills,
                seed=seed,
                progress=_print_progress,
            )
            report = anyio.run(rounds, backend=backend)
            reports.append(report)
            print(report.describe(), flush=True)
    print(f"wall time {time.perf_counter() - started:.1f} s", flush=True)
    return 1 if any(report.violations for report in reports) else 0


if __name__ == "__main__":
    sys.exit(main())
