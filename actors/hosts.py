"""What a new kind of host is written with, from outside this package.

The core places subagent calls by asking the runtime's hosts what they can do
(``Placer.place`` gives a ``Placement`` or None), never by checking their class: a
host kind of any shape implements those protocols (``fractor.actors`` exports them
too). One that speaks fractor's own wire, as ``LocalHosts`` and
``fractor.actors.integrations.ray.RayHosts`` do, subclasses ``RemoteHosts`` (its
``_open``, ``_receive`` and ``_shutdown``) and ``HostLink`` (``start``, ``send``),
and runs an ``AgentHost`` (made from a ``HostConfig``) on the far side of each
link. ``RayHosts`` is written from these names alone.
"""

from ._hosts._host import AgentHost as AgentHost
from ._hosts._host import HostConfig as HostConfig
from ._hosts._hosts import DEFAULT_POOL as DEFAULT_POOL
from ._hosts._hosts import LocalHosts as LocalHosts
from ._hosts._hosts import PlacementStrategy as PlacementStrategy
from ._hosts._hosts import RemoteHosts as RemoteHosts
from ._hosts._placing import ChildReply as ChildReply
from ._hosts._placing import HostUnavailable as HostUnavailable
from ._hosts._placing import Placement as Placement
from ._hosts._placing import Placer as Placer
from ._hosts._remote import HostLink as HostLink
from ._messages import exception_text as exception_text

__all__ = [
    "DEFAULT_POOL",
    "AgentHost",
    "ChildReply",
    "HostConfig",
    "HostLink",
    "HostUnavailable",
    "LocalHosts",
    "Placement",
    "PlacementStrategy",
    "Placer",
    "RemoteHosts",
    "exception_text",
]
