"""Every public surface (the packages and their public subpackages) is explicit and complete."""

from __future__ import annotations

import importlib
import types
import typing

import pytest

import fractor
import fractor.actors.cli
import fractor.actors.hosts
import fractor.actors.providers
import fractor.runtime.lowlevel
from fractor import actors, runtime
from fractor.actors._observation._events import Details

#: Names a package re-exports from the kernel on purpose (one definition, two homes).
REEXPORTED = {"fractor.actors": {"Usage"}}
#: Where a surface's own names are defined, when not under its own name.
HOMES = {
    "fractor.runtime.lowlevel": (
        "fractor.runtime._waiter",
        "fractor.runtime._lease",
        "fractor.runtime._ledger",
        "fractor.runtime._rates",
    ),
    "fractor.actors.hosts": ("fractor.actors._",),
}


@pytest.mark.parametrize(
    "package",
    [
        "fractor.runtime",
        "fractor.runtime.lowlevel",
        "fractor.actors",
        "fractor.actors.providers",
        "fractor.actors.cli",
        "fractor.actors.hosts",
    ],
)
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
            assert value.__module__.startswith(HOMES.get(package, (package,))), name


def test_runtime_surface_names() -> None:
    expected = {
        "Actor", "ActorContext", "ActorError", "ActorRef", "ActorStopped", "AskTimeout", "Budget",
        "BudgetExceeded", "Caps", "DuplicateActor", "Envelope", "Event", "EventBus", "EventKind",
        # events: the envelope, the base of every kind's detail, the kernel's own kind
        "EventDetail", "ActorStop",
        "FailurePolicy", "FractorError", "Hosts", "InvalidUsage",
        "MailboxFull", "MailboxStatistics", "MemoryStore", "BlobStore",
        "Node", "NodeSnapshot", "NodeStatus",
        "OutputSharing", "RateLimit", "LaneStatistics",
        "PendingReply", "Price", "Record", "Reservation", "Runtime", "RuntimeClosed",
        "RuntimeStatistics", "SQLiteStore", "Spawnable", "Store", "StoreError", "Supervisor",
        "Subscription", "TreeSnapshot", "UnknownMessage",
        "Usage", "decode_json", "decode_msgpack", "encode_json", "encode_msgpack",
    }  # fmt: skip
    assert set(runtime.__all__) == expected


def test_actors_surface_names() -> None:
    expected = {
        "Agent", "AgentActor", "AgentRef", "AgentState", "AnthropicModel", "AssistantMessage",
        "Conversation", "CycleModel", "ExecutionTrace", "FinishReason", "FunctionModel",
        "GetConversation", "GetTrace", "HostUnavailable", "LocalHosts", "MalformedAction",
        "Message", "Model", "ModelRequest",
        "ModelResponse", "OpenAIModel", "ProviderError", "ReActModel", "RestartPolicy", "Result",
        "RemoteHosts", "RetryPolicy", "ScriptExhausted", "ScriptedModel", "Status", "StepRecord",
        "StopCondition", "SystemMessage", "Task", "Tool", "ToolCall", "ToolDefinitionError",
        "ToolOutcome", "ToolResultMessage", "ToolSpec", "Toolbox", "Usage", "UserMessage",
        "call", "calls", "collect_trace_tree", "estimate_tokens", "export_traces", "fail",
        "load_traces", "model_from_string", "render_trace_tree", "reply", "tool", "watch",
        # streaming and watching a running agent
        # (a stream yields the runtime's Events: the kinds below, one class each)
        "AgentStream", "GetProgress", "Progress", "Sink", "Streamed", "StreamingModel",
        "streamed",
        # memory: compaction, attempts that learn
        "Compaction", "DEFAULT_SUMMARY_INSTRUCTIONS", "DigestMessage", "SummaryRecord",
        # a human in the loop
        "ApprovalError", "ApprovalPolicy", "ApprovalRequest", "Decide", "GetApprovals",
        # typed answers
        "OutputMode", "OutputSchema",
        # placing subtrees on hosts, asked of what hosts can do
        "ChildReply", "Placement", "Placer",
        # tools known once a runtime runs (an MCP server's)
        "Toolset", "ToolsUnavailable",
        # what a server's headers said of its rate limits; a model that falls back
        "ServerLimits", "FallbackModel",
        # content parts: images, documents and audio beside text, their limits and trace line
        "Audio", "ContentError", "ContentLimits", "Document", "Image", "Part", "Text",
        "describe_part", "part_tokens",
        # the web view of a live tree (needs the ui extra only once served)
        "serve_ui",
    }  # fmt: skip
    # The agent layer's kinds of events, one class each: those of the one union the
    # wire decodes (a kind added there is exported with no line here).
    kinds = {cls.__name__ for cls in typing.get_args(Details)} - {"ActorStop"}
    assert {"ModelText", "ToolStart", "ToolProgress", "ApprovalAsked"} <= kinds
    assert not kinds & expected
    assert set(actors.__all__) == expected | kinds


def test_subpackage_surface_names() -> None:
    assert set(runtime.lowlevel.__all__) == {
        "LEASED", "HeldUp", "Lease", "Ledger", "Lender", "Refusal", "Tally", "Want",
        "Lane", "Pass", "Rates", "TOOL_LANE", "DIMENSIONS", "Dimension",
        "Waiter", "clock", "new_waiter", "park", "wake",
    }  # fmt: skip
    assert set(actors.providers.__all__) == {
        "PROVIDERS", "AnthropicModel", "OpenAIModel", "ProviderError", "ProviderModel",
        "model_from_string", "redact",
    }  # fmt: skip
    assert set(actors.cli.__all__) == {"main"}
    # What a new kind of host is written with, from outside the package.
    assert set(actors.hosts.__all__) == {
        "DEFAULT_POOL", "AgentHost", "ChildReply", "HostConfig", "HostLink",
        "HostUnavailable", "LocalHosts", "Placement", "PlacementStrategy", "Placer",
        "RemoteHosts", "exception_text",
    }  # fmt: skip
    assert actors.hosts.Placer is actors.Placer
    # One definition, two homes: what actors re-exports from its subpackages.
    assert actors.providers.model_from_string is actors.model_from_string
    assert actors.watch.__module__ == "fractor.actors.cli._live"


def test_the_package_holds_every_public_name_of_both_layers() -> None:
    # ``from fractor import Agent, Runtime, Budget, tool``: each name is the one its
    # layer defines, and the layers stay where they are.
    assert set(fractor.__all__) == set(actors.__all__) | set(runtime.__all__)
    for name in fractor.__all__:
        home = actors if name in actors.__all__ else runtime
        assert getattr(fractor, name) is getattr(home, name), name
    assert fractor.actors is actors
    assert fractor.runtime is runtime
    public = {
        name
        for name, value in vars(fractor).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType)
    }
    assert public == set(fractor.__all__)


def test_runtime_never_imports_actors() -> None:
    import pathlib

    root = pathlib.Path(runtime.__file__ or "").parent
    for path in root.glob("*.py"):
        text = path.read_text()
        assert "import fractor.actors" not in text, path
        assert "from fractor.actors" not in text, path
        assert "from fractor import" not in text, path


def test_exception_tree() -> None:
    import fractor.runtime as rt

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
