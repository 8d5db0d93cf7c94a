"""batchsync's local fault-injecting HTTP/1.1 keep-alive API: for tests, the demo, the recipes
and trying a run without touching a real service.

    python -m batchsync.mock --port 8788      # port 0 (default) picks a free one

It prints ``listening on http://127.0.0.1:PORT`` once it accepts connections. Its routes are
the table ``SECTIONS`` below, which both answers the requests and writes ``--help``.

Every route but /stats counts towards the stats: ``counts`` (per path with query),
``requests``, ``peak_concurrency`` (requests being handled at once), ``peak_by_host`` (the
same per Host header), ``connections`` (TCP connections that carried at least one of those
requests) and ``log`` (arrival ``t`` and ``end`` as Unix times, ``target``, ``host``,
``status``; a quota request also its ``window``'s start, a page its ``page``).
"""

from __future__ import annotations

import argparse
import base64
import email.utils
import functools
import json
import math
import secrets
import signal
import sys
import textwrap
import threading
import time
import zlib
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from . import batch, gemini, llm
from .batch import BatchMock
from .gemini import GeminiMock
from .llm import LLMMock

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
            self.in_flight_by_host: Counter[str] = Counter()
            self.peak_by_host: dict[str, int] = {}
            self.family_in_flight: Counter[str] = Counter()
            self.family_arrivals: dict[str, list[float]] = {}
            self.connections = 0
            self.seen: Counter[str] = Counter()
            self.log: list[dict[str, Any]] = []
            self.quota_windows: dict[str, tuple[float, int]] = {}

    def connected(self) -> None:
        with self._lock:
            self.connections += 1

    def begin(self, target: str, host: str) -> dict[str, Any]:
        """Count a request in; returns its log entry, whose status ``end`` fills in."""
        entry: dict[str, Any] = {"t": time.time(), "target": target, "host": host, "status": None}
        with self._lock:
            self.counts[target] += 1
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
            self.in_flight_by_host[host] += 1
            self.peak_by_host[host] = max(
                self.peak_by_host.get(host, 0), self.in_flight_by_host[host]
            )
            self.log.append(entry)
        return entry

    def end(self, entry: dict[str, Any], status: int | None) -> None:
        """The request is answered: counted out once (a body's last write comes after)."""
        with self._lock:
            if "end" in entry:
                return
            self.in_flight -= 1
            self.in_flight_by_host[entry["host"]] -= 1
            entry["status"] = status
            entry["end"] = time.time()

    def times_seen(self, key: str) -> int:
        """How many times ``key`` was seen before, counting this one in."""
        with self._lock:
            self.seen[key] += 1
            return self.seen[key]

    def quota(self, family: str, limit: int, window: float) -> tuple[int, float, float]:
        """Count a request of ``family`` against its quota: (requests left after this one,
        negative when it is over; when its window began; seconds until the window resets)."""
        now = time.time()
        with self._lock:
            started, used = self.quota_windows.get(family, (now, 0))
            if now - started >= window:
                started, used = now, 0
            self.quota_windows[family] = (started, used + 1)
            return limit - used - 1, started, started + window - now

    def over_limit(self, family: str, max_in_flight: int, max_rate: float) -> bool:
        """Count a request of ``family`` in; True when it is one too many (in flight or per s)."""
        now = time.monotonic()
        with self._lock:
            arrivals = [t for t in self.family_arrivals.get(family, []) if now - t < 1.0]
            arrivals.append(now)
            self.family_arrivals[family] = arrivals
            self.family_in_flight[family] += 1
            return self.family_in_flight[family] > max_in_flight or len(arrivals) > max_rate

    def leave_family(self, family: str) -> None:
        with self._lock:
            self.family_in_flight[family] -= 1

    def snapshot(self, with_log: bool) -> dict[str, Any]:
        with self._lock:
            report = {
                "counts": dict(self.counts),
                "requests": sum(self.counts.values()),
                "peak_concurrency": self.peak,
                "peak_by_host": dict(self.peak_by_host),
                "in_flight": self.in_flight,
                "connections": self.connections,
            }
            if with_log:
                report["log"] = [dict(entry) for entry in self.log]
            return report


class Tokens:
    """Bearer tokens per realm, each good for a number of uses and seconds; counts issues."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # token -> [realm, uses left, expiry (Unix time), refused on sight]
        self._live: dict[str, list[Any]] = {}
        self._counts: dict[str, Counter[str]] = {}
        self._expired: set[str] = set()

    def issue(self, realm: str, uses: int, ttl: float, *, refuse: bool) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._live[token] = [realm, uses, time.time() + ttl, refuse]
            self._counts.setdefault(realm, Counter())["issued"] += 1
        return token

    def use(self, realm: str, token: str) -> str | None:
        """None when ``token`` is good for ``realm`` (a use spent); else why not."""
        with self._lock:
            counts = self._counts.setdefault(realm, Counter())
            entry = self._live.get(token)
            if entry is None or entry[0] != realm or entry[3]:
                counts["unauthorized"] += 1
                return "unknown" if entry is None or entry[0] != realm else "refused"
            if entry[1] <= 0 or time.time() >= entry[2]:
                counts["unauthorized"] += 1
                if token not in self._expired:
                    self._expired.add(token)
                    counts["expired"] += 1
                return "expired"
            entry[1] -= 1
            counts["used"] += 1
            return None

    def report(self, realm: str) -> dict[str, int]:
        with self._lock:
            counts = self._counts.get(realm, Counter())
            return {name: counts[name] for name in ("issued", "expired", "used", "unauthorized")}


@dataclass(frozen=True)
class Call:
    """One request as a route sees it: its path, the path's first segment, its query (each
    name's last value) and its body."""

    path: str
    head: str
    query: dict[str, str]
    body: bytes

    def segment(self, index: int) -> str:
        """The path's segment ``index`` (0: the route's own name)."""
        return self.path.strip("/").split("/")[index]


def head_of(path: str) -> str:
    return "/" + path.strip("/").split("/", 1)[0]


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # TCP_NODELAY, as real servers set it: the body, written apart from the headers, would
    # otherwise wait for the client's delayed ACK (40 ms) on a connection with one request out.
    disable_nagle_algorithm = True
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
        self.entry: dict[str, Any] = {}  # (the log's entry, once it is counted in)
        parts = urlsplit(self.path)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        route = route_of(path)
        # (a route that never reads the body answers before it is read: that is its point)
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length and route.reads_body else b""
        call = Call(path, head_of(path), query, body)
        if not route.counted:
            route.answer(self, call)
            return
        stats = self.server.stats
        if not self.counted_connection:
            self.counted_connection = True
            stats.connected()
        entry = self.entry = stats.begin(self.path, self.headers.get("Host", ""))  # (a route
        # may add to its log entry)
        self.status: int | None = None
        try:
            delay = float(query.get("delay", route.delay))
            if delay:
                time.sleep(delay)
            route.answer(self, call)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            stats.end(entry, self.status)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def _ok(self, call: Call) -> None:
        self._json(200, {"path": call.path, "ok": True})

    def _429_once(self, call: Call) -> None:
        wait = float(call.query.get("retry_after", "1"))
        if self.server.stats.times_seen(call.path) != 1:
            self._ok(call)
            return
        when = (
            email.utils.formatdate(time.time() + wait, usegmt=True)
            if call.head == "/429-date"
            else f"{wait:g}"
        )
        self._json(429, {"error": "slow down"}, {"Retry-After": when})

    def _account(self, call: Call) -> None:
        """An account's limit: its first request starts N seconds in which every request of
        the account is refused, each told the time left."""
        now = time.monotonic()
        with self.server.accounts_lock:
            until = self.server.accounts.setdefault(
                call.segment(1), now + float(call.query.get("retry_after", "1"))
            )
        if now < until:
            self._json(429, {"error": "account limit"}, {"Retry-After": f"{until - now:.3f}"})
        else:
            self._ok(call)

    def _503_then_ok(self, call: Call) -> None:
        seen = self.server.stats.times_seen(f"503-then-ok {call.segment(1)}")
        if seen <= int(call.query.get("after", "3")):
            self._json(503, {"error": "unavailable"})
        else:
            self._ok(call)

    def _jitter(self, call: Call) -> None:
        seen = self.server.stats.times_seen(f"jitter {call.segment(1)}")
        if seen % int(call.query.get("every", "20")) == 0:
            time.sleep(float(call.query.get("slow", "2")))
        self._ok(call)

    def _503(self, call: Call) -> None:
        query = call.query
        extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
        self._json(503, {"error": "unavailable"}, extra)

    def _echo(self, call: Call) -> None:
        self._json(
            200,
            {
                "method": self.command,
                "path": call.path,
                "query": call.query,
                "headers": dict(self.headers.items()),
                "body": call.body.decode("utf-8", errors="replace"),
            },
        )

    def _half(self, call: Call) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "100")
        self.end_headers()
        self.wfile.write(b'{"cut": "')
        self.wfile.flush()
        self.close_connection = True

    def _endless_pages(self, call: Call) -> None:
        number = int(call.query.get("cursor", "0"))
        pad = "x" * (int(call.query.get("kb", "1024")) * 1024)
        self._json(200, {"items": [{"n": number, "pad": pad}], "next": str(number + 1)})

    def _gemini(self, call: Call) -> None:
        headers = {name.lower(): value for name, value in self.headers.items()}
        gemini_mock = self.server.gemini
        self._reply(*gemini_mock.answer(self.command, call.path, call.query, call.body, headers))

    def _cookie_each(self, call: Call) -> None:
        number = self.server.stats.times_seen("cookie-each")
        cookie = f"c{number}={'v' * int(call.query.get('size', '100'))}; Path=/"
        self._json(200, {"set": f"c{number}"}, {"Set-Cookie": cookie})

    def _set_cookie(self, call: Call) -> None:
        cookie = f"{call.query.get('name', 'session')}={call.query.get('value', '1')}; Path=/"
        self._json(200, {"set": cookie}, {"Set-Cookie": cookie})

    def _redirect(self, call: Call) -> None:
        code = int(call.query.get("code", "302"))
        self._send(code, b"", "text/plain", {"Location": call.query.get("to", "/ok")})

    def _stats(self, call: Call) -> None:
        self._json(200, self.server.stats.snapshot(with_log=call.query.get("log") == "1"))

    def _stats_reset(self, call: Call) -> None:
        self.server.stats.reset()
        self._json(200, {"reset": True})

    def _llm(self, call: Call) -> None:
        """The mock LLM API: its batch routes (which read the request's headers: the upload's
        Content-Type, the Host of a results URL, the key) and its live ones."""
        path, query, body = call.path, call.query, call.body
        if not BatchMock.handles(path):
            self._json(*self.server.llm.answer(self.command, path, query, body))
            return
        headers = {name.lower(): value for name, value in self.headers.items()}
        self._reply(*self.server.batches.answer(self.command, path, query, body, headers))

    def _reply(self, status: int, payload: Any, extra: Mapping[str, str]) -> None:
        """A mock API's answer: JSON, or bytes with their Content-Type among the headers."""
        if isinstance(payload, bytes):
            extra = dict(extra)
            content_type = extra.pop("Content-Type", "application/octet-stream")
            self._send(status, payload, content_type, extra)
        else:
            self._json(status, payload, dict(extra))

    def _quota(self, family: str, query: dict[str, str]) -> None:
        """A quota of ``limit`` requests a ``window`` for the family, announced in headers of
        one ``style``: "x" (X-RateLimit-*, seconds left), "github" (X-RateLimit-*, an epoch
        reset, and a 403 when spent) or "ietf" (the structured RateLimit field)."""
        left, headers = self._quota_headers(family, query)
        if left >= 0:
            self._json(200, {"family": family, "ok": True}, headers)
        else:
            status = 403 if query.get("style") == "github" else 429
            self._json(status, {"message": "API rate limit exceeded"}, headers)

    def _quota_headers(self, family: str, query: dict[str, str]) -> tuple[int, dict[str, str]]:
        """Count a request against the family's quota: requests left (negative when over)
        and the headers that announce what is left."""
        limit, window = int(query.get("limit", "5")), float(query.get("window", "2"))
        style = query.get("style", "x")
        left, started, reset = self.server.stats.quota(family, limit, window)
        self.entry["window"] = started  # (the log says which window each request fell in)
        remaining, seconds = max(left, 0), math.ceil(reset)
        if style == "ietf":
            return left, {
                "RateLimit": f'"default";r={remaining};t={seconds}',
                "RateLimit-Policy": f'"default";q={limit};w={window:g}',
            }
        when = math.ceil(time.time() + reset) if style == "github" else seconds
        return left, {"X-RateLimit-Remaining": str(remaining), "X-RateLimit-Reset": str(when)}

    def _page(self, path: str, style: str, query: dict[str, str]) -> None:
        """One page of a collection of ``total`` records ``{"n": i}``, ``size`` a page, the
        next page named the ``style`` way: "link" (a Link header), "cursor" (an opaque
        ``next`` in the body, sent back as ``cursor``), "next" (the next path in the body),
        "page" (``page`` 1, 2, …) or "offset" (``offset`` 0, ``size``, …); the last two end
        with an empty page. Page ``fail`` answers 503 its first ``fail_times`` requests
        (always without it); ``tag`` keeps one test's count apart. With ``limit``, the
        ``family``'s quota is counted and announced as ``/quota`` does (style x)."""
        headers: dict[str, str] = {}
        if "limit" in query:
            family = query.get("family", "pages")
            left, headers = self._quota_headers(family, {**query, "style": "x"})
            if left < 0:
                self._json(429, {"message": "API rate limit exceeded"}, headers)
                return
        total, size = int(query.get("total", "10")), int(query.get("size", "3"))
        if style == "cursor":
            start = int(base64.urlsafe_b64decode(query["cursor"])) if "cursor" in query else 0
        elif style == "offset":
            start = int(query.get("offset", "0"))
        else:
            start = (int(query.get("page", "1")) - 1) * size
        number = start // size + 1
        self.entry["page"] = number
        failing = query.get("fail")
        if failing is not None and int(failing) == number:
            times = int(query.get("fail_times", "0"))
            key = f"page {query.get('tag', '')} {style} {number}"
            if not times or self.server.stats.times_seen(key) <= times:
                self._json(503, {"error": f"page {number} is failing"})
                return
        records = [{"n": n} for n in range(start, min(start + size, total))]
        more = start + size < total
        body: dict[str, Any] = {"items": records, "page": number}
        # (the next page's path, on the server ``base`` names when given)
        following = {**query, "page": str(number + 1)}
        next_path = f"{query.get('base', '')}{path}?{urlencode(following)}"
        if more and style == "link":
            headers["Link"] = f'<{next_path}>; rel="next"'
        elif style == "cursor":
            after = base64.urlsafe_b64encode(str(start + size).encode()).decode()
            body["next"] = after if more else None
        elif style == "next":
            body["next"] = next_path if more else None
        self._json(200, body, headers)

    def _bearer(self, head: str, realm: str, query: dict[str, str]) -> None:
        """An OAuth-like token endpoint and the API it guards (see the module's doc)."""
        tokens = self.server.tokens
        if head == "/token":
            token = tokens.issue(
                realm, int(query.get("uses", "10")), float(query.get("ttl", "3600")),
                refuse=query.get("refuse") == "1",
            )  # fmt: skip
            if query.get("format") == "header":
                self._send(200, f"Bearer {token}".encode(), "text/plain")
            else:
                self._json(200, {"access_token": token, "token_type": "Bearer"})
            return
        if head == "/tokens":
            self._json(200, tokens.report(realm))
            return
        scheme, _, token = (self.headers.get("Authorization") or "").partition(" ")
        problem = tokens.use(realm, token) if scheme == "Bearer" else "missing"
        if problem is None:
            self._json(200, {"path": self.path, "ok": True})
        else:
            challenge = f'Bearer realm="{realm}", error="invalid_token"'
            self._json(
                401, {"error": f"token {token} is {problem}"}, {"WWW-Authenticate": challenge}
            )

    def _s3_object(self, key: str) -> None:
        """An S3 object, or the errors S3 answers with (XML, as botocore reads them)."""

        def error(status: int, code: str, headers: dict[str, str] | None = None) -> None:
            xml = f"<?xml version='1.0'?><Error><Code>{code}</Code><Message>{code}</Message>"
            self._send(status, f"{xml}</Error>".encode(), "application/xml", headers)

        if key.startswith("slowdown-once") and self.server.stats.times_seen(f"s3 {key}") == 1:
            error(503, "SlowDown", {"Retry-After": "1"})
        elif key.startswith("missing"):
            error(404, "NoSuchKey")
        else:
            self._send(200, f"object {key}".encode(), "binary/octet-stream", {"ETag": '"e"'})

    def _chat_completion(self, body: bytes) -> None:
        """OpenAI's chat completion, with the faults its last message asks for."""
        request = json.loads(body or b"{}")
        content = str(request.get("messages", [{}])[-1].get("content", ""))
        fault, _, key = content.partition(":")
        first = key and self.server.stats.times_seen(f"chat {content}") == 1
        if fault == "429-once" and first:
            error = {"message": "Rate limit reached", "type": "requests", "code": "rate_limit"}
            self._json(429, {"error": error}, {"Retry-After": "1"})
            return
        if fault == "500-once" and first:
            self._json(500, {"error": {"message": "The server had an error", "type": "server"}})
            return
        message = {"role": "assistant", "content": f"echo: {content}"}
        self._json(
            200,
            {
                "id": f"chatcmpl-{abs(hash(content)) % 10**8}", "object": "chat.completion",
                "created": int(time.time()), "model": request.get("model", "mock"),
                "choices": [{"index": 0, "message": message, "finish_reason": "stop"}],
                "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
            },
        )  # fmt: skip

    def _sized(self, size: int) -> None:
        """A body of ``size`` bytes announced in Content-Length, written in chunks (none to a
        HEAD): a large file whose HEAD has no body to bound."""
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if self.command != "HEAD":
            chunk = b"\0" * 2**16
            for start in range(0, size, len(chunk)):
                self.wfile.write(chunk[: size - start])

    def do_CONNECT(self) -> None:
        """A forward proxy that refuses every tunnel: 407, as one wanting credentials does."""
        self.send_response(407)
        self.send_header("Proxy-Authenticate", 'Basic realm="mock"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _send(
        self, status: int, body: bytes, content_type: str, headers: dict[str, str] | None = None
    ) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.end_headers()
        # (counted out before the body goes: a client that has the whole answer may send the
        # next at once, and must not be seen with both in flight)
        if self.entry:
            self.server.stats.end(self.entry, self.status)
        if self.command != "HEAD":
            self.wfile.write(body)

    def _encoded(self, query: dict[str, str]) -> None:
        """Text in any charset, labelled as the test says (or not at all)."""
        body = query.get("text", "café").encode(query.get("charset", "utf-8"))
        self.send_response(200)
        if "type" in query:
            self.send_header("Content-Type", query["type"])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, status: int, payload: object, headers: dict[str, str] | None = None) -> None:
        self._send(status, json.dumps(payload).encode(), "application/json", headers)

    def _limited(self, query: dict[str, str]) -> None:
        """A server with a capacity: 429 past ``max_inflight`` at once or ``max_rate`` a second."""
        stats = self.server.stats
        family = query.get("family", "limited")
        over = stats.over_limit(
            family, int(query.get("max_inflight", "1000000")), float(query.get("max_rate", "inf"))
        )
        if not over:
            time.sleep(float(query.get("work", "0")))
        # The request stops counting once its work is done, before the answer goes out.
        stats.leave_family(family)
        if over:
            extra = {"Retry-After": query["retry_after"]} if "retry_after" in query else {}
            self._json(429, {"error": "over capacity"}, extra)
        else:
            self._json(200, {"ok": True})

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

    def _trickle_headers(self, interval: float, lines: int) -> None:
        self.send_response(200)
        self.flush_headers()  # the status line (and Server, Date) without the blank line
        for number in range(lines):
            time.sleep(interval)
            self.wfile.write(b"X-Trickle-%d: %d\r\n" % (number, number))
            self.wfile.flush()
        body = b'{"trickled": true}'
        self.wfile.write(
            b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
        )
        self.wfile.write(body)

    def _redirect_body(self, to: str, mebibytes: int, interval: str | None) -> None:
        self.send_response(302)
        self.send_header("Location", to)
        self.send_header("Content-Type", "text/plain")
        size = 1000 if interval else mebibytes * MIB
        self.send_header("Content-Length", str(size))
        self.end_headers()
        if interval:
            for _ in range(size):
                time.sleep(float(interval))
                self.wfile.write(b" ")
                self.wfile.flush()
            return
        block = b" " * MIB
        for _ in range(mebibytes):
            self.wfile.write(block)

    def _echo_values(self, query: dict[str, str]) -> None:
        """The query's values (but the style) echoed where a client may quote them."""
        values = "-".join(v for k, v in query.items() if k != "style")
        if query.get("style") == "status":
            self.wfile.write(f"HTTP/1.1 bad key {values}\r\n\r\n".encode())
            self.close_connection = True
        else:
            self._send(302, b"", "text/plain", {"Location": f"/404/{values}"})

    def _stall_upload(self, hold: float) -> None:
        self.close_connection = True
        time.sleep(hold)

    def _many_headers(self, count: int) -> None:
        extra = {f"X-Header-{n}": str(n) for n in range(count)}
        self._json(200, {"headers": len(extra)}, extra)

    def _deep(self, depth: int) -> None:
        self._send(200, b"[" * depth + b"]" * depth, "application/json")

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
        self.tokens = Tokens()
        self.llm = LLMMock()
        self.batches = BatchMock(self.llm)
        self.gemini = GeminiMock()
        # Each account's limit ends at this moment (monotonic), from its first request.
        self.accounts: dict[str, float] = {}
        self.accounts_lock = threading.Lock()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Clients hanging up (timeouts, refused bodies) are part of the job, not errors."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        return f"http://{host!s}:{port}"


Answer = Callable[[Handler, Call], None]


@dataclass(frozen=True)
class Route:
    """One route: the path it answers, how the help shows it, and its answer.

    ``path`` is a first segment (``/ok`` answers /ok and /ok/...) or, ``exact``, the whole
    path. ``delay`` is the default of the ``delay=S`` every counted route takes; a route not
    ``counted`` stays out of the stats, one that does not ``reads_body`` answers before the
    body is read. ``more`` lists the routes under it that a mock of their own answers."""

    path: str
    usage: str
    does: str
    answer: Answer
    exact: bool = False
    delay: float = 0.0
    counted: bool = True
    reads_body: bool = True
    more: tuple[tuple[str, str], ...] = ()


SECTIONS: tuple[tuple[str, tuple[Route, ...]], ...] = (
    ("Answers and failures", (
        Route("/ok", "/ok[/anything]?delay=S",
              'Answers 200 JSON {"path": ..., "ok": true}, after S seconds (every counted '
              "route takes delay=S).", Handler._ok),
        Route("/slow", "/slow[/anything]?delay=S", "The same as /ok, after 2 s by default.",
              Handler._ok, delay=2.0),
        Route("/429-once", "/429-once/KEY?retry_after=N",
              "The first request of each KEY: 429 with Retry-After: N seconds (1); later: 200.",
              Handler._429_once),
        Route("/429-date", "/429-date/KEY?retry_after=N",
              "The same with Retry-After as an HTTP-date N seconds ahead.", Handler._429_once),
        Route("/503", "/503[/anything]?retry_after=N",
              "Always 503 (with Retry-After: N when given).", Handler._503),
        Route("/404", "/404[/anything]", "Always 404.",
              lambda h, c: h._json(404, {"error": "not found"})),
        Route("/broken-json", "/broken-json", "200 with a body that is not JSON.",
              lambda h, c: h._send(200, b'{"truncated": ', "application/json")),
        Route("/retry-after-60", "/retry-after-60", "Always 429 with Retry-After: 60.",
              lambda h, c: h._json(429, {"error": "slow down"}, {"Retry-After": "60"})),
        Route("/account", "/account/ACCOUNT/...?retry_after=N",
              "The first request of an ACCOUNT starts its limit: every request of the "
              "account in the N seconds after it gets 429 with Retry-After: the seconds "
              "left; later ones: 200.", Handler._account),
        Route("/limited", "/limited/...?max_inflight=K&max_rate=R&work=S&family=F&retry_after=N",
              "A server with a capacity: 429 when more than K requests of family F are in "
              "flight or more than R arrived in the last second; else 200 after S seconds of "
              "work.", lambda h, c: h._limited(c.query)),
        Route("/503-then-ok", "/503-then-ok/FAMILY/...?after=N",
              "The first N requests (3) of a FAMILY: 503; later ones: 200.",
              Handler._503_then_ok),
        Route("/jitter", "/jitter/FAMILY/...?every=N&slow=S",
              "200; every Nth request (20) of a FAMILY only after S seconds (2).",
              Handler._jitter),
    )),
    ("Bodies, headers, redirects", (
        Route("/trickle", "/trickle?interval=S&bytes=N",
              "200 headers at once, then one body byte every S seconds (0.2; 50 bytes).",
              lambda h, c: h._trickle(
                  float(c.query.get("interval", "0.2")), int(c.query.get("bytes", "50")))),
        Route("/huge", "/huge?mb=N&gzip=1&chunked=1",
              "200 with an N MiB body (256): gzip-compressed (gzip=1), or without a "
              "Content-Length (chunked=1).",
              lambda h, c: h._huge(int(c.query.get("mb", "256")), c.query.get("gzip") == "1",
                                   c.query.get("chunked") == "1")),
        Route("/many-headers", "/many-headers?n=N",
              "200 with N extra headers (X-Header-0 ...; 150).",
              lambda h, c: h._many_headers(int(c.query.get("n", "150")))),
        Route("/text", "/text", "200 text/plain in UTF-8.",
              lambda h, c: h._send(200, "héllo wörld".encode(), "text/plain; charset=utf-8")),
        Route("/bytes", "/bytes", "200 application/octet-stream: the 256 byte values.",
              lambda h, c: h._send(200, bytes(range(256)), "application/octet-stream")),
        Route("/encoded", "/encoded?text=T&charset=C&type=CT",
              '200 with T ("café") encoded in C (utf-8), Content-Type CT exactly as given '
              "(none without type): charsets declared, missing or wrong.",
              lambda h, c: h._encoded(c.query)),
        Route("/echo", "/echo", "200 JSON of the request: method, path, query, headers, body.",
              Handler._echo),
        Route("/redirect", "/redirect?to=URL&code=C",
              "A redirect (C, 302) to URL (/ok).", Handler._redirect),
        Route("/status", "/status/CODE",
              "An answer with that status and nothing else (a 3xx with no Location).",
              lambda h, c: h._send(int(c.segment(1)), b"status", "text/plain")),
        Route("/sized", "/sized?bytes=N",
              "200 with an N-byte body (none to a HEAD: a large file's).",
              lambda h, c: h._sized(int(c.query.get("bytes", "0")))),
        Route("/set-cookie", "/set-cookie?name=N&value=V", "200 that sets a cookie.",
              Handler._set_cookie),
        Route("/cookie-each", "/cookie-each[/anything]?size=N",
              "200 that sets a new cookie each time (c1, c2, ... with N bytes of value, 100): "
              "a jar that grows without end.", Handler._cookie_each),
        Route("/half", "/half", "200 announcing 100 bytes, then 9 of them and a hang-up.",
              Handler._half),
    )),
    ("Hostile servers: every phase of an attempt must stay within its limits", (
        Route("/trickle-headers", "/trickle-headers?interval=S&lines=N",
              "The status line, then one header line every S seconds (0.1; N of them, 60), "
              "then a small JSON body.",
              lambda h, c: h._trickle_headers(
                  float(c.query.get("interval", "0.1")), int(c.query.get("lines", "60")))),
        Route("/redirect-body", "/redirect-body?to=URL&mb=N&interval=S",
              "A 302 to URL (/ok) with an N MiB body (300), or, with interval, one byte every "
              "S seconds.",
              lambda h, c: h._redirect_body(c.query.get("to", "/ok"),
                                            int(c.query.get("mb", "300")),
                                            c.query.get("interval"))),
        Route("/stall-upload", "/stall-upload?hold=S",
              "Never reads the request body; closes after S seconds (10). Not counted.",
              lambda h, c: h._stall_upload(float(c.query.get("hold", "10"))),
              counted=False, reads_body=False),
        Route("/bad-location", "/bad-location", "A 302 whose Location is not UTF-8.",
              lambda h, c: h._send(302, b"", "text/plain", {"Location": "/ok/\xff\xfe"})),
        Route("/deep", "/deep?depth=N", "200 with JSON nested N arrays deep (1000).",
              lambda h, c: h._deep(int(c.query.get("depth", "1000")))),
        Route("/surrogate", "/surrogate", '200 with {"name": "\\ud800"}: a lone surrogate '
              "escape.", lambda h, c: h._send(200, b'{"name": "\\ud800"}', "application/json")),
        Route("/surrogate-key", "/surrogate-key",
              '200 with {"\\ud800": 1, "a": {"\\udc00b": 2}}: lone surrogate escapes in keys.',
              lambda h, c: h._send(200, b'{"\\ud800": 1, "a": {"\\udc00b": 2}}',
                                   "application/json")),
        Route("/echo-values", "/echo-values?style=S&...",
              "Echoes the query's values (a key among them) as careless servers do: in a "
              "status line that is not HTTP (style=status), or in a 302 to /404/VALUES "
              "(style=location).", lambda h, c: h._echo_values(c.query)),
    )),
    ("An OpenAI-compatible endpoint for SDK clients (base URL http://127.0.0.1:PORT/v1)", (
        Route("/v1/chat/completions", "POST /v1/chat/completions",
              'A chat completion whose reply echoes the last message; a message '
              '"429-once:KEY" gets, the first time per KEY, a 429 with Retry-After: 1, and '
              '"500-once:KEY" a 500.', lambda h, c: h._chat_completion(c.body), exact=True),
    )),
    ("A mock LLM API: requests and tokens per minute limited as OpenAI and Anthropic do", (
        Route("/llm", "/llm/KEY/LIMITS/...",
              "KEY: any name, with limits, counters, files and batches of its own. LIMITS: "
              "name=value pairs joined by commas, or - for the defaults: rpm (500), tpm "
              "(200000), itpm and otpm (Anthropic's input and output tokens, tpm), window "
              "(seconds, 60: the period the limits count over, and their resets tell), "
              "latency (seconds, 0), refill (window, oldest or bucket), retry_after (1 or 0), "
              "and the batch knobs pace, expire, fail, enqueued, shuffle, batch_rows, "
              "batch_bytes, stall_upload, stall_create, stall_results. SDK base URLs: "
              ".../llm/KEY/LIMITS/v1 for openai, .../llm/KEY/LIMITS for anthropic.",
              Handler._llm, more=llm.ROUTES_HELP + batch.ROUTES_HELP),
    )),
    ("A mock of Gemini's batch mode (SDK base URL http://127.0.0.1:PORT/gemini/KEY/KNOBS)", (
        Route("/gemini", "/gemini/KEY/KNOBS/...",
              "KNOBS: pace (seconds, 0.5: each state's length), stall_create (seconds before "
              "a create is answered), or -. A request whose text holds [[error]] is answered "
              "an error of code 3, one with [[500]] code 13.",
              Handler._gemini, more=gemini.ROUTES_HELP),
    )),
    ("Quotas announced in rate-limit headers, with a real per-window counter", (
        Route("/quota", "/quota/FAMILY/...?limit=N&window=S&style=x,github,ietf",
              "N requests (5) of a FAMILY per S-second window (2), each answer saying how "
              "many are left and when the window resets: X-RateLimit-* with seconds left "
              "(x), GitHub's epoch reset and 403 (github), the IETF RateLimit field (ietf); "
              "over it: 429 (GitHub: 403).",
              lambda h, c: h._quota(c.segment(1), c.query)),
    )),
    ("Paginated collections", (
        Route("/pages", "/pages/STYLE/...?total=N&size=K&fail=P&fail_times=T&tag=X&base=URL"
              "&limit=L&window=S",
              'TOTAL records {"n": i} (10), SIZE a page (3), the next page named by STYLE: '
              "link (a Link header), cursor (an opaque next in the body, sent back as "
              "cursor=), next (the next path in the body), page (page=1, 2, ... until an "
              "empty page), offset (offset=0, K, ... until an empty page); page P answers 503 "
              "its first T requests (always without fail_times); a next page is named on the "
              "server at base when given; with limit, a quota as /quota's (style x).",
              lambda h, c: h._page(c.path, c.segment(1), c.query)),
        Route("/endless-pages", "/endless-pages?kb=N&cursor=C",
              "A collection that never ends: pages of about N KiB (1024) whose next is "
              "always a new cursor.", Handler._endless_pages),
    )),
    ("An S3-compatible bucket for boto3 (endpoint_url=http://127.0.0.1:PORT, path-style)", (
        Route("/s3-mock", "GET|HEAD /s3-mock/KEY",
              'The object KEY ("object KEY"); a KEY starting with slowdown-once gets, the '
              "first time, a 503 SlowDown with Retry-After: 1, and missing a 404 NoSuchKey.",
              lambda h, c: h._s3_object(c.path.split("/", 2)[2])),
    )),
    ("Tokens that expire, for auth= and --auth-command (per REALM)", (
        Route("/token", "/token/REALM?uses=N&ttl=S&refuse=1&format=header",
              "Issues a fresh random bearer token good for N requests (10) and S seconds "
              "(3600); refuse=1: one /protected refuses anyway. JSON {\"access_token\": ...}; "
              'format=header: the text "Bearer TOKEN".',
              lambda h, c: h._bearer(c.head, c.segment(1), c.query)),
        Route("/protected", "/protected/REALM/...",
              "200 JSON for Authorization: Bearer TOKEN with a live token of REALM; else 401 "
              "(WWW-Authenticate, and a body that echoes the token, as careless servers do).",
              lambda h, c: h._bearer(c.head, c.segment(1), c.query)),
        Route("/tokens", "/tokens/REALM",
              "JSON: tokens issued, tokens that expired (refused once used up or out of "
              "time), 401s answered.",
              lambda h, c: h._bearer(c.head, c.segment(1), c.query)),
    )),
    ("What the server saw", (
        Route("/stats", "/stats?log=1",
              "JSON: requests per target, peak concurrency, connections (with log=1 also "
              "each request's arrival time and status). Not counted.",
              Handler._stats, exact=True, counted=False),
        Route("/stats/reset", "/stats/reset", "Clears the stats. Not counted.",
              Handler._stats_reset, exact=True, counted=False),
    )),
)  # fmt: skip

ROUTES = tuple(route for _, routes in SECTIONS for route in routes)
_EXACT = {route.path: route for route in ROUTES if route.exact}
_BY_HEAD = {route.path: route for route in ROUTES if not route.exact}


# (what answers a path no route names)
_NO_ROUTE = Route("", "", "404.", lambda h, c: h._json(404, {"error": f"no route {c.path}"}))


def route_of(path: str) -> Route:
    """The route answering ``path``: its own when one is exact, else its first segment's."""
    return _EXACT.get(path) or _BY_HEAD.get(head_of(path)) or _NO_ROUTE


def routes_help(width: int = 96) -> str:
    """Every route of the table, section by section, as ``--help`` shows them."""
    lines = []
    for title, routes in SECTIONS:
        lines += ["", f"{title}:"]
        for route in routes:
            lines += [f"  {route.usage}", *_wrapped(route.does, width, 6)]
            for usage, does in route.more:
                lines += [f"    {usage}", *_wrapped(does, width, 8)]
    usage, does = PROXY_HELP
    lines += ["", "A proxy:", f"  {usage}", *_wrapped(does, width, 6)]
    return "\n".join(lines)


# (answered by ``Handler.do_CONNECT``: CONNECT names no path for the table)
PROXY_HELP = ("CONNECT HOST:PORT", "407 with Proxy-Authenticate: a forward proxy that refuses "
              "every tunnel.")  # fmt: skip


def _wrapped(text: str, width: int, indent: int) -> list[str]:
    return textwrap.wrap(text, width, initial_indent=" " * indent, subsequent_indent=" " * indent)


def main() -> None:
    # (Ctrl-C stops the server: not the command line's "nothing was sent" of the package)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    parser = argparse.ArgumentParser(
        prog="python -m batchsync.mock",
        description="batchsync's local fault-injecting API: every route below on one port.",
        epilog="routes (each name in capitals is any name of yours; N, S: numbers):"
        + routes_help(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--port", type=int, default=0, help="port on 127.0.0.1 (0: any free one)")
    args = parser.parse_args()
    server = MockServer(args.port)
    sys.stdout.write(f"listening on {server.url}\n")  # (what a caller waits for)
    sys.stdout.flush()
    try:
        server.serve_forever(poll_interval=0.2)
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
