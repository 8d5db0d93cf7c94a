"""The HTTP job: prepare each item's request once, then send, classify and decode per attempt."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import requests

from .classify import Verdict, classify_http_exception, classify_status, success, terminal
from .decode import InvalidBody, decode_body
from .engine import Task
from .options import FetchOptions
from .redact import redact_text, secret_values
from .spec import InvalidItem, RequestSpec, item_label, parse_item
from .transport import BodyTooLarge, Transport, host_of

# Responses that carry no body to decode, whatever ``expect`` says.
_NO_BODY_STATUSES = frozenset({204, 205, 304})


class HttpJob:
    """Turns items into HTTP Tasks for the engine."""

    def __init__(
        self,
        options: FetchOptions,
        transport: Transport,
        clock: Callable[[], float] = time.monotonic,
        unix_time: Callable[[], float] = time.time,
    ) -> None:
        self._options = options
        self._transport = transport
        self._secrets = secret_values(options.headers, all_secret=True)
        self._clock = clock
        self._unix_time = unix_time

    @property
    def timeout(self) -> float:
        return self._options.timeout

    def label(self, item: object) -> tuple[str | None, Any]:
        return item_label(item)

    def prepare(self, item: object) -> Task:
        spec = parse_item(item)
        request = self._prepare_request(spec)
        host = host_of(spec.url)
        if spec.retry_safe:
            return Task(spec.url, spec.id, partial(self._attempt, request), host=host)
        return Task(
            spec.url,
            spec.id,
            partial(self._attempt, request),
            max_attempts=1,
            no_retry_reason=f"{spec.method} is not retried without an idempotency_key",
            host=host,
        )

    def _prepare_request(self, spec: RequestSpec) -> requests.PreparedRequest:
        """The request as it goes on the wire, built once and reused by every attempt."""
        headers = dict(self._options.headers or {})
        headers.update(spec.headers or {})
        if spec.idempotency_key is not None:
            headers["Idempotency-Key"] = spec.idempotency_key
        request = requests.Request(
            spec.method,
            spec.url,
            headers=headers,
            params=spec.params or {},
            json=spec.json_body,
            data=spec.data,
        )
        try:
            return self._transport.session().prepare_request(request)
        except (requests.RequestException, ValueError, TypeError) as exc:
            secrets = self._secrets | secret_values(spec.headers)
            raise InvalidItem(
                f"cannot build the request: {redact_text(str(exc), secrets)}"
            ) from None

    def _attempt(self, request: requests.PreparedRequest, bound: float | None) -> Verdict:
        assert bound is not None
        wall_end = self._clock() + bound
        try:
            response = self._transport.send(request, wall_end)
        except Exception as exc:  # every failure is classified, none escapes
            return self._redacted(classify_http_exception(exc))
        status = response.status_code
        try:
            return self._judge(request, response, wall_end)
        except (InvalidBody, BodyTooLarge) as exc:
            return terminal("invalid_body", str(exc), status)
        except Exception as exc:  # a failure while reading the body keeps the status seen
            return self._redacted(replace(classify_http_exception(exc), status_code=status))

    def _redacted(self, verdict: Verdict) -> Verdict:
        if not self._secrets or verdict.error is None:
            return verdict
        return replace(verdict, error=redact_text(verdict.error, self._secrets))

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
