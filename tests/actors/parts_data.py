"""Small image and PDF files for the content-part tests, built by hand (no Pillow)."""

from __future__ import annotations

import struct
import zlib


def _chunk(kind: bytes, body: bytes) -> bytes:
    crc = zlib.crc32(body, zlib.crc32(kind)) & 0xFFFFFFFF
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", crc)


def png(width: int = 4, height: int = 3, *, fill: int = 0) -> bytes:
    """A real RGB PNG of ``width`` x ``height`` (``fill`` varies its bytes)."""
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    rows = b"".join(b"\x00" + bytes([fill % 256, 0, 0]) * width for _ in range(height))
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", zlib.compress(rows))
        + _chunk(b"IEND", b"")
    )


def big_png(size: int, *, width: int = 1024, height: int = 768) -> bytes:
    """A whole PNG of ``size`` bytes in all (at least its image's): its image, then
    zeros in an ancillary chunk before its IEND."""
    image = png(width, height)
    head, end = image[:-12], image[-12:]
    padding = bytes(max(0, size - len(image) - 12))
    return head + (_chunk(b"noIs", padding) if padding else b"") + end


def gif(width: int = 7, height: int = 5) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\x00\x00\x00" + b";"


def jpeg(width: int = 640, height: int = 480) -> bytes:
    """A JPEG header: SOI, an APP0 segment, a DQT-like segment, then SOF0."""
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\x00\x01\x01\x00\x00\x01\x00\x01\x00\x00"
    dqt = b"\xff\xdb" + struct.pack(">H", 4) + b"\x00\x00"
    sof = b"\xff\xc0" + struct.pack(">HBHHB", 11, 8, height, width, 1) + b"\x01\x11\x00"
    return b"\xff\xd8" + app0 + dqt + sof + b"\xff\xd9"


def webp_vp8x(width: int = 300, height: int = 200) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\x00\x00\x00\x00"
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_vp8l(width: int = 50, height: int = 60) -> bytes:
    bits = (width - 1) | ((height - 1) << 14)
    body = b"VP8L" + struct.pack("<I", 5) + b"\x2f" + struct.pack("<I", bits)
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def webp_vp8(width: int = 33, height: int = 22) -> bytes:
    frame = b"\x00\x00\x00" + b"\x9d\x01\x2a" + struct.pack("<HH", width, height)
    body = b"VP8 " + struct.pack("<I", len(frame)) + frame
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def pdf(pages: int = 2) -> bytes:
    """A small PDF with ``pages`` page objects and one ``/Pages`` tree."""
    objects = [b"1 0 obj << /Type /Catalog /Pages 2 0 R >> endobj"]
    kids = " ".join(f"{3 + i} 0 R" for i in range(pages)).encode()
    objects.append(b"2 0 obj << /Type /Pages /Kids [" + kids + b"] /Count %d >> endobj" % pages)
    objects.extend(
        b"%d 0 obj << /Type /Page /Parent 2 0 R >> endobj" % (3 + i) for i in range(pages)
    )
    return b"%PDF-1.4\n" + b"\n".join(objects) + b"\ntrailer << /Root 1 0 R >>\n%%EOF\n"


def wav(seconds: float = 0.5, *, rate: int = 8000) -> bytes:
    """A real PCM WAV of ``seconds`` of silence: mono, 16-bit, ``rate`` samples a second."""
    samples = bytes(2 * int(seconds * rate))
    fmt = struct.pack("<HHIIHH", 1, 1, rate, 2 * rate, 2, 16)
    body = b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt
    body += b"data" + struct.pack("<I", len(samples)) + samples
    return b"RIFF" + struct.pack("<I", len(body)) + body


def mp3(frames: int = 10) -> bytes:
    """An MP3 of ``frames`` silent MPEG-1 layer III frames at 128 kbit/s, 44.1 kHz, after
    a small ID3 tag (417 bytes a frame: 1.0 s is about 38 frames)."""
    tag = b"ID3\x04\x00\x00" + bytes([0, 0, 0, 10]) + bytes(10)
    frame = b"\xff\xfb\x90\x00" + bytes(413)
    return tag + frame * frames
