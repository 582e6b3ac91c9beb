"""Provider errors, classified for the retry policy, and secrets kept out of them.

- ``ProviderError``: a request to a provider failed. Its message names the provider,
  the model, the HTTP status (when there was one), what happened and what to do; its
  ``retryable`` attribute tells the agent's ``RetryPolicy`` whether sending the
  request again may help (rate limits, server errors, timeouts, lost connections and
  malformed responses: yes; a rejected key, an unknown model, any other 4xx: no).
- ``status_error`` and ``translate_sdk_error``: the ``ProviderError`` for an HTTP
  error status or an exception of either SDK (both name their classes alike).
- ``redact``: a text with the secrets (an API key, a URL's credentials) taken out,
  as every error, stop reason, trace and log keeps it.

What a server or an exception said (an error body, an error event in a stream, a
transport exception's text) enters a ``ProviderError`` by one door, its ``detail``,
and nowhere else: the error shows it cut short, and ``redacted`` takes the secrets
out of the whole text *before* cutting it again. Cut first, a key that straddles the
cut would leave its head behind, which no redaction of the whole key then finds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any

import msgspec

from fractor.runtime import FractorError

from .._messages import ServerLimits, Usage
from ._ratelimits import retry_after_in, server_limits, spent_until

__all__ = [
    "REDACTED",
    "ProviderError",
    "malformed",
    "redact",
    "status_error",
    "timed_out",
    "translate_sdk_error",
]


class ProviderError(FractorError):
    """A request to a model provider failed.

    ``provider`` is ``"openai"`` or ``"anthropic"``, ``model`` the model name,
    ``status`` the HTTP status (``None`` when no response came back), ``retryable``
    whether the same request may succeed later (read by ``RetryPolicy``), and
    ``retry_after`` the seconds the provider asked to wait, when it said so, and
    ``limits`` all that the response's headers said of the server's rate limits
    (``ServerLimits``; None when it said nothing, or no response came back).

    ``detail`` is what the server or an exception said, as it came (it may be long,
    and it may echo the key): the message shows it in parentheses after ``what``, cut
    at 300 characters. ``what`` (the attribute) is the two together, as shown. Build
    the error with the server's text there, never cut into ``what`` by hand:
    ``redacted`` redacts the whole text and only then cuts it.
    """

    def __init__(
        self,
        provider: str,
        what: str,
        *,
        detail: str = "",
        advice: str = "",
        model: str = "",
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
        usage: Usage | None = None,
        kind: str = "",
        limits: ServerLimits | None = None,
    ) -> None:
        where = f"{provider} model {model!r}" if model else provider
        if status is not None:
            where += f", HTTP {status}"
        shown = f"{what} ({_clipped(detail)})" if detail else what
        message = f"{where}: {shown}"
        if advice:
            message += f"; {advice}"
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        #: What kind of failure it is: what a model that falls back to another
        #: reads. From the status: "context_length", "too_large", "rate_limited",
        #: "busy", "server", "auth", "not_found", "quota", "rejected"; without one
        #: or past it: "unreachable" (no connection was made: nothing was sent),
        #: "connection" (the connection was lost), "timeout", "broken" (a stream
        #: that broke off), "malformed" (an answer that is not the wire format's),
        #: "content" (a part the endpoint does not take); "" when not known.
        self.kind = kind
        self.what = shown
        self.advice = advice
        #: What the failed request spent, when it is known: the usage a stream that
        #: broke part-way reported, or its input estimate plus what was received.
        self.usage = usage
        self.limits = limits
        # Whole, for ``redacted`` alone: it may hold a secret that the cut text
        # shows only the head of.
        self._what = what
        self._detail = detail

    def redacted(self, secrets: Iterable[str]) -> ProviderError:
        """The same error with ``secrets`` and URL credentials taken out of its text
        (a server may echo the key in its error body): out of the whole ``detail``
        first, which is then cut short, so no piece of a secret is left at the cut."""
        secrets = tuple(secrets)
        return ProviderError(
            self.provider,
            redact(self._what, secrets),
            detail=redact(self._detail, secrets),
            advice=redact(self.advice, secrets),
            model=self.model,
            status=self.status,
            retryable=self.retryable,
            retry_after=self.retry_after,
            usage=self.usage,
            kind=self.kind,
            limits=self.limits,
        )

    def spent(self, usage: Usage) -> ProviderError:
        """The same error, saying what the request spent."""
        self.usage = usage
        return self


# -- secrets: never in what fractor records or prints --------------------------------

#: What stands where a secret was.
REDACTED = "[redacted]"
#: Credentials in a URL: ``scheme://user:password@host`` (or ``scheme://token@host``).
_URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redact(text: str, secrets: Iterable[str]) -> str:
    """``text`` with every secret (an API key, say) and any credentials of a URL
    replaced by ``[redacted]``: what an error, a stop reason, a trace or a log keeps."""
    for secret in secrets:
        if secret and len(secret) >= 4 and secret in text:
            text = text.replace(secret, REDACTED)
    if "@" in text:
        text = _URL_CREDENTIALS.sub(f"{REDACTED}@", text)
    return text


# -- errors -------------------------------------------------------------------------

_MAX_DETAIL = 300


def _clipped(text: str) -> str:
    """``text`` on one line, cut at ``_MAX_DETAIL`` characters: what an error shows
    of its ``detail``. Reads no more of a long text than it shows."""
    head = " ".join(text[: 4 * _MAX_DETAIL].split())
    if len(head) > _MAX_DETAIL or len(text) > 4 * _MAX_DETAIL:
        head = head[: _MAX_DETAIL - 3] + "..."
    return head


#: What a server's message says when a request does not fit the model's context:
#: OpenAI ("maximum context length"), Anthropic ("prompt is too long"), vLLM ("maximum
#: context length"), llama.cpp ("exceeds the available context size"), Ollama and
#: others ("context window", "context length").
_CONTEXT_SIGNS = (
    "context length",
    "context_length",
    "maximum context",
    "prompt is too long",
    "exceeds the available context",
    "context window",
    "context size",
)


def _error_fields(body: object) -> tuple[str, str]:
    """(message, code-or-type) of a provider's JSON error body, best effort."""
    if isinstance(body, Mapping):
        inner = body.get("error", body)
        if isinstance(inner, Mapping):
            message = inner.get("message")
            code = inner.get("code") or inner.get("type") or ""
            return (str(message) if message else "", str(code))
        if isinstance(inner, str):
            return inner, ""
    if isinstance(body, str):
        return body, ""
    return "", ""


def status_error(
    provider: str,
    model: str,
    status: int,
    body: object,
    headers: Mapping[str, str] | None,
    *,
    key_hint: str,
    base_url: str,
) -> ProviderError:
    """The ``ProviderError`` for an HTTP error status, classified for ``RetryPolicy``,
    with what its headers said of the rate limits (``limits``). A 429's
    ``retry_after`` is its ``retry-after`` header, else the wait its message asks for
    (OpenAI's "Please try again in 644ms."), else the reset of a count its headers say
    nothing is left of (``x-ratelimit-remaining-requests: 0``)."""
    message, code = _error_fields(body)
    said = f"{code}: {message}" if code and message else message or code
    limits = server_limits(headers) if headers else None
    if status == 429 and (limits is None or limits.retry_after is None):
        # No retry-after header: the wait its message asks for, or else the reset of
        # the count its headers say is spent (a server that says when to come back is
        # waited for, in whichever way it says it).
        asked = retry_after_in(message)
        if asked is None and limits is not None:
            asked = spent_until(limits)
        if asked is not None:
            limits = (
                ServerLimits(retry_after=asked)
                if limits is None
                else msgspec.structs.replace(limits, retry_after=asked)
            )
    lowered = message.lower()
    too_large_for_rate = status == 429 and "request too large" in lowered
    retryable: bool
    kind = "rejected"
    if status in (400, 413) and (
        code == "context_length_exceeded" or any(sign in lowered for sign in _CONTEXT_SIGNS)
    ):
        retryable = False
        kind = "context_length"
        what = "the request does not fit the model's context"
        advice = "shorten the context or lower max_tokens, or use a model with a longer one"
    elif status in (401, 403):
        kind = "auth"
        retryable = False
        what = "the API key was rejected" if status == 401 else "access was refused"
        advice = (
            f"check the key ({key_hint}), that it is valid for {base_url} and that it may "
            "use this model; not retried"
        )
    elif status == 404:
        kind = "not_found"
        retryable = False
        what = "the model or the endpoint was not found"
        advice = (
            f"check the model name {model!r} and the base URL {base_url} (a local "
            "OpenAI-compatible server's usually ends in /v1); not retried"
        )
    elif status == 429 and code in ("insufficient_quota", "billing_hard_limit_reached"):
        kind = "quota"
        retryable = False
        what = "the account's quota is used up"
        advice = "check the plan and billing of this account; not retried"
    elif too_large_for_rate:
        # OpenAI: a request larger than the whole per-minute token limit. Waiting
        # never lets it through; whatever x-should-retry says, it is not retried.
        kind = "too_large"
        retryable = False
        what = "the request is larger than the rate limit allows at all"
        advice = (
            "shorten the context or lower max_tokens, or use a model with a higher "
            "tokens-per-minute limit; not retried"
        )
    elif status in (408, 409, 429):
        kind = "rate_limited" if status == 429 else "busy"
        retryable = True
        what = "rate limited or busy"
        advice = (
            "retryable (the agent's RetryPolicy decides how often, with backoff); if it "
            "persists, lower the concurrency or raise the account's rate limit"
        )
    elif status >= 500:
        kind = "server"
        retryable = True
        what = "the provider's server failed or is overloaded"
        advice = (
            "retryable (the agent's RetryPolicy decides how often, with backoff); if it "
            "persists, check the provider's status or try again later"
        )
    elif status == 413:
        kind = "too_large"
        retryable = False
        what = "the request is too large"
        advice = "shorten the context or lower the input token budget; not retried"
    else:
        retryable = False
        what = "the request was rejected"
        advice = "fix the request or the model options; not retried"
    should_retry = (headers or {}).get("x-should-retry")
    if should_retry in ("true", "false") and not too_large_for_rate:
        retryable = should_retry == "true"
    return ProviderError(
        provider,
        what,
        detail=said,
        advice=advice,
        model=model,
        status=status,
        retryable=retryable,
        retry_after=None if limits is None else limits.retry_after,
        limits=limits,
        kind=kind,
    )


def translate_sdk_error(
    sdk: ModuleType,
    exc: Exception,
    *,
    provider: str,
    model: str,
    key_hint: str,
    base_url: str,
    timeout: float,
) -> ProviderError | None:
    """The ``ProviderError`` for an exception of the provider's SDK, else ``None``.

    Both SDKs share the class names: ``APIStatusError`` (an HTTP error status),
    ``APITimeoutError`` (a subclass of ``APIConnectionError``), ``APIConnectionError``
    and ``APIResponseValidationError``.
    """
    error: Any = exc  # the SDK's classes, known only at run time
    if isinstance(exc, sdk.APIStatusError):
        headers = {k.lower(): v for k, v in error.response.headers.items()}
        return status_error(
            provider,
            model,
            error.status_code,
            error.body if error.body is not None else error.message,
            headers,
            key_hint=key_hint,
            base_url=base_url,
        )
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc
        unsent = _unsent(cause)
        if isinstance(exc, sdk.APITimeoutError) and not unsent:
            return timed_out(provider, model, timeout)
        return ProviderError(
            provider,
            f"could not reach {base_url}" if unsent else f"lost the connection to {base_url}",
            detail=f"{type(cause).__name__}: {cause}",
            advice=(
                "retryable (the agent's RetryPolicy decides how often); check the base "
                "URL, the network and that the server is running"
            ),
            model=model,
            retryable=True,
            kind="unreachable" if unsent else "connection",
        )
    if isinstance(exc, sdk.APIResponseValidationError):
        return malformed(provider, model, error.status_code, str(exc))
    return None


#: The transport's exceptions (httpx's) for a connection that was never made: a
#: refused connection, a name that does not resolve, a connect that timed out.
_NOT_CONNECTED = frozenset({"ConnectError", "ConnectTimeout"})


def _unsent(cause: BaseException) -> bool:
    """Whether a transport's exception says no connection was made, so the request
    never reached a server (nothing sent, nothing billed)."""
    if isinstance(cause, ConnectionRefusedError):
        return True
    return any(cls.__name__ in _NOT_CONNECTED for cls in type(cause).__mro__)


def timed_out(
    provider: str, model: str, timeout: float, status: int | None = None
) -> ProviderError:
    """A request whose response was not complete within ``timeout`` seconds: the
    model's timeout bounds the whole request (headers, body, every event of a
    stream), whichever clock saw it pass (the model's deadline, or the SDK's own
    wait for data)."""
    return ProviderError(
        provider,
        f"no complete response within the {timeout:g} s timeout",
        advice=(
            "retryable (the agent's RetryPolicy decides how often); the timeout bounds "
            "the whole request, streamed or not: for long outputs give the model a "
            "longer timeout=..."
        ),
        model=model,
        status=status,
        retryable=True,
        kind="timeout",
    )


def malformed(provider: str, model: str, status: int | None, detail: str) -> ProviderError:
    """A response that is not what the provider's wire format promises."""
    return ProviderError(
        provider,
        "the response is malformed",
        detail=detail,
        advice=(
            "retryable (the agent's RetryPolicy decides how often); if it persists, check "
            f"that the server at the base URL speaks the {provider} API"
        ),
        model=model,
        status=status,
        retryable=True,
        kind="malformed",
    )
