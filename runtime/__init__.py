"""fractor's actor kernel: actors with private bounded mailboxes in one task group.

It knows nothing about LLMs; the ``actors`` package builds agents on it.
"""

from ._actor import Actor as Actor
from ._actor import ActorContext as ActorContext
from ._actor import FailurePolicy as FailurePolicy
from ._actor import Spawnable as Spawnable
from ._admission import OutputSharing as OutputSharing
from ._admission import Reservation as Reservation
from ._budget import Budget as Budget
from ._budget import Caps as Caps
from ._budget import Price as Price
from ._budget import Usage as Usage
from ._codec import decode_json as decode_json
from ._codec import decode_msgpack as decode_msgpack
from ._codec import encode_json as encode_json
from ._codec import encode_msgpack as encode_msgpack
from ._events import ActorStop as ActorStop
from ._events import Event as Event
from ._events import EventBus as EventBus
from ._events import EventDetail as EventDetail
from ._events import EventKind as EventKind
from ._events import Subscription as Subscription
from ._exceptions import ActorError as ActorError
from ._exceptions import ActorStopped as ActorStopped
from ._exceptions import AskTimeout as AskTimeout
from ._exceptions import BudgetExceeded as BudgetExceeded
from ._exceptions import DuplicateActor as DuplicateActor
from ._exceptions import FractorError as FractorError
from ._exceptions import InvalidUsage as InvalidUsage
from ._exceptions import MailboxFull as MailboxFull
from ._exceptions import RuntimeClosed as RuntimeClosed
from ._exceptions import StoreError as StoreError
from ._exceptions import UnknownMessage as UnknownMessage
from ._messages import Envelope as Envelope
from ._messages import MailboxStatistics as MailboxStatistics
from ._messages import RuntimeStatistics as RuntimeStatistics
from ._rates import LaneStatistics as LaneStatistics
from ._rates import RateLimit as RateLimit
from ._ref import ActorRef as ActorRef
from ._ref import PendingReply as PendingReply
from ._runtime import Hosts as Hosts
from ._runtime import Runtime as Runtime
from ._store import BlobStore as BlobStore
from ._store import MemoryStore as MemoryStore
from ._store import Record as Record
from ._store import SQLiteStore as SQLiteStore
from ._store import Store as Store
from ._supervisor import Supervisor as Supervisor
from ._tree import Node as Node
from ._tree import NodeSnapshot as NodeSnapshot
from ._tree import NodeStatus as NodeStatus
from ._tree import TreeSnapshot as TreeSnapshot

__all__ = [
    "Actor",
    "ActorContext",
    "ActorError",
    "ActorRef",
    "ActorStop",
    "ActorStopped",
    "AskTimeout",
    "BlobStore",
    "Budget",
    "BudgetExceeded",
    "Caps",
    "DuplicateActor",
    "Envelope",
    "Event",
    "EventBus",
    "EventDetail",
    "EventKind",
    "FailurePolicy",
    "FractorError",
    "Hosts",
    "InvalidUsage",
    "LaneStatistics",
    "MailboxFull",
    "MailboxStatistics",
    "MemoryStore",
    "Node",
    "NodeSnapshot",
    "NodeStatus",
    "OutputSharing",
    "PendingReply",
    "Price",
    "RateLimit",
    "Record",
    "Reservation",
    "Runtime",
    "RuntimeClosed",
    "RuntimeStatistics",
    "SQLiteStore",
    "Spawnable",
    "Store",
    "StoreError",
    "Subscription",
    "Supervisor",
    "TreeSnapshot",
    "UnknownMessage",
    "Usage",
    "decode_json",
    "decode_msgpack",
    "encode_json",
    "encode_msgpack",
]
