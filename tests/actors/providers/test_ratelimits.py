"""What the servers say of their rate limits: ``server_limits`` on each header set,
the Go durations of OpenAI's resets, and what an error's limits and retry_after are."""

from __future__ import annotations

import datetime
import email.utils
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fractor.actors import ModelRequest, ProviderError, ServerLimits, UserMessage
from fractor.actors._requests._rate import _heard
from fractor.actors.providers._errors import status_error
from fractor.actors.providers._ratelimits import parse_duration, retry_after_in, server_limits
from fractor.runtime import RateLimit
from fractor.runtime.lowlevel import DIMENSIONS, Dimension, Rates

from ..loopback import LoopbackServer, json_reply
from .wires import Wire, anthropic_error, openai_error

NOW = 1_760_000_000.0  # a fixed "now", in seconds since the epoch


def _rfc3339(seconds_from_now: float) -> str:
    when = datetime.datetime.fromtimestamp(NOW + seconds_from_now, tz=datetime.UTC)
    return when.isoformat().replace("+00:00", "Z")


# -- Go durations -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("12ms", 0.012),
        ("120ms", 0.12),
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("4m12.172s", 252.172),
        ("23h18m29.144s", 23 * 3600 + 18 * 60 + 29.144),
        ("1.5s", 1.5),
        ("250µs", 0.00025),
        ("250us", 0.00025),
        ("40ns", 4e-8),
        ("0", 0.0),
        ("0s", 0.0),
        ("2.5", 2.5),  # a bare number of seconds, as some proxies send
    ],
)
def test_go_durations_read_as_seconds(text: str, seconds: float) -> None:
    assert parse_duration(text) == pytest.approx(seconds, rel=1e-12, abs=1e-15)


@pytest.mark.parametrize("text", ["", "soon", "1x", "-1", "-1s", "s", "1s2", "nan", "inf", "1e999"])
def test_durations_that_do_not_read_are_none(text: str) -> None:
    assert parse_duration(text) is None


def _fraction(amount: int, unit: int) -> str:
    """``amount / unit`` as Go prints it: the whole part, and the fraction's digits
    without trailing zeros."""
    whole, part = divmod(amount, unit)
    digits = str(part).rjust(len(str(unit)) - 1, "0").rstrip("0")
    return f"{whole}.{digits}" if digits else str(whole)


def _go(nanoseconds: int) -> str:
    """A duration as Go's ``time.Duration.String`` prints it."""
    if nanoseconds == 0:
        return "0s"
    if nanoseconds < 1_000:
        return f"{nanoseconds}ns"
    if nanoseconds < 1_000_000:
        return _fraction(nanoseconds, 1_000) + "µs"
    if nanoseconds < 1_000_000_000:
        return _fraction(nanoseconds, 1_000_000) + "ms"
    hours, rest = divmod(nanoseconds, 3600 * 10**9)
    minutes, rest = divmod(rest, 60 * 10**9)
    text = f"{hours}h" if hours else ""
    if hours or minutes:
        text += f"{minutes}m"
    return text + _fraction(rest, 10**9) + "s"


@given(st.integers(min_value=0, max_value=200 * 3600 * 10**9))
def test_every_go_duration_reads_back_as_its_seconds(nanoseconds: int) -> None:
    assert parse_duration(_go(nanoseconds)) == pytest.approx(
        nanoseconds / 1e9, rel=1e-12, abs=1e-12
    )


@given(st.text(max_size=30))
def test_no_text_makes_the_duration_parser_raise(text: str) -> None:
    seconds = parse_duration(text)
    assert seconds is None or seconds >= 0


@given(st.dictionaries(st.sampled_from(["x-ratelimit-reset-tokens", "retry-after",
    "anthropic-ratelimit-requests-reset", "x-ratelimit-limit-requests", "retry-after-ms",
    "anthropic-ratelimit-tokens-remaining"]), st.text(max_size=40)))  # fmt: skip
def test_no_header_value_makes_the_parser_raise(headers: dict[str, str]) -> None:
    limits = server_limits(headers, now=NOW)
    if limits is not None:
        for value in (getattr(limits, name) for name in limits.__struct_fields__):
            assert value is None or value >= 0


# -- the header sets ----------------------------------------------------------------------


def test_openai_headers() -> None:
    headers = {
        "x-ratelimit-limit-requests": "60",
        "x-ratelimit-limit-tokens": "150000",
        "x-ratelimit-remaining-requests": "59",
        "x-ratelimit-remaining-tokens": "149984",
        "x-ratelimit-reset-requests": "1s",
        "x-ratelimit-reset-tokens": "6m0s",
        "content-type": "application/json",
    }
    assert server_limits(headers, now=NOW) == ServerLimits(
        requests_limit=60,
        requests_remaining=59,
        requests_reset=1.0,
        tokens_limit=150_000,
        tokens_remaining=149_984,
        tokens_reset=360.0,
    )


def test_anthropic_headers_read_resets_as_seconds_from_now() -> None:
    headers: dict[str, str] = {}
    for bucket, limit, remaining, reset in (
        ("requests", 50, 49, 1.5),
        ("tokens", 90_000, 89_000, 0.25),
        ("input-tokens", 40_000, 39_000, 2.0),
        ("output-tokens", 8_000, 8_000, -30.0),  # already past: 0, never negative
    ):
        headers[f"anthropic-ratelimit-{bucket}-limit"] = str(limit)
        headers[f"anthropic-ratelimit-{bucket}-remaining"] = str(remaining)
        headers[f"anthropic-ratelimit-{bucket}-reset"] = _rfc3339(reset)
    headers["retry-after"] = "3"
    limits = server_limits(headers, now=NOW)
    # (1.5 s, 0.25 s and 2 s from an integral NOW are exact in floats and timestamps)
    assert limits == ServerLimits(
        requests_limit=50,
        requests_remaining=49,
        requests_reset=1.5,
        tokens_limit=90_000,
        tokens_remaining=89_000,
        tokens_reset=0.25,
        input_tokens_limit=40_000,
        input_tokens_remaining=39_000,
        input_tokens_reset=2.0,
        output_tokens_limit=8_000,
        output_tokens_remaining=8_000,
        output_tokens_reset=0.0,
        retry_after=3.0,
    )


def test_header_names_are_read_in_any_case() -> None:
    limits = server_limits({"X-RateLimit-Remaining-Requests": "7", "Retry-After": "2"}, now=NOW)
    assert limits == ServerLimits(requests_remaining=7, retry_after=2.0)


def test_retry_after_in_seconds_as_a_date_and_in_milliseconds() -> None:
    date = email.utils.formatdate(NOW + 30, usegmt=True)
    assert server_limits({"retry-after": "1.5"}, now=NOW) == ServerLimits(retry_after=1.5)
    assert server_limits({"retry-after": date}, now=NOW) == ServerLimits(retry_after=30.0)
    past = email.utils.formatdate(NOW - 30, usegmt=True)
    assert server_limits({"retry-after": past}, now=NOW) == ServerLimits(retry_after=0.0)
    # retry-after-ms wins (as in both SDKs): it is the finer of the two
    both = {"retry-after": "1", "retry-after-ms": "644"}
    assert server_limits(both, now=NOW) == ServerLimits(retry_after=0.644)
    # a garbled retry-after-ms leaves retry-after to say it
    garbled = {"retry-after": "2", "retry-after-ms": "soon"}
    assert server_limits(garbled, now=NOW) == ServerLimits(retry_after=2.0)


def test_garbage_negative_and_minus_one_are_left_out_field_by_field() -> None:
    headers = {
        "x-ratelimit-limit-requests": "-1",  # Azure
        "x-ratelimit-remaining-requests": "lots",
        "x-ratelimit-reset-requests": "-2s",
        "x-ratelimit-limit-tokens": "1000",
        "x-ratelimit-remaining-tokens": "1.5",
        "x-ratelimit-reset-tokens": "soon",
        "anthropic-ratelimit-requests-reset": "tomorrow",
        "anthropic-ratelimit-output-tokens-remaining": "0",  # 0 is a count, kept
        "retry-after": "-5",
        "x-ratelimit-remaining-tokens_usage_based": "12",  # a variant: not read
    }
    assert server_limits(headers, now=NOW) == ServerLimits(
        tokens_limit=1000, output_tokens_remaining=0
    )


def test_headers_that_say_nothing_of_limits_are_none() -> None:
    assert server_limits({}, now=NOW) is None
    assert server_limits({"content-type": "application/json", "x-request-id": "1"}) is None
    assert server_limits({"x-ratelimit-remaining-requests": "garbage"}) is None


def test_the_wait_an_openai_429_message_asks_for() -> None:
    message = (
        "Rate limit reached for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Used 29937, Requested 385. Please try again in 644ms. Visit ..."
    )
    assert retry_after_in(message) == pytest.approx(0.644)
    assert retry_after_in("Please try again in 1.5s.") == pytest.approx(1.5)
    assert retry_after_in("Please try again in 1m30s.") == pytest.approx(90.0)
    assert retry_after_in("Please try again later.") is None


# -- what an error carries ----------------------------------------------------------------


def _error(status: int, body: Any, headers: dict[str, str] | None = None) -> ProviderError:
    return status_error(
        "openai", "m", status, body, headers, key_hint="$OPENAI_API_KEY", base_url="http://x"
    )


def _openai_429(message: str, code: str = "rate_limit_exceeded") -> dict[str, Any]:
    return {"error": {"message": message, "type": "tokens", "param": None, "code": code}}


def test_a_429_carries_its_limits_and_the_wait_its_message_asks_for() -> None:
    headers = {"x-ratelimit-remaining-tokens": "0", "x-ratelimit-reset-tokens": "644ms"}
    error = _error(429, _openai_429("... Please try again in 644ms."), headers)
    assert error.retryable
    assert error.retry_after == pytest.approx(0.644)
    assert error.limits == ServerLimits(
        tokens_remaining=0, tokens_reset=parse_duration("644ms"), retry_after=error.retry_after
    )
    # a header says it first
    error = _error(429, _openai_429("Please try again in 644ms."), {"retry-after": "2"})
    assert error.retry_after == 2.0
    assert error.limits == ServerLimits(retry_after=2.0)
    # no header at all
    error = _error(429, _openai_429("Please try again in 1.5s."), None)
    assert (error.retry_after, error.limits) == (1.5, ServerLimits(retry_after=1.5))
    # the message is read on a 429 only
    assert _error(500, _openai_429("Please try again in 1s."), None).retry_after is None


def test_a_request_too_large_for_the_rate_is_never_retried() -> None:
    body = _openai_429(
        "Request too large for gpt-4o in organization org-x on tokens per min (TPM): "
        "Limit 30000, Requested 31538. The input or output tokens must be reduced"
    )
    for headers in (None, {"x-should-retry": "true", "retry-after": "1"}):
        error = _error(429, body, headers)
        assert not error.retryable
        assert error.status == 429
        assert "larger than the rate limit" in str(error)
    # an ordinary rate limit stays retryable, a spent quota does not (as before)
    assert _error(429, _openai_429("Rate limit reached for gpt-4o ...")).retryable
    quota = _error(429, _openai_429("You exceeded your quota", code="insufficient_quota"))
    assert not quota.retryable
    assert "quota" in str(quota)


def test_a_503_with_retry_after_says_it() -> None:
    error = _error(503, {"error": "busy"}, {"retry-after": "4"})
    assert error.retryable
    assert error.retry_after == 4.0
    assert error.limits == ServerLimits(retry_after=4.0)


def test_redacted_keeps_the_limits() -> None:
    error = _error(429, _openai_429("key sk-secret Please try again in 2s."))
    redacted = error.redacted(["sk-secret"])
    assert redacted.limits == error.limits == ServerLimits(retry_after=2.0)
    assert redacted.retry_after == 2.0
    assert "sk-secret" not in str(redacted)


# -- through the providers ------------------------------------------------------------------

OPENAI_HEADERS = (
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-remaining-requests", "59"),
    ("x-ratelimit-reset-requests", "1s"),
)
ANTHROPIC_HEADERS = (
    ("anthropic-ratelimit-requests-limit", "60"),
    ("anthropic-ratelimit-requests-remaining", "59"),
)


def _rate_error(wire: Wire) -> dict[str, Any]:
    if wire.provider == "openai":
        return openai_error("Rate limit reached", "rate_limit_exceeded")
    return anthropic_error("rate_limit_error", "slow down")


def _request() -> ModelRequest:
    return ModelRequest(messages=(UserMessage(content="hi"),), max_tokens=64)


async def test_a_response_carries_what_its_headers_said(wire: Wire, server: LoopbackServer) -> None:
    headers = OPENAI_HEADERS if wire.provider == "openai" else ANTHROPIC_HEADERS
    server.queue(json_reply(wire.reply("ok"), headers=headers), json_reply(wire.reply("ok")))
    async with wire.model(server, stream=False) as model:
        answered = await model.request(_request())
        bare = await model.request(_request())
    assert answered.text == "ok"
    assert answered.limits is not None
    assert (answered.limits.requests_limit, answered.limits.requests_remaining) == (60, 59)
    assert bare.limits is None  # no such header: nothing said


async def test_an_error_status_carries_what_its_headers_said(
    wire: Wire, server: LoopbackServer
) -> None:
    headers = OPENAI_HEADERS if wire.provider == "openai" else ANTHROPIC_HEADERS
    server.queue(
        json_reply(_rate_error(wire), status=429, headers=headers),
        json_reply(_rate_error(wire), status=429, headers=(*headers, ("retry-after", "7"))),
    )
    async with wire.model(server, stream=False) as model:
        with pytest.raises(ProviderError) as first:
            await model.request(_request())
        with pytest.raises(ProviderError) as second:
            await model.request(_request())
    assert first.value.status == 429
    assert first.value.retryable
    assert first.value.limits is not None
    assert first.value.limits.requests_remaining == 59
    assert first.value.retry_after is None
    assert second.value.retry_after == 7.0
    assert second.value.limits is not None
    assert second.value.limits.retry_after == 7.0


@pytest.mark.parametrize("dimension", DIMENSIONS, ids=lambda d: d.key)
def test_every_dimension_is_read_from_the_headers_and_heard_by_the_lanes(
    dimension: Dimension,
) -> None:
    # A server's headers of it become its three ServerLimits fields.
    bucket = dimension.key.replace("_", "-")
    headers = {
        f"anthropic-ratelimit-{bucket}-limit": "50",
        f"anthropic-ratelimit-{bucket}-remaining": "0",
        f"anthropic-ratelimit-{bucket}-reset": _rfc3339(2.0),
    }
    limits = server_limits(headers, now=NOW)
    assert limits is not None
    fields = (f"{dimension.key}_limit", f"{dimension.key}_remaining", f"{dimension.key}_reset")
    assert tuple(getattr(limits, name) for name in fields) == (50, 0, 2.0)
    assert all(
        getattr(limits, name) is None
        for name in ServerLimits.__struct_fields__
        if name not in fields
    )
    # Nothing left of it pauses a lane until the reset, unless the lane counts it
    # itself (a limit of it declared: its window knows when the next request fits).
    rates = Rates({"counting": RateLimit(**{dimension.field: 10})}, now=lambda: 0.0)
    for name, paused in (("plain", True), ("counting", False)):
        lane = rates.lane(name)
        _heard(rates, lane, limits)
        assert rates.statistics()[name].pauses == int(paused)
