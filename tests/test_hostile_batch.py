"""The hostile batch provider (tests/hostile_batch.py) against the real mock of both batch APIs,
driven by plain ``urllib``: it forwards, and each fault does what it says."""

from __future__ import annotations

import http.client
import json
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator, Mapping
from datetime import datetime
from email.message import Message
from email.utils import parsedate_to_datetime
from typing import Any

import pytest

from .hostile_batch import (
    DROP,
    HostileProvider,
    deep_json,
    huge_int,
    results_lines,
    set_fields,
)
from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration

KNOBS = "pace=0.05"
# (Anthropic's headers on every request: the mock takes any key, of either provider.)
HEADERS = {"x-api-key": "sk-ant-hostile", "anthropic-version": "2023-06-01"}


def call(
    method: str,
    url: str,
    body: bytes | dict[str, Any] | None = None,
    headers: Mapping[str, str] = HEADERS,
) -> tuple[int, Message, bytes]:
    """Status, headers and body of one request (an error status is an answer too)."""
    given = dict(headers)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    if isinstance(body, dict):
        given.setdefault("Content-Type", "application/json")
    request = urllib.request.Request(url, data=data, method=method, headers=given)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, response.headers, response.read()
    except urllib.error.HTTPError as answer:
        return answer.code, answer.headers, answer.read()


def call_json(method: str, url: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
    status, _, data = call(method, url, body)
    assert status == 200, data
    payload: dict[str, Any] = json.loads(data)
    return payload


def base(at: str) -> tuple[str, str]:
    """A fresh KEY's ``/llm/KEY/KNOBS`` URL at ``at``, and the KEY."""
    key = uuid.uuid4().hex[:10]
    return f"{at}/llm/{key}/{KNOBS}", key


def batch_stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    """What the mock saw of KEY's batches (nothing yet: an empty dict)."""
    try:
        return server.get(f"/llm/{key}/batch-stats")
    except urllib.error.HTTPError:
        return {}


def upload(url: str, rows: int = 2) -> str:
    """Upload an OpenAI batch input file of ``rows`` chat rows at ``url`` (``.../v1``)."""
    lines = [
        {
            "custom_id": f"row-{n}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"model": "mock", "messages": [{"role": "user", "content": f"q {n}"}]},
        }
        for n in range(rows)
    ]
    content = "".join(json.dumps(line) + "\n" for line in lines).encode()
    boundary = uuid.uuid4().hex
    body = (
        (
            f'--{boundary}\r\nContent-Disposition: form-data; name="purpose"\r\n\r\nbatch\r\n'
            f'--{boundary}\r\nContent-Disposition: form-data; name="file"; filename="in.jsonl"\r\n'
            "Content-Type: application/jsonl\r\n\r\n"
        ).encode()
        + content
        + f"\r\n--{boundary}--\r\n".encode()
    )
    content_type = f"multipart/form-data; boundary={boundary}"
    status, _, data = call("POST", f"{url}/files", body, {"Content-Type": content_type})
    assert status == 200, data
    file_id: str = json.loads(data)["id"]
    return file_id


def create_openai(url: str) -> dict[str, Any]:
    request = {
        "input_file_id": upload(url),
        "endpoint": "/v1/chat/completions",
        "completion_window": "24h",
    }
    return call_json("POST", f"{url}/batches", request)


def anthropic_request() -> dict[str, Any]:
    params = {"model": "mock", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    return {"requests": [{"custom_id": f"r{n}", "params": params} for n in range(2)]}


def wait_until(url: str, field: str, done: str) -> dict[str, Any]:
    end = time.monotonic() + 5
    while (batch := call_json("GET", url))[field] != done:
        assert time.monotonic() < end, batch
        time.sleep(0.02)
    return batch


@pytest.fixture
def hostile(server: MockServerProcess) -> Iterator[HostileProvider]:
    with HostileProvider(upstream=server.url) as proxy:
        yield proxy


def test_forwards_an_openai_upload_create_poll_and_download(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    prefix, key = base(hostile.url)
    url = f"{prefix}/v1"
    batch = create_openai(url)
    done = wait_until(f"{url}/batches/{batch['id']}", "status", "completed")
    status, headers, output = call("GET", f"{url}/files/{done['output_file_id']}/content")
    assert status == 200
    assert headers["Content-Length"] == str(len(output))
    assert headers["Transfer-Encoding"] is None
    assert sorted(json.loads(line)["custom_id"] for line in output.splitlines()) == [
        "row-0",
        "row-1",
    ]
    stats = batch_stats(server, key)
    assert stats["batches_created"] == 1
    assert stats["files_uploaded"] == 1
    assert hostile.count("POST", r"/v1/batches$") == 1
    assert hostile.seen[0].method == "POST"
    assert hostile.seen[0].path.endswith("/v1/files")
    assert not hostile.touched_others


def test_once_answers_without_forwarding_then_forwards(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    prefix, key = base(hostile.url)
    created = call_json("POST", f"{prefix}/v1/messages/batches", anthropic_request())
    hostile.once("GET", r"/batches/[^/]+$", status=404, body={"error": "gone"})
    hostile.once(
        "GET", r"/results$", status=302, headers={"Location": "http://127.0.0.1:9/elsewhere"}
    )
    poll = f"{prefix}/v1/messages/batches/{created['id']}"
    before = len(server.log(f"/llm/{key}/"))
    status, headers, body = call("GET", poll)
    assert (status, json.loads(body)) == (404, {"error": "gone"})
    assert headers["Content-Type"] == "application/json"
    assert len(server.log(f"/llm/{key}/")) == before  # (never forwarded)
    assert call_json("GET", poll)["id"] == created["id"]
    connection = http.client.HTTPConnection(hostile.url.removeprefix("http://"), timeout=10)
    connection.request("GET", f"{poll.removeprefix(hostile.url)}/results")
    answer = connection.getresponse()
    assert (answer.status, answer.getheader("Location")) == (302, "http://127.0.0.1:9/elsewhere")
    connection.close()
    assert hostile.count("GET", r"/batches/[^/]+$") == 2


def test_skew_shifts_the_date_and_the_times(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    hostile.skew = -600.0
    prefix, _ = base(hostile.url)
    created = call_json("POST", f"{prefix}/v1/messages/batches", anthropic_request())
    path = f"{prefix.removeprefix(hostile.url)}/v1/messages/batches/{created['id']}"
    status, headers, body = call("GET", hostile.url + path)
    assert status == 200
    date = parsedate_to_datetime(headers["Date"]).timestamp()
    assert abs(date - (time.time() - 600)) < 5
    skewed, real = json.loads(body), call_json("GET", server.url + path)
    for name in ("created_at", "expires_at"):
        assert skewed[name].endswith("Z") and len(skewed[name]) == len(real[name])
        shift = datetime.fromisoformat(
            skewed[name].replace("Z", "+00:00")
        ) - datetime.fromisoformat(real[name].replace("Z", "+00:00"))
        assert shift.total_seconds() == -600
    openai = f"{prefix}/v1"
    batch = create_openai(openai)
    real_batch = call_json(
        "GET", f"{server.url}{openai.removeprefix(hostile.url)}/batches/{batch['id']}"
    )
    assert batch["created_at"] == real_batch["created_at"] - 600
    assert batch["expires_at"] == real_batch["expires_at"] - 600
    listed = call_json("GET", f"{openai}/batches")["data"]
    assert [item["created_at"] for item in listed] == [real_batch["created_at"] - 600]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_other_batches_come_first_and_page_to_the_real_one(
    server: MockServerProcess, hostile: HostileProvider, provider: str
) -> None:
    prefix, key = base(hostile.url)
    if provider == "openai":
        listing, cursor, fake = f"{prefix}/v1/batches", "after", "batch_other"
        mine = create_openai(f"{prefix}/v1")["id"]
    else:
        listing, cursor, fake = f"{prefix}/v1/messages/batches", "after_id", "msgbatch_other"
        mine = call_json("POST", listing, anthropic_request())["id"]
    hostile.other_batches = 250
    ids: list[str] = []
    pages: list[int] = []
    after = ""
    while True:
        page = call_json("GET", f"{listing}?limit=100" + (f"&{cursor}={after}" if after else ""))
        data = [item["id"] for item in page["data"]]
        assert (page["first_id"], page["last_id"]) == (data[0], data[-1])
        ids += data
        pages.append(len(data))
        if not page["has_more"]:
            break
        after = page["last_id"]
    assert ids == [f"{fake}{n}" for n in range(250, 0, -1)] + [mine]
    assert pages == [100, 100, 51]
    assert call_json("GET", f"{listing}")["data"][0]["id"] == f"{fake}250"  # (limit 20)
    assert len(call_json("GET", f"{listing}?limit=5000")["data"]) == 100
    assert call_json("GET", f"{listing}/{fake}7")["id"] == f"{fake}7"
    assert not hostile.touched_others
    status, _, _ = call("POST", f"{listing}/{fake}7/cancel", b"")
    assert status == 404
    assert [seen.path for seen in hostile.touched_others] == [
        f"{listing.removeprefix(hostile.url)}/{fake}7/cancel"
    ]
    assert batch_stats(server, key)["batches_created"] == 1


def test_other_batches_before_id_pages_back_to_theirs(hostile: HostileProvider) -> None:
    prefix, _ = base(hostile.url)
    listing = f"{prefix}/v1/messages/batches"
    mine = call_json("POST", listing, anthropic_request())["id"]
    hostile.other_batches = 5
    page = call_json("GET", f"{listing}?limit=3&before_id={mine}")
    assert [item["id"] for item in page["data"]] == [f"msgbatch_other{n}" for n in (3, 2, 1)]
    assert page["has_more"]
    page = call_json("GET", f"{listing}?limit=3&before_id=msgbatch_other3")
    assert ([item["id"] for item in page["data"]], page["has_more"]) == (
        ["msgbatch_other5", "msgbatch_other4"],
        False,
    )


def test_rewrites_a_create_and_the_results(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    prefix, key = base(hostile.url)
    listing = f"{prefix}/v1/messages/batches"
    hostile.rewrite(
        "POST", r"/messages/batches$", set_fields(id=DROP, processing_status="queued"), times=1
    )
    odd = call_json("POST", listing, anthropic_request())
    assert "id" not in odd
    assert odd["processing_status"] == "queued"
    assert batch_stats(server, key)["batches_created"] == 1
    created = call_json("POST", listing, anthropic_request())  # (once: this one as it was)
    ended = wait_until(f"{listing}/{created['id']}", "processing_status", "ended")
    assert ended["results_url"].startswith(hostile.url)  # (the Host forwarded)
    hostile.rewrite("GET", r"/results$", lambda _: deep_json(), times=1)
    status, _, body = call("GET", ended["results_url"])
    assert (status, body) == (200, deep_json())
    hostile.rewrite("GET", r"/results$", results_lines(lambda _: huge_int(50)), times=1)
    status, _, body = call("GET", ended["results_url"])
    assert body.split() == [huge_int(50)] * 2


def test_drop_loses_the_answer_of_a_create_that_happened(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    prefix, key = base(hostile.url)
    hostile.drop("POST", r"/v1/messages/batches$")
    with pytest.raises(http.client.RemoteDisconnected):
        call("POST", f"{prefix}/v1/messages/batches", anthropic_request())
    assert batch_stats(server, key)["batches_created"] == 1
    call_json("POST", f"{prefix}/v1/messages/batches", anthropic_request())  # (once only)
    assert batch_stats(server, key)["batches_created"] == 2


def test_hold_answers_late_what_is_done_at_once(
    server: MockServerProcess, hostile: HostileProvider
) -> None:
    prefix, key = base(hostile.url)
    hostile.hold("POST", r"/v1/messages/batches$", 0.5)
    answers: list[dict[str, Any]] = []
    started = time.monotonic()
    client = threading.Thread(
        target=lambda: answers.append(
            call_json("POST", f"{prefix}/v1/messages/batches", anthropic_request())
        )
    )
    client.start()
    end = time.monotonic() + 5
    while not batch_stats(server, key).get("batches_created"):
        assert time.monotonic() < end
        time.sleep(0.02)
    assert not answers  # (made upstream, its answer still held)
    client.join(timeout=10)
    assert answers
    assert time.monotonic() - started >= 0.5
