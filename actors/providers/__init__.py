"""The real model providers, three modules per wire format, and the model-string registry.

- ``_base.py``: what every provider shares (``ProviderModel``: configuration, the
  SDK client, requests and streams), with ``_errors.py`` (``ProviderError``, its
  classification, ``redact``), ``_sse.py`` (server-sent events and the
  ``StreamReader`` each wire format implements) and ``_estimates.py`` (token
  estimates). Both providers build on them; neither imports the other, nor this
  ``__init__``.
- ``_openai.py``: ``OpenAIModel``, the chat completions wire format (OpenAI and every
  OpenAI-compatible server: vLLM, Ollama, llama.cpp, LM Studio), and its requests;
  ``_openai_response.py`` reads a completion, ``_openai_stream.py`` a streamed one
  (``OpenAIStreamReader``).
- ``_anthropic.py``: ``AnthropicModel``, Anthropic's Messages API, and its requests;
  ``_anthropic_response.py`` reads a message, ``_anthropic_stream.py`` a streamed one
  (``AnthropicStreamReader``). A model's module imports its readers, never the reverse.
- Here: ``model_from_string("openai:gpt-4.1-mini")``, the model string form of the
  command line and of configuration files: ``PROVIDER:MODEL``, split at the first
  colon (so ``openai:llama3.2:3b`` is the Ollama model ``llama3.2:3b``).

A new wire format is one more such trio of modules, one more entry in
``PROVIDERS`` and one more branch of ``model_from_string``.
"""

import typing

from .. import _models
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

#: The providers a model string may name.
PROVIDERS = ("anthropic", "openai")


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
    builds ``AnthropicModel("claude-sonnet-4-5")``. The string is split at the first
    colon; the provider is case-insensitive. ``options`` are request options sent
    with every request (``temperature=0.2``, ...). Raises ``ValueError`` for a string
    without a provider or a model, or with an unknown provider.
    """
    if not isinstance(spec, str):
        raise TypeError(f"a model string is a str like 'openai:gpt-4.1-mini', got {spec!r}")
    provider, colon, name = spec.strip().partition(":")
    provider = provider.strip().lower()
    name = name.strip()
    known = " or ".join(f"'{p}:MODEL'" for p in PROVIDERS)
    if not colon or not provider:
        raise ValueError(
            f"model string {spec!r} names no provider: write it as {known}, "
            "for example 'openai:gpt-4.1-mini' or 'anthropic:claude-sonnet-4-5'"
        )
    if provider not in PROVIDERS:
        raise ValueError(
            f"unknown provider {provider!r} in model string {spec!r}: known providers are "
            f"{', '.join(PROVIDERS)} (any OpenAI-compatible server: 'openai:MODEL' with a "
            "base URL)"
        )
    if not name:
        raise ValueError(f"model string {spec!r} names no model: write it as {known}")
    if provider == "openai":
        return OpenAIModel(
            name, base_url=base_url, api_key=api_key, timeout=timeout, options=options
        )
    return AnthropicModel(
        name, base_url=base_url, api_key=api_key, timeout=timeout, options=options
    )
