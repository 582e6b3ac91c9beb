"""What the live views write in words: plain progress lines, one per event that
matters (``ProgressLines``, for a pipe, CI or a dumb terminal), and the latest line
each running agent's model streamed (``LatestLines``, shown under it in the tree of
the terminal's live view, ``fractor.actors.cli``, and of the web view,
``fractor.actors.ui``: both read it from here, below them).
Both are pure: they read events and return text. Each dispatches on the event's
detail class and says which kinds it shows in words of its own (``SHOWN``) and which
it leaves out on purpose (``IGNORED``); any other kind (one defined since) it shows
as it is, ``kind field=value ...`` (``generic_line``), so that no kind is silently
dropped and a new kind needs no line here.

Images and documents (a task's, a tool result's, an answer's: the ``parts`` of
``ExecutionStart``, ``ToolEnd`` and ``ExecutionEnd``) are one line each, as
``describe_part`` wrote them (``[image 1024x768 png, 182 KB, sha256:ab12cd34]``),
never their bytes: ``part_lines`` says them, both views show them.
"""

from __future__ import annotations

from fractor.runtime import ActorStop, Event, EventDetail

from ._events import (
    ApprovalAsked,
    ApprovalDecision,
    BudgetResume,
    BudgetWait,
    CompactionEnd,
    DeadlineReached,
    ExecutionEnd,
    ExecutionStart,
    LimitReached,
    ModelText,
    RateResume,
    RateWait,
    Refused,
    RequestEnd,
    RequestStart,
    Restart,
    Retry,
    Spawn,
    StepEnd,
    StepStart,
    ToolEnd,
    ToolProgress,
    ToolStart,
)

__all__ = ["WAITING", "LatestLines", "ProgressLines", "part_lines"]

#: The mark before a line of something waiting (an approval, a tool's progress) and
#: the live tree's "waiting for budget": a character every default font has (a
#: terminal's, the web view's), unlike ⧗ (U+29D7), a box in Debian's Chromium.
WAITING = "…"
#: How many characters of a tool call's arguments a step line shows.
_ARGUMENTS_SHOWN = 80
#: How many characters of an agent's latest streamed line the tree shows.
_LINE_SHOWN = 100
#: How many characters of a kind shown as it is (``generic_line``) a line shows.
_GENERIC_SHOWN = 120
#: How many part lines the tree keeps under an agent (the latest; a line counts
#: the ones before).
_PARTS_SHOWN = 4


def part_lines(detail: EventDetail) -> tuple[str, ...]:
    """The images and documents an event names, one line each, saying whose they
    are: ``task: [image ...]``, ``search returned [document ...]``, ``answered with
    [image ...]``; none for an event that carries none."""
    match detail:
        case ExecutionStart(parts=parts) if parts:
            return tuple(f"task: {part}" for part in parts)
        case ToolEnd(tool=tool, parts=parts) if parts:
            return tuple(f"{tool} returned {part}" for part in parts)
        case ExecutionEnd(parts=parts) if parts:
            return tuple(f"answered with {part}" for part in parts)
    return ()


class LatestLines:
    """The latest line of text each running execution's model is streaming, from the
    runtime's events (``ModelText``): what the live tree shows under a running agent.
    A tool call's progress (``ToolProgress``) and an approval waited for show there
    too, while they last.

    A step's request starts a new line; an execution's end forgets it. Only the
    tail of a long line is kept (``width`` characters). An event of a kind neither
    ``SHOWN`` nor ``IGNORED`` is the line, as it is (``generic_line``), until the next.

    Apart from that line, ``parts(execution_id)`` are the lines of the images and
    documents the execution was given, its tools returned and it answered with
    (``part_lines``; the latest ``_PARTS_SHOWN``, after a line counting the others),
    kept after it ended.
    """

    #: The kinds it reads in words of its own.
    SHOWN: frozenset[type[EventDetail]] = frozenset(
        {
            ExecutionStart,
            ModelText,
            ApprovalAsked,
            ToolProgress,
            ToolEnd,
            StepStart,
            Retry,
            ExecutionEnd,
            ApprovalDecision,
        }
    )
    #: The kinds it leaves out on purpose.
    IGNORED: frozenset[type[EventDetail]] = frozenset(
        {
            Refused,
            StepEnd,
            RequestStart,
            RequestEnd,
            ToolStart,
            Spawn,
            Restart,
            CompactionEnd,
            BudgetWait,
            BudgetResume,
            RateWait,
            RateResume,
            LimitReached,
            DeadlineReached,
            ActorStop,
        }
    )
    #: Both (a kind in neither is shown as it is).
    _KNOWN = SHOWN | IGNORED

    def __init__(self, width: int = _LINE_SHOWN) -> None:
        self.width = width
        self._text: dict[str, str] = {}
        #: Per execution: the tool call whose progress its line shows (its call id).
        self._progress: dict[str, str] = {}
        #: Per execution that has any: the lines of its parts, and how many in all.
        self._parts: dict[str, tuple[list[str], int]] = {}

    def feed(self, event: Event) -> None:
        """Take one event (a listener of the bus: called with every event, where it
        happens, so each kind costs what it must and no more: one set lookup for
        most)."""
        detail = event.detail
        kind = type(detail)
        if kind in self.IGNORED:
            return
        key = event.execution_id
        if type(detail) is ModelText:
            text = self._text.get(key, "") + detail.text
            if len(text) > 4 * self.width:
                text = text[-2 * self.width :]
            self._text[key] = text
        elif kind is StepStart or kind is Retry or kind is ApprovalDecision:
            self._new_line(key)
        elif kind is ExecutionStart:
            self._keep_parts(key, detail)
        elif type(detail) is ToolEnd:
            self._keep_parts(key, detail)
            if self._progress.get(key) == detail.call_id:  # its progress line is done
                del self._progress[key]
                self._text.pop(key, None)
        elif kind is ExecutionEnd:
            self._keep_parts(key, detail)
            self._new_line(key)
        else:
            match detail:
                case ApprovalAsked(tool=tool, id=request_id):
                    self._text[key] = f"\n{WAITING} waiting for approval: {tool} [{request_id}]"
                case ToolProgress(tool=tool, call_id=call_id) as progress:
                    self._text[key] = f"\n{WAITING} {tool}: {_progress(progress)}"
                    self._progress[key] = call_id
                case _ if kind not in self._KNOWN:  # as it is
                    self._text[key] = "\n" + generic_line(detail)
                    self._progress.pop(key, None)

    def _new_line(self, key: str) -> None:
        """A new line for ``key``, or none."""
        self._text.pop(key, None)
        self._progress.pop(key, None)

    def _keep_parts(self, key: str, detail: EventDetail) -> None:
        said = part_lines(detail)
        if said:
            kept, seen = self._parts.get(key, ([], 0))
            kept.extend(said)
            del kept[:-_PARTS_SHOWN]
            self._parts[key] = (kept, seen + len(said))

    def line(self, execution_id: str) -> str:
        """The latest non-empty line ``execution_id`` streamed ("" if none), its tail
        if it is longer than ``width``."""
        text = self._text.get(execution_id, "")
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return ""
        last = lines[-1].strip()
        return last if len(last) <= self.width else "…" + last[-(self.width - 1) :]

    def parts(self, execution_id: str) -> tuple[str, ...]:
        """The lines of the images and documents of ``execution_id`` (see the class)."""
        kept, seen = self._parts.get(execution_id, ((), 0))
        if seen > len(kept):
            return (f"… {seen - len(kept)} earlier part(s)", *kept)
        return tuple(kept)

    def __len__(self) -> int:
        return len(self._text)


def _clip(text: str, limit: int = _ARGUMENTS_SHOWN) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def generic_line(detail: EventDetail) -> str:
    """An event of a kind shown as it is, on one line: its kind's name and its fields,
    ``cache_hit tool=search hits=2`` (a field left at None or an empty host left out),
    clipped."""
    fields = " ".join(
        f"{name}={' '.join(str(value).split())}"
        for name in detail.__struct_fields__
        if (value := getattr(detail, name)) is not None and (name != "host" or value)
    )
    return _clip(f"{detail.kind} {fields}" if fields else detail.kind, _GENERIC_SHOWN)


def _progress(detail: ToolProgress) -> str:
    """A tool's progress in words: ``40/100 (40%): reading``, ``3: reading``."""
    total = detail.total
    text = f"{detail.progress:g}"
    if total is not None:
        text += f"/{total:g}"
        if total > 0:
            text += f" ({min(detail.progress / total, 1.0):.0%})"
    return text + (f": {_clip(detail.message)}" if detail.message else "")


class ProgressLines:
    """Turns events into plain progress lines: ``line(event)`` is the line or None.

    One line per execution start and end, spawn, budget or rate wait, budget stop, deadline,
    retry, restart, compaction, approval asked and decided, and tool call progress
    reported; with ``steps=True`` also one per model step (its tool calls with their
    arguments, tokens and time); and one per event of a kind neither ``SHOWN`` nor
    ``IGNORED``, as it is (``generic_line``). Each image or document a task, a tool
    result or an answer carries is a line of its own (``part_lines``), after its
    event's line if it has one (a tool call's end has none). Lines are indented by
    depth and start with the seconds since the runtime started.
    """

    #: The kinds it writes a line for (``ToolStart`` and ``StepEnd`` with ``steps``).
    SHOWN: frozenset[type[EventDetail]] = frozenset(
        {
            ExecutionStart,
            Spawn,
            LimitReached,
            DeadlineReached,
            BudgetWait,
            RateWait,
            Retry,
            Restart,
            CompactionEnd,
            ExecutionEnd,
            ApprovalAsked,
            ApprovalDecision,
            ToolProgress,
            ToolStart,
            StepEnd,
        }
    )
    #: The kinds it leaves out on purpose: the model's text and requests, a step's
    #: start (its end says it all), a tool call's end (its step's line names it), a
    #: budget or rate wait's end, a refusal (the ask answers it), an actor's stop.
    IGNORED: frozenset[type[EventDetail]] = frozenset(
        {
            ModelText,
            RequestStart,
            RequestEnd,
            StepStart,
            ToolEnd,
            BudgetResume,
            RateResume,
            Refused,
            ActorStop,
        }
    )
    #: Both (a kind in neither is shown as it is).
    _KNOWN = SHOWN | IGNORED

    def __init__(self, *, steps: bool = False) -> None:
        self.steps = steps
        self._missed = 0
        # Per execution: the tool calls started in its current step, (name, arguments).
        self._calls: dict[str, list[tuple[str, str]]] = {}

    def line(self, event: Event) -> str | None:
        """The line(s) ``event`` prints, or None for an event not shown."""
        prefix = self._prefix(event)
        lines: list[str] = []
        if event.missed > self._missed:
            dropped, self._missed = event.missed - self._missed, event.missed
            lines.append(f"{prefix}({dropped} event(s) dropped: this view fell behind)")
        text = self._text(event)
        if text is not None:
            lines.append(prefix + text)
        said = part_lines(event.detail)
        if said:
            agent = event.agent or event.agent_id
            lines.extend(f"{prefix}{agent}: {line}" for line in said)
        return "\n".join(lines) or None

    @staticmethod
    def _prefix(event: Event) -> str:
        return f"[{event.at:6.2f}s] " + "  " * max(event.depth - 1, 0)

    def _text(self, event: Event) -> str | None:
        agent = event.agent or event.agent_id
        match event.detail:
            case ExecutionStart(task=task):
                return f"{agent}: started: {_clip(task, 70)!r}"
            case Spawn(child=child):
                return f"{agent}: spawned {child}"
            case LimitReached(reason=reason):
                return f"{agent}: budget exceeded: {reason}"
            case DeadlineReached(reason=reason):
                return f"{agent}: deadline: {reason}"
            case BudgetWait(reason=reason):
                return f"{agent}: {reason or 'waiting for budget'}"
            case RateWait(reason=reason):
                return f"{agent}: waiting: {reason}"
            case Retry(attempt=attempt, error=error, delay=delay):
                return f"{agent}: retry {attempt} in {delay:.1f} s after {_clip(error)}"
            case Restart(restarts=restarts, reason=reason, digest=digest):
                learns = " (it reads a digest of the attempts before)" if digest else ""
                return f"{agent}: restart {restarts} after: {_clip(reason, 120)}{learns}"
            case CompactionEnd(ok=ok, turns=turns, covered=covered, error=error):
                if ok:
                    return (
                        f"{agent}: folded {turns} old turn{'' if turns == 1 else 's'} into "
                        f"its summary (it covers {covered})"
                    )
                return f"{agent}: summary not updated: {_clip(error, 120)}"
            case ExecutionEnd() as end:
                return self._end(agent, event.execution_id, end)
            case ApprovalAsked(tool=tool, arguments=arguments, id=request_id):
                return f"{agent}: waiting for approval of {tool}({_clip(arguments)}) [{request_id}]"
            case ApprovalDecision(tool=tool, approved=approved, reason=reason):
                verdict = "approved" if approved else "denied"
                return f"{agent}: {tool} {verdict}" + (f": {reason}" if reason else "")
            case ToolProgress(tool=tool) as progress:
                return f"{agent}: {tool}: {_progress(progress)}"
            case ToolStart(tool=tool, arguments=arguments) if self.steps:
                self._calls.setdefault(event.execution_id, []).append((tool, arguments))
            case StepEnd() as step if self.steps:
                return self._step(agent, event.execution_id, step)
            case detail if type(detail) not in self._KNOWN:  # as it is
                return f"{agent}: {generic_line(detail)}"
        return None

    def _end(self, agent: str, execution_id: str, end: ExecutionEnd) -> str:
        self._calls.pop(execution_id, None)
        status, steps = end.status, end.steps
        text = (
            f"{agent}: {status} after {steps} step{'' if steps == 1 else 's'}, "
            f"{end.tokens:,} tokens"
        )
        if status in ("failed", "cancelled"):
            # Cut short, as a retry's error is: the result says it whole, once.
            text += f": {_clip(end.reason, _GENERIC_SHOWN)}"
        return text

    def _step(self, agent: str, execution_id: str, step: StepEnd) -> str:
        started = self._calls.pop(execution_id, [])
        shown: list[str] = []
        for name in step.tool_calls:
            found = next((call for call in started if call[0] == name), None)
            if found is None:
                shown.append(str(name))  # a subagent: its own lines follow
            else:
                started.remove(found)
                shown.append(f"{name}({_clip(found[1])})")
        index = step.step + 1
        cost = f"[{step.tokens:,} tokens, {step.seconds:.1f} s]"
        if shown:
            return f"{agent}: step {index}: {len(shown)} tool call(s): {', '.join(shown)} {cost}"
        return f"{agent}: step {index}: answered {cost}"
