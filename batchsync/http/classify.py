"""What an HTTP attempt's outcome means: success, worth retrying, or final; and what it says
about the host.

Pure functions of a status code, a header value or an exception; the engine acts on the Verdict.
"""

from __future__ import annotations

import math
import re
import ssl
import urllib.error
from collections.abc import Callable, Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

import requests
import urllib3.exceptions

from ..core.backoff import parse_retry_after
from ..core.kinds import KINDS, Kind, failed
from ..core.verdict import Announced, ErrorKind, Feedback, Retryable, Verdict, retry, terminal
from .guard import PrivateAddress
from .httpfacts import HttpFacts, facts_of, facts_of_status
from .retries import RETRYABLE, no_answer

# urllib3 opens its messages with the connection or pool they came from: "HTTPConnection(
# host='h', port=80): ..." says nothing the Result does not, so it goes.
_CONNECTION_PREFIX = re.compile(r"^\w*(?:Connection|ConnectionPool)\(host=[^)]*\):\s*")
# OpenSSL's messages end with where in CPython's ssl module they were raised: "(_ssl.c:1000)".
_SSL_SOURCE = re.compile(r"\s*\(_ssl\.c:\d+\)")
# What http.client says when a proxy answers CONNECT with anything but 200 (only in words).
_TUNNEL_REFUSED = re.compile(r"^Tunnel connection failed: ([1-5][0-9][0-9])\b")
# requests' OSError for a CA bundle (verify=, REQUESTS_CA_BUNDLE, CURL_CA_BUNDLE) that is not
# there: nothing the server did, and no retry brings it back.
_MISSING_CA_BUNDLE = "Could not find a suitable TLS CA certificate bundle"


class BadRedirect(Exception):
    """A redirect that cannot be followed (its Location is not a URL requests can read)."""


def classify_status(
    status_code: int,
    retry_after: str | None,
    now: float,
    quota: float | None = None,
    retryable: frozenset[int] = RETRYABLE,
    *,
    should_retry: str | None = None,
) -> Verdict | None:
    """None for a 2xx or 3xx (the body decides); otherwise a retry or terminal Verdict.

    A 3xx judged here is one nothing follows (no Location, a 300, a 304): an answer, as
    requests' ``Response.ok`` says.

    ``retry_after`` is the raw Retry-After header; ``now`` the current Unix time for
    HTTP-dates; ``quota`` the seconds until the host's quota resets when its headers say none
    is left (``quota.quota_wait``). A 403 with either is a rate limit (GitHub's rule), retried
    after it; the longer of the two is the floor under the next wait. ``retryable``: the
    statuses retried (the caller's ``retry_statuses``). ``should_retry``: the raw
    ``x-should-retry`` header, the server's own word, which the official OpenAI and Anthropic
    SDKs obey over the status: ``false`` final, ``true`` retried, by any method (the server
    says a new try is safe).
    """
    if 200 <= status_code < 400:
        return None
    error = f"HTTP {status_code}"
    wait = parse_retry_after(retry_after, now)
    if quota is not None:
        wait = quota if wait is None else max(wait, quota)
    facts = HttpFacts(status_code, quota=quota)
    word = _SERVER_WORDS.get((should_retry or "").strip().lower())
    if word is False:
        return terminal("status", error, facts)
    if word or status_code in retryable or (status_code == 403 and wait is not None):
        # (a 429 or 403 refused the request, nothing was done; or the server says a new try
        # is safe: any method may go again)
        resendable = word is True or status_code in _REFUSED_STATUSES
        return Verdict("retry", "status", error, facts, retry_after=wait, resendable=resendable)
    return terminal("status", error, facts)


# The header in which a server says whether to try again, and what it may say (any other
# value says nothing).
SHOULD_RETRY = "x-should-retry"
_SERVER_WORDS = {"true": True, "false": False}


def classify_refused_answer(
    error: Exception,
    status: int,
    retry_after: str | None,
    now: float,
    retryable: frozenset[int] = RETRYABLE,
    *,
    should_retry: str | None = None,
) -> Verdict:
    """A response the caller's hook raised ``error`` for (``raise_for_status``): judged by
    its status, as that response would have been (a 503 retried, after its Retry-After); the
    hook's error, final, when the status alone says nothing failed."""
    verdict = classify_status(status, retry_after, now, None, retryable, should_retry=should_retry)
    return verdict or terminal("status", describe(error), HttpFacts(status))


def innermost(exc: BaseException) -> BaseException:
    """The real cause an exception carries: requests wraps urllib3's MaxRetryError, which
    wraps it in ``.reason`` (or as its first argument)."""
    reason: BaseException = exc
    for _ in range(4):
        inner = getattr(reason, "reason", None)
        if isinstance(inner, BaseException):
            reason = inner
        elif reason.args and isinstance(reason.args[0], BaseException):
            reason = reason.args[0]
        else:
            break
    return reason


def describe(exc: BaseException) -> str:
    """One short line for an exception: its type and the innermost reason it carries."""
    reason = innermost(exc)
    text = _CONNECTION_PREFIX.sub("", (str(reason) or type(reason).__name__).rstrip("."))
    return f"{type(exc).__name__}: {text}"


def _refused_tunnel(exc: BaseException) -> Verdict | None:
    """A proxy's refusal of CONNECT, judged by its status as the same answer to a plain-HTTP
    request through it (a 3xx opened no tunnel: final); None for any other exception."""
    if not isinstance(exc, requests.exceptions.ProxyError | urllib3.exceptions.ProxyError):
        return None
    reason = innermost(exc)
    cause = getattr(reason, "original_error", None) or reason
    match = _TUNNEL_REFUSED.match(str(cause))
    if match is None:
        return None
    error = f"ProxyError: {cause}"
    verdict = classify_status(int(match[1]), None, 0.0)  # (no Retry-After: no clock read)
    return terminal("connection", error) if verdict is None else replace(verdict, error=error)


def classify_http_exception(exc: Exception) -> Verdict:
    """Map an exception raised while sending a request or reading its body to a Verdict."""
    if isinstance(exc, PrivateAddress):
        return failed("invalid_request", str(exc))
    refused = _refused_tunnel(exc)
    if refused is not None:
        return refused
    error = describe(exc)
    # urllib3's NewConnectionError subclasses its ConnectTimeoutError: test it first.
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return failed("connection", error)
    if isinstance(exc, requests.Timeout | urllib3.exceptions.TimeoutError | TimeoutError):
        return failed("timeout", error)
    if isinstance(exc, requests.exceptions.SSLError | urllib3.exceptions.SSLError) or (
        _MISSING_CA_BUNDLE in str(exc)
    ):
        # (a peer that hung up during the handshake said nothing about trust, and may not recur)
        hung_up = isinstance(innermost(exc), ssl.SSLEOFError | ssl.SSLZeroReturnError)
        return failed("connection" if hung_up else "tls", _SSL_SOURCE.sub("", error))
    kind = next((found for classes, found in _KIND_BY_CLASS if isinstance(exc, classes)), None)
    return failed(kind or "exception", error)


# (The tables below keep a library's names a line, ``fmt: skip``: they read as tables.)
# The kind of the other exceptions of requests and urllib3 (and the standard library's
# ConnectionError), by class, the first that matches; "exception" for none.
_KIND_BY_CLASS: tuple[tuple[tuple[type[BaseException], ...], ErrorKind], ...] = (
    ((requests.TooManyRedirects, BadRedirect), "redirect"),
    ((requests.exceptions.InvalidURL, requests.exceptions.MissingSchema,
      requests.exceptions.InvalidSchema, requests.exceptions.InvalidHeader,
      requests.exceptions.InvalidJSONError), "invalid_request"),
    ((requests.exceptions.ContentDecodingError, urllib3.exceptions.DecodeError), "invalid_body"),
    ((requests.ConnectionError, requests.exceptions.ChunkedEncodingError,
      urllib3.exceptions.ProtocolError, ConnectionError), "connection"),
)  # fmt: skip


# Exception classes of common clients (httpx, SDKs built on it such as openai's and
# anthropic's, botocore) that mean the call never got an answer, known by name so that none of
# those libraries is needed here; a name with "Timeout" in it is a timeout.
_TRANSIENT_CLASS_NAMES = frozenset(
    {
        "TimeoutException", "NetworkError", "RemoteProtocolError",  # httpx
        "APIConnectionError", "APITimeoutError",  # openai, anthropic
        "EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError",  # botocore
        "ConnectionClosedError",
    }
)  # fmt: skip


# botocore's error codes for "slow down" (its own retry handler's list), which AWS answers
# with a 400 as often as with a 429 or 503: a 429 to the limits and the retry decision.
_THROTTLING_CODES = frozenset(
    {
        "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottledException",
        "TooManyRequestsException", "ProvisionedThroughputExceededException",
        "TransactionInProgressException", "RequestLimitExceeded", "BandwidthLimitExceeded",
        "LimitExceededException", "RequestThrottled", "SlowDown", "PriorRequestNotComplete",
        "EC2ThrottledException",
    }
)  # fmt: skip


def _transient_kind(exc: BaseException) -> ErrorKind | None:
    """The kind of an exception (or of the one it wraps, as URLError) that says no answer came."""
    for cause in (exc, innermost(exc)):
        if isinstance(cause, TimeoutError | requests.Timeout):
            return "timeout"
        if isinstance(cause, ConnectionError | requests.ConnectionError):
            return "connection"
        names = {cls.__name__ for cls in type(cause).__mro__} & _TRANSIENT_CLASS_NAMES
        if names:
            return "timeout" if any("Timeout" in name for name in names) else "connection"
    return None


def is_transient(exc: BaseException) -> bool:
    """Timeouts, connection errors (the standard library's, requests', and those of common
    clients such as httpx, openai's and botocore, by class name) and ``Retryable``."""
    return isinstance(exc, Retryable) or _transient_kind(exc) is not None


def _attribute(holder: object, name: str) -> object:
    """``getattr``, None when a property raises: the caller's exception may not break this."""
    try:
        return getattr(holder, name, None)
    except Exception:
        return None


def status_of(exc: BaseException) -> int | None:
    """The HTTP status an exception carries: its own ``status_code`` (openai, anthropic), its
    response's (requests' and httpx's ``HTTPError``), urllib's ``HTTPError.code``, or
    botocore's ``ClientError`` response metadata, a throttling error code counting as 429."""
    response = _attribute(exc, "response")
    metadata = _botocore_metadata(response)
    error = response.get("Error") if isinstance(response, Mapping) else None
    if metadata and isinstance(error, Mapping) and error.get("Code") in _THROTTLING_CODES:
        return 429
    for status in (
        _attribute(exc, "status_code"),
        _attribute(response, "status_code"),
        _attribute(exc, "code") if isinstance(exc, urllib.error.HTTPError) else None,
        metadata.get("HTTPStatusCode"),
    ):
        if isinstance(status, int) and not isinstance(status, bool) and 100 <= status <= 599:
            return status
    return None


def _botocore_metadata(response: object) -> Mapping[str, Any]:
    """botocore's ``ClientError.response["ResponseMetadata"]``, or nothing."""
    metadata = response.get("ResponseMetadata") if isinstance(response, Mapping) else None
    return metadata if isinstance(metadata, Mapping) else {}


def wait_hint(exc: BaseException, now: float) -> float | None:
    """Seconds the exception says to wait before trying again, or None: its ``retry_after``
    (seconds, or a datetime: a zone-less one is local time, as Python reads it), else the
    Retry-After of its response (or urllib's ``HTTPError.headers``); ``now``: the Unix time."""
    hint = _attribute(exc, "retry_after")
    try:
        if isinstance(hint, datetime):
            return max(hint.timestamp() - now, 0.0)
        if isinstance(hint, int | float) and not isinstance(hint, bool):
            seconds = float(hint)
            return seconds if math.isfinite(seconds) and seconds >= 0 else None
        value = _retry_after_header(exc)
    except Exception:  # a hint out of range, headers that only look like headers
        return None
    return parse_retry_after(value, now) if isinstance(value, str) else None


def headers_of(holder: object) -> Mapping[str, str] | None:
    """The response headers an SDK's answer or exception carries: its own ``headers`` (a raw
    response: openai's ``with_raw_response``, httpx's), or its ``response``'s (openai's and
    anthropic's errors, requests' and httpx's ``HTTPError``); None without any."""
    response = _attribute(holder, "response")
    for headers in (_attribute(holder, "headers"), _attribute(response, "headers")):
        if isinstance(headers, Mapping):
            return headers
    return None


def _retry_after_header(exc: BaseException) -> object:
    """The Retry-After of the exception's response, own ``headers`` (urllib) or botocore metadata;
    what headers that only look like headers raise is the caller's to catch."""
    response = _attribute(exc, "response")
    headers = (
        _attribute(response, "headers")
        or _attribute(exc, "headers")
        or _botocore_metadata(response).get("HTTPHeaders")
    )
    get = getattr(headers, "get", None)
    return (get("Retry-After") or get("retry-after")) if callable(get) else None


def classify_raised(
    exc: Exception, retry_if: Callable[[BaseException], bool] | None, now: float
) -> Verdict:
    """Map an exception raised by a callable to a Verdict.

    Retried when ``retry_if`` says so (an answer that is not a bool or None ends the item,
    saying so); without it, an exception carrying an HTTP status is judged by the HTTP rules
    (429, 408 and 5xx retried), any other by ``is_transient``. Its wait hint (``wait_hint``)
    is a floor under the next wait, as a Retry-After is.
    """
    status = status_of(exc)
    kind = _transient_kind(exc) or ("status" if status is not None else "exception")
    if retry_if is not None:
        said = retry_if(exc)
        unsaid = no_answer(retry_if, said)
        if unsaid is not None:
            return terminal(kind, f"{describe(exc)} ({unsaid})", facts_of_status(status))
        retryable = bool(said)
    elif status is not None:
        retryable = status in RETRYABLE
    else:
        retryable = is_transient(exc)
    wait = wait_hint(exc, now)
    if retry_if is None and status is None and wait is not None:
        retryable = True  # (a wait hint without a status can only mean: come back later)
    error = describe(exc)
    if retryable:
        return retry(kind, error, facts_of_status(status), wait)
    return terminal(kind, error, facts_of_status(status))


_SLOW_DOWN_STATUSES = frozenset({429, 503})
# Statuses that say the server did not act on the request (RFC 6585's 429, a refusal).
_REFUSED_STATUSES = frozenset({403, 429})
# The kind of each error kind, and of none (an answer: what a success is to the limits).
_KIND_OF_ERROR: dict[ErrorKind | None, Kind] = {None: Kind(False, "answer", "outcome")}
_KIND_OF_ERROR.update(KINDS.items())


def paces(said: Announced | None) -> bool:
    """Whether a provider's headers say when its limits come back (a reset, a spent count, a
    millisecond wait): a 429 with them is a hold until then, not a sign the host is unwell."""
    return said is not None and (
        said.retry_after is not None
        or any(reset is not None or left == 0 for _, (left, reset, _) in said.budgets())
    )


def host_feedback(verdict: Verdict) -> Feedback:
    """What an attempt tells the limits of its host.

    Congested: a 429, a 503 or a kind that says so (a timeout). Unwell (the breaker's
    failure): a kind that is the host's failure (a connection error, a timeout), a 5xx, or a
    retryable answer without Retry-After such as a 429 or 408 (or a ``Retryable`` raised
    without ``retry_after``). Not counted: a 429 or ``Retryable`` with Retry-After, which the
    cooldown handles, or with a provider's reset or count (``paces``), which the quota gate
    holds, and a kind that is no answer of the host's (an attempt cut short, lost to
    its hedge, or never sent). Anything else is an answer. Hold, for every caller: the
    Retry-After of a 429 or 503 (a wait hint without such a status, ``Retryable(retry_after=…)``,
    is that item's alone).
    """
    facts = facts_of(verdict)
    status = facts.status_code
    kind = _KIND_OF_ERROR[verdict.error_kind]
    slow_down = status in _SLOW_DOWN_STATUSES
    congested = slow_down or kind.congested
    unwell = _unwell(verdict, kind.breaker, status, facts.announced)
    told = facts.announced is not None or facts.used is not None or facts.usage is not None
    if slow_down or facts.quota or told:
        # (the rare feedback with more than the two judgements: a 429 or 503, whose Retry-After
        # holds the host, or an answer that read a quota or a provider's limits, or its usage)
        hold = verdict.retry_after if slow_down and verdict.retry_after else None
        return Feedback(
            congested, unwell, hold, facts.quota, facts.announced, facts.used, facts.usage
        )
    return _FEEDBACK[congested, unwell]


def _unwell(
    verdict: Verdict, breaker: str, status: int | None, announced: Announced | None
) -> bool | None:
    """The breaker's judgement of an attempt (None: not counted); see ``host_feedback``."""
    if breaker == "ignored":
        return None
    if breaker == "failure" or (status is not None and status >= 500):
        return True
    if verdict.outcome == "retry":
        return None if verdict.retry_after is not None or paces(announced) else True
    return False


# The feedbacks without a hold, made once: one is needed per attempt.
_FEEDBACK = {
    (congested, unwell): Feedback(congested, unwell)
    for congested in (False, True)
    for unwell in (None, False, True)
}
