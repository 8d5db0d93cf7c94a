"""No phase of an attempt escapes its end: connect, TLS handshake, send, status line, headers,
body and the bodies of redirects, each against a server that keeps it busy just inside every
socket timeout. And what hostile answers end as."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from batchsync import fetch_all
from tests.mockserver import MockServerProcess

pytestmark = pytest.mark.integration

# Generous: the watchdog looks every 50 ms, and the machine may be loaded.
SLACK = 1.5


class Dribbler:
    """A TCP server that reads what it is sent and answers ``reply`` one byte every
    ``interval`` seconds (never all of it within any socket timeout of a second)."""

    def __init__(self, reply: bytes, interval: float = 0.1, read_request: bool = True) -> None:
        self._reply = reply
        self._interval = interval
        self._read_request = read_request
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        self._listener.settimeout(0.1)
        while not self._stop.is_set():
            try:
                connection, _ = self._listener.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._dribble, args=(connection,), daemon=True).start()

    def _dribble(self, connection: socket.socket) -> None:
        with connection, contextlib.suppress(OSError):
            if self._read_request:
                connection.settimeout(5)
                connection.recv(65536)
            for byte in self._reply:
                if self._stop.wait(self._interval):
                    return
                connection.sendall(bytes([byte]))

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._listener.close()


@contextlib.contextmanager
def dribbler(reply: bytes, **options: Any) -> Iterator[Dribbler]:
    server = Dribbler(reply, **options)
    try:
        yield server
    finally:
        server.close()


def timed(items: list[Any], **options: Any) -> tuple[float, Any]:
    started = time.monotonic()
    rs = fetch_all(items, attempts=1, **options)
    return time.monotonic() - started, rs


def both_lanes(url: str) -> list[Any]:
    """The URL as a plain item (the fast lane) and with params (the requests path)."""
    return [url, {"url": url, "params": {"lane": "requests"}}]


STATUS_AND_HEADERS = (
    b"HTTP/1.1 200 OK\r\n" + b"X-Slow: 1\r\n" * 100 + b"Content-Length: 2\r\n\r\n{}"
)


def test_a_trickled_status_line_and_headers_end_at_the_timeout() -> None:
    with dribbler(STATUS_AND_HEADERS) as server:
        took, rs = timed(both_lanes(f"http://127.0.0.1:{server.port}/"), timeout=1, concurrency=2)
    assert [r.error_kind for r in rs] == ["timeout", "timeout"]
    assert took < 1 + SLACK
    assert all(r.attempt_log[0].elapsed < 1 + SLACK for r in rs)


def test_a_trickled_tls_handshake_ends_at_the_timeout() -> None:
    # A TLS record header announcing a long ServerHello, then its bytes one at a time.
    record = b"\x16\x03\x03\x40\x00" + b"\x02" * 200
    with dribbler(record, read_request=False) as server:
        took, rs = timed(both_lanes(f"https://127.0.0.1:{server.port}/"), timeout=1, concurrency=2)
    assert [r.error_kind for r in rs] == ["timeout", "timeout"]
    assert took < 1 + SLACK


def test_header_lines_one_every_tenth_of_a_second_hold_nothing_past_the_deadline(
    server: MockServerProcess,
) -> None:
    url = f"{server.url}/trickle-headers?interval=0.1&lines=60"
    took, rs = timed(both_lanes(url), timeout=1, budget=2, deadline=2, concurrency=2)
    assert took < 2 + SLACK
    assert all(not r.ok and r.error_kind in ("timeout", "deadline") for r in rs)


def test_a_request_body_the_server_never_reads_ends_as_a_timeout(
    server: MockServerProcess,
) -> None:
    item = {
        "url": f"{server.url}/stall-upload?hold=30",
        "method": "PUT",
        "data": "x" * (16 * 2**20),  # more than the socket buffers hold
    }
    took, rs = timed([item], timeout=1)
    assert (rs[0].error_kind, rs[0].attempts) == ("timeout", 1)
    assert took < 1 + SLACK


def test_a_connect_that_hangs_ends_at_the_timeout() -> None:
    # A listener whose accept queue is full: further connects hang in SYN-SENT.
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(3):
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        took, rs = timed([f"http://127.0.0.1:{port}/"], timeout=1)
    finally:
        for filler in fillers:
            filler.close()
        listener.close()
    assert took < 1 + SLACK
    assert rs[0].error_kind in ("timeout", "connection")  # some kernels refuse at once


@pytest.mark.parametrize("lane", ["fast", "requests"])
def test_a_trickled_redirect_body_ends_at_the_timeout(server: MockServerProcess, lane: str) -> None:
    url = f"{server.url}/redirect-body?interval=0.05"
    item = both_lanes(url)[0 if lane == "fast" else 1]
    started = time.monotonic()
    rs = fetch_all([item], timeout=2, budget=4)
    took = time.monotonic() - started
    assert not rs[0].ok
    assert rs[0].error_kind in ("timeout", "budget")
    assert rs[0].attempt_log[0].elapsed < 2 + SLACK
    assert took < 4 + SLACK


# Peak RSS from VmHWM, which starts afresh at exec (ru_maxrss would count the memory of the
# test process that forked this one).
RSS_PROBE = """
import json, re, sys
from pathlib import Path
from batchsync import fetch_all
url = sys.argv[1]
rs = fetch_all([url, {"url": url, "params": {"lane": "requests"}}], attempts=1,
               max_bytes=100_000, concurrency=2, timeout=30)
peak = int(re.search(r"VmHWM:\\s+(\\d+)", Path("/proc/self/status").read_text())[1])
print(json.dumps({"results": [[r.ok, r.redirects, r.error] for r in rs],
                  "peak_rss_mib": peak / 1024}))
"""


def test_a_huge_redirect_body_is_dropped_not_read(server: MockServerProcess) -> None:
    url = f"{server.url}/redirect-body?mb=300&to={server.url}/ok/after-huge-redirect"
    probe = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, url],
        capture_output=True, text=True, timeout=120, check=True,
    )  # fmt: skip
    report = json.loads(probe.stdout)
    assert report["results"] == [[True, 1, None], [True, 1, None]]
    assert report["peak_rss_mib"] < 100


def test_hostile_answers_end_as_what_they_are(server: MockServerProcess) -> None:
    items = [
        *both_lanes(f"{server.url}/bad-location"),
        f"{server.url}/deep?depth=100000",
        {"url": f"{server.url}/ok", "headers": {"X-Name": "price in €"}},
        {"url": f"{server.url}/ok", "headers": {"X-Split": "a\r\nInjected: yes"}},
        {"url": f"{server.url}/ok", "headers": {"X-Nul": "a\x00b"}},
    ]
    rs = fetch_all(items, attempts=3)
    kinds = [(r.error_kind, r.attempts) for r in rs]
    assert kinds == [
        ("redirect", 1),
        ("redirect", 1),
        ("invalid_body", 1),
        ("invalid_request", 0),
        ("invalid_request", 0),
        ("invalid_request", 0),
    ]
    assert "X-Name" in (rs[3].error or "") and "€" not in (rs[3].error or "")
    assert "Injected" not in (rs[4].error or "")
    assert server.count("/ok") == 0  # none of the bad headers was sent


def test_a_header_the_cli_cannot_send_is_a_usage_error(tmp_path: Any) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "batchsync", "-", "-H", "Authorization: Bearer S\r\nInjected: y"],
        input="http://127.0.0.1:1/\n", capture_output=True, text=True, timeout=60,
        cwd=tmp_path, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Bearer" not in done.stderr and "Injected" not in done.stderr
    assert not (tmp_path / "batch-results.jsonl").exists()


def test_a_trickling_proxy_is_cut_at_the_timeout(monkeypatch: pytest.MonkeyPatch) -> None:
    """Connections to a proxy are watched like any other."""
    with dribbler(STATUS_AND_HEADERS) as proxy:
        for name in ("NO_PROXY", "no_proxy"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.port}")
        took, rs = timed(["http://127.0.0.1:1/via-proxy"], timeout=1)
    assert (rs[0].error_kind, rs[0].attempts) == ("timeout", 1)
    assert took < 1 + SLACK


@pytest.mark.parametrize("lane", ["fast", "requests"])
def test_a_kept_alive_connection_is_watched_too(server: MockServerProcess, lane: str) -> None:
    """The second request reuses the first one's connection, then its headers trickle."""
    urls = [f"{server.url}/ok/kept-alive", f"{server.url}/trickle-headers?interval=0.1&lines=60"]
    items = urls if lane == "fast" else [{"url": url, "params": {"a": "1"}} for url in urls]
    started = time.monotonic()
    rs = fetch_all(items, attempts=1, timeout=1, concurrency=1)
    assert [r.error_kind for r in rs] == [None, "timeout"]
    assert time.monotonic() - started < 1 + SLACK
