"""The HTTP job: prepare each item's requests once, then send, classify and decode per attempt."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import replace
from functools import partial
from typing import Any

import requests

from .classify import (
    Verdict,
    classify_http_exception,
    classify_status,
    describe,
    success,
    terminal,
)
from .decode import InvalidBody, decode_body
from .engine import Route, Task
from .hedge import HedgeDelay, Hedger
from .limits import Gates
from .options import FetchOptions
from .redact import redact_text
from .result import Result
from .spec import InvalidItem, RequestSpec, item_label, parse_item
from .transport import BodyTooLarge, Transport, host_of

# Responses that carry no body to decode, whatever ``expect`` says.
_NO_BODY_STATUSES = frozenset({204, 205, 304})
_DEDUP_METHODS = frozenset({"GET", "HEAD"})
_LOST = Verdict("terminal", "cancelled", "lost the race to a hedged request")


class HttpJob:
    """Turns items into HTTP Tasks for the engine. ``close()`` when the run is over."""

    def __init__(
        self,
        options: FetchOptions,
        transport: Transport,
        gates: Gates | None = None,
        clock: Callable[[], float] = time.monotonic,
        unix_time: Callable[[], float] = time.time,
    ) -> None:
        self._options = options
        self._transport = transport
        self._secrets = options.secrets()
        self._clock = clock
        self._unix_time = unix_time
        self._hedger: Hedger | None = None
        if options.hedge_after is not None:
            self._hedger = Hedger(
                HedgeDelay(options.hedge_after), workers=2 * options.concurrency, gates=gates
            )

    @property
    def timeout(self) -> float:
        return self._options.timeout

    def close(self) -> None:
        """End the hedging threads; requests that lost a race are cut, not waited for."""
        if self._hedger is not None:
            self._transport.abort()
            self._hedger.close()

    def label(self, item: object) -> tuple[str | None, Any]:
        return item_label(item)

    def prepare(self, item: object) -> Task:
        spec = parse_item(item)
        routes = [self._url_route(spec, url) for url in (spec.url, *(spec.fallbacks or ()))]
        routes += [
            Route(partial(self._call_fallback, fallback, spec), gated=False, max_attempts=1)
            for fallback in self._options.fallbacks
        ]
        return Task(
            spec.url, spec.id, routes[0], tuple(routes[1:]), self._dedup_key(spec), subject=spec
        )

    def _url_route(self, spec: RequestSpec, url: str) -> Route:
        request = self._prepare_request(spec, url)
        host = host_of(url)
        # Only GETs are hedged: a second copy of anything else could change something twice.
        hedge_host = host if self._hedger is not None and spec.method == "GET" else None
        attempt = partial(self._attempt, request, hedge_host)
        if spec.retry_safe:
            return Route(attempt, host)
        reason = f"{spec.method} is not retried without an idempotency_key"
        return Route(attempt, host, max_attempts=1, no_retry_reason=reason)

    def _dedup_key(self, spec: RequestSpec) -> Hashable | None:
        """Identical bodiless GET/HEAD requests share one flight (unless ``dedup`` is off)."""
        if (
            not self._options.dedup
            or spec.method not in _DEDUP_METHODS
            or spec.json_body is not None
            or spec.data is not None
        ):
            return None
        params = tuple(sorted((str(k), str(v)) for k, v in (spec.params or {}).items()))
        headers = tuple(sorted((k.lower(), v) for k, v in (spec.headers or {}).items()))
        return (spec.method, spec.url, params, headers, tuple(spec.fallbacks or ()))

    def _prepare_request(self, spec: RequestSpec, url: str) -> requests.PreparedRequest:
        """The request as it goes on the wire, built once and reused by every attempt."""
        headers = dict(self._options.headers or {})
        headers.update(spec.headers or {})
        if spec.idempotency_key is not None:
            headers["Idempotency-Key"] = spec.idempotency_key
        request = requests.Request(
            spec.method,
            url,
            headers=headers,
            params=spec.params or {},
            json=spec.json_body,
            data=spec.data,
        )
        try:
            return self._transport.session().prepare_request(request)
        except (requests.RequestException, ValueError, TypeError) as exc:
            secrets = self._secrets.values(spec.headers)
            raise InvalidItem(
                f"cannot build the request: {redact_text(str(exc), secrets)}"
            ) from None

    def _call_fallback(
        self,
        fallback: Callable[[RequestSpec, Result | None], Any],
        spec: RequestSpec,
        bound: float | None,
        so_far: Result | None,
    ) -> Verdict:
        try:
            return success(fallback(spec, so_far))
        except Exception as exc:  # the caller's fallback failing is that route's failure
            return terminal("exception", describe(exc))

    def _attempt(
        self,
        request: requests.PreparedRequest,
        hedge_host: str | None,
        bound: float | None,
        so_far: Result | None,
    ) -> Verdict:
        assert bound is not None
        wall_end = self._clock() + bound
        if hedge_host is not None and self._hedger is not None:
            return self._hedger.run(partial(self._exchange, request, wall_end), hedge_host)
        return self._exchange(request, wall_end, None)

    def _exchange(
        self,
        request: requests.PreparedRequest,
        wall_end: float,
        lost: threading.Event | None,
    ) -> Verdict:
        """Send one request and read its answer; a request that lost a race just closes."""
        try:
            response = self._transport.send(request, wall_end)
        except Exception as exc:  # every failure is classified, none escapes
            return self._redacted(classify_http_exception(exc))
        if lost is not None and lost.is_set():
            response.close()
            return _LOST
        status = response.status_code
        try:
            return self._judge(request, response, wall_end)
        except (InvalidBody, BodyTooLarge) as exc:
            return terminal("invalid_body", str(exc), status)
        except Exception as exc:  # a failure while reading the body keeps the status seen
            return self._redacted(replace(classify_http_exception(exc), status_code=status))

    def _redacted(self, verdict: Verdict) -> Verdict:
        if not self._secrets.batch_values or verdict.error is None:
            return verdict
        return replace(verdict, error=redact_text(verdict.error, self._secrets.batch_values))

    def _judge(
        self, request: requests.PreparedRequest, response: requests.Response, wall_end: float
    ) -> Verdict:
        status = response.status_code
        failed = classify_status(status, response.headers.get("Retry-After"), self._unix_time())
        if failed is not None:
            self._transport.discard(response, wall_end)
            return failed
        body = self._transport.read_body(response, wall_end, self._options.max_bytes)
        if request.method == "HEAD" or status in _NO_BODY_STATUSES:
            return success(None, status)
        data = decode_body(body, self._options.expect, response.headers.get("Content-Type"))
        return success(data, status)
