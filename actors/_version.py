"""The installed ``fractor`` distribution's version, read once: ``fractor --version``,
the MCP client's ``clientInfo`` and a served agent's ``serverInfo`` say it."""

from __future__ import annotations

import importlib.metadata

try:
    VERSION = importlib.metadata.version("fractor")
except importlib.metadata.PackageNotFoundError:  # a source tree, not installed
    VERSION = "0+unknown"

__all__ = ["VERSION"]
