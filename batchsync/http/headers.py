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
import inspect
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, BinaryIO

import urllib3.connection
from urllib3 import HTTPHeaderDict

# A plain header line, where a line begins: a name of printable ASCII (no colon), a colon,
# then a value without CR or LF. ``email``'s compat32 policy drops the spaces and tabs before
# the value.
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

    def get(self, name: str, failobj: Any = None) -> Any:
        name = name.lower()
        headers = self._headers  # type: ignore[attr-defined]
        if headers == self._built:
            names = self._names
            return headers[names.index(name)][1] if name in names else failobj
        for key, value in headers:
            if key.lower() == name:
                return value
        return failobj

    def items(self) -> list[tuple[str, Any]]:
        return list(self._headers)  # type: ignore[attr-defined]


def _plain_fields(lines: list[bytes]) -> tuple[list[tuple[str, str]], list[str]] | None:
    """The (name, value) of each line of a plain header block, and each name lower-cased;
    None when the block is not plain: a line that is not ``Name: value``, no blank line at
    its end, or a Content-Type the email parser treats specially.

    The block is read in one search: each line ends at its only LF, so a match that begins
    where a line does takes the whole line, and as many matches as lines means every line is
    one."""
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


# The stdlib pieces the quick path stands on, as this module found them at import.
_STDLIB_BEGIN = http.client.HTTPResponse.begin
_STDLIB_PARSE_HEADERS = http.client.parse_headers
_STDLIB_READ_HEADERS: Callable[[BinaryIO], list[bytes]] | None = getattr(
    http.client, "_read_headers", None
)


def parse_headers(
    fp: BinaryIO, _class: type[http.client.HTTPMessage] = http.client.HTTPMessage
) -> http.client.HTTPMessage:
    """``http.client.parse_headers`` with the quick path.

    The lines are read by the stdlib's own ``_read_headers``, so ``http.client._MAXLINE`` and
    ``_MAXHEADERS`` apply as they are set at the time of the call.
    """
    if _class is not http.client.HTTPMessage or _STDLIB_READ_HEADERS is None:
        return _STDLIB_PARSE_HEADERS(fp, _class)
    lines = _STDLIB_READ_HEADERS(fp)
    plain = _plain_fields(lines)
    if plain is None:  # what ``email.parser`` makes of them, as the stdlib does
        text = b"".join(lines).decode("iso-8859-1")
        parsed: http.client.HTTPMessage = email.parser.Parser(_class=QuickMessage).parsestr(text)
        return parsed
    message = QuickMessage()  # (the same, built directly: the block is plain)
    fields, message._names = plain
    message._headers = fields  # type: ignore[attr-defined]
    message._built = list(fields)
    message._payload = ""  # type: ignore[attr-defined]  # (what set_payload("") sets)
    return message


def _has_expected_shape(begin: Callable[..., Any]) -> bool:
    """Whether ``begin`` and this Python's header functions are the ones the quick path was
    built for: ``begin(self)`` with no defaults or closures that reads the header block
    through a global ``parse_headers(fp, _class=HTTPMessage)``, and a ``_read_headers(fp)``."""
    return _begin_has_expected_shape(begin) and _header_functions_have_expected_shape()


def _begin_has_expected_shape(begin: Callable[..., Any]) -> bool:
    """``begin(self)``, without defaults or closures, naming a global ``parse_headers``."""
    code = begin.__code__
    return (
        code.co_argcount == 1
        and not code.co_kwonlyargcount
        and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        and begin.__defaults__ is None
        and begin.__kwdefaults__ is None
        and not code.co_freevars
        and "parse_headers" in code.co_names
    )


def _header_functions_have_expected_shape() -> bool:
    """``parse_headers(fp, _class=HTTPMessage)`` and ``_read_headers(fp)``, as found at import."""
    read = getattr(_STDLIB_READ_HEADERS, "__code__", None)
    return (
        _STDLIB_PARSE_HEADERS.__code__.co_varnames[:2] == ("fp", "_class")
        and _STDLIB_PARSE_HEADERS.__defaults__ == (http.client.HTTPMessage,)
        and read is not None
        and read.co_argcount == 1
        and _STDLIB_READ_HEADERS.__defaults__ is None  # type: ignore[union-attr]
    )


def _quick_begin_of(
    begin: Callable[..., Any],
) -> Callable[[http.client.HTTPResponse], None] | None:
    """``begin`` (http.client's own), run with ``parse_headers`` bound to this module's: the
    status line, chunking, lengths and keep-alive are decided exactly as the running Python
    decides them. None for a ``begin`` not built the way the quick path expects."""
    if not _has_expected_shape(begin):
        return None
    globals_ = {**vars(http.client), "parse_headers": parse_headers}
    return types.FunctionType(begin.__code__, globals_, "begin")


_QUICK_BEGIN = _quick_begin_of(_STDLIB_BEGIN)


def quick_path_in_effect() -> bool:
    """Whether responses are read the quick way now: the shape was as expected at import,
    and nothing has replaced the stdlib pieces since (a patch is honoured by stepping aside)."""
    return (
        _QUICK_BEGIN is not None
        and http.client.HTTPResponse.begin is _STDLIB_BEGIN
        and http.client.parse_headers is _STDLIB_PARSE_HEADERS
        and getattr(http.client, "_read_headers", None) is _STDLIB_READ_HEADERS
    )


class QuickHeadersResponse(http.client.HTTPResponse):
    """An ``http.client`` response whose headers are read by ``parse_headers`` above."""

    def begin(self) -> None:
        if quick_path_in_effect():
            _QUICK_BEGIN(self)  # type: ignore[misc]
        else:
            http.client.HTTPResponse.begin(self)


# urllib3's own ``getresponse`` and the pieces of it the quick path stands in for, as found at
# import: for a header block read the quick way it checks, normalises and copies what is
# already plain (no defect, no payload, no folded value), at a sixth of a small request's cost.
URLLIB3_GETRESPONSE = urllib3.connection.HTTPConnection.getresponse
# (urllib3.connection's own names, live: a later patch of one is seen)
_URLLIB3_CONNECTION_NAMES = vars(urllib3.connection)
# (read with ``get``: ``_normalize_header_values`` came with urllib3 2.8, and a release without
# one of these names builds no quick ``getresponse``: urllib3's own runs, the same bytes)
_URLLIB3_ASSERT_HEADER_PARSING: Any = _URLLIB3_CONNECTION_NAMES.get("assert_header_parsing")
_URLLIB3_NORMALIZE: Any = _URLLIB3_CONNECTION_NAMES.get("_normalize_header_values")
_URLLIB3_HEADER_DICT: Any = _URLLIB3_CONNECTION_NAMES.get("HTTPHeaderDict")


class _QuickItems(list[tuple[str, str]]):
    """The (name, value) pairs of a header block read the quick way, as urllib3 would have
    normalised them (unchanged: no value of a plain block holds a line break)."""


def _read_quick(message: http.client.HTTPMessage) -> bool:
    """Whether ``message`` was built by ``parse_headers`` above and not changed since."""
    return (
        type(message) is QuickMessage
        and message._built is not None
        and message._headers == message._built  # type: ignore[attr-defined]
    )


def _assert_header_parsing(headers: http.client.HTTPMessage) -> None:
    """urllib3's check, which a block read the quick way passes (no defect, no payload)."""
    if not _read_quick(headers):
        _URLLIB3_ASSERT_HEADER_PARSING(headers)


def _normalize_header_values(message: http.client.HTTPMessage) -> list[tuple[str, str]]:
    """urllib3's normalisation, which leaves a block read the quick way as it is."""
    if _read_quick(message):
        return _QuickItems(message._headers)  # type: ignore[attr-defined]
    normalized: list[tuple[str, str]] = _URLLIB3_NORMALIZE(message)
    return normalized


def _header_dict(items: list[tuple[str, str]]) -> HTTPHeaderDict:
    """``HTTPHeaderDict(items)``: for a block read the quick way, filled as its ``add`` fills
    it (each name under its lower case, a repeated name's values after the first), without
    the generic ``extend``'s type checks."""
    if type(items) is not _QuickItems:
        return HTTPHeaderDict(items)
    headers = HTTPHeaderDict()
    container = headers._container
    for name, value in items:
        new = [name, value]
        found = container.setdefault(name.lower(), new)
        if found is not new:
            found.append(value)
    return headers


def _quick_getresponse_of(
    getresponse: Callable[..., Any],
) -> Callable[[urllib3.connection.HTTPConnection], Any] | None:
    """urllib3's ``getresponse`` run with the three pieces above in place of its own: every
    other step (the response options, the socket's timeout, http.client's ``getresponse``, the
    HTTPResponse and its arguments) is urllib3's code, with urllib3.connection's other names
    as they were at import. None for a ``getresponse`` not built the way this expects
    (urllib3 2.x's)."""
    code = getresponse.__code__
    names = {"assert_header_parsing", "_normalize_header_values", "HTTPHeaderDict"}
    if code.co_freevars != ("__class__",) or not names <= set(code.co_names):
        return None
    if None in (_URLLIB3_ASSERT_HEADER_PARSING, _URLLIB3_NORMALIZE, _URLLIB3_HEADER_DICT):
        return None
    globals_ = {
        **vars(urllib3.connection),
        "assert_header_parsing": _assert_header_parsing,
        "_normalize_header_values": _normalize_header_values,
        "HTTPHeaderDict": _header_dict,
    }
    return types.FunctionType(
        code, globals_, "getresponse", getresponse.__defaults__, getresponse.__closure__
    )


# (a connection uses it while its class's ``getresponse`` is URLLIB3_GETRESPONSE and
# ``quick_getresponse_in_effect()``: see ``connections._Tracked``)
QUICK_GETRESPONSE = _quick_getresponse_of(URLLIB3_GETRESPONSE)


def quick_getresponse_in_effect() -> bool:
    """Whether the three names the quick ``getresponse`` stands in for are still urllib3's own
    (a caller may patch ``urllib3.connection.assert_header_parsing`` to quiet its warnings:
    then urllib3's ``getresponse`` runs, with the patch). Its other names are read as they
    were at import."""
    return (
        QUICK_GETRESPONSE is not None
        and _URLLIB3_CONNECTION_NAMES.get("assert_header_parsing") is _URLLIB3_ASSERT_HEADER_PARSING
        and _URLLIB3_CONNECTION_NAMES.get("_normalize_header_values") is _URLLIB3_NORMALIZE
        and _URLLIB3_CONNECTION_NAMES.get("HTTPHeaderDict") is _URLLIB3_HEADER_DICT
    )


def header_value(headers: Mapping[str, str], name: str) -> str | None:
    """``headers.get(name)``, read straight from urllib3's HTTPHeaderDict when it is one (its
    values joined as its own look-up joins them), not through its generic Mapping methods."""
    if type(headers) is HTTPHeaderDict:
        found = headers._container.get(name.lower())
        return None if found is None else ", ".join(found[1:])
    return headers.get(name)
