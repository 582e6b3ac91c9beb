"""A ``FallbackModel``'s requests: each model of its chain through its own stages
in turn, until one answers (see ``actors._models._fallback``): each its own
request (its own lane, reservation, price and events), the chain moving on when
the one before cannot answer (``falls_back``; a rate limit that would make it wait
longer than the chain's ``max_wait`` or the deadline leaves)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import msgspec

from .._messages import exception_text
from .._models._fallback import falls_back
from .._observation._events import Retry
from ._chain import Chain

if TYPE_CHECKING:
    from .._agent._policy import RetryPolicy
    from .._execution._recording import Recorder
    from .._messages import ModelRequest, ModelResponse
    from .._models._fallback import FallbackModel

__all__ = ["Fallback"]


class Fallback:
    """The stages of each model of a ``FallbackModel``'s chain."""

    __slots__ = ("chains", "patience")

    def __init__(self, model: FallbackModel, retry: RetryPolicy, *, once: bool = False) -> None:
        self.chains = tuple(Chain(link, retry, once=once) for link in model.models)
        #: How long a model with one after it waits for its rate limit (within
        #: the deadline).
        self.patience = math.inf if model.max_wait is None else model.max_wait

    async def send(self, recorder: Recorder, request: ModelRequest) -> ModelResponse:
        chains = self.chains
        last = len(chains) - 1
        for index, chain in enumerate(chains):
            try:
                response = await chain.send(
                    recorder, request, None if index == last else self.patience
                )
            except Exception as exc:
                if index == last or not falls_back(exc, retried=True):
                    raise
                if recorder.observed:
                    recorder.emit(
                        Retry(
                            attempt=index + 1,
                            error=f"{chain.model.name} did not answer "
                            f"({exception_text(exc)[:200]}); "
                            f"falling back to {chains[index + 1].model.name}",
                            delay=0.0,
                        )
                    )
                continue
            if not response.model:  # named by the model that gave it
                response = msgspec.structs.replace(response, model=chain.model.name)
            return response
        raise AssertionError("unreachable: the last model answers or raises")
