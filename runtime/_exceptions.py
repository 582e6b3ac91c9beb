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
    ├── BudgetExceeded                a hard limit of the supervisor's tree refused a
    │                                 charge: names the limit, the node that has it,
    │                                 and for tokens and cost what was needed and left
    └── InvalidUsage                  a model reported usage that cannot be true
                                      (also a ``ValueError``); never a refund

The ``actors`` package adds, under ``FractorError``: ``ToolDefinitionError`` (also a
``TypeError``), ``ScriptExhausted`` and ``MalformedAction``.

Errors are raised inside an actor and become values only at actor boundaries: a
handler that raises fails the pending ``ask`` with that very exception; the asker
never hangs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._budget import Usage

__all__ = [
    "ActorError",
    "ActorStopped",
    "AskTimeout",
    "BudgetExceeded",
    "DuplicateActor",
    "FractorError",
    "InvalidUsage",
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
    For tokens and cost, ``need`` is what the refused request needed at least (its
    input estimate plus a minimum output, ``need_detail`` says how it adds up) and
    ``left`` what the settled usage of that node still leaves: a refusal always has
    ``need > left``. Both are ``None`` for counters (steps, tool calls, agents, ...).
    """

    def __init__(
        self,
        limit: str,
        allowed: float,
        node_id: str,
        node_name: str,
        *,
        need: float | None = None,
        left: float | None = None,
        need_detail: str = "",
        why: str = "",
    ) -> None:
        message = f"{limit} limit of {_number(allowed)} reached"
        if need is not None and left is not None:
            detail = f" ({need_detail})" if need_detail else ""
            message += (
                f": the next request needs about {_number(need)}{detail}, "
                f"{_number(max(left, 0))} left"
            )
        elif why:
            message += f": {why}"
        super().__init__(f"{message} (budget of {node_name} {node_id!r})")
        self.limit = limit
        self.allowed = allowed
        self.node_id = node_id
        self.node_name = node_name
        self.need = need
        self.left = left
        self.need_detail = need_detail
        self.why = why


class InvalidUsage(FractorError, ValueError):
    """A model reported usage that cannot be true (negative counts, a cost that is not
    a finite number >= 0, more output than the request allowed). The request counts as
    failed; it is charged its whole reservation (``charged``), never refunded."""

    def __init__(self, model: str, problem: str, charged: Usage) -> None:
        shown = f"model {model!r}" if model else "the model"
        super().__init__(f"{shown} reported impossible usage: {problem}")
        self.model = model
        self.problem = problem
        self.charged = charged


def _number(value: float) -> str:
    """A limit or an amount as a person reads it: 4,000 tokens, 0.05 of a currency."""
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1):
        return f"{int(value):,}"
    return f"{value:.6g}"
