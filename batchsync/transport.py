"""HTTP I/O: pooled requests sessions, attempts bounded by wall-clock time, bodies read in chunks.

Everything that touches a socket lives here; deciding what a response means does not.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.poolmanager import pool_classes_by_scheme as DEFAULT_POOL_CLASSES
from urllib3.util import Retry

from .redact import Secrets

SessionSource = requests.Session | Callable[[], requests.Session]

CHUNK_BYTES = 64 * 1024
_MAX_CACHED_ORIGINS = 4096


class AttemptTimedOut(TimeoutError):
    """The attempt used up its wall-clock allowance (connect, headers and body together)."""


class BodyTooLarge(ValueError):
    """The (decompressed) body passed ``max_bytes``."""


class _Tracked:
    """Mixed into urllib3's connection classes: a connection enters its ledger on connect."""

    ledger: ConnectionLedger

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        self.ledger.add(self)


class ConnectionLedger:
    """The connections a Transport's pools open, so that a stop can cut those in flight.

    Blocking socket reads cannot be interrupted from another thread, but shutting the socket
    down ends them at once: that is how an interrupted batch leaves no thread behind.
    """

    def __init__(self) -> None:
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self.pool_classes = {
            "http": self._pool(HTTPConnectionPool, HTTPConnection),
            "https": self._pool(HTTPSConnectionPool, HTTPSConnection),
        }

    def _pool(self, pool: type[HTTPConnectionPool], connection: type) -> type:
        tracked = type(f"Tracked{connection.__name__}", (_Tracked, connection), {"ledger": self})
        return type(f"Tracked{pool.__name__}", (pool,), {"ConnectionCls": tracked})

    def add(self, connection: object) -> None:
        with self._lock:
            self._connections.add(connection)

    def abort(self) -> int:
        """Shut down every open connection's socket; how many there were."""
        with self._lock:
            connections = list(self._connections)
        cut = 0
        for connection in connections:
            sock = getattr(connection, "sock", None)
            if sock is None:
                continue
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
                cut += 1
        return cut


def fit_session(
    session: requests.Session, pool_size: int, ledger: ConnectionLedger | None = None
) -> requests.Session:
    """Size the session's HTTP adapters' pools to ``pool_size`` and turn urllib3's retries off.

    The engine owns retries; a pool smaller than the number of workers would open and discard
    connections ("Connection pool is full"). With a ``ledger``, pools that urllib3's own
    classes would make record their connections in it.
    """
    for adapter in session.adapters.values():
        if not isinstance(adapter, HTTPAdapter):
            continue
        adapter.max_retries = Retry(0, read=False)
        if adapter._pool_maxsize < pool_size:
            adapter._pool_maxsize = pool_size
            adapter._pool_connections = max(adapter._pool_connections, pool_size)
            adapter.init_poolmanager(
                adapter._pool_connections,
                pool_size,
                block=adapter._pool_block,
            )
        manager = adapter.poolmanager
        if ledger is not None and manager.pool_classes_by_scheme == DEFAULT_POOL_CLASSES:
            manager.pool_classes_by_scheme = ledger.pool_classes
    return session


def origin_of(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower()


def host_of(url: str) -> str:
    """The host (and port, when given) a URL's per-host limits are counted under."""
    parts = urlsplit(url)
    host = (parts.hostname or "").lower()
    try:
        port = parts.port
    except ValueError:
        port = None
    return f"{host}:{port}" if port else host


class Transport:
    """Sends prepared requests and reads their bodies, each attempt within a wall-clock bound.

    A ``requests.Session`` instance is shared by all workers; a factory is called once per
    worker thread. Environment settings (proxies, CA bundle) are looked up once per origin
    instead of on every request, and still honoured.
    """

    def __init__(
        self,
        session: SessionSource | None,
        pool_size: int,
        secrets: Secrets = Secrets(),  # noqa: B008 - immutable
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory: Callable[[], requests.Session] | None = None
        self._shared: requests.Session | None = None
        self.ledger = ConnectionLedger()
        if session is None:
            self._shared = fit_session(requests.Session(), pool_size, self.ledger)
            self._owns_session = True
        elif isinstance(session, requests.Session):
            self._shared = fit_session(session, pool_size, self.ledger)
            self._owns_session = False
        else:
            self._factory = session
            self._owns_session = True
        self._pool_size = pool_size
        self._local = threading.local()
        self._made: list[requests.Session] = []
        self._settings: dict[tuple[int, str], dict[str, Any]] = {}
        self._secrets = secrets
        self._clock = clock

    def session(self) -> requests.Session:
        """The session this worker thread uses."""
        if self._shared is not None:
            return self._shared
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            assert self._factory is not None
            made = self._factory()
            if not isinstance(made, requests.Session):
                raise TypeError(f"session factory returned {type(made).__name__}, not a Session")
            session = fit_session(made, self._pool_size, self.ledger)
            self._local.session = session
            self._made.append(session)
        return session

    def abort(self) -> None:
        """Cut every connection, those in flight included: their attempts end at once."""
        self.ledger.abort()

    def close(self) -> None:
        """Close the sessions batchsync made; a caller's own session stays open."""
        if self._owns_session and self._shared is not None:
            self._shared.close()
        for session in self._made:
            session.close()
        self._made.clear()

    def _environment(self, session: requests.Session, url: str) -> dict[str, Any]:
        key = (id(session), origin_of(url))
        settings = self._settings.get(key)
        if settings is None:
            if len(self._settings) >= _MAX_CACHED_ORIGINS:
                self._settings.clear()
            merged = session.merge_environment_settings(url, {}, None, None, None)
            settings = {name: merged[name] for name in ("proxies", "verify", "cert")}
            self._settings[key] = settings
        return settings

    def _left(self, wall_end: float) -> float:
        left = wall_end - self._clock()
        if left <= 0:
            raise AttemptTimedOut("attempt timed out")
        return left

    def _send_once(
        self, session: requests.Session, request: requests.PreparedRequest, wall_end: float
    ) -> requests.Response:
        assert request.url is not None
        return session.send(
            request,
            allow_redirects=False,
            stream=True,
            timeout=self._left(wall_end),
            **self._environment(session, request.url),
        )

    def send(self, request: requests.PreparedRequest, wall_end: float) -> requests.Response:
        """Send ``request``, following redirects, until a final response's headers arrive.

        Secret headers go only to the request's own host: a redirect elsewhere drops them.
        The caller must read or close the returned response.
        """
        session = self.session()
        first_url = request.url
        assert first_url is not None
        response = self._send_once(session, request, wall_end)
        hops = 0
        while response.is_redirect and response.next is not None:
            follow = response.next
            response.close()
            hops += 1
            if hops > session.max_redirects:
                raise requests.TooManyRedirects(f"more than {session.max_redirects} redirects")
            assert follow.url is not None
            if session.should_strip_auth(first_url, follow.url):
                for name in list(follow.headers):
                    if self._secrets.is_secret(name):
                        del follow.headers[name]
            response = self._send_once(session, follow, wall_end)
        return response

    def read_body(self, response: requests.Response, wall_end: float, max_bytes: int) -> bytearray:
        """The decompressed body, read in chunks; refused past ``max_bytes`` or ``wall_end``.

        Each read waits at most for the time the attempt has left, so a server that trickles
        its body cannot hold the attempt past its bound.
        """
        raw = response.raw
        declared = response.headers.get("Content-Length")
        if (
            declared is not None
            and declared.isdigit()
            and int(declared) > max_bytes
            and not response.headers.get("Content-Encoding")
        ):
            response.close()
            raise BodyTooLarge(f"body of {declared} bytes is over max_bytes {max_bytes}")
        connection = getattr(raw, "connection", None)
        sock = getattr(connection, "sock", None)
        body = bytearray()
        try:
            while True:
                left = self._left(wall_end)
                if sock is not None:
                    sock.settimeout(left)
                chunk = raw.read1(CHUNK_BYTES, decode_content=True)
                if not chunk:
                    break
                body += chunk
                if len(body) > max_bytes:
                    raise BodyTooLarge(f"body is over max_bytes {max_bytes}")
        except BaseException:
            response.close()
            raise
        raw.release_conn()
        return body

    def discard(self, response: requests.Response, wall_end: float) -> None:
        """Drop a response we do not need, keeping its connection when the body is small."""
        # On any failure read_body has closed the response; nothing of it is kept.
        with contextlib.suppress(
            BodyTooLarge, OSError, requests.RequestException, urllib3.exceptions.HTTPError
        ):
            self.read_body(response, wall_end, CHUNK_BYTES)
