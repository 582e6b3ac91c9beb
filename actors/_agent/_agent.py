"""``Agent``: the immutable definition of an agent, checked when it is made.

Its data, checks and what is derived from them are an ``AgentDefinition``
(``actors._agent._definition``, the bottom of the agent core); ``Agent`` adds how the runtime
spawns it. ``Runtime.spawn(agent)`` runs a definition as an ``AgentActor``
(``actors._agent._actor``: the running agent, its conversation and traces) and hands
back an ``AgentRef`` (``actors._agent._ref``: the handle, and the questions it asks
the actor). Both are re-exported here. A definition is what gets shipped to another
host: it pickles as the arguments it was made with.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

from fractor.runtime import ActorRef

from .._messages import Task
from ._actor import AgentActor
from ._definition import AgentDefinition
from ._ref import AgentRef, GetConversation, GetProgress, GetTrace

__all__ = [
    "Agent",
    "AgentActor",
    "AgentRef",
    "GetConversation",
    "GetProgress",
    "GetTrace",
    "Task",
]


@dataclass(frozen=True, slots=True)
class Agent(AgentDefinition):
    """An immutable agent definition; ``Runtime.spawn`` turns it into a running actor.

    ``tools`` are ``@tool`` functions (a plain function is wrapped with ``tool``).
    ``subagents`` are other agents offered to the model as tools (name, description,
    one ``task`` argument); each call runs the subagent as a child actor and returns
    only its final response. ``budget`` limits each execution, descendants included.
    ``tool_concurrency`` bounds how many tool calls of one step run at once, and
    how many subagents (counted apart: a step may run that many of each).
    ``stop_when`` is called with each step's record after its tools ran; returning
    True ends the execution. ``max_tokens`` caps each model request's output (the
    supervisor may cap it lower). ``retry`` and ``restart`` are the supervision
    policies; ``escalate`` makes a failure of this agent, run as a subagent, fail its
    parent too. ``trace_limit`` is how many execution traces the actor keeps.
    ``host`` names a pool of the runtime's hosts (``Runtime(hosts=...)``): each
    execution of this agent as a subagent runs there, with its whole subtree (by
    default the runtime's placement decides: see ``actors._hosts._hosts``).
    ``output_type`` asks for a typed answer (a msgspec Struct, a dataclass, a
    TypedDict or a scalar): ``Result.output`` holds it, ``Result.text`` its JSON;
    ``output_mode`` says how the model is asked for it (``"native"``: the provider's
    structured output; ``"tool"``: a final-answer tool; ``"text"``: instructions and
    a parse; ``"auto"``: the best the model has), and ``output_retries`` how many bad
    answers go back to the model before the execution fails. ``approval`` names the
    tool calls a person must approve first (tool names, or a function of the call;
    ``@tool(approval=True)`` marks a tool itself): see ``AgentRef.approve``.
    ``memory`` folds old turns of a long conversation into a summary
    (``Compaction``: when, how many turns stay, which model summarizes).
    ``content_limits`` bounds the images and documents of a task, a tool result and
    a model request (``ContentLimits``: 20 MB a part, 50 MB a request by default).
    """

    def __reduce__(self) -> tuple[Any, ...]:
        """Pickled as the arguments it was made with (for an agent shipped to another
        host, as Ray ships code): what ``__post_init__`` derives is derived again."""
        arguments = {f.name: getattr(self, f.name) for f in fields(self) if f.init}
        return (_rebuilt_agent, (arguments,))

    # Spawnable
    def new_actor(self) -> AgentActor:
        return AgentActor(self)

    def make_ref(self, ref: ActorRef) -> AgentRef:
        return AgentRef(ref, self)


def _rebuilt_agent(arguments: dict[str, Any]) -> Agent:
    """An agent again, from what ``Agent.__reduce__`` kept."""
    return Agent(**arguments)
