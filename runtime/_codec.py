"""Encoders and decoders, built once and reused (msgspec's perf advice).

``encode_json`` / ``encode_msgpack`` take any Struct; ``decode_json`` /
``decode_msgpack`` take the bytes and the type to decode into, and keep one decoder
per type.
"""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

__all__ = ["decode_json", "decode_msgpack", "encode_json", "encode_msgpack"]

T = TypeVar("T")

_json_encoder = msgspec.json.Encoder()
_msgpack_encoder = msgspec.msgpack.Encoder()


def encode_json(value: object) -> bytes:
    """Encode ``value`` (a Struct, or plain data) as JSON."""
    return _json_encoder.encode(value)


def encode_msgpack(value: object) -> bytes:
    """Encode ``value`` (a Struct, or plain data) as MessagePack."""
    return _msgpack_encoder.encode(value)


_json_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}
_msgpack_decoders: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def decode_json(data: bytes | str, kind: type[T]) -> T:
    """Decode JSON ``data`` into ``kind``, validating it on the way."""
    decoder = _json_decoders.get(kind)
    if decoder is None:
        decoder = _json_decoders[kind] = msgspec.json.Decoder(kind)
    result: T = decoder.decode(data)
    return result


def decode_msgpack(data: bytes, kind: type[T]) -> T:
    """Decode MessagePack ``data`` into ``kind``, validating it on the way."""
    decoder = _msgpack_decoders.get(kind)
    if decoder is None:
        decoder = _msgpack_decoders[kind] = msgspec.msgpack.Decoder(kind)
    result: T = decoder.decode(data)
    return result
