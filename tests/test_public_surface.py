"""Every public surface (the packages and their public subpackages) is explicit and complete."""

from __future__ import annotations

import importlib
import types

import pytest

#: Names a package re-exports from the kernel on purpose (one definition, two homes).
REEXPORTED = {"actors": {"Usage"}}
#: Where a surface's own names are defined, when not under its own name.
HOMES = {"runtime.lowlevel": ("runtime._waiter", "runtime._lease", "runtime._ledger")}


@pytest.mark.parametrize(
    "package", ["runtime", "runtime.lowlevel", "actors", "actors.providers", "actors.cli"]
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
    import runtime

    expected = {
        "Actor", "ActorContext", "ActorError", "ActorRef", "ActorStopped", "AskTimeout", "Budget",
        "BudgetExceeded", "Caps", "DuplicateActor", "Envelope", "Event", "EventBus", "EventKind",
        "FailurePolicy", "FractorError", "Hosts", "InvalidUsage",
        "MailboxFull", "MailboxStatistics", "MemoryStore", "Node", "NodeSnapshot", "NodeStatus",
        "PendingReply", "Price", "Record", "Reservation", "Runtime", "RuntimeClosed",
        "RuntimeStatistics", "SQLiteStore", "Spawnable", "Store", "StoreError", "Supervisor",
        "Subscription", "TreeSnapshot", "UnknownMessage",
        "Usage", "decode_json", "decode_msgpack", "encode_json", "encode_msgpack",
    }  # fmt: skip
    assert set(runtime.__all__) == expected


def test_actors_surface_names() -> None:
    import actors

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
        "AgentStream", "BudgetResumed", "BudgetWaiting", "GetProgress", "Progress", "Retrying",
        "Sink", "Stopped", "StreamEvent", "Streamed", "StreamingModel", "SubagentFinished",
        "SubagentStarted", "TextDelta", "ToolCallFinished", "ToolCallStarted", "streamed",
        # memory: compaction, attempts that learn
        "Compaction", "DEFAULT_SUMMARY_INSTRUCTIONS", "DigestMessage", "SummaryRecord",
        "Compacted", "Restarted",
        # a human in the loop
        "ApprovalDecided", "ApprovalError", "ApprovalPolicy", "ApprovalRequest",
        "ApprovalRequested", "Decide", "GetApprovals",
        # typed answers
        "OutputMode", "OutputSchema",
        # tools known once a runtime runs (an MCP server's)
        "Toolset",
    }  # fmt: skip
    assert set(actors.__all__) == expected


def test_subpackage_surface_names() -> None:
    import actors.cli
    import actors.providers
    import runtime.lowlevel

    assert set(runtime.lowlevel.__all__) == {
        "LEASED", "HeldUp", "Lease", "Ledger", "Lender", "Refusal", "Tally", "Want",
        "Waiter", "clock", "new_waiter", "park", "wake",
    }  # fmt: skip
    assert set(actors.providers.__all__) == {
        "PROVIDERS", "AnthropicModel", "OpenAIModel", "ProviderError", "ProviderModel",
        "model_from_string", "redact",
    }  # fmt: skip
    assert set(actors.cli.__all__) == {"main"}
    # One definition, two homes: what actors re-exports from its subpackages.
    assert actors.providers.model_from_string is actors.model_from_string
    assert actors.watch.__module__ == "actors.cli._live"


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
