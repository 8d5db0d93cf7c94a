"""An item's pages as routes: the HTTP job asks for the route of an item's first page, and
each page's route asks for the next (``http.paginate`` reads the pagination styles).

Each page is a route of its own (its own retries, the item's budget); its ``then`` gathers the
item's data with the page and names the next page, or says why there is none to follow.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Any
from urllib.parse import urlsplit

import requests

from ..core.redact import Secrets
from ..core.result import Result
from ..core.task import Route, Task
from ..core.verdict import Verdict, terminal
from ..http.guard import Guard, PrivateAddress
from ..http.httpfacts import facts_of
from ..http.paginate import (
    HELD_SHARE,
    Continued,
    Page,
    Paging,
    PagingError,
    first_page,
    gathered,
    held_size,
    next_page,
    pages_held_over,
    pages_over,
    records_of,
    same_origin,
    with_userinfo,
)
from ..http.spec import RequestSpec

# The route of one request of an item: its RequestSpec, the URL it goes to, its own secrets.
RouteTo = Callable[[RequestSpec, str, frozenset[str]], Route]


@dataclass(frozen=True)
class Pager:
    """Makes a Task paged and names each next page; holds nothing of a run but its settings
    (the routes it makes carry the job's ``route_to``, so no cycle ties the job to it)."""

    paging: Paging
    max_bytes: int
    secrets: Secrets
    guard: Guard | None

    def paged(
        self,
        task: Task,
        spec: RequestSpec,
        *,
        own: frozenset[str],
        continued: Continued | None,
        route_to: RouteTo,
    ) -> Task:
        """The Task with the item's own route made its first page (or, resumed, the page it
        goes on from), and each fallback URL's route the first page of that URL."""
        paging = self.paging
        # the page parameters go in the URL: so do the item's own
        params, spec = spec.params, spec.model_copy(update={"params": None})
        specs = [
            spec.model_copy(update={"url": _with_params(url, params) if params else url})
            for url in (spec.url, *(spec.fallbacks or ()))
        ]
        start = first_page(paging, specs[0].url) if continued is None else continued.page
        routes = [self._page_route(specs[0], own, start, route_to)]
        routes += [
            self._page_route(each, own, first_page(paging, each.url), route_to)
            for each in specs[1:]
        ]
        return replace(
            task,
            route=routes[0],
            fallbacks=(*routes[1:], *task.fallbacks[len(specs) - 1 :]),
            steps=start.number - 1,
            data=start.data,
        )

    def _page_route(
        self, spec: RequestSpec, own: frozenset[str], page: Page, route_to: RouteTo
    ) -> Route:
        route = route_to(spec, page.url, own)
        attempt = route.attempt
        if page.number > 1:
            named = f"page {page.number} ({self.secrets.text(page.url, own)})"
            attempt = partial(_on_page, named, attempt)
        return replace(
            route,
            attempt=attempt,
            then=partial(self._then, spec, own, page, route_to),
            continuation=page.continuation(),
        )

    def _then(
        self,
        spec: RequestSpec,
        own: frozenset[str],
        page: Page,
        route_to: RouteTo,
        verdict: Verdict,
    ) -> tuple[Any, Route | Verdict | None]:
        """A page route's ``then``: the item's data with the page, and the next page's route."""
        data, following = self.after(spec, own, page, verdict)
        if isinstance(following, Page):
            return data, self._page_route(spec, own, following, route_to)
        return data, following

    def after(
        self, spec: RequestSpec, own: frozenset[str], page: Page, verdict: Verdict
    ) -> tuple[Any, Page | Verdict | None]:
        """The item's data with this page, and the next page (None: done; a Verdict: the
        next page cannot be fetched)."""
        paging = self.paging
        size = page.size + verdict.size
        if size > self.max_bytes:  # (the pages so far are kept, memory bounded)
            return page.data, terminal("invalid_body", pages_over(page.number, size))
        held = page.held + held_size(records_of(paging, verdict.data))
        if held > HELD_SHARE * self.max_bytes:  # (decoded, tiny records weigh more)
            return page.data, terminal("invalid_body", pages_held_over(page.number, held))
        try:
            data = gathered(paging, page.data, verdict.data, first=page.number == 1)
            following = next_page(
                paging,
                first_url=spec.url,
                url=page.url,
                number=page.number,
                position=page.position,
                body=verdict.data,
                link=facts_of(verdict).link,
            )
        except PagingError as exc:  # (a later run would meet it again: nothing to go on from)
            return page.data, terminal("invalid_body", f"after page {page.number}: {exc}")
        if following is None:
            return data, None
        url, position = following
        url, seen = with_userinfo(url, spec.url), page.seen | {page.url}
        upcoming = Page(url, page.number + 1, position, data, seen, size, held)
        problem = self._page_problem(spec.url, url, seen)
        if problem is None:
            return data, upcoming
        shown = f"page {upcoming.number} ({self.secrets.text(url, own)}): {problem}"
        return data, terminal("invalid_body", shown)

    def _page_problem(self, first_url: str, url: str, seen: frozenset[str]) -> str | None:
        """Why a response's next page is not fetched (the item's secrets stay with its origin)."""
        if url in seen:
            return "fetched already: the pages go round in a loop"
        if not same_origin(url, first_url):
            return "the next page is on another origin; not followed"
        if self.guard is not None:
            try:
                self.guard.check(urlsplit(url).hostname or "")
            except PrivateAddress as exc:
                return str(exc)
        return None


def _on_page(
    named: str,
    attempt: Callable[[float | None, Result | None], Verdict],
    wall_end: float | None,
    so_far: Result | None,
) -> Verdict:
    """An attempt at a later page, its failure naming the page."""
    verdict = attempt(wall_end, so_far)
    return verdict if verdict.error is None else replace(verdict, error=f"{named}: {verdict.error}")


def _with_params(url: str, params: Mapping[str, Any]) -> str:
    """The URL requests would send for ``url`` and ``params``."""
    prepared = requests.PreparedRequest()
    prepared.prepare_url(url, params)
    return str(prepared.url)
