"""How a step's subagent calls start, as the agent core sees it: here, or placed on a
host (DESIGN.md section 1, "Subagents").

``Delegation`` (``actors._execution._delegation``) starts each child of a step. Here, it spawns
the actor of the subagent's definition, which the agent's actor hands down to its
execution's parts (a ``NewActor``: ``AgentActor`` itself), so that nothing below the
running agent imports it. On hosts that place subtrees (a ``Placer``, see
``actors._hosts._placing``, asked through ``placer_of``) a ``Placement`` launches it, and
hands back the child's one reply (a ``ChildReply``, the surface ``Delegation``
reads of a local child's ``PendingReply`` too).

The public ``Placer`` and ``Placement`` take the ``Agent`` a host kind is written
against; the core holds its subagents as the ``AgentDefinition`` below ``Agent``
(they are ``Agent`` instances when it runs), so it calls them through ``Place`` and
``Launch``, the same two calls typed with the definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, cast

from fractor.runtime import Actor

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from fractor.runtime import Node, Supervisor

    from .._agent._definition import AgentDefinition
    from .._parts import Media

__all__ = ["ChildReply", "HostUnavailable", "Launch", "NewActor", "Place", "placer_of"]

#: How a subagent call runs here: the actor of its definition (``AgentActor``), which
#: the parent's step spawns in its task group.
NewActor = Callable[["AgentDefinition"], Actor]


class HostUnavailable(Exception):
    """No live host can take a subtree pinned to a pool."""


class ChildReply(Protocol):
    """The one reply of a child, wherever it runs: it settles once, then calls back."""

    @property
    def error(self) -> BaseException | None:
        """Why the child stopped without an answer (None: it answered)."""
        ...

    def result(self) -> Any:
        """The child's ``Result`` (once settled without an error)."""
        ...

    def add_done_callback(self, callback: Callable[[Any], None]) -> None:
        """Call ``callback(reply)`` once the reply settles."""
        ...


class Launch(Protocol):
    """A ``Placement`` as the core calls it (see ``actors._hosts._placing.Placement``)."""

    @property
    def host(self) -> str: ...

    def launch(
        self,
        agent: AgentDefinition,
        text: str,
        node: Node,
        supervisor: Supervisor,
        task_group: TaskGroup,
        *,
        parts: tuple[Media, ...] = (),
    ) -> ChildReply: ...


#: ``Placer.place`` as the core calls it: a placement of a subagent call, or None.
Place = Callable[["Node", "AgentDefinition", "Supervisor"], "Launch | None"]


def placer_of(hosts: object) -> Place | None:
    """The ``place`` of ``hosts`` if they can place subtrees, else None: asked of what
    they can do, never of their class."""
    place = getattr(hosts, "place", None)
    if place is None or not callable(place):
        return None
    return cast("Place", place)
