"""What kind of failure a provider's HTTP error is (``ProviderError.kind``): what a
model that falls back to another reads. The bodies are the servers' own shapes."""

from __future__ import annotations

import pytest

from fractor.actors.providers._errors import status_error


def _kind(status: int, body: object) -> tuple[str, bool]:
    error = status_error("openai", "m", status, body, None, key_hint="sk-...", base_url="u")
    return error.kind, error.retryable


@pytest.mark.parametrize(
    ("status", "body"),
    [
        # OpenAI
        (
            400,
            {
                "error": {
                    "message": "This model's maximum context length is 8192 tokens.",
                    "type": "invalid_request_error",
                    "code": "context_length_exceeded",
                }
            },
        ),
        # Anthropic
        (
            400,
            {
                "type": "error",
                "error": {
                    "type": "invalid_request_error",
                    "message": "prompt is too long: 210000 tokens > 200000 maximum",
                },
            },
        ),
        # vLLM
        (
            400,
            {
                "object": "error",
                "message": "This model's maximum context length is 4096 tokens. However, "
                "you requested 5000 tokens.",
                "type": "BadRequestError",
                "code": 400,
            },
        ),
        # llama.cpp's server
        (
            400,
            {
                "error": {
                    "code": 400,
                    "message": "the request exceeds the available context size, try increasing it",
                    "type": "exceed_context_size_error",
                }
            },
        ),
    ],
)
def test_a_request_too_long_for_the_context_is_a_context_length_error(
    status: int, body: object
) -> None:
    assert _kind(status, body) == ("context_length", False)


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}},
         "rate_limited", True),
        (429, {"error": {"message": "Request too large for gpt-4o", "code": "rate_limit_exceeded"}},
         "too_large", False),
        (429, {"error": {"message": "quota", "code": "insufficient_quota"}}, "quota", False),
        (500, {"error": {"message": "boom"}}, "server", True),
        (529, {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
         "server", True),
        (401, {"error": {"message": "bad key"}}, "auth", False),
        (404, {"error": {"message": "no such model"}}, "not_found", False),
        (413, "too big", "too_large", False),
        (400, {"error": {"message": "bad temperature"}}, "rejected", False),
    ],
)  # fmt: skip
def test_each_status_says_its_kind(status: int, body: object, kind: str, retryable: bool) -> None:
    assert _kind(status, body) == (kind, retryable)


def test_a_redacted_error_keeps_its_kind() -> None:
    error = status_error("openai", "m", 500, "x", None, key_hint="k", base_url="u")
    assert error.redacted(["k"]).kind == "server"
