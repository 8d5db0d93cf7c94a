"""Response headers read without the email package: the same HTTPMessage at a fraction of the cost.

``http.client`` hands every response's header block to ``email.parser``, a general MIME parser
that took about a sixth of the instructions batchsync spends on a small request. The header blocks
HTTP servers send are nearly always plain ``Name: value`` lines, and for those the message is
built here directly; anything else (folded lines, malformed lines, multipart or message
bodies that the email parser treats specially) still goes through ``email.parser``, so the
result is the stdlib's in every case.
"""

from __future__ import annotations

import email.parser
import http.client
import re
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO, TypeGuard

from urllib3 import HTTPHeaderDict

from . import internals
from .internals import MESSAGE_FIELDS, QUICK_HEADER_DICT, READ_HEADERS, header_reading_unchanged

# A plain header line, where a line begins: a name of printable ASCII (no colon), a colon,
# then a value without CR or LF (``email``'s compat32 drops the spaces and tabs before it).
_PLAIN_LINES = re.compile(r"^([!-9;-~]+):[ \t]*([^\r\n]*)\r?\n", re.MULTILINE)
_END_OF_HEADERS = (b"\r\n", b"\n")
# Content types for which the email parser looks into the (empty) body and builds parts.
_SPECIAL_TYPE = re.compile(r"multipart|message", re.IGNORECASE)


class QuickMessage(http.client.HTTPMessage):
    """An HTTPMessage whose look-ups skip the email policy's value clean-up.

    compat32 hands a str value back as is unless it holds surrogates, and text decoded from
    latin-1, as every HTTP header here is, cannot hold any.
    """

    # The header list as this module built it, and its names lower-cased: while the message's
    # own list still equals it (nothing added, removed or renamed since), ``get`` finds a name
    # by the index of its first line without lower-casing every name on every look-up.
    _built: list[tuple[str, Any]] | None = None
    _names: list[str]
    # email.message.Message's own fields (their shape checked by ``internals.MESSAGE_FIELDS``).
    _headers: list[tuple[str, Any]]
    _payload: Any

    def get(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        headers = self._headers
        if headers == self._built:
            names = self._names
            return headers[names.index(name)][1] if name in names else failobj
        for key, value in headers:
            if key.lower() == name:
                return value
        return failobj

    def items(self) -> list[tuple[str, Any]]:
        return list(self._headers)


def _plain_fields(lines: list[bytes]) -> tuple[list[tuple[str, str]], list[str]] | None:
    """The (name, value) of each line of a plain header block, and each name lower-cased;
    None when the block is not plain: a line that is not ``Name: value``, no blank line at
    its end, or a Content-Type the email parser treats specially. (One search: each line ends
    at its only LF, so as many matches as lines means each match is a whole line.)"""
    if lines[-1] not in _END_OF_HEADERS:
        return None
    block = b"".join(lines[:-1]).decode("iso-8859-1")
    fields: list[tuple[str, str]] = _PLAIN_LINES.findall(block)
    if len(fields) != len(lines) - 1:
        return None
    names = [name.lower() for name, _ in fields]
    if _SPECIAL_TYPE.search(block) and any(
        name == "content-type" and _SPECIAL_TYPE.search(value)
        for name, (_, value) in zip(names, fields, strict=True)
    ):
        return None
    return fields, names


def parse_headers(
    fp: BinaryIO, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
) -> http.client.HTTPMessage:
    """``http.client.parse_headers`` with the quick path.

    The lines are read by the stdlib's own ``_read_headers``, so ``http.client._MAXLINE`` and
    ``_MAXHEADERS`` apply as they are set at the time of the call.
    """
    if _class is not http.client.HTTPMessage or READ_HEADERS is None or not MESSAGE_FIELDS:
        return internals.STDLIB_PARSE_HEADERS(fp, _class)
    lines = READ_HEADERS(fp)
    plain = _plain_fields(lines)
    if plain is None:  # what ``email.parser`` makes of them, as the stdlib does
        text = b"".join(lines).decode("iso-8859-1")
        parsed: http.client.HTTPMessage = email.parser.Parser(_class=QuickMessage).parsestr(text)
        return parsed
    message = QuickMessage()  # (the same, built directly: the block is plain)
    fields, message._names = plain
    message._headers = fields
    message._payload = ""  # (what set_payload("") sets)
    message._built = list(fields)
    return message


def _quick_begin_of(begin: Callable[..., Any]) -> Callable[[http.client.HTTPResponse], None] | None:
    """``begin`` (http.client's own) run with this module's ``parse_headers``, all else decided
    as the running Python decides it; None for a ``begin`` not built the way this expects."""
    return internals.begin_parsing_with(begin, parse_headers)


_QUICK_BEGIN = _quick_begin_of(internals.STDLIB_BEGIN)


def quick_path_in_effect() -> bool:
    """Whether responses are read the quick way now: the shape was as expected at import,
    and nothing has replaced the stdlib pieces since (a patch is honoured by stepping aside)."""
    return _QUICK_BEGIN is not None and header_reading_unchanged()


class QuickHeadersResponse(http.client.HTTPResponse):
    """An ``http.client`` response whose headers are read by ``parse_headers`` above."""

    def begin(self) -> None:
        if _QUICK_BEGIN is not None and header_reading_unchanged():
            _QUICK_BEGIN(self)
        else:
            http.client.HTTPResponse.begin(self)


class _QuickItems(list[tuple[str, str]]):
    """The (name, value) pairs of a header block read the quick way, as urllib3 would have
    normalised them (unchanged: no value of a plain block holds a line break)."""


def _read_quick(message: http.client.HTTPMessage) -> TypeGuard[QuickMessage]:
    """Whether ``message`` was built by ``parse_headers`` above and not changed since."""
    return (
        type(message) is QuickMessage
        and message._built is not None
        and message._headers == message._built
    )


def _assert_header_parsing(headers: http.client.HTTPMessage) -> None:
    """urllib3's check, which a block read the quick way passes (no defect, no payload)."""
    if not _read_quick(headers):
        internals.URLLIB3_ASSERT_HEADER_PARSING(headers)


def _normalize_header_values(message: http.client.HTTPMessage) -> list[tuple[str, str]]:
    """urllib3's normalisation, which leaves a block read the quick way as it is."""
    if _read_quick(message):
        return _QuickItems(message._headers)
    normalized: list[tuple[str, str]] = internals.URLLIB3_NORMALIZE(message)
    return normalized


def _header_dict(items: list[tuple[str, str]]) -> HTTPHeaderDict:
    """``HTTPHeaderDict(items)``: for a block read the quick way, filled as its ``add`` fills
    it, without the generic ``extend``'s type checks."""
    if type(items) is not _QuickItems or QUICK_HEADER_DICT is None:
        return HTTPHeaderDict(items)
    headers = HTTPHeaderDict()
    container = headers._container
    for name, value in items:
        new = [name, value]
        found = container.setdefault(name.lower(), new)
        if found is not new:
            found.append(value)
    return headers


# urllib3's own ``getresponse``, for a header block read the quick way, checks, normalises and
# copies what is already plain (no defect, no payload, no folded value), at a sixth of a small
# request's cost: the quick one stands in for those three steps (``internals.getresponse_with``).
# (A connection uses it while its class's ``getresponse`` is urllib3's and
# ``quick_getresponse_in_effect()``: see ``connections._Tracked``.)
QUICK_GETRESPONSE = internals.getresponse_with(
    internals.URLLIB3_GETRESPONSE, _assert_header_parsing, _normalize_header_values, _header_dict
)


def quick_getresponse_in_effect() -> bool:
    """Whether the three names the quick ``getresponse`` stands in for are still urllib3's own
    (a caller may patch ``urllib3.connection.assert_header_parsing`` to quiet its warnings:
    then urllib3's ``getresponse`` runs, with the patch); its other names are as at import."""
    return QUICK_GETRESPONSE is not None and internals.getresponse_names_unchanged()


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """``headers.get(name)``, read straight from urllib3's HTTPHeaderDict when it is one (its
    values joined as its own look-up joins them), not through its generic Mapping methods."""
    if type(headers) is QUICK_HEADER_DICT:
        found = headers._container.get(name.lower())
        return None if found is None else ", ".join(found[1:])
    return headers.get(name)
