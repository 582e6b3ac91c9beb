"""What the live view writes in words: plain progress lines, one per event that
matters (``ProgressLines``, for a pipe, CI or a dumb terminal), and the latest line
each running agent's model streamed (``LatestLines``, shown under it in the tree).
Both are pure: they read events and return text.
"""

from __future__ import annotations

from fractor.runtime import Event

__all__ = ["LatestLines", "ProgressLines"]

#: How many characters of a tool call's arguments a step line shows.
_ARGUMENTS_SHOWN = 80
#: How many characters of an agent's latest streamed line the tree shows.
_LINE_SHOWN = 100


class LatestLines:
    """The latest line of text each running execution's model is streaming, from the
    runtime's events ("text"): what the live tree shows under a running agent.

    A step's request starts a new line; an execution's end forgets it. Only the
    tail of a long line is kept (``width`` characters).
    """

    def __init__(self, width: int = _LINE_SHOWN) -> None:
        self.width = width
        self._text: dict[str, str] = {}

    def feed(self, event: Event) -> None:
        kind = event.kind
        if kind == "text":
            key = event.execution_id
            text = self._text.get(key, "") + str(event.detail.get("text", ""))
            if len(text) > 4 * self.width:
                text = text[-2 * self.width :]
            self._text[key] = text
        elif kind == "approval_request":
            detail = event.detail
            self._text[event.execution_id] = (
                f"\n⧗ waiting for approval: {detail.get('tool', '?')} [{detail.get('id', '?')}]"
            )
        elif kind in ("step_start", "retry", "execution_end", "approval_decision"):
            self._text.pop(event.execution_id, None)  # a new line, or none

    def line(self, execution_id: str) -> str:
        """The latest non-empty line ``execution_id`` streamed ("" if none), its tail
        if it is longer than ``width``."""
        text = self._text.get(execution_id, "")
        lines = [line for line in text.splitlines() if line.strip()]
        if not lines:
            return ""
        last = lines[-1].strip()
        return last if len(last) <= self.width else "…" + last[-(self.width - 1) :]

    def __len__(self) -> int:
        return len(self._text)


def _clip(text: str, limit: int = _ARGUMENTS_SHOWN) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


class ProgressLines:
    """Turns events into plain progress lines: ``line(event)`` is the line or None.

    One line per execution start and end, spawn, budget wait, budget stop, deadline,
    retry and restart; with ``steps=True`` also one per model step (its tool calls with their
    arguments, tokens and time). Lines are indented by depth and start with the
    seconds since the runtime started.
    """

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
        return "\n".join(lines) or None

    @staticmethod
    def _prefix(event: Event) -> str:
        return f"[{event.at:6.2f}s] " + "  " * max(event.depth - 1, 0)

    def _text(self, event: Event) -> str | None:
        detail = event.detail
        agent = event.agent or event.agent_id
        match event.kind:
            case "execution_start":
                return f"{agent}: started: {_clip(str(detail.get('task', '')), 70)!r}"
            case "spawn":
                return f"{agent}: spawned {detail.get('child', '?')}"
            case "budget_exceeded":
                return f"{agent}: budget exceeded: {detail.get('reason', '')}"
            case "deadline":
                return f"{agent}: deadline: {detail.get('reason', '')}"
            case "budget_wait":
                return f"{agent}: {detail.get('reason', 'waiting for budget')}"
            case "retry":
                delay = float(detail.get("delay", 0.0))
                return (
                    f"{agent}: retry {detail.get('attempt', '?')} in {delay:.1f} s "
                    f"after {_clip(str(detail.get('error', '')))}"
                )
            case "restart":
                learns = (
                    " (it reads a digest of the attempts before)" if detail.get("digest") else ""
                )
                return (
                    f"{agent}: restart {detail.get('restarts', '?')} after: "
                    f"{_clip(str(detail.get('reason', '')), 120)}{learns}"
                )
            case "compaction":
                turns = int(detail.get("turns", 0))
                if detail.get("ok"):
                    return (
                        f"{agent}: folded {turns} old turn{'' if turns == 1 else 's'} into "
                        f"its summary (it covers {detail.get('covered', '?')})"
                    )
                return f"{agent}: summary not updated: {_clip(str(detail.get('error', '')), 120)}"
            case "execution_end":
                return self._end(agent, event)
            case "approval_request":
                return (
                    f"{agent}: waiting for approval of {detail.get('tool', '?')}"
                    f"({_clip(str(detail.get('arguments', '')))}) [{detail.get('id', '?')}]"
                )
            case "approval_decision":
                verdict = "approved" if detail.get("approved") else "denied"
                reason = detail.get("reason", "")
                return f"{agent}: {detail.get('tool', '?')} {verdict}" + (
                    f": {reason}" if reason else ""
                )
            case "tool_start" if self.steps:
                calls = self._calls.setdefault(event.execution_id, [])
                calls.append((str(detail.get("tool", "")), str(detail.get("arguments", ""))))
            case "step_end" if self.steps:
                return self._step(agent, event)
        return None

    def _end(self, agent: str, event: Event) -> str:
        self._calls.pop(event.execution_id, None)
        detail = event.detail
        status = str(detail.get("status", "?"))
        steps = int(detail.get("steps", 0))
        tokens = int(detail.get("tokens", 0))
        text = f"{agent}: {status} after {steps} step{'' if steps == 1 else 's'}, {tokens:,} tokens"
        if status in ("failed", "cancelled"):
            text += f": {detail.get('reason', '')}"
        return text

    def _step(self, agent: str, event: Event) -> str:
        detail = event.detail
        started = self._calls.pop(event.execution_id, [])
        shown: list[str] = []
        for name in detail.get("tool_calls", ()):
            found = next((call for call in started if call[0] == name), None)
            if found is None:
                shown.append(str(name))  # a subagent: its own lines follow
            else:
                started.remove(found)
                shown.append(f"{name}({_clip(found[1])})")
        index = int(detail.get("step", 0)) + 1
        cost = f"[{int(detail.get('tokens', 0)):,} tokens, {float(detail.get('seconds', 0)):.1f} s]"
        if shown:
            return f"{agent}: step {index}: {len(shown)} tool call(s): {', '.join(shown)} {cost}"
        return f"{agent}: step {index}: answered {cost}"
