"""The fast lane: a bodiless GET or HEAD of batchsync's own session sent straight to its
origin's urllib3 pool, as requests would send it, without requests' per-request work.

It takes only what it sends exactly as requests would (see ``lane_split`` and
``FastLane.wire``); an answer that sets a cookie or redirects is handed to the session lane,
which owns cookies, redirects and proxies.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import requests
from requests.adapters import HTTPAdapter
from requests.models import REDIRECT_STATI
from requests.utils import get_netrc_auth, select_proxy
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.exceptions import ClosedPoolError
from urllib3.util import Retry

from ..core.kept import Kept
from .exchange import BodyReader, Origin, Reply, Wire
from .internals import QUICK_HEADER_DICT
from .origins import host_key
from .session import SessionLane

# Per-origin look-ups kept at most; past that the cache starts afresh (entries are re-derived
# on demand, so forgetting one costs a look-up, never a request).
_MAX_CACHED_ORIGINS = 4096

# An origin's way in: the urllib3 pool that serves it (None: the requests way) and its host key.
OriginPool = tuple[HTTPConnectionPool | None, str]

# Bodiless methods the fast lane sends; everything else goes the full requests way.
_FAST_METHODS = frozenset({"GET", "HEAD"})
# What urllib3 makes of retries=False, redirect=False on every request, made once.
_NO_RETRIES = Retry(False, redirect=False)

# requests' own sends; when something has patched one (a mocking library, instrumentation
# that adds trace headers), the fast lane stands aside so that it sees every request.
_ADAPTER_SEND = HTTPAdapter.send
_SESSION_SEND = requests.Session.send


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


class FastLane:
    """Sends ``Wire``s straight to their origin's pool (a ``Lane``: see ``transport``); what
    the requests way must settle goes to ``sessions``."""

    def __init__(self, sessions: SessionLane, reader: BodyReader) -> None:
        assert sessions.shared is not None  # (the fast lane is for batchsync's own session)
        self._sessions = sessions
        self._session = sessions.shared
        self._reader = reader
        self._watchdog = reader.watchdog
        self._pools: Kept[Origin, OriginPool] = Kept(_MAX_CACHED_ORIGINS)

    @property
    def open(self) -> bool:
        """Whether requests may take the fast lane now (see ``wire``)."""
        return (
            HTTPAdapter.send is _ADAPTER_SEND
            and requests.Session.send is _SESSION_SEND
            and not self._sessions.has_cookies(self._session)
        )

    def wire(self, method: str, url: str, headers: Mapping[str, str]) -> Wire | None:
        """The fast form of a bodiless GET/HEAD, or None when it must go the full requests
        way: a URL that requests would rewrite or add auth for (see ``lane_split``), a proxy
        or netrc entry for the host, cookies in the jar, or requests' sends patched. ``headers``
        are sent as given (see ``SessionLane.headers_with``)."""
        if not self.open or method not in _FAST_METHODS:
            return None
        split = lane_split(url)
        if split is None:
            return None
        origin, target = split
        pool, host = self._pools.get(origin) or self._pool(origin, url)
        if pool is None:
            return None
        return Wire(method, url, origin, host, target, headers, pool)

    def _pool(self, origin: Origin, url: str) -> OriginPool:
        """The urllib3 pool that serves an origin directly (None when it must not) and its host
        key, once per origin: the pool and TLS settings ``HTTPAdapter.send`` would use."""
        session = self._session
        settings = self._sessions.environment(session, url)
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
        return self._pools.keep(origin, (pool, host_key(*origin)))

    def send(self, wire: Wire, wall_end: float) -> Reply:
        """Send ``wire`` on its origin's pool until its answer's headers arrive; an answer
        that sets a cookie or redirects is the session lane's to settle, and so is the whole
        request when cookies came since it was made."""
        if self._sessions.has_cookies(self._session):  # cookies came since it was claimed
            return self._sessions.send(self._sessions.recipe(wire), wall_end)
        left = self._reader.left(wall_end)
        self._watchdog.arm(wall_end)
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
        headers = raw.headers  # (urllib3's keeps the names in lower case: looked up at once)
        names = headers._container if type(headers) is QUICK_HEADER_DICT else headers
        if "set-cookie" in names or (raw.status in REDIRECT_STATI and "location" in names):
            return self._sessions.take_over(wire, raw, wall_end)
        return Reply(raw.status, raw.headers, raw, wire.url)

    def _reopened(self, wire: Wire, wall_end: float) -> Reply:
        """``wire`` sent again on its origin's pool made anew (or the requests way, if none is)."""
        self._pools.forget(wire.origin)
        pool = self._pool(wire.origin, wire.url)[0]
        if pool is None:
            return self._sessions.send(self._sessions.recipe(wire), wall_end)
        wire.pool = pool
        return self.send(wire, wall_end)
