"""Hosts for the tests: in this process (``LocalHosts``) and on a real local Ray
instance, started once for the session on 127.0.0.1 and shut down at its end; and
the multi-node cluster of ``test_spreading.py``, started early in a child process."""

from __future__ import annotations

import signal
import subprocess
from collections.abc import Callable, Iterator

import pytest

from fractor.actors import LocalHosts, RemoteHosts


@pytest.fixture(scope="session")
def ray_instance() -> Iterator[None]:
    import ray  # the dev extra installs it (pyproject.toml): never skipped

    ray.init(
        num_cpus=8,
        include_dashboard=False,
        address="local",
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="session", autouse=True)
def cluster_script(request: pytest.FixtureRequest) -> Iterator[subprocess.Popen[str] | None]:
    """``test_spreading.py``'s cluster script, started with the first test of this
    folder when that module's tests are selected: its ~20 s, mostly waits on Ray's
    processes, pass beside the tests before it instead of after them. None when the
    module is not selected (its ``placed`` then starts the script itself)."""
    if not any(item.path.name == "test_spreading.py" for item in request.session.items):
        yield None
        return
    from .test_spreading import start_script

    process = start_script()
    try:
        yield process
    finally:
        if process.poll() is None:  # never read (a session ended early): stop it
            process.send_signal(signal.SIGINT)  # its finally shuts the cluster down
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()


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
