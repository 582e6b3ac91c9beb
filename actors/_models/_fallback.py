"""A model that falls back: a chain of models, the first that answers wins.

``FallbackModel(primary, cheaper, local)``: an agent sends each request to the first
model of the chain; it goes to the next one when the one before cannot answer it:

- it does not fit that model's context (``ProviderError.kind`` "context_length"), is
  larger than its rate limit allows at all ("too_large"), or carries an image or a
  document that model does not take ("content": a text-only endpoint): at once;
- its server failed or was unreachable, after that model's retries (the agent's
  ``RetryPolicy``): a server error, a timeout (a stream that stalls past it too), a
  connection refused or lost, a stream that broke off part-way, an answer that is
  not the wire format's (a 200 with an HTML page);
- its rate limit would make it wait longer than ``max_wait`` seconds or than the
  execution's deadline leaves: what the server asked (a 429's Retry-After, or the
  reset of a count its headers say is spent), the pause of the model's lane, or the
  limits declared for it (``Runtime(rate_limits=...)``: a window that has no room
  for the request before then, or a concurrency that frees no slot in time).

Anything else (a rejected request, a bad key, a budget that is spent) is the
answer, as with one model. Each attempt is its own request for the supervisor: its
own lane and budget reservation, charged at its own model's price, its own
``request_start`` and ``request_end`` events and span (which name the model); the
trace's request events say which model answered.

Outside an agent (``request``), the chain is tried in order with no retries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .._messages import ModelRequest, ModelResponse
    from ._fakes import Sink
    from ._protocol import Model

__all__ = ["FALLBACK_KINDS", "FallbackModel", "falls_back"]

#: The kinds of provider errors (``ProviderError.kind``) that go to the next model of
#: the chain at once, and those that go there once the model's retries are spent.
FALLBACK_KINDS = frozenset({"context_length", "too_large", "content"})
_AFTER_RETRIES = frozenset(
    {
        "server",
        "busy",
        "rate_limited",
        "timeout",
        "unreachable",
        "connection",
        "broken",
        "malformed",
    }
)


class FallbackModel:
    """A chain of models (see the module's docstring)."""

    def __init__(self, *models: Model, max_wait: float | None = None) -> None:
        if len(models) < 2:
            raise ValueError(f"a FallbackModel needs 2 models or more, got {len(models)}")
        for model in models:
            if not callable(getattr(model, "request", None)) or not isinstance(
                getattr(model, "name", None), str
            ):
                raise TypeError(f"every link of a FallbackModel must be a Model, got {model!r}")
            if callable(getattr(model, "request_via", None)):
                raise TypeError(
                    f"a FallbackModel's links are models that answer themselves; "
                    f"{model.name!r} is built on another (put the FallbackModel inside it)"
                )
        if max_wait is not None and not max_wait >= 0:
            raise ValueError(f"max_wait must be >= 0 seconds, got {max_wait!r}")
        self.models: Sequence[Model] = tuple(models)
        self.max_wait = max_wait

    @property
    def name(self) -> str:
        """The chain's name: its models' names, in order."""
        return " | ".join(model.name for model in self.models)

    @property
    def streaming(self) -> bool:
        """Whether every model of the chain streams (then the agent streams)."""
        return all(getattr(model, "streaming", False) for model in self.models)

    def estimate_tokens(self, request: ModelRequest) -> int:
        return self.models[0].estimate_tokens(request)

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Each model in turn, with no retries, until one answers."""
        for model in self.models[:-1]:
            try:
                return await model.request(request)
            except Exception as exc:
                if not falls_back(exc, retried=True):
                    raise
        return await self.models[-1].request(request)

    async def stream(self, request: ModelRequest, sink: Sink) -> ModelResponse:
        """As ``request``, streaming (the text of a model that failed part-way was
        handed over already: the next one's follows it)."""
        for model in self.models[:-1]:
            try:
                return await model.stream(request, sink)  # type: ignore[attr-defined,no-any-return]
            except Exception as exc:
                if not falls_back(exc, retried=True):
                    raise
        return await self.models[-1].stream(request, sink)  # type: ignore[attr-defined,no-any-return]

    async def aclose(self) -> None:
        for model in self.models:
            await model.aclose()

    def __repr__(self) -> str:
        return f"FallbackModel({', '.join(repr(model.name) for model in self.models)})"


def falls_back(error: BaseException, *, retried: bool) -> bool:
    """Whether a request that failed with ``error`` goes to the next model of a
    chain: at once for what no retry mends, and once the model's retries are spent
    (``retried``) for a failing or unreachable server."""
    kind = getattr(error, "kind", "")
    if kind in FALLBACK_KINDS:
        return True
    if not retried:
        return False
    if kind in _AFTER_RETRIES:
        return True
    # A failure with no status (a timeout, a connection refused) of a provider.
    return getattr(error, "status", 0) is None and bool(getattr(error, "retryable", False))
