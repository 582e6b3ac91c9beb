"""Content parts: text, images, documents and audio that messages carry beside their
text.

A part is a frozen msgspec Struct of a tagged union (``Part``):

- ``Text``: a piece of text. At the door (``AgentRef.ask``, a tool's result) text
  pieces are joined into the message's ``content``; a ``Text`` is how a list of
  pieces says "this is text" next to images.
- ``Image``: PNG, JPEG, WebP or GIF, as bytes (``data``) or a ``url``.
- ``Document``: a PDF, as bytes or a ``url``.
- ``Audio``: WAV or MP3, as bytes or a ``url``.

**A kind of media part is one class** (``MEDIA_KINDS``), on ``MediaPart``: its
``kind`` (its tag, and what a model's ``accepts=`` names), the ``media_types`` its
bytes may be (and how their magic numbers say so: ``sniff_type``), what it reads of
its bytes and how it checks they are whole (``read_facts``), how it is described
(``facts_text``) and estimated (``tokens``). Everything else (the door, the stores'
blobs, the hosts' wire, MCP, the live views) reads those; a provider's wire says how
it sends each kind, or refuses one it cannot (``tests/actors/test_part_kinds.py``
sends every kind through every consumer).

For bytes, the media type is read from the bytes' magic number (a ``media_type``
given that disagrees is refused, naming what was found; a generic one,
``application/octet-stream`` say, lets the bytes decide: ``part_from_bytes``), the
bytes must be a whole file of that type by a cheap look at its structure
(``check_whole``: a truncated PNG, JPEG, GIF, WebP or PDF is refused, saying what is
missing), the SHA-256 of the content is computed once (a ``sha256`` given must be
it), and what is cheap to read from the header is kept: an image's ``width`` and
``height`` (PNG IHDR, JPEG SOF, GIF screen, WebP VP8/VP8L/VP8X) and a PDF's
``pages`` (an estimate: its ``/Type /Page`` objects; None when none is visible, e.g.
in compressed object streams). All of it happens once, when the part is made, at the
door: a part handed on (to subagents, to a host, to a store and back) is not checked
again.

**Bytes are never copied.** A part holds the very ``bytes`` object it was made with;
passing it in messages, results and traces passes a reference, so a 5 MB image
handed from a lead to 100 subagents is one 5 MB object. Made from a ``bytearray`` or a
``memoryview``, it is copied once, into ``bytes``, at construction.

A part decoded from a store holds no bytes (``data is None``, ``stored`` True: only
its hash and metadata); loading a conversation or a trace to run again restores them
from the store's blobs (``actors._blobs``).

**Limits** (``ContentLimits``): at most ``part`` bytes per part (default 20 MB) and
``request`` bytes of parts per task, tool result or model request (default 50 MB).
They are checked at the door, before anything is sent or written: ``ContentError``
says what was too large and the limit.

**Token estimates**: ``part_tokens`` is the documented default rule the budget's
input estimate uses (see its docstring); ``anthropic_image_tokens`` and
``openai_image_tokens`` are the providers' published rules for images, for a model
to pick (``part_tokens(part, image_tokens=openai_image_tokens)``).

``describe_part`` is how a trace or a live view shows a part: one line, never its
bytes, e.g. ``[image 1024x768 png, 182 KB, sha256:ab12cd34]``.
"""

from __future__ import annotations

import hashlib
import math
import os
import re
import zlib
from collections.abc import Callable, Iterable
from typing import Any, ClassVar, Literal, Self

import msgspec

from fractor.runtime import FractorError

__all__ = [
    "AUDIO_TOKENS_PER_SECOND",
    "DEFAULT_PART_BYTES",
    "DEFAULT_REQUEST_BYTES",
    "DOCUMENT_TOKENS_PER_PAGE",
    "MEDIA_KINDS",
    "UNKNOWN_AUDIO_SECONDS",
    "UNKNOWN_DOCUMENT_PAGES",
    "UNKNOWN_IMAGE_TOKENS",
    "Audio",
    "ContentError",
    "ContentLimits",
    "Document",
    "Image",
    "Media",
    "MediaPart",
    "Part",
    "Text",
    "anthropic_image_tokens",
    "describe_part",
    "openai_image_tokens",
    "part_tokens",
    "size_text",
]

#: The default most bytes of one part.
DEFAULT_PART_BYTES = 20_000_000
#: The default most bytes of all the parts of one task, tool result or model request.
DEFAULT_REQUEST_BYTES = 50_000_000

ImageType = Literal["image/png", "image/jpeg", "image/webp", "image/gif"]
IMAGE_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/webp", "image/gif")
PDF = "application/pdf"
WAV = "audio/wav"
MP3 = "audio/mpeg"


class ContentError(FractorError, ValueError):
    """A part was refused: bytes of a kind fractor does not take (named by what
    their magic number says they are), bytes that are not a whole file of their kind
    (cut short, a header that does not parse), a ``sha256`` given that is not the
    bytes', or a part or a request over its size limit. Raised at the door, before
    anything is sent or written."""


class ContentLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The most bytes of one part (``part``) and of all the parts of one task, tool
    result or model request (``request``); None: no limit."""

    part: int | None = DEFAULT_PART_BYTES
    request: int | None = DEFAULT_REQUEST_BYTES

    def __post_init__(self) -> None:
        for name in ("part", "request"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ValueError(f"ContentLimits.{name} must be an int >= 1 or None, got {value!r}")

    def check(self, parts: Iterable[Part], what: str = "a request") -> None:
        """``ContentError`` if a part of ``parts`` or all of them together are too large."""
        total = 0
        for part in parts:
            size = part.size
            if self.part is not None and size > self.part:
                raise ContentError(
                    f"{describe_part(part)} in {what} is {size_text(size)}: more than the "
                    f"{size_text(self.part)} a part may have (ContentLimits.part)"
                )
            total += size
        if self.request is not None and total > self.request:
            raise ContentError(
                f"the parts of {what} are {size_text(total)} together: more than the "
                f"{size_text(self.request)} a request may carry (ContentLimits.request)"
            )


class Text(msgspec.Struct, frozen=True, kw_only=True, gc=False, tag="text"):
    """A piece of text among parts."""

    text: str

    @property
    def size(self) -> int:
        return 0


class MediaPart(msgspec.Struct, frozen=True, kw_only=True, gc=False):
    """What every kind of media part is (see the module): bytes (``data``) or a
    ``url``, its ``media_type`` read from the bytes, their ``sha256`` and ``size``.

    A kind subclasses it with a tag (its ``kind``) and says, once, what is its own:
    ``media_types`` and ``url_types`` (by extension), ``sniff_type``, ``read_facts``,
    ``facts_text`` and ``tokens``.
    """

    media_type: str = ""
    data: bytes | None = None
    url: str = ""
    sha256: str = ""
    size: int = 0

    #: Its name: its tag, and what a model's ``accepts=`` names.
    kind: ClassVar[str] = ""
    #: The media types its bytes may be, and how each is named in words.
    media_types: ClassVar[dict[str, str]] = {}
    #: The media type of a URL by its extension, for one given no ``media_type``.
    url_types: ClassVar[dict[str, str]] = {}

    def __post_init__(self) -> None:
        _complete(self)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_PART_BYTES
    ) -> Self:
        """The part in the file at ``path`` (its size checked before it is read)."""
        return cls(data=_read(path, max_bytes))

    @classmethod
    def from_url(cls, url: str, *, media_type: str = "") -> Self:
        """A part the model fetches from ``url`` (http, https or a ``data:`` URL); its
        media type, if not given, from the URL's extension (``url_types``)."""
        return cls(url=url, media_type=media_type)

    @classmethod
    def from_bytes(cls, data: bytes, media_type: str = "", *, name: str = "") -> Self:
        """A part of this kind of ``data`` that a source labelled ``media_type`` (a
        generic label lets the bytes decide), named ``name`` if the kind has names."""
        options: dict[str, Any] = {"name": name} if name and "name" in cls.__struct_fields__ else {}
        return cls(data=data, media_type=media_type, **options)

    @staticmethod
    def sniff_type(data: bytes) -> str:
        """The media type of this kind that the magic number of ``data`` says, or ""."""
        return ""

    def read_facts(self, data: bytes, media_type: str) -> dict[str, Any]:
        """``ContentError`` unless ``data`` is a whole file of ``media_type`` (a cheap
        look at its structure), else what its header says cheaply, by field name."""
        return {}

    def facts_text(self) -> str:
        """What ``describe_part`` says of a part with its bytes, before its size."""
        return self.media_type

    def tokens(self, image_tokens: ImageTokens) -> int:
        """The input tokens it is counted for in a request's estimate."""
        return 0

    @property
    def stored(self) -> bool:
        """Decoded from a store without its bytes (see ``actors._blobs``)."""
        return self.data is None and not self.url


class Image(MediaPart, frozen=True, kw_only=True, gc=False, tag="image"):
    """An image: PNG, JPEG, WebP or GIF, as bytes (``data``) or a ``url``.

    ``Image(data=png_bytes)`` reads the media type from the magic number (a
    ``media_type`` given must match it); ``Image.from_file(path)``;
    ``Image.from_url(url, media_type="")``. ``sha256``, ``size``, ``width`` and
    ``height`` are filled in from the bytes (width and height None when the header
    does not say them cheaply); do not pass them.
    """

    width: int | None = None
    height: int | None = None

    kind: ClassVar[str] = "image"
    media_types: ClassVar[dict[str, str]] = {
        "image/png": "PNG",
        "image/jpeg": "JPEG",
        "image/webp": "WebP",
        "image/gif": "GIF",
    }
    url_types: ClassVar[dict[str, str]] = {
        ".png": "image/png",
        ".jpg": "image/jpeg",
        ".jpeg": "image/jpeg",
        ".gif": "image/gif",
        ".webp": "image/webp",
    }

    @staticmethod
    def sniff_type(data: bytes) -> str:
        if data.startswith(b"\x89PNG\r\n\x1a\n"):
            return "image/png"
        if data.startswith(b"\xff\xd8\xff"):
            return "image/jpeg"
        if data.startswith((b"GIF87a", b"GIF89a")):
            return "image/gif"
        if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
            return "image/webp"
        return ""

    def read_facts(self, data: bytes, media_type: str) -> dict[str, Any]:
        size = check_whole(data, media_type)
        assert size is not None
        return {"width": size[0], "height": size[1]}

    def facts_text(self) -> str:
        shown = self.media_type.removeprefix("image/")
        if self.width is None or self.height is None:
            return shown
        return f"{self.width}x{self.height} {shown}"

    def tokens(self, image_tokens: ImageTokens) -> int:
        if self.width is None or self.height is None:
            return UNKNOWN_IMAGE_TOKENS
        return image_tokens(self.width, self.height)


class Document(MediaPart, frozen=True, kw_only=True, gc=False, tag="document"):
    """A document: a PDF, as bytes (``data``) or a ``url``; ``name`` is optional.

    ``Document(data=pdf_bytes)``, ``Document.from_file(path)``,
    ``Document.from_url(url)``. ``sha256``, ``size`` and ``pages`` (an estimate,
    None when the file does not show it cheaply) are filled in from the bytes.
    """

    name: str = ""
    pages: int | None = None

    kind: ClassVar[str] = "document"
    media_types: ClassVar[dict[str, str]] = {PDF: "PDF"}
    url_types: ClassVar[dict[str, str]] = {".pdf": PDF}

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_PART_BYTES
    ) -> Self:
        """The document in the file at ``path``, named by its file name."""
        return cls(data=_read(path, max_bytes), name=os.path.basename(os.fspath(path)))

    @classmethod
    def from_url(cls, url: str, *, media_type: str = PDF, name: str = "") -> Self:
        """A document the model fetches from ``url``."""
        return cls(url=url, media_type=media_type, name=name)

    @staticmethod
    def sniff_type(data: bytes) -> str:
        return PDF if data.startswith(b"%PDF-") else ""

    def read_facts(self, data: bytes, media_type: str) -> dict[str, Any]:
        check_whole(data, media_type)
        return {"pages": pdf_pages(data)}

    def facts_text(self) -> str:
        pages = "" if self.pages is None else f", {self.pages} page{'s' * (self.pages != 1)}"
        return f"{self.name or 'pdf'}{pages}"

    def tokens(self, image_tokens: ImageTokens) -> int:
        pages = self.pages
        if pages is None:
            pages = max(UNKNOWN_DOCUMENT_PAGES, -(-self.size // 100_000))
        return DOCUMENT_TOKENS_PER_PAGE * pages


class Audio(MediaPart, frozen=True, kw_only=True, gc=False, tag="audio"):
    """A recording: WAV or MP3, as bytes (``data``) or a ``url``.

    ``Audio(data=wav_bytes)``, ``Audio.from_file(path)``, ``Audio.from_url(url)``.
    ``sha256``, ``size`` and ``seconds`` (its length: a WAV's from its header, an
    MP3's from its frames; None when they do not say it) are filled in from the bytes.
    """

    seconds: float | None = None

    kind: ClassVar[str] = "audio"
    media_types: ClassVar[dict[str, str]] = {WAV: "WAV", MP3: "MP3"}
    url_types: ClassVar[dict[str, str]] = {".wav": WAV, ".mp3": MP3}

    @staticmethod
    def sniff_type(data: bytes) -> str:
        if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
            return WAV
        if data.startswith(b"ID3") or (
            len(data) >= 2 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0
        ):
            return MP3
        return ""

    def read_facts(self, data: bytes, media_type: str) -> dict[str, Any]:
        seconds = wav_seconds(data) if media_type == WAV else mp3_seconds(data)
        return {"seconds": seconds}

    def facts_text(self) -> str:
        shown = self.media_types.get(self.media_type, self.media_type).lower()
        return shown if self.seconds is None else f"{shown} {self.seconds:.3g} s"

    def tokens(self, image_tokens: ImageTokens) -> int:
        seconds = self.seconds if self.seconds is not None else UNKNOWN_AUDIO_SECONDS
        return max(1, math.ceil(seconds * AUDIO_TOKENS_PER_SECOND))


#: Every kind of media part, each one class (see the module). A new kind is a class
#: here, added to this tuple and to ``Media``, and how each provider's wire sends it.
MEDIA_KINDS: tuple[type[MediaPart], ...] = (Image, Document, Audio)
#: A part of any kind: what a caller may give (``AgentRef.ask``, a tool's result).
Part = Text | Image | Document | Audio
#: What messages, results and traces carry in their ``parts`` (their text is in
#: their ``content``): images, documents and recordings.
Media = Image | Document | Audio


def kind_of_type(media_type: str) -> type[MediaPart] | None:
    """The kind whose bytes may be ``media_type`` (parameters and case aside), or None."""
    label = media_type.split(";", 1)[0].strip().lower()
    for kind in MEDIA_KINDS:
        if label in kind.media_types:
            return kind
    return None


# -- completing a part from its bytes -------------------------------------------------


def _complete(part: MediaPart) -> None:
    """Fill in what the bytes say, or refuse them: their kind from the magic number,
    a whole file of it by its structure (``read_facts``), their SHA-256 (checked
    against one given: the hash is made of the bytes, once, here).

    A part without bytes is a ``url`` or a part stored without them (its hash and
    facts as they were read when it was made); ``with_data`` gives such a part its
    bytes back without checking them again."""
    set_ = msgspec.structs.force_setattr
    kind = f"{_article(part.kind)} {part.kind}"
    data = part.data
    if part.sha256 and (len(part.sha256) != 64 or not _HEX.fullmatch(part.sha256)):
        raise ContentError(
            f"{kind}'s sha256 is 64 hex digits (lowercase), got {part.sha256!r}: "
            "leave it out, it is computed from the bytes"
        )
    if data is None:
        if not part.url and not part.sha256:
            raise ContentError(f"{kind} needs its bytes (data=...) or a url")
        if part.url and not isinstance(part.url, str):
            raise ContentError(f"{kind}'s url must be a str, got {part.url!r}")
        if part.url and not part.media_type:
            set_(part, "media_type", _type_from_url(part.url, type(part).url_types))
        return
    raw: object = data  # the constructor does not check types: a caller may pass anything
    if type(raw) is not bytes:
        if not isinstance(raw, bytearray | memoryview):
            raise ContentError(f"{kind}'s data must be bytes, got {type(raw).__qualname__}")
        data = bytes(raw)
        set_(part, "data", data)
    if part.url:
        raise ContentError(f"{kind} has its bytes or a url, not both")
    found = sniff(data)
    expected = type(part).media_types
    if found not in expected:
        what = f"bytes of {found}" if found else f"bytes of no known type ({_head(data)})"
        raise ContentError(f"{kind} must be {' or '.join(expected.values())}, got {what}")
    label = _label(part.media_type)
    if label and label != found:
        raise ContentError(
            f"the {part.kind}'s media_type says {part.media_type!r}, its bytes are {found}"
        )
    facts = part.read_facts(data, found)
    digest = hashlib.sha256(data).hexdigest()
    if part.sha256 and part.sha256 != digest:
        raise ContentError(
            f"the {part.kind}'s sha256 says {part.sha256[:8]}..., its bytes' is {digest[:8]}...: "
            "give the bytes it was made of, or leave sha256 out (it is computed)"
        )
    set_(part, "media_type", found)
    set_(part, "size", len(data))
    set_(part, "sha256", digest)
    for name, value in facts.items():
        set_(part, name, value)


def _article(word: str) -> str:
    return "an" if word[:1] in ("a", "e", "i", "o", "u") else "a"


_HEX = re.compile(r"[0-9a-f]{64}")

#: The labels that say nothing of what bytes are: with them, the bytes decide.
GENERIC_TYPES = frozenset({"", "application/octet-stream", "binary/octet-stream"})


def _label(media_type: str) -> str:
    """A media type as given, lowercased and without parameters; "" for a generic
    label (``GENERIC_TYPES``), which says nothing the bytes do not."""
    if not media_type:
        return ""
    label = media_type.split(";", 1)[0].strip().lower()
    return "" if label in GENERIC_TYPES else label


def generic_type(media_type: str) -> bool:
    """Whether ``media_type`` says nothing of what bytes are (``GENERIC_TYPES``, in any
    case, with or without parameters): then their bytes decide."""
    return not _label(media_type)


def part_from_bytes(data: bytes, media_type: str = "", *, name: str = "") -> Media:
    """The part of ``data`` that a source (a server, a file) labelled ``media_type``:
    of the kind the label says, checked against the bytes as any part is; when the
    label is generic (``GENERIC_TYPES``: none, ``application/octet-stream``,
    ``binary/octet-stream``), the bytes decide. ``ContentError`` when they are of no
    kind fractor takes, or not what the label says. ``name`` names a document."""
    label = _label(media_type) or sniff(data)
    kind = kind_of_type(label) if label else None
    if kind is None:
        said = f"bytes of no known type ({_head(data)})" if not label else f"{label!r}"
        raise ContentError(f"{said}: fractor takes {TAKEN}")
    return kind.from_bytes(data, media_type, name=name)  # type: ignore[return-value]


def part_from_file(
    path: str | os.PathLike[str], *, max_bytes: int | None = DEFAULT_PART_BYTES
) -> Media:
    """The part in the file at ``path``, of the kind its bytes say (``part_from_bytes``),
    named by its file name if its kind has names; its size checked before it is read."""
    return part_from_bytes(_read(path, max_bytes), name=os.path.basename(os.fspath(path)))


def with_data(part: Media, data: bytes) -> Media:
    """``part``, stored without its bytes, with them again: bytes kept by its hash (a
    store's blobs, a host's), which were checked when the part was made; nothing is
    read or hashed again (a part handed to a hundred subagents is checked once)."""
    restored = msgspec.structs.replace(part)  # no bytes: nothing to check
    msgspec.structs.force_setattr(restored, "data", data)
    return restored


# -- whether bytes are a whole file ---------------------------------------------------

_PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: The IEND chunk: no data, so always the same 12 bytes (length 0, type, CRC).
_PNG_END = b"\x00\x00\x00\x00IEND\xaeB`\x82"
#: A PDF's ``%%EOF`` is looked for in its last this many bytes (as Acrobat does).
_PDF_TAIL = 1024
_PDF_VERSION = re.compile(rb"%PDF-\d\.\d")


def check_whole(data: bytes, media_type: str) -> tuple[int, int] | None:
    """``ContentError`` unless ``data`` is a whole file of ``media_type`` by a cheap
    look at its structure (never a decoding); an image's (width, height), None for
    a PDF. What is checked:

    - PNG: a complete IHDR chunk (its CRC right) of nonzero sizes, and an IEND chunk;
    - JPEG: a frame header (SOF) of nonzero sizes among the segments after SOI, and
      an end-of-image marker after it;
    - GIF: a complete screen descriptor of nonzero sizes, and the trailer (``;``)
      at the end;
    - WebP: all the bytes its RIFF header says, and a VP8, VP8L or VP8X header of
      nonzero sizes;
    - PDF: its version in the header (``%PDF-1.7``), and ``%%EOF`` in its last KB.

    Bytes after a file's end are allowed (a video after a JPEG: a motion photo). A
    look costs a few slices and one search from the end of the bytes."""
    why = ""
    size: tuple[int, int] | None = None
    if media_type == "image/png":
        if len(data) < 33 or data[8:16] != b"\x00\x00\x00\x0dIHDR":
            why = f"its IHDR chunk is cut short (the bytes end at {len(data)})"
        elif zlib.crc32(data[12:29]) != int.from_bytes(data[29:33], "big"):
            why = "its IHDR chunk's CRC is wrong"
        else:
            size = int.from_bytes(data[16:20], "big"), int.from_bytes(data[20:24], "big")
            if not (0 < size[0] < 2**31 and 0 < size[1] < 2**31):
                why = f"its IHDR says {size[0]}x{size[1]}"
            elif data.rfind(_PNG_END, 33) < 0:
                why = "it has no IEND chunk: it is cut short"
    elif media_type == "image/jpeg":
        frame = _jpeg_frame(data)
        if frame is None:
            why = "it has no frame header (SOF): it is cut short or is not a JPEG"
        else:
            size, end = (frame[0], frame[1]), frame[2]
            if not (size[0] and size[1]):
                why = f"its frame header says {size[0]}x{size[1]}"
            elif data.rfind(b"\xff\xd9", end) < 0:
                why = "it has no end of image (EOI): it is cut short"
    elif media_type == "image/gif":
        if len(data) < 13:
            why = f"its screen descriptor is cut short (the bytes end at {len(data)})"
        else:
            size = int.from_bytes(data[6:8], "little"), int.from_bytes(data[8:10], "little")
            if not (size[0] and size[1]):
                why = f"its screen descriptor says {size[0]}x{size[1]}"
            elif len(data) < 14 or not data[-256:].rstrip(b"\x00").endswith(b";"):
                why = "it has no trailer: it is cut short"
    elif media_type == "image/webp":
        riff = int.from_bytes(data[4:8], "little")
        if len(data) < riff + 8:
            why = f"it is cut short (its RIFF header says {riff + 8} bytes, it has {len(data)})"
        else:
            size = _webp_size(data)
            if size is None:
                why = "it has no VP8, VP8L or VP8X header"
            elif not (size[0] and size[1]):
                why = f"its header says {size[0]}x{size[1]}"
    elif media_type == PDF:
        if not _PDF_VERSION.match(data):
            why = "its header has no version (%PDF-1.x)"
        elif data.rfind(b"%%EOF", max(0, len(data) - _PDF_TAIL)) < 0:
            why = f"it has no %%EOF in its last {size_text(_PDF_TAIL)}: it is cut short"
    if why:
        raise ContentError(f"the bytes are not a whole {_short(media_type)}: {why}")
    return size


def wav_seconds(data: bytes) -> float | None:
    """``ContentError`` unless ``data`` is a whole WAV (its ``fmt`` chunk, and all of
    its ``data`` chunk's bytes); its length in seconds (None: a byte rate of 0)."""
    at, byte_rate, length = 12, None, None
    while at + 8 <= len(data):
        chunk, size = data[at : at + 4], int.from_bytes(data[at + 4 : at + 8], "little")
        if chunk == b"fmt " and size >= 16 and at + 24 <= len(data):
            byte_rate = int.from_bytes(data[at + 16 : at + 20], "little")
        elif chunk == b"data":
            length = size
            if size != 0xFFFFFFFF and at + 8 + size > len(data):  # (a stream's: unknown)
                raise ContentError(
                    f"the bytes are not a whole WAV: its data chunk says {size:,} bytes, "
                    f"{len(data) - at - 8:,} follow"
                )
            break
        at += 8 + size + (size & 1)
    if byte_rate is None or length is None:
        missing = "fmt" if byte_rate is None else "data"
        raise ContentError(f"the bytes are not a whole WAV: it has no {missing} chunk")
    if not byte_rate or length == 0xFFFFFFFF:
        return None
    return length / byte_rate


#: MPEG audio layer III bit rates (kbit/s) by index: MPEG-1, then MPEG-2 and 2.5.
_MP3_RATES = (
    (0, 32, 40, 48, 56, 64, 80, 96, 112, 128, 160, 192, 224, 256, 320),
    (0, 8, 16, 24, 32, 40, 48, 56, 64, 80, 96, 112, 128, 144, 160),
)
#: MPEG-1 sampling rates by index (MPEG-2 halves them, MPEG-2.5 quarters them).
_MP3_HERTZ = (44100, 48000, 32000)


def mp3_seconds(data: bytes) -> float | None:
    """``ContentError`` unless ``data`` is a whole MP3 (its ID3 tag whole, then layer III
    frames, the last one whole); its length in seconds, at 1,152 samples a frame (576
    for MPEG-2 and 2.5), or None for a free-format frame, which does not say it."""
    at = 0
    if data.startswith(b"ID3"):
        if len(data) < 10:
            raise ContentError("the bytes are not a whole MP3: its ID3 tag is cut short")
        at = 10 + sum((data[6 + i] & 0x7F) << (7 * (3 - i)) for i in range(4))
    first, seconds = at, 0.0
    while at + 4 <= len(data):
        header = data[at : at + 4]
        if header[0] != 0xFF or header[1] & 0xE0 != 0xE0:
            break  # a trailer (an ID3v1 tag, say) or nothing where the tag ends
        version, layer = (header[1] >> 3) & 3, (header[1] >> 1) & 3
        rate, sampling, padding = header[2] >> 4, (header[2] >> 2) & 3, (header[2] >> 1) & 1
        if layer != 1 or version == 1 or rate == 15 or sampling == 3:
            raise ContentError(
                f"the bytes are not a whole MP3: its frame at {at:,} is not MPEG layer III"
            )
        mpeg1 = version == 3
        kbits = _MP3_RATES[0 if mpeg1 else 1][rate]
        if not kbits:
            return None
        hertz = _MP3_HERTZ[sampling] >> (0 if mpeg1 else 1 if version == 2 else 2)
        length = (144 if mpeg1 else 72) * kbits * 1000 // hertz + padding
        if at + length > len(data):
            raise ContentError(
                f"the bytes are not a whole MP3: its frame at {at:,} has {length:,} bytes, "
                f"{len(data) - at:,} follow"
            )
        seconds, at = seconds + (1152 if mpeg1 else 576) / hertz, at + length
    if at == first:
        raise ContentError(
            f"the bytes are not a whole MP3: no audio frame where its tag ends (at {at:,})"
        )
    return seconds


def _read(path: str | os.PathLike[str], max_bytes: int | None) -> bytes:
    size = os.stat(path).st_size
    if max_bytes is not None and size > max_bytes:
        raise ContentError(
            f"{os.fspath(path)!r} is {size_text(size)}: more than the {size_text(max_bytes)} "
            "a part may have (max_bytes)"
        )
    with open(path, "rb") as file:
        return file.read()


def sniff(data: bytes) -> str:
    """The media type the magic number of ``data`` says, or "" for none fractor takes."""
    for kind in MEDIA_KINDS:
        found = kind.sniff_type(data)
        if found:
            return found
    return ""


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 " and data[23:26] == b"\x9d\x01\x2a":
        width = int.from_bytes(data[26:28], "little") & 0x3FFF
        height = int.from_bytes(data[28:30], "little") & 0x3FFF
        return width, height
    if chunk == b"VP8L" and data[20:21] == b"\x2f" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X" and len(data) >= 30:
        return int.from_bytes(data[24:27], "little") + 1, int.from_bytes(data[27:30], "little") + 1
    return None


#: JPEG start-of-frame markers (C0-CF but DHT C4, JPG C8 and DAC CC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_frame(data: bytes) -> tuple[int, int, int] | None:
    """(width, height, where the frame header ends) of a JPEG's SOF, read across
    the segments after SOI; None when the header ends or scans begin before one."""
    at = 2
    for _ in range(1_000):  # a header has a few dozen segments; never scan the image
        while at < len(data) and data[at] == 0xFF and at + 1 < len(data) and data[at + 1] == 0xFF:
            at += 1  # fill bytes
        if at + 4 > len(data) or data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker in _SOF:
            if at + 9 > len(data):
                return None
            height = int.from_bytes(data[at + 5 : at + 7], "big")
            width = int.from_bytes(data[at + 7 : at + 9], "big")
            return width, height, at + 2 + int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in (0xD8, 0x01) or 0xD0 <= marker <= 0xD7:
            at += 2
            continue
        if marker == 0xD9 or marker == 0xDA:  # end of image, start of scan: no SOF seen
            return None
        at += 2 + int.from_bytes(data[at + 2 : at + 4], "big")
    return None


_PAGE = re.compile(rb"/Type\s*/Page(?![A-Za-z])")


def pdf_pages(data: bytes) -> int | None:
    """An estimate of a PDF's pages: its ``/Type /Page`` objects (not ``/Pages``);
    None when none is visible (they may sit in compressed object streams)."""
    pages = len(_PAGE.findall(data))
    return pages or None


def _type_from_url(url: str, types: dict[str, str]) -> str:
    if url.startswith("data:"):
        return url[5:].split(";", 1)[0].split(",", 1)[0]
    path = url.split("?", 1)[0].split("#", 1)[0]
    return types.get(os.path.splitext(path)[1].lower(), "")


def _short(media_type: str) -> str:
    kind = kind_of_type(media_type)
    return kind.media_types[media_type] if kind is not None else media_type


def _head(data: bytes) -> str:
    if not data:
        return "empty"
    return f"starting {data[:8]!r}"


def size_text(size: int) -> str:
    """A size in bytes as people read it: ``182 KB``, ``1.2 MB``, ``25 MB``."""
    if size >= 10_000_000:
        return f"{size / 1_000_000:.0f} MB"
    if size >= 1_000_000:
        return f"{size / 1_000_000:.1f} MB"
    return f"{max(1, round(size / 1000)) if size else 0} KB"


# -- how a part is shown --------------------------------------------------------------


def describe_part(part: Part) -> str:
    """One line saying what ``part`` is, never its bytes:
    ``[image 1024x768 png, 182 KB, sha256:ab12cd34]``, ``[document report.pdf,
    12 pages, 1.2 MB, sha256:...]``, ``[audio wav 2.5 s, 80 KB, sha256:...]``,
    ``[image https://...]``, ``[text 120 chars]``."""
    if type(part) is Text:
        return f"[text {len(part.text)} chars]"
    assert isinstance(part, MediaPart)
    if part.url:
        url = part.url if len(part.url) <= 60 else part.url[:57] + "..."
        if url.startswith("data:"):
            url = url.split(",", 1)[0] + ",..."
        return f"[{part.kind} {url}]"
    return f"[{part.kind} {part.facts_text()}, {size_text(part.size)}, sha256:{part.sha256[:8]}]"


def describe_parts(parts: Iterable[Part]) -> str:
    """The lines of ``describe_part``, joined by a space ("" for none)."""
    return " ".join(describe_part(part) for part in parts)


# -- token estimates ------------------------------------------------------------------

#: The input tokens counted for an image whose size is unknown (a URL, or a header
#: that does not say it): the most Anthropic's rule counts for one image.
UNKNOWN_IMAGE_TOKENS = 1_600
#: The input tokens counted per page of a PDF (its text and the page's image, as
#: providers send both); a PDF's own text is not read for the estimate.
DOCUMENT_TOKENS_PER_PAGE = 1_500
#: The pages counted for a PDF whose pages are unknown (a URL, compressed objects):
#: at least this many, or one per 100 KB of it.
UNKNOWN_DOCUMENT_PAGES = 3
#: The input tokens counted per second of audio (OpenAI's audio models count about
#: ten a second), and the seconds counted for a recording of unknown length.
AUDIO_TOKENS_PER_SECOND = 10
UNKNOWN_AUDIO_SECONDS = 60.0


def anthropic_image_tokens(width: int, height: int) -> int:
    """Anthropic's published rule: ``width * height / 750``, at most 1,600 (an image
    larger than about 1.15 megapixels is scaled down to that before the model sees it)."""
    return min(UNKNOWN_IMAGE_TOKENS, max(1, -(-width * height // 750)))


def openai_image_tokens(width: int, height: int) -> int:
    """OpenAI's published tile rule (``detail: high``): scaled to fit 2048x2048, then
    its shortest side to 768 (never up), 85 tokens plus 170 per 512-px tile."""
    w, h = float(max(1, width)), float(max(1, height))
    if max(w, h) > 2048:
        scale = 2048 / max(w, h)
        w, h = w * scale, h * scale
    if min(w, h) > 768:
        scale = 768 / min(w, h)
        w, h = w * scale, h * scale
    tiles = -(-int(w) // 512) * -(-int(h) // 512)
    return 85 + 170 * tiles


ImageTokens = Callable[[int, int], int]


def part_tokens(
    part: Part, *, image_tokens: ImageTokens = anthropic_image_tokens, chars_per_token: float = 4
) -> int:
    """The input tokens a part is counted for in a request's estimate.

    - text: a token per ``chars_per_token`` characters;
    - an image of known size: ``image_tokens(width, height)`` (by default Anthropic's
      ``width * height / 750``, at most 1,600; ``openai_image_tokens`` is OpenAI's);
      of unknown size: ``UNKNOWN_IMAGE_TOKENS`` (1,600);
    - a PDF: ``DOCUMENT_TOKENS_PER_PAGE`` (1,500) per page; pages unknown: the larger
      of ``UNKNOWN_DOCUMENT_PAGES`` (3) and one per 100 KB;
    - audio: ``AUDIO_TOKENS_PER_SECOND`` (10) a second; its length unknown:
      ``UNKNOWN_AUDIO_SECONDS`` (60).
    """
    if type(part) is Text:
        return -int(-len(part.text) // chars_per_token)
    assert isinstance(part, MediaPart)
    return part.tokens(image_tokens)


_NAMED = re.compile(r"sha256:([0-9a-f]{8,64})")


def named_parts(text: str, parts: Iterable[Part]) -> tuple[Media, ...]:
    """The images and documents of ``parts`` that ``text`` names as
    ``sha256:<at least 8 hex digits>`` (as ``describe_part`` shows them), in the
    order named, each once: how a model hands parts of its context to a subagent
    (the task text of its call names them). Empty when ``text`` names none."""
    if "sha256:" not in text:
        return ()
    prefixes = _NAMED.findall(text)
    found: dict[str, Media] = {}
    candidates = [p for p in parts if isinstance(p, MediaPart) and p.sha256]
    for prefix in prefixes:
        for part in candidates:
            if part.sha256.startswith(prefix) and part.sha256 not in found:
                found[part.sha256] = part
                break
    return tuple(found.values())


# -- turning what a caller gives into text and parts ----------------------------------


def split_content(value: Any, what: str, *, joiner: str = "\n\n") -> tuple[str, tuple[Media, ...]]:
    """``(text, parts)`` of a str, a part, or a list/tuple mixing str and parts: the
    text pieces (str and ``Text``) joined by ``joiner``, the images and documents in
    their order. ``TypeError`` naming ``what`` for anything else."""
    if isinstance(value, str):
        return value, ()
    if isinstance(value, Text | MediaPart):
        items: list[Any] | tuple[Any, ...] = (value,)
    elif isinstance(value, list | tuple):
        items = value
    else:
        raise TypeError(
            f"{what} is text (str), a part, or a list of str and parts "
            f"({_NAMES}, fractor.Text), got {type(value).__qualname__}"
        )
    texts: list[str] = []
    parts: list[Media] = []
    for item in items:
        if isinstance(item, str):
            texts.append(item)
        elif type(item) is Text:
            texts.append(item.text)
        elif isinstance(item, MediaPart):
            parts.append(item)  # type: ignore[arg-type]
        else:
            raise TypeError(
                f"{what} mixes str and parts ({_NAMES}, fractor.Text), "
                f"got a {type(item).__qualname__}"
            )
    return joiner.join(texts), tuple(parts)


#: The kinds of media parts, as error messages name them.
_NAMES = ", ".join(f"fractor.{kind.__name__}" for kind in MEDIA_KINDS)
#: What fractor takes, in words, for an error about bytes of another kind.
TAKEN = ", ".join(
    f"{kind.kind}{'' if kind.kind == 'audio' else 's'} ({', '.join(kind.media_types.values())})"
    for kind in MEDIA_KINDS
)
