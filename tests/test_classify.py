from __future__ import annotations

import email.message
import ssl
import time
import urllib.error
from datetime import UTC, datetime
from types import SimpleNamespace
from typing import Any

import pytest
import requests
import urllib3.exceptions

from batchsync.core.verdict import Retryable
from batchsync.http.classify import (
    classify_http_exception,
    classify_raised,
    classify_refused_answer,
    classify_status,
    describe,
    is_transient,
    status_of,
    wait_hint,
)
from batchsync.http.httpfacts import facts_of

NOW = 1_800_000_000.0


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_2xx_leaves_the_decision_to_the_body(status: int) -> None:
    assert classify_status(status, None, NOW) is None


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_408_429_and_5xx_are_retryable(status: int) -> None:
    verdict = classify_status(status, None, NOW)
    assert verdict is not None
    assert (verdict.outcome, verdict.error_kind, facts_of(verdict).status_code) == (
        "retry",
        "status",
        status,
    )
    assert verdict.error == f"HTTP {status}"


@pytest.mark.parametrize("status", [300, 301, 302, 304, 307, 308, 399])
def test_a_3xx_left_unfollowed_is_an_answer(status: int) -> None:
    # (a redirect with a Location is followed before it is judged; requests' r.ok is True)
    assert classify_status(status, "5", NOW) is None


# (a 403 with Retry-After is a rate limit, GitHub's rule: see test_quota.py)
@pytest.mark.parametrize("status", [100, 400, 401, 404, 410, 422, 499])
def test_every_other_status_is_terminal(status: int) -> None:
    verdict = classify_status(status, "5", NOW)
    assert verdict is not None
    assert (verdict.outcome, verdict.error_kind) == ("terminal", "status")


def test_retry_after_is_carried_on_retryable_statuses() -> None:
    verdict = classify_status(429, "7", NOW)
    assert verdict is not None
    assert verdict.retry_after == 7.0


@pytest.mark.parametrize(
    ("exc", "outcome", "kind"),
    [
        (requests.ConnectTimeout("x"), "retry", "timeout"),
        (requests.ReadTimeout("x"), "retry", "timeout"),
        (urllib3.exceptions.ReadTimeoutError(None, "/", "Read timed out."), "retry", "timeout"),  # type: ignore[arg-type]
        (TimeoutError("slow"), "retry", "timeout"),
        (requests.ConnectionError("refused"), "retry", "connection"),
        (urllib3.exceptions.ProtocolError("reset"), "retry", "connection"),
        (urllib3.exceptions.NewConnectionError(None, "refused"), "retry", "connection"),  # type: ignore[arg-type]
        (requests.exceptions.ChunkedEncodingError("cut"), "retry", "connection"),
        (requests.exceptions.SSLError("bad cert"), "terminal", "tls"),
        (urllib3.exceptions.SSLError("handshake"), "terminal", "tls"),
        (requests.TooManyRedirects("loop"), "terminal", "redirect"),
        (requests.exceptions.InvalidURL("bad"), "terminal", "invalid_request"),
        (requests.exceptions.ContentDecodingError("gzip"), "terminal", "invalid_body"),
        (RuntimeError("boom"), "terminal", "exception"),
    ],
)
def test_exceptions_while_fetching(exc: Exception, outcome: str, kind: str) -> None:
    verdict = classify_http_exception(exc)
    assert (verdict.outcome, verdict.error_kind) == (outcome, kind)
    assert facts_of(verdict).status_code is None


def test_describe_reaches_the_innermost_reason() -> None:
    inner = ConnectionRefusedError(111, "Connection refused")
    wrapped = urllib3.exceptions.MaxRetryError(None, "/x", inner)  # type: ignore[arg-type]
    outer = requests.ConnectionError(wrapped)
    assert describe(outer) == "ConnectionError: [Errno 111] Connection refused"


def test_describe_is_one_line_without_trailing_period() -> None:
    assert describe(ValueError("bad value.")) == "ValueError: bad value"


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (Retryable("later"), True),
        (TimeoutError(), True),
        (ConnectionResetError(), True),
        (requests.ReadTimeout(), True),
        (requests.ConnectionError(), True),
        (ValueError(), False),
        (KeyError("x"), False),
    ],
)
def test_default_retry_if(exc: BaseException, expected: bool) -> None:
    assert is_transient(exc) is expected


def test_raised_by_a_callable_kinds_and_retry_after() -> None:
    retryable = classify_raised(Retryable("busy", retry_after=2.5), is_transient, NOW)
    assert (retryable.outcome, retryable.error_kind, retryable.retry_after) == (
        "retry",
        "exception",
        2.5,
    )
    timeout = classify_raised(TimeoutError("slow"), is_transient, NOW)
    assert (timeout.outcome, timeout.error_kind) == ("retry", "timeout")
    final = classify_raised(ValueError("bad"), is_transient, NOW)
    assert (final.outcome, final.error_kind, final.error) == (
        "terminal",
        "exception",
        "ValueError: bad",
    )


def test_a_custom_retry_if_decides() -> None:
    verdict = classify_raised(ValueError("flaky"), lambda exc: isinstance(exc, ValueError), NOW)
    assert verdict.outcome == "retry"
    verdict = classify_raised(TimeoutError("never again"), lambda exc: False, NOW)
    assert (verdict.outcome, verdict.error_kind) == ("terminal", "timeout")


class SDKError(Exception):
    """An error as SDKs built on httpx raise it: a status of its own and the response."""

    def __init__(self, status_code: int, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"Error code: {status_code}")
        self.status_code = status_code
        self.response = SimpleNamespace(status_code=status_code, headers=headers or {})


class APIConnectionError(Exception):
    """Named as openai's is: known without importing it."""


class APITimeoutError(APIConnectionError):
    pass


def http_error(status: int, headers: dict[str, str] | None = None) -> requests.HTTPError:
    response = requests.Response()
    response.status_code = status
    response.headers.update(headers or {})
    return requests.HTTPError(f"{status} Server Error", response=response)


@pytest.mark.parametrize(
    ("exc", "outcome", "kind", "status", "hint"),
    [
        (SDKError(429, {"Retry-After": "7"}), "retry", "status", 429, 7.0),
        (SDKError(429), "retry", "status", 429, None),
        (SDKError(500), "retry", "status", 500, None),
        (SDKError(408), "retry", "status", 408, None),
        (SDKError(400), "terminal", "status", 400, None),
        (SDKError(404, {"Retry-After": "7"}), "terminal", "status", 404, None),
        (http_error(503), "retry", "status", 503, None),
        (http_error(401), "terminal", "status", 401, None),
        (APITimeoutError("timed out"), "retry", "timeout", None, None),
        (APIConnectionError("refused"), "retry", "connection", None, None),
        (Retryable("busy", retry_after=datetime.fromtimestamp(NOW + 30, UTC)), "retry",
         "exception", None, 30.0),
        (Retryable("busy", retry_after=datetime.fromtimestamp(NOW - 30, UTC)), "retry",
         "exception", None, 0.0),
        (Retryable("busy", retry_after=float("nan")), "retry", "exception", None, None),
    ],
)  # fmt: skip
def test_an_exception_is_judged_by_the_status_and_the_wait_it_carries(
    exc: Exception, outcome: str, kind: str, status: int | None, hint: float | None
) -> None:
    verdict = classify_raised(exc, None, NOW)
    assert (verdict.outcome, verdict.error_kind, facts_of(verdict).status_code) == (
        outcome,
        kind,
        status,
    )
    assert verdict.retry_after == hint


def test_a_retry_after_date_on_a_response_counts_from_now() -> None:
    when = datetime.fromtimestamp(NOW + 12, UTC)
    exc = http_error(503, {"Retry-After": when.strftime("%a, %d %b %Y %H:%M:%S GMT")})
    assert wait_hint(exc, NOW) == 12.0
    assert status_of(exc) == 503


class ClientError(Exception):
    """Shaped as botocore's: the answer as a dict, its status and headers in ResponseMetadata
    (header names in lower case)."""

    def __init__(self, status: int, code: str, headers: dict[str, str] | None = None) -> None:
        super().__init__(f"An error occurred ({code})")
        self.response = {
            "Error": {"Code": code},
            "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": headers or {}},
        }


@pytest.mark.parametrize(
    ("exc", "outcome", "status", "hint"),
    [
        (ClientError(503, "InternalError", {"retry-after": "3"}), "retry", 503, 3.0),
        (ClientError(503, "SlowDown"), "retry", 429, None),  # throttling, whatever the status
        (ClientError(400, "ThrottlingException"), "retry", 429, None),
        (ClientError(400, "ProvisionedThroughputExceededException"), "retry", 429, None),
        (ClientError(403, "AccessDenied"), "terminal", 403, None),
    ],
)
def test_a_botocore_client_error_is_judged_by_its_response_metadata(
    exc: Exception, outcome: str, status: int, hint: float | None
) -> None:
    verdict = classify_raised(exc, None, NOW)
    assert (verdict.outcome, facts_of(verdict).status_code, verdict.retry_after) == (
        outcome,
        status,
        hint,
    )


def test_urllibs_errors_are_judged_like_the_others() -> None:
    headers = email.message.Message()
    headers["Retry-After"] = "4"
    busy = urllib.error.HTTPError("http://h/x", 503, "Service Unavailable", headers, None)
    verdict = classify_raised(busy, None, NOW)
    assert (verdict.outcome, facts_of(verdict).status_code, verdict.retry_after) == (
        "retry",
        503,
        4.0,
    )
    refused = urllib.error.URLError(ConnectionRefusedError(111, "Connection refused"))
    verdict = classify_raised(refused, None, NOW)
    assert (verdict.outcome, verdict.error_kind) == ("retry", "connection")


def test_a_zone_less_datetime_is_local_time() -> None:
    now = time.time()
    hint = Retryable("later", retry_after=datetime.fromtimestamp(now + 20))  # local, naive
    assert wait_hint(hint, now) == pytest.approx(20.0, abs=0.01)


class Hostile(Exception):
    """Everything a classifier might look at raises."""

    @property
    def response(self) -> Any:
        raise RuntimeError("no response here")

    @property
    def retry_after(self) -> Any:
        return 10**400


def test_attributes_that_raise_or_overflow_are_no_status_and_no_hint() -> None:
    verdict = classify_raised(Hostile("boom"), None, NOW)
    assert (verdict.outcome, verdict.error, verdict.retry_after) == (
        "terminal",
        "Hostile: boom",
        None,
    )


def test_retry_if_overrides_the_status_rules() -> None:
    assert classify_raised(SDKError(400), lambda exc: True, NOW).outcome == "retry"
    assert classify_raised(SDKError(503), lambda exc: False, NOW).outcome == "terminal"


def test_odd_attributes_are_no_status_and_no_hint() -> None:
    odd = ValueError("x")
    odd.status_code = "500"  # type: ignore[attr-defined]
    odd.retry_after = True  # type: ignore[attr-defined]
    odd.response = SimpleNamespace(status_code=True, headers=42)  # type: ignore[attr-defined]
    assert (status_of(odd), wait_hint(odd, NOW)) == (None, None)
    assert classify_raised(odd, None, NOW).outcome == "terminal"


def test_a_tls_failure_is_one_line_without_openssls_source_position() -> None:
    reason = ssl.SSLCertVerificationError(
        1,
        "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: self-signed "
        "certificate (_ssl.c:1006)",
    )
    verdict = classify_http_exception(urllib3.exceptions.SSLError(reason))
    assert (verdict.outcome, verdict.error_kind, verdict.error) == (
        "terminal",
        "tls",
        "SSLError: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed: "
        "self-signed certificate",
    )


def test_a_peer_that_hangs_up_during_the_handshake_is_a_connection_failure() -> None:
    """It said nothing about trust, and a busy load balancer may not do it again."""
    eof = ssl.SSLEOFError(8, "EOF occurred in violation of protocol (_ssl.c:992)")
    verdict = classify_http_exception(urllib3.exceptions.SSLError(eof))
    assert (verdict.outcome, verdict.error_kind) == ("retry", "connection")


def refused_tunnel(line: str) -> requests.exceptions.ProxyError:
    """What requests raises when a proxy answers CONNECT with anything but 200."""
    cause = urllib3.exceptions.ProxyError("Unable to connect to proxy", OSError(line))
    pool = urllib3.HTTPSConnectionPool("127.0.0.1", 1)
    return requests.exceptions.ProxyError(urllib3.exceptions.MaxRetryError(pool, "/", cause))


@pytest.mark.parametrize(
    ("status", "outcome", "kind", "status_code"),
    [
        (407, "terminal", "status", 407),
        (403, "terminal", "status", 403),
        (502, "retry", "status", 502),
        (302, "terminal", "connection", None),
    ],
)
def test_a_refused_tunnel_is_judged_by_the_proxys_status(
    status: int, outcome: str, kind: str, status_code: int | None
) -> None:
    line = f"Tunnel connection failed: {status} Some Reason"
    verdict = classify_http_exception(refused_tunnel(line))
    assert (verdict.outcome, verdict.error_kind, facts_of(verdict).status_code) == (
        outcome, kind, status_code,
    )  # fmt: skip
    assert verdict.error == f"ProxyError: {line}"


def test_a_proxy_that_cannot_be_reached_is_still_a_connection_failure() -> None:
    verdict = classify_http_exception(refused_tunnel("[Errno 111] Connection refused"))
    assert (verdict.outcome, verdict.error_kind, facts_of(verdict).status_code) == (
        "retry", "connection", None,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("status", "outcome", "error"),
    [(503, "retry", "HTTP 503"), (404, "terminal", "HTTP 404"), (200, "terminal", "HTTPError: no")],
)
def test_an_answer_a_hook_raised_for_is_judged_by_its_status(
    status: int, outcome: str, error: str
) -> None:
    verdict = classify_refused_answer(requests.HTTPError("no"), status, "7", NOW)
    assert (verdict.outcome, verdict.error_kind, facts_of(verdict).status_code, verdict.error) == (
        outcome, "status", status, error,
    )  # fmt: skip
    assert verdict.retry_after == (7.0 if outcome == "retry" else None)
