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
from typing import Any

import requests
from requests.adapters import HTTPAdapter
from urllib3.connection import HTTPConnection
from urllib3.poolmanager import pool_classes_by_scheme as DEFAULT_POOL_CLASSES
from urllib3.util import Retry

from .guard import Guard, PrivateAddress
from .headers import QUICK_GETRESPONSE, URLLIB3_GETRESPONSE, QuickHeadersResponse
from .watchdog import Watchdog

# The header-line pieces a connection's ``putheader`` stands on, as found at import.
_URLLIB3_PUTHEADER = HTTPConnection.putheader
_STDLIB_PUTHEADER = http.client.HTTPConnection.putheader
_STDLIB_OUTPUT = http.client.HTTPConnection._output  # type: ignore[attr-defined]
# http.client's state of a connection between putrequest and endheaders.
_REQUEST_STARTED: str = http.client._CS_REQ_STARTED  # type: ignore[attr-defined]
# Header lines a run keeps made at most; past that it starts afresh (a line is made again on
# demand, so forgetting one costs its checks, never a byte).
_MAX_HEADER_LINES = 1024


class _Tracked:
    """Mixed into urllib3's connection classes: a connection enters its ledger as its socket
    connects, has its peer checked before any byte (a TLS ClientHello included) is sent, is
    watched for its attempt's end, reads its responses' headers the quick way, and makes each
    distinct header line once a run."""

    ledger: ConnectionLedger
    # The connection class it is mixed into (whose ``putheader`` the quick one stands for).
    connection_class: type[HTTPConnection]
    # False for the connections to a proxy: the proxy's own address is the caller's choice.
    peer_check = True
    response_class = QuickHeadersResponse

    def putheader(self, header: str, *values: str) -> None:
        """urllib3's and http.client's ``putheader``, each distinct (name, values) line
        checked and encoded once a run, and its bytes appended as ``_output`` appends them.

        The line depends on the name and values alone (both text), so the bytes are the same;
        a call that fails, or appends no line (urllib3's SKIP_HEADER), is never kept. Nothing
        is kept or reused while a ``putheader`` or ``_output`` is not the one found at import
        (a patch, or the connection class's own)."""
        lines = self.ledger.header_lines
        key = (header, values)
        try:
            line = lines.get(key)
        except TypeError:  # (an unhashable value: http.client says what it makes of it)
            line = None
        connection = self.connection_class
        quick = (  # (the pieces found at import: no patch, no connection class's own)
            connection.putheader is _URLLIB3_PUTHEADER
            and http.client.HTTPConnection.putheader is _STDLIB_PUTHEADER
            and connection._output is _STDLIB_OUTPUT  # type: ignore[attr-defined]
        )
        if line is not None and quick and self._HTTPConnection__state == _REQUEST_STARTED:  # type: ignore[attr-defined]
            self._buffer.append(line)  # type: ignore[attr-defined]
            return
        buffer: list[bytes] = self._buffer  # type: ignore[attr-defined]
        before = len(buffer)
        super().putheader(header, *values)  # type: ignore[misc]
        if quick:
            _keep_line(lines, key, buffer[before:])

    def getresponse(self) -> Any:
        """urllib3's ``getresponse``, without its checks and copy of a header block read the
        quick way (see ``headers.QUICK_GETRESPONSE``), while the connection class's own is
        urllib3's as found at import."""
        if (
            QUICK_GETRESPONSE is None
            or self.connection_class.getresponse is not URLLIB3_GETRESPONSE
        ):
            return super().getresponse()  # type: ignore[misc]
        return QUICK_GETRESPONSE(self)  # type: ignore[arg-type]

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


def _keep_line(
    lines: dict[tuple[str, tuple[str, ...]], bytes],
    key: tuple[str, tuple[str, ...]],
    added: list[bytes],
) -> None:
    """Keep the line a ``putheader`` of ``key`` (name, values) appended: only when it appended
    exactly one, and its name and values are all text."""
    header, values = key
    if len(added) != 1 or type(header) is not str or any(type(v) is not str for v in values):
        return
    if len(lines) >= _MAX_HEADER_LINES:
        lines.clear()
    lines[key] = added[0]


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
        # Each distinct header line its connections sent, made once (see _Tracked.putheader);
        # kept no longer than the run, as the requests that carry them.
        self.header_lines: dict[tuple[str, tuple[str, ...]], bytes] = {}

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
            members = {"ledger": self, "peer_check": peer_check, "connection_class": connection}
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
