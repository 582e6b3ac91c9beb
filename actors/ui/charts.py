"""The pure renderers of the web view, for the page's server and the command line.

Nothing here serves or opens anything: each function returns a model or a
self-contained SVG (or HTML) document as text.

- Stored traces as a timeline (``_timeline.py``): ``build_timeline(traces)`` gives a
  ``Timeline`` of ``Row``s and ``Bar``s on one time axis; ``render_timeline_svg`` and
  ``render_timeline_html`` draw it (or the traces directly).
- A tool's throughput against concurrency (``_sweep.py``): ``await sweep(target,
  levels, calls=N)`` gives a ``SweepReport`` with its knee; ``render_sweep_svg`` and
  ``format_sweep_table`` show it; ``parse_levels`` reads ``1,2,4,...,64``.
"""

from ._sweep import KNEE_GAIN as KNEE_GAIN
from ._sweep import SweepInputError as SweepInputError
from ._sweep import SweepLevel as SweepLevel
from ._sweep import SweepReport as SweepReport
from ._sweep import as_tool as as_tool
from ._sweep import find_knee as find_knee
from ._sweep import format_sweep_table as format_sweep_table
from ._sweep import parse_levels as parse_levels
from ._sweep import render_sweep_svg as render_sweep_svg
from ._sweep import sweep as sweep
from ._timeline import Bar as Bar
from ._timeline import Row as Row
from ._timeline import Timeline as Timeline
from ._timeline import build_timeline as build_timeline
from ._timeline import render_timeline_html as render_timeline_html
from ._timeline import render_timeline_svg as render_timeline_svg

__all__ = [
    "KNEE_GAIN",
    "Bar",
    "Row",
    "SweepInputError",
    "SweepLevel",
    "SweepReport",
    "Timeline",
    "as_tool",
    "build_timeline",
    "find_knee",
    "format_sweep_table",
    "parse_levels",
    "render_sweep_svg",
    "render_timeline_html",
    "render_timeline_svg",
    "sweep",
]
