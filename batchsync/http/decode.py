"""Turning a body into the data a Result carries, as ``expect`` asks.

Text and JSON are decoded as plain requests decodes them (``r.text``, ``r.json()``), so that a
caller moving over gets the same strings: the charset the Content-Type declares; for ``text/*``
without one ISO-8859-1 (requests follows RFC 2616) and for ``application/json`` UTF-8; with no
label at all, JSON's UTF-8/16/32 from its first bytes and other text the guess of
charset_normalizer (or chardet). Bytes a charset cannot decode become U+FFFD, as in requests.
"""

from __future__ import annotations

import base64
import json
from typing import Any

from pydantic import BaseModel, ValidationError
from requests.compat import chardet
from requests.structures import CaseInsensitiveDict
from requests.utils import get_encoding_from_headers, guess_json_utf

from ..core.kept import Kept
from .spec import one_line


class InvalidBody(ValueError):
    """The body cannot be read the way ``expect`` asks."""


# Content-Type → declared encoding, as worked out once: a run meets few Content-Types. Only
# those up to _MAX_KEPT_LENGTH characters are kept, at most _MAX_KEPT of them (past that the
# cache starts afresh; an entry is re-derived on demand).
_MAX_KEPT, _MAX_KEPT_LENGTH = 256, 200
_ENCODINGS: Kept[str | None, str | None] = Kept(_MAX_KEPT)
_UNKNOWN = object()


def declared_encoding(content_type: str | None) -> str | None:
    """The encoding requests gives a response of this Content-Type (``r.encoding``)."""
    kept = _ENCODINGS.get(content_type, _UNKNOWN)
    if kept is not _UNKNOWN:
        return kept  # type: ignore[return-value]
    given = CaseInsensitiveDict({"content-type": content_type}) if content_type else None
    encoding = None if given is None else get_encoding_from_headers(given)
    if content_type is None or len(content_type) <= _MAX_KEPT_LENGTH:
        _ENCODINGS.keep(content_type, encoding)
    return encoding


def text_of(body: bytes | bytearray, encoding: str | None) -> str:
    """``r.text``: the body in ``encoding``, else in the guessed one; UTF-8 when unknown."""
    if not body:
        return ""
    if encoding is None:
        encoding = chardet.detect(bytes(body))["encoding"] if chardet is not None else None
    try:
        return str(body, encoding or "utf-8", errors="replace")
    except LookupError:  # a charset Python does not know
        return str(body, "utf-8", errors="replace")


def json_text(body: bytes | bytearray, encoding: str | None) -> str:
    """The text ``r.json()`` parses: without a declared encoding, a UTF-8/16/32 read off the
    first bytes (when they decode in it), else ``r.text``."""
    if encoding is None and len(body) > 3:
        guessed = guess_json_utf(bytes(body[:4]))
        if guessed is not None:
            try:
                return str(body, guessed)
            except UnicodeDecodeError:
                pass
    return text_of(body, encoding)


def decode_body(body: bytes | bytearray, expect: object, content_type: str | None) -> Any:
    """The body as JSON (default), text, base64 text for bytes, or a validated pydantic model."""
    if expect == "bytes":
        return base64.b64encode(body).decode("ascii")
    encoding = declared_encoding(content_type)
    if expect == "text":
        return text_of(body, encoding)
    # (with a declared encoding, the text r.json() parses is r.text)
    text = json_text(body, None) if encoding is None else text_of(body, encoding)
    if isinstance(expect, type) and issubclass(expect, BaseModel):
        try:
            return expect.model_validate_json(text)
        except ValidationError as exc:
            raise _misfit(expect, exc) from None
    try:
        return json.loads(text)
    except ValueError as exc:
        raise InvalidBody(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidBody("body is JSON nested too deeply to read") from None


def decode_value(value: Any, expect: object) -> Any:
    """A JSON value already read (a batch row's answer, inside its results line) as
    ``decode_body`` gives a body: validated into ``expect`` when it is a pydantic model."""
    if isinstance(expect, type) and issubclass(expect, BaseModel):
        try:
            return expect.model_validate(value)
        except ValidationError as exc:
            raise _misfit(expect, exc) from None
    return value


def _misfit(expect: type[BaseModel], exc: ValidationError) -> InvalidBody:
    return InvalidBody(f"body does not fit {expect.__name__}: {one_line(exc)}")
