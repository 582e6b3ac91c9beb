"""Content parts: their types, what is read from their bytes, refusals, estimates."""

from __future__ import annotations

import hashlib
from pathlib import Path

import msgspec
import pytest

import fractor
from fractor.actors import ContentError, ContentLimits, Document, Image, Text, describe_part
from fractor.actors._parts import (
    anthropic_image_tokens,
    openai_image_tokens,
    part_tokens,
    split_content,
)

from .parts_data import big_png, gif, jpeg, pdf, png, webp_vp8, webp_vp8l, webp_vp8x


def test_public_names_are_exported_at_the_top() -> None:
    for name in ("Image", "Document", "Text", "Part", "ContentError", "ContentLimits"):
        assert getattr(fractor, name) is getattr(fractor.actors, name)
    assert "describe_part" in fractor.__all__


@pytest.mark.parametrize(
    ("data", "media_type", "size"),
    [
        (png(1024, 768), "image/png", (1024, 768)),
        (jpeg(640, 480), "image/jpeg", (640, 480)),
        (gif(7, 5), "image/gif", (7, 5)),
        (webp_vp8x(300, 200), "image/webp", (300, 200)),
        (webp_vp8l(50, 60), "image/webp", (50, 60)),
        (webp_vp8(33, 22), "image/webp", (33, 22)),
    ],
)
def test_an_image_reads_its_type_hash_and_size_from_its_bytes(
    data: bytes, media_type: str, size: tuple[int, int]
) -> None:
    image = Image(data=data)
    assert image.media_type == media_type
    assert (image.width, image.height) == size
    assert image.sha256 == hashlib.sha256(data).hexdigest()
    assert image.size == len(data)
    assert image.data is data  # the very object: never copied


def test_a_document_counts_its_pages_not_its_page_tree(tmp_path: Path) -> None:
    path = tmp_path / "report.pdf"
    path.write_bytes(pdf(pages=3))
    document = Document.from_file(path)
    assert document.media_type == "application/pdf"
    assert document.pages == 3
    assert document.name == "report.pdf"
    assert describe_part(document).startswith("[document report.pdf, 3 pages, ")


def test_from_file_and_from_url(tmp_path: Path) -> None:
    path = tmp_path / "shot.png"
    path.write_bytes(png(10, 20))
    image = Image.from_file(path)
    assert (image.width, image.height, image.media_type) == (10, 20, "image/png")
    remote = Image.from_url("https://example.com/a/chart.JPG?x=1")
    assert remote.media_type == "image/jpeg"
    assert remote.data is None
    assert not remote.stored
    assert describe_part(remote) == "[image https://example.com/a/chart.JPG?x=1]"
    doc = Document.from_url("https://example.com/paper.pdf")
    assert doc.media_type == "application/pdf"


def test_a_trace_line_never_shows_bytes() -> None:
    data = big_png(182_000, width=1024, height=768)
    line = describe_part(Image(data=data))
    digest = hashlib.sha256(data).hexdigest()[:8]
    assert line == f"[image 1024x768 png, 182 KB, sha256:{digest}]"
    assert describe_part(Text(text="hello")) == "[text 5 chars]"
    data_url = Image.from_url("data:image/png;base64," + "A" * 500)
    assert "AAAA" not in describe_part(data_url)


@pytest.mark.parametrize(
    ("data", "kind", "expected"),
    [
        (b"hello world", Image, "got bytes of no known type (starting b'hello wo')"),
        (pdf(), Image, "got bytes of application/pdf"),
        (png(), Document, "must be PDF, got bytes of image/png"),
        (b"", Image, "no known type (empty)"),
    ],
)
def test_bytes_of_another_kind_are_refused_naming_what_they_are(
    data: bytes, kind: type[Image] | type[Document], expected: str
) -> None:
    with pytest.raises(ContentError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        kind(data=data)


def test_a_media_type_that_disagrees_with_the_bytes_is_refused() -> None:
    with pytest.raises(ContentError, match="says 'image/jpeg', its bytes are image/png"):
        Image(data=png(), media_type="image/jpeg")
    with pytest.raises(ContentError, match="needs its bytes"):
        Image()
    with pytest.raises(ContentError, match="not both"):
        Image(data=png(), url="https://example.com/x.png")


def test_size_limits_per_part_and_per_request(tmp_path: Path) -> None:
    path = tmp_path / "big.png"
    path.write_bytes(big_png(3_000))
    with pytest.raises(ContentError, match="more than the 2 KB a part may have"):
        Image.from_file(path, max_bytes=2_000)
    parts = [Image(data=big_png(3_000, width=2)), Image(data=big_png(3_000, width=3))]
    ContentLimits(part=3_000, request=6_000).check(parts)
    with pytest.raises(ContentError, match=r"more than the 2 KB a part may have \(Content"):
        ContentLimits(part=2_000).check(parts, "the task")
    with pytest.raises(ContentError, match="6 KB together: more than the 5 KB a request"):
        ContentLimits(request=5_000).check(parts, "the task")
    with pytest.raises(ValueError, match=r"ContentLimits\.part must be"):
        ContentLimits(part=0)
    assert ContentLimits() == ContentLimits(part=20_000_000, request=50_000_000)


def test_a_part_round_trips_and_keeps_its_metadata_on_both_wire_formats() -> None:
    image = Image(data=png(4, 3))
    for encode, decode in (
        (msgspec.json.encode, msgspec.json.decode),
        (msgspec.msgpack.encode, msgspec.msgpack.decode),
    ):
        back = decode(encode(image), type=fractor.Part)
        assert back == image
    stored = msgspec.structs.replace(image, data=None)
    assert stored.stored
    assert describe_part(stored) == describe_part(image)


def test_split_content_joins_text_and_keeps_the_parts_in_order() -> None:
    a, b = Image(data=png(1, 1)), Document(data=pdf())
    assert split_content("plain", "a task") == ("plain", ())
    assert split_content(["look", a, Text(text="and"), b], "a task") == ("look\n\nand", (a, b))
    assert split_content(a, "a task") == ("", (a,))
    with pytest.raises(TypeError, match="mixes str and parts"):
        split_content(["x", 3], "a task")
    with pytest.raises(TypeError, match="a task is text"):
        split_content(3, "a task")


def test_token_rules() -> None:
    assert anthropic_image_tokens(1000, 1000) == 1334
    assert anthropic_image_tokens(4000, 4000) == 1600  # capped
    assert openai_image_tokens(1024, 1024) == 85 + 170 * 4  # 768x768: 2x2 tiles
    assert openai_image_tokens(2048, 4096) == 85 + 170 * 6  # 1024x2048 -> 768x1536
    assert openai_image_tokens(100, 100) == 85 + 170
    assert part_tokens(Image(data=png(750, 2))) == 2
    assert part_tokens(Image.from_url("https://x/y.png")) == 1_600
    assert part_tokens(Document(data=pdf(pages=2))) == 3_000
    assert part_tokens(Text(text="12345678")) == 2
    assert part_tokens(Image(data=png(1024, 1024)), image_tokens=openai_image_tokens) == 765


def _cut(data: bytes, at: int) -> bytes:
    return data[:at]


_PNG = png(64, 64)
_JPEG = jpeg(640, 480)


@pytest.mark.parametrize(
    ("data", "kind", "expected"),
    [
        (b"\x89PNG\r\n\x1a\n", Image, "not a whole PNG: its IHDR chunk is cut short"),
        (_cut(_PNG, 22), Image, "not a whole PNG: its IHDR chunk is cut short"),
        (_cut(_PNG, len(_PNG) - 20), Image, "not a whole PNG: it has no IEND chunk"),
        (png(0, 3), Image, "not a whole PNG: its IHDR says 0x3"),
        (_PNG[:29] + b"\x00\x00\x00\x00" + _PNG[33:], Image, "its IHDR chunk's CRC is wrong"),
        (_cut(_JPEG, 10), Image, "not a whole JPEG: it has no frame header (SOF)"),
        (_cut(_JPEG, len(_JPEG) - 2), Image, "not a whole JPEG: it has no end of image"),
        (jpeg(0, 480), Image, "not a whole JPEG: its frame header says 0x480"),
        (_cut(gif(7, 5), 9), Image, "not a whole GIF: its screen descriptor is cut short"),
        (_cut(gif(7, 5), 13), Image, "not a whole GIF: it has no trailer"),
        (_cut(webp_vp8x(300, 200), 25), Image, "not a whole WebP: it is cut short"),
        (b"RIFF\x04\x00\x00\x00WEBP", Image, "not a whole WebP: it has no VP8"),
        (b"%PDF-", Document, "not a whole PDF: its header has no version"),
        (_cut(pdf(), len(pdf()) - 8), Document, r"not a whole PDF: it has no %%EOF"),
    ],
    ids=[
        *("png-signature", "png-cut-in-ihdr", "png-cut-in-idat", "png-0x3", "png-ihdr-crc"),
        *("jpeg-cut-in-header", "jpeg-cut-in-scan", "jpeg-0x480"),
        *("gif-cut-in-screen", "gif-no-trailer", "webp-cut", "webp-no-frame"),
        *("pdf-header", "pdf-cut"),
    ],
)
def test_truncated_or_broken_files_are_refused_at_the_door(
    data: bytes, kind: type[Image] | type[Document], expected: str
) -> None:
    with pytest.raises(ContentError, match=expected.replace("(", r"\(").replace(")", r"\)")):
        kind(data=data)


def test_files_with_bytes_after_their_end_are_taken() -> None:
    # A PNG with bytes after IEND, a JPEG with a video after EOI (a motion photo), a
    # PDF with a line after %%EOF: whole files all the same.
    assert Image(data=png(5, 5) + b"\x00" * 100).width == 5
    assert Image(data=jpeg(8, 9) + b"ftypmp42" + bytes(500)).height == 9
    assert Document(data=pdf(pages=1) + b"\r\n").pages == 1


def test_a_given_hash_is_checked_against_the_bytes() -> None:
    with pytest.raises(ContentError, match="no known type"):
        Image(data=b"definitely not an image", sha256="0" * 64)
    data = png(4, 3)
    with pytest.raises(
        ContentError, match=r"image's sha256 says 0{8}\.\.\., its bytes' is [0-9a-f]{8}"
    ):
        Image(data=data, sha256="0" * 64)
    with pytest.raises(ContentError, match="an image's sha256 is 64 hex digits"):
        Image(data=data, sha256="abc")
    good = Image(data=data, sha256=hashlib.sha256(data).hexdigest())
    assert (good.width, good.height, good.size) == (4, 3, len(data))


def test_restoring_a_stored_parts_bytes_hashes_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    # A part is checked once, at the door: restoring its bytes from a store's blobs
    # (or from a host's) hashes nothing again, however often it is done.
    from fractor.actors._blobs import attach_parts, detach_parts

    image = Image(data=big_png(100_000))
    blobs: dict[str, bytes] = {}
    (stored,) = detach_parts((image,), blobs)
    hashed: list[int] = []
    real = hashlib.sha256

    def counting(data: bytes) -> object:
        hashed.append(len(data))
        return real(data)

    monkeypatch.setattr(hashlib, "sha256", counting)  # as fractor.actors._parts calls it
    for _ in range(3):
        (back,) = attach_parts((stored,), blobs)
        assert back == image
        assert back.data is image.data
    assert hashed == []


@pytest.mark.parametrize("label", ["application/octet-stream", "binary/octet-stream", ""])
def test_a_generic_label_lets_the_bytes_decide(label: str) -> None:
    from fractor.actors._parts import part_from_bytes

    image = part_from_bytes(png(4, 3), label)
    assert isinstance(image, Image)
    assert (image.media_type, image.width) == ("image/png", 4)
    document = part_from_bytes(pdf(pages=2), label, name="report.pdf")
    assert isinstance(document, Document)
    assert (document.media_type, document.pages, document.name) == (
        "application/pdf",
        2,
        "report.pdf",
    )
    assert Image(data=png(), media_type=label).media_type == "image/png"
    assert Document(data=pdf(), media_type=label).media_type == "application/pdf"
    with pytest.raises(ContentError, match="no known type"):
        part_from_bytes(b"\x00" * 100, label)


def test_a_specific_label_is_kept_and_checked() -> None:
    from fractor.actors._parts import generic_type, part_from_bytes

    assert generic_type("Application/Octet-Stream; charset=binary")
    assert not generic_type("application/pdf")

    with pytest.raises(
        ContentError, match="must be PNG or JPEG or WebP or GIF, got bytes of application/pdf"
    ):
        part_from_bytes(pdf(), "image/png")
    assert isinstance(part_from_bytes(pdf(), "Application/PDF; charset=binary"), Document)
