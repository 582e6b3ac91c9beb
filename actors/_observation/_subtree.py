"""What the agent layer keeps with a subtree of the tree, in its top node's ``layer``.

The kernel's ``Node`` holds one slot for the layer above (``Node.layer``), hands it to
every node opened below and never reads it. Here it holds a ``Subtree``: where the
subtree's executions leave themselves when they end, for the top execution to store
with its own trace (``traces``; None when nothing is stored), and who watches the
subtree's events (``watch``: the watcher of a streamed ask). A ``Subtree`` is replaced,
never changed, so a node that sets its own leaves its parent's as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

from fractor.runtime import Event, Node

__all__ = ["Subtree", "subtree", "with_traces", "with_watch"]


class Subtree:
    """The agent layer's part of a node (see the module)."""

    __slots__ = ("traces", "watch")

    def __init__(
        self, traces: list[Any] | None = None, watch: Callable[[Event], None] | None = None
    ) -> None:
        #: Where the executions of this subtree leave themselves when they end
        #: (``Execution``, or a trace shipped back by another host).
        self.traces = traces
        #: Called with each event of the subtree, whether or not anyone subscribes to
        #: the runtime's events.
        self.watch = watch


_NONE = Subtree()


def subtree(node: Node) -> Subtree:
    """What the agent layer keeps with ``node`` (a blank ``Subtree`` when nothing)."""
    layer = node.layer
    return _NONE if layer is None else cast("Subtree", layer)


def with_traces(node: Node, traces: list[Any] | None) -> None:
    """``node`` and the nodes opened below it leave their executions in ``traces``."""
    node.layer = Subtree(traces, subtree(node).watch)


def with_watch(node: Node, watch: Callable[[Event], None] | None) -> None:
    """``watch`` sees the events of ``node`` and of the nodes opened below it."""
    node.layer = Subtree(subtree(node).traces, watch)
