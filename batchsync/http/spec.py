"""Items in, RequestSpecs out: parse and validate what the caller gave, before anything is sent."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from ..core.verdict import InvalidItem

UNSAFE_METHODS = frozenset({"POST", "PATCH"})
# CONNECT opens a tunnel and TRACE echoes the request (headers and all) back: neither is a call.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
_SHOWN_METHOD = re.compile(r"[A-Za-z]{1,16}")


def json_writable(value: Any) -> bool:
    """Whether strict JSON (every output file, the journal) can hold ``value``: no NaN, no
    infinity, no object JSON has no form for."""
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError):
        return False
    return True


# requests' own rules for a header (``requests.utils.check_header_validity``): a name without
# colons, whitespace first or line breaks; a value that starts with no whitespace and has no
# line breaks. Plus what http.client cannot send (beyond latin-1) and what no server should get
# (NUL). Messages name the header, never its value: values are often secrets.
_HEADER_NAME = re.compile(r"[^:\s][^:\r\n]*")
_HEADER_VALUE = re.compile(r"(?:\S[^\r\n\x00]*)?")


def check_headers(headers: Mapping[str, str | None]) -> None:
    """ValueError naming the first header that cannot be sent as given (a None value, as in
    requests, leaves the header out)."""
    for name, value in headers.items():
        if not _HEADER_NAME.fullmatch(name) or not name.isascii():
            raise ValueError(f"not a valid header name: {name!r}")
        if value is None:
            continue
        if not _HEADER_VALUE.fullmatch(value):
            raise ValueError(
                f"header {name}: its value has a line break, a NUL or leading whitespace"
            )
        if not value.isascii():
            try:
                value.encode("latin-1")
            except UnicodeEncodeError:
                raise ValueError(
                    f"header {name}: its value has characters that HTTP headers cannot carry "
                    "(beyond latin-1)"
                ) from None


Headers = TypeVar("Headers", bound=Mapping[str, str | None] | None)


def sendable_headers(value: Headers) -> Headers:
    """``check_headers`` as a field's validator: the headers given, once each can be sent."""
    if value is not None:
        check_headers(value)
    return value


# A space or a control character in a host: urllib3 2.8 refuses it as it parses, an older
# release (setup.cfg admits 2.6) reads it as a host; refused here on every release.
_NOT_IN_A_HOST = re.compile(r"[\x00-\x20\x7f]")
_UNREADABLE = "not a valid URL: its host or port cannot be read"


def check_url(url: str) -> str:
    """The URL itself when it is an absolute http(s) URL with a host; else ValueError."""
    try:
        parsed = parse_url(url)
    except LocationParseError:  # (its message repeats the URL, passwords and all)
        raise ValueError(_UNREADABLE) from None
    if _NOT_IN_A_HOST.search(parsed.host or ""):
        raise ValueError(_UNREADABLE)
    scheme = (parsed.scheme or "").lower()
    if scheme not in ("http", "https"):
        raise ValueError(f"scheme must be http or https, got {parsed.scheme or 'none'!r}")
    if not parsed.host:
        raise ValueError("URL has no host")
    return url


class RequestSpec(BaseModel):
    """One request of a batch, as given in an item (a mapping, a JSON line, or just a URL)."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    url: str
    method: str = "GET"
    headers: dict[str, str | None] | None = None
    params: dict[str, Any] | None = None
    json_body: Any = Field(default=None, alias="json")
    data: str | dict[str, Any] | None = None
    id: Any = None
    idempotency_key: str | None = None
    fallbacks: list[str] | None = None

    @field_validator("url")
    @classmethod
    def _absolute_http_url(cls, value: str) -> str:
        return check_url(value)

    _sendable_headers = field_validator("headers")(staticmethod(sendable_headers))

    @field_validator("id")
    @classmethod
    def _strict_json_id(cls, value: Any) -> Any:
        if not json_writable(value):
            raise ValueError("strict JSON cannot hold it (a NaN, an infinity or another object)")
        return value

    @field_validator("fallbacks")
    @classmethod
    def _fallback_urls(cls, value: list[str] | None) -> list[str] | None:
        return None if value is None else [check_url(url) for url in value]

    @field_validator("method")
    @classmethod
    def _known_method(cls, value: str) -> str:
        if value.upper() not in METHODS:
            shown = f"{value!r} is " if _SHOWN_METHOD.fullmatch(value) else ""
            raise ValueError(f"{shown}not one of {', '.join(sorted(METHODS))}")
        return value.upper()

    @property
    def retry_safe(self) -> bool:
        """POST and PATCH may be repeated only when an idempotency key makes that safe."""
        return self.method not in UNSAFE_METHODS or self.idempotency_key is not None

    def to_item(self) -> dict[str, Any]:
        """The item as it would be written in an input file (valid input again)."""
        return self.model_dump(by_alias=True, exclude_none=True, exclude_defaults=True) | {
            "url": self.url
        }


def one_line(exc: ValidationError) -> str:
    """A pydantic error as one line: ``field: message; field: message``."""
    parts = []
    for error in exc.errors():
        location = ".".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        parts.append(f"{location}: {message}" if location else message)
    return "; ".join(parts)


def parse_item(item: object) -> RequestSpec:
    """A RequestSpec from a URL string, a mapping or a RequestSpec; InvalidItem otherwise."""
    if isinstance(item, RequestSpec):
        return item
    if isinstance(item, str):
        try:
            return RequestSpec.model_construct(url=check_url(item))
        except ValueError as exc:
            raise InvalidItem(str(exc)) from None
    if isinstance(item, Mapping):
        try:
            return RequestSpec.model_validate(item)
        except ValidationError as exc:
            raise InvalidItem(one_line(exc)) from None
    raise InvalidItem(
        f"an item must be a URL string or a mapping with 'url', not {type(item).__name__}"
    )


def item_label(item: object) -> tuple[str | None, Any]:
    """The (url, id) to report for an item, read without validating it."""
    if isinstance(item, str):
        return item, None
    if isinstance(item, RequestSpec):
        return item.url, item.id
    if isinstance(item, Mapping):
        url, item_id = item.get("url"), item.get("id")
        # An id that cannot be written out is refused with the item (see RequestSpec).
        return (url if isinstance(url, str) else None), item_id if json_writable(item_id) else None
    return None, None
