"""A local web view of a live runtime: ``async with serve_ui(rt) as ui: ...``.

The page, on 127.0.0.1 with a token in its URL, shows the live tree (each node's
agent, status, depth, what it waits for, its usage against every budget above it as
bars, the latest line it streamed) and the tool calls waiting for approval, which it
can approve or deny. See ``_server.py`` for how the server runs beside the runtime.
The same server shows a SQLite store's executions as timelines (``serve_stored``,
``fractor ui --db FILE``) and a tool's concurrency sweep as its chart grows
(``serve_sweep``, ``fractor bench --tool M:F --sweep ... --ui``).
It needs the ``ui`` extra (starlette, uvicorn): ``pip install 'fractor[ui]'``.
"""

from ._server import UI as UI
from ._server import StoredUI as StoredUI
from ._server import SweepUI as SweepUI
from ._server import SweepView as SweepView
from ._server import serve_stored as serve_stored
from ._server import serve_sweep as serve_sweep
from ._server import serve_ui as serve_ui
from ._sweep import sweep as sweep
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
    "StoredUI",
    "SweepUI",
    "SweepView",
    "TreeView",
    "bars",
    "serve_stored",
    "serve_sweep",
    "serve_ui",
    "sweep",
    "tree_view",
]
