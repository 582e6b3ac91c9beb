"""Hosts for the tests: in this process (``LocalHosts``) and on a real local Ray
instance, started once for the session on 127.0.0.1 and shut down at its end."""

from __future__ import annotations

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
