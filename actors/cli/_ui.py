"""``--ui`` of ``fractor run`` and ``fractor demo``: the web view of the run's tree
(``fractor.actors.ui.serve_ui``) while it runs; its URL, with its token, is printed
once on stderr. The view needs the ``ui`` extra (Starlette and uvicorn)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from contextlib import AbstractAsyncContextManager
from typing import Any

from fractor.runtime import Runtime

__all__ = ["check_ui", "web_view"]


def check_ui() -> None:
    """Raise ``ValueError`` saying what to install when the web view cannot run here
    (asked before anything runs)."""
    try:
        from ..ui import serve_ui  # noqa: F401
    except ImportError as exc:
        raise ValueError(
            f"--ui needs the web view's extra: pip install 'fractor[ui]' ({exc})"
        ) from None


def web_view(
    rt: Runtime, on: bool, *, secrets: Iterable[str] = ()
) -> AbstractAsyncContextManager[Any]:
    """The web view of ``rt`` while the block runs (nothing when not ``on``)."""
    if not on:
        return contextlib.nullcontext()
    from ..ui import serve_ui

    return serve_ui(rt, secrets=tuple(secret for secret in secrets if secret))
