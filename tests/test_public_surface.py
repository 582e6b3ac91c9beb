"""The public surface of both packages is explicit and complete."""

from __future__ import annotations

import importlib
import types

import pytest

#: Names a package re-exports from the kernel on purpose (one definition, two homes).
REEXPORTED = {"actors": {"Usage"}}


@pytest.mark.parametrize("package", ["runtime", "actors"])
def test_all_lists_exactly_the_public_names(package: str) -> None:
    module = importlib.import_module(package)
    exported = set(module.__all__)
    public = {
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == exported
    assert len(module.__all__) == len(exported), "duplicates in __all__"
    for name in exported - REEXPORTED.get(package, set()):
        value = getattr(module, name)
        if isinstance(value, type | types.FunctionType):
            assert value.__module__.startswith(package), name


def test_runtime_surface_names() -> None:
    import runtime

    expected = {
        "Actor", "ActorContext", "ActorError", "ActorRef", "ActorStopped", "AskTimeout", "Budget",
        "BudgetExceeded", "DuplicateActor", "Envelope", "Event", "EventBus", "EventKind",
        "FailurePolicy", "FractorError", "InvalidUsage",
        "MailboxFull", "MailboxStatistics", "MemoryStore", "Node", "NodeSnapshot", "NodeStatus",
        "PendingReply", "Price", "Record", "Reservation", "Runtime", "RuntimeClosed",
        "RuntimeStatistics", "SQLiteStore", "Spawnable", "Store", "StoreError", "Supervisor",
        "Subscription", "TreeSnapshot", "UnknownMessage",
        "Usage", "decode_json", "decode_msgpack", "encode_json", "encode_msgpack",
    }  # fmt: skip
    assert set(runtime.__all__) == expected


def test_runtime_never_imports_actors() -> None:
    import pathlib

    root = pathlib.Path(importlib.import_module("runtime").__file__ or "").parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "import actors" not in text, path
        assert "from actors" not in text, path


def test_exception_tree() -> None:
    import runtime as rt

    assert issubclass(rt.ActorError, rt.FractorError)
    assert issubclass(rt.RuntimeClosed, rt.FractorError)
    assert issubclass(rt.StoreError, rt.FractorError)
    for exc in (
        rt.ActorStopped,
        rt.MailboxFull,
        rt.UnknownMessage,
        rt.AskTimeout,
        rt.DuplicateActor,
    ):
        assert issubclass(exc, rt.ActorError)
    assert issubclass(rt.AskTimeout, TimeoutError)
    assert issubclass(rt.UnknownMessage, TypeError)
    assert issubclass(rt.DuplicateActor, ValueError)
