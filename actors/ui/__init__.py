"""A local web view of a live runtime: ``async with serve_ui(rt) as ui: ...``.

The page, on 127.0.0.1 with a token in its URL, shows the live tree (each node's
agent, status, depth, what it waits for, its usage against every budget above it as
bars, the latest line it streamed) and the tool calls waiting for approval, which it
can approve or deny. See ``_server.py`` for how the server runs beside the runtime.
It needs the ``ui`` extra (starlette, uvicorn): ``pip install 'fractor[ui]'``.
"""

from ._server import UI as UI
from ._server import serve_ui as serve_ui
from ._view import ApprovalView as ApprovalView
from ._view import Bar as Bar
from ._view import Held as Held
from ._view import NodeView as NodeView
from ._view import TreeView as TreeView
from ._view import bars as bars
from ._view import tree_view as tree_view

__all__ = [
    "UI",
    "ApprovalView",
    "Bar",
    "Held",
    "NodeView",
    "TreeView",
    "bars",
    "serve_ui",
    "tree_view",
]
