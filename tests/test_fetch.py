"""The HTTP path with ``responses`` standing in for the network."""

from __future__ import annotations

import base64
import email.utils
import threading
import time
from collections.abc import Iterator

import pytest
import requests
import responses
from pydantic import BaseModel
from requests.adapters import HTTPAdapter
from responses import matchers

from batchsync import Backoff, fetch_all

FAST = Backoff(base=0.01, jitter=0.0)
API = "http://api.test"


@pytest.fixture
def mocked() -> Iterator[responses.RequestsMock]:
    with responses.RequestsMock(assert_all_requests_are_fired=False) as mock:
        yield mock


def test_json_bodies_come_back_as_data(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/a", json={"sku": "a"})
    rs = fetch_all([f"{API}/a"])
    assert (rs[0].ok, rs[0].status_code, rs[0].data, rs[0].attempts) == (True, 200, {"sku": "a"}, 1)


def test_404_and_broken_json_are_final_at_once(mocked: responses.RequestsMock) -> None:
    missing = mocked.get(f"{API}/missing", status=404, json={"error": "no"})
    broken = mocked.get(f"{API}/broken", body='{"oops": ', content_type="application/json")
    rs = fetch_all([f"{API}/missing", f"{API}/broken"], backoff=FAST)
    assert (rs[0].error_kind, rs[0].status_code, rs[0].error) == ("status", 404, "HTTP 404")
    assert (rs[1].error_kind, rs[1].status_code) == ("invalid_body", 200)
    assert missing.call_count == 1
    assert broken.call_count == 1


def test_503_is_retried_up_to_attempts(mocked: responses.RequestsMock) -> None:
    down = mocked.get(f"{API}/down", status=503)
    rs = fetch_all([f"{API}/down"], attempts=3, backoff=FAST)
    assert down.call_count == 3
    assert (rs[0].attempts, rs[0].error_kind, rs[0].status_code) == (3, "status", 503)
    assert rs[0].error == "HTTP 503 after 3 attempts"


def test_retry_after_as_an_http_date_holds_the_next_try(mocked: responses.RequestsMock) -> None:
    served: list[float] = []
    until: list[int] = []

    def busy_once(request: requests.PreparedRequest) -> tuple[int, dict[str, str], str]:
        served.append(time.time())
        if len(served) > 1:
            return 200, {"Content-Type": "application/json"}, '{"ok": true}'
        until.append(int(served[0]) + 2)  # a date has whole seconds: 1 to 2 s from now
        return 429, {"Retry-After": email.utils.formatdate(until[0], usegmt=True)}, ""

    mocked.add_callback(responses.GET, f"{API}/busy", callback=busy_once)
    rs = fetch_all([f"{API}/busy"], backoff=FAST)
    assert rs[0].ok
    wait = rs[0].attempt_log[0].wait
    # Until the date, from the moment the answer was read: just after it was served (however
    # long the machine took to get there), far from the 10 ms backoff.
    left = until[0] - served[0]
    assert wait is not None and left - 0.5 < wait <= left
    assert served[1] - served[0] >= wait  # and the next try was held that long


def test_connection_errors_are_retried(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/flaky", body=requests.ConnectionError("connection reset"))
    mocked.get(f"{API}/flaky", json=[1])
    rs = fetch_all([f"{API}/flaky"], backoff=FAST)
    assert (rs[0].ok, rs[0].attempts) == (True, 2)
    assert rs[0].attempt_log[0].error_kind == "connection"


def test_post_without_idempotency_key_is_sent_once(mocked: responses.RequestsMock) -> None:
    down = mocked.post(f"{API}/orders", status=503)
    rs = fetch_all([{"url": f"{API}/orders", "method": "POST", "json": {"n": 1}}], backoff=FAST)
    assert down.call_count == 1
    assert (
        rs[0].error == "HTTP 503 after 1 attempt (POST is not retried without an idempotency_key)"
    )


def test_a_post_refused_by_a_rate_limit_is_retried_without_an_idempotency_key(
    mocked: responses.RequestsMock,
) -> None:
    """A 429 says the server did not act on the request: sending it again cannot act twice
    (an LLM's completions are POSTs, and their 429s must be waited out, not kept)."""
    limited = mocked.post(f"{API}/v1/chat/completions", status=429, headers={"Retry-After": "0"})
    done = mocked.post(f"{API}/v1/chat/completions", json={"usage": {"total_tokens": 3}})
    item = {"url": f"{API}/v1/chat/completions", "method": "POST", "json": {"n": 1}}
    rs = fetch_all([item], attempts=3, backoff=FAST)
    assert (limited.call_count, done.call_count, rs[0].ok, rs[0].attempts) == (1, 1, True, 2)
    mocked.post(f"{API}/orders", status=429, headers={"Retry-After": "0"})
    mocked.post(f"{API}/orders", status=503)
    rs = fetch_all([{"url": f"{API}/orders", "method": "POST"}], attempts=3, backoff=FAST)
    assert rs[0].attempts == 2  # the 503 may have acted: not sent a third time
    assert rs[0].error == (
        "HTTP 503 after 2 attempts (POST is not retried without an idempotency_key)"
    )


def test_post_with_idempotency_key_is_retried_with_the_same_key(
    mocked: responses.RequestsMock,
) -> None:
    down = mocked.post(f"{API}/orders", status=503)
    item = {"url": f"{API}/orders", "method": "POST", "json": {"n": 1}, "idempotency_key": "k-77"}
    rs = fetch_all([item], attempts=3, backoff=FAST)
    assert down.call_count == 3
    assert {call.request.headers["Idempotency-Key"] for call in mocked.calls} == {"k-77"}
    assert {call.request.body for call in mocked.calls} == {b'{"n": 1}'}
    assert rs[0].attempts == 3


def test_put_is_idempotent_and_retried(mocked: responses.RequestsMock) -> None:
    down = mocked.put(f"{API}/x", status=502)
    fetch_all([{"url": f"{API}/x", "method": "PUT", "data": "v"}], attempts=2, backoff=FAST)
    assert down.call_count == 2


def test_headers_params_and_bodies_go_on_the_wire(mocked: responses.RequestsMock) -> None:
    mocked.post(
        f"{API}/search",
        match=[
            matchers.header_matcher({"X-Batch": "b", "X-Item": "i"}),
            matchers.query_param_matcher({"q": "red shoes", "n": "2"}),
            matchers.json_params_matcher({"filter": [1, 2]}),
        ],
        json={"hits": 2},
    )
    item = {
        "url": f"{API}/search",
        "method": "POST",
        "headers": {"X-Item": "i"},
        "params": {"q": "red shoes", "n": 2},
        "json": {"filter": [1, 2]},
        "id": "s1",
    }
    rs = fetch_all([item], headers={"X-Batch": "b"})
    assert (rs[0].ok, rs[0].data, rs[0].id) == (True, {"hits": 2}, "s1")


def test_item_headers_override_batch_headers(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/h", match=[matchers.header_matcher({"Accept": "text/csv"})], body="a,b")
    rs = fetch_all(
        [{"url": f"{API}/h", "headers": {"Accept": "text/csv"}}],
        headers={"Accept": "application/json"},
        expect="text",
    )
    assert rs[0].data == "a,b"


class Product(BaseModel):
    sku: str
    price: float


def test_expect_text_bytes_and_models(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/t", body="héllo".encode(), content_type="text/plain; charset=utf-8")
    mocked.get(f"{API}/b", body=b"\x00\xff", content_type="application/octet-stream")
    mocked.get(f"{API}/p", json={"sku": "a", "price": 2})
    mocked.get(f"{API}/bad", json={"sku": "a", "price": "free"})
    assert fetch_all([f"{API}/t"], expect="text")[0].data == "héllo"
    assert base64.b64decode(fetch_all([f"{API}/b"], expect="bytes")[0].data) == b"\x00\xff"
    assert fetch_all([f"{API}/p"], expect=Product)[0].data == Product(sku="a", price=2.0)
    bad = fetch_all([f"{API}/bad"], expect=Product)[0]
    assert bad.error_kind == "invalid_body"
    assert "price" in (bad.error or "")


def test_no_content_is_success_without_data(mocked: responses.RequestsMock) -> None:
    mocked.delete(f"{API}/x", status=204)
    rs = fetch_all([{"url": f"{API}/x", "method": "DELETE"}])
    assert (rs[0].ok, rs[0].status_code, rs[0].data) == (True, 204, None)


def test_a_body_over_max_bytes_is_invalid(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/big", body=b"[" + b"1," * 600 + b"1]")
    rs = fetch_all([f"{API}/big"], max_bytes=1000)
    assert rs[0].error_kind == "invalid_body"
    assert "max_bytes 1000" in (rs[0].error or "")


def test_invalid_urls_are_never_sent(mocked: responses.RequestsMock) -> None:
    rs = fetch_all(["ftp://api.test/f", "http://", {"url": f"{API}/x", "params": 5}])
    assert [r.error_kind for r in rs] == ["invalid_request"] * 3
    assert [r.attempts for r in rs] == [0, 0, 0]
    assert len(mocked.calls) == 0


@pytest.mark.parametrize(
    "options",
    [{"concurrency": 0}, {"timeout": -1}, {"max_bytes": 0}, {"expect": "xml"}, {"session": 5}],
)
def test_invalid_options_raise_before_anything_is_sent(
    mocked: responses.RequestsMock, options: dict[str, object]
) -> None:
    mocked.get(f"{API}/a", json={})
    with pytest.raises(ValueError, match="invalid option"):
        fetch_all([f"{API}/a"], **options)  # type: ignore[arg-type]
    assert len(mocked.calls) == 0


def test_too_many_redirects_is_a_redirect_failure(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/loop", status=302, headers={"Location": f"{API}/loop"})
    rs = fetch_all([f"{API}/loop"], backoff=FAST)
    assert (rs[0].error_kind, rs[0].attempts) == ("redirect", 1)


def test_secrets_do_not_follow_a_redirect_to_another_host(mocked: responses.RequestsMock) -> None:
    mocked.get(f"{API}/moved", status=302, headers={"Location": "http://elsewhere.test/x"})
    mocked.get("http://elsewhere.test/x", json={"here": True})
    mocked.get(f"{API}/same", status=302, headers={"Location": f"{API}/there"})
    mocked.get(f"{API}/there", json={"there": True})
    secrets = {"X-Api-Key": "sekrit", "Authorization": "Bearer tok"}
    rs = fetch_all(
        [{"url": f"{API}/moved", "headers": {"X-Trace": "t1"}}, f"{API}/same"], headers=secrets
    )
    assert all(r.ok for r in rs)
    sent = {call.request.url: call.request.headers for call in mocked.calls}
    elsewhere = sent["http://elsewhere.test/x"]
    assert "X-Api-Key" not in elsewhere
    assert "Authorization" not in elsewhere
    assert elsewhere["X-Trace"] == "t1"
    assert sent[f"{API}/there"]["X-Api-Key"] == "sekrit"
    assert sent[f"{API}/there"]["Authorization"] == "Bearer tok"


def test_a_callers_session_is_honoured_and_left_open(mocked: responses.RequestsMock) -> None:
    mocked.get(
        f"{API}/me",
        match=[matchers.header_matcher({"Authorization": "Basic dTpw", "X-App": "1"})],
        json={"me": True},
    )
    session = requests.Session()
    session.auth = ("u", "p")
    session.headers["X-App"] = "1"
    seen: list[int] = []
    session.hooks["response"].append(lambda response, **kwargs: seen.append(response.status_code))
    rs = fetch_all([f"{API}/me"], session=session)
    assert rs[0].data == {"me": True}
    assert seen == [200]
    adapter = session.get_adapter(API)
    assert isinstance(adapter, HTTPAdapter)
    assert adapter.max_retries.total == 0


def test_a_session_factory_is_called_once_per_worker_thread(
    mocked: responses.RequestsMock,
) -> None:
    mocked.get(f"{API}/a", json={})
    threads: set[int] = set()
    made = 0
    lock = threading.Lock()

    def factory() -> requests.Session:
        nonlocal made
        with lock:
            made += 1
            threads.add(threading.get_ident())
        return requests.Session()

    rs = fetch_all([f"{API}/a"] * 40, concurrency=3, session=factory)
    assert all(r.ok for r in rs)
    assert 1 <= made == len(threads) <= 3
