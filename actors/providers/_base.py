"""What the model providers share: their base.

- ``ProviderModel``: the base of ``OpenAIModel`` (``_openai.py``) and
  ``AnthropicModel`` (``_anthropic.py``): configuration, the SDK client's life, error
  translation (``_errors.py``), and streaming: ``stream`` reads the server-sent
  events of a streamed response (``_sse.py``) and hands each to the provider's
  ``StreamReader``, closes the connection at once when cut short (a deadline, a
  stop), and turns a stream that breaks part-way into a ``ProviderError`` carrying
  the usage of what was received. Neither provider imports the other; the
  ``model_from_string`` registry that names them both lives in the package's
  ``__init__``.
- ``Asker``: what reading a response needs of the model that asked for it (each
  wire format's response and stream readers take one).
- Around it: ``_errors.py`` (``ProviderError``), ``_sse.py`` (server-sent events,
  ``StreamReader``), ``_estimates.py`` (the token estimates of the budget pre-check),
  ``_ratelimits.py`` (what a response's headers say of the server's rate limits:
  every answer, whole or streamed, carries it as ``ModelResponse.limits``, and every
  HTTP error as ``ProviderError.limits``).

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
import urllib.parse
from collections.abc import AsyncGenerator, Collection, Mapping
from types import ModuleType
from typing import Any, ClassVar, Protocol, Self

import anyio
import msgspec

from .._messages import ModelRequest, ModelResponse
from .._models._protocol import Sink
from ._content import KINDS, Parts, check_accepts
from ._errors import ProviderError, malformed, redact, timed_out, translate_sdk_error
from ._ratelimits import server_limits
from ._sse import MAX_EVENT, EventTooLarge, SinkFailed, StreamReader, finish_stream, sse_events

__all__ = [
    "Asker",
    "ProviderModel",
]

#: The placeholder key sent to a server given by ``base_url`` when no key is known:
#: local servers (vLLM, Ollama, llama.cpp, LM Studio) ignore it, the SDKs want one.
PLACEHOLDER_KEY = "not-needed"

#: How long ``aclose`` may take to close the SDK client's connections.
_CLOSE_SECONDS = 5.0

#: The bytes an event of a stream may hold, past what its output cap allows (the
#: event's JSON around its text; Azure's content-filter results on the first chunk).
_EVENT_FRAMING = 64 * 1024
#: The bytes an event may hold for each character of output the cap allows (text
#: escaped in JSON takes up to six, ``\uXXXX``).
_EVENT_BYTES_PER_CHAR = 8


class Asker(Protocol):
    """What reading a response (in one piece or streamed) needs of the model that
    asked for it: its names, its input estimate, call ids, its errors."""

    @property
    def provider(self) -> str: ...

    @property
    def name(self) -> str: ...

    @property
    def model(self) -> str: ...

    def estimate_tokens(self, request: ModelRequest) -> int: ...

    def new_call_id(self) -> str: ...

    def broken(self, status: int | None, detail: str) -> ProviderError: ...

    def malformed(self, status: int, detail: str) -> ProviderError: ...


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
    ``base_url`` (local servers need no key); with neither, a ``ProviderError`` of
    kind ``"no_key"`` (which the command line words in its own options).
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
        kind="no_key",
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


# -- the base of both providers -------------------------------------------------------


class ProviderModel:
    """What ``OpenAIModel`` and ``AnthropicModel`` share: configuration, the SDK
    client's life, error translation and call ids. A subclass builds the client,
    sends one request and parses one response body.

    The SDK client is created at the first request (so a model can be built outside
    any event loop) with the SDK's own retries off, and closed by ``aclose`` (a
    runtime closes the models of its agents as it exits): its connections belong to
    the event loop they were made in. A request after ``aclose`` opens a new client,
    so one model serves one ``anyio.run`` after another.

    ``accepts`` names the kinds of parts the endpoint takes, ``"image"``,
    ``"document"`` and ``"audio"`` (all by default, as far as the wire format carries
    them: Anthropic's takes no audio, and says so): ``accepts=()`` for a server that takes text
    only (a llama.cpp server without a vision projector), ``("image",)`` for one that
    reads images but not PDFs. A request carrying a part of another kind, or a part
    with no bytes (``stored``), is a ``ProviderError`` (``kind="content"``, not
    retryable) naming the part, raised before anything is sent.
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
        stream: bool = True,
        accepts: Collection[str] = KINDS,
    ) -> None:
        provider = self.provider
        if not isinstance(stream, bool):
            raise TypeError(f"{provider}: stream must be True or False, got {stream!r}")
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
        self._client: _Held | None = None
        self._ids = itertools.count(1)
        self._stream = stream
        self._accepts = check_accepts(provider, accepts)

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
        """Where requests go (the SDK's default when none was given), as it may be
        shown: credentials in the URL (``user:password@``) and the key are redacted."""
        if self._client is not None:
            url = str(self._client.client.base_url)
        else:
            url = self._base_url or self.default_base_url
        return redact(url, self._secrets())

    #: Shown in messages when no base URL was given and no client exists yet.
    default_base_url: ClassVar[str] = ""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self._model!r}, base_url={self.base_url!r})"

    def _secrets(self) -> tuple[str, ...]:
        """What must never be recorded: the key (given or from the environment)."""
        return (self._api_key,)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the SDK client and its connections: at once when no request uses it,
        else as the last one using it ends (a runtime closing a model that another
        one still uses cuts none of its requests). A later request opens a new client;
        closing again does nothing."""
        held, self._client = self._client, None
        if held is not None:
            held.retired = True
            if not held.users:
                await held.close()

    @property
    def accepts(self) -> frozenset[str]:
        """The kinds of parts this model's endpoint takes (``accepts=`` at
        construction; by default both, ``"image"`` and ``"document"``). A request
        carrying a part of another kind is refused before anything is sent."""
        return self._accepts

    def parts(self) -> Parts:
        """A new ``Parts`` for one request build: checks each part, encodes it once."""
        return Parts(self.provider, self._model, self._accepts)

    @property
    def streaming(self) -> bool:
        """Whether agents stream this model's requests (``stream=`` at construction)."""
        return self._stream

    def _hold(self) -> _Held:
        """The SDK client for one more request, made at the first request (and the
        first after ``aclose``); the request lets go of it with ``_Held.release``."""
        held = self._client
        if held is None:
            held = self._client = _Held(self.create_client(self._sdk))
        held.users += 1
        return held

    def _failure(self, exc: Exception) -> ProviderError:
        """The redacted ``ProviderError`` for an exception raised while sending."""
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
                "the request failed",
                detail=f"{type(exc).__name__}: {exc}",
                model=self._model,
            )
        return error.redacted(self._secrets())

    async def request(self, request: ModelRequest) -> ModelResponse:
        """Send one request; a failure of any kind is a ``ProviderError``.

        ``timeout`` bounds the whole request, from sending it to the last byte of the
        body (the SDK's own timeout bounds each wait for data: a server that trickles
        its body never lets one run out): past it, a retryable ``ProviderError``.
        """
        held = self._hold()
        try:
            return await self._request(held.client, request)
        finally:
            await held.release()

    async def _request(self, client: Any, request: ModelRequest) -> ModelResponse:
        failure: ProviderError | None = None
        with anyio.move_on_after(self._timeout):
            try:
                status, body, headers = await self.send(client, request)
            except ProviderError as error:  # the request refused before it was sent
                failure = error.redacted(self._secrets())
            except Exception as exc:
                failure = self._failure(exc)
            else:
                try:
                    return _with_limits(self.parse(status, body, request), headers)
                except ProviderError as error:
                    failure = error.redacted(self._secrets())
                except Exception as exc:
                    detail = f"the reply could not be read: {type(exc).__name__}: {exc}"
                    failure = self.malformed(status, detail).redacted(self._secrets())
        # Raised out here, neither chained nor as the context of another: the
        # original exception holds the raw body, which may echo the key. With no
        # failure, only the deadline ended the block.
        raise self._timed_out(None) if failure is None else failure

    async def stream(self, request: ModelRequest, sink: Sink) -> ModelResponse:
        """Send one request streamed: each piece of the answer's text goes to ``sink``
        as it arrives; the response is the one ``request`` would return.

        A cancellation (a deadline, a stop) closes the connection at once, shielded, so
        the server sees the client go and stops generating. A stream that fails
        part-way (the server's error event, a cut connection, garbage, no end) is a
        ``ProviderError`` whose ``usage`` is what the server reported, or the input
        estimate plus an estimate of what was received. A server that answers with
        one JSON body instead of a stream is read as such (its text reaches ``sink``
        in one piece). A server that streams far past the output cap (it ignores
        ``max_tokens``), or sends one event far larger than the cap allows (a line
        of megabytes, a body with no line break), is cut off, not retried; an event
        is never held past that bound. ``timeout`` bounds the whole request, every
        event of the stream included: keep-alive comments do not hold it open past
        it (a retryable ``ProviderError`` carrying the usage so far). An exception
        raised by ``sink`` is the caller's and is raised as it is (the connection
        closed first), never retried.
        """
        held = self._hold()
        try:
            return await self._streamed(held.client, request, sink)
        finally:
            await held.release()

    async def _streamed(self, client: Any, request: ModelRequest, sink: Sink) -> ModelResponse:
        def guarded(text: str) -> None:
            try:
                sink(text)
            except Exception as exc:
                raise SinkFailed(exc) from exc

        reader = self.stream_reader(request, guarded)
        cap = request.max_tokens or self._max_output_tokens
        too_long = None if cap is None else 16 * cap + 1024
        max_event = (
            MAX_EVENT
            if too_long is None
            else min(MAX_EVENT, _EVENT_FRAMING + _EVENT_BYTES_PER_CHAR * too_long)
        )
        status: int | None = None
        headers: Mapping[str, str] | None = None
        failure: ProviderError
        try:
            with anyio.move_on_after(self._timeout):
                manager = self.open_stream(client, request)
                response = await manager.__aenter__()
                # The body's bytes straight from httpx (the SDK's iter_bytes wraps them
                # in a generator it never closes); closed below, with the connection.
                chunks: AsyncGenerator[bytes, None] = response.http_response.aiter_bytes()
                events = sse_events(chunks, max_event=max_event)
                reading = False
                try:
                    status = int(response.status_code)
                    headers = response.headers
                    if "json" in response.headers.get("content-type", ""):
                        body: bytes = await response.read()
                        answer = _with_limits(self.parse(status, body, request), headers)
                        if answer.text:
                            guarded(answer.text)
                        return answer
                    reading = True
                    async for name, data in events:
                        if reader.feed(name, data):
                            break
                        if too_long is not None and reader.received > too_long:
                            raise ProviderError(
                                self.provider,
                                f"the server streamed more than {too_long} characters for "
                                f"an output cap of {cap} tokens, and was cut off",
                                advice="it ignores max_tokens: check the server's options",
                                model=self._model,
                                status=status,
                            )
                    return _with_limits(reader.response(status), headers)
                finally:
                    # Shielded, so a cancellation closes too: the server sees the client go.
                    with anyio.CancelScope(shield=True), anyio.move_on_after(_CLOSE_SECONDS):
                        await manager.__aexit__(None, None, None)
                        await finish_stream(events, chunks, started=reading)
            # Every way through the block returns or raises: only the deadline ends it.
            raise self._timed_out(status)
        except SinkFailed as failed:
            # The caller's own error, not the provider's: no retry would mend it.
            raise failed.error from None
        except ProviderError as error:
            failure = error.redacted(self._secrets())
        except EventTooLarge as exc:
            per_cap = "" if cap is None else f" (the most for an output cap of {cap} tokens)"
            failure = ProviderError(
                self.provider,
                f"the server sent an event of more than {exc.limit} bytes{per_cap}, and "
                "was cut off",
                advice=(
                    "it ignores max_tokens, or does not send server-sent events: check "
                    "the server's options and the base URL; not retried"
                ),
                model=self._model,
                status=status,
            )
        except Exception as exc:
            if status is None:  # before any byte of the stream: as for a request
                failure = self._failure(exc)
            else:  # a stall is silence; a body cut short is for its reader to judge
                if _stalled(exc):  # the SDK's wait for data ran out first
                    failure = self._timed_out(status)
                else:
                    failure = reader.broken(status, self._cut(exc)).redacted(self._secrets())
        if failure.usage is None and status is not None:
            failure.spent(reader.usage())
        if failure.limits is None and headers:
            # A stream that broke part-way: its response's headers still said them.
            failure.limits = server_limits(headers)
        raise failure

    def _cut(self, exc: Exception) -> str:
        """What broke a stream off, in words."""
        kind = type(exc).__name__
        return f"{kind}: {exc}" if str(exc) else kind

    def _timed_out(self, status: int | None) -> ProviderError:
        """A request that ran past ``timeout``: its response not complete in time."""
        return timed_out(self.provider, self._model, self._timeout, status)

    def broken(self, status: int | None, detail: str) -> ProviderError:
        """A stream that ended or broke before its last event."""
        return ProviderError(
            self.provider,
            "the stream broke off before the response was complete",
            detail=detail,
            advice="retryable (the agent's RetryPolicy decides how often)",
            model=self._model,
            status=status,
            retryable=True,
            kind="broken",
        )

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
    ) -> tuple[int, bytes, Mapping[str, str]]:  # pragma: no cover - abstract
        """Send ``request`` in one piece: the response's status, body and headers
        (an HTTP error status raises the SDK's error)."""
        raise NotImplementedError

    def parse(
        self, status: int, body: bytes, request: ModelRequest
    ) -> ModelResponse:  # pragma: no cover - abstract
        raise NotImplementedError

    def open_stream(self, client: Any, request: ModelRequest) -> Any:  # pragma: no cover - abstract
        """The SDK's streaming-response context manager for ``request``; entering it
        sends the request (and raises the SDK's error for an HTTP error status)."""
        raise NotImplementedError

    def stream_reader(
        self, request: ModelRequest, sink: Sink
    ) -> StreamReader:  # pragma: no cover - abstract
        raise NotImplementedError


def _stalled(exc: Exception) -> bool:
    """Whether a stream broke off because the SDK's wait for data ran out (the
    model's own deadline is at least as near: a rare race)."""
    return isinstance(exc, TimeoutError) or type(exc).__name__.endswith("Timeout")


async def read_raw(raw: Any) -> tuple[int, bytes, Mapping[str, str]]:
    """Status, body and headers of an SDK ``with_raw_response`` result (either
    flavour): the httpx response's own, no copy (its body read once)."""
    http_response = raw.http_response
    body: bytes = await http_response.aread()
    status: int = http_response.status_code
    return status, body, http_response.headers


def _with_limits(response: ModelResponse, headers: Mapping[str, str]) -> ModelResponse:
    """``response`` with what ``headers`` said of the rate limits, if they said any."""
    limits = server_limits(headers)
    return response if limits is None else msgspec.structs.replace(response, limits=limits)


class _Held:
    """An SDK client and how many requests use it now: a retired one (the model was
    closed) is closed by the last of them, or at once when none does."""

    __slots__ = ("client", "retired", "users")

    def __init__(self, client: Any) -> None:
        self.client = client
        self.users = 0
        self.retired = False

    async def release(self) -> None:
        self.users -= 1
        if self.retired and not self.users:
            await self.close()

    async def close(self) -> None:
        with anyio.move_on_after(_CLOSE_SECONDS, shield=True):
            await self.client.close()
