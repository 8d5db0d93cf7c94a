"""Pagination: which page follows which, when an item has no more, and what its data becomes.

Pure decisions over one page at a time (its URL, number, body and Link header); the HTTP job
sends the pages and the engine runs each as an attempt of its own.
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from itertools import chain
from random import Random
from typing import Any, Literal
from urllib.parse import parse_qsl, quote_plus, unquote_plus, urljoin, urlsplit, urlunsplit

import jmespath
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult
from urllib3.exceptions import LocationParseError
from urllib3.util import parse_url

from .origins import origin_of

Style = Literal["link", "json", "page", "offset"]

STYLES = "link, json:PATH, page:PARAM or offset:PARAM,STEP"


class PagingError(ValueError):
    """A page that does not say what comes next in a way that can be followed: its records
    cannot be found, or its next page is not a URL or cursor."""


@dataclass(frozen=True, slots=True)
class Paging:
    """How an item's pages follow each other (see ``paging``)."""

    style: Style
    # json: where the next URL or cursor is; page/offset: the query parameter counted.
    path: ParsedResult | None = None
    param: str = ""
    step: int = 1
    # Where a page's records are (a JMESPath): the item's data is then one flat list of them.
    records: ParsedResult | None = None
    max_pages: int | None = None


def _compiled(expression: str, what: str) -> ParsedResult:
    try:
        return jmespath.compile(expression)
    except JMESPathError as exc:
        raise ValueError(f"{what}: not a JMESPath expression: {str(exc).splitlines()[0]}") from None


def paging(how: str, *, cursor_param: str, records: str | None, max_pages: int | None) -> Paging:
    """The Paging a ``--paginate`` value names: ``link`` (the Link header's rel="next"),
    ``json:PATH`` (the next URL, or a cursor sent as ``cursor_param``, at PATH in the body),
    ``page:PARAM`` (1, 2, … until an empty page), ``offset:PARAM,STEP`` (0, STEP, 2·STEP, …
    until an empty page). ValueError when it names none of them."""
    style, _, argument = how.partition(":")
    found = _compiled(records, "page_items (--items)") if records is not None else None
    param, _, step = argument.partition(",")
    shape = None
    if style == "link" and not argument:
        shape = Paging("link")
    elif style == "json" and argument:
        shape = Paging("json", _compiled(argument, "json"), cursor_param)
    elif style == "page" and argument and "," not in argument:
        shape = Paging("page", param=argument)
    elif style == "offset" and param and step.isdigit() and int(step) > 0:
        shape = Paging("offset", param=param, step=int(step))
    if shape is None:
        raise ValueError(f"paginate must be {STYLES}, got {how!r}")
    return replace(shape, records=found, max_pages=max_pages)


def records_of(paging: Paging, body: Any) -> Any:
    """What a page contributes: its records when a path says where they are, else its body."""
    return body if paging.records is None else paging.records.search(body)


def is_empty(records: Any) -> bool:
    return records is None or (isinstance(records, list | dict | str) and not records)


def gathered(paging: Paging, so_far: list[Any], body: Any, *, first: bool) -> list[Any]:
    """The item's data with one more page: the pages' bodies, or one flat list of records.
    PagingError when the first page has nothing where the records are said to be (a wrong
    path would otherwise look like an empty collection)."""
    if paging.records is None:
        return [*so_far, body]
    found = paging.records.search(body)
    if found is None and first:
        raise PagingError(f"the first page has nothing at {paging.records.expression}")
    if found is None:
        return so_far
    return [*so_far, *found] if isinstance(found, list) else [*so_far, found]


def first_position(paging: Paging, url: str) -> int:
    """The page or offset the item's own URL stands at: its parameter, else page 1 or offset 0."""
    if paging.style not in ("page", "offset"):
        return 0
    given = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True)).get(paging.param)
    if given is not None and re.fullmatch(r"-?[0-9]{1,18}", given):
        return int(given)
    return 1 if paging.style == "page" else 0


def first_page(paging: Paging, url: str) -> Page:
    return Page(url, 1, first_position(paging, url), [])


def next_page(
    paging: Paging,
    *,
    first_url: str,
    url: str,
    number: int,
    position: int,
    body: Any,
    link: str | None,
) -> tuple[str, int] | None:
    """The URL of the page after page ``number`` (at ``url``, standing at ``position``) and
    its position; None when that page was the last.

    A page is the last when ``max_pages`` is reached, when nothing names a next one (link,
    json) or when it had no records (page, offset). PagingError when page or offset numbering
    meets an object without ``records`` to look in, or json:PATH finds no URL or cursor.
    """
    if paging.max_pages is not None and number >= paging.max_pages:
        return None
    found: str | None
    if paging.style == "link":
        found = _next_link(link, url)
    elif paging.style == "json":
        found = _next_from_body(paging, body, first_url=first_url, url=url)
    else:
        if paging.records is None and isinstance(body, Mapping):
            # (an object wrapping an empty list is not empty: the records' place must be known)
            raise PagingError(
                "a page is an object: say where its records are (page_items / --items)"
            )
        if is_empty(records_of(paging, body)):
            return None
        position += paging.step
        found = with_param(first_url, paging.param, str(position))
    return None if found is None else (found, position)


# One link of a Link header (RFC 8288): <target>, then name=value parameters (token or quoted).
_LINK = re.compile(
    r'\s*<([^>]*)>((?:\s*;\s*[^\s;,=]+\s*(?:=\s*(?:"(?:[^"\\]|\\.)*"|[^\s;,"]*))?)*)\s*'
)
_PARAM = re.compile(r'\s*;\s*([^\s;,=]+)\s*(?:=\s*("(?:[^"\\]|\\.)*"|[^\s;,"]*))?')


def links(header: str) -> Iterator[tuple[str, dict[str, str]]]:
    """The (target, parameters) of each link in a Link header; parameter names lower-case,
    quoted values unquoted. Stops at the first link it cannot read."""
    position = 0
    while position < len(header):
        found = _LINK.match(header, position)
        if found is None:
            return
        parameters: dict[str, str] = {}
        for name, given in _PARAM.findall(found[2]):
            value = re.sub(r"\\(.)", r"\1", given[1:-1]) if given.startswith('"') else given
            parameters.setdefault(name.lower(), value)
        yield found[1], parameters
        position = found.end()
        if position < len(header) and header[position] != ",":
            return
        position += 1


def _next_link(link: str | None, url: str) -> str | None:
    for target, parameters in links(link or ""):
        if "next" in parameters.get("rel", "").lower().split():
            return urljoin(url, target)
    return None


def _next_from_body(paging: Paging, body: Any, *, first_url: str, url: str) -> str | None:
    """An http(s) URL, a path or a query is followed; a string or number is a cursor; null,
    an empty string or nothing at all ends the item."""
    assert paging.path is not None
    found = paging.path.search(body) if isinstance(body, Mapping | list) else None
    if found is None or found == "":
        return None
    if isinstance(found, bool | dict | list):
        raise PagingError(f"the next page at json:{paging.path.expression} is not a URL or cursor")
    text = str(found)
    if text.lower().startswith(("http://", "https://")) or text.startswith(("/", "?")):
        return urljoin(url, text)
    return with_param(first_url, paging.param, text)


def same_origin(url: str, other: str) -> bool:
    """Whether two URLs go to the same scheme, host and port (see ``_origin``)."""
    mine = _origin(url)
    return mine is not None and mine == _origin(other)


def _origin(url: str) -> str | None:
    """The URL's origin as the standard library reads it and as urllib3 (which sends it) does;
    None where the two differ (a backslash before an @, say) or there is none."""
    try:
        sent = parse_url(url)
    except LocationParseError:
        return None
    read = origin_of(url)
    return read if read == origin_of(f"{sent.scheme}://{sent.netloc}") else None


def with_userinfo(url: str, first_url: str) -> str:
    """``url`` with the first URL's user and password when it names none: a next page given
    in full keeps the credentials the item's own URL carried (on the same origin only)."""
    first, parts = urlsplit(first_url), urlsplit(url)
    if "@" not in first.netloc or "@" in parts.netloc:
        return url
    userinfo = first.netloc.rpartition("@")[0]
    return urlunsplit(parts._replace(netloc=f"{userinfo}@{parts.netloc}"))


def with_param(url: str, name: str, value: str) -> str:
    """``url`` with query parameter ``name`` set to ``value`` in place of any it had; the
    rest of the query is kept as written."""
    parts = urlsplit(url)
    kept = [
        piece
        for piece in parts.query.split("&")
        if piece and unquote_plus(piece.partition("=")[0]) != name
    ]
    kept.append(f"{quote_plus(name)}={quote_plus(value)}")
    return urlunsplit(parts._replace(query="&".join(kept)))


@dataclass(frozen=True, slots=True)
class Page:
    """One page of an item: its URL, number (from 1), position (page number or offset), the
    item's data from the pages before it."""

    url: str
    number: int
    position: int
    data: list[Any]
    # The pages fetched before it in this run (a next page among them is a loop).
    seen: frozenset[str] = frozenset()
    # Bytes of the bodies of the pages before it: together they stay within max_bytes.
    size: int = 0
    # Bytes their data takes in memory (see ``held_size``): within HELD_SHARE x max_bytes.
    held: int = 0

    def continuation(self) -> dict[str, Any]:
        """Where the item goes on from this page (JSON, for the journal)."""
        return {"url": self.url, "page": self.number, "position": self.position}


@dataclass(frozen=True, slots=True)
class Continued:
    """An item that a resumed run takes up at a later page, with the data of those before."""

    item: object
    page: Page

    @classmethod
    def of(cls, item: object, continuation: Mapping[str, Any], data: Any) -> Continued:
        kept = list(data) if isinstance(data, list) else []
        page = Page(
            str(continuation["url"]),
            int(continuation["page"]),
            int(continuation["position"]),
            kept,
            # (about the bytes those pages took, as JSON: they go on counting towards the bound)
            size=len(json.dumps(kept, ensure_ascii=False, default=str).encode()),
            held=held_size(kept),
        )
        return cls(item, page)


# What an item's pages may take in memory, decoded, as a multiple of max_bytes. Text-heavy
# JSON takes about its own size decoded, so max_bytes of bodies binds first; tiny records
# ({"n": 1}) take 10 to 25 times theirs, and would make max_bytes of pages a multiple of
# it in memory. With the page in flight (its body, text and value, for pages well under
# max_bytes) an item's peak stays within 3 x max_bytes.
HELD_SHARE = 2
# Values CPython shares rather than makes anew (True and False too, as 1 and 0) cost nothing.
_SHARED = frozenset(range(-5, 257))
_SHARED_SIZE = sys.getsizeof(256)
_CONTAINERS = frozenset({dict, list})
# What the garbage collector adds to each container (sys.getsizeof less __sizeof__).
_TRACKED = sys.getsizeof([]) - [].__sizeof__()


def held_size(value: Any) -> int:
    """About the bytes a decoded JSON value holds in CPython: every container, string and
    number it is made of (a key once, as ``json.loads`` shares keys; None, True, False and
    small ints not at all). Read a level at a time by C loops, the containers counted
    exactly and a long level's strings and numbers from an even sample of them: a page of
    records costs a fraction of its decoding."""
    total = 0
    keys: set[Any] = set()
    level: list[Any] = [value]
    while level:
        kinds = set(map(type, level))
        if not _CONTAINERS & kinds:
            return total + _scalars_size(level)
        dicts, lists = _of_type(level, kinds, dict), _of_type(level, kinds, list)
        if not kinds <= _CONTAINERS:
            total += _scalars_size([item for item in level if type(item) not in _CONTAINERS])
        total += sum(map(dict.__sizeof__, dicts)) + sum(map(list.__sizeof__, lists))
        total += (len(dicts) + len(lists)) * _TRACKED
        fresh = set(chain.from_iterable(dicts)) - keys
        keys |= fresh
        total += sum(map(sys.getsizeof, fresh))
        level = [*chain.from_iterable(map(dict.values, dicts)), *chain.from_iterable(lists)]
    return total


def _of_type(level: list[Any], kinds: set[type], kind: type) -> list[Any]:
    """The items of ``level`` of type ``kind`` (the whole level when all are)."""
    return level if kinds == {kind} else [item for item in level if type(item) is kind]


# Strings and numbers measured one by one at most; past that, an even sample of this many.
_SAMPLE = 1024


def _scalars_size(values: list[Any]) -> int:
    """What strings and numbers take, less the shared ones (see _SHARED)."""
    # (at random, seeded by the count: an even stride could keep in step with the records)
    sample = values if len(values) <= _SAMPLE else Random(len(values)).sample(values, _SAMPLE)
    shared = sum(map(_SHARED.__contains__, sample)) * _SHARED_SIZE
    size = sum(map(sys.getsizeof, sample)) - shared - sample.count(None) * sys.getsizeof(None)
    return size * len(values) // len(sample)


def pages_held_over(number: int, held: int) -> str:
    """Why an item's pages stop: decoded, they would take more than HELD_SHARE x max_bytes."""
    return (
        f"page {number} makes the pages take about {held} bytes in memory, over "
        f"{HELD_SHARE} x max_bytes: kept the pages before it (raise max_bytes, or set "
        "max_pages, for a larger collection)"
    )


def pages_over(number: int, size: int) -> str:
    """Why an item's pages stop: together they passed max_bytes, as one body may not."""
    return (
        f"page {number} makes the pages {size} bytes, over max_bytes: kept the pages before it "
        "(raise max_bytes, or set max_pages, for a larger collection)"
    )
