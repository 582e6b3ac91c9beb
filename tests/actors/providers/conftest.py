"""The ``wire`` fixture: a provider test runs once per wire format."""

from __future__ import annotations

import pytest

from .wires import ANTHROPIC, ANTHROPIC_TRIO_UNSUPPORTED, OPENAI, Wire


@pytest.fixture(params=[OPENAI, ANTHROPIC], ids=lambda wire: wire.provider)
def wire(request: pytest.FixtureRequest) -> Wire:
    chosen: Wire = request.param
    if (
        chosen is ANTHROPIC
        and ANTHROPIC_TRIO_UNSUPPORTED
        and "anyio_backend" in request.fixturenames
        and request.getfixturevalue("anyio_backend") == "trio"
    ):
        pytest.skip("the installed anthropic SDK is older than 0.46: asyncio only")
    return chosen
