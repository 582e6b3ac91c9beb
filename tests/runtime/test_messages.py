"""Every kernel message and snapshot round-trips through JSON and MessagePack."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fractor.runtime import (
    Envelope,
    MailboxStatistics,
    RuntimeStatistics,
    decode_json,
    decode_msgpack,
    encode_json,
    encode_msgpack,
)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**62), 2**62) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=10,
)


@given(message=json_values, request_id=st.integers(0, 2**62), sender=st.text())
def test_envelope_round_trips(message: object, request_id: int, sender: str) -> None:
    envelope = Envelope(message=message, request_id=request_id, sender=sender)
    assert decode_json(encode_json(envelope), Envelope) == envelope
    assert decode_msgpack(encode_msgpack(envelope), Envelope) == envelope


@pytest.mark.parametrize(
    "snapshot",
    [
        MailboxStatistics(
            actor_id="a-1",
            capacity=8,
            queued=2,
            waiting_senders=1,
            handled=5,
            failed=1,
            closed=False,
        ),
        RuntimeStatistics(live_actors=3, spawned=4, stopped=1, handled=9, failed=0, pending_asks=2),
    ],
)
def test_snapshots_round_trip_and_are_frozen(snapshot: msgspec.Struct) -> None:
    kind = type(snapshot)
    assert decode_json(encode_json(snapshot), kind) == snapshot
    assert decode_msgpack(encode_msgpack(snapshot), kind) == snapshot
    with pytest.raises(AttributeError):
        snapshot.live_actors = 0  # type: ignore[attr-defined]


def test_decoding_validates() -> None:
    with pytest.raises(msgspec.ValidationError, match="request_id"):
        decode_json(b'{"message": 1, "request_id": "x"}', Envelope)
