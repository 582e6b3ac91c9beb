"""What both wire formats share to send images and documents (``actors._parts``).

- ``Parts``: one per request build. It checks each part before anything is sent
  (``ProviderError`` naming the part, ``kind="content"``, not retryable: the same
  request would be refused again) and gives its base64 text, computed once per part
  (by SHA-256) for the whole request however many turns carry it, never stored back
  into the part.
- ``label``: the text line sent just before each part, ``describe_part`` of it
  (``[image 1024x768 png, 182 KB, sha256:ab12cd34]``), so the model knows its name:
  a subagent call whose task text names ``sha256:<prefix>`` hands that part down.
- ``part_estimate``: the input tokens a part adds to a provider's estimate.

A part is refused when it has no bytes (``stored``: read from a store without its
blob; load it with the store's blobs first), when the model was told its endpoint
does not take its kind (``accepts=``), or when the wire format cannot carry it
(the caller says why: an OpenAI document given only by an http URL).
"""

from __future__ import annotations

import base64
from collections.abc import Collection

from .._parts import MEDIA_KINDS, ImageTokens, Media, describe_part, part_tokens
from ._errors import ProviderError

__all__ = [
    "KINDS",
    "PART_LABEL_TOKENS",
    "Parts",
    "check_accepts",
    "kind_of",
    "label",
    "part_estimate",
]

#: The kinds of parts a model may say it accepts (``accepts=``).
KINDS = tuple(kind.kind for kind in MEDIA_KINDS)

#: The input tokens counted per part on top of its own, for the line naming it.
PART_LABEL_TOKENS = 20


def kind_of(part: Media) -> str:
    """Its kind's name: ``"image"``, ``"document"``, ``"audio"`` (``MEDIA_KINDS``)."""
    return part.kind


def _plural(kind: str) -> str:
    """A kind's name for more than one: ``images``, ``documents``, ``audio``."""
    return kind if kind == "audio" else f"{kind}s"


def check_accepts(provider: str, accepts: Collection[str]) -> frozenset[str]:
    """The kinds of ``accepts`` as a frozenset, or ``ValueError`` naming a wrong one."""
    if isinstance(accepts, str) or not isinstance(accepts, Collection):
        raise TypeError(
            f"{provider}: accepts is a collection of kinds ({', '.join(KINDS)}), got {accepts!r}"
        )
    unknown = sorted(set(accepts) - set(KINDS))
    if unknown:
        raise ValueError(
            f"{provider}: accepts names kinds of parts ({', '.join(KINDS)}), got {unknown}"
        )
    return frozenset(accepts)


def label(part: Media) -> str:
    """The text sent just before a part: its one-line description."""
    return describe_part(part)


def part_estimate(part: Media, image_tokens: ImageTokens) -> int:
    """The input tokens of ``part`` in a provider's estimate: ``part_tokens`` by the
    provider's image rule, plus ``PART_LABEL_TOKENS`` for the line naming it."""
    return part_tokens(part, image_tokens=image_tokens) + PART_LABEL_TOKENS


class Parts:
    """The parts of one request build: checked, and each one's base64 made once."""

    __slots__ = ("_accepts", "_encoded", "_model", "_provider")

    def __init__(self, provider: str, model: str, accepts: frozenset[str]) -> None:
        self._provider = provider
        self._model = model
        self._accepts = accepts
        self._encoded: dict[str, str] = {}

    def refuse(self, part: Media, why: str, advice: str) -> ProviderError:
        """The ``ProviderError`` refusing ``part`` (named by ``describe_part``)."""
        return ProviderError(
            self._provider,
            f"cannot send {describe_part(part)}: {why}",
            advice=advice,
            model=self._model,
            kind="content",
        )

    def check(self, part: Media) -> None:
        """Raise the ``ProviderError`` refusing ``part`` if this model cannot send it."""
        kind = kind_of(part)
        if kind not in self._accepts:
            taken = " and ".join(_plural(k) for k in KINDS if k in self._accepts) or "no parts"
            raise self.refuse(
                part,
                f"this model's endpoint does not take {_plural(kind)} (it takes {taken}: accepts=)",
                "send it to a model that takes them, or describe it in text",
            )
        if part.stored:
            raise self.refuse(
                part,
                "it has no bytes (it was read from a store without its blob)",
                "load it with its store's blobs (load_blobs) before sending it",
            )

    def base64(self, part: Media) -> str:
        """The base64 text of ``part``'s bytes: made once per part for this request."""
        key = part.sha256
        text = self._encoded.get(key)
        if text is None:
            data = part.data
            assert data is not None  # checked: a part without a url has its bytes
            text = self._encoded[key] = base64.b64encode(data).decode("ascii")
        return text

    def data_url(self, part: Media) -> str:
        """``data:<media type>;base64,...`` of ``part``: made once per part too."""
        key = "url:" + part.sha256
        text = self._encoded.get(key)
        if text is None:
            data = part.data
            assert data is not None  # checked: a part without a url has its bytes
            encoded = base64.b64encode(data).decode("ascii")
            text = self._encoded[key] = f"data:{part.media_type};base64,{encoded}"
        return text
