"""HTTP I/O: pooled requests sessions, attempts bounded by wall-clock time, bodies read in chunks.

Everything that touches a socket lives here; deciding what a response means does not.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
import time
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from requests.cookies import extract_cookies_to_jar
from requests.models import REDIRECT_STATI
from requests.structures import CaseInsensitiveDict
from requests.utils import get_netrc_auth, select_proxy
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.exceptions import ClosedPoolError, LocationParseError
from urllib3.poolmanager import pool_classes_by_scheme as DEFAULT_POOL_CLASSES
from urllib3.util import Retry, parse_url

from .guard import Guard, PrivateAddress
from .headers import QuickHeadersResponse
from .redact import Secrets

if TYPE_CHECKING:
    from .options import FetchOptions

SessionSource = requests.Session | Callable[[], requests.Session]

CHUNK_BYTES = 64 * 1024
_MAX_CACHED_ORIGINS = 4096


Origin = tuple[str, str, int | None]

# Bodiless methods the fast lane sends; everything else goes the full requests way.
_FAST_METHODS = frozenset({"GET", "HEAD"})
# Characters that requests would percent-encode or otherwise rewrite in a URL.
_NOT_PLAIN = re.compile(r"[\s\"<>\\^`{|}]")


@dataclass(slots=True)  # built per item, never changed (frozen would cost 6x to build)
class Wire:
    """A bodiless request as the fast lane sends it: straight to the origin's urllib3 pool."""

    method: str
    url: str
    origin: Origin
    host: str
    target: str
    headers: Mapping[str, str]


Outgoing = Wire | requests.PreparedRequest

# requests' own adapter send; when something has patched it, the fast lane stands aside.
_ADAPTER_SEND = HTTPAdapter.send


@dataclass(slots=True)
class Reply:
    """A response whose headers have come: status, headers and the raw stream of its body."""

    status: int
    headers: Mapping[str, str]
    raw: Any
    closer: Callable[[], None] | None = None

    def close(self) -> None:
        """Close the stream (and its connection) and hand the connection slot back."""
        if self.closer is not None:
            self.closer()
            return
        self.raw.close()
        self.raw.release_conn()


# scheme://host[:port][/path?query][#fragment], the common shape, split without parse_url.
_PLAIN_URL = re.compile(r"(https?)://([A-Za-z0-9.-]+)(?::([0-9]{1,5}))?(/[^#]*)?(?:#.*)?")


def _split_plain(url: str) -> tuple[Origin, str] | None:
    """A URL's origin and request target; None for a URL that is not http(s) with a host."""
    match = _PLAIN_URL.fullmatch(url)
    if match is not None and int(match[3] or 1) <= 65535:
        port = int(match[3]) if match[3] else None
        return (match[1], match[2].lower(), port), match[4] or "/"
    try:
        parts = parse_url(url)
    except LocationParseError:
        return None
    if parts.scheme not in ("http", "https") or not parts.host:
        return None
    return (parts.scheme, parts.host.lower(), parts.port), parts.request_uri


# How far past an attempt's end a socket read may be allowed to wait (see _passes_end): this
# share of the time the attempt had when it was sent, and at least READ_END_SLACK seconds.
READ_END_SHARE = 0.02
READ_END_SLACK = 0.05


def _passes_end(timeout: float | None, left: float) -> bool:
    """Whether a read with the socket's current ``timeout`` could wait past the attempt's end
    (``left`` seconds away) by more than the slack.

    The timeout urllib3 set when sending was the time left then, so after a prompt reply it
    still fits: re-arming it costs a system call that gives up the GIL, on every response.
    """
    if timeout is None:
        return True
    return timeout - left > max(READ_END_SLACK, timeout * READ_END_SHARE)


class AttemptTimedOut(TimeoutError):
    """The attempt used up its wall-clock allowance (connect, headers and body together)."""


class BodyTooLarge(ValueError):
    """The (decompressed) body passed ``max_bytes``."""


class _Tracked:
    """Mixed into urllib3's connection classes: a connection enters its ledger on connect,
    and reads its responses' headers the quick way."""

    ledger: ConnectionLedger
    response_class = QuickHeadersResponse

    def connect(self) -> None:
        super().connect()  # type: ignore[misc]
        guard = self.ledger.guard
        if guard is not None:
            try:
                guard.check_peer(self.sock)  # type: ignore[attr-defined]
            except PrivateAddress:
                self.close()  # type: ignore[attr-defined]
                raise
        self.ledger.add(self)


class ConnectionLedger:
    """The connections a Transport's pools open, so that a stop can cut those in flight.

    Blocking socket reads cannot be interrupted from another thread, but shutting the socket
    down ends them at once: that is how an interrupted batch leaves no thread behind.
    """

    def __init__(self, guard: Guard | None = None) -> None:
        self.guard = guard
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
        guard: Guard | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory: Callable[[], requests.Session] | None = None
        self._shared: requests.Session | None = None
        self.ledger = ConnectionLedger(guard)
        self._guard = guard
        if session is None:
            self._shared = fit_session(requests.Session(), pool_size, self.ledger)
            self._owns_session = True
        elif isinstance(session, requests.Session):
            self._shared = fit_session(session, pool_size, self.ledger)
            self._owns_session = False
        else:
            self._factory = session
            self._owns_session = True
        self._fast = session is None
        self._jar_used = False
        self._lanes: dict[Origin, HTTPConnectionPool | None] = {}
        self._pool_size = pool_size
        self._local = threading.local()
        self._made: list[requests.Session] = []
        self._settings: dict[tuple[int, str], dict[str, Any]] = {}
        self._secrets = secrets
        self._clock = clock

    @classmethod
    def for_options(cls, options: FetchOptions) -> Transport:
        return cls(options.session, options.concurrency, options.secrets(), options.guard())

    @property
    def guard(self) -> Guard | None:
        return self._guard

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

    @property
    def fast(self) -> bool:
        """Whether requests may take the fast lane at all (see ``wire``)."""
        return self._fast and not self._jar_used and HTTPAdapter.send is _ADAPTER_SEND

    def headers_with(self, *layers: Mapping[str, str] | None) -> Mapping[str, str]:
        """The session's default headers overlaid with ``layers``, as requests merges them."""
        merged = CaseInsensitiveDict(self.session().headers)
        for layer in layers:
            merged.update(layer or {})
        return {name: value for name, value in merged.items() if value is not None}

    def wire(self, method: str, url: str, headers: Mapping[str, str]) -> Wire | None:
        """The fast form of a bodiless GET/HEAD to a plain URL, or None when it must go the
        full requests way: a caller's session, a proxy or netrc entry for the host, cookies
        in the jar, a URL that requests would rewrite, or ``HTTPAdapter.send`` patched (by a
        mocking library that wants to see every request). ``headers`` are sent as given
        (see ``headers_with``)."""
        if (
            not self.fast
            or method not in _FAST_METHODS
            or not url.isascii()
            or _NOT_PLAIN.search(url)
        ):
            return None
        split = _split_plain(url)
        if split is None:
            return None
        origin, target = split
        if self._lane(origin, url) is None:
            return None
        host = f"{origin[1]}:{origin[2]}" if origin[2] else origin[1]
        return Wire(method, url, origin, host, target, headers)

    def _lane(self, origin: Origin, url: str) -> HTTPConnectionPool | None:
        """The urllib3 pool that serves an origin directly, or None when it must not."""
        if origin in self._lanes:
            return self._lanes[origin]
        session = self.session()
        settings = self._environment(session, url)
        adapter = session.get_adapter(url)
        pool = None
        if (
            type(adapter) is HTTPAdapter
            and select_proxy(url, settings["proxies"]) is None
            and not (session.trust_env and get_netrc_auth(url))
        ):
            probe = requests.Request("GET", url).prepare()
            pool = adapter.get_connection_with_tls_context(
                probe, settings["verify"], None, settings["cert"]
            )
        if len(self._lanes) >= _MAX_CACHED_ORIGINS:
            self._lanes.clear()
        self._lanes[origin] = pool
        return pool

    def send(self, request: Outgoing, wall_end: float) -> Reply:
        """Send ``request``, following redirects, until a final response's headers arrive.

        Secret headers go only to the request's own host: a redirect elsewhere drops them.
        The caller must read or close the returned Reply.
        """
        if isinstance(request, Wire):
            return self._send_wire(request, wall_end)
        session = self.session()
        assert request.url is not None
        return self._settle(
            session, request.url, self._send_once(session, request, wall_end), wall_end
        )

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

    def _send_wire(self, wire: Wire, wall_end: float) -> Reply:
        pool = self._lanes[wire.origin]
        assert pool is not None
        left = self._left(wall_end)
        try:
            raw = pool.urlopen(
                wire.method, wire.target, headers=wire.headers, retries=False, redirect=False,
                assert_same_host=False, preload_content=False, decode_content=False,
                timeout=left,
            )  # fmt: skip
        except ClosedPoolError:  # the pool manager dropped this origin's pool: ask again
            del self._lanes[wire.origin]
            self._lane(wire.origin, wire.url)
            return self._send_wire(wire, wall_end)
        if "set-cookie" in raw.headers or (
            raw.status in REDIRECT_STATI and "location" in raw.headers
        ):
            # Cookies and redirects are the session's business: hand over to requests.
            session = self.session()
            prepared = session.prepare_request(
                requests.Request(wire.method, wire.url, headers=dict(wire.headers))
            )
            adapter = session.get_adapter(wire.url)
            assert isinstance(adapter, HTTPAdapter)
            response = adapter.build_response(prepared, raw)
            extract_cookies_to_jar(session.cookies, prepared, raw)
            if session.cookies:
                self._jar_used = True
            # With yield_requests=True, resolve_redirects yields the next PreparedRequest.
            response._next = next(  # type: ignore[assignment]
                session.resolve_redirects(response, prepared, yield_requests=True), None
            )
            return self._settle(session, wire.url, response, wall_end)
        return Reply(raw.status, raw.headers, raw)

    def _settle(
        self,
        session: requests.Session,
        first_url: str,
        response: requests.Response,
        wall_end: float,
    ) -> Reply:
        """Follow redirects from ``response`` to the final one."""
        hops = 0
        while response.is_redirect and response.next is not None:
            follow = response.next
            response.close()
            hops += 1
            if hops > session.max_redirects:
                raise requests.TooManyRedirects(f"more than {session.max_redirects} redirects")
            assert follow.url is not None
            if self._guard is not None:
                self._guard.check(urlsplit(follow.url).hostname or "")
            if session.should_strip_auth(first_url, follow.url):
                for name in list(follow.headers):
                    if self._secrets.is_secret(name):
                        del follow.headers[name]
            response = self._send_once(session, follow, wall_end)
        return Reply(response.status_code, response.headers, response.raw, response.close)

    def read_body(self, reply: Reply, wall_end: float, max_bytes: int) -> bytearray:
        """The decompressed body, read in chunks; refused past ``max_bytes`` or ``wall_end``.

        Each read waits at most for the time the attempt has left (give or take the slack), so
        a server that trickles or stalls its body cannot hold the attempt past its bound.
        """
        raw = reply.raw
        declared = reply.headers.get("Content-Length")
        encoded = bool(reply.headers.get("Content-Encoding"))
        # Without an encoding, the declared length is the body's: check it, and stop reading
        # once it has all come.
        counted = declared is not None and not encoded
        if counted and declared and declared.isdigit() and int(declared) > max_bytes:
            reply.close()
            raise BodyTooLarge(f"body of {declared} bytes is over max_bytes {max_bytes}")
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        body = bytearray()
        try:
            while True:
                left = self._left(wall_end)
                if sock is not None and _passes_end(sock.gettimeout(), left):
                    sock.settimeout(left)
                chunk = raw.read1(CHUNK_BYTES, decode_content=encoded)
                if not chunk:
                    break
                body += chunk
                if len(body) > max_bytes:
                    raise BodyTooLarge(f"body is over max_bytes {max_bytes}")
                if counted and getattr(raw, "length_remaining", None) == 0:
                    break
        except BaseException:
            reply.close()
            raise
        raw.release_conn()
        return body

    def discard(self, reply: Reply, wall_end: float) -> None:
        """Drop a response we do not need, keeping its connection when the body is small."""
        # On any failure read_body has closed the response; nothing of it is kept.
        with contextlib.suppress(
            BodyTooLarge, OSError, requests.RequestException, urllib3.exceptions.HTTPError
        ):
            self.read_body(reply, wall_end, CHUNK_BYTES)
