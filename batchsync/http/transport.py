"""HTTP I/O: one interface, ``Lane.send(request, wall_end) -> Reply``, and the ``Transport``
that chooses the lane for each request and reads the answers' bodies.

Two lanes implement it: the requests way (``session.SessionLane``: any session, any request,
redirects, cookies and proxies) and the fast lane (``fastlane.FastLane``: a bodiless GET or
HEAD of batchsync's own session, straight to urllib3). The wall-clock end of an attempt goes
as one value from the job through the lane to the socket (its timeout, and the watchdog that
bounds what a socket timeout alone would not). Everything that touches a socket lives in these
modules; deciding what a response means does not.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from typing import Protocol, TypeVar

import requests

from ..core.redact import Secrets
from .connections import ConnectionLedger
from .exchange import BodyReader, Outgoing, Recipe, Reply, Wire
from .fastlane import FastLane
from .guard import Guard
from .session import Cert, SessionLane, SessionSource, Verify
from .watchdog import Watchdog

# What a lane sends: its own form of a request (a Wire, a Recipe, or either).
Request_contra = TypeVar("Request_contra", contravariant=True)


class Lane(Protocol[Request_contra]):
    """A way to send a request: until its final answer's headers have come, within
    ``wall_end`` (a reading of the clock), or AttemptTimedOut. The caller reads or closes the
    Reply's body (``Transport.read_body``, ``Transport.discard``)."""

    def send(self, request: Request_contra, wall_end: float) -> Reply: ...


class Transport:
    """The run's HTTP I/O: makes each request in the form of the lane that will send it,
    sends it there (``send``: a ``Lane`` of ``Outgoing`` requests), and reads the answer's
    body, each attempt within its wall-clock end.

    ``session`` None is batchsync's own session, whose bodiless GETs and HEADs may take the
    fast lane; a caller's session (or a factory of sessions, one per worker) sends everything
    the requests way. ``close()`` when the run is over.
    """

    def __init__(
        self,
        session: SessionSource | None,
        pool_size: int,
        secrets: Secrets | None = None,
        *,
        guard: Guard | None = None,
        clock: Callable[[], float] = time.monotonic,
        verify: Verify | None = None,
        cert: Cert | None = None,
        cookies: bool = True,
    ) -> None:
        self.ledger = ConnectionLedger(guard, Watchdog(clock))
        self.guard = guard
        self._reader = BodyReader(self.ledger.watchdog, clock)
        # (a Secrets of its own when none is given: a lent session's are learned into it)
        self._sessions = SessionLane(
            session,
            pool_size=pool_size,
            secrets=Secrets() if secrets is None else secrets,
            ledger=self.ledger,
            reader=self._reader,
            verify=verify,
            cert=cert,
            cookies=cookies,
        )
        self._fast_lane = None if session is not None else FastLane(self._sessions, self._reader)

    @property
    def fast(self) -> bool:
        """Whether requests may take the fast lane at all (see ``wire``)."""
        return self._fast_lane is not None and self._fast_lane.open

    def wire(self, method: str, url: str, headers: Mapping[str, str]) -> Wire | None:
        """The fast lane's form of a request (see ``FastLane.wire``), or None when it must go
        the requests way (``prepare``). ``headers`` are sent as given (see ``headers_with``)."""
        lane = self._fast_lane
        return None if lane is None else lane.wire(method, url, headers)

    def prepare(self, request: requests.Request) -> Recipe:
        """``request`` prepared by the session, for the requests way (headers, auth and cookies)."""
        return self._sessions.prepare(request)

    def headers_with(self, *layers: Mapping[str, str | None] | None) -> Mapping[str, str]:
        """The session's default headers overlaid with ``layers``, as requests merges them."""
        return self._sessions.headers_with(*layers)

    def send(self, request: Outgoing, wall_end: float) -> Reply:
        """Send ``request`` on its lane, following redirects, until a final response's headers
        arrive; the caller reads or closes the Reply, and calls ``finish`` after the attempt."""
        try:
            if isinstance(request, Wire):
                assert self._fast_lane is not None
                return self._fast_lane.send(request, wall_end)
            return self._sessions.send(request, wall_end)
        except Exception as exc:
            self._reader.raise_if_ended(exc, wall_end)
            raise

    def read_body(self, reply: Reply, wall_end: float, max_bytes: int) -> bytearray:
        """The decompressed body, within ``wall_end`` and ``max_bytes`` (``BodyReader.read``)."""
        return self._reader.read(reply, wall_end, max_bytes)

    def stream(self, reply: Reply, wall_end: float, stall: float) -> Iterator[bytes]:
        """The answer's decompressed body chunk by chunk (see ``BodyReader.chunks``)."""
        return self._reader.chunks(reply, wall_end, stall)

    def discard(self, reply: Reply, wall_end: float) -> None:
        """Drop an answer we do not need, keeping its connection when the body is small."""
        self._reader.discard(reply, wall_end)

    def finish(self) -> None:
        """This thread's attempt is over: its connection is no longer watched."""
        self.ledger.watchdog.disarm()

    def abort(self) -> None:
        """Cut every connection, those in flight included: their attempts end at once."""
        self.ledger.abort()

    def close(self) -> None:
        """Close the run's connections, put every session back as it was, and close the
        sessions batchsync made; a caller's own session stays open."""
        self.ledger.watchdog.close()
        self._sessions.close()
        self.ledger.header_lines.clear()
