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
from collections.abc import Callable, Mapping, MutableMapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import requests
import urllib3.exceptions
from requests.adapters import HTTPAdapter
from requests.cookies import extract_cookies_to_jar
from requests.models import REDIRECT_STATI
from requests.structures import CaseInsensitiveDict
from requests.utils import (
    DEFAULT_CA_BUNDLE_PATH,
    default_headers,
    get_netrc_auth,
    resolve_proxies,
    select_proxy,
)
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import ClosedPoolError
from urllib3.poolmanager import pool_classes_by_scheme as DEFAULT_POOL_CLASSES
from urllib3.response import BaseHTTPResponse
from urllib3.util import Retry

from ..core.redact import Secrets
from .classify import BadRedirect, describe
from .cookies import OriginJars, lend
from .guard import Guard, PrivateAddress
from .headers import QuickHeadersResponse
from .origins import host_key
from .watchdog import Watchdog

SessionSource = requests.Session | Callable[[], requests.Session]
# As in requests: verify a path to a CA bundle (or directory), True (certifi), or False; cert
# a client certificate file, or a (certificate, key) pair of files.
Verify = bool | str
Cert = str | tuple[str, str]

CHUNK_BYTES = 64 * 1024
# Per-origin look-ups kept at most; past that the cache starts afresh (entries are re-derived
# on demand, so forgetting one costs a look-up, never a request).
_MAX_CACHED_ORIGINS = 4096


Origin = tuple[str, str, int | None]
# An origin's fast lane: the urllib3 pool that serves it (None: it must go the requests way)
# and its host key.
Lane = tuple[HTTPConnectionPool | None, str]

# Bodiless methods the fast lane sends; everything else goes the full requests way.
_FAST_METHODS = frozenset({"GET", "HEAD"})
# What urllib3 makes of retries=False, redirect=False on every request, made once.
_NO_RETRIES = Retry(False, redirect=False)


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


# requests' own sends; when something has patched one (a mocking library, instrumentation
# that adds trace headers), the fast lane stands aside so that it sees every request.
_ADAPTER_SEND = HTTPAdapter.send
_SESSION_SEND = requests.Session.send


@dataclass(frozen=True, slots=True)
class Recipe:
    """A request for the full requests way: as the caller built it, and as the session
    prepared it when the item was claimed (prepared again when cookies may have come since)."""

    request: requests.Request
    prepared: requests.PreparedRequest
    # The run's auth= for this send (see auth.RunAuth): applied to the request as it goes,
    # after the cookies, so that a token is as fresh as the send.
    auth: Callable[[requests.PreparedRequest], requests.PreparedRequest] | None = None

    @property
    def method(self) -> str | None:
        return self.prepared.method


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


# The URLs the fast lane takes: those requests sends as written and reports as written (its
# ``Response.url``): http(s), a lower-case host name or IPv4 address, a port without leading
# zeros, a path, and a query of only the characters that requests and urllib3 pass through
# unchanged (RFC 3986 unreserved, sub-delims, ":@/" and "?" in the query). No userinfo
# (requests turns it into Authorization), no percent-escape (requests re-quotes them), no
# fragment, no IPv6 literal. Dot segments are ruled out below.
_PLAIN = r"[A-Za-z0-9._~!$&'()*+,;=:@/-]"
_LANE_URL = re.compile(
    rf"(https?)://([a-z0-9][a-z0-9.-]*)(?::([1-9][0-9]{{0,4}}))?"
    rf"(/{_PLAIN}*)(\?(?:{_PLAIN}|\?)+)?"
)
_DOT_SEGMENT = re.compile(r"/\.\.?(?:/|$)")


def lane_split(url: str) -> tuple[Origin, str] | None:
    """A URL's origin and request target when requests would send that target unchanged;
    None for any URL that requests would rewrite (normalise, quote, or add auth for)."""
    match = _LANE_URL.fullmatch(url)
    if match is None:
        return None
    scheme, host, port, path, query = match.groups()
    if _DOT_SEGMENT.search(path) or (port and int(port) > 65535):
        return None
    return (scheme, host, int(port) if port else None), path + (query or "")


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


def _held_body(content: bytes, max_bytes: int) -> bytearray:
    """A body read already (by a response hook), refused past ``max_bytes``."""
    body = bytearray(content)
    if len(body) > max_bytes:
        raise BodyTooLarge(f"body is over max_bytes {max_bytes}")
    return body


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


# The headers requests sends by default (User-Agent, Accept-Encoding, Accept, Connection).
_DEFAULT_HEADERS = frozenset(name.lower() for name in default_headers())


def leave_origin(
    headers: MutableMapping[str, str | bytes],
    is_secret: Callable[[str], bool],
    defaults: Mapping[str, str | bytes],
) -> None:
    """Make a redirect hop's ``headers`` fit for another origin: the run's secret headers go,
    and one that stood for a header requests sends by default (a ``-H 'User-Agent: …'``) gives
    its place to the session's value, so the hop is the one requests sends without them."""
    fallback = {name.lower(): (name, value) for name, value in defaults.items()}
    for name in list(headers):
        if not is_secret(name):
            continue
        standing = fallback.get(name.lower()) if name.lower() in _DEFAULT_HEADERS else None
        if standing is None:
            del headers[name]
        else:
            headers[standing[0]] = standing[1]  # (in the place it had)


def proxy_reads_headers(url: str, proxies: Mapping[str, str]) -> bool:
    """Whether a request for ``url`` goes to a proxy in the clear, so that the proxy (and not
    the origin server) reads its headers: plain HTTP, with a proxy for its URL. (Over HTTPS a
    proxy only tunnels: the headers are the origin's to read.)"""
    return urlsplit(url).scheme.lower() == "http" and bool(select_proxy(url, dict(proxies)))


def _unreadable_location(exc: UnicodeDecodeError) -> BadRedirect:
    return BadRedirect(f"cannot follow a redirect: {exc.reason} in its Location")


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


class _Tracked:
    """Mixed into urllib3's connection classes: a connection enters its ledger as its socket
    connects, has its peer checked before any byte (a TLS ClientHello included) is sent, is
    watched for its attempt's end, and reads its responses' headers the quick way."""

    ledger: ConnectionLedger
    # False for the connections to a proxy: the proxy's own address is the caller's choice.
    peer_check = True
    response_class = QuickHeadersResponse

    def _new_conn(self) -> socket.socket:
        sock: socket.socket = super()._new_conn()  # type: ignore[misc]
        guard = self.ledger.guard
        if guard is not None and self.peer_check:
            try:
                guard.check_peer(sock)
            except PrivateAddress:
                sock.close()
                raise
        self.ledger.add(self)
        self.ledger.watchdog.attach(sock)
        return sock


class _TrackedPool:
    """Mixed into urllib3's pool classes: a kept-alive connection taken for a request is
    attached to the attempt's watch (a new one is attached as its socket connects)."""

    ledger: ConnectionLedger

    def _get_conn(self, timeout: float | None = None) -> Any:
        connection = super()._get_conn(timeout)  # type: ignore[misc]
        self.ledger.watchdog.attach(connection.sock)
        return connection


class ConnectionLedger:
    """The connections a Transport's pools open, so that a stop can cut those in flight.

    Blocking socket reads cannot be interrupted from another thread, but shutting the socket
    down ends them at once: that is how an interrupted batch leaves no thread behind.
    """

    def __init__(self, guard: Guard | None = None, watchdog: Watchdog | None = None) -> None:
        self.guard = guard
        self.watchdog = watchdog or Watchdog()
        self._connections: weakref.WeakSet[Any] = weakref.WeakSet()
        self._lock = threading.Lock()
        self._tracked: dict[tuple[type, bool], type] = {}
        self.pool_classes = self.tracked(DEFAULT_POOL_CLASSES)

    def tracked(
        self, pool_classes: Mapping[str, type], *, peer_check: bool = True
    ) -> dict[str, type]:
        """Pool classes like ``pool_classes`` (urllib3's or an adapter's own) whose
        connections are this ledger's."""
        return {scheme: self._track(pool, peer_check) for scheme, pool in pool_classes.items()}

    def _track(self, pool: type, peer_check: bool) -> type:
        if getattr(pool, "ledger", None) is self:
            return pool
        key = (pool, peer_check)
        if key not in self._tracked:
            connection = pool.ConnectionCls  # type: ignore[attr-defined]
            members = {"ledger": self, "peer_check": peer_check}
            tracked = type(f"Tracked{connection.__name__}", (_Tracked, connection), members)
            members = {"ledger": self, "ConnectionCls": tracked}
            self._tracked[key] = type(f"Tracked{pool.__name__}", (_TrackedPool, pool), members)
        return self._tracked[key]

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


def _tracking_proxies(make: Callable[..., Any], ledger: ConnectionLedger) -> Callable[..., Any]:
    """An adapter's ``proxy_manager_for`` whose managers' connections are ``ledger``'s (cut
    on a stop, watched for their attempt's end); the proxy's own address is not checked."""

    def proxy_manager_for(proxy: str, **kwargs: Any) -> Any:
        manager = make(proxy, **kwargs)
        classes = manager.pool_classes_by_scheme
        manager.pool_classes_by_scheme = ledger.tracked(classes, peer_check=False)
        return manager

    return proxy_manager_for


_LENT: weakref.WeakSet[HTTPAdapter] = weakref.WeakSet()
_LENT_LOCK = threading.Lock()


def fit_session(
    session: requests.Session, pool_size: int, ledger: ConnectionLedger
) -> Callable[[], None]:
    """Fit a session for one run; returns what puts it back as it was.

    Each of the session's HTTP adapters (once, however often it is mounted) gets, for the run,
    a pool manager of its own (made by the adapter's ``init_poolmanager``, so a subclass's TLS
    settings stay) with pools of at least ``pool_size`` connections (smaller would open and
    discard connections), whose connections enter the run's ``ledger`` (which cuts them on a
    stop, watches them for their attempt's end and checks their peer), and urllib3's retries
    off (the engine owns retries). The returned callable closes the run's connections and puts
    every attribute of each adapter back. An adapter serves one run at a time: lending it to
    a second one at once raises ValueError.
    """
    adapters = list(
        {id(a): a for a in session.adapters.values() if isinstance(a, HTTPAdapter)}.values()
    )
    with _LENT_LOCK:
        if any(adapter in _LENT for adapter in adapters):
            raise ValueError(
                "this requests.Session (or one of its adapters) is in use by another batchsync "
                "run; give each run its own session, or a factory of sessions"
            )
        _LENT.update(adapters)
    kept = [(adapter, dict(vars(adapter))) for adapter in adapters]
    for adapter in adapters:
        own = adapter.poolmanager
        adapter.max_retries = Retry(0, read=False)
        adapter.proxy_manager = {}
        connections = max(adapter._pool_connections, pool_size)
        maxsize = max(adapter._pool_maxsize, pool_size)
        adapter.init_poolmanager(connections, maxsize, block=adapter._pool_block)
        manager = adapter.poolmanager
        for name, value in own.connection_pool_kw.items():
            manager.connection_pool_kw.setdefault(name, value)
        manager.pool_classes_by_scheme = ledger.tracked(own.pool_classes_by_scheme)
        adapter.proxy_manager_for = _tracking_proxies(  # type: ignore[method-assign]
            adapter.proxy_manager_for, ledger
        )

    def restore() -> None:
        for adapter, state in reversed(kept):
            adapter.poolmanager.clear()
            for proxy in adapter.proxy_manager.values():
                proxy.clear()
            vars(adapter).clear()
            vars(adapter).update(state)
        with _LENT_LOCK:
            for adapter in adapters:
                _LENT.discard(adapter)

    return restore


# What a lent session's auth is shown to find what it sends: a request to nowhere in particular.
_AUTH_PROBE = "http://auth-probe.invalid/"


def lent_secrets(session: requests.Session, secrets: Secrets) -> frozenset[str]:
    """The secret values a caller's session holds, which its requests carry as an item's own
    would: its secret headers' (Authorization, Cookie, Proxy-Authorization, ``secret_headers``
    names), its secret ``params``', its proxies' userinfo, its cookies', and its ``auth``'s."""
    headers = {str(name): _text(value) for name, value in session.headers.items()}
    params = session.params if isinstance(session.params, Mapping) else None
    proxies = [value for value in (session.proxies or {}).values() if isinstance(value, str)]
    found = set(secrets.of_item(proxies, headers, params))
    found.update(f"{cookie.name}={cookie.value}" for cookie in session.cookies if cookie.value)
    found.update(auth_secrets(session.auth))
    return frozenset(found)


def auth_secrets(auth: object) -> set[str]:
    """What a session's ``auth`` holds and sends: a (user, password) pair, an auth's
    ``username`` and ``password`` (requests' Basic, Digest and proxy auths), and the header
    values it sets on a request (a custom AuthBase's token, however it writes it)."""
    if auth is None:
        return set()
    pair = auth if isinstance(auth, tuple) and len(auth) == 2 else None
    user = pair[0] if pair else getattr(auth, "username", None)
    password = pair[1] if pair else getattr(auth, "password", None)
    given = [_text(value) for value in (user, password) if isinstance(value, str | bytes)]
    found = set(given)
    if len(given) == 2:
        found.add(":".join(given))  # (what Basic auth sends, base64-encoded)
    if callable(auth):
        found.update(_sent_by(auth))
    return found


def _sent_by(auth: Callable[[requests.PreparedRequest], Any]) -> set[str]:
    """The header values ``auth`` sets on a probe request (none if it fails on one)."""
    probe = requests.Request("GET", _AUTH_PROBE).prepare()
    before = dict(probe.headers)
    try:
        applied = auth(probe)
    except Exception:  # (an auth that needs a real request: it is masked by shape only)
        return set()
    headers = getattr(applied, "headers", None) or {}
    return {
        _text(value)
        for name, value in headers.items()
        if isinstance(value, str | bytes) and before.get(name) != value
    }


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class Transport:
    """Sends prepared requests and reads their bodies, each attempt within a wall-clock bound.

    A ``requests.Session`` instance is shared by all workers (and left as it was when the run
    closes); a factory is called once per worker thread. Environment settings (proxies, CA
    bundle) are looked up once per origin instead of on every request, and still honoured;
    an explicit ``verify`` / ``cert`` wins over them and over the session's own.
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
        self._factory: Callable[[], requests.Session] | None = None
        self._shared: requests.Session | None = None
        self.ledger = ConnectionLedger(guard, Watchdog(clock))
        self._guard = guard
        self._pool_size = pool_size
        self._restores: list[Callable[[], None]] = []
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        # Each fitted session's jars of the run's cookies, one per origin (see cookies.py).
        self._keep_cookies = cookies
        self._cookie_jars: dict[int, OriginJars] = {}
        # Sessions batchsync made (its own, or a factory's) are closed with the run.
        self._owns_sessions = not isinstance(session, requests.Session)
        # (a Secrets of its own when none is given: a lent session's are learned into it)
        self._secrets = Secrets() if secrets is None else secrets
        if session is None:
            self._shared = self._fitted(requests.Session())
        elif isinstance(session, requests.Session):
            self._shared = self._fitted(session)
        else:
            self._factory = session
        self._fast = session is None
        self._lanes: dict[Origin, Lane] = {}
        self._local = threading.local()
        self._settings: dict[tuple[int, str], dict[str, Any]] = {}
        # True said in so many words means certifi's bundle, whatever the environment says.
        self._verify = DEFAULT_CA_BUNDLE_PATH if verify is True else verify
        self._cert = cert
        self._clock = clock

    @property
    def guard(self) -> Guard | None:
        return self._guard

    def _fitted(self, session: requests.Session) -> requests.Session:
        """``session``, fitted for this run once (a factory may hand out one session twice)."""
        with self._lock:
            if not any(session is fitted for fitted in self._sessions):
                self._restores.append(fit_session(session, self._pool_size, self.ledger))
                jars, restore = lend(session.cookies, keep=self._keep_cookies)
                self._restores.append(restore)
                self._cookie_jars[id(session)] = jars
                self._sessions.append(session)
                # (the caller's secrets, masked in every text from the run's first request on)
                self._secrets.learn(lent_secrets(session, self._secrets))
        return session

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
            session = self._fitted(made)
            self._local.session = session
        return session

    def abort(self) -> None:
        """Cut every connection, those in flight included: their attempts end at once."""
        self.ledger.abort()

    def close(self) -> None:
        """Close the run's connections, put every session back as it was, and close the
        sessions batchsync made; a caller's own session stays open."""
        self.ledger.watchdog.close()
        for restore in self._restores:
            restore()
        self._restores.clear()
        if self._owns_sessions:
            for session in self._sessions:
                session.close()
        self._sessions.clear()
        self._cookie_jars.clear()

    def _environment(self, session: requests.Session, url: str) -> dict[str, Any]:
        """proxies, verify and cert for a URL, as ``Session.request`` would merge them, but
        with an explicit ``verify`` / ``cert`` of the run winning over the environment."""
        parts = urlsplit(url)
        key = (id(session), f"{parts.scheme}://{parts.netloc}".lower())
        settings = self._settings.get(key)
        if settings is None:
            if len(self._settings) >= _MAX_CACHED_ORIGINS:
                self._settings.clear()
            merged = session.merge_environment_settings(url, {}, None, self._verify, self._cert)
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
        return (
            self._shared is not None
            and self._fast
            and HTTPAdapter.send is _ADAPTER_SEND
            and requests.Session.send is _SESSION_SEND
            and not self._has_cookies(self._shared)
        )

    def _has_cookies(self, session: requests.Session) -> bool:
        """Whether the session's jar, or the run's jars of its origins, hold anything
        (without taking a jar's lock)."""
        if session.cookies._cookies:  # type: ignore[attr-defined]
            return True
        jars = self._cookie_jars.get(id(session))
        return jars is not None and bool(jars.by_origin)

    def headers_with(self, *layers: Mapping[str, str | None] | None) -> Mapping[str, str]:
        """The session's default headers overlaid with ``layers``, as requests merges them."""
        merged: CaseInsensitiveDict[str | bytes | None] = CaseInsensitiveDict(
            self.session().headers
        )
        for layer in layers:
            merged.update(layer or {})
        return {name: value for name, value in merged.items() if isinstance(value, str)}

    def wire(self, method: str, url: str, headers: Mapping[str, str]) -> Wire | None:
        """The fast form of a bodiless GET/HEAD, or None when it must go the full requests
        way: a caller's session, a URL that requests would rewrite or add auth for (see
        ``lane_split``), a proxy or netrc entry for the host, cookies in the jar, or
        ``HTTPAdapter.send`` patched (by a mocking library that wants to see every request).
        ``headers`` are sent as given (see ``headers_with``)."""
        if not self.fast or method not in _FAST_METHODS:
            return None
        split = lane_split(url)
        if split is None:
            return None
        origin, target = split
        pool, host = self._lanes.get(origin) or self._lane(origin, url)
        if pool is None:
            return None
        return Wire(method, url, origin, host, target, headers, pool)

    def _lane(self, origin: Origin, url: str) -> Lane:
        """The urllib3 pool that serves an origin directly (None when it must not), and the
        origin's host key; looked up once per origin.

        The pool and its TLS settings are the ones ``HTTPAdapter.send`` would use: the same
        look-up and the same ``cert_verify`` (certifi unless told otherwise).
        """
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
            assert probe.url is not None
            pool = adapter.get_connection_with_tls_context(
                probe, settings["verify"], None, settings["cert"]
            )
            try:
                adapter.cert_verify(pool, probe.url, settings["verify"], settings["cert"])
            except OSError:  # (a CA bundle that is not there: each attempt says so, as requests)
                pool = None
        if len(self._lanes) >= _MAX_CACHED_ORIGINS:
            self._lanes.clear()
        lane = self._lanes[origin] = (pool, host_key(*origin))
        return lane

    def send(self, request: Outgoing, wall_end: float) -> Reply:
        """Send ``request``, following redirects, until a final response's headers arrive.

        Secret headers go only to the request's own host: a redirect elsewhere drops them.
        The caller must read or close the returned Reply, and call ``finish`` when the
        attempt is over.
        """
        try:
            if isinstance(request, Wire):
                return self._send_wire(request, wall_end)
            session = self.session()
            prepared = request.prepared
            if self._has_cookies(session):  # as fresh as the jar, as a new request would be
                prepared = self.prepare(request.request).prepared
            if request.auth is not None:
                prepared = request.auth(prepared)
            assert prepared.url is not None
            response = self._send_once(session, prepared, wall_end)
            return self._settle(session, prepared.url, response, wall_end)
        except Exception as exc:
            if self._ended(exc, wall_end):
                raise AttemptTimedOut(f"attempt timed out ({describe(exc)})") from exc
            raise

    def prepare(self, request: requests.Request) -> Recipe:
        """``request`` prepared by the session (headers merged, auth and cookies applied),
        with the redirect drain (see ``drain_redirect``)."""
        session = self.session()
        prepared = session.prepare_request(request)
        prepared.hooks["response"].insert(0, self.drain_redirect)
        jars = self._cookie_jars.get(id(session))
        if jars is not None:  # the run's cookies: each to its own origin only
            prepared.hooks["response"].insert(0, jars.keep)
            jars.fit(prepared, session.headers, request.headers)
        return Recipe(request, prepared)

    def finish(self) -> None:
        """This thread's attempt is over: its connection is no longer watched."""
        self.ledger.watchdog.disarm()

    def _ended(self, exc: Exception, wall_end: float) -> bool:
        """Whether ``exc`` is the attempt's end coming rather than a failure of its own: the
        watchdog cut its socket, so the read or write failed in whatever way that phase fails.
        (An AttemptTimedOut says so already.)"""
        return not isinstance(exc, AttemptTimedOut) and self._clock() >= wall_end

    def _send_once(
        self,
        session: requests.Session,
        request: requests.PreparedRequest,
        wall_end: float,
        redirects: int = 0,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """One request, no redirect followed; ``proxies`` (a redirect hop's) instead of the
        environment's for its URL."""
        assert request.url is not None
        settings = self._environment(session, request.url)
        if proxies is not None:
            settings = {**settings, "proxies": proxies}
        self.ledger.watchdog.arm(wall_end)
        try:
            return session.send(
                request,
                allow_redirects=False,
                stream=True,
                timeout=self._left(wall_end),
                **settings,
            )
        except UnicodeDecodeError as exc:  # requests decodes Location as UTF-8
            raise _unreadable_location(exc) from None
        except requests.HTTPError as exc:
            if exc.response is None:
                raise
            exc.response.close()  # (its body is not read: the connection goes)
            raise AnswerRefused(exc, exc.response, redirects) from exc

    def _send_wire(self, wire: Wire, wall_end: float) -> Reply:
        assert self._shared is not None  # (the fast lane is for batchsync's own session)
        if self._has_cookies(self._shared):  # cookies came since it was claimed
            return self.send(self._recipe(wire), wall_end)
        left = self._left(wall_end)
        self.ledger.watchdog.arm(wall_end)
        try:
            raw = wire.pool.urlopen(
                wire.method,
                wire.target,
                headers=wire.headers,
                retries=_NO_RETRIES,
                redirect=False,
                assert_same_host=False,
                preload_content=False,
                decode_content=False,
                timeout=left,
            )
        except ClosedPoolError:  # the pool manager dropped this origin's pool: ask again
            return self._reopened(wire, wall_end)
        if "set-cookie" in raw.headers or (
            raw.status in REDIRECT_STATI and "location" in raw.headers
        ):
            return self._handed_over(wire, raw, wall_end)
        return Reply(raw.status, raw.headers, raw, wire.url)

    def _reopened(self, wire: Wire, wall_end: float) -> Reply:
        """``wire`` sent again, on its origin's pool as the pool manager makes it anew (or the
        full requests way, when the origin has no fast lane now)."""
        self._lanes.pop(wire.origin, None)
        pool = self._lane(wire.origin, wire.url)[0]
        if pool is None:
            return self.send(self._recipe(wire), wall_end)
        wire.pool = pool
        return self._send_wire(wire, wall_end)

    def _handed_over(self, wire: Wire, raw: BaseHTTPResponse, wall_end: float) -> Reply:
        """The fast lane's answer ``raw`` settled by requests: cookies and redirects are the
        session's business."""
        session = self.session()
        prepared = self._recipe(wire).prepared
        adapter = session.get_adapter(wire.url)
        assert isinstance(adapter, HTTPAdapter)
        response = self.drain_redirect(adapter.build_response(prepared, raw))
        jars = self._cookie_jars.get(id(session))
        if jars is not None:  # (as its hook would, before the next hop is worked out)
            jars.keep(response)
        extract_cookies_to_jar(session.cookies, prepared, raw)
        # With yield_requests=True, resolve_redirects yields the next PreparedRequest.
        proxies = self._environment(session, wire.url)["proxies"]
        try:
            response._next = next(
                session.resolve_redirects(response, prepared, proxies=proxies, yield_requests=True),
                None,
            )
        except UnicodeDecodeError as exc:
            raise BadRedirect(f"cannot follow a redirect: {exc.reason} in its Location") from None
        return self._settle(session, wire.url, response, wall_end)

    def _recipe(self, wire: Wire) -> Recipe:
        """The request the fast-lane ``wire`` stands for, for the full requests way."""
        return self.prepare(requests.Request(wire.method, wire.url, headers=dict(wire.headers)))

    def drain_redirect(self, response: requests.Response, *args: Any, **kwargs: Any) -> Any:
        """A response hook, run before any other: reads a redirect's body within the
        attempt's end and ``CHUNK_BYTES``, for the hooks after it to see as the response's
        content (a larger one drops the connection, and they see none). requests would read
        it whole, however large or slow, to follow the redirect."""
        end = self.ledger.watchdog.end()
        if not response.is_redirect or end is None:
            return response
        reply = Reply(response.status_code, response.headers, response.raw, "", 0, response.close)
        body = b""
        # Past CHUNK_BYTES read_body closes it: the connection goes instead of the rest.
        with contextlib.suppress(BodyTooLarge):
            body = bytes(self.read_body(reply, end, CHUNK_BYTES, rearm=True))
        response._content = body
        response._content_consumed = True
        return response

    def _settle(
        self,
        session: requests.Session,
        first_url: str,
        response: requests.Response,
        wall_end: float,
    ) -> Reply:
        """Follow redirects from ``response`` to the final one.

        Each hop goes through the proxies requests would use for it: the first request's,
        with the environment's for the new URL added (``Session.rebuild_proxies``), so a hop
        to a NO_PROXY host keeps the first request's proxy, as in requests.
        """
        hops = 0
        proxies = self._environment(session, first_url)["proxies"]
        while response.is_redirect and response.next is not None:
            follow = response.next
            response.close()
            hops += 1
            proxies = self._hop(session, first_url, follow, hops, proxies)
            response = self._send_once(session, follow, wall_end, hops, proxies)
        return Reply(
            response.status_code,
            response.headers,
            response.raw,
            response.url or first_url,
            hops,
            response.close,
            response.content if response._content_consumed else None,
        )

    def _hop(
        self,
        session: requests.Session,
        first_url: str,
        follow: requests.PreparedRequest,
        hops: int,
        proxies: dict[str, str],
    ) -> dict[str, str]:
        """The redirect ``follow`` (hop ``hops`` from ``first_url``) checked and made ready:
        refused past the session's limit or to a guarded host, the run's secret headers dropped
        when it leaves the origin; returns the proxies it goes through."""
        if hops > session.max_redirects:
            raise requests.TooManyRedirects(f"more than {session.max_redirects} redirects")
        assert follow.url is not None
        if self._guard is not None:
            self._guard.check(urlsplit(follow.url).hostname or "")
        # requests has already dealt with Authorization, Cookie and Proxy-Authorization
        # for the new URL; the run's own secret headers are batchsync's to drop.
        if session.should_strip_auth(first_url, follow.url):
            leave_origin(follow.headers, self._secrets.is_declared, session.headers)
        proxies = resolve_proxies(follow, proxies, session.trust_env)
        if not proxy_reads_headers(follow.url, proxies):  # (the origin would read it)
            follow.headers.pop("Proxy-Authorization", None)
        return proxies

    def read_body(
        self, reply: Reply, wall_end: float, max_bytes: int, *, rearm: bool = False
    ) -> bytearray:
        """The decompressed body, read in chunks; refused past ``max_bytes`` or ``wall_end``.

        Each read waits at most for the time the attempt has left (give or take the slack), so
        a server that trickles or stalls its body cannot hold the attempt past its bound. The
        connection goes back to the pool only when the watchdog has not cut it; ``rearm``
        keeps watching the attempt after that (it goes on: a redirect's next hop).
        """
        raw = reply.raw
        # (a look-up first: a missing header costs get() a KeyError, caught, on every answer)
        encoded = "Content-Encoding" in reply.headers and bool(reply.headers["Content-Encoding"])
        # Without an encoding, the declared length is the body's: check it, and stop reading
        # once it has all come.
        declared = None if encoded else declared_length(raw, reply.headers)
        if declared is not None and declared > max_bytes:
            reply.close()
            raise BodyTooLarge(f"body of {declared} bytes is over max_bytes {max_bytes}")
        try:
            if reply.content is None:
                body = self._read_stream(raw, wall_end, max_bytes, encoded, declared is not None)
            else:  # a hook read it all, as requests reads it
                body = _held_body(reply.content, max_bytes)
        except BaseException as exc:
            reply.close()
            self._raise_if_ended(exc, wall_end)
            raise
        watchdog = self.ledger.watchdog
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
        """The body read from ``raw`` in chunks (decoded when ``encoded``), each read bounded
        by the attempt's end; done when the stream ends or, ``counted``, when the declared
        length has all come."""
        sock = getattr(getattr(raw, "connection", None), "sock", None)
        body = bytearray()
        while True:
            left = self._left(wall_end)
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

    def _raise_if_ended(self, exc: BaseException, wall_end: float) -> None:
        """An AttemptTimedOut for ``exc`` when it is the attempt's end coming (see ``_ended``);
        a body refused as too large, or an interrupt, stands as it is."""
        if isinstance(exc, BodyTooLarge) or not isinstance(exc, Exception):
            return
        if self._ended(exc, wall_end):
            raise AttemptTimedOut(f"attempt timed out ({describe(exc)})") from exc

    def discard(self, reply: Reply, wall_end: float) -> None:
        """Drop a response we do not need, keeping its connection when the body is small."""
        # On any failure read_body has closed the response; nothing of it is kept.
        with contextlib.suppress(
            BodyTooLarge, OSError, requests.RequestException, urllib3.exceptions.HTTPError
        ):
            self.read_body(reply, wall_end, CHUNK_BYTES)
