"""The token estimates of ``actors.providers._estimates``: what a request is
reckoned to read before it is sent, and what a reply a server did not count is
reckoned to have written."""

from __future__ import annotations

from fractor.actors.providers._estimates import estimate_output_tokens


def test_an_output_estimate_is_a_token_per_four_characters_at_least_one() -> None:
    assert estimate_output_tokens("") == 0
    assert estimate_output_tokens("a") == 1
    assert estimate_output_tokens("abcdefghi") == 3
    assert estimate_output_tokens("abcd", arguments=5) == 3


def test_an_output_estimate_never_passes_the_requests_cap() -> None:
    # More characters than four a token fit under the cap the request was granted
    # (a tokenizer that packs them denser, a server that ignores the cap): the
    # estimate is the cap, never more, so it is never taken for impossible usage.
    dense = "1 " * 400
    assert estimate_output_tokens(dense) == 200
    assert estimate_output_tokens(dense, cap=50) == 50
    assert estimate_output_tokens(dense, arguments=40, cap=50) == 50
    assert estimate_output_tokens("abcd", cap=50) == 1  # under the cap: as it is
    assert estimate_output_tokens(dense, cap=None) == 200  # no cap: no clamp
