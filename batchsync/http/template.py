"""Requests from a table: a URL template (and maybe a JSON body template) filled from each row.

One module for the command line and the library, pure functions: ``Template.parse`` checks a
template once, up front (``ValueError``: nothing is sent), and ``Template.expand`` turns one
row (any mapping) into one request item ``{url, method, json?, id?}`` that then takes the
usual path — validation, secrets, journal, failed file. A row the template cannot fill is a
``RowError`` that names the field, never a value: rows may hold secrets.

Rules:

* ``{field}`` takes the row's value; ``{{`` and ``}}`` are literal braces.
* In the URL, placeholders may stand in the path, query and fragment only: the scheme, host and
  port are literal, so a row's values cannot send a request (and the ``-H`` headers) to another
  host. Every value is percent-encoded in full (UTF-8; only letters, digits and ``-._~`` stay as
  they are), so it stays one path segment or one query value: ``a/b`` becomes ``a%2Fb``.
* In the body template (JSON), a string that is exactly ``"{field}"`` takes the row's value with
  its JSON type; ``{field}`` inside a longer string is put in as text. Keys are literal.
* A value is text as JSON would write it (``true``, ``12``, ``1.5``); a missing key, ``None``,
  or NaN (a pandas gap) is no value.
* The id: the ``id_field`` value; without ``id_field``, the row's ``id`` when it has one.
* ``row_as_body`` (the OpenAI cookbook's input: a file of request bodies): the body is the row
  itself, less its ``metadata`` field (dropped always, as the cookbook drops it), sent as the
  row gives it (a row that strict JSON cannot write fails alone). The URL names no field: one
  URL for every row, no value of theirs in it. The id: the ``metadata`` value when the row has
  one (any JSON value); with ``id_field``, that field's value, which stays in the body.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit

from .spec import METHODS, check_url, json_writable

# The field a row sent as the body keeps apart from it: the cookbook's, its id by default.
METADATA = "metadata"
# The deepest a body template may nest, on every Python (where the interpreter's recursion
# limit fell moved with 3.12, whose comprehensions add no frame).
MAX_BODY_DEPTH = 256


class RowError(ValueError):
    """A row the template cannot fill; the message names the field, never a value."""


@dataclass(frozen=True, slots=True)
class _Field:
    name: str


_Text = tuple[str | _Field, ...]  # literal pieces and fields, in order
# A body template compiled: a whole field (its value with its JSON type), text with fields in
# it (a _Text, the only tuple among nodes), a list or dict of nodes, or another JSON value as is.
_Node = Any


_BRACES = re.compile(r"\{\{|\}\}|\{([^{}]*)\}|[{}]")
# What comes before the first placeholder: a scheme, then the whole authority.
_ORIGIN = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*[/?#]")


def parse_text(text: str, what: str) -> _Text:
    """A template string as literal pieces and fields; ValueError for a lone brace or ``{}``."""
    pieces: list[str | _Field] = []
    literal = ""
    position = 0
    for match in _BRACES.finditer(text):
        literal += text[position : match.start()]
        position = match.end()
        token = match[0]
        if token in ("{{", "}}"):
            literal += token[0]
        elif token in ("{", "}"):
            raise ValueError(
                f"{what}: unbalanced {token!r} at character {match.start() + 1} "
                f"(write {token * 2} for a literal {token})"
            )
        elif not match[1]:
            raise ValueError(f"{what}: {{}} at character {match.start() + 1} names no field")
        else:
            pieces += [literal, _Field(match[1])] if literal else [_Field(match[1])]
            literal = ""
    literal += text[position:]
    return tuple([*pieces, literal] if literal else pieces)


def _fields_of(pieces: _Text) -> list[str]:
    return [piece.name for piece in pieces if isinstance(piece, _Field)]


def _compile_text(value: str, fields: list[str]) -> _Node:
    """A body string: a whole field keeps its value's JSON type, fields within text are text."""
    pieces = parse_text(value, "the body template")
    fields += _fields_of(pieces)
    if len(pieces) == 1 and isinstance(pieces[0], _Field):
        return pieces[0]
    if any(isinstance(piece, _Field) for piece in pieces):
        return pieces
    return "".join(piece for piece in pieces if isinstance(piece, str))


def _compile_body(value: Any, fields: list[str], depth: int = 0) -> _Node:
    if depth > MAX_BODY_DEPTH:
        raise ValueError("the body template is nested too deeply")
    if isinstance(value, str):
        return _compile_text(value, fields)
    if isinstance(value, Mapping):
        return {str(k): _compile_body(v, fields, depth + 1) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_compile_body(v, fields, depth + 1) for v in value]
    if not json_writable(value):
        raise ValueError("the body template: it must be JSON (no NaN, infinity or other object)")
    return value


def parse_body(text: str) -> Any:
    """The body template given as JSON text (``--body-template``); ValueError when it is not."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("the body template is nested too deeply") from None
    except ValueError as exc:
        message = exc.msg if isinstance(exc, json.JSONDecodeError) else "not valid JSON"
        column = f" at character {exc.pos + 1}" if isinstance(exc, json.JSONDecodeError) else ""
        raise ValueError(f"the body template is not JSON: {message}{column}") from None


def _missing(value: Any) -> bool:
    """No value: None, or anything not equal to itself (NaN, pandas' NaT and NA)."""
    if value is None:
        return True
    try:
        return bool(value != value)  # noqa: PLR0124 (NaN is the value unequal to itself)
    except Exception:  # pandas.NA: its truth is ambiguous
        return True


def _value(row: Mapping[str, Any], name: str) -> Any:
    value = row.get(name)
    if _missing(value):
        raise RowError(f"no value for {{{name}}}")
    return value


def _as_text(row: Mapping[str, Any], name: str) -> str:
    value = _value(row, name)
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, Mapping | list | tuple | set | bytes | bytearray):
        raise RowError(f"{{{name}}} is a {type(value).__name__}, not a value to put in text")
    return str(value)


def _encoded(row: Mapping[str, Any], name: str) -> str:
    """A value percent-encoded in full: one path segment, one query value, whatever it holds."""
    try:
        return quote(_as_text(row, name), safe="")
    except UnicodeEncodeError:  # a lone surrogate (JSON's "\ud800")
        raise RowError(f"{{{name}}} is not UTF-8 text") from None


def _fill(pieces: _Text, row: Mapping[str, Any], encode: bool) -> str:
    value = _encoded if encode else _as_text
    return "".join(piece if isinstance(piece, str) else value(row, piece.name) for piece in pieces)


def _path_fields(pieces: _Text) -> list[str]:
    """The fields that stand in the URL's path (before its query or fragment)."""
    names = []
    for piece in pieces:
        if isinstance(piece, str) and ("?" in piece or "#" in piece):
            break
        if isinstance(piece, _Field):
            names.append(piece.name)
    return names


def _dot_segments(url: str) -> int:
    """How many path segments are '.' or '..' (clients resolve them: the path would move)."""
    return sum(segment in (".", "..") for segment in urlsplit(url).path.split("/"))


def _build(node: _Node, row: Mapping[str, Any]) -> Any:
    if isinstance(node, _Field):
        value = _value(row, node.name)
        if not json_writable(value):
            raise RowError(f"{{{node.name}}} has no JSON form ({type(value).__name__})")
        return value
    if isinstance(node, tuple):
        return _fill(node, row, encode=False)
    if isinstance(node, list):
        return [_build(item, row) for item in node]
    if isinstance(node, dict):
        return {key: _build(item, row) for key, item in node.items()}
    return node


def _row_body(row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as a request body: all of it but ``metadata``, in its order."""
    body = {key: value for key, value in row.items() if key != METADATA}
    if not json_writable(body):
        raise RowError("the row has no JSON form (a NaN, an infinity or another object)")
    return body


def _checked_url(pieces: _Text) -> str:
    """The URL template with each field filled by a placeholder, once it is known to be an
    http(s) URL whose scheme, host and port are written out (fields in path and query only)."""
    # (the text before the first field: its first piece, as literal pieces come joined)
    head = pieces[0] if pieces and isinstance(pieces[0], str) else ""
    filled = "".join(p if isinstance(p, str) else "x" for p in pieces)
    origin_written = not _fields_of(pieces) or _ORIGIN.match(head) is not None
    if not origin_written and "://" in head:
        raise ValueError(
            "the URL template: fields may stand in the path and query only; the scheme, "
            "host and port must be written out"
        )
    try:
        check_url(filled)
    except ValueError as exc:
        raise ValueError(f"the URL template is not an http(s) URL: {exc}") from None
    if not origin_written:
        raise ValueError("the URL template is not an http(s) URL: it starts with a field")
    return filled


@dataclass(frozen=True)
class Template:
    """A checked request template; ``expand(row)`` makes one request item per row."""

    url: str
    method: str
    body: Any
    id_field: str | None
    fields: tuple[str, ...]  # every field the URL and body name, in order, once each
    _url: _Text
    _body: _Node | None
    _dots: int  # '.' and '..' segments the template's own path has
    row_as_body: bool = False  # the row itself is the body (see the module's rules)

    @classmethod
    def parse(
        cls,
        url: str,
        method: str = "GET",
        body: Any = None,
        id_field: str | None = None,
        *,
        row_as_body: bool = False,
    ) -> Template:
        """Check the template once; ValueError naming what is wrong (nothing is sent)."""
        pieces = parse_text(url, "the URL template")
        filled = _checked_url(pieces)
        if method.upper() not in METHODS:
            raise ValueError(f"method must be one of {', '.join(sorted(METHODS))}")
        if id_field is not None and not id_field:
            raise ValueError("id_field: give a field name")
        names = _fields_of(pieces)
        if row_as_body and body is not None:
            raise ValueError("with the row as the body, give no body template: the row is the body")
        if row_as_body and names:
            raise ValueError(
                "with the row as the body, every row goes to the one URL given: the URL template "
                f"cannot name a field ({{{names[0]}}}; {{{{ and }}}} are literal braces)"
            )
        try:
            node = None if body is None else _compile_body(body, names)
        except RecursionError:
            raise ValueError("the body template is nested too deeply") from None
        fields = tuple(dict.fromkeys(names))
        dots = _dot_segments(filled)
        return cls(url, method.upper(), body, id_field, fields, pieces, node, dots, row_as_body)

    def expand(self, row: object) -> dict[str, Any]:
        """The request item for ``row``; RowError (naming a field, never a value) when the row
        lacks a value the template needs."""
        if not isinstance(row, Mapping):
            raise RowError(f"a row must be a mapping of fields, not {type(row).__name__}")
        url = _fill(self._url, row, encode=True)
        if _dot_segments(url) > self._dots:
            dotted = [name for name in _path_fields(self._url) if set(_as_text(row, name)) <= {"."}]
            raise RowError(
                f"{', '.join(f'{{{name}}}' for name in dotted)} would make a '.' or '..' path "
                "segment, which changes the path"
            )
        item: dict[str, Any] = {"url": url}
        if self.method != "GET":
            item["method"] = self.method
        if self.row_as_body:
            item["json"] = _row_body(row)
        elif self._body is not None:
            item["json"] = _build(self._body, row)
        item.update(self._id_of(row))
        return item

    def _id_of(self, row: Mapping[str, Any]) -> dict[str, Any]:
        """The item's ``id``: the id field's value, else the row's own id (none when unset)."""
        if self.id_field is not None:
            return {"id": _value(row, self.id_field)}
        default = row.get(METADATA if self.row_as_body else "id")
        return {} if _missing(default) else {"id": default}

    def identity(self) -> str:
        """A digest of the template options, for a journal: resuming with other options would
        pair stored Results with other requests."""
        options = [self.url, self.method, self.body, self.id_field]
        if self.row_as_body:  # (only then: the digests of earlier journals stay as they were)
            options.append("row as body")
        text = json.dumps(options, sort_keys=True, default=repr)
        return hashlib.sha256(text.encode()).hexdigest()
