"""The web view's browser tests share one headless Chromium per worker (their
group runs on one worker: ``tests/conftest.py``), started once, as a real component
is; each test opens pages of its own in it and closes them (``Browser.lent``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from .browser import Browser, find_chromium


@pytest.fixture(scope="session")
def chromium_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Browser]:
    browser = Browser(find_chromium(), tmp_path_factory.mktemp("chromium") / "profile")
    try:
        yield browser
    finally:
        browser.quit()


@pytest.fixture
def chromium(chromium_process: Browser) -> Iterator[Browser]:
    """The worker's Chromium, lent to one test: the pages it opened are closed after."""
    browser = chromium_process.lent()
    try:
        yield browser
    finally:
        browser.close()
