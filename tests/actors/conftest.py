"""Fixtures of the agent tests: a loopback HTTP server, and no ambient configuration."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from . import sample_tools
from .loopback import LoopbackServer


@pytest.fixture
def server() -> Iterator[LoopbackServer]:
    with LoopbackServer() as running:
        yield running


@pytest.fixture(autouse=True)
def hermetic(monkeypatch: pytest.MonkeyPatch) -> None:
    """No key, endpoint or proxy of the machine reaches a test."""
    for var in (
        *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy"),
        *("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID", "OPENAI_PROJECT_ID"),
        *("ANTHROPIC_API_KEY", "ANTHROPIC_AUTH_TOKEN", "ANTHROPIC_BASE_URL"),
        *("ANTHROPIC_PROFILE", "ANTHROPIC_CUSTOM_HEADERS"),
    ):
        monkeypatch.delenv(var, raising=False)


@pytest.fixture(autouse=True)
def nothing_sent() -> None:
    """``sample_tools.send_email`` starts each test having sent nothing."""
    sample_tools.RAN.clear()
