"""The kernel's low-level waiting primitives, for code built on it (as ``anyio.lowlevel``).

Most code needs none of this: ``Runtime``, ``ActorRef`` and the mailboxes park and
wake their tasks themselves. A layer above the kernel that keeps its own waiters on a
hot path (the ``actors`` package's execution, waiting for its children's results)
uses the same cheap ones the kernel does:

- ``new_waiter()`` makes a ``Waiter`` for the calling task; ``park(waiter)`` is what to
  await until another task calls ``wake(waiter)`` (at most once).
- ``clock()`` is the running backend's clock as a plain function, looked up once.

See ``runtime._waiter`` for why a waiter is a bare future on asyncio.

And the ledger's parts, for a layer that runs subtrees on other hosts (see
``runtime._ledger``): ``HeldUp`` (a charge must wait for headroom held by a lease:
``Supervisor.charge_waiting`` and ``open_waiting`` wait for it), ``Lender``, and the
messages that cross between hosts: ``Tally``, ``Want``, ``Refusal``.

And the rate limits' parts, for the layer that sends model requests (see
``runtime._rates``): ``Rates`` (``Supervisor.rates``), a model's ``Lane``, and the
``Pass`` a request takes of it.
"""

from ._lease import LEASED as LEASED
from ._lease import HeldUp as HeldUp
from ._lease import Lease as Lease
from ._lease import Lender as Lender
from ._lease import Refusal as Refusal
from ._lease import Tally as Tally
from ._lease import Want as Want
from ._ledger import Ledger as Ledger
from ._rates import DIMENSIONS as DIMENSIONS
from ._rates import TOOL_LANE as TOOL_LANE
from ._rates import Dimension as Dimension
from ._rates import Lane as Lane
from ._rates import Pass as Pass
from ._rates import Rates as Rates
from ._waiter import Waiter as Waiter
from ._waiter import clock as clock
from ._waiter import new_waiter as new_waiter
from ._waiter import park as park
from ._waiter import wake as wake

__all__ = [
    "DIMENSIONS",
    "LEASED",
    "TOOL_LANE",
    "Dimension",
    "HeldUp",
    "Lane",
    "Lease",
    "Ledger",
    "Lender",
    "Pass",
    "Rates",
    "Refusal",
    "Tally",
    "Waiter",
    "Want",
    "clock",
    "new_waiter",
    "park",
    "wake",
]
