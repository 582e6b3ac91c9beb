"""Where Ray puts hosts among a cluster's nodes (``RayHosts(scheduling=)``), on a real
multi-node Ray cluster: ``ray.cluster_utils.Cluster`` starts three raylets (simulated
nodes, 4 CPUs each) on 127.0.0.1.

The cluster runs in a child process (this file run as a script), once for the module:
the tests' session Ray instance (``ray_instance``) lives in this process, and a driver
joins one Ray instance only. The script opens a runtime with 3 hosts under each
scheduling, reports where each host went (``RayHosts.nodes()``, which asks each host's
actor for ``ray.get_runtime_context().get_node_id()``) and what a ``"strict_spread"``
pool with more hosts than nodes does. It mostly waits on Ray's processes, for ~20 s:
the session's Ray instance starts it once that is up (``ClusterScript`` in
conftest.py), and it runs beside the tests before these, which read its report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import TYPE_CHECKING, Any

import pytest

from fractor.actors.integrations.ray import RayHosts, Scheduling

if TYPE_CHECKING:  # run as a script, this file is no module of the package
    from .conftest import ClusterScript

NODES = 3
#: How long the script may take: three raylets, three runtimes of three hosts each.
SCRIPT_SECONDS = 240


def start_script() -> subprocess.Popen[str]:
    """This file run as a script: it starts the cluster and prints its report."""
    return subprocess.Popen(
        [sys.executable, __file__],
        # Ray resolves 127.0.0.1 in a cluster's address to this machine's outward IP,
        # which its nodes here do not listen on; this keeps it the loopback address.
        env={**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


@pytest.fixture(scope="module")
def placed(cluster_script: ClusterScript) -> dict[str, Any]:
    """What the script reports: each scheduling's ``{host: node}``, the cluster's node
    ids, and the refusal of a pool too large for ``"strict_spread"``."""
    process = cluster_script.start()  # or started already, beside the tests before
    try:
        out, err = process.communicate(timeout=SCRIPT_SECONDS)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"the cluster script did not end in {SCRIPT_SECONDS} s:\n{err[-4000:]}")
    assert process.returncode == 0, err[-4000:]
    report: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return report


def test_the_cluster_has_three_nodes(placed: dict[str, Any]) -> None:
    assert len(set(placed["cluster"])) == NODES


@pytest.mark.parametrize("scheduling", ["spread", "strict_spread"])
def test_spreading_puts_three_hosts_on_three_nodes(placed: dict[str, Any], scheduling: str) -> None:
    nodes = placed[scheduling]
    assert sorted(nodes) == ["default-0", "default-1", "default-2"]
    assert set(nodes.values()) <= set(placed["cluster"])
    assert len(set(nodes.values())) == NODES, nodes


def test_the_default_is_rays_own_placement(placed: dict[str, Any]) -> None:
    # Ray's default fills a node up to about half its resources before it uses
    # another: measured here, three 1-CPU hosts on 4-CPU nodes took 2 nodes (two
    # hosts on one), as the issue found. Which nodes is Ray's choice: not asserted.
    nodes = placed["default"]
    assert sorted(nodes) == ["default-0", "default-1", "default-2"]
    assert set(nodes.values()) <= set(placed["cluster"])


def test_strict_spread_refuses_more_hosts_than_nodes(placed: dict[str, Any]) -> None:
    refusal = placed["too_many"]
    assert refusal.startswith("RuntimeError: pool 'default': Ray found no 4 distinct nodes")
    assert "scheduling='spread'" in refusal


def test_bad_schedulings_are_refused_at_once() -> None:
    with pytest.raises(ValueError, match="scheduling must be one of 'default', 'spread'"):
        RayHosts(3, scheduling="pack")  # type: ignore[arg-type]
    from fractor.actors.integrations.ray import HostPool

    with pytest.raises(ValueError, match="pool 'free' asks Ray for no resources"):
        RayHosts(pools={"free": HostPool(num_cpus=0)}, scheduling="strict_spread")
    # Without strict spreading, a host asking for nothing is Ray's business.
    assert RayHosts(pools={"free": HostPool(num_cpus=0)}, scheduling="spread").pools


async def _report() -> dict[str, Any]:
    import ray
    from ray.cluster_utils import Cluster

    from fractor.actors.integrations import ray as ray_hosts
    from fractor.runtime import Runtime

    node: dict[str, Any] = {"num_cpus": 4, "node_ip_address": "127.0.0.1"}
    cluster = Cluster(
        initialize_head=True,
        head_node_args={**node, "include_dashboard": False},
    )
    for _ in range(NODES - 1):
        cluster.add_node(**node)
    cluster.wait_for_nodes()
    ray.init(
        address=cluster.address,
        _node_ip_address="127.0.0.1",
        log_to_driver=False,
        configure_logging=False,
    )
    report: dict[str, Any] = {"cluster": [n["NodeID"] for n in ray.nodes() if n["Alive"]]}  # type: ignore[no-untyped-call]
    try:
        schedulings: tuple[Scheduling, ...] = ("default", "spread", "strict_spread")
        for scheduling in schedulings:
            hosts = RayHosts(NODES, scheduling=scheduling)
            async with Runtime(hosts=hosts):
                report[scheduling] = await hosts.nodes()
        # More hosts than nodes: refused once PLACEMENT_SECONDS passed, 1 s here (the
        # pools above had the default 30 s, however slow a loaded machine is).
        ray_hosts.PLACEMENT_SECONDS = 1.0
        try:
            async with Runtime(hosts=RayHosts(NODES + 1, scheduling="strict_spread")):
                report["too_many"] = "opened"
        except* RuntimeError as group:  # the runtime's task group wraps it
            (refusal,) = _leaves(group)
            report["too_many"] = f"RuntimeError: {refusal}"
    finally:
        ray.shutdown()
        cluster.shutdown()  # type: ignore[no-untyped-call]
    return report


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


if __name__ == "__main__":
    import anyio

    print(json.dumps(anyio.run(_report)))
