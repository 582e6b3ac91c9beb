"""The latest line each running execution's model streams, read from the events.

A small reader of its own: ``fractor.actors.cli.LatestLines`` does more (tool progress,
parts) but sits in the command line's layer, above this package (see
tests/test_layers.py); once the page is moved to the edge's layer it can use that one.
"""

from __future__ import annotations

from fractor.runtime import Event

from .._observation._events import (
    ApprovalAsked,
    ApprovalDecision,
    ExecutionEnd,
    ModelText,
    StepStart,
)

__all__ = ["StreamedLines"]

#: How much of a line is kept (its tail).
WIDTH = 160


class StreamedLines:
    """``feed(event)`` each event; ``line(execution_id)`` the latest non-empty line."""

    def __init__(self, width: int = WIDTH) -> None:
        self.width = width
        self._text: dict[str, str] = {}

    def feed(self, event: Event) -> None:
        key = event.execution_id
        match event.detail:
            case ModelText(text=piece):
                text = self._text.get(key, "") + piece
                if len(text) > 4 * self.width:
                    text = text[-2 * self.width :]
                self._text[key] = text
            case ApprovalAsked(tool=tool, id=request_id):
                self._text[key] = f"\nwaiting for approval: {tool} [{request_id}]"
            case StepStart() | ExecutionEnd() | ApprovalDecision():
                self._text.pop(key, None)
            case _:
                pass

    def line(self, execution_id: str) -> str:
        text = self._text.get(execution_id, "")
        for line in reversed(text.splitlines()):
            if line.strip():
                last = line.strip()
                return last if len(last) <= self.width else "…" + last[-(self.width - 1) :]
        return ""
