"""A hostile batch provider: a fault-injecting reverse proxy in front of the project's mock of
OpenAI's Batch API and Anthropic's Message Batches (batchsync/mock/batch.py).

Tests put it between a batch client and the mock, so that the client meets what a real
provider may do to it and the mock alone does not: an answer it never hears (while the
provider acted), a poll answered 404 once, a results download redirected elsewhere, a
``Retry-After`` of a day, a create whose answer lacks its ``id``, results holding a JSON value
nested 100 000 deep, a provider whose clock is ten minutes off, and a key shared with someone
else's thousands of batches (listed first, newest first) that the client must page past and
never touch::

    with HostileProvider(upstream=server.url) as hostile:
        url = f"{hostile.url}/llm/{key}/{knobs}/v1/messages"
        hostile.once("GET", r"/batches/[^/]+$", status=404)  # the next matching request only
        hostile.skew = -600.0  # the provider's clock 10 min behind the client's
        hostile.other_batches = 3000
        ...
        assert not hostile.touched_others

Built on the standard library only (``http.server`` to listen, ``http.client`` to forward), on
127.0.0.1 and a free port, served from a daemon thread. Every request is forwarded as it came
(method, path and query, headers, body; its ``Host`` too, so that the results URLs the mock
builds point back at the proxy), and the upstream's status, headers (less the hop-by-hop ones,
``Content-Length`` recomputed) and body are returned, unless a fault says otherwise:

* ``once``: the next matching requests are answered by the proxy itself, never forwarded;
* ``rewrite``: forwarded, and the answer's body replaced by a function of it (``deep_json``,
  ``huge_int``, ``set_fields``, ``results_lines`` and ``replace_body`` make such functions);
* ``hold``: forwarded at once, answered late; ``drop``: forwarded, never answered (the
  connection closed);
* ``skew``: the provider's clock off by that many seconds: the ``Date`` header and the time
  fields of JSON answers (not of results downloads) shifted;
* ``other_batches``: that many batches of someone else's, newer than any of the key's own,
  listed first by a list of batches; a GET of one answers it, and anything else done to one
  (cancel, delete, results or file download) is answered 404 and kept in ``touched_others``.

A fault matches a request by its method (any case; ``"*"`` for any) and ``re.search`` of its
path without the query. All settings may change at any time from the test's thread.
``seen`` holds every request by arrival, whoever answered it.
"""

from __future__ import annotations

import contextlib
import enum
import http.client
import json
import re
import socket
import sys
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import formatdate, parsedate_to_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from types import TracebackType
from typing import Any, NamedTuple, Self
from urllib.parse import parse_qsl, urlencode, urlsplit

Transform = Callable[[bytes], bytes]
"""What ``rewrite`` does to an answer's body."""


class _Drop(enum.Enum):
    DROP = "DROP"


DROP = _Drop.DROP
"""``set_fields(name=DROP)`` removes the field ``name``."""

# Headers of one connection, not of the message: never forwarded either way.
HOP_BY_HOP = frozenset(
    {
        "connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer",
        "upgrade", "expect", "content-length",
    }
)  # fmt: skip
# OpenAI's unix-second times (of batches, and files' created_at) and Anthropic's RFC 3339 ones.
OPENAI_TIMES = (
    "created_at", "in_progress_at", "expires_at", "finalizing_at", "completed_at", "failed_at",
    "expired_at", "cancelling_at", "cancelled_at",
)  # fmt: skip
ANTHROPIC_TIMES = ("created_at", "ended_at", "expires_at", "cancel_initiated_at", "archived_at")
TIME_FIELDS = frozenset(OPENAI_TIMES + ANTHROPIC_TIMES)
DEFAULT_LIMIT, MOST_LIMIT = 20, 100
DAY = 24 * 3600

OPENAI, ANTHROPIC = "openai", "anthropic"
_LISTS = {
    OPENAI: re.compile(r"/v1/batches/?$"),
    ANTHROPIC: re.compile(r"/v1/messages/batches/?$"),
}
_CURSOR = {OPENAI: "after", ANTHROPIC: "after_id"}
_FAKE_PREFIX = {OPENAI: "batch_other", ANTHROPIC: "msgbatch_other"}
_FAKE_BATCH = {
    OPENAI: re.compile(r"/v1/batches/(batch_other(\d+))(/.*)?$"),
    ANTHROPIC: re.compile(r"/v1/messages/batches/(msgbatch_other(\d+))(/.*)?$"),
}
_FAKE_FILE = re.compile(r"/v1/files/(file-other[^/]*)(/.*)?$")
# Results downloads: their bodies are the rows' answers, never shifted by the skew.
_RESULTS = re.compile(r"/v1/files/[^/]+/content$|/v1/messages/batches/[^/]+/results$")
_ISO = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?(Z|[+-]\d\d:\d\d)")


# Transforms for ``rewrite``


def deep_json(depth: int = 100_000) -> bytes:
    """A JSON array nested ``depth`` deep (``[[[...]]]``): valid, and past any recursion limit."""
    return b"[" * depth + b"]" * depth


def huge_int(digits: int = 5_000) -> bytes:
    """A JSON integer of ``digits`` digits (past Python's 4 300-digit conversion limit)."""
    return b"1" + b"0" * (digits - 1)


def replace_body(body: bytes) -> Transform:
    """A transform that answers ``body`` whatever the upstream said."""
    return lambda _: body


def set_fields(**fields: object) -> Transform:
    """A transform that loads a JSON object, sets these fields (removes those given ``DROP``)
    and dumps it again; a body that is not a JSON object is left as it is."""

    def transform(body: bytes) -> bytes:
        try:
            value = json.loads(body)
        except ValueError:
            return body
        if not isinstance(value, dict):
            return body
        for name, given in fields.items():
            if given is DROP:
                value.pop(name, None)
            else:
                value[name] = given
        return json.dumps(value).encode()

    return transform


def results_lines(fn_per_line: Callable[[bytes], bytes]) -> Transform:
    """A transform that maps each non-empty line of a JSONL body through ``fn_per_line`` (the
    line without its newline), keeping the line breaks and the empty lines as they were."""

    def transform(body: bytes) -> bytes:
        lines = body.split(b"\n")
        return b"\n".join(fn_per_line(line) if line.strip() else line for line in lines)

    return transform


# The provider's clock


def shift_time(value: object, skew: float) -> object:
    """A time field's value ``skew`` seconds later: unix seconds (an int stays an int) or an
    RFC 3339 string (in the same form: its fraction digits and its ``Z`` or offset kept);
    anything else as it is."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, int):
        return round(value + skew)
    if isinstance(value, float):
        return value + skew
    if not isinstance(value, str) or not (match := _ISO.fullmatch(value)):
        return value
    fraction, zone = match.group(1) or "", match.group(2)
    try:
        moment = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return value
    shifted = moment + timedelta(seconds=skew)  # (the same offset as the original)
    text = shifted.strftime("%Y-%m-%dT%H:%M:%S")
    if fraction:
        digits = len(fraction) - 1
        micro = f"{shifted.microsecond:06d}"
        text += "." + (micro[:digits] if digits <= 6 else micro + "0" * (digits - 6))
    return text + zone


def _shift_object(value: dict[str, Any], skew: float) -> None:
    for name in TIME_FIELDS & value.keys():
        value[name] = shift_time(value[name], skew)


def shift_json(body: bytes, skew: float) -> bytes:
    """A JSON answer with its time fields (``TIME_FIELDS``, of the object and of each item of
    its ``data``) shifted by ``skew``; the body unchanged when there is nothing to shift."""
    if not skew or not body:
        return body
    try:
        value = json.loads(body)
    except (ValueError, RecursionError):
        return body
    if not isinstance(value, dict):
        return body
    _shift_object(value, skew)
    data = value.get("data")
    if isinstance(data, list):
        for item in data:
            if isinstance(item, dict):
                _shift_object(item, skew)
    return json.dumps(value).encode()


def shift_date(value: str | None, skew: float) -> str:
    """An HTTP ``Date`` ``skew`` seconds later (now, skewed, when there is none or it does not
    parse)."""
    moment = time.time()
    if value:
        with contextlib.suppress(TypeError, ValueError, IndexError):
            moment = parsedate_to_datetime(value).timestamp()
    return formatdate(moment + skew, usegmt=True)


def _iso(moment: float) -> str:
    """Anthropic's form of a time: RFC 3339 in UTC, to the millisecond, ending in ``Z``."""
    return datetime.fromtimestamp(moment, UTC).isoformat(timespec="milliseconds")[:-6] + "Z"


# Someone else's batches


def fake_batch(provider: str, number: int, now: float) -> dict[str, Any]:
    """Someone else's ended batch ``number`` at ``now`` (on the real clock: the skew comes on
    top, as on every answer)."""
    if provider == OPENAI:
        moment = int(now)
        return {
            "id": f"batch_other{number}",
            "object": "batch",
            "endpoint": "/v1/chat/completions",
            "errors": None,
            "input_file_id": f"file-other{number}",
            "completion_window": "24h",
            "status": "completed",
            "output_file_id": f"file-other{number}-output",
            "error_file_id": None,
            "created_at": moment,
            "in_progress_at": moment,
            "expires_at": moment + DAY,
            "finalizing_at": moment,
            "completed_at": moment,
            "failed_at": None,
            "expired_at": None,
            "cancelling_at": None,
            "cancelled_at": None,
            "request_counts": {"total": 7, "completed": 7, "failed": 0},
            "metadata": None,
        }
    return {
        "id": f"msgbatch_other{number}",
        "type": "message_batch",
        "processing_status": "ended",
        "request_counts": {
            "processing": 0,
            "succeeded": 7,
            "errored": 0,
            "canceled": 0,
            "expired": 0,
        },
        "ended_at": _iso(now),
        "created_at": _iso(now),
        "expires_at": _iso(now + DAY),
        "cancel_initiated_at": None,
        "archived_at": None,
        "results_url": None,
    }


def page_limit(given: str | None) -> int:
    """A list's ``limit``: 20 when not given (or not a number), between 1 and 100."""
    if given is None or not given.isdigit():
        return DEFAULT_LIMIT
    return max(1, min(int(given), MOST_LIMIT))


# The proxy


class Request(NamedTuple):
    """A request the proxy took: its method, its path and its query (without the ``?``)."""

    method: str
    path: str
    query: str


@dataclass
class Reply:
    """An answer: its status, headers (in order, repeats kept) and body."""

    status: int
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def header(self, name: str) -> str | None:
        return next((v for n, v in self.headers if n.lower() == name.lower()), None)


def _json_reply(status: int, value: object) -> Reply:
    return Reply(status, [("Content-Type", "application/json")], json.dumps(value).encode())


def _not_found(provider: str, what: str) -> Reply:
    """The provider's 404 for the batch (or file) ``what``."""
    if provider == ANTHROPIC:
        message = f"No message batch with id {what!r}."
        return _json_reply(
            404, {"type": "error", "error": {"type": "not_found_error", "message": message}}
        )
    message = f"No such object: '{what}'."
    kind = "invalid_request_error"
    return _json_reply(
        404, {"error": {"message": message, "type": kind, "param": "id", "code": None}}
    )


@dataclass
class _Rule:
    kind: str  # "answer", "rewrite", "hold" or "drop"
    method: str
    pattern: re.Pattern[str]
    times: int | None  # (None: every match)
    reply: Reply | None = None
    transform: Transform | None = None
    seconds: float = 0.0

    def matches(self, method: str, path: str) -> bool:
        return (
            (self.times is None or self.times > 0)
            and self.method in ("*", method.upper())
            and self.pattern.search(path) is not None
        )


@dataclass
class _Plan:
    """What the faults do to one request, decided (and their counts spent) on its arrival."""

    answer: Reply | None = None
    rewrites: list[Transform] = field(default_factory=list)
    hold: float = 0.0
    drop: bool = False
    skew: float = 0.0
    others: int = 0


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    block_on_close = False  # (a held answer or an idle kept-alive connection must not block)
    hostile: HostileProvider

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Quiet about clients that went away (killed while an answer was held: the point)."""
        if not isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: ``seen`` is the log."""

    def setup(self) -> None:
        super().setup()
        self.server.hostile._opened(self.connection)

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.hostile._closed(self.connection)

    def do_GET(self) -> None:
        body = self._body()
        if body is not None:
            self.server.hostile._serve(self, body)

    do_POST = do_PUT = do_PATCH = do_DELETE = do_HEAD = do_OPTIONS = do_GET

    def _body(self) -> bytes | None:
        """The request's body, by Content-Length or chunked (None, and a 400, when neither
        reads)."""
        if "chunked" in self.headers.get("Transfer-Encoding", "").lower():
            chunks: list[bytes] = []
            while True:
                size_line = self.rfile.readline(1024)
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    self.send_error(400, "bad chunk size")
                    return None
                if size == 0:
                    while self.rfile.readline(65_536).strip():  # (trailers)
                        pass
                    return b"".join(chunks)
                chunks.append(self.rfile.read(size))
                self.rfile.readline(1024)
        length = self.headers.get("Content-Length") or "0"
        if not length.strip().isdigit():
            self.send_error(400, "bad Content-Length")
            return None
        return self.rfile.read(int(length)) if int(length) else b""


class HostileProvider:
    """The hostile provider in front of the mock at ``upstream`` (``http://HOST:PORT``, maybe
    with a base path), listening on ``url`` from the moment it is made until ``close()`` (or
    the end of its ``with``). ``timeout``: how long to wait for the upstream's answer."""

    def __init__(
        self, upstream: str, *, host: str = "127.0.0.1", port: int = 0, timeout: float = 120.0
    ) -> None:
        parts = urlsplit(upstream)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the upstream is an http(s) URL: {upstream!r}")
        self.upstream = upstream.rstrip("/")
        self.timeout = timeout
        self._upstream_parts = (parts.scheme, parts.hostname, parts.port, parts.path.rstrip("/"))
        self._lock = threading.Lock()
        self._rules: list[_Rule] = []
        self._skew = 0.0
        self._other_batches = 0
        self._seen: list[Request] = []
        self._touched: list[Request] = []
        self._connections: set[socket.socket] = set()
        self._stopped = threading.Event()
        self._server = _Server((host, port), _Handler)
        self._server.hostile = self
        bound_host, bound_port = self._server.server_address[:2]
        self.url = f"http://{bound_host!s}:{bound_port}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(0.05,), name="hostile-batch", daemon=True
        )
        self._thread.start()

    # Life

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Stop listening, release held answers and close the clients' connections."""
        if self._stopped.is_set():
            return
        self._stopped.set()
        self._server.shutdown()
        self._server.server_close()
        with self._lock:
            connections = list(self._connections)
        for connection in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=10)

    # Faults

    def once(
        self,
        method: str,
        path_regex: str,
        *,
        status: int,
        headers: Mapping[str, str] | None = None,
        body: bytes | dict[str, Any] | list[Any] = b"",
        times: int = 1,
    ) -> None:
        """Answer the next ``times`` matching requests with this status, headers and body
        (a dict or list is sent as JSON), without forwarding them: upstream nothing happens."""
        given = list((headers or {}).items())
        if not isinstance(body, bytes):
            body = json.dumps(body).encode()
            if not any(name.lower() == "content-type" for name, _ in given):
                given.append(("Content-Type", "application/json"))
        self._add(
            _Rule("answer", method, re.compile(path_regex), times, Reply(status, given, body))
        )

    def rewrite(
        self, method: str, path_regex: str, fn: Transform, *, times: int | None = None
    ) -> None:
        """Forward the matching requests, and answer ``fn(body)`` for the upstream's body (the
        status and headers kept); ``times=None``: every matching request. Several rewrites of
        one request apply in the order they were given, after the skew."""
        self._add(_Rule("rewrite", method, re.compile(path_regex), times, transform=fn))

    def hold(self, method: str, path_regex: str, seconds: float, *, times: int = 1) -> None:
        """Forward the matching requests at once (upstream they are done), but answer them
        ``seconds`` later (sooner if the proxy closes)."""
        self._add(_Rule("hold", method, re.compile(path_regex), times, seconds=seconds))

    def drop(self, method: str, path_regex: str, *, times: int = 1) -> None:
        """Forward the matching requests, then close their connection without an answer: the
        upstream acted and the client never hears of it."""
        self._add(_Rule("drop", method, re.compile(path_regex), times))

    def reset(self) -> None:
        """Forget every fault, the skew and the other batches (``seen`` is kept)."""
        with self._lock:
            self._rules.clear()
            self._skew = 0.0
            self._other_batches = 0

    def _add(self, rule: _Rule) -> None:
        rule.method = rule.method.upper()
        if rule.times is not None and rule.times < 1:
            raise ValueError(f"times is at least 1 (or None for rewrite): {rule.times}")
        with self._lock:
            self._rules.append(rule)

    @property
    def skew(self) -> float:
        """Seconds the provider's clock is off the real one (negative: behind)."""
        with self._lock:
            return self._skew

    @skew.setter
    def skew(self, seconds: float) -> None:
        with self._lock:
            self._skew = float(seconds)

    @property
    def other_batches(self) -> int:
        """How many batches of someone else's the key has, newer than its own."""
        with self._lock:
            return self._other_batches

    @other_batches.setter
    def other_batches(self, count: int) -> None:
        if count < 0:
            raise ValueError(f"other_batches is at least 0: {count}")
        with self._lock:
            self._other_batches = int(count)

    # What it saw

    @property
    def seen(self) -> list[Request]:
        """Every request taken, by arrival (a copy)."""
        with self._lock:
            return list(self._seen)

    @property
    def touched_others(self) -> list[Request]:
        """The requests that cancelled, deleted or downloaded (results or a file) someone
        else's batch (a copy): a well-behaved client leaves this empty."""
        with self._lock:
            return list(self._touched)

    def count(self, method: str, path_regex: str) -> int:
        """How many requests taken match ``method`` (``"*"``: any) and ``path_regex``."""
        pattern, method = re.compile(path_regex), method.upper()
        return sum(
            method in ("*", seen.method) and pattern.search(seen.path) is not None
            for seen in self.seen
        )

    # Serving

    def _opened(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.add(connection)

    def _closed(self, connection: socket.socket) -> None:
        with self._lock:
            self._connections.discard(connection)

    def _plan(self, request: Request) -> _Plan:
        """Note the request, and decide (spending the faults' counts) what happens to it: the
        first matching ``once`` answers it (and no other fault is spent), or else every
        matching ``rewrite`` and the first matching ``hold`` and ``drop`` apply."""
        method, path = request.method, request.path
        with self._lock:
            self._seen.append(request)
            plan = _Plan(skew=self._skew, others=self._other_batches)
            matching = [rule for rule in self._rules if rule.matches(method, path)]
            answer = next((rule for rule in matching if rule.kind == "answer"), None)
            if answer is not None:
                plan.answer, spent = answer.reply, [answer]
            else:
                spent = [rule for rule in matching if rule.kind == "rewrite"]
                plan.rewrites = [rule.transform for rule in spent if rule.transform is not None]
                for kind in ("hold", "drop"):
                    rule = next((rule for rule in matching if rule.kind == kind), None)
                    if rule is not None:
                        spent.append(rule)
                        plan.hold = rule.seconds if kind == "hold" else plan.hold
                        plan.drop = plan.drop or kind == "drop"
            for rule in spent:
                if rule.times is not None:
                    rule.times -= 1
            self._rules = [rule for rule in self._rules if rule.times is None or rule.times > 0]
        return plan

    def _serve(self, handler: _Handler, body: bytes) -> None:
        target = urlsplit(handler.path)
        request = Request(handler.command.upper(), target.path, target.query)
        plan = self._plan(request)
        headers = list(handler.headers.items())
        if plan.answer is not None:
            self._send(handler, plan.answer, plan.skew, given=True)
            return
        reply = self._fake(request, plan.others)
        if reply is None:
            reply = self._listing(request, headers, body, plan.others)
        if reply is None:
            reply = self._forward(request.method, handler.path, headers, body)
        content_type = (reply.header("Content-Type") or "").lower()
        if "json" in content_type and not _RESULTS.search(request.path):
            reply.body = shift_json(reply.body, plan.skew)
        try:
            for transform in plan.rewrites:
                reply.body = transform(reply.body)
        except Exception as problem:  # (a broken transform is the test's bug: say so)
            message = f"hostile_batch: a rewrite failed: {problem!r}".encode()
            reply = Reply(500, [("Content-Type", "text/plain")], message)
        if plan.hold:
            self._stopped.wait(plan.hold)
        if plan.drop:
            handler.close_connection = True
            return
        self._send(handler, reply, plan.skew)

    def _send(self, handler: _Handler, reply: Reply, skew: float, *, given: bool = False) -> None:
        """Write ``reply``: the Date on the provider's clock (a ``once``'s own Date kept)."""
        head = handler.command.upper() == "HEAD"
        try:
            handler.send_response_only(reply.status)
            dated = False
            length: str | None = None
            for name, value in reply.headers:
                lowered = name.lower()
                if lowered == "content-length" and head:
                    length = value
                if lowered in HOP_BY_HOP:
                    continue
                dated = dated or lowered == "date"
                skewed = lowered == "date" and not given
                handler.send_header(name, shift_date(value, skew) if skewed else value)
            if not dated:
                handler.send_header("Date", shift_date(None, skew))
            handler.send_header("Content-Length", length or str(len(reply.body)))
            handler.end_headers()
            if not head:
                handler.wfile.write(reply.body)
        except (ConnectionError, TimeoutError):
            handler.close_connection = True

    def _forward(
        self, method: str, target: str, headers: list[tuple[str, str]], body: bytes
    ) -> Reply:
        """The upstream's answer to this request (502 when it gives none)."""
        scheme, hostname, port, base = self._upstream_parts
        kind = http.client.HTTPSConnection if scheme == "https" else http.client.HTTPConnection
        connection = kind(hostname, port, timeout=self.timeout)
        try:
            connection.putrequest(method, base + target, skip_host=True, skip_accept_encoding=True)
            if not any(name.lower() == "host" for name, _ in headers):
                connection.putheader("Host", urlsplit(self.upstream).netloc)
            for name, value in headers:
                if name.lower() not in HOP_BY_HOP:
                    connection.putheader(name, value)
            if body or method in ("POST", "PUT", "PATCH"):
                connection.putheader("Content-Length", str(len(body)))
            connection.endheaders(body or None)
            response = connection.getresponse()
            data = response.read()
            return Reply(response.status, response.getheaders(), data)
        except (OSError, http.client.HTTPException) as problem:
            message = f"hostile_batch: the upstream gave no answer: {problem!r}".encode()
            return Reply(502, [("Content-Type", "text/plain")], message)
        finally:
            connection.close()

    def _fake(self, request: Request, others: int) -> Reply | None:
        """The answer to a request about someone else's batch or file (None when it is not
        about one), noting those that would cancel, delete or download one."""
        method = request.method
        if match := _FAKE_FILE.search(request.path):
            if method == "DELETE" or match.group(2) == "/content":
                self._touch(request)
            return _not_found(OPENAI, match.group(1))
        for provider, pattern in _FAKE_BATCH.items():
            if match := pattern.search(request.path):
                ident, number, rest = match.group(1), int(match.group(2)), match.group(3) or ""
                if method == "DELETE" or rest in ("/cancel", "/results"):
                    self._touch(request)
                if method == "GET" and not rest and 1 <= number <= others:
                    return _json_reply(200, fake_batch(provider, number, time.time()))
                return _not_found(provider, ident)
        return None

    def _touch(self, request: Request) -> None:
        with self._lock:
            self._touched.append(request)

    def _listing(
        self, request: Request, headers: list[tuple[str, str]], body: bytes, others: int
    ) -> Reply | None:
        """A list of batches with someone else's ``others`` batches first (None when this is
        no list of batches, or there are none of theirs)."""
        if request.method != "GET" or not others:
            return None
        provider = next((p for p, r in _LISTS.items() if r.search(request.path)), None)
        if provider is None:
            return None
        query = dict(parse_qsl(request.query, keep_blank_values=True))
        limit = page_limit(query.get("limit"))
        numbers = list(range(others, 0, -1))  # (newest first)
        index = {f"{_FAKE_PREFIX[provider]}{n}": k for k, n in enumerate(numbers)}
        cursor = _CURSOR[provider]
        ours = ("limit", cursor, "before_id") if provider == ANTHROPIC else ("limit", cursor)
        passed = {k: v for k, v in query.items() if k not in ours}

        def upstream(**given: str) -> tuple[Reply, dict[str, Any] | None]:
            target = request.path + "?" + urlencode({**passed, **given})
            reply = self._forward(request.method, target, headers, body)
            try:
                page = json.loads(reply.body) if reply.status == 200 else None
            except ValueError:
                page = None
            return reply, page if isinstance(page, dict) else None

        now = time.time()
        before = (query.get("before_id") or None) if provider == ANTHROPIC else None
        if before is not None:  # (Anthropic's page of the ones newer than ``before_id``)
            if before in index:
                end = index[before]
                reply, page = upstream(limit="1")
                if page is None:
                    return reply
                chosen = numbers[max(0, end - limit) : end]
                items, more = [fake_batch(provider, n, now) for n in chosen], end - limit > 0
            else:
                reply, page = upstream(limit=str(limit), before_id=before)
                if page is None:
                    return reply
                items, more = list(page.get("data") or []), bool(page.get("has_more"))
                room = limit - len(items)
                if not more and room > 0:
                    chosen = numbers[max(0, others - room) :]
                    items = [fake_batch(provider, n, now) for n in chosen] + items
                    more = others - room > 0
                elif not more:
                    more = True  # (theirs are newer still)
        else:
            after = query.get(cursor) or None
            if after is None:
                start = 0
            elif after in index:
                start = index[after] + 1
            else:
                start = others  # (past all of theirs: a real id)
            chosen = numbers[start : start + limit]
            items = [fake_batch(provider, n, now) for n in chosen]
            room = limit - len(items)
            given = {cursor: after} if after is not None and after not in index else {}
            reply, page = upstream(limit=str(room or 1), **given)
            if page is None:
                return reply
            real = list(page.get("data") or [])
            if room:
                items += real
                more = bool(page.get("has_more"))
            else:
                more = start + limit < others or bool(real)
        listing: dict[str, Any] = {"object": "list"} if provider == OPENAI else {}
        listing |= {
            "data": items,
            "first_id": items[0]["id"] if items else None,
            "last_id": items[-1]["id"] if items else None,
            "has_more": more,
        }
        kept = [(n, v) for n, v in reply.headers if n.lower() != "content-type"]
        return Reply(
            200, [*kept, ("Content-Type", "application/json")], json.dumps(listing).encode()
        )
