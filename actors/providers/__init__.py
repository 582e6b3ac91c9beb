"""The real model providers, one module (or a few) per wire format, and the
model-string registry.

- ``_base.py``: what every provider shares (``ProviderModel``: configuration, the
  SDK client, requests and streams), with ``_errors.py`` (``ProviderError``, its
  classification, ``redact``), ``_sse.py`` (server-sent events and the
  ``StreamReader`` each wire format implements), ``_estimates.py`` (token
  estimates) and ``_content.py`` (images and documents: each part checked, and its
  base64 made once per request). Both providers build on them; neither imports the other, nor this
  ``__init__``.
- ``_openai.py``: ``OpenAIModel``, the chat completions wire format (OpenAI and every
  OpenAI-compatible server: vLLM, Ollama, llama.cpp, LM Studio), and its requests;
  ``_openai_response.py`` reads a completion, ``_openai_stream.py`` a streamed one
  (``OpenAIStreamReader``).
- ``_anthropic.py``: ``AnthropicModel``, Anthropic's Messages API, and its requests;
  ``_anthropic_response.py`` reads a message, ``_anthropic_stream.py`` a streamed one
  (``AnthropicStreamReader``). A model's module imports its readers, never the reverse.
- Here: ``PROVIDERS``, the registry, and ``model_from_string("openai:gpt-4.1-mini")``,
  the model string form of the command line and of configuration files:
  ``PROVIDER:MODEL``, split at the first colon (so ``openai:llama3.2:3b`` is the
  Ollama model ``llama3.2:3b``), built by what ``PROVIDERS`` holds for ``PROVIDER``.

A new wire format is its own module(s) and one entry in ``PROVIDERS``: here for one
of fractor's, or from anywhere for one of yours (``PROVIDERS["mistral"] =
MistralModel``): nothing else names the providers. Its entry is the model's class
(or any function) called as ``OpenAIModel`` is: ``(model, *, base_url, api_key,
timeout, options)``.
"""

import collections.abc
import typing

from .._models import _protocol as _models
from ._anthropic import AnthropicModel as AnthropicModel
from ._base import ProviderModel as ProviderModel
from ._errors import ProviderError as ProviderError
from ._errors import redact as redact
from ._openai import OpenAIModel as OpenAIModel

__all__ = [
    "PROVIDERS",
    "AnthropicModel",
    "OpenAIModel",
    "ProviderError",
    "ProviderModel",
    "model_from_string",
    "redact",
]


class _ModelFactory(typing.Protocol):
    """What a ``PROVIDERS`` entry is: the model's class, or any function called alike."""

    def __call__(
        self,
        model: str,
        /,
        *,
        base_url: str | None,
        api_key: str | None,
        timeout: float,
        options: collections.abc.Mapping[str, typing.Any],
    ) -> _models.Model: ...


#: The providers a model string may name (in lower case), and what builds the model of
#: each. Add one with ``PROVIDERS[name] = factory``: ``model_from_string``, and so the
#: command line, know it from here.
PROVIDERS: dict[str, _ModelFactory] = {
    "anthropic": AnthropicModel,
    "openai": OpenAIModel,
}


def model_from_string(
    spec: str,
    *,
    base_url: str | None = None,
    api_key: str | None = None,
    timeout: float = 60.0,
    **options: typing.Any,
) -> _models.Model:
    """The model a ``PROVIDER:MODEL`` string names.

    ``"openai:gpt-4.1-mini"`` builds ``OpenAIModel("gpt-4.1-mini")`` (also for any
    OpenAI-compatible server, with ``base_url``), ``"anthropic:claude-sonnet-4-5"``
    builds ``AnthropicModel("claude-sonnet-4-5")``: whatever ``PROVIDERS`` holds for
    the provider builds the model. The string is split at the first colon; the
    provider is case-insensitive. ``options`` are request options sent with every
    request (``temperature=0.2``, ...). Raises ``ValueError`` for a string without a
    provider or a model, or with an unknown provider.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a model string is a str like 'openai:gpt-4.1-mini', got {spec!r}")
    provider, colon, name = spec.strip().partition(":")
    provider = provider.strip().lower()
    name = name.strip()
    known = " or ".join(f"'{p}:MODEL'" for p in sorted(PROVIDERS))
    if not colon or not provider:
        raise ValueError(
            f"model string {spec!r} names no provider: write it as {known}, "
            "for example 'openai:gpt-4.1-mini' or 'anthropic:claude-sonnet-4-5'"
        )
    build = PROVIDERS.get(provider)
    if build is None:
        raise ValueError(
            f"unknown provider {provider!r} in model string {spec!r}: known providers are "
            f"{', '.join(sorted(PROVIDERS))} (any OpenAI-compatible server: 'openai:MODEL' "
            "with a base URL)"
        )
    if not name:
        raise ValueError(f"model string {spec!r} names no model: write it as {known}")
    return build(name, base_url=base_url, api_key=api_key, timeout=timeout, options=options)
