"""Placement: where a subagent call runs, asked of the runtime's hosts.

``Delegation`` asks the runtime's hosts (``Runtime(hosts=...)``) what they can do,
never what class they are (as httpcore's pool asks a connection
``can_handle_request``): hosts that have a ``place`` method are a ``Placer`` and
are asked, for each subagent call, ``place(parent, agent, supervisor)``: a
``Placement`` on one of them, or None to run the call here. Hosts without it (and
no hosts) run every call here.

A ``Placement`` launches the child's subtree under its node (opened here, its
budget checked) and hands back the child's one reply (a ``ChildReply``, the surface
``Delegation`` reads of a local child's ``PendingReply`` too). ``RemoteHosts`` (and
``LocalHosts``, ``RayHosts``) implement it; another kind of host may implement it
from the public names alone. The core's side of it (``HostUnavailable``,
``ChildReply``, re-exported here, and how it asks) is ``actors._execution._children``, below
the ``Agent`` these protocols name.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

from .._execution._children import ChildReply, HostUnavailable

if TYPE_CHECKING:
    from anyio.abc import TaskGroup

    from fractor.runtime import Node, Supervisor

    from .._agent._agent import Agent

__all__ = ["ChildReply", "HostUnavailable", "Placement", "Placer"]


class Placement(Protocol):
    """A subagent call placed on a host, not started yet."""

    @property
    def host(self) -> str:
        """The host's name (shown in events and in errors)."""
        ...

    def launch(
        self, agent: Agent, text: str, node: Node, supervisor: Supervisor, task_group: TaskGroup
    ) -> ChildReply:
        """Run ``agent`` on ``text`` on the host as the subtree of ``node`` (just
        opened here), followed by a task in ``task_group``; its one reply, settled
        once after ``supervisor.close(node, ...)`` with how the subtree ended. Raises
        if it could not be started (the call is then refused, ``node`` closed).

        A task that names images and documents of its parent's context (its
        ``Task.parts``) is launched with them as one more keyword, ``parts=`` (a
        tuple of ``Image`` and ``Document``), and only then: a placement that takes
        them accepts ``*, parts=()`` (``RemoteHosts`` sends them to the host, each
        blob's bytes once); one written without parts runs every text-only call and
        refuses (by raising) a call that carries some. Its reply's ``Result.parts``
        go to the parent as the call's result."""
        ...


class Placer(Protocol):
    """Hosts that place subtrees: what the core asks of ``Runtime(hosts=...)``."""

    def place(self, parent: Node, agent: Agent, supervisor: Supervisor) -> Placement | None:
        """Where a subagent call of ``agent`` under ``parent`` runs: a placement on a
        host, or None (here). Raises ``HostUnavailable`` when it must run on a host
        and none can take it (the call is refused)."""
        ...
