"""fractor's LLM agents, built as actors on the ``runtime`` kernel.

An ``Agent`` is an immutable definition; ``Runtime.spawn(agent)`` runs it as an actor
and returns an ``AgentRef``. Each task is one execution: model requests and parallel
tool calls in an ephemeral execution buffer, one ``Result`` back, and only the final
answer kept in the conversation.
"""

from ._agent import Agent as Agent
from ._agent_actor import AgentActor as AgentActor
from ._agent_ref import AgentRef as AgentRef
from ._agent_ref import Decide as Decide
from ._agent_ref import GetApprovals as GetApprovals
from ._agent_ref import GetConversation as GetConversation
from ._agent_ref import GetProgress as GetProgress
from ._agent_ref import GetTrace as GetTrace
from ._approval import ApprovalError as ApprovalError
from ._approval import ApprovalPolicy as ApprovalPolicy
from ._approval import ApprovalRequest as ApprovalRequest
from ._events import ApprovalAsked as ApprovalAsked
from ._events import ApprovalDecision as ApprovalDecision
from ._events import BudgetResume as BudgetResume
from ._events import BudgetWait as BudgetWait
from ._events import CompactionEnd as CompactionEnd
from ._events import DeadlineReached as DeadlineReached
from ._events import ExecutionEnd as ExecutionEnd
from ._events import ExecutionStart as ExecutionStart
from ._events import LimitReached as LimitReached
from ._events import ModelText as ModelText
from ._events import Refused as Refused
from ._events import RequestEnd as RequestEnd
from ._events import RequestStart as RequestStart
from ._events import Restart as Restart
from ._events import Retry as Retry
from ._events import Spawn as Spawn
from ._events import StepEnd as StepEnd
from ._events import StepStart as StepStart
from ._events import ToolEnd as ToolEnd
from ._events import ToolProgress as ToolProgress
from ._events import ToolStart as ToolStart
from ._execution import StopCondition as StopCondition
from ._fakes import CycleModel as CycleModel
from ._fakes import FunctionModel as FunctionModel
from ._fakes import ScriptedModel as ScriptedModel
from ._fakes import ScriptExhausted as ScriptExhausted
from ._fakes import estimate_tokens as estimate_tokens
from ._hosts import LocalHosts as LocalHosts
from ._hosts import RemoteHosts as RemoteHosts
from ._memory import DEFAULT_SUMMARY_INSTRUCTIONS as DEFAULT_SUMMARY_INSTRUCTIONS
from ._memory import Compaction as Compaction
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
from ._models import Model as Model
from ._models import Sink as Sink
from ._models import StreamingModel as StreamingModel
from ._output import OutputMode as OutputMode
from ._persistence import AgentState as AgentState
from ._placing import ChildReply as ChildReply
from ._placing import HostUnavailable as HostUnavailable
from ._placing import Placement as Placement
from ._placing import Placer as Placer
from ._policy import RestartPolicy as RestartPolicy
from ._policy import RetryPolicy as RetryPolicy
from ._react import MalformedAction as MalformedAction
from ._react import ReActModel as ReActModel
from ._streaming import AgentStream as AgentStream
from ._streaming import ApprovalDecided as ApprovalDecided
from ._streaming import ApprovalRequested as ApprovalRequested
from ._streaming import BudgetResumed as BudgetResumed
from ._streaming import BudgetWaiting as BudgetWaiting
from ._streaming import Compacted as Compacted
from ._streaming import Restarted as Restarted
from ._streaming import Retrying as Retrying
from ._streaming import Stopped as Stopped
from ._streaming import StreamEvent as StreamEvent
from ._streaming import SubagentFinished as SubagentFinished
from ._streaming import SubagentStarted as SubagentStarted
from ._streaming import TextDelta as TextDelta
from ._streaming import ToolCallFinished as ToolCallFinished
from ._streaming import ToolCallProgress as ToolCallProgress
from ._streaming import ToolCallStarted as ToolCallStarted
from ._toolbox import Toolbox as Toolbox
from ._toolbox import Toolset as Toolset
from ._tools import Tool as Tool
from ._tools import ToolDefinitionError as ToolDefinitionError
from ._tools import tool as tool
from ._traces import collect_trace_tree as collect_trace_tree
from ._traces import export_traces as export_traces
from ._traces import load_traces as load_traces
from ._traces import render_trace_tree as render_trace_tree
from ._turns import Streamed as Streamed
from ._turns import call as call
from ._turns import calls as calls
from ._turns import fail as fail
from ._turns import reply as reply
from ._turns import streamed as streamed
from ._version import VERSION as _VERSION
from .cli._live import watch as watch
from .providers import AnthropicModel as AnthropicModel
from .providers import OpenAIModel as OpenAIModel
from .providers import ProviderError as ProviderError
from .providers import model_from_string as model_from_string

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
    "ApprovalAsked",
    "ApprovalDecided",
    "ApprovalDecision",
    "ApprovalError",
    "ApprovalPolicy",
    "ApprovalRequest",
    "ApprovalRequested",
    "AssistantMessage",
    "BudgetResume",
    "BudgetResumed",
    "BudgetWait",
    "BudgetWaiting",
    "ChildReply",
    "Compacted",
    "Compaction",
    "CompactionEnd",
    "Conversation",
    "CycleModel",
    "DeadlineReached",
    "Decide",
    "DigestMessage",
    "ExecutionEnd",
    "ExecutionStart",
    "ExecutionTrace",
    "FinishReason",
    "FunctionModel",
    "GetApprovals",
    "GetConversation",
    "GetProgress",
    "GetTrace",
    "HostUnavailable",
    "LimitReached",
    "LocalHosts",
    "MalformedAction",
    "Message",
    "Model",
    "ModelRequest",
    "ModelResponse",
    "ModelText",
    "OpenAIModel",
    "OutputMode",
    "OutputSchema",
    "Placement",
    "Placer",
    "Progress",
    "ProviderError",
    "ReActModel",
    "Refused",
    "RemoteHosts",
    "RequestEnd",
    "RequestStart",
    "Restart",
    "RestartPolicy",
    "Restarted",
    "Result",
    "Retry",
    "RetryPolicy",
    "Retrying",
    "ScriptExhausted",
    "ScriptedModel",
    "Sink",
    "Spawn",
    "Status",
    "StepEnd",
    "StepRecord",
    "StepStart",
    "StopCondition",
    "Stopped",
    "StreamEvent",
    "Streamed",
    "StreamingModel",
    "SubagentFinished",
    "SubagentStarted",
    "SummaryRecord",
    "SystemMessage",
    "Task",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolCallFinished",
    "ToolCallProgress",
    "ToolCallStarted",
    "ToolDefinitionError",
    "ToolEnd",
    "ToolOutcome",
    "ToolProgress",
    "ToolResultMessage",
    "ToolSpec",
    "ToolStart",
    "Toolbox",
    "Toolset",
    "Usage",
    "UserMessage",
    "call",
    "calls",
    "collect_trace_tree",
    "estimate_tokens",
    "export_traces",
    "fail",
    "load_traces",
    "model_from_string",
    "render_trace_tree",
    "reply",
    "streamed",
    "tool",
    "watch",
]
