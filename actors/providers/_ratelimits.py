"""What a response's headers say of the server's rate limits: ``server_limits``.

Read on every response, a success or an error, streamed or not, by both providers
(``_base.py`` for a success, ``_errors.py`` for an HTTP error status). What they
read:

- OpenAI (and servers that copy it): ``x-ratelimit-{limit,remaining,reset}-{requests,
  tokens}``. A reset is a Go ``time.Duration`` (``12ms``, ``1s``, ``6m0s``,
  ``4m12.172s``, ``23h18m29.144s``): the time until the bucket is full again.
- Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-
  {limit,remaining,reset}``. A reset is an RFC 3339 timestamp, read as the seconds
  from ``now`` (never fewer than 0). Token ``remaining`` counts come rounded to the
  thousand.
- Both: ``retry-after`` (seconds, or an HTTP date) and ``retry-after-ms`` (which wins,
  as in both SDKs).

Every header is optional and may be nonsense (Azure sends ``-1`` and ``0``): a value
that does not read, or is negative, is left out field by field; nothing here raises.
``retry_after_in`` reads the wait an OpenAI 429's message asks for ("Please try again
in 644ms."), used when no header said one; ``spent_until``, the reset of a count the
headers say nothing is left of (a 429 that says when to come back that way only).
"""

from __future__ import annotations

import datetime
import email.utils
import math
import re
import time
from collections.abc import Mapping
from typing import Any

from fractor.runtime.lowlevel import DIMENSIONS

from .._messages import ServerLimits

__all__ = ["parse_duration", "retry_after_in", "server_limits", "spent_until"]

#: Header name -> (``ServerLimits`` field, how its value reads).
_COUNT, _DURATION, _TIMESTAMP = 0, 1, 2
_HEADERS: dict[str, tuple[str, int]] = {}
for _bucket, _field in (("requests", "requests"), ("tokens", "tokens")):
    _HEADERS[f"x-ratelimit-limit-{_bucket}"] = (f"{_field}_limit", _COUNT)
    _HEADERS[f"x-ratelimit-remaining-{_bucket}"] = (f"{_field}_remaining", _COUNT)
    _HEADERS[f"x-ratelimit-reset-{_bucket}"] = (f"{_field}_reset", _DURATION)
# Anthropic says every dimension a lane counts (``DIMENSIONS``), by its key.
for _bucket, _field in ((d.key.replace("_", "-"), d.key) for d in DIMENSIONS):
    _HEADERS[f"anthropic-ratelimit-{_bucket}-limit"] = (f"{_field}_limit", _COUNT)
    _HEADERS[f"anthropic-ratelimit-{_bucket}-remaining"] = (f"{_field}_remaining", _COUNT)
    _HEADERS[f"anthropic-ratelimit-{_bucket}-reset"] = (f"{_field}_reset", _TIMESTAMP)
del _bucket, _field

#: The seconds of each unit of a Go duration.
_UNITS = {"h": 3600.0, "m": 60.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "μs": 1e-6}
_UNITS["ns"] = 1e-9
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)"
_UNIT = r"(?:ns|us|µs|μs|ms|h|m|s)"
_PART = re.compile(rf"({_NUMBER})({_UNIT})")
_DURATION_RE = re.compile(rf"(?:{_NUMBER}{_UNIT})+")
#: An OpenAI 429's message: "... Please try again in 644ms." (or "in 1.5s", "in 6m0s").
_TRY_AGAIN = re.compile(rf"try again in ((?:{_NUMBER}{_UNIT})+)", re.IGNORECASE)


def parse_duration(text: str) -> float | None:
    """The seconds of a Go duration (``4m12.172s``, ``12ms``, ``0``), or of a bare
    number of seconds (as some proxies send); None when it does not read or is
    negative."""
    text = text.strip()
    if _DURATION_RE.fullmatch(text):
        seconds = sum(float(number) * _UNITS[unit] for number, unit in _PART.findall(text))
    else:
        try:
            seconds = float(text)
        except ValueError:
            return None
    return seconds if seconds >= 0 and math.isfinite(seconds) else None


def retry_after_in(message: str) -> float | None:
    """The wait an error's message asks for ("Please try again in 644ms."), if any."""
    found = _TRY_AGAIN.search(message)
    return None if found is None else parse_duration(found.group(1))


def _count(text: str) -> int | None:
    try:
        value = int(text.strip())
    except ValueError:
        return None
    return value if value >= 0 else None


def _timestamp(text: str, now: float) -> float | None:
    """The seconds from ``now`` to an RFC 3339 time (0 when it is past)."""
    try:
        when = datetime.datetime.fromisoformat(text.strip())
    except ValueError:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def _retry_after(value: str, now: float) -> float | None:
    """``retry-after``: seconds, or an HTTP date (the seconds until it, at least 0)."""
    seconds = parse_duration(value)
    if seconds is not None:
        return seconds
    try:
        when = email.utils.parsedate_to_datetime(value.strip())
    except (TypeError, ValueError, IndexError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.UTC)
    return max(0.0, when.timestamp() - now)


def server_limits(headers: Mapping[str, str], *, now: float | None = None) -> ServerLimits | None:
    """What ``headers`` (any mapping, names in any case) say of the rate limits, or
    None when they hold no such header. ``now`` (``time.time()`` unless given) is
    when they came: an Anthropic reset and a ``retry-after`` date are read as the
    seconds from it."""
    fields: dict[str, Any] = {}
    retry_after: str | None = None
    retry_after_ms: str | None = None
    for name, value in headers.items():
        name = name.lower()
        if name.startswith(("x-ratelimit-", "anthropic-ratelimit-")):
            known = _HEADERS.get(name)
            if known is None:
                continue
            field, kind = known
            read: float | None
            if kind == _COUNT:
                read = _count(value)
            elif kind == _DURATION:
                read = parse_duration(value)
            else:
                if now is None:
                    now = time.time()
                read = _timestamp(value, now)
            if read is not None:
                fields[field] = read
        elif name == "retry-after":
            retry_after = value
        elif name == "retry-after-ms":
            retry_after_ms = value
    if retry_after_ms is not None:
        try:
            ms = float(retry_after_ms)
        except ValueError:
            ms = -1.0
        if ms >= 0 and math.isfinite(ms):
            fields["retry_after"] = ms / 1000.0
    if retry_after is not None and "retry_after" not in fields:
        seconds = _retry_after(retry_after, time.time() if now is None else now)
        if seconds is not None:
            fields["retry_after"] = seconds
    return ServerLimits(**fields) if fields else None


#: Each count of ``ServerLimits``: (what is left of it, the seconds until it resets).
_COUNTS = tuple(
    (f"{count}_remaining", f"{count}_reset")
    for count in ("requests", "tokens", "input_tokens", "output_tokens")
)


def spent_until(limits: ServerLimits) -> float | None:
    """The seconds until every count that ``limits`` say nothing is left of has reset
    (``x-ratelimit-remaining-requests: 0`` with ``x-ratelimit-reset-requests: 1.5s``,
    or Anthropic's ``anthropic-ratelimit-*-remaining`` and ``-reset``): when a server
    that refused a request without a ``retry-after`` would take the next one. None
    when no count is spent, or none that is says when it resets."""
    until: float | None = None
    for remaining, reset in _COUNTS:
        left = getattr(limits, remaining)
        seconds = getattr(limits, reset)
        if left is not None and left <= 0 and seconds is not None:
            until = seconds if until is None else max(until, seconds)
    return until
