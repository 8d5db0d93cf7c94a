"""The run's connections: every one a Transport's pools open is in its ledger (cut on a stop),
watched for its attempt's end, and checked for its peer before its first byte; a caller's
session is fitted for the run to open only such connections, and put back as it was after.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.poolmanager import pool_classes_by_scheme as DEFAULT_POOL_CLASSES
from urllib3.util import Retry

from ..core.kept import Kept
from .guard import Guard, PrivateAddress
from .headers import QUICK_GETRESPONSE, QuickHeadersResponse
from .internals import (
    HEADER_LINES_KEPT,
    REQUEST_STARTED,
    STDLIB_OUTPUT,
    URLLIB3_GETRESPONSE,
    ConnectionHooks,
    PoolHooks,
    getresponse_names_unchanged,
    stock_header_lines,
)
from .watchdog import Watchdog

if TYPE_CHECKING:
    from .internals import StdlibConnection

# The header-line pieces a connection's ``putheader`` stands on, as found at import.
_URLLIB3_PUTHEADER: object = HTTPConnection.putheader
_STDLIB_PUTHEADER = http.client.HTTPConnection.putheader
# Header lines a run keeps made at most, and the longest it keeps; past the count it starts
# afresh (a line is made again on demand, so forgetting one costs its checks, never a byte).
_MAX_HEADER_LINES = 1024
_MAX_KEPT_LINE = 256
# The fewest connection references the ledger holds before it drops those of closed ones.
_PRUNE_AT_LEAST = 64


class _Tracked(ConnectionHooks):
    """Mixed into urllib3's connection classes: a connection enters its ledger as its socket
    connects, has its peer checked before any byte (a TLS ClientHello too) is sent, is watched
    for its attempt's end, reads headers the quick way, makes each header line once a run."""

    ledger: ConnectionLedger
    # The connection class it is mixed into (whose ``putheader`` the quick one stands for).
    connection_class: type[StdlibConnection]
    # Whether that class makes its lines the stock way (``internals.stock_header_lines``).
    keeps_lines: bool
    # False for the connections to a proxy: the proxy's own address is the caller's choice.
    peer_check = True
    response_class = QuickHeadersResponse

    def putheader(self, header: str, *values: str) -> None:
        """urllib3's and http.client's ``putheader``, each distinct short line of one text value
        made once a run: the same bytes while the class makes lines the stock way
        (``keeps_lines``) and neither ``putheader`` nor ``_output`` is patched. A call that fails
        or appends no line (urllib3's SKIP_HEADER) is never kept, nor are bytes values (compared
        with text, they warn under ``python -b``)."""
        if not (
            self.keeps_lines
            and type(header) is str
            and len(values) == 1
            and type(values[0]) is str
            and self.connection_class.putheader is _URLLIB3_PUTHEADER
            and http.client.HTTPConnection.putheader is _STDLIB_PUTHEADER
            and self.connection_class._output is STDLIB_OUTPUT
        ):
            super().putheader(header, *values)
            return
        lines = self.ledger.header_lines
        key = (header, values[0])
        line = lines.get(key)
        buffer = self._buffer
        if line is not None and self._HTTPConnection__state == REQUEST_STARTED:
            buffer.append(line)
            return
        before = len(buffer)
        super().putheader(header, *values)
        # (kept when it is one line of at most _MAX_KEPT_LINE bytes: long unique values keep none)
        added = buffer[before:]
        if len(added) == 1 and len(added[0]) <= _MAX_KEPT_LINE:
            lines.keep(key, added[0])

    def getresponse(self) -> Any:
        """urllib3's ``getresponse``, without its checks and copy of a header block read the
        quick way (``headers.QUICK_GETRESPONSE``), while the class's own is urllib3's at import."""
        if (
            QUICK_GETRESPONSE is None
            or self.connection_class.getresponse is not URLLIB3_GETRESPONSE
            or not getresponse_names_unchanged()
        ):
            return super().getresponse()
        return QUICK_GETRESPONSE(self)

    def connected(self, sock: socket.socket) -> None:
        guard = self.ledger.guard
        if guard is not None and self.peer_check:
            try:
                guard.check_peer(sock)
            except PrivateAddress:
                sock.close()
                raise
        self.ledger.add(self)
        self.ledger.watchdog.attach(sock)


class ConnectionLedger:
    """The connections a Transport's pools open, so that a stop can cut those in flight.

    Blocking socket reads cannot be interrupted from another thread, but shutting the socket
    down ends them at once: that is how an interrupted batch leaves no thread behind.
    """

    def __init__(self, guard: Guard | None = None, watchdog: Watchdog | None = None) -> None:
        self.guard = guard
        self.watchdog = watchdog or Watchdog()
        # Weak references kept under the lock and pruned by ``add``, not a WeakSet: a WeakSet
        # drops an entry from whichever thread collects it, without this lock, which on a
        # free-threaded build can change the set while ``abort`` copies it.
        self._connections: list[weakref.ref[Any]] = []
        self._prune_at = _PRUNE_AT_LEAST
        self._lock = threading.Lock()
        self._tracked: dict[tuple[type, bool], type] = {}
        self.pool_classes = self.tracked(DEFAULT_POOL_CLASSES)
        # Each distinct header line its connections sent, made once (see _Tracked.putheader),
        # by its name and value; kept no longer than the run, as the requests that carry them.
        self.header_lines: Kept[tuple[str, str], bytes] = Kept(_MAX_HEADER_LINES)

    def tracked(
        self, pool_classes: Mapping[str, type], *, peer_check: bool = True
    ) -> dict[str, type]:
        """``pool_classes`` (urllib3's or an adapter's) made to open this ledger's connections."""
        return {scheme: self._track(pool, peer_check) for scheme, pool in pool_classes.items()}

    def _track(self, pool: type[HTTPConnectionPool], peer_check: bool) -> type:
        if getattr(pool, "ledger", None) is self:
            return pool
        key = (pool, peer_check)
        if key not in self._tracked:
            connection = pool.ConnectionCls
            stock = (HTTPConnection, http.client.HTTPConnection)
            members = {
                "ledger": self,
                "peer_check": peer_check,
                "connection_class": connection,
                "keeps_lines": HEADER_LINES_KEPT and stock_header_lines(connection, stock),
            }
            tracked = type(f"Tracked{connection.__name__}", (_Tracked, connection), members)
            # (a kept-alive connection taken for a request is attached to the attempt's watch,
            # as a new one is as its socket connects)
            members = {"ledger": self, "ConnectionCls": tracked, "taken": self.watchdog.attach}
            self._tracked[key] = type(f"Tracked{pool.__name__}", (PoolHooks, pool), members)
        return self._tracked[key]

    def add(self, connection: object) -> None:
        with self._lock:
            self._connections.append(weakref.ref(connection))
            if len(self._connections) >= self._prune_at:  # (the list at most twice the live)
                self._connections = [ref for ref in self._connections if ref() is not None]
                self._prune_at = max(_PRUNE_AT_LEAST, 2 * len(self._connections))

    def abort(self) -> None:
        """Shut down every open connection's socket."""
        with self._lock:
            connections = [c for ref in self._connections if (c := ref()) is not None]
        for connection in connections:
            sock = getattr(connection, "sock", None)
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)


def _tracking_proxies(make: Callable[..., Any], ledger: ConnectionLedger) -> Callable[..., Any]:
    """An adapter's ``proxy_manager_for`` whose managers' connections are ``ledger``'s (cut
    on a stop, watched for their attempt's end); the proxy's own address is not checked."""

    def proxy_manager_for(proxy: str, **kwargs: Any) -> Any:
        manager = make(proxy, **kwargs)
        classes = manager.pool_classes_by_scheme
        manager.pool_classes_by_scheme = ledger.tracked(classes, peer_check=False)
        return manager

    return proxy_manager_for


# (never iterated, only tested and changed: an entry a collection drops from another thread, as
# a WeakSet does, cannot disturb a look-up, on a free-threaded build either)
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
        vars(adapter)["proxy_manager_for"] = _tracking_proxies(adapter.proxy_manager_for, ledger)

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
