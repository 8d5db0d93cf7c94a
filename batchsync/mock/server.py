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
    /account/ACCOUNT/...?retry_after=N   the first request of an ACCOUNT: 429 with Retry-After: N
                                     for the whole account; every later one: 200
    /limited/...?max_inflight=K&max_rate=R&work=S&family=F
                                     a server with a capacity: 429 when more than K requests of
                                     family F are in flight or more than R arrived in the last
                                     second; else 200 after S seconds of work
    /503-then-ok/FAMILY/...?after=N  the first N requests of a FAMILY: 503; later ones: 200
    /jitter/FAMILY/...?every=N&slow=S  200; every Nth request of a FAMILY only after S seconds
    /trickle?interval=S&bytes=N      200 headers at once, then one body byte every S seconds
    /huge?mb=N&gzip=1&chunked=1      200 with an N MiB body: gzip-compressed (gzip=1), or
                                     without a Content-Length (chunked=1)
    /many-headers?n=N                200 with N extra headers (X-Header-0 ... ; default 150)
    /text, /bytes                    200 text/plain UTF-8, 200 application/octet-stream
    /encoded?text=T&charset=C&type=CT  200 with T (default "café") encoded in C (default
                                     utf-8), Content-Type CT exactly as given (none without
                                     type): charsets declared, missing or wrong
    /echo                            200 JSON of the request: method, path, query, headers, body
    /redirect?to=URL&code=302        a redirect to URL
    /status/CODE                     an answer with that status and nothing else (a 3xx with
                                     no Location)
    /sized?bytes=N                   200 with an N-byte body (none to a HEAD: a large file's)
    CONNECT HOST:PORT                407 with Proxy-Authenticate: a proxy that refuses tunnels
    /set-cookie?name=N&value=V       200 that sets a cookie
    /cookie-each[/anything]?size=N   200 that sets a new cookie each time (c1, c2, … with N
                                     bytes of value, default 100): a jar that grows without end
    /half                            200 announcing 100 bytes, then 9 of them and a hang-up
  Hostile servers, for testing that every phase of an attempt stays within its limits:
    /trickle-headers?interval=S&lines=N  the status line, then one header line every S seconds
                                     (N of them, default 60), then a small JSON body
    /redirect-body?to=URL&mb=N&interval=S  a 302 to URL (default /ok) with an N MiB body
                                     (default 300), or, with interval, one byte every S seconds
    /stall-upload?hold=S             never reads the request body; closes after S seconds
    /bad-location                    a 302 whose Location is not UTF-8
    /deep?depth=N                    200 with JSON nested N arrays deep (default 1000)
    /surrogate                       200 with {"name": "\\ud800"}: a lone surrogate escape
    /echo-values?style=status|location  echoes the query's values (a key among them) as
                                     careless servers do: in a status line that is not HTTP
                                     (status), or in a 302 to /404/VALUES (location)
    /surrogate-key                   200 with {"\\ud800": 1, "a": {"\\udc00b": 2}}: lone surrogate
                                     escapes in keys
  An OpenAI-compatible endpoint, for SDK clients (base URL http://127.0.0.1:PORT/v1):
    POST /v1/chat/completions        a chat completion whose reply echoes the last message;
                                     a message "429-once:KEY" gets, the first time per KEY, a
                                     429 with Retry-After: 1, and "500-once:KEY" a 500
  A mock LLM API limiting requests and tokens per minute like OpenAI and Anthropic (see
  scripts/mock_llm.py: LIMITS is e.g. rpm=600,tpm=60000,window=6,latency=0.05, or -):
    POST /llm/KEY/LIMITS/v1/chat/completions, /llm/KEY/LIMITS/v1/embeddings (OpenAI) and
         /llm/KEY/LIMITS/v1/messages (Anthropic): answers with `usage` and random lengths,
                                     429s with the providers' bodies, every answer with their
                                     rate-limit headers; each KEY has its own sliding window
    GET /llm/KEY/stats?log=1         JSON: what the KEY's limits counted, window by window
  Their batch APIs on the same prefix (see scripts/mock_batch.py: knobs pace, expire, fail,
  enqueued, shuffle, batch_rows and batch_bytes among the LIMITS; files and batches per KEY):
    POST /llm/KEY/LIMITS/v1/files (multipart upload), GET /v1/files, GET|DELETE
         /v1/files/ID, GET /v1/files/ID/content: OpenAI's Files API
    POST|GET /llm/KEY/LIMITS/v1/batches (?limit=N&after=ID), GET /v1/batches/ID, POST
         /v1/batches/ID/cancel: OpenAI's Batch API, states stepped by the clock
    POST|GET /llm/KEY/LIMITS/v1/messages/batches, GET|DELETE /v1/messages/batches/ID, GET
         .../ID/results (JSONL), POST .../ID/cancel: Anthropic's Message Batches API
    GET /llm/KEY/batch-stats         JSON: files and batches of the KEY, rows run, rows run
                                     twice, refused creates, the keys seen
  Quotas announced in rate-limit headers, with a real per-window counter:
    /quota/FAMILY/...?limit=N&window=S&style=x|github|ietf
                                     N requests of a FAMILY per S-second window, each answer
                                     saying how many are left and when the window resets
                                     (X-RateLimit-* with seconds left; GitHub's epoch reset and
                                     403; the IETF RateLimit field); over it: 429 (GitHub: 403)
  Paginated collections of TOTAL records {"n": i}, SIZE a page, the next page named by STYLE:
    /pages/STYLE/...?total=N&size=K&fail=P&fail_times=T&tag=X&base=URL&limit=L&window=S
                                     link (a Link header), cursor (an opaque "next" in the
                                     body, sent back as cursor=), next (the next path in the
                                     body), page (page=1, 2, … until an empty page), offset
                                     (offset=0, K, … until an empty page); page P answers 503
                                     its first T requests (always without fail_times); a
                                     next page is named on the server at base when given;
                                     with limit, a quota as /quota's (family, style x)
    /endless-pages?kb=N&cursor=C     a collection that never ends: pages of about N KiB
                                     (default 1024) whose "next" is always a new cursor
  An S3-compatible bucket, for boto3 (endpoint_url=http://127.0.0.1:PORT, path-style):
    GET/HEAD /s3-mock/KEY            the object KEY ("object KEY"); a KEY starting with
                                     "slowdown-once" gets, the first time, a 503 SlowDown
                                     with Retry-After: 1, and "missing" a 404 NoSuchKey
  Tokens that expire, for auth= and --auth-command (per REALM, so tests do not share):
    /token/REALM?uses=N&ttl=S&refuse=1&format=header
                                     issue a fresh random bearer token good for N requests
                                     (default 10) and S seconds (default 3600); refuse=1: one
                                     /protected refuses anyway. JSON {"access_token": ...};
                                     format=header: the text "Bearer TOKEN"
    /protected/REALM/...             200 JSON for "Authorization: Bearer TOKEN" with a live
                                     token of REALM; else 401 (WWW-Authenticate, and a body
                                     that echoes the token, as careless servers do)
    /tokens/REALM                    JSON: tokens issued, tokens that expired (refused once
                                     used up or out of time), 401s answered
    /stats?log=1                     JSON: requests per target, peak concurrency, connections
                                     (with log=1 also each request's arrival time and status)
    /stats/reset                     clear the stats

Every path except /stats counts towards the stats: ``counts`` (per path with query),
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
import sys
import threading
import time
import zlib
from collections import Counter
from collections.abc import Mapping
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlencode, urlsplit

from mock_batch import BatchMock
from mock_gemini import GeminiMock
from mock_llm import LLMMock

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
        if self.path.startswith("/stall-upload"):  # before reading the body: that is the point
            self._stall_upload()
            return
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        parts = urlsplit(self.path)
        path, query = parts.path, {k: v[-1] for k, v in parse_qs(parts.query).items()}
        if path == "/stats":
            self._json(200, self.server.stats.snapshot(with_log=query.get("log") == "1"))
            return
        if path == "/stats/reset":
            self.server.stats.reset()
            self._json(200, {"reset": True})
            return
        stats = self.server.stats
        if not self.counted_connection:
            self.counted_connection = True
            stats.connected()
        entry = self.entry = stats.begin(self.path, self.headers.get("Host", ""))  # (a route
        # may add to its log entry)
        self.status: int | None = None
        try:
            self._route(path, query, body)
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        finally:
            stats.end(entry, self.status)

    def send_response(self, code: int, message: str | None = None) -> None:
        self.status = code
        super().send_response(code, message)

    def _route(self, path: str, query: dict[str, str], body: bytes) -> None:
        head = "/" + path.strip("/").split("/", 1)[0]
        delay = float(query.get("delay", 2.0 if head == "/slow" else 0.0))
        if delay:
            time.sleep(delay)
        if head in ("/ok", "/slow"):
            self._json(200, {"path": path, "ok": True})
        elif head in ("/429-once", "/429-date"):
            wait = float(query.get("retry_after", "1"))
            if self.server.stats.times_seen(path) == 1:
                when = (
                    email.utils.formatdate(time.time() + wait, usegmt=True)
                    if head == "/429-date"
                    else f"{wait:g}"
                )
                self._json(429, {"error": "slow down"}, {"Retry-After": when})
            else:
                self._json(200, {"path": path, "ok": True})
        elif head == "/account":
            account = path.strip("/").split("/")[1]
            if self.server.stats.times_seen(f"account {account}") == 1:
                retry_after = query.get("retry_after", "1")
                self._json(429, {"error": "account limit"}, {"Retry-After": retry_after})
            else:
                self._json(200, {"path": path, "ok": True})
        elif head == "/limited":
            self._limited(query)
        elif head == "/503-then-ok":
            family = path.strip("/").split("/")[1]
            if self.server.stats.times_seen(f"503-then-ok {family}") <= int(
                query.get("after", "3")
            ):
                self._json(503, {"error": "unavailable"})
            else:
                self._json(200, {"path": path, "ok": True})
        elif head == "/jitter":
            family = path.strip("/").split("/")[1]
            if (
                self.server.stats.times_seen(f"jitter {family}") % int(query.get("every", "20"))
                == 0
            ):
                time.sleep(float(query.get("slow", "2")))
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
        elif head == "/many-headers":
            extra = {f"X-Header-{n}": str(n) for n in range(int(query.get("n", "150")))}
            self._json(200, {"headers": len(extra)}, extra)
        elif head == "/trickle-headers":
            self._trickle_headers(
                float(query.get("interval", "0.1")), int(query.get("lines", "60"))
            )
        elif head == "/redirect-body":
            self._redirect_body(
                query.get("to", "/ok"), int(query.get("mb", "300")), query.get("interval")
            )
        elif head == "/bad-location":
            self._send(302, b"", "text/plain", {"Location": "/ok/\xff\xfe"})
        elif head == "/deep":
            depth = int(query.get("depth", "1000"))
            self._send(200, b"[" * depth + b"]" * depth, "application/json")
        elif head == "/echo-values":
            self._echo_values(query)
        elif head == "/surrogate":
            self._send(200, b'{"name": "\\ud800"}', "application/json")
        elif head == "/surrogate-key":
            self._send(200, b'{"\\ud800": 1, "a": {"\\udc00b": 2}}', "application/json")
        elif head == "/text":
            self._send(200, "héllo wörld".encode(), "text/plain; charset=utf-8")
        elif head == "/encoded":
            self._encoded(query)
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
        elif head == "/half":
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", "100")
            self.end_headers()
            self.wfile.write(b'{"cut": "')
            self.wfile.flush()
            self.close_connection = True
        elif head == "/quota":
            self._quota(path.strip("/").split("/")[1], query)
        elif head == "/endless-pages":
            number = int(query.get("cursor", "0"))
            pad = "x" * (int(query.get("kb", "1024")) * 1024)
            self._json(200, {"items": [{"n": number, "pad": pad}], "next": str(number + 1)})
        elif head == "/pages":
            self._page(path, path.strip("/").split("/")[1], query)
        elif head == "/s3-mock":
            self._s3_object(path.split("/", 2)[2])
        elif head == "/llm":
            self._llm(path, query, body)
        elif head == "/gemini":
            headers = {name.lower(): value for name, value in self.headers.items()}
            self._reply(*self.server.gemini.answer(self.command, path, query, body, headers))
        elif path == "/v1/chat/completions":
            self._chat_completion(body)
        elif head == "/cookie-each":
            number = self.server.stats.times_seen("cookie-each")
            cookie = f"c{number}={'v' * int(query.get('size', '100'))}; Path=/"
            self._json(200, {"set": f"c{number}"}, {"Set-Cookie": cookie})
        elif head == "/set-cookie":
            cookie = f"{query.get('name', 'session')}={query.get('value', '1')}; Path=/"
            self._json(200, {"set": cookie}, {"Set-Cookie": cookie})
        elif head in ("/token", "/tokens", "/protected"):
            self._bearer(head, path.strip("/").split("/")[1], query)
        elif head == "/redirect":
            code = int(query.get("code", "302"))
            self._send(code, b"", "text/plain", {"Location": query.get("to", "/ok")})
        elif head == "/status":
            self._send(int(path.strip("/").split("/")[1]), b"status", "text/plain")
        elif head == "/sized":
            self._sized(int(query.get("bytes", "0")))
        else:
            self._json(404, {"error": f"no route {path}"})

    def _llm(self, path: str, query: dict[str, str], body: bytes) -> None:
        """The mock LLM API: its batch routes (which read the request's headers: the upload's
        Content-Type, the Host of a results URL, the key) and its live ones."""
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

    def _stall_upload(self) -> None:
        self.close_connection = True
        query = {k: v[-1] for k, v in parse_qs(urlsplit(self.path).query).items()}
        time.sleep(float(query.get("hold", "10")))

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
