"""The one exception tree of fractor.

::

    FractorError                      base of every error fractor raises
    ├── ActorError                    something about one actor (carries ``actor_id``)
    │   ├── ActorStopped              the actor is no longer running: its pending and
    │   │                             future asks fail with this, exactly once each
    │   ├── MailboxFull               a ``*_nowait`` send found the mailbox at capacity
    │   ├── UnknownMessage            the actor does not handle this message type
    │   │                             (also a ``TypeError``)
    │   ├── AskTimeout                no reply within the ask's timeout
    │   │                             (also a ``TimeoutError``)
    │   └── DuplicateActor            an actor id already in use (also a ``ValueError``)
    ├── RuntimeClosed                 the ``Runtime`` is not running (not entered yet,
    │                                 or already left)
    ├── StoreError                    a store could not load or save: names the store
    │                                 and the operation; a failed save wrote nothing
    └── BudgetExceeded                a hard limit of the supervisor's tree refused a
                                      charge: names the limit and the node that has it

The ``actors`` package adds, under ``FractorError``: ``ToolDefinitionError`` (also a
``TypeError``), ``ScriptExhausted`` and ``MalformedAction``.

Errors are raised inside an actor and become values only at actor boundaries: a
handler that raises fails the pending ``ask`` with that very exception; the asker
never hangs.
"""

from __future__ import annotations

__all__ = [
    "ActorError",
    "ActorStopped",
    "AskTimeout",
    "BudgetExceeded",
    "DuplicateActor",
    "FractorError",
    "MailboxFull",
    "RuntimeClosed",
    "StoreError",
    "UnknownMessage",
]


class FractorError(Exception):
    """Base class of every error raised by fractor."""


class ActorError(FractorError):
    """An error about one actor, named by ``actor_id``."""

    def __init__(self, message: str, *, actor_id: str) -> None:
        super().__init__(message)
        self.actor_id = actor_id


class ActorStopped(ActorError):
    """The actor has stopped; it will never handle this message."""

    def __init__(self, actor_id: str, reason: str) -> None:
        super().__init__(f"actor {actor_id!r} is stopped ({reason})", actor_id=actor_id)
        self.reason = reason


class MailboxFull(ActorError):
    """A non-blocking send found the actor's mailbox at capacity."""

    def __init__(self, actor_id: str, capacity: int) -> None:
        super().__init__(
            f"mailbox of actor {actor_id!r} is full ({capacity} messages queued); "
            "use the awaitable variant to wait for room",
            actor_id=actor_id,
        )
        self.capacity = capacity


class UnknownMessage(ActorError, TypeError):
    """The actor was sent a message type it does not handle."""

    def __init__(self, actor_id: str, message: object, expected: str = "") -> None:
        kind = type(message).__qualname__
        hint = f"; it accepts {expected}" if expected else ""
        super().__init__(
            f"actor {actor_id!r} does not handle messages of type {kind}{hint}",
            actor_id=actor_id,
        )
        self.message_type = type(message)


class AskTimeout(ActorError, TimeoutError):
    """No reply arrived within the timeout given to ``ask``."""

    def __init__(self, actor_id: str, timeout: float, message: object) -> None:
        super().__init__(
            f"actor {actor_id!r} did not answer a {type(message).__qualname__} "
            f"within {timeout:g} s",
            actor_id=actor_id,
        )
        self.timeout = timeout


class DuplicateActor(ActorError, ValueError):
    """An actor id is already taken by a live actor of this runtime."""

    def __init__(self, actor_id: str) -> None:
        super().__init__(f"an actor with id {actor_id!r} is already running", actor_id=actor_id)


class RuntimeClosed(FractorError):
    """The runtime is not running: enter ``async with Runtime()`` first."""

    def __init__(self, state: str) -> None:
        super().__init__(f"the runtime is {state}; use it inside 'async with Runtime() as rt:'")
        self.state = state


class StoreError(FractorError):
    """A store could not do what was asked. A failed save wrote nothing at all.

    ``store`` names the store (with its path, if it has one), ``operation`` what was
    asked of it, ``reason`` what went wrong.
    """

    def __init__(self, store: str, operation: str, reason: str) -> None:
        super().__init__(f"{store}: cannot {operation}: {reason}")
        self.store = store
        self.operation = operation
        self.reason = reason


class BudgetExceeded(FractorError):
    """A hard limit refused a charge: nothing was spent beyond it.

    ``limit`` is the ``Budget`` field; ``node_id`` and ``node_name`` name the node whose
    budget it is (the node itself or an ancestor); ``allowed`` is the limit's value.
    """

    def __init__(self, limit: str, allowed: float, node_id: str, node_name: str) -> None:
        shown = f"{allowed:g}" if isinstance(allowed, float) else str(allowed)
        super().__init__(f"{limit} limit of {shown} reached (budget of {node_name} {node_id!r})")
        self.limit = limit
        self.allowed = allowed
        self.node_id = node_id
        self.node_name = node_name
