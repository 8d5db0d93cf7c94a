from __future__ import annotations

import ssl

import pytest
import requests
import urllib3.exceptions

from batchsync.classify import (
    classify_http_exception,
    classify_raised,
    classify_status,
    describe,
    is_transient,
)
from batchsync.verdict import Retryable

NOW = 1_800_000_000.0


@pytest.mark.parametrize("status", [200, 201, 204, 299])
def test_2xx_leaves_the_decision_to_the_body(status: int) -> None:
    assert classify_status(status, None, NOW) is None


@pytest.mark.parametrize("status", [408, 429, 500, 502, 503, 504, 599])
def test_408_429_and_5xx_are_retryable(status: int) -> None:
    verdict = classify_status(status, None, NOW)
    assert verdict is not None
    assert (verdict.outcome, verdict.error_kind, verdict.status_code) == ("retry", "status", status)
    assert verdict.error == f"HTTP {status}"


@pytest.mark.parametrize("status", [100, 301, 304, 400, 401, 403, 404, 410, 422, 499])
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
    assert verdict.status_code is None


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
    retryable = classify_raised(Retryable("busy", retry_after=2.5), is_transient)
    assert (retryable.outcome, retryable.error_kind, retryable.retry_after) == (
        "retry",
        "exception",
        2.5,
    )
    timeout = classify_raised(TimeoutError("slow"), is_transient)
    assert (timeout.outcome, timeout.error_kind) == ("retry", "timeout")
    final = classify_raised(ValueError("bad"), is_transient)
    assert (final.outcome, final.error_kind, final.error) == (
        "terminal",
        "exception",
        "ValueError: bad",
    )


def test_a_custom_retry_if_decides() -> None:
    verdict = classify_raised(ValueError("flaky"), lambda exc: isinstance(exc, ValueError))
    assert verdict.outcome == "retry"
    verdict = classify_raised(TimeoutError("never again"), lambda exc: False)
    assert (verdict.outcome, verdict.error_kind) == ("terminal", "timeout")


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
