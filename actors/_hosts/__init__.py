"""Hosts, where a runtime places subtrees besides its own process: placement behind a
protocol, the wire messages and a remote child's stand-in, the agent host on the far
side, and the local hosts (Ray's are an integration,
``fractor.actors.integrations.ray``). A new kind of host is written from outside with
the public ``fractor.actors.hosts``.

- ``_host.py``: An agent host: one event loop running many subtrees of other processes'
  trees.
- ``_hosts.py``: Hosts: where a runtime places subtrees besides its own process.
- ``_placing.py``: Placement: where a subagent call runs, asked of the runtime's hosts.
- ``_remote.py``: A subagent whose subtree runs on another host.

A private package, one of the folders by kind of ``fractor.actors``: nothing is imported
here, so importing one of its modules runs no other. The public names are re-exported by
``fractor.actors`` and ``fractor.actors.hosts``.
"""
