"""Every async test runs on both anyio backends. The README's examples that start Ray
start with the session's first test, as scripts, and run beside the tests before
``tests/test_readme.py``, which reads what they printed."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fractor.runtime import MemoryStore, SQLiteStore, Store


@pytest.fixture(params=["asyncio", "trio"])
def anyio_backend(request: pytest.FixtureRequest) -> str:
    backend: str = request.param
    return backend


@pytest.fixture(scope="session", autouse=True)
def early_readme_scripts(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[int, subprocess.Popen[str]]]:
    """The README's examples that start Ray (``STARTING_RAY`` in test_readme.py), by
    index, started as scripts if the examples run as scripts in this session: their
    ~15 s, mostly waits on Ray's processes, pass beside the tests before them instead
    of at the end. Empty when those tests are not selected, or when pytest-xdist
    shares the tests among workers (each would start them)."""
    if "PYTEST_XDIST_WORKER" in os.environ or not any(
        item.path.name == "test_readme.py" and item.name.startswith("test_readme_example_runs_as")
        for item in request.session.items
    ):
        yield {}
        return
    from .test_readme import STARTING_RAY, started

    with started(STARTING_RAY, tmp_path_factory) as processes:
        yield processes


#: Makes a store (see ``make_store``).
MakeStore = Callable[[], Store]


@pytest.fixture(params=["memory", "sqlite"])
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> MakeStore:
    """Makes a store, each time the same one as if it were a file: one ``MemoryStore``,
    or a ``SQLiteStore`` on one file of the test's own (a second store made is
    another process's view of the same data)."""
    if request.param == "memory":
        shared = MemoryStore()
        return lambda: shared
    return lambda: SQLiteStore(tmp_path / "store.db")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Under pytest-xdist (``--dist loadgroup``) the tests that share something costly
    run on one worker, which starts it once: the Ray tests of a group share the
    worker's Ray instance (~5 s and ~1 GiB each), the browser tests run one Chromium
    at a time (two at once on two cores make both slow), and a module whose fixture
    starts its component once for the module (the README's scripts, the wheel, an
    MCP server) runs whole on one worker instead of starting it on each. (Without
    pytest-xdist, ``-p no:xdist``, there are no workers and no groups to mark.)"""
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        params = callspec.params if callspec is not None else {}
        names = getattr(item, "fixturenames", ())
        module = item.path.stem
        if module in WHOLE_MODULES:
            item.add_marker(pytest.mark.xdist_group(module))
        elif "ray_instance" in names or params.get("make_hosts") == "ray":
            item.add_marker(pytest.mark.xdist_group(RAY_GROUPS.get(module, "ray")))
        elif module in ("test_browser", "test_browser_big"):
            item.add_marker(pytest.mark.xdist_group("browser"))


#: Three Ray instances at most, each for about a third of the Ray tests (measured
#: under the parallel run: test_hosts 299 s, test_lease_properties 203 s, the rest
#: 162 s; in one group they were the suite's longest path, 454 s).
RAY_GROUPS = {"test_hosts": "ray-hosts", "test_lease_properties": "ray-properties"}
#: Modules with a module-scoped fixture that starts something for all their tests.
WHOLE_MODULES = frozenset(
    {"test_readme", "test_packaging", "test_mcp_tools", "test_mcp_reference", "test_spreading"}
)
