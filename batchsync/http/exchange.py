"""What a lane sends and what comes back: the two forms of a request (``Wire`` for the fast
lane, ``Recipe`` for the requests way), the ``Reply`` whose headers have come, the errors an
attempt ends with, and its body read within the attempt's end (``BodyReader``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import requests
import urllib3.exceptions
from urllib3.connectionpool import HTTPConnectionPool

from .classify import describe
from .headers import header_value
from .watchdog import Watchdog

CHUNK_BYTES = 64 * 1024

# An origin as the fast lane keys it: scheme, host, port (None: the scheme's default).
Origin = tuple[str, str, int | None]


@dataclass(slots=True)  # built per item; only ``pool`` changes, when its pool was closed
class Wire:
    """A bodiless request as the fast lane sends it: straight to the origin's urllib3 pool."""

    method: str
    url: str
    origin: Origin
    host: str
    target: str
    headers: Mapping[str, str]
    pool: HTTPConnectionPool


@dataclass(frozen=True, slots=True)
class Recipe:
    """A request for the full requests way: as the caller built it, and as the session
    prepared it when the item was claimed (prepared again when cookies may have come since)."""

    request: requests.Request
    prepared: requests.PreparedRequest
    # The host key its limits are counted under (``origins.host_of`` of the URL given).
    host: str
    # The run's auth= for this send (see auth.RunAuth): applied to the request as it goes,
    # after the cookies, so that a token is as fresh as the send.
    auth: Callable[[requests.PreparedRequest], requests.PreparedRequest] | None = None
    # False: a redirect is the answer, not followed (a provider's control call: the key it
    # carries goes to the endpoint's origin and nowhere else).
    follow: bool = True

    @property
    def method(self) -> str | None:
        return self.prepared.method

    @property
    def url(self) -> str:
        """The URL as the session prepared it (params and all)."""
        return str(self.prepared.url)


Outgoing = Wire | Recipe


@dataclass(slots=True)
class Reply:
    """A response whose headers have come: status, headers and the raw stream of its body,
    the URL it came from and how many redirects led there."""

    status: int
    headers: Mapping[str, str]
    raw: Any
    url: str
    redirects: int = 0
    closer: Callable[[], None] | None = None
    # The body, when a response hook of the caller's session has read it already.
    content: bytes | None = None

    def close(self) -> None:
        """Close the stream (and its connection) and hand the connection slot back."""
        if self.closer is not None:
            self.closer()
            return
        self.raw.close()
        self.raw.release_conn()


class AttemptTimedOut(TimeoutError):
    """The attempt used up its wall-clock allowance (connect, headers and body together)."""


class AnswerRefused(Exception):
    """A session's response hook raised HTTPError for a response (``raise_for_status``):
    the error, and how many redirects led to the response it was about."""

    def __init__(
        self, error: requests.HTTPError, response: requests.Response, redirects: int
    ) -> None:
        super().__init__(str(error))
        self.error = error
        self.response = response
        self.redirects = redirects


class BodyTooLarge(ValueError):
    """The (decompressed) body passed ``max_bytes``."""


# How far past an attempt's end a socket read may be allowed to wait (see _passes_end): this
# share of the time the attempt had when it was sent, and at least READ_END_SLACK seconds.
READ_END_SHARE = 0.02
READ_END_SLACK = 0.05


def _passes_end(timeout: float | None, left: float) -> bool:
    """Whether a read with the socket's ``timeout`` could wait past the attempt's end (``left``
    seconds away) by more than the slack: re-arming costs a system call that gives up the GIL."""
    if timeout is None:
        return True
    return timeout - left > max(READ_END_SLACK, timeout * READ_END_SHARE)


def declared_length(raw: Any, headers: Mapping[str, str]) -> int | None:
    """The length of the body still to come as the response declares it (before decoding),
    None when it does not say: urllib3's own count when the stream keeps one, which is 0 for
    the answer to a HEAD and for a 204 or 304 (their Content-Length describes a body that
    never comes), else the Content-Length."""
    remaining = getattr(raw, "length_remaining", None)
    if isinstance(remaining, int):
        return remaining
    value = headers.get("Content-Length")
    return int(value) if value is not None and value.isascii() and value.isdigit() else None


class BodyReader:
    """An attempt's wall-clock end, kept: the time it has left, whether a failure was that end
    coming, and its answer's body read within it (``watchdog`` bounds what a read alone cannot)."""

    def __init__(self, watchdog: Watchdog, clock: Callable[[], float]) -> None:
        self.watchdog = watchdog
        self._clock = clock

    def left(self, wall_end: float) -> float:
        """The seconds the attempt has left; AttemptTimedOut when it has none."""
        left = wall_end - self._clock()
        if left <= 0:
            raise AttemptTimedOut("attempt timed out")
        return left

    def read(
        self, reply: Reply, wall_end: float, max_bytes: int, *, rearm: bool = False
    ) -> bytearray:
        """The decompressed body, read in chunks; refused past ``max_bytes`` or ``wall_end``.

        Each read waits at most for the time the attempt has left (give or take the slack), so
        a server that trickles or stalls its body cannot hold the attempt past its bound. The
        connection goes back to the pool only when the watchdog has not cut it; ``rearm``
        keeps watching the attempt after that (it goes on: a redirect's next hop).
        """
        raw = reply.raw
        encoded = bool(header_value(reply.headers, "Content-Encoding"))
        # Without an encoding the declared length is the body's: checked, and read up to.
        declared = None if encoded else declared_length(raw, reply.headers)
        if declared is not None and declared > max_bytes:
            reply.close()
            raise BodyTooLarge(f"body of {declared} bytes is over max_bytes {max_bytes}")
        try:
            if reply.content is None:
                body = self._read_stream(raw, wall_end, max_bytes, encoded, declared is not None)
            elif len(reply.content) > max_bytes:  # a hook read it all, as requests reads it
                raise BodyTooLarge(f"body is over max_bytes {max_bytes}")
            else:
                body = bytearray(reply.content)
        except BaseException as exc:
            reply.close()
            self.raise_if_ended(exc, wall_end)
            raise
        watchdog = self.watchdog
        if watchdog.disarm():  # cut as the body completed: the connection is not reusable
            reply.close()
            raise AttemptTimedOut("attempt timed out")
        raw.release_conn()
        if rearm:
            watchdog.arm(wall_end)
        return body

    def _read_stream(
        self, raw: Any, wall_end: float, max_bytes: int, encoded: bool, counted: bool
    ) -> bytearray:
        """The body read from ``raw`` in chunks, each read bounded by the attempt's end."""
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        body = bytearray()
        while True:
            left = self.left(wall_end)
            if sock is not None and _passes_end(sock.gettimeout(), left):
                sock.settimeout(left)
            chunk = raw.read1(CHUNK_BYTES, decode_content=encoded)
            if not chunk:
                return body
            body += chunk
            if len(body) > max_bytes:
                raise BodyTooLarge(f"body is over max_bytes {max_bytes}")
            if counted and getattr(raw, "length_remaining", None) == 0:
                return body

    def chunks(self, reply: Reply, wall_end: float, stall: float) -> Iterator[bytes]:
        """The decompressed body as it comes, for a body too large to hold (a batch's
        results): each read waits at most ``stall`` seconds, and the whole within
        ``wall_end``. The caller stops when it has had enough (the reply is closed then)."""
        raw = reply.raw
        encoded = bool(header_value(reply.headers, "Content-Encoding"))
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        try:
            if reply.content is not None:
                yield reply.content
                return
            while True:  # (as ``_read_stream`` reads, each read within ``stall`` too)
                left = min(stall, self.left(wall_end))
                if sock is not None and _passes_end(sock.gettimeout(), left):
                    sock.settimeout(left)
                chunk = raw.read1(CHUNK_BYTES, decode_content=encoded)
                if not chunk:
                    break
                yield chunk
        except BaseException as exc:
            reply.close()
            self.raise_if_ended(exc, wall_end)
            raise
        if self.watchdog.disarm():
            reply.close()
            raise AttemptTimedOut("attempt timed out")
        raw.release_conn()

    def raise_if_ended(self, exc: BaseException, wall_end: float) -> None:
        """An AttemptTimedOut for ``exc`` when it is the attempt's end coming rather than a
        failure of its own: the watchdog cut its socket, so the read or write failed in
        whatever way that phase fails. An AttemptTimedOut (which says so already), a body
        refused as too large, or an interrupt, stands as it is."""
        if (
            isinstance(exc, Exception)
            and not isinstance(exc, AttemptTimedOut | BodyTooLarge)
            and self._clock() >= wall_end
        ):
            raise AttemptTimedOut(f"attempt timed out ({describe(exc)})") from exc

    def discard(self, reply: Reply, wall_end: float) -> None:
        """Drop a response we do not need, keeping its connection when the body is small."""
        # On any failure read has closed the response; nothing of it is kept.
        with contextlib.suppress(
            BodyTooLarge, OSError, requests.RequestException, urllib3.exceptions.HTTPError
        ):
            self.read(reply, wall_end, CHUNK_BYTES)
