"""The model request in progress in a task, for a model built on another that a
user's model calls itself (``ReActModel.request`` inside the user's ``request``).

An agent hands a ``ModelAdapter`` its stages through ``request_via``: each inner
request is admitted there. A user's own model that calls a ``ReActModel`` directly
gives it no ``send``, so the agent's request in progress is kept in a slot of the
task's context (set by the budget stage while the request is in flight), and
``admitting`` finds it there: each inner request after the first is admitted
before it is sent, as one more request of the one in progress. This is the only
context variable of the request path, and it lives with the models so that no
model imports the execution.
"""

from __future__ import annotations

import functools
from contextvars import ContextVar
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from .._messages import ModelRequest, ModelResponse
    from ._protocol import Model, Send

__all__ = ["IN_CALL", "Admits", "CallSlot", "admitting"]


class Admits(Protocol):
    """A model request in flight that admits the requests of a model inside it."""

    async def admit(self, model: Model, request: ModelRequest) -> ModelResponse: ...


class CallSlot:
    """Where a task keeps its agent's model request in flight: one for each
    execution, bound to its task's context as it begins, so that a request sets
    ``call``, not the context variable, as it is sent."""

    __slots__ = ("call", "owner")

    def __init__(self, owner: object, call: Admits | None = None) -> None:
        #: The execution whose requests it keeps (its recorder): a task that
        #: inherited the slot of the execution that started it (a child actor's)
        #: never uses that one.
        self.owner = owner
        #: The request in flight (None: none is).
        self.call = call


#: The model request in flight in this context, if any, in its slot.
IN_CALL: ContextVar[CallSlot | None] = ContextVar("fractor_model_call", default=None)


def admitting(model: Model) -> Send:
    """How a model built on another sends its own requests to ``model`` when it is
    not given a ``send`` (``ReActModel.request``): admitted by the request in
    flight in this task, if there is one (``Admits.admit``), else
    ``model.request``."""
    slot = IN_CALL.get()
    call = slot.call if slot is not None else None
    if call is None:
        return model.request
    return functools.partial(call.admit, model)
