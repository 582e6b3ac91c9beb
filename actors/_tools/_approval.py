"""Tool calls a person approves first: a human in the loop.

A tool marked ``@tool(approval=True)``, or a call an agent's ``approval`` policy names
(tool names, or a function of the call), is **held** before it runs: an
``ApprovalRequest`` is registered, announced (the runtime's events, the stream of the
ask, the live view) and waited for, while the other calls of the same step go on.
The application answers it through the ref of the agent it asked (or of the
top-level agent above a subagent that asked): ``ref.approvals()``,
``ref.approve(id)``, ``ref.deny(id, reason)``. The answer is served at once, past the
mailbox (the actor's control lane), not behind the running execution.

An approved call is charged and runs like any other; a denied one is not run and
its result, which the model reads, says so and why. The wait is an await inside the
execution: the deadline, a stop and a cancellation end it as they end anything else
(the call is then interrupted). The trace keeps the decision and the seconds waited
(``ToolOutcome.approval``, ``ToolOutcome.waited``).

Requests are kept per runtime (``approvals_of``), each tagged with the top-level
agent of its tree, which is the one whose ref may answer it. A subtree placed on
another host asks through its host (``forwarders``, by the subtree's top node): the
request is sent to the driver, which lists it in the tree of the top-level agent
there (``adopt``) and sends the decision back (``settle`` on the host); a wait that
ends first is withdrawn on both sides.
"""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable, Collection
from typing import TYPE_CHECKING, Protocol, TypeAlias

import anyio
import msgspec

from .._messages import ToolCall

if TYPE_CHECKING:
    from fractor.runtime import Node, Runtime

__all__ = [
    "Answer",
    "ApprovalError",
    "ApprovalPolicy",
    "ApprovalRequest",
    "Approvals",
    "Forwarder",
    "approvals_of",
    "approver",
]

ApprovalPolicy: TypeAlias = Callable[[ToolCall], bool] | Collection[str]
"""Which tool calls of an agent need approval: tool names, or a function of the call."""


class ApprovalRequest(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """A tool call waiting for a person's decision.

    ``path`` names the agents from the top of the tree down to the one that asked
    (``("lead", "researcher")``), ``depth`` its depth in the tree (1: a top-level
    agent), ``agent`` its name and ``agent_id`` the id of its actor, as
    ``Result.agent_id`` means it (a top-level agent's ``ref.id``; a subagent's actor
    is named by its one execution), ``execution_id`` its execution (its node in
    ``rt.tree()``); ``at`` is when it was asked (seconds since the runtime started).
    It is decided through the top-level agent's ref (``ref.approve(request)``).
    """

    id: str
    agent: str
    agent_id: str
    execution_id: str
    depth: int
    path: tuple[str, ...]
    call: ToolCall
    at: float


class ApprovalError(LookupError):
    """No pending approval has this id for this agent (already answered, never
    asked, or asked in another agent's tree)."""

    def __init__(self, request_id: str, agent_id: str) -> None:
        super().__init__(
            f"no approval {request_id!r} is waiting in the tree of agent {agent_id!r}: it was "
            "answered already, its call was interrupted, or it belongs to another agent "
            "(see ref.approvals())"
        )
        self.request_id = request_id
        self.agent_id = agent_id


class Forwarder(Protocol):
    """How a subtree on a host asks the driver (see the module), and where the
    subtree's top sits in the whole tree: the agents above it (``above``, from the
    top-level agent down) and its ``depth`` there."""

    @property
    def above(self) -> tuple[str, ...]: ...

    @property
    def depth(self) -> int: ...

    def ask(self, request: ApprovalRequest) -> None: ...

    def withdraw(self, request_id: str) -> None: ...


#: How the driver answers a request adopted from a host: (approved, reason).
Answer: TypeAlias = Callable[[bool, str], None]


class _Pending:
    __slots__ = ("answer", "decided", "done", "reason", "request", "top")

    def __init__(self, request: ApprovalRequest, top: str, answer: Answer | None = None) -> None:
        self.request = request
        self.top = top
        self.done = anyio.Event()
        self.decided = False
        self.reason = ""
        #: For a request adopted from a host: where the decision goes.
        self.answer = answer


class Approvals:
    """The approvals a runtime's trees wait for (one per runtime: ``approvals_of``)."""

    def __init__(self) -> None:
        self._pending: dict[str, _Pending] = {}
        self._ids = itertools.count(1)
        #: Before each id (a host's name: ids stay unique on the driver).
        self.prefix = ""
        #: On a host: how each subtree's calls ask the driver, by its top node's id.
        self.forwarders: dict[str, Forwarder] = {}

    def pending(self, top: str) -> tuple[ApprovalRequest, ...]:
        """The requests waiting in the tree of the top-level agent ``top``, oldest first."""
        return tuple(p.request for p in self._pending.values() if p.top == top)

    def decide(self, request_id: str, top: str, *, approved: bool, reason: str = "") -> None:
        """Answer a request of ``top``'s tree; ``ApprovalError`` if there is none."""
        pending = self._pending.get(request_id)
        if pending is None or pending.top != top:
            raise ApprovalError(request_id, top)
        del self._pending[request_id]
        if pending.answer is not None:  # asked on a host: the decision goes there
            pending.answer(approved, reason)
            return
        pending.decided = approved
        pending.reason = reason
        pending.done.set()

    def settle(self, request_id: str, *, approved: bool, reason: str) -> None:
        """On a host: the driver's decision on a request forwarded to it (none if the
        wait ended meanwhile)."""
        pending = self._pending.pop(request_id, None)
        if pending is not None:
            pending.decided = approved
            pending.reason = reason
            pending.done.set()

    def adopt(self, request: ApprovalRequest, top: str, answer: Answer) -> None:
        """On the driver: list a request a host forwarded, in the tree of ``top``."""
        self._pending[request.id] = _Pending(request, top, answer)

    def withdraw(self, request_id: str) -> None:
        """On the driver: a forwarded request whose wait ended on its host."""
        self._pending.pop(request_id, None)

    def open(
        self, node: Node, agent: str, agent_id: str, call: ToolCall, at: float
    ) -> tuple[ApprovalRequest, _Pending]:
        """Register a request for ``call`` of the execution at ``node``, named by its
        place in the whole tree (on a host, below the agents above its subtree)."""
        chain = list(node.chain())[:-1]  # without the supervisor's root
        forwarder = None
        for index, current in enumerate(chain):
            forwarder = self.forwarders.get(current.id)
            if forwarder is not None:  # a subtree run for another host's tree: its top
                del chain[index + 1 :]
                break
        top = chain[-1]
        path = tuple(n.name for n in reversed(chain))
        depth = node.depth
        if forwarder is not None:
            path = (*forwarder.above, *path)
            depth += forwarder.depth - top.depth
        request = ApprovalRequest(
            id=f"{self.prefix}approval-{next(self._ids)}",
            agent=agent,
            agent_id=agent_id,
            execution_id=node.id,
            depth=depth,
            path=path,
            call=call,
            at=at,
        )
        pending = _Pending(request, top.actor_id)
        self._pending[request.id] = pending
        return request, pending

    async def wait(self, pending: _Pending) -> tuple[bool, str, float]:
        """Wait for the decision: (approved, reason, seconds waited). If the wait is
        interrupted, the request is withdrawn."""
        began = time.perf_counter()
        try:
            await pending.done.wait()
        finally:
            self._pending.pop(pending.request.id, None)
        return pending.decided, pending.reason, time.perf_counter() - began


_by_runtime: weakref.WeakKeyDictionary[Runtime, Approvals] = weakref.WeakKeyDictionary()


def approvals_of(runtime: Runtime) -> Approvals:
    """The approvals of ``runtime``'s trees (made at the first use)."""
    found = _by_runtime.get(runtime)
    if found is None:
        found = _by_runtime[runtime] = Approvals()
    return found


def approver(
    policy: ApprovalPolicy | None, marked: Collection[str]
) -> Callable[[ToolCall], bool] | None:
    """One function telling whether a call needs approval, from an agent's policy and
    the names of its tools marked ``approval=True``; None when no call ever does."""
    if policy is None:
        if not marked:
            return None
        names = frozenset(marked)
        return lambda call: call.name in names
    if callable(policy):
        function = policy
        if not marked:
            return function
        names = frozenset(marked)
        return lambda call: call.name in names or bool(function(call))
    if isinstance(policy, str) or not all(isinstance(name, str) for name in policy):
        raise TypeError(
            f"approval must be tool names (a list of str) or a function of the call, got {policy!r}"
        )
    names = frozenset(policy) | frozenset(marked)
    return lambda call: call.name in names
