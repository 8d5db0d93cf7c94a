"""A local fault-injecting HTTP/1.1 keep-alive API for tests, the demo and by-hand experiments.

    python scripts/mock_server.py --port 8788      # port 0 (default) picks a free one

It prints ``listening on http://127.0.0.1:PORT`` once it accepts connections. Paths:

    /ok[/anything]?delay=S           200 JSON {"path": ..., "ok": true}, after S seconds
    /slow[/anything]?delay=S         the same, default delay 2 s
    /429-once/KEY?retry_after=N      first request per KEY: 429, Retry-After: N seconds; then 200
    /429-date/KEY?retry_after=N      the same with Retry-After as an HTTP-date N seconds ahead
    /503[/anything]                  always 503
    /404[/anything]                  always 404
    /broken-json                     200 with a body that is not JSON
    /retry-after-60                  always 429 with Retry-After: 60
    /trickle?interval=S&bytes=N      200 headers at once, then one body byte every S seconds
    /huge?mb=N&gzip=1&chunked=1      200 with an N MiB body: gzip-compressed (gzip=1), or
                                     without a Content-Length (chunked=1)
    /text, /bytes                    200 text/plain UTF-8, 200 application/octet-stream
    /echo                            200 JSON of the request: method, path, query, headers, body
    /redirect?to=URL&code=302        a redirect to URL
    /stats                           JSON: requests per target, peak concurrency, connections
    /stats/reset                     clear the stats

Every path except /stats counts towards the stats: ``counts`` (per path with query),
``requests``, ``peak_concurrency`` (requests being handled at once) and ``connections``
(TCP connections that carried at least one of those requests).
"""

from __future__ import annotations

import argparse
import email.utils
import functools
import json
import sys
import threading
import time
import zlib
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

MIB = 2**20


class Stats:
    """What the server saw, kept under one lock."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            self.counts: Counter[str] = Counter()
            self.in_flight = 0
            self.peak = 0
            self.connections = 0
            self.seen_once: set[str] = set()

    def connected(self) -> None:
        with self._lock:
            self.connections += 1

    def begin(self, target: str) -> None:
        with self._lock:
            self.counts[target] += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)

    def end(self) -> None:
        with self._lock:
            self.in_flight -= 1

    def first_time(self, key: str) -> bool:
        with self._lock:
            if key in self.seen_once:
                return False
            self.seen_once.add(key)
            return True

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "counts": dict(self.counts),
                "requests": sum(self.counts.values()),
                "peak_concurrency": self.peak,
                "in_flight": self.in_flight,
                "connections": self.connections,
            }


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: MockServer

    def setup(self) -> None:
        super().setup()
        self.counted_connection = False

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the stats endpoint is the log."""

    def do_GET(self) -> None:
        self._handle()

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_GET

    def _handle(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if path == "/stats":
            self._json(200, self.server.stats.snapshot())
            return
        if path == "/stats/reset":
            self.server.stats.reset()
            self._json(200, {"reset": True})
            return
        stats = self.server.stats
        if not self.counted_connection:
            self.counted_connection = True
            stats.connected()
        stats.begin(self.path)
        try:
            self._route(path, query, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            stats.end()

    def _route(self, path: str, query: dict[str, str], body: bytes) -> None:
        head = "/" + path.strip("/").split("/", 1)[0]
        delay = float(query.get("delay", 2.0 if head == "/slow" else 0.0))
        if delay:
            time.sleep(delay)
        if head in ("/ok", "/slow"):
            self._json(200, {"path": path, "ok": True})
        elif head in ("/429-once", "/429-date"):
            wait = float(query.get("retry_after", "1"))
            if self.server.stats.first_time(path):
                when = (
                    email.utils.formatdate(time.time() + wait, usegmt=True)
                    if head == "/429-date"
                    else f"{wait:g}"
                )
                self._json(429, {"error": "slow down"}, {"Retry-After": when})
            else:
                self._json(200, {"path": path, "ok": True})
        elif head == "/503":
            extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self._json(503, {"error": "unavailable"}, extra)
        elif head == "/404":
            self._json(404, {"error": "not found"})
        elif head == "/broken-json":
            self._send(200, b'{"truncated": ', "application/json")
        elif head == "/retry-after-60":
            self._json(429, {"error": "slow down"}, {"Retry-After": "60"})
        elif head == "/trickle":
            self._trickle(float(query.get("interval", "0.2")), int(query.get("bytes", "50")))
        elif head == "/huge":
            self._huge(
                int(query.get("mb", "256")), query.get("gzip") == "1", query.get("chunked") == "1"
            )
        elif head == "/text":
            self._send(200, "héllo wörld".encode(), "text/plain; charset=utf-8")
        elif head == "/bytes":
            self._send(200, bytes(range(256)), "application/octet-stream")
        elif head == "/echo":
            self._json(
                200,
                {
                    "method": self.command,
                    "path": path,
                    "query": query,
                    "headers": dict(self.headers.items()),
                    "body": body.decode("utf-8", errors="replace"),
                },
            )
        elif head == "/redirect":
            code = int(query.get("code", "302"))
            self._send(code, b"", "text/plain", {"Location": query.get("to", "/ok")})
        else:
            self._json(404, {"error": f"no route {path}"})

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _trickle(self, interval: float, size: int) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        self.wfile.flush()
        for _ in range(size):
            time.sleep(interval)
            self.wfile.write(b" ")
            self.wfile.flush()

    def _huge(self, mebibytes: int, compressed: bool, chunked: bool) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if compressed:
            packed = gzipped(mebibytes)
            self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(packed)))
            self.end_headers()
            self.wfile.write(packed)
            return
        block = json_block()
        if not chunked:
            self.send_header("Content-Length", str(mebibytes * len(block)))
            self.end_headers()
            for _ in range(mebibytes):
                self.wfile.write(block)
            return
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for _ in range(mebibytes):
            self.wfile.write(b"%x\r\n%s\r\n" % (len(block), block))
        self.wfile.write(b"0\r\n\r\n")


@functools.cache
def json_block() -> bytes:
    """One MiB of JSON-looking bytes."""
    return b"[" + b"0," * (MIB // 2 - 1) + b"0]"


@functools.cache
def gzipped(mebibytes: int) -> bytes:
    """``mebibytes`` MiB of zeros, gzip-compressed a block at a time (a decompression bomb)."""
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(MIB)
    packed = b"".join(packer.compress(zeros) for _ in range(mebibytes))
    return packed + packer.flush()


class MockServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def __init__(self, port: int = 0) -> None:
        super().__init__(("127.0.0.1", port), Handler)
        self.stats = Stats()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (timeouts, refused bodies) are part of the job, not errors."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description="batchsync's local fault-injecting API")
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    args = parser.parse_args()
    server = MockServer(args.port)
    print(f"listening on {server.url}", flush=True)
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
