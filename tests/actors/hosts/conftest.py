"""Hosts for the tests: in this process (``LocalHosts``) and on a real local Ray
instance, started once for the session on 127.0.0.1 and shut down at its end; and
the multi-node cluster of ``test_spreading.py`` in a child process, started early."""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest

from fractor.actors import LocalHosts, RemoteHosts


class ClusterScript:
    """``test_spreading.py``'s cluster script, run once: ~20 s, mostly waits on Ray's
    processes. When that module's tests are selected, the session's Ray instance
    starts it as soon as it is up itself (not at once with it), and it runs beside
    the tests before that module's; otherwise the module's first test starts it."""

    def __init__(self, *, early: bool) -> None:
        self.early = early
        self.process: subprocess.Popen[str] | None = None

    def start(self) -> subprocess.Popen[str]:
        if self.process is None:
            from .test_spreading import start_script

            self.process = start_script()
        return self.process


@pytest.fixture(scope="session")
def cluster_script(request: pytest.FixtureRequest) -> Iterator[ClusterScript]:
    """Early unless the module is not selected, or pytest-xdist shares the tests among
    workers (each would start it)."""
    selected = any(item.path.name == "test_spreading.py" for item in request.session.items)
    script = ClusterScript(early=selected and "PYTEST_XDIST_WORKER" not in os.environ)
    try:
        yield script
    finally:
        process = script.process
        if process is not None and process.poll() is None:  # never read: stop it
            process.send_signal(signal.SIGINT)  # its finally shuts the cluster down
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


@pytest.fixture(scope="session")
def ray_instance(cluster_script: ClusterScript) -> Iterator[None]:
    import ray  # the dev extra installs it (pyproject.toml): never skipped

    ray.init(
        num_cpus=8,
        include_dashboard=False,
        address="local",
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    if cluster_script.early:
        cluster_script.start()
    try:
        yield
    finally:
        ray.shutdown()


MakeHosts = Callable[..., RemoteHosts]


@pytest.fixture(params=["local", "ray"])
def make_hosts(request: pytest.FixtureRequest) -> MakeHosts:
    """A factory of hosts: ``make_hosts(2)`` or ``make_hosts(pools=...)``."""
    if request.param == "local":
        return LocalHosts
    request.getfixturevalue("ray_instance")
    from fractor.actors.integrations.ray import HostPool, RayHosts

    def ray_hosts(
        count: int = 2, *, pools: dict[str, int] | None = None, **options: object
    ) -> RemoteHosts:
        ray_pools = {name: HostPool(count=n) for name, n in pools.items()} if pools else None
        return RayHosts(count, pools=ray_pools, **options)  # type: ignore[arg-type]

    return ray_hosts
