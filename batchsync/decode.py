"""Turning a body into the data a Result carries, as ``expect`` asks."""

from __future__ import annotations

import base64
import codecs
import json
from typing import Any

from pydantic import BaseModel, ValidationError

from .spec import one_line


class InvalidBody(ValueError):
    """The body cannot be read the way ``expect`` asks."""


def charset_of(content_type: str | None) -> str:
    """The charset a Content-Type names, when Python knows it; UTF-8 otherwise."""
    for param in (content_type or "").split(";")[1:]:
        name, _, value = param.partition("=")
        if name.strip().lower() == "charset":
            charset = value.strip().strip("\"'")
            try:
                return codecs.lookup(charset).name
            except LookupError:
                break
    return "utf-8"


def decode_body(body: bytes | bytearray, expect: object, content_type: str | None) -> Any:
    """The body as JSON (default), text, base64 text for bytes, or a validated pydantic model."""
    if expect == "bytes":
        return base64.b64encode(body).decode("ascii")
    if expect == "text":
        return body.decode(charset_of(content_type), errors="replace")
    if isinstance(expect, type) and issubclass(expect, BaseModel):
        try:
            return expect.model_validate_json(body)
        except ValidationError as exc:
            raise InvalidBody(f"body does not fit {expect.__name__}: {one_line(exc)}") from None
    try:
        return json.loads(body)
    except ValueError as exc:
        raise InvalidBody(f"body is not JSON: {exc}") from None
    except RecursionError:
        raise InvalidBody("body is JSON nested too deeply to read") from None
