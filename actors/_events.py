"""The events of the agent layer: how an execution's events are made.

``agent_event`` is the one place an agent's event is built (the execution's ``emit``
calls it), so the shape of events can change here alone.
"""

from __future__ import annotations

from typing import Any

from fractor.runtime import Event, EventKind

__all__ = ["agent_event"]


def agent_event(
    kind: EventKind,
    *,
    at: float,
    agent: str,
    agent_id: str,
    execution_id: str,
    parent_id: str,
    depth: int,
    detail: dict[str, Any],
) -> Event:
    """One event of an execution of ``agent``."""
    return Event(
        kind=kind,
        at=at,
        agent=agent,
        agent_id=agent_id,
        execution_id=execution_id,
        parent_id=parent_id,
        depth=depth,
        detail=detail,
    )
