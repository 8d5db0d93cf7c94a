"""The server's own word on retrying: ``x-should-retry``, as the official OpenAI and Anthropic
SDKs obey it. ``false`` makes an answer final whatever its status; ``true`` makes it
retryable (within the attempts and the budget, and for any method: the server says a new try
is safe); any other value leaves the status to decide."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar

import pytest

from batchsync import Backoff, fetch_all
from batchsync.http.classify import classify_status


@pytest.mark.parametrize(
    ("status", "said", "outcome"),
    [
        (503, "false", "terminal"),
        (429, "false", "terminal"),
        (400, "true", "retry"),
        (409, "True", "retry"),
        (503, " true ", "retry"),
        (503, "maybe", "retry"),  # (not a word it gives: the status decides)
        (400, "1", "terminal"),
    ],
)
def test_the_servers_word_on_retrying_decides_over_the_status(
    status: int, said: str, outcome: str
) -> None:
    verdict = classify_status(status, None, 0.0, should_retry=said)
    assert verdict is not None and verdict.outcome == outcome


def test_a_success_stays_a_success_whatever_the_server_says() -> None:
    assert classify_status(200, None, 0.0, should_retry="true") is None


class _Scripted(BaseHTTPRequestHandler):
    """``/no``: 503 saying do not retry. ``/yes``: 400 saying retry, twice, then 200."""

    seen: ClassVar[Counter[str]] = Counter()
    lock = threading.Lock()

    def _answer(self) -> None:
        with self.lock:
            self.seen[self.path] += 1
            count = self.seen[self.path]
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        status, word = (503, "false") if self.path == "/no" else (400, "true")
        if self.path == "/yes" and count > 2:
            status, word = 200, "false"  # (a success is one whatever it says)
        body = b'{"n": %d}' % count
        self.send_response(status)
        self.send_header("x-should-retry", word)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _answer

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def scripted() -> Iterator[tuple[str, Counter[str]]]:
    _Scripted.seen = Counter()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Scripted)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", _Scripted.seen
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_server_that_says_retry_gets_its_tries_and_one_that_says_no_gets_one(
    scripted: tuple[str, Counter[str]], method: str
) -> None:
    """Counted by the server: the 503 that says no is sent once (3 attempts were allowed), the
    400s that say yes are tried again until the answer, a POST without an idempotency key
    too."""
    base, seen = scripted
    items = [{"url": f"{base}{path}", "method": method, "json": {}} for path in ("/no", "/yes")]
    no, yes = fetch_all(items, attempts=3, backoff=Backoff(base=0.01, jitter=0))
    assert dict(seen) == {"/no": 1, "/yes": 3}
    assert (no.ok, no.error_kind, no.attempts, no.error) == (False, "status", 1, "HTTP 503")
    assert (yes.ok, yes.attempts, yes.data) == (True, 3, {"n": 3})


def test_every_place_an_answer_is_judged_takes_the_servers_word() -> None:
    """An answer the caller's hook refused, and a batch endpoint's answer, as a live one."""
    from batchsync.batches.client import _judged
    from batchsync.http.classify import classify_refused_answer
    from batchsync.http.retries import RETRYABLE

    refused = classify_refused_answer(RuntimeError("no"), 503, None, 0.0, should_retry="false")
    assert refused.outcome == "terminal"
    assert _judged(503, {"x-should-retry": "false"}, 0.0, RETRYABLE).outcome == "terminal"
    assert _judged(400, {"x-should-retry": "true"}, 0.0, RETRYABLE).outcome == "retry"
