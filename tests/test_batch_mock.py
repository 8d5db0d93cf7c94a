"""The mock batch APIs (batchsync/mock/batch.py, served by the mock server) driven by the real
``openai`` and ``anthropic`` clients: files uploaded and downloaded, batches that step through
their states by the clock, rows answered as the live routes answer them, failed, expired and
cancelled rows in the providers' shapes, the enqueued-token cap as each provider applies it,
and the server's own counts of what ran."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable
from typing import Any, Final, Literal

import anthropic
import openai
import pytest

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration

OPENAI_ENDED = ("completed", "failed", "expired", "cancelled")
CHAT: Final[Literal["/v1/chat/completions"]] = "/v1/chat/completions"


def prefix(server: MockServerProcess, limits: str) -> tuple[str, str]:
    """A fresh KEY's base URL with these limits and knobs, and the KEY."""
    key = uuid.uuid4().hex[:10]
    return f"{server.url}/llm/{key}/{limits}", key


def gpt(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)


def claude(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)


def batch_stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    return server.get(f"/llm/{key}/batch-stats")


def chat_body(text: str, max_tokens: int = 20) -> dict[str, Any]:
    return {
        "model": "gpt-mock",
        "messages": [{"role": "user", "content": text}],
        "max_tokens": max_tokens,
    }


def chat_lines(count: int, marks: dict[int, str] | None = None, tag: str = "") -> list[Any]:
    """``count`` chat rows ``r0``... (``question NN``: 29 tokens each with max_tokens 20, as
    the mock counts); ``marks`` adds a marker to some rows' text."""
    marks = marks or {}
    return [
        {
            "custom_id": f"{tag}r{n}",
            "method": "POST",
            "url": CHAT,
            "body": chat_body(f"question {n:02d}" + marks.get(n, "")),
        }
        for n in range(count)
    ]


def upload(client: openai.OpenAI, lines: list[Any]) -> str:
    data = "".join(json.dumps(line) + "\n" for line in lines).encode()
    uploaded = client.files.create(file=("rows.jsonl", data), purpose="batch")
    assert (uploaded.bytes, uploaded.purpose, uploaded.status) == (len(data), "batch", "processed")
    return uploaded.id


def until(read: Callable[[], Any], done: Callable[[Any], bool], timeout: float = 10.0) -> Any:
    """Read again every 20 ms until ``done`` says so."""
    deadline = time.monotonic() + timeout
    while True:
        value = read()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.02)


def finish(client: openai.OpenAI, batch_id: str) -> Any:
    return until(lambda: client.batches.retrieve(batch_id), lambda b: b.status in OPENAI_ENDED)


def lines_of(client: openai.OpenAI, file_id: str | None) -> list[dict[str, Any]]:
    if file_id is None:
        return []
    return [json.loads(line) for line in client.files.content(file_id).text.splitlines()]


def requests_of(count: int, marks: dict[int, str] | None = None) -> list[Any]:
    marks = marks or {}
    return [
        {
            "custom_id": f"r{n}",
            "params": {
                "model": "claude-mock",
                "max_tokens": 20,
                "messages": [{"role": "user", "content": f"question {n:02d}" + marks.get(n, "")}],
            },
        }
        for n in range(count)
    ]


def ended(client: anthropic.Anthropic, batch_id: str) -> Any:
    return until(
        lambda: client.messages.batches.retrieve(batch_id),
        lambda b: b.processing_status == "ended",
    )


def test_openai_batch_answers_every_row_as_the_live_route_would(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "pace=0.1")
    client = gpt(base)
    rows = chat_lines(20)
    file_id = upload(client, rows)
    created = client.batches.create(
        input_file_id=file_id, endpoint=CHAT, completion_window="24h", metadata={"run": "a"}
    )
    assert (created.status, created.output_file_id, created.metadata) == (
        "validating",
        None,
        {"run": "a"},
    )
    done = finish(client, created.id)
    assert done.status == "completed" and done.error_file_id is None and done.errors is None
    assert done.request_counts is not None
    assert (done.request_counts.total, done.request_counts.completed) == (20, 20)
    assert done.in_progress_at and done.finalizing_at and done.completed_at
    output = lines_of(client, done.output_file_id)
    assert sorted(line["custom_id"] for line in output) == sorted(r["custom_id"] for r in rows)
    assert [line["custom_id"] for line in output] != [r["custom_id"] for r in rows]  # shuffled
    assert all(line["id"].startswith("batch_req_") and line["error"] is None for line in output)
    assert {line["response"]["status_code"] for line in output} == {200}
    by_id = {line["custom_id"]: line["response"]["body"] for line in output}
    for row in rows[:3]:
        raw = client.chat.completions.with_raw_response.create(**row["body"])
        live, answer = raw.http_response.json(), by_id[row["custom_id"]]
        assert set(answer) == set(live) and answer["object"] == "chat.completion"
        assert answer["choices"] == live["choices"] and answer["usage"] == live["usage"]
    # (the rows did not count against the KEY's live limits: only the 3 live requests did)
    assert server.get(f"/llm/{key}/stats")["requests"] == 3
    assert [b.id for b in client.batches.list()] == [created.id]
    for ident in (file_id, done.output_file_id):
        assert client.files.delete(ident).deleted
    with pytest.raises(openai.NotFoundError):
        client.files.retrieve(file_id)
    counted = batch_stats(server, key)
    assert counted["files_alive"] == [] and counted["auth"] == ["Bearer sk-test"]
    assert (counted["files_uploaded"], counted["files_deleted"], counted["batches_created"]) == (
        1,
        2,
        1,
    )
    assert (counted["batches_run"], counted["rows_run"], counted["twice"]) == (1, 20, [])
    assert counted["batches"][0]["tokens"] == 20 * 29


def test_openai_failed_rows_are_output_lines_and_expired_ones_errors(
    server: MockServerProcess,
) -> None:
    base, _ = prefix(server, "pace=0.05,shuffle=0")
    client = gpt(base)
    marks = {2: " [[error]]", 5: " [[500]]", 7: " [[expire]]", 8: " [[expire]]"}
    file_id = upload(client, chat_lines(10, marks))
    batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
    done = finish(client, batch.id)
    assert done.status == "expired" and done.expired_at and done.completed_at is None
    assert done.request_counts is not None
    assert (done.request_counts.completed, done.request_counts.failed) == (6, 4)
    output = lines_of(client, done.output_file_id)
    assert [line["custom_id"] for line in output] == [
        "r0",
        "r1",
        "r2",
        "r3",
        "r4",
        "r5",
        "r6",
        "r9",
    ]
    status = {line["custom_id"]: line["response"]["status_code"] for line in output}
    assert (status["r2"], status["r5"], status["r0"]) == (400, 500, 200)
    bad = {
        line["custom_id"]: line["response"]["body"]["error"]
        for line in output
        if line["response"]["status_code"] != 200
    }
    assert bad["r2"]["type"] == "invalid_request_error" and bad["r5"]["type"] == "server_error"
    assert set(bad["r2"]) == {"message", "type", "param", "code"}
    errors = lines_of(client, done.error_file_id)
    assert [line["custom_id"] for line in errors] == ["r7", "r8"]
    assert all(line["response"] is None for line in errors)
    assert {line["error"]["code"] for line in errors} == {"batch_expired"}


def test_openai_cancel_keeps_the_rows_done_before_it(server: MockServerProcess) -> None:
    base, key = prefix(server, "pace=0.6")
    client = gpt(base)
    batch = client.batches.create(
        input_file_id=upload(client, chat_lines(20)), endpoint=CHAT, completion_window="24h"
    )
    until(lambda: client.batches.retrieve(batch.id), lambda b: b.status == "in_progress")
    time.sleep(0.25)
    cancelling = client.batches.cancel(batch.id)
    assert cancelling.status == "cancelling" and cancelling.cancelling_at
    done = finish(client, batch.id)
    assert done.status == "cancelled" and done.cancelled_at and done.completed_at is None
    answered = lines_of(client, done.output_file_id)
    cancelled = lines_of(client, done.error_file_id)
    assert 0 < len(answered) < 20 and len(answered) + len(cancelled) == 20
    assert {line["error"]["code"] for line in cancelled} == {"batch_cancelled"}
    # (rows are done in submission order: the answered ones are the first)
    done_ids = {line["custom_id"] for line in answered}
    assert done_ids == {f"r{n}" for n in range(len(answered))}
    with pytest.raises(openai.BadRequestError, match="Cannot cancel"):
        client.batches.cancel(batch.id)
    assert batch_stats(server, key)["batches_run"] == 1


def test_openai_enqueued_cap_fails_a_batch_that_would_exceed_it(server: MockServerProcess) -> None:
    # Each batch of 10 rows holds 290 tokens: a second one while the first runs is over 400.
    base, key = prefix(server, "pace=0.2,enqueued=400")
    client = gpt(base)
    first = upload(client, chat_lines(10, tag="a"))
    # (the same questions of another model: other requests, as many tokens)
    others = [{**line, "body": {**line["body"], "model": "gpt-mock-b"}} for line in chat_lines(10)]
    second = upload(client, [{**line, "custom_id": f"b{line['custom_id']}"} for line in others])
    running = client.batches.create(input_file_id=first, endpoint=CHAT, completion_window="24h")
    refused = client.batches.create(input_file_id=second, endpoint=CHAT, completion_window="24h")
    assert refused.status == "validating"
    failed = finish(client, refused.id)
    assert failed.status == "failed" and failed.failed_at and failed.in_progress_at is None
    assert failed.errors is not None and failed.errors.data is not None
    error = failed.errors.data[0]
    assert error.code == "token_limit_exceeded" and error.line is None
    assert (
        error.message is not None and "Enqueued token limit reached for gpt-mock" in error.message
    )
    assert "Limit: 400 enqueued tokens" in error.message
    assert failed.output_file_id is None and failed.error_file_id is None
    assert finish(client, running.id).status == "completed"
    again = client.batches.create(input_file_id=second, endpoint=CHAT, completion_window="24h")
    assert finish(client, again.id).status == "completed"
    counted = batch_stats(server, key)
    assert (counted["batches_created"], counted["refused_creates"]) == (3, 1)
    assert (counted["batches_run"], counted["rows_run"], counted["twice"]) == (2, 20, [])
    rerun = client.batches.create(input_file_id=second, endpoint=CHAT, completion_window="24h")
    assert finish(client, rerun.id).status == "completed"
    assert len(batch_stats(server, key)["twice"]) == 10  # (a resubmission shows)


def test_the_fail_and_expire_knobs_pick_rows_by_key_and_custom_id(
    server: MockServerProcess,
) -> None:
    base, _ = prefix(server, "pace=0.02,fail=0.3,expire=0.2")
    client = gpt(base)
    picked = []
    for _ in range(2):
        file_id = upload(client, chat_lines(40))
        batch = client.batches.create(input_file_id=file_id, endpoint=CHAT, completion_window="24h")
        done = finish(client, batch.id)
        assert done.status == "expired"
        failing = {
            line["custom_id"]
            for line in lines_of(client, done.output_file_id)
            if line["response"]["status_code"] == 400
        }
        expired = {line["custom_id"] for line in lines_of(client, done.error_file_id)}
        assert 0 < len(failing) < 30 and 0 < len(expired) < 20
        picked.append((failing, expired))
    assert picked[0] == picked[1]


def test_anthropic_batch_answers_every_row_as_the_live_route_would(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "pace=0.1")
    client = claude(base)
    requests = requests_of(10)
    created = client.messages.batches.create(requests=requests)
    assert created.processing_status == "in_progress" and created.results_url is None
    assert created.id.startswith("msgbatch_") and created.request_counts.processing == 10
    with pytest.raises(anthropic.AnthropicError, match="results_url"):
        client.messages.batches.results(created.id)
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.delete(created.id)
    done = ended(client, created.id)
    assert done.ended_at is not None and done.results_url is not None
    assert done.results_url.endswith(f"/v1/messages/batches/{created.id}/results")
    assert (done.request_counts.succeeded, done.request_counts.processing) == (10, 0)
    results = list(client.messages.batches.results(created.id))
    assert sorted(r.custom_id for r in results) == sorted(r["custom_id"] for r in requests)
    assert [r.custom_id for r in results] != [r["custom_id"] for r in requests]
    by_id = {r.custom_id: r.result for r in results}
    for request in requests[:3]:
        live = client.messages.create(**request["params"])
        result = by_id[request["custom_id"]]
        assert result.type == "succeeded"
        assert result.message.content == live.content and result.message.usage == live.usage
        assert result.message.stop_reason == live.stop_reason
    assert [b.id for b in client.messages.batches.list()] == [created.id]
    deleted = client.messages.batches.delete(created.id)
    assert (deleted.id, deleted.type) == (created.id, "message_batch_deleted")
    with pytest.raises(anthropic.NotFoundError):
        client.messages.batches.retrieve(created.id)
    counted = batch_stats(server, key)
    assert (counted["batches_run"], counted["rows_run"], counted["batches_deleted"]) == (1, 10, 1)
    assert counted["auth"] and counted["twice"] == []


def test_anthropic_errored_expired_and_canceled_results(server: MockServerProcess) -> None:
    base, _ = prefix(server, "pace=0.05")
    client = claude(base)
    marks = {1: " [[error]]", 2: " [[500]]", 3: " [[expire]]"}
    done = ended(client, client.messages.batches.create(requests=requests_of(6, marks)).id)
    counts = done.request_counts
    assert (counts.succeeded, counts.errored, counts.expired, counts.canceled) == (3, 2, 1, 0)
    results = {r.custom_id: r.result for r in client.messages.batches.results(done.id)}
    assert [results[f"r{n}"].type for n in range(4)] == [
        "succeeded",
        "errored",
        "errored",
        "expired",
    ]
    errors = [results[name].model_dump()["error"] for name in ("r1", "r2")]
    assert [error["type"] for error in errors] == ["error", "error"]
    assert [error["error"]["type"] for error in errors] == ["invalid_request_error", "api_error"]


def test_anthropic_cancel_keeps_the_rows_done_before_it(server: MockServerProcess) -> None:
    base, _ = prefix(server, "pace=0.6")
    client = claude(base)
    batch = client.messages.batches.create(requests=requests_of(20))
    time.sleep(0.3)
    canceling = client.messages.batches.cancel(batch.id)
    assert canceling.processing_status == "canceling" and canceling.cancel_initiated_at
    done = ended(client, batch.id)
    counts = done.request_counts
    assert 0 < counts.succeeded < 20 and counts.succeeded + counts.canceled == 20
    kinds = [r.result.type for r in client.messages.batches.results(batch.id)]
    assert sorted(set(kinds)) == ["canceled", "succeeded"]
    with pytest.raises(anthropic.BadRequestError):
        client.messages.batches.cancel(batch.id)


def test_anthropic_enqueued_cap_is_a_429(server: MockServerProcess) -> None:
    base, key = prefix(server, "pace=0.1,enqueued=400")
    client = claude(base)
    first = client.messages.batches.create(requests=requests_of(10))
    with pytest.raises(anthropic.RateLimitError) as refused:
        client.messages.batches.create(requests=requests_of(10))
    assert refused.value.response.headers["retry-after"] == "1"
    body: Any = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "rate_limit_error"
    ended(client, first.id)
    assert ended(client, client.messages.batches.create(requests=requests_of(10)).id)
    counted = batch_stats(server, key)
    assert (counted["batches_created"], counted["refused_creates"]) == (2, 1)
    assert counted["batches_run"] == 2


def test_bad_inputs_are_answered_400_in_each_providers_shape(server: MockServerProcess) -> None:
    base, _ = prefix(server, "pace=0.05,batch_rows=3")
    client, messages = gpt(base), claude(base)
    line = chat_lines(1)[0]
    for bad in (
        {**line, "method": "GET"},
        {**line, "url": "/v1/nope"},
        {key: value for key, value in line.items() if key != "custom_id"},
        {**line, "body": "text"},
    ):
        with pytest.raises(openai.BadRequestError) as refused:
            upload(client, [bad])
        error: Any = refused.value.body
        assert error["type"] == "invalid_request_error" and error["param"] is None
    with pytest.raises(openai.BadRequestError, match="not unique"):
        upload(client, [line, line])
    with pytest.raises(openai.BadRequestError, match="at most 3"):
        upload(client, chat_lines(4))
    file_id = upload(client, chat_lines(3))
    with pytest.raises(openai.BadRequestError, match="endpoint"):
        client.batches.create(
            input_file_id=file_id, endpoint="/v1/embeddings", completion_window="24h"
        )
    with pytest.raises(openai.BadRequestError, match="input_file_id"):
        client.batches.create(input_file_id="file-nope", endpoint=CHAT, completion_window="24h")
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")
    with pytest.raises(openai.NotFoundError):
        client.files.content("file-nope")
    good = requests_of(1)[0]
    params = {name: value for name, value in good["params"].items() if name != "max_tokens"}
    cases: list[tuple[list[Any], str]] = [
        ([{**good, "custom_id": "bad id!"}], "custom_id"),
        ([good, good], "Duplicate"),
        ([{**good, "params": params}], "max_tokens"),
        (requests_of(4), "at most 3"),
    ]
    for bad_requests, problem in cases:
        with pytest.raises(anthropic.BadRequestError, match=problem) as refused_batch:
            messages.messages.batches.create(requests=bad_requests)
        body: Any = refused_batch.value.body
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        assert set(body["error"]) == {"type", "message"}
    with pytest.raises(anthropic.NotFoundError):
        messages.messages.batches.retrieve("msgbatch_nope")


def test_a_key_keeps_its_knobs(server: MockServerProcess) -> None:
    base, key = prefix(server, "pace=0.1,tpm=9000")
    upload(gpt(base), chat_lines(1))
    with pytest.raises(openai.BadRequestError, match="already has the limits"):
        upload(gpt(f"{server.url}/llm/{key}/pace=0.2,tpm=9000"), chat_lines(1))
    with pytest.raises(openai.BadRequestError, match="already has the limits"):
        gpt(f"{server.url}/llm/{key}/tpm=9000").chat.completions.create(**chat_body("a"))
    with pytest.raises(openai.BadRequestError, match="expire is between 0 and 1"):
        upload(gpt(f"{server.url}/llm/{key}-2/expire=2"), chat_lines(1))
