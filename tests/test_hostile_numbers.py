"""Hostile numbers in headers and bodies (hundreds of digits, other scripts' digits, floats'
words) end an item as what the answer was: the header readers refuse them, and a real run
against a server sending them keeps every answer and counts every attempt."""

from __future__ import annotations

import http
import json
import threading
import uuid
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict

from batchsync import Backoff, fetch_all
from batchsync.core.backoff import parse_retry_after
from batchsync.core.numbers import MAX_COUNT
from batchsync.core.verdict import Announced
from batchsync.http.provider import announced, parse_duration
from batchsync.http.quota import quota_wait, retry_after_of
from batchsync.limits.tokens import estimate_tokens, usage_tokens

pytestmark = pytest.mark.integration

HUGE = "1" + "0" * 400
NOW = 1_796_180_640.0

# Values int() or float() read, or overflow on, or that are no number at all.
HOSTILE = [
    HUGE,
    "9" * 309,
    "1" + "0" * 20,
    "-1",
    "²",
    "1²",
    "\u0661\u0662",
    "\uff11\uff12",
    "NaN",
    "inf",
    "1e5",
    "1_000",
    "0x10",
    "",
    "1.7976931348623157e308",
]


def _only(headers: list[tuple[str, str]]) -> Announced | None:
    return announced(headers, NOW)


# (a) the readers


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    "name",
    [
        "x-ratelimit-limit-requests",
        "x-ratelimit-limit-tokens",
        "x-ratelimit-remaining-requests",
        "x-ratelimit-remaining-tokens",
        "anthropic-ratelimit-requests-limit",
        "anthropic-ratelimit-tokens-remaining",
        "anthropic-ratelimit-input-tokens-remaining",
    ],
)
def test_a_provider_count_that_is_no_count_is_not_said(name: str, value: str) -> None:
    said = _only([(name, value)])
    assert said is not None
    counts = (said.requests_limit, said.requests_remaining, said.tokens_limit)
    assert counts == (None, None, None)
    assert said.tokens_remaining is None


@pytest.mark.parametrize(
    "value", [*HOSTILE, HUGE + "s", "99999999999h", "1" * 39 + "h", "²s", "1h" * 30, "\u0661s"]
)
def test_a_reset_that_is_no_duration_is_not_said(value: str) -> None:
    said = _only([("x-ratelimit-reset-tokens", value), ("x-ratelimit-reset-requests", value)])
    assert said == Announced()
    assert parse_duration(value) is None


def test_a_reset_far_in_the_future_is_not_said() -> None:
    said = _only(
        [
            ("anthropic-ratelimit-tokens-reset", "9999-12-31T23:59:59Z"),
            ("anthropic-ratelimit-requests-reset", "9999-12-31T23:59:59+00:00"),
        ]
    )
    assert said == Announced()


@pytest.mark.parametrize("value", HOSTILE)
def test_azure_s_wait_that_is_no_number_is_not_said(value: str) -> None:
    said = _only([("retry-after-ms", value), ("x-ms-retry-after-ms", value)])
    assert said == Announced()
    assert retry_after_of(CaseInsensitiveDict({"retry-after-ms": value})) is None
    assert retry_after_of(CaseInsensitiveDict({"x-ms-retry-after-ms": value})) is None


def test_azure_s_wait_reads_in_seconds_that_retry_after_reads_back() -> None:
    assert retry_after_of(CaseInsensitiveDict({"retry-after-ms": "1500"})) == "1.5"
    for millis in ("0.01", "1", "2500", "9999999999"):
        text = retry_after_of(CaseInsensitiveDict({"retry-after-ms": millis}))
        assert text is not None
        assert text.replace(".", "", 1).isascii() and text.replace(".", "", 1).isdigit(), text
        assert parse_retry_after(text, NOW) == pytest.approx(float(millis) / 1000)


def test_the_other_azure_wait_stands_when_one_is_no_number() -> None:
    both = CaseInsensitiveDict({"retry-after-ms": "²", "x-ms-retry-after-ms": "2000"})
    assert retry_after_of(both) == "2"


@pytest.mark.parametrize("value", HOSTILE)
@pytest.mark.parametrize(
    "kind", ["x-ratelimit-remaining", "x-ratelimit-reset", "ratelimit-reset", "ratelimit"]
)
def test_a_quota_header_that_is_no_number_says_no_wait(kind: str, value: str) -> None:
    headers = {
        "x-ratelimit-remaining": [("X-RateLimit-Remaining", value), ("X-RateLimit-Reset", "30")],
        "x-ratelimit-reset": [("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", value)],
        "ratelimit-reset": [("RateLimit-Remaining", "0"), ("RateLimit-Reset", value)],
        "ratelimit": [("RateLimit", f'"default";r=0;t={value}')],
    }[kind]
    assert quota_wait(headers, lambda: NOW) is None


@pytest.mark.parametrize(
    "headers",
    [
        [("RateLimit", f'"default";r={HUGE};t=30')],
        [("RateLimit", '"default";r=0'), ("RateLimit-Policy", f'"default";q=100;w={HUGE}')],
        [("RateLimit", "remaining=0, reset=" + "9" * 309)],
        [("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "9" * 12)],  # epoch in ms: too far
        [("X-RateLimit-Remaining", "\u0660"), ("X-RateLimit-Reset", "30")],  # Arabic-Indic zero
    ],
)
def test_a_structured_or_far_quota_says_no_wait(headers: list[tuple[str, str]]) -> None:
    assert quota_wait(headers, lambda: NOW) is None


def test_an_honest_quota_still_says_its_wait() -> None:
    assert quota_wait([("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "30")], lambda: NOW)
    assert quota_wait([("RateLimit", '"default";r=0;t=7')], lambda: NOW) == 7.0
    epoch = [("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", str(int(NOW) + 60))]
    assert quota_wait(epoch, lambda: NOW) == 60.0


@pytest.mark.parametrize(
    ("usage", "expected"),
    [
        ({"total_tokens": 10**400}, None),
        ({"total_tokens": MAX_COUNT + 1}, None),
        ({"total_tokens": -5}, None),
        ({"total_tokens": True}, None),
        ({"total_tokens": 12.0}, None),
        ({"total_tokens": "12"}, None),
        ({"total_tokens": float("inf")}, None),
        ({"total_tokens": float("nan")}, None),
        ({"total_tokens": 10**400, "prompt_tokens": 3, "completion_tokens": 4}, 7),
        ({"prompt_tokens": 10**400, "completion_tokens": 4}, 4),
        ({"input_tokens": MAX_COUNT, "output_tokens": MAX_COUNT}, MAX_COUNT),
        ({"total_tokens": 12}, 12),
    ],
)
def test_a_usage_that_is_no_count_is_not_used(usage: dict[str, Any], expected: int | None) -> None:
    assert usage_tokens({"usage": usage}) == expected


def test_a_usage_of_400_digits_parsed_from_json_is_not_used() -> None:
    body = json.loads('{"usage": {"total_tokens": ' + HUGE + "}}")
    assert usage_tokens(body) is None


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10**400},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": MAX_COUNT + 1},
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 10, "n": 10**400},
        {"prompt": ["a", "b", "c"], "max_tokens": MAX_COUNT},
        {"input": "hi", "max_output_tokens": 10**13},
    ],
)
def test_an_estimate_beyond_the_bound_is_the_bound(body: dict[str, Any]) -> None:
    assert estimate_tokens(body) == MAX_COUNT


@pytest.mark.parametrize("limit", [-1, True, 1.5, "100", float("inf"), None])
def test_an_allowance_that_is_no_count_adds_nothing(limit: object) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": limit}
    assert estimate_tokens(body) == estimate_tokens({"messages": body["messages"]})


# (b) a real run against a server sending them


@dataclass
class Reply:
    status: int
    headers: list[tuple[str, str]]
    body: bytes


@dataclass
class Plans:
    """What the server answers each path, attempt by attempt (the last one again after),
    and what it did: requests counted per path, the status of each path's last answer."""

    replies: dict[str, list[Reply]] = field(default_factory=dict)
    counts: Counter[str] = field(default_factory=Counter)
    last_status: dict[str, int] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def answer(self, path: str) -> Reply:
        with self.lock:
            self.counts[path] += 1
            replies = self.replies.get(path) or [Reply(404, [], b"{}")]
            reply = replies[min(self.counts[path], len(replies)) - 1]
            self.last_status[path] = reply.status
            return reply


def _encoded(value: str) -> bytes:
    """A header value's bytes as a hostile server may send them: Latin-1 when it can be
    (``²`` arrives as ``²``), else UTF-8."""
    try:
        return value.encode("latin-1")
    except UnicodeEncodeError:
        return value.encode()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _Server

    def _serve(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        reply = self.server.plans.answer(self.path)
        lines = [f"HTTP/1.1 {reply.status} {http.HTTPStatus(reply.status).phrase}".encode()]
        lines += [name.encode() + b": " + _encoded(value) for name, value in reply.headers]
        lines += [b"Content-Type: application/json", b"Content-Length: %d" % len(reply.body)]
        self.wfile.write(b"\r\n".join(lines) + b"\r\n\r\n" + reply.body)
        self.wfile.flush()

    do_GET = _serve
    do_POST = _serve

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        pass


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, plans: Plans) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.plans = plans


@pytest.fixture(scope="module")
def hostile_server() -> Iterator[tuple[str, Plans]]:
    plans = Plans()
    running = _Server(plans)
    thread = threading.Thread(target=running.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{running.server_address[1]}", plans
    finally:
        running.shutdown()
        running.server_close()
        thread.join(timeout=5)


_DURATIONS = ["6m0s", "1s", "20ms", HUGE + "s", "99999999999h", "²s", "0"]
_TIMES = ["9999-12-31T23:59:59Z", "2001-01-01T00:00:00Z", "2026-13-45T99:99:99Z"]
_COUNT_NAMES = [
    *(
        f"x-ratelimit-{part}-{kind}"
        for part in ("limit", "remaining")
        for kind in ("requests", "tokens")
    ),
    *(
        f"anthropic-ratelimit-{kind}-{part}"
        for kind in ("requests", "tokens", "input-tokens", "output-tokens")
        for part in ("limit", "remaining")
    ),
    "X-RateLimit-Remaining",
    "RateLimit-Remaining",
]
_WAIT_NAMES = [
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "X-RateLimit-Reset",
    "RateLimit-Reset",
]

# Counts: hostile ones, and honest ones big and small (0 spends a quota: honest waits are kept
# short or far beyond the budget, so that a case takes a fraction of a second).
counts = st.one_of(
    st.sampled_from(HOSTILE),
    st.sampled_from(["0", "1", "100000", str(MAX_COUNT), str(MAX_COUNT + 1)]),
    st.integers(min_value=0, max_value=10**20).map(str),
)
waits = st.one_of(st.sampled_from(HOSTILE), st.sampled_from(["0", "1", "50", "100000"]))
header = st.one_of(
    st.tuples(st.sampled_from(_COUNT_NAMES), counts),
    st.tuples(st.sampled_from(_WAIT_NAMES), waits),
    st.tuples(
        st.sampled_from(["x-ratelimit-reset-requests", "x-ratelimit-reset-tokens"]),
        st.sampled_from([*_DURATIONS, *HOSTILE]),
    ),
    st.tuples(
        st.sampled_from(["anthropic-ratelimit-tokens-reset", "anthropic-ratelimit-requests-reset"]),
        st.sampled_from([*_TIMES, *HOSTILE]),
    ),
    st.tuples(
        st.just("RateLimit"),
        st.tuples(counts, waits).map(lambda pair: f'"default";r={pair[0]};t={pair[1]}'),
    ),
    st.tuples(st.just("RateLimit-Policy"), waits.map(lambda wait: f'"default";q=100;w={wait}')),
)
# JSON values a usage count may be: ints of any size, and what is no count.
usage_number = st.one_of(
    st.sampled_from([10**400, 10**309, MAX_COUNT + 1, -1, True, 1.5, "12", None]),
    st.sampled_from([float("inf"), float("nan")]),
    st.integers(min_value=0, max_value=10**6),
)
usage = st.one_of(
    st.none(),
    st.dictionaries(
        st.sampled_from(
            [
                "total_tokens",
                "prompt_tokens",
                "completion_tokens",
                "input_tokens",
                "output_tokens",
            ]
        ),
        usage_number,
        max_size=3,
    ),
)
# What a request's body may ask for (a JSON body: its numbers are ints).
max_tokens = st.one_of(
    st.sampled_from([10**400, 10**13, MAX_COUNT, -1, 0, True, 1.5, "100", None]),
    st.integers(min_value=1, max_value=2000),
)
reply = st.builds(
    lambda status, headers, used: (status, headers, used),
    st.sampled_from([200, 200, 200, 429, 503]),
    st.lists(header, max_size=6),
    usage,
)
item = st.tuples(
    st.lists(reply, min_size=1, max_size=2), max_tokens, st.sampled_from([None, 10**400, 2])
)
case = st.fixed_dictionaries(
    {
        "items": st.lists(item, min_size=1, max_size=4),
        "concurrency": st.integers(min_value=2, max_value=4),
        "attempts": st.integers(min_value=1, max_value=2),
        "token_rate": st.sampled_from([None, "100000/min", "600/s", "50/s"]),
        "rate": st.sampled_from([None, "auto", "auto", "100/s"]),
    }
)


def _body(used: object) -> bytes:
    data: dict[str, Any] = {"id": "hostile", "choices": []}
    if used is not None:
        data["usage"] = used
    return json.dumps(data).encode()  # (its inf and nan as Infinity and NaN, as some servers do)


@settings(
    max_examples=150,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    derandomize=True,
)
@given(case)
def test_hostile_numbers_end_as_the_answers_they_came_with(
    hostile_server: tuple[str, Plans], case: dict[str, Any]
) -> None:
    base, plans = hostile_server
    run = uuid.uuid4().hex[:12]
    items = []
    for position, (replies, limit, n) in enumerate(case["items"]):
        path = f"/{run}/{position}"
        plans.replies[path] = [
            Reply(status, headers, _body(used)) for status, headers, used in replies
        ]
        body: dict[str, Any] = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
        if limit is not None:
            body["max_tokens"] = limit
        if n is not None:
            body["n"] = n
        items.append({"url": base + path, "method": "POST", "json": body, "idempotency_key": path})
    results = fetch_all(
        items,
        concurrency=case["concurrency"],
        attempts=case["attempts"],
        timeout=5,
        budget=1.5,
        deadline=4,
        backoff=Backoff(base=0.01, max=0.05, jitter=0),
        token_rate=case["token_rate"],
        rate=case["rate"],
        quota_headers=True,
        progress=False,
    )
    for position, result in enumerate(results):
        path = f"/{run}/{position}"
        sent = plans.counts[path]
        event(f"{result.error_kind or 'ok'} after {sent}")
        assert result.error_kind != "exception", (result.error, result.attempt_log)
        assert result.attempts == sent, (result.to_dict(), sent)
        assert result.status_code == plans.last_status.get(path), (result.to_dict(), sent)
        if result.ok:
            assert isinstance(result.data, dict)
            assert result.data["id"] == "hostile"


def test_a_429_whose_azure_wait_is_no_number_is_retried(
    hostile_server: tuple[str, Plans],
) -> None:
    base, plans = hostile_server
    paths = [f"/{uuid.uuid4().hex}/{value}" for value in ("sup", "huge")]
    for path, value in zip(paths, ["²", "1" + "0" * 400], strict=True):
        plans.replies[path] = [
            Reply(429, [("retry-after-ms", value)], b"{}"),
            Reply(200, [], b'{"id": "hostile"}'),
        ]
    results = fetch_all(
        [{"url": base + path} for path in paths],
        attempts=2,
        timeout=5,
        budget=5,
        backoff=Backoff(base=0.01, max=0.05, jitter=0),
        progress=False,
    )
    for path, result in zip(paths, results, strict=True):
        assert result.error_kind is None, (result.error, result.attempt_log)
        assert result.ok and result.data == {"id": "hostile"}
        assert result.attempts == plans.counts[path] == 2
        assert [entry.status_code for entry in result.attempt_log] == [429, 200]


def test_an_answer_stands_when_the_limits_fail_to_learn_from_it(
    hostile_server: tuple[str, Plans], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A limit that raises on an answer (a number it could not use) loses what the answer
    taught, not the answer: the attempt counts, its status and data stay, and the slot it
    held is given back, so that the next items are sent."""
    from batchsync.limits import quota as limits

    def failing(self: limits.QuotaGate, *_: object) -> None:
        raise OverflowError("int too large to convert to float")

    monkeypatch.setattr(limits.QuotaGate, "release", failing)
    base, plans = hostile_server
    paths = [f"/{uuid.uuid4().hex}/{n}" for n in range(4)]
    for path in paths:
        plans.replies[path] = [Reply(200, [], b'{"id": "hostile"}')]
    results = fetch_all(
        [{"url": base + path} for path in paths],
        concurrency=1,
        per_host=1,
        timeout=5,
        budget=5,
        deadline=10,
        progress=False,
    )
    for path, result in zip(paths, results, strict=True):
        assert result.ok, (result.error_kind, result.error)
        assert result.status_code == 200 and result.data == {"id": "hostile"}
        assert result.attempts == plans.counts[path] == 1
