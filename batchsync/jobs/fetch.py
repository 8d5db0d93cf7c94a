"""The HTTP job: prepare each item's requests once, then send, classify and decode per attempt."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Hashable, Mapping
from dataclasses import replace
from functools import cached_property, partial
from typing import Any
from urllib.parse import urlsplit

import requests

from ..core.redact import Secrets, item_secrets
from ..core.result import Result
from ..core.task import Route, Task
from ..core.verdict import Feedback, InvalidItem, Ruling, Verdict, retry
from ..http.answers import taken
from ..http.auth import AuthFailed, RefreshWaitTimedOut, RunAuth
from ..http.classify import (
    SHOULD_RETRY,
    classify_http_exception,
    classify_refused_answer,
    classify_status,
    host_feedback,
)
from ..http.decode import InvalidBody, decode_body
from ..http.exchange import AnswerRefused, BodyTooLarge, Outgoing, Recipe, Reply
from ..http.guard import PrivateAddress
from ..http.headers import header_value
from ..http.httpfacts import HttpFacts, facts_of
from ..http.paginate import Continued, same_origin
from ..http.quota import answer_limits, retry_after_of
from ..http.retries import judged, parse_statuses
from ..http.spec import RequestSpec, item_label, parse_item
from ..http.transport import Transport
from ..limits.gates import Gates
from ..limits.spend import NOTHING, priced
from ..limits.tokenrate import item_cost, used_tokens
from ..limits.tokens import usage_parts
from .calls import fallback_routes
from .options import FetchOptions
from .pages import Pager

# Responses that carry no body to decode, whatever ``expect`` says.
_NO_BODY_STATUSES = frozenset({204, 205, 304})
_DEDUP_METHODS = frozenset({"GET", "HEAD"})
_LOST = Verdict("terminal", "cancelled", "lost the race to a hedged request")
_NO_TIME_TO_RESEND = "HTTP 401; the attempt's time ran out before the resend with the new token"

log = logging.getLogger("batchsync")


class HttpJob:
    """Turns items into HTTP Tasks for the engine. ``close()`` when the run is over."""

    def __init__(
        self,
        options: FetchOptions,
        transport: Transport,
        gates: Gates | None = None,
        unix_time: Callable[[], float] = time.time,
        secrets: Secrets | None = None,
    ) -> None:
        """Gets auth='s first token now: AuthFailed when it cannot be got (nothing sent)."""
        self._options = options
        self.timeout = options.timeout  # (an attribute, not a property: read twice an attempt)
        self._transport = transport
        self._guard = transport.guard
        self._secrets = options.secrets() if secrets is None else secrets
        self._pager, self._reads_link = None, False
        if (paging := options.paging()) is not None:  # (only the link style reads Link)
            self._reads_link = paging.style == "link"
            self._pager = Pager(paging, options.max_bytes, self._secrets, self._guard)
        self._auth = None if options.auth is None else RunAuth(options.auth, self._secrets)
        if self._auth is not None:
            self._auth.start()
        self._lane_ok = self._auth is None or self._auth.lane
        # Plain URL items may skip the RequestSpec when nothing needs to be shown one.
        self._lean = self._lane_ok and self._pager is None and not options.items_shown
        self._usage = options.usage_reader
        self._cap = options.spend_cap
        self._by_side = self._cap is not None or options.sides_read
        self._answers = options.retry_answers
        self._unix_time = unix_time
        self._retryable = parse_statuses(options.retry_statuses)
        self._retry_if = options.retry_if
        self._hedger = options.hedger(gates)

    def close(self) -> None:
        """End the hedging threads; requests that lost a race are cut, not waited for."""
        if self._hedger is not None:
            self._transport.abort()
            self._hedger.close()

    @property
    def secrets(self) -> Secrets:
        return self._secrets

    feedback = staticmethod(host_feedback)

    def label(self, item: object) -> tuple[str | None, Any]:
        url, item_id = item_label(item.item if isinstance(item, Continued) else item)
        return (None if url is None else self._secrets.url(url)), item_id

    def prepare(self, item: object) -> Task:
        """The item's Task; InvalidItem (its message masked) when it cannot be sent."""
        try:
            if isinstance(item, str) and self._lean:
                wire = self._transport.wire("GET", item, self._lane_headers)
                if wire is not None:  # the common case, kept lean: a plain URL, fast lane
                    if self._guard is not None:
                        self._guarded(wire.origin[1])
                    dedup = item if self._options.dedup else None
                    # (its own secrets too: a server may echo its key in a status line)
                    own = self._secrets.of_url(item)
                    hedge_host = wire.host if self._hedger is not None else None
                    attempt = partial(self._attempt, wire, hedge_host, own)
                    return Task(
                        self._secrets.url(item),
                        None,
                        Route(attempt, wire.host),
                        dedup_key=dedup,
                        subject=item,
                    )
            return self._spec_task(item)
        except InvalidItem as exc:
            masked = self._secrets.text(str(exc), self._item_secrets(item))
            raise type(exc)(masked) from None

    def _spec_task(self, item: object) -> Task:
        """The Task of a RequestSpec: routes for its URL, fallback URLs and fallback functions."""
        continued = item if isinstance(item, Continued) else None
        spec = parse_item(item if continued is None else continued.item)
        urls = (spec.url, *(spec.fallbacks or ()))
        for url in urls:
            self._guarded(urlsplit(url).hostname or "")
        own = self._item_secrets(spec)
        routes = [self._url_route(spec, url, own) for url in urls]
        mask = partial(self._secrets.text, extra=own)
        routes += fallback_routes(self._options.fallbacks, spec, mask)
        cost, sides = item_cost(item, spec.json_body, self._options.cost, self._options.token_rates)
        task = Task(
            self._secrets.given(spec.url, own),
            spec.id,
            routes[0],
            tuple(routes[1:]),
            self._dedup_key(spec),
            subject=spec,
            cost=cost,
            price=None if self._cap is None else priced(spec.json_body, self._cap.prices),
            sides=sides,
        )
        if self._pager is not None:
            return self._pager.paged(
                task, spec, own=own, continued=continued, route_to=self._url_route
            )
        return task

    def _item_secrets(self, item: object) -> frozenset[str]:
        """An item's own secret values (``Secrets.of_item``) from what is given, valid or not."""
        headers: Mapping[str, Any] | None
        params: Mapping[str, Any] | None
        if isinstance(item, Continued):
            item = item.item
        if isinstance(item, RequestSpec):
            urls, headers, params = [item.url, *(item.fallbacks or ())], item.headers, item.params
        elif isinstance(item, Mapping):
            urls = [
                url
                for url in (item.get("url"), *_listed(item.get("fallbacks")))
                if isinstance(url, str)
            ]
            headers, params = _mapping(item.get("headers")), _mapping(item.get("params"))
        else:
            urls, headers, params = [item] if isinstance(item, str) else [], None, None
        return self._secrets.of_item(urls, headers, params)

    def _url_route(self, spec: RequestSpec, url: str, own: frozenset[str]) -> Route:
        request = self._outgoing(spec, url)
        host = request.host
        # Only GETs are hedged: a second copy of anything else could change something twice.
        hedged = self._hedger is not None and spec.method == "GET"
        attempt = partial(self._attempt, request, host if hedged else None, own)
        if spec.retry_safe:
            return Route(attempt, host)
        reason = f"{spec.method} is not retried without an idempotency_key"
        return Route(attempt, host, max_attempts=1, no_retry_reason=reason)

    def _dedup_key(self, spec: RequestSpec) -> Hashable | None:
        """Identical bodiless GET/HEAD requests share one flight (unless ``dedup`` is off)."""
        if (
            not self._options.dedup
            or spec.method not in _DEDUP_METHODS
            or spec.idempotency_key is not None  # each key is a request of its own
            or spec.json_body is not None
            or spec.data is not None
        ):
            return None
        if spec.method == "GET" and not (spec.params or spec.headers or spec.fallbacks):
            return spec.url  # the same key as a plain URL item's
        return _request_key(spec)

    def _outgoing(self, spec: RequestSpec, url: str) -> Outgoing:
        """The request every attempt sends: the fast form when allowed, else requests' own."""
        if (
            self._lane_ok
            and self._transport.fast
            and spec.json_body is None
            and spec.data is None
            and not spec.params
        ):
            item_headers: dict[str, str | None] = dict(spec.headers or {})
            if spec.idempotency_key is not None:
                item_headers["Idempotency-Key"] = spec.idempotency_key
            headers = (
                self._transport.headers_with(self._options.headers, item_headers)
                if item_headers
                else self._lane_headers
            )
            wire = self._transport.wire(spec.method, url, headers)
            if wire is not None:
                return wire
        return self._prepare_request(spec, url)

    def _guarded(self, host: str) -> None:
        """With deny_private, refuse (as an invalid item) a host that resolves privately."""
        guard = self._guard
        if guard is not None:
            try:
                guard.check(host)
            except PrivateAddress as exc:
                raise InvalidItem(str(exc)) from None

    @cached_property
    def _lane_headers(self) -> Mapping[str, str]:
        """The headers of a fast-lane request without headers of its own."""
        return self._transport.headers_with(self._options.headers)

    def _prepare_request(self, spec: RequestSpec, url: str) -> Recipe:
        """The request prepared by the session: headers merged, auth and cookies applied."""
        headers: dict[str, str | None] = dict(self._options.headers or {})
        headers.update(spec.headers or {})
        if spec.idempotency_key is not None:
            headers["Idempotency-Key"] = spec.idempotency_key
        request = requests.Request(
            spec.method,
            url,
            headers=headers,  # type: ignore[arg-type]  # None leaves a header out, as documented
            params=spec.params or {},
            json=spec.json_body,
            data=spec.data,
        )
        try:
            return self._transport.prepare(request)
        except (requests.RequestException, ValueError, TypeError) as exc:
            raise InvalidItem(f"cannot build the request: {exc}") from None

    def _attempt(
        self,
        request: Outgoing,
        hedge_host: str | None,
        own: frozenset[str],
        wall_end: float | None,
        so_far: Result | None,
    ) -> Verdict:
        """Each route's attempt; with auth=, carrying the run's current token."""
        assert wall_end is not None
        if self._auth is not None:
            return self._authorized(self._auth, request, hedge_host, own, wall_end)
        return self._sent(request, hedge_host, own, wall_end)

    def _sent(
        self, request: Outgoing, hedge_host: str | None, own: frozenset[str], wall_end: float
    ) -> Verdict:
        """One request sent (hedged when ``hedge_host`` is), its error masked."""
        if hedge_host is not None and self._hedger is not None:
            exchange = partial(self._exchange, request, own, wall_end)
            send = partial(self._hedger.run, exchange, hedge_host)
        else:
            send = partial(self._exchange, request, own, wall_end, None)
        if own:  # (the item's own secrets, masked in whatever is logged meanwhile)
            with item_secrets(own):
                verdict = send()
        else:  # (no context to enter: most items have no secrets of their own)
            verdict = send()
        if verdict.error is not None:
            if self._retry_if is not None:  # (asked before the error is masked: it may add to it)
                verdict = judged(verdict, self._retry_if)
            verdict = replace(verdict, error=self._secrets.text(verdict.error or "", own))
        return verdict

    def _authorized(
        self,
        auth: RunAuth,
        request: Outgoing,
        hedge_host: str | None,
        own: frozenset[str],
        wall_end: float,
    ) -> Verdict:
        """An attempt carrying the run's current token. A 401 renews the token as
        ``auth.after_401`` says and resends within the same attempt (its time bound, not one
        of the item's retries), until it gives up, the refresh fails or no time is left (a wait
        for another worker's refresh: a retryable timeout); each resend is logged at DEBUG."""
        token = auth.current
        renewals = sent = 0  # (every request sent counts in the item's attempts)
        while True:
            verdict = self._sent(auth.apply(request, token), hedge_host, own, wall_end)
            requests_now = 2 if verdict.hedged else 1
            sent += requests_now
            if sent > requests_now:
                verdict = replace(verdict, resent=sent - requests_now)
            facts = facts_of(verdict)
            if facts.status_code != 401:
                if facts.status_code is not None:
                    auth.accept(token)
                return verdict
            if facts.redirects and not same_origin(facts.final_url or "", request.url):
                return verdict  # (from another origin, which never got the token)
            step = auth.step(token, renewals)
            if step == "give_up":
                if renewals or token.generation > 0:
                    error = f"HTTP 401 (refused a fresh token; {renewals} renewals)"
                    return replace(verdict, error=error)
                return verdict
            if step == "refresh":
                try:
                    token = auth.refresh(token, wall_end - time.monotonic())
                except RefreshWaitTimedOut as exc:
                    return replace(retry("timeout", str(exc)), resent=sent - 1)
                except AuthFailed as exc:
                    error = self._secrets.text(f"HTTP 401; no new token: {exc}", own)
                    return replace(verdict, error=error)
            else:
                token = auth.current
            if time.monotonic() >= wall_end:  # (a resend that cannot go out is not counted)
                return replace(retry("timeout", _NO_TIME_TO_RESEND), resent=sent - 1)
            renewals += 1
            if log.isEnabledFor(logging.DEBUG):
                log.debug(
                    "%s: HTTP 401; resent with token %d (%d refreshes so far)",
                    self._secrets.text(request.url, own),
                    token.generation,
                    auth.refreshes,
                )

    def _exchange(
        self, request: Outgoing, own: frozenset[str], wall_end: float, lost: threading.Event | None
    ) -> Verdict:
        """Send one request and read its answer; a request that lost a race just closes."""
        try:
            try:
                reply = self._transport.send(request, wall_end)
            except AnswerRefused as refused:  # the caller's hook raised for the response
                answer = refused.response
                verdict = classify_refused_answer(
                    refused.error,
                    answer.status_code,
                    answer.headers.get("Retry-After"),
                    self._unix_time(),
                    self._retryable,
                    should_retry=answer.headers.get(SHOULD_RETRY),
                )
                landed = self._landed(answer.url, own, request)
                facts = HttpFacts(answer.status_code, landed, refused.redirects)
                return replace(verdict, facts=facts)
            except Exception as exc:  # every failure is classified, none escapes
                return classify_http_exception(exc)
            if lost is not None and lost.is_set():
                reply.close()
                return _LOST
            landed = self._landed(reply.url, own, request)
            try:
                return self._judge(request.method, reply, wall_end, landed)
            except (InvalidBody, BodyTooLarge) as exc:
                facts = HttpFacts(reply.status, landed, reply.redirects)
                again = isinstance(exc, InvalidBody) and "invalid" in self._answers
                ruling: Ruling = "retry" if again else "terminal"
                return Verdict(ruling, "invalid_body", str(exc), facts, resendable=again)
            except Exception as exc:  # a failure while reading the body keeps the status seen
                facts = HttpFacts(reply.status, landed, reply.redirects)
                return replace(classify_http_exception(exc), facts=facts)
        finally:
            self._transport.finish()

    def _landed(self, url: str | None, own: frozenset[str], request: Outgoing) -> str | None:
        """Where an answer came from, masked (see ``Secrets.answered``)."""
        return None if url is None else self._secrets.answered(url, own, request.url)

    def _judge(
        self, method: str | None, reply: Reply, wall_end: float, landed: str | None
    ) -> Verdict:
        """The Verdict on an answer, its facts (``HttpFacts``) made once."""
        status = reply.status
        quota, announced = (
            answer_limits(reply.headers, self._unix_time)
            if self._options.quota_headers
            else (None, None)
        )
        if not 200 <= status < 300:  # (the Retry-After look-up and the clock only when needed)
            retry_after = retry_after_of(reply.headers)
            failed = classify_status(
                status,
                retry_after,
                self._unix_time(),
                quota,
                self._retryable,
                should_retry=reply.headers.get(SHOULD_RETRY),
            )
            if failed is not None:
                self._transport.discard(reply, wall_end)
                facts = facts_of(failed)._replace(
                    final_url=landed,
                    redirects=reply.redirects,
                    announced=announced,
                    usage=None if self._cap is None else NOTHING,
                )
                return replace(failed, facts=facts)
        body = self._transport.read_body(reply, wall_end, self._options.max_bytes)
        if method == "HEAD" or status in _NO_BODY_STATUSES:
            data = None
        else:
            expect = self._options.expect
            content_type = header_value(reply.headers, "Content-Type")  # (for charsets too)
            data = decode_body(body, expect, content_type)
        link = reply.headers.get("Link") if self._reads_link else None
        used = None if self._usage is None else used_tokens(self._usage, data)
        usage = usage_parts(data, cached=True) if self._by_side else None
        facts = HttpFacts(status, landed, reply.redirects, quota, link, announced, used, usage)
        return taken(Verdict("success", facts=facts, data=data, size=len(body)), self._answers)


class WrappedJob:
    """A job whose items become the HTTP job's items (input entries, table rows): the
    attempts, their timeout and what they tell the limits are the HTTP job's."""

    def __init__(self, inner: HttpJob) -> None:
        self._inner = inner

    @property
    def timeout(self) -> float:
        return self._inner.timeout

    def feedback(self, verdict: Verdict) -> Feedback:
        return self._inner.feedback(verdict)


def _request_key(spec: RequestSpec) -> Hashable:
    """What makes two bodiless requests the same (params and headers in any order and case)."""
    params = tuple(sorted((str(k), str(v)) for k, v in (spec.params or {}).items()))
    headers = tuple(sorted((k.lower(), v) for k, v in (spec.headers or {}).items()))
    return (spec.method, spec.url, params, headers, tuple(spec.fallbacks or ()))


def _listed(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else []


def _mapping(value: object) -> Mapping[str, Any] | None:
    return value if isinstance(value, Mapping) else None
