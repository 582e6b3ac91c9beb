"""The words of the live view (``ProgressLines``, ``LatestLines``, ``part_lines``,
``generic_line``) live in ``fractor.actors._observation._lines``, below both the
command line and the web view (``fractor.actors.ui``), which share them; they are
re-exported here for the command line's modules."""

from .._observation._lines import WAITING as WAITING
from .._observation._lines import LatestLines as LatestLines
from .._observation._lines import ProgressLines as ProgressLines
from .._observation._lines import generic_line as generic_line
from .._observation._lines import part_lines as part_lines

__all__ = ["WAITING", "LatestLines", "ProgressLines", "generic_line", "part_lines"]
