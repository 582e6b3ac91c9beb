"""fractor's LLM agents, built as actors on the ``runtime`` kernel.

An ``Agent`` is an immutable definition; ``Runtime.spawn(agent)`` runs it as an actor
and returns an ``AgentRef``. Each task is one execution: model requests and parallel
tool calls in an ephemeral execution buffer, one ``Result`` back, and only the final
answer kept in the conversation.
"""

import typing as _typing

from ._agent._actor import AgentActor as AgentActor
from ._agent._agent import Agent as Agent
from ._agent._persistence import AgentState as AgentState
from ._agent._policy import RestartPolicy as RestartPolicy
from ._agent._policy import RetryPolicy as RetryPolicy
from ._agent._ref import AgentRef as AgentRef
from ._agent._ref import Decide as Decide
from ._agent._ref import GetApprovals as GetApprovals
from ._agent._ref import GetConversation as GetConversation
from ._agent._ref import GetProgress as GetProgress
from ._agent._ref import GetTrace as GetTrace
from ._execution._execution import StopCondition as StopCondition
from ._execution._output import OutputMode as OutputMode
from ._hosts._hosts import LocalHosts as LocalHosts
from ._hosts._hosts import RemoteHosts as RemoteHosts
from ._hosts._placing import ChildReply as ChildReply
from ._hosts._placing import HostUnavailable as HostUnavailable
from ._hosts._placing import Placement as Placement
from ._hosts._placing import Placer as Placer
from ._memory._summarizer import DEFAULT_SUMMARY_INSTRUCTIONS as DEFAULT_SUMMARY_INSTRUCTIONS
from ._memory._summarizer import Compaction as Compaction
from ._messages import AssistantMessage as AssistantMessage
from ._messages import Conversation as Conversation
from ._messages import DigestMessage as DigestMessage
from ._messages import ExecutionTrace as ExecutionTrace
from ._messages import FinishReason as FinishReason
from ._messages import Message as Message
from ._messages import ModelRequest as ModelRequest
from ._messages import ModelResponse as ModelResponse
from ._messages import OutputSchema as OutputSchema
from ._messages import Progress as Progress
from ._messages import Result as Result
from ._messages import ServerLimits as ServerLimits
from ._messages import Status as Status
from ._messages import StepRecord as StepRecord
from ._messages import SummaryRecord as SummaryRecord
from ._messages import SystemMessage as SystemMessage
from ._messages import Task as Task
from ._messages import ToolCall as ToolCall
from ._messages import ToolOutcome as ToolOutcome
from ._messages import ToolResultMessage as ToolResultMessage
from ._messages import ToolSpec as ToolSpec
from ._messages import Usage as Usage
from ._messages import UserMessage as UserMessage
from ._models._fakes import CycleModel as CycleModel
from ._models._fakes import FunctionModel as FunctionModel
from ._models._fakes import ScriptedModel as ScriptedModel
from ._models._fakes import ScriptExhausted as ScriptExhausted
from ._models._fakes import estimate_tokens as estimate_tokens
from ._models._fallback import FallbackModel as FallbackModel
from ._models._protocol import Model as Model
from ._models._protocol import Sink as Sink
from ._models._protocol import StreamingModel as StreamingModel
from ._models._react import MalformedAction as MalformedAction
from ._models._react import ReActModel as ReActModel
from ._models._turns import Streamed as Streamed
from ._models._turns import call as call
from ._models._turns import calls as calls
from ._models._turns import fail as fail
from ._models._turns import reply as reply
from ._models._turns import streamed as streamed
from ._observation import _events
from ._observation._events import *  # noqa: F403 (every kind of event, one class each: its __all__)
from ._observation._stream import AgentStream as AgentStream
from ._observation._stream import old_name as _old_name
from ._observation._traces import collect_trace_tree as collect_trace_tree
from ._observation._traces import export_traces as export_traces
from ._observation._traces import load_traces as load_traces
from ._observation._traces import render_trace_tree as render_trace_tree
from ._parts import Audio as Audio
from ._parts import ContentError as ContentError
from ._parts import ContentLimits as ContentLimits
from ._parts import Document as Document
from ._parts import Image as Image
from ._parts import Part as Part
from ._parts import Text as Text
from ._parts import describe_part as describe_part
from ._parts import part_tokens as part_tokens
from ._tools._approval import ApprovalError as ApprovalError
from ._tools._approval import ApprovalPolicy as ApprovalPolicy
from ._tools._approval import ApprovalRequest as ApprovalRequest
from ._tools._tool import Tool as Tool
from ._tools._tool import ToolDefinitionError as ToolDefinitionError
from ._tools._tool import tool as tool
from ._tools._toolbox import Toolbox as Toolbox
from ._tools._toolbox import Toolset as Toolset
from ._tools._toolbox import ToolsUnavailable as ToolsUnavailable
from ._version import VERSION as _VERSION
from .cli._live import watch as watch
from .providers import AnthropicModel as AnthropicModel
from .providers import OpenAIModel as OpenAIModel
from .providers import ProviderError as ProviderError
from .providers import model_from_string as model_from_string
from .ui import serve_ui as serve_ui

#: The installed distribution's version.
__version__ = _VERSION

__all__ = [
    "DEFAULT_SUMMARY_INSTRUCTIONS",
    "Agent",
    "AgentActor",
    "AgentRef",
    "AgentState",
    "AgentStream",
    "AnthropicModel",
    "ApprovalError",
    "ApprovalPolicy",
    "ApprovalRequest",
    "AssistantMessage",
    "Audio",
    "ChildReply",
    "Compaction",
    "ContentError",
    "ContentLimits",
    "Conversation",
    "CycleModel",
    "Decide",
    "DigestMessage",
    "Document",
    "ExecutionTrace",
    "FallbackModel",
    "FinishReason",
    "FunctionModel",
    "GetApprovals",
    "GetConversation",
    "GetProgress",
    "GetTrace",
    "HostUnavailable",
    "Image",
    "LocalHosts",
    "MalformedAction",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "OpenAIModel",
    "OutputMode",
    "OutputSchema",
    "Part",
    "Placement",
    "Placer",
    "Progress",
    "ProviderError",
    "ReActModel",
    "RemoteHosts",
    "RestartPolicy",
    "Result",
    "RetryPolicy",
    "ScriptExhausted",
    "ScriptedModel",
    "ServerLimits",
    "Sink",
    "Status",
    "StepRecord",
    "StopCondition",
    "Streamed",
    "StreamingModel",
    "SummaryRecord",
    "SystemMessage",
    "Task",
    "Text",
    "Tool",
    "ToolCall",
    "ToolDefinitionError",
    "ToolOutcome",
    "ToolResultMessage",
    "ToolSpec",
    "Toolbox",
    "ToolsUnavailable",
    "Toolset",
    "Usage",
    "UserMessage",
    "call",
    "calls",
    "collect_trace_tree",
    "describe_part",
    "estimate_tokens",
    "export_traces",
    "fail",
    "load_traces",
    "model_from_string",
    "part_tokens",
    "render_trace_tree",
    "reply",
    "serve_ui",
    "streamed",
    "tool",
    "watch",
]
__all__ += _events.__all__  # the kinds of events

if not _typing.TYPE_CHECKING:  # (a type checker says an old name is gone: nothing to warn)

    def __getattr__(name: str) -> object:
        """The old names of the stream's events (``TextDelta``, ...), until the next
        release, each with a ``DeprecationWarning`` naming its new class."""
        return _old_name("fractor.actors", name)
