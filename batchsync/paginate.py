"""Pagination: which page follows which, when an item has no more, and what its data becomes.

Pure decisions over one page at a time (its URL, number, body and Link header); the HTTP job
sends the pages and the engine runs each as an attempt of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import parse_qsl, quote_plus, unquote_plus, urljoin, urlsplit, urlunsplit

import jmespath
from jmespath.exceptions import JMESPathError
from jmespath.parser import ParsedResult
from requests.utils import parse_header_links

Style = Literal["link", "json", "page", "offset"]

STYLES = "link, json:PATH, page:PARAM or offset:PARAM,STEP"


class NoRecords(ValueError):
    """A page whose records cannot be told apart from the rest of its body."""


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
    found = _compiled(records, "records") if records is not None else None
    if style == "link" and not argument:
        return Paging("link", records=found, max_pages=max_pages)
    if style == "json" and argument:
        path = _compiled(argument, "json")
        return Paging("json", path, cursor_param, records=found, max_pages=max_pages)
    if style == "page" and argument and "," not in argument:
        return Paging("page", param=argument, records=found, max_pages=max_pages)
    if style == "offset":
        param, _, step = argument.partition(",")
        if param and step.isdigit() and int(step) > 0:
            return Paging("offset", param=param, step=int(step), records=found, max_pages=max_pages)
    raise ValueError(f"paginate must be {STYLES}, got {how!r}")


def records_of(paging: Paging, body: Any) -> Any:
    """What a page contributes: its records when a path says where they are, else its body."""
    return body if paging.records is None else paging.records.search(body)


def is_empty(records: Any) -> bool:
    return records is None or (isinstance(records, list | dict | str) and not records)


def gathered(paging: Paging, so_far: list[Any], body: Any) -> list[Any]:
    """The item's data with one more page: the pages' bodies, or one flat list of records."""
    if paging.records is None:
        return [*so_far, body]
    found = paging.records.search(body)
    if found is None:
        return so_far
    return [*so_far, *found] if isinstance(found, list) else [*so_far, found]


def first_position(paging: Paging, url: str) -> int:
    """The page number or offset the item's own URL stands at (its parameter, else the
    first: page 1, offset 0)."""
    if paging.style not in ("page", "offset"):
        return 0
    given = dict(parse_qsl(urlsplit(url).query, keep_blank_values=True)).get(paging.param)
    if given is not None and given.lstrip("-").isdigit():
        return int(given)
    return 1 if paging.style == "page" else 0


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
    json), when it had no records (page, offset), or when the next would be the same URL.
    NoRecords when page or offset numbering meets an object without ``records`` to look in.
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
            raise NoRecords("a page is an object: say where its records are (page_items / --items)")
        if is_empty(records_of(paging, body)):
            return None
        position += paging.step
        found = with_param(first_url, paging.param, str(position))
    if found is None or found == url:
        return None
    return found, position


def _next_link(link: str | None, url: str) -> str | None:
    if not link:
        return None
    for entry in parse_header_links(link):
        if "next" in entry.get("rel", "").lower().split() and entry.get("url"):
            return urljoin(url, entry["url"])
    return None


def _next_from_body(paging: Paging, body: Any, *, first_url: str, url: str) -> str | None:
    """An http(s) URL or a path is followed; any other value is a cursor."""
    assert paging.path is not None
    found = paging.path.search(body) if isinstance(body, Mapping | list) else None
    if found is None or found == "" or isinstance(found, bool | dict | list):
        return None
    text = str(found)
    if text.startswith(("http://", "https://", "/")):
        return urljoin(url, text)
    return with_param(first_url, paging.param, text)


def with_param(url: str, name: str, value: str) -> str:
    """``url`` with query parameter ``name`` set to ``value`` in place of any it had; the
    rest of the query is kept as written."""
    parts = urlsplit(url)
    kept = [piece for piece in parts.query.split("&")
            if piece and unquote_plus(piece.partition("=")[0]) != name]  # fmt: skip
    kept.append(f"{quote_plus(name)}={quote_plus(value)}")
    return urlunsplit(parts._replace(query="&".join(kept)))


@dataclass(frozen=True, slots=True)
class Page:
    """One page of an item: its URL, number (from 1), position (page number or offset) and
    the item's data from the pages before it."""

    url: str
    number: int
    position: int
    data: list[Any]

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
        page = Page(
            str(continuation["url"]), int(continuation["page"]), int(continuation["position"]),
            list(data) if isinstance(data, list) else [],
        )  # fmt: skip
        return cls(item, page)
