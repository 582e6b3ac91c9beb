"""The observation stage: each attempt of a request, as it goes to the model and
as it ends, for the event bus and what reads it (the stream, the CLI, the web
view, OpenTelemetry's spans, the hosts' wire). In the stack only while someone
observes the execution (``Chain``): an unobserved request never passes here.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._messages import exception_text
from .._observation._events import RequestEnd, RequestStart
from ._call import Call, Next, failed_usage

if TYPE_CHECKING:
    from fractor.runtime import Usage

    from .._messages import ModelResponse

__all__ = ["Observe"]


class Observe:
    """The observation stage (see the module's docstring)."""

    __slots__ = ("next",)

    def __init__(self, next: Next) -> None:
        self.next = next

    async def send(self, call: Call) -> ModelResponse:
        recorder = call.recorder
        request = call.request
        contents = recorder.bus.contents
        # An observer recording contents gets the messages (a reference: no copy).
        recorder.emit(
            RequestStart(
                step=len(recorder.steps),
                attempt=call.attempt + 1,
                model=call.name,
                purpose=request.purpose,
                messages=request.messages if contents else None,
            )
        )
        try:
            response = await self.next(call)
        except Exception as exc:
            _failed(call, failed_usage(call, exc), exception_text(exc))
            raise
        except BaseException:
            _failed(call, None, "cut off before the model answered")
            raise
        usage = response.usage
        recorder.emit(
            RequestEnd(
                model=call.name,
                response_model=response.model,
                input_tokens=usage.input_tokens,
                output_tokens=usage.output_tokens,
                finish_reason=response.finish_reason,
                tool_calls=tuple((c.id, c.name) for c in response.tool_calls),
                response=response if contents else None,
            )
        )
        return response


def _failed(call: Call, usage: Usage | None, error: str) -> None:
    """The end of an attempt with no answer: what it used, and why."""
    call.recorder.emit(
        RequestEnd(
            model=call.name,
            input_tokens=usage.input_tokens if usage is not None else 0,
            output_tokens=usage.output_tokens if usage is not None else 0,
            finish_reason="error",
            error=error[:300],
        )
    )
