"""The contract the model providers share: their error, their base, token estimates.

- ``ProviderError``: a request to a provider failed. Its message names the provider,
  the model, the HTTP status (when there was one), what happened and what to do; its
  ``retryable`` attribute tells the agent's ``RetryPolicy`` whether sending the
  request again may help (rate limits, server errors, timeouts, lost connections and
  malformed responses: yes; a rejected key, an unknown model, any other 4xx: no).
- ``estimate_request_tokens``: the cheap input-token estimate of the budget pre-check,
  with each provider's own constants.
- ``ProviderModel``: the base of ``OpenAIModel`` (``_openai.py``) and
  ``AnthropicModel`` (``_anthropic.py``): configuration, the SDK client's life, error
  translation. Neither provider imports the other; the ``model_from_string``
  registry that names them both lives in the package's ``__init__``.

Both providers send requests through their official SDK, with the SDK's own retries
off: the agent's ``RetryPolicy`` is the one that retries. The SDKs are optional
extras (``pip install 'fractor[openai]'``, ``'fractor[anthropic]'``), imported only
when a provider model is built.
"""

from __future__ import annotations

import importlib
import itertools
import math
import os
import re
import urllib.parse
from collections.abc import Iterable, Mapping
from types import ModuleType
from typing import Any, ClassVar, Self

import anyio
import msgspec

from runtime import FractorError

from .._messages import AssistantMessage, ModelRequest, ModelResponse

__all__ = [
    "ProviderError",
    "ProviderModel",
    "estimate_output_tokens",
    "estimate_request_tokens",
]

#: The placeholder key sent to a server given by ``base_url`` when no key is known:
#: local servers (vLLM, Ollama, llama.cpp, LM Studio) ignore it, the SDKs want one.
PLACEHOLDER_KEY = "not-needed"

_json_encoder = msgspec.json.Encoder()
#: How long ``aclose`` may take to close the SDK client's connections.
_CLOSE_SECONDS = 5.0


class ProviderError(FractorError):
    """A request to a model provider failed.

    ``provider`` is ``"openai"`` or ``"anthropic"``, ``model`` the model name,
    ``status`` the HTTP status (``None`` when no response came back), ``retryable``
    whether the same request may succeed later (read by ``RetryPolicy``), and
    ``retry_after`` the seconds the provider asked to wait, when it said so.
    """

    def __init__(
        self,
        provider: str,
        what: str,
        *,
        advice: str = "",
        model: str = "",
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        where = f"{provider} model {model!r}" if model else provider
        if status is not None:
            where += f", HTTP {status}"
        message = f"{where}: {what}"
        if advice:
            message += f"; {advice}"
        super().__init__(message)
        self.provider = provider
        self.model = model
        self.status = status
        self.retryable = retryable
        self.retry_after = retry_after
        self.what = what
        self.advice = advice

    def redacted(self, secrets: Iterable[str]) -> ProviderError:
        """The same error with ``secrets`` and URL credentials taken out of its text
        (a server may echo the key in its error body)."""
        return ProviderError(
            self.provider,
            redact(self.what, secrets),
            advice=redact(self.advice, secrets),
            model=self.model,
            status=self.status,
            retryable=self.retryable,
            retry_after=self.retry_after,
        )


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


# -- configuration shared by the providers ------------------------------------------


def check_base_url(provider: str, base_url: str) -> None:
    """``ValueError`` unless ``base_url`` is an http(s) URL with a host (its credentials,
    if it has any, are redacted from the message)."""
    try:
        parts = urllib.parse.urlsplit(base_url)
        parts.port  # noqa: B018 (raises ValueError for a port that is not a number)
    except ValueError as exc:
        problem = str(exc)
    else:
        if parts.scheme not in ("http", "https"):
            problem = "the scheme must be http or https"
        elif not parts.hostname:
            problem = "it names no host"
        else:
            return
    raise ValueError(
        f"{provider}: base_url must be an http(s) URL such as http://localhost:8000/v1, "
        f"got {redact(base_url, ())!r}: {problem}"
    )


def import_sdk(provider: str) -> ModuleType:
    """The provider's SDK module, or a ``ProviderError`` saying how to install it."""
    try:
        return importlib.import_module(provider)
    except ImportError as exc:
        raise ProviderError(
            provider,
            f"the {provider!r} SDK is not installed ({exc})",
            advice=f"install the extra: pip install 'fractor[{provider}]'",
        ) from exc


def resolve_api_key(
    provider: str, api_key: str | None, env_var: str, base_url: str | None
) -> tuple[str, str]:
    """The key to send, and where it came from in words (for error messages).

    ``api_key`` if given, else ``$env_var``, else a placeholder for the server at
    ``base_url`` (local servers need no key); with neither, a ``ProviderError``.
    """
    if api_key:
        return api_key, "the api_key given"
    from_env = os.environ.get(env_var, "")
    if from_env:
        return from_env, f"${env_var}"
    if base_url:
        return PLACEHOLDER_KEY, f"none was given, so a placeholder was sent: set ${env_var}"
    raise ProviderError(
        provider,
        "no API key was given",
        advice=(
            f"set the environment variable {env_var}, or pass api_key=...; for a local "
            "server that needs no key, pass its base_url=..."
        ),
    )


def check_options(
    provider: str, options: Mapping[str, Any] | None, reserved: frozenset[str]
) -> dict[str, Any]:
    """A copy of the request options, refusing the fields the provider sets itself."""
    if options is None:
        return {}
    if not isinstance(options, Mapping):
        raise TypeError(f"{provider}: options must be a mapping of request fields, got {options!r}")
    clash = sorted(set(options) & reserved)
    if clash:
        raise ValueError(
            f"{provider}: options may not set {', '.join(clash)}: the model sets them "
            "from the request (use the agent's instructions, tools, max_tokens and budget)"
        )
    return dict(options)


def check_positive(provider: str, name: str, value: float | None) -> None:
    if value is None:
        return
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not math.isfinite(value)
        or value <= 0
    ):
        raise ValueError(f"{provider}: {name} must be a finite number > 0, got {value!r}")


def output_cap(request_cap: int | None, model_cap: int | None) -> int | None:
    """The output cap to send: the request's (the supervisor's reservation), clamped
    to what the model can produce. ``None`` when neither says anything."""
    if request_cap is None:
        return model_cap
    if model_cap is None:
        return max(request_cap, 1)
    return max(min(request_cap, model_cap), 1)


# -- errors -------------------------------------------------------------------------

_MAX_DETAIL = 300


def _detail(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_DETAIL:
        text = text[: _MAX_DETAIL - 3] + "..."
    return text


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


def _retry_after(headers: Mapping[str, str] | None) -> float | None:
    if not headers:
        return None
    for name, scale in (("retry-after-ms", 1000.0), ("retry-after", 1.0)):
        value = headers.get(name)
        if value is None:
            continue
        try:
            seconds = float(value) / scale
        except ValueError:
            continue
        if seconds >= 0:
            return seconds
    return None


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
    """The ``ProviderError`` for an HTTP error status, classified for ``RetryPolicy``."""
    message, code = _error_fields(body)
    summary = f"{code}: {message}" if code and message else message or code
    said = f" ({_detail(summary)})" if summary else ""
    retryable: bool
    if status in (401, 403):
        retryable = False
        what = "the API key was rejected" if status == 401 else "access was refused"
        what += said
        advice = (
            f"check the key ({key_hint}), that it is valid for {base_url} and that it may "
            "use this model; not retried"
        )
    elif status == 404:
        retryable = False
        what = f"the model or the endpoint was not found{said}"
        advice = (
            f"check the model name {model!r} and the base URL {base_url} (a local "
            "OpenAI-compatible server's usually ends in /v1); not retried"
        )
    elif status == 429 and code in ("insufficient_quota", "billing_hard_limit_reached"):
        retryable = False
        what = f"the account's quota is used up{said}"
        advice = "check the plan and billing of this account; not retried"
    elif status in (408, 409, 429):
        retryable = True
        what = f"rate limited or busy{said}"
        advice = (
            "retryable (the agent's RetryPolicy decides how often, with backoff); if it "
            "persists, lower the concurrency or raise the account's rate limit"
        )
    elif status >= 500:
        retryable = True
        what = f"the provider's server failed or is overloaded{said}"
        advice = (
            "retryable (the agent's RetryPolicy decides how often, with backoff); if it "
            "persists, check the provider's status or try again later"
        )
    elif status == 413:
        retryable = False
        what = f"the request is too large{said}"
        advice = "shorten the context or lower the input token budget; not retried"
    else:
        retryable = False
        what = f"the request was rejected{said}"
        advice = "fix the request or the model options; not retried"
    should_retry = (headers or {}).get("x-should-retry")
    if should_retry in ("true", "false"):
        retryable = should_retry == "true"
    return ProviderError(
        provider,
        what,
        advice=advice,
        model=model,
        status=status,
        retryable=retryable,
        retry_after=_retry_after(headers),
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
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError(
            provider,
            f"no response within the {timeout:g} s timeout",
            advice=(
                "retryable (the agent's RetryPolicy decides how often); for long outputs "
                "give the model a longer timeout=..."
            ),
            model=model,
            retryable=True,
        )
    if isinstance(exc, sdk.APIConnectionError):
        cause = exc.__cause__ or exc
        return ProviderError(
            provider,
            f"could not reach {base_url} ({_detail(f'{type(cause).__name__}: {cause}')})",
            advice=(
                "retryable (the agent's RetryPolicy decides how often); check the base "
                "URL, the network and that the server is running"
            ),
            model=model,
            retryable=True,
        )
    if isinstance(exc, sdk.APIResponseValidationError):
        return malformed(provider, model, error.status_code, str(exc))
    return None


def malformed(provider: str, model: str, status: int | None, detail: str) -> ProviderError:
    """A response that is not what the provider's wire format promises."""
    return ProviderError(
        provider,
        f"the response is malformed ({_detail(detail)})",
        advice=(
            "retryable (the agent's RetryPolicy decides how often); if it persists, check "
            f"that the server at the base URL speaks the {provider} API"
        ),
        model=model,
        status=status,
        retryable=True,
    )


# -- the base of both providers -------------------------------------------------------


class ProviderModel:
    """What ``OpenAIModel`` and ``AnthropicModel`` share: configuration, the SDK
    client's life, error translation and call ids. A subclass builds the client,
    sends one request and parses one response body.

    The SDK client is created at the first request (so a model can be built outside
    any event loop) with the SDK's own retries off, and closed by ``aclose``. A model
    instance belongs to one event loop: build one per ``anyio.run``.
    """

    #: The provider's name: the prefix of ``name`` and of model strings.
    provider: ClassVar[str]
    #: The environment variable the API key is read from when none is given.
    env_var: ClassVar[str]
    #: The environment variable the base URL is read from when none is given.
    base_url_env: ClassVar[str]
    #: Request fields the model sets itself, which ``options`` may not.
    reserved: ClassVar[frozenset[str]]

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        options: Mapping[str, Any] | None,
        max_output_tokens: int | None,
    ) -> None:
        provider = self.provider
        if not isinstance(model, str) or not model.strip():
            raise ValueError(f"{provider}: the model name must be a non-empty str, got {model!r}")
        for option, text in (("base_url", base_url), ("api_key", api_key)):
            if text is not None and not isinstance(text, str):
                raise TypeError(
                    f"{provider}: {option} must be a str or None, got {type(text).__qualname__}"
                )
        check_positive(provider, "timeout", timeout)
        if max_output_tokens is not None and (
            not isinstance(max_output_tokens, int)
            or isinstance(max_output_tokens, bool)
            or max_output_tokens < 1
        ):
            raise ValueError(
                f"{provider}: max_output_tokens must be a whole number >= 1 or None, "
                f"got {max_output_tokens!r}"
            )
        self._model = model.strip()
        self._base_url = base_url or os.environ.get(self.base_url_env) or None
        if self._base_url is not None:
            check_base_url(provider, self._base_url)
        self._timeout = float(timeout)
        self._options = check_options(provider, options, self.reserved)
        self._max_output_tokens = max_output_tokens
        self._sdk = import_sdk(provider)
        self._api_key, self._key_hint = resolve_api_key(
            provider, api_key, self.env_var, self._base_url
        )
        self._client: Any = None
        self._closed = False
        self._ids = itertools.count(1)

    @property
    def name(self) -> str:
        """``"<provider>:<model>"``: the key of this model's prices in ``Runtime(prices=...)``."""
        return f"{self.provider}:{self._model}"

    @property
    def model(self) -> str:
        """The model name sent to the provider."""
        return self._model

    @property
    def base_url(self) -> str:
        """Where requests go (the SDK's default when none was given)."""
        if self._client is not None:
            return str(self._client.base_url)
        return self._base_url or self.default_base_url

    #: Shown in messages when no base URL was given and no client exists yet.
    default_base_url: ClassVar[str] = ""

    def __repr__(self) -> str:
        base_url = redact(self.base_url, self._secrets())
        return f"{type(self).__name__}({self._model!r}, base_url={base_url!r})"

    def _secrets(self) -> tuple[str, ...]:
        """What must never be recorded: the key (given or from the environment)."""
        return (self._api_key,)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the SDK client and its connections; the model serves no more requests."""
        self._closed = True
        client, self._client = self._client, None
        if client is not None:
            with anyio.move_on_after(_CLOSE_SECONDS, shield=True):
                await client.close()

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request; a failure of any kind is a ``ProviderError``."""
        if self._closed:
            raise ProviderError(
                self.provider,
                "the model was closed (aclose) and sends no more requests",
                advice="build a new model",
                model=self._model,
            )
        if self._client is None:
            self._client = self.create_client(self._sdk)
        failure: ProviderError
        try:
            status, body = await self.send(self._client, request)
        except Exception as exc:
            error = translate_sdk_error(
                self._sdk,
                exc,
                provider=self.provider,
                model=self._model,
                key_hint=self._key_hint,
                base_url=self.base_url,
                timeout=self._timeout,
            )
            if error is None:  # not the SDK's: a library below it, or a bug
                error = ProviderError(
                    self.provider,
                    f"the request failed: {type(exc).__name__}: {exc}",
                    model=self._model,
                )
            failure = error.redacted(self._secrets())
        else:
            try:
                return self.parse(status, body, request)
            except ProviderError as error:
                failure = error.redacted(self._secrets())
            except Exception as exc:
                detail = f"the reply could not be read: {type(exc).__name__}: {exc}"
                failure = self.malformed(status, detail).redacted(self._secrets())
        # Raised out here, neither chained nor as the context of another: the
        # original exception holds the raw body, which may echo the key.
        raise failure

    def malformed(self, status: int, detail: str) -> ProviderError:
        return malformed(self.provider, self._model, status, detail)

    def new_call_id(self) -> str:
        """A call id for a tool call the server sent without one (or with a repeat)."""
        return f"fractor_call_{next(self._ids)}"

    # -- what a provider implements --------------------------------------------------

    def create_client(self, sdk: ModuleType) -> Any:  # pragma: no cover - abstract
        raise NotImplementedError

    async def send(
        self, client: Any, request: ModelRequest
    ) -> tuple[int, bytes]:  # pragma: no cover - abstract
        raise NotImplementedError

    def parse(
        self, status: int, body: bytes, request: ModelRequest
    ) -> ModelResponse:  # pragma: no cover - abstract
        raise NotImplementedError


async def read_raw(raw: Any) -> tuple[int, bytes]:
    """Status and body of an SDK ``with_raw_response`` result (either flavour)."""
    http_response = raw.http_response
    body: bytes = await http_response.aread()
    status: int = http_response.status_code
    return status, body


# -- token estimates ------------------------------------------------------------------


def estimate_request_tokens(
    request: ModelRequest,
    *,
    chars_per_token: float,
    per_message: int,
    per_tool: int,
    base: int = 0,
    tools_preamble: int = 0,
) -> int:
    """A provider's estimate of the input tokens of ``request``, linear in its size.

    ``ceil(chars / chars_per_token)`` over every message's text (tool call names and
    arguments, tool results included) and every tool spec (name, description, JSON
    schema), plus ``per_message`` tokens per message, ``per_tool`` per tool,
    ``tools_preamble`` once when tools are offered and ``base`` once.
    """
    chars = 0
    for message in request.messages:
        chars += len(message.content)
        if type(message) is AssistantMessage:
            for tool_call in message.tool_calls:
                chars += len(tool_call.name) + len(tool_call.arguments) + len(tool_call.id)
    for spec in request.tools:
        chars += len(spec.name) + len(spec.description)
        chars += len(_json_encoder.encode(spec.parameters))
    tokens = -int(-chars // chars_per_token) if chars else 0
    tokens += base + per_message * len(request.messages)
    if request.tools:
        tokens += tools_preamble + per_tool * len(request.tools)
    return tokens


def estimate_output_tokens(text: str, arguments: int = 0, chars_per_token: float = 4.0) -> int:
    """Output tokens of a response whose server reported no usage: an estimate."""
    chars = len(text) + arguments
    return max(1, -int(-chars // chars_per_token)) if chars else 0
