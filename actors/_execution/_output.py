"""Typed answers: ``Agent(output_type=T)`` (DESIGN.md section 7, issue 17).

``OutputSpec`` is what an agent's definition derives from its ``output_type``,
``output_mode`` and ``output_retries``, once, when the ``Agent`` is made: the JSON
schema of ``T`` (``msgspec.json.schema``, with its references inlined), how the
model is asked for it, and the decoders that turn an answer into a value of ``T``.
A type msgspec cannot describe is refused there, with the agent's name.

How the model is asked (``output_mode``):

- ``"native"``: the provider's structured output. The request carries an
  ``OutputSchema`` (``native=True``): ``OpenAIModel`` sends it as ``response_format``
  ``json_schema`` (OpenAI, vLLM, llama.cpp, LM Studio, Ollama). The answer's text is
  the JSON.
- ``"tool"``: a final-answer tool (``final_answer``) offered next to the agent's
  tools, its parameters the schema (an object; any other schema is wrapped as
  ``{"value": ...}``). Its arguments are the answer.
- ``"text"``: the schema and "answer with only that JSON" appended to the system
  prompt; the final text is parsed (JSON in a code fence or in prose is found).
  The request carries the schema with ``native=False``: a ``ReActModel`` (whose
  replies are JSON already) then takes a JSON value as its ``"final"``.
- ``"auto"``: native when the model says it has it (``structured_output = True``:
  ``OpenAIModel``, ``ScriptedModel``, ``FunctionModel``); text for a model built on
  another one (``ReActModel``: its tool calls are text already); the tool otherwise
  (``AnthropicModel``, any other model).

A bad answer (not JSON, the wrong shape) goes back to the model as an error it
reads, and the execution goes on (see ``actors._execution._answering``).
"""

from __future__ import annotations

import re
from typing import Any, Literal, TypeAlias, cast

import msgspec

from .._messages import (
    Message,
    ModelRequest,
    OutputSchema,
    SystemMessage,
    ToolCall,
    ToolSpec,
)

__all__ = ["FINAL_ANSWER", "OutputMode", "OutputSpec", "answers", "output_spec"]

OutputMode: TypeAlias = Literal["auto", "native", "tool", "text"]
"""How a model is asked for a typed answer (see ``Agent``)."""

#: The name of the final-answer tool of ``output_mode="tool"``.
FINAL_ANSWER = "final_answer"

_MODES = ("auto", "native", "tool", "text")
_REF = "#/$defs/"
_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.DOTALL)
_encoder = msgspec.json.Encoder()
#: What is wrong with an answer nested deeper than the decoder reads (msgspec stops
#: with a ``RecursionError`` some hundreds of levels down): an answer that cannot be
#: used, sent back as any other is.
_TOO_DEEP = "nested too deeply to be read: give it with fewer levels of nesting"
_ACCEPTED = (
    "a msgspec Struct, a dataclass, a TypedDict or a scalar (str, int, float, bool), "
    "or lists, dicts, unions and Literals of those"
)


class OutputSpec:
    """The typed answer of one agent definition (see the module).

    ``mode`` is the mode in use (``"auto"`` resolved for the agent's model);
    ``retries`` how many bad answers go back to the model before the execution
    fails; ``schema`` the JSON schema of ``type``; ``tool`` the final-answer tool
    (``mode="tool"`` only).
    """

    __slots__ = (
        "_arguments",
        "_decoder",
        "_wrapped",
        "instructions",
        "mode",
        "request_schema",
        "retries",
        "schema",
        "tool",
        "type",
        "type_name",
    )

    def __init__(self, output_type: Any, mode: Literal["native", "tool", "text"], retries: int):
        self.type = output_type
        self.type_name = type_name(output_type)
        self.mode = mode
        self.retries = retries
        self.schema = inlined(msgspec.json.schema(output_type))
        self._decoder = msgspec.json.Decoder(output_type)
        name = re.sub(r"[^A-Za-z0-9_-]+", "_", self.type_name).strip("_")[:64] or "answer"
        self.request_schema: OutputSchema | None = None
        if mode != "tool":
            self.request_schema = OutputSchema(
                name=name, schema=self.schema, native=mode == "native"
            )
        self.instructions = ""
        if mode == "text":
            self.instructions = (
                "Your final answer must be JSON matching this JSON schema, and nothing "
                f"else (no prose around it):\n{_encoder.encode(self.schema).decode()}"
            )
        self._wrapped = self.schema.get("type") != "object"
        self.tool: ToolSpec | None = None
        self._arguments = self._decoder
        if mode == "tool":
            self.tool = ToolSpec(
                name=FINAL_ANSWER,
                description=(
                    "Give your final answer: call this tool once you have it, with the "
                    + ('answer as "value"' if self._wrapped else "answer as its arguments")
                    + ". Nothing else you write is the answer."
                ),
                parameters=self._tool_parameters(),
            )
            if self._wrapped:
                wrapper = msgspec.defstruct(FINAL_ANSWER, [("value", output_type)])
                self._arguments = msgspec.json.Decoder(wrapper)

    def _tool_parameters(self) -> dict[str, Any]:
        if not self._wrapped:
            return self.schema
        value = dict(self.schema)
        defs = value.pop("$defs", None)
        parameters: dict[str, Any] = {
            "type": "object",
            "properties": {"value": value},
            "required": ["value"],
            "additionalProperties": False,
        }
        if defs is not None:
            parameters["$defs"] = defs
        return parameters

    # -- the requests -----------------------------------------------------------------

    def specs(self, specs: tuple[ToolSpec, ...]) -> tuple[ToolSpec, ...]:
        """The tools offered: the agent's, and the final-answer tool if there is one."""
        return specs if self.tool is None else (*specs, self.tool)

    def history(self, history: tuple[Message, ...]) -> tuple[Message, ...]:
        """The context before the execution's buffer, with the text mode's
        instructions at the end of the system prompt (one made if there is none)."""
        if not self.instructions:
            return history
        if history and isinstance(history[0], SystemMessage):
            system = history[0].content
            return (SystemMessage(content=f"{system}\n\n{self.instructions}"), *history[1:])
        return (SystemMessage(content=self.instructions), *history)

    def request(
        self, messages: tuple[Message, ...], tools: tuple[ToolSpec, ...], max_tokens: int | None
    ) -> ModelRequest:
        return ModelRequest(
            messages=messages,
            tools=tools,
            max_tokens=max_tokens,
            output_schema=self.request_schema,
        )

    def returns(self) -> str:
        """What a subagent's tool description says of its answer."""
        schema = _encoder.encode(self.schema).decode()
        return f" It answers with JSON matching this JSON schema: {schema}"

    # -- the answers ------------------------------------------------------------------

    def encode(self, value: Any) -> str:
        """The JSON of a typed answer (``Result.text``, what the conversation keeps)."""
        return _encoder.encode(value).decode()

    def parse_text(self, text: str) -> tuple[Any, str]:
        """The value an answer's text stands for, and "" ; or None and what was wrong.

        The whole text first; then JSON in a code fence or in prose; a ``str`` answer
        that is no JSON string is the text itself. JSON nested deeper than the
        decoder reads is a problem like any other, never an exception."""
        try:
            return self._decoder.decode(text), ""
        except msgspec.ValidationError as exc:
            problem = str(exc)
        except msgspec.DecodeError as exc:
            problem = f"the answer is not JSON ({exc})" if text.strip() else "the answer is empty"
        except RecursionError:
            problem = f"the answer is {_TOO_DEEP}"
        for candidate in _candidates(text):
            try:
                return self._decoder.decode(candidate), ""
            except msgspec.ValidationError as exc:
                if problem.startswith(("the answer is not JSON", "the answer is empty")):
                    problem = str(exc)
            except (msgspec.DecodeError, RecursionError):
                pass
        if self.type is str and text.strip():
            return text.strip(), ""
        return None, problem

    def parse_arguments(self, arguments: str) -> tuple[Any, str]:
        """The value a final-answer tool call's arguments stand for, and ""; or None
        and what was wrong."""
        try:
            value = self._arguments.decode(arguments)
        except msgspec.ValidationError as exc:
            return None, str(exc)
        except msgspec.DecodeError as exc:
            return None, f"the arguments are not JSON ({exc})"
        except RecursionError:
            return None, f"the arguments are {_TOO_DEEP}"
        return (value.value if self._wrapped else value), ""

    def correction(self, problem: str) -> str:
        """What the model reads after a bad answer in its text."""
        if self.tool is not None:
            return (
                f"Your answer could not be used: {problem}. Give your final answer by "
                f"calling the {FINAL_ANSWER} tool."
            )
        return (
            f"Your answer could not be used: {problem}. Reply again with only the "
            "corrected JSON, matching the schema."
        )

    def tool_error(self, problem: str) -> str:
        """The result of a final-answer call whose arguments did not match."""
        return (
            f"The answer did not match the schema: {problem}. Call {FINAL_ANSWER} again "
            "with the corrected answer."
        )

    def failure(self, problem: str) -> str:
        """The stop reason of an execution whose answers never matched."""
        return f"the answer did not match {self.type_name}: {problem}"


def output_spec(
    agent: str, model: Any, output_type: Any, mode: object, retries: object
) -> OutputSpec | None:
    """The ``OutputSpec`` of an agent definition (None without an ``output_type``),
    or a clear error naming the agent and what it accepts."""
    prefix = f"Agent {agent!r}:"
    if mode not in _MODES:
        raise ValueError(f"{prefix} output_mode must be one of {', '.join(_MODES)}, got {mode!r}")
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise ValueError(f"{prefix} output_retries must be an int >= 0, got {retries!r}")
    if output_type is None:
        return None
    native = getattr(model, "structured_output", False) is True
    if mode == "auto":
        adapter = callable(getattr(model, "request_via", None))
        mode = "native" if native else "text" if adapter else "tool"
    elif mode == "native" and not native:
        raise ValueError(
            f"{prefix} output_mode='native' needs a model with native structured output "
            f"(structured_output = True: OpenAIModel, ScriptedModel, FunctionModel), and "
            f"{getattr(model, 'name', type(model).__qualname__)!r} has none: use "
            "output_mode='tool' or 'text'"
        )
    try:
        return OutputSpec(output_type, cast(Literal["native", "tool", "text"], mode), retries)
    except (TypeError, ValueError) as exc:
        raise TypeError(
            f"{prefix} output_type must be {_ACCEPTED}; got {output_type!r}, which has no "
            f"JSON schema: {str(exc).splitlines()[0]}"
        ) from None


def type_name(output_type: Any) -> str:
    """``Weather``, ``list[int]``: a type as a person reads it."""
    if isinstance(output_type, type):
        return output_type.__qualname__
    return repr(output_type).replace("typing.", "")


def inlined(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with each ``$ref`` to its ``$defs`` replaced by the definition,
    except where a type refers to itself: those definitions stay in ``$defs``."""
    defs: dict[str, Any] = schema.get("$defs", {})
    needed: set[str] = set()

    def walk(node: Any, inside: frozenset[str]) -> Any:
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith(_REF) and ref[len(_REF) :] in defs:
                name = ref[len(_REF) :]
                if name in inside:
                    needed.add(name)
                    return node
                rest = {
                    key: walk(value, inside)
                    for key, value in node.items()
                    if key not in ("$ref", "$defs")
                }
                return {**walk(defs[name], inside | {name}), **rest}
            return {key: walk(value, inside) for key, value in node.items() if key != "$defs"}
        if isinstance(node, list):
            return [walk(value, inside) for value in node]
        return node

    root: dict[str, Any] = walk(schema, frozenset())
    kept: dict[str, Any] = {}
    while pending := needed - kept.keys():
        for name in sorted(pending):
            kept[name] = walk(defs[name], frozenset({name}))
    if kept:
        root["$defs"] = kept
    return root


def _candidates(text: str) -> list[str]:
    """JSON an answer may hold besides its whole text: each fenced block, then the
    outermost object or array."""
    found = [match.group(1) for match in _FENCE.finditer(text)]
    for left, right in ("{}", "[]"):
        start, end = text.find(left), text.rfind(right)
        if 0 <= start < end:
            found.append(text[start : end + 1])
    return found


def answers(calls: tuple[ToolCall, ...]) -> bool:
    """Whether a step's calls include the final-answer tool's (``output_mode="tool"``)."""
    return any(call.name == FINAL_ANSWER for call in calls)
