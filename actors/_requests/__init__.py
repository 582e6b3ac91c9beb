"""The request path: how a model request of an execution goes to its model, as a
stack of stages built once per agent and model (``build``).

- ``_call.py``: the request on its way down (``Call``), what a stage is (``Stage``).
- ``_retry.py``: retries, by the agent's ``RetryPolicy``.
- ``_budget.py``: the tree's budget: reserve, settle, ask again after a cut.
- ``_rate.py``: the model's rate lane: its limits and its server's pauses.
- ``_observe.py``: the request's events, for whoever observes.
- ``_wire.py``: the model itself.
- ``_chain.py``: one model's stages, in their order.
- ``_fallback.py``: a ``FallbackModel``'s chains, in turn.
- ``_stack.py``: ``build``, and the ``Adapter`` of a model built on another.

Each stage has one method, ``send(call)``, and knows the one below it (``next``).
"""

from ._budget import bind_calls
from ._call import Call, Next, Stage
from ._rate import wait_for_rate
from ._stack import Requests, build

__all__ = ["Call", "Next", "Requests", "Stage", "bind_calls", "build", "wait_for_rate"]
