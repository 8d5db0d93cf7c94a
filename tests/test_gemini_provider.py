"""Gemini's batch mode as the provider module reads it (the pure parts: where each call goes,
a row's line, an answer's Result, the states). Work in progress: not registered yet."""

from __future__ import annotations

import json
from urllib.parse import urlsplit

from batchsync.batches.gemini import Gemini
from batchsync.store.submissions import Part

LIVE = "https://generativelanguage.googleapis.com/v1beta/models/gemini-2.5-flash:generateContent"


def test_the_endpoint_and_its_calls() -> None:
    gemini = Gemini()
    endpoint = gemini.endpoint(urlsplit(LIVE))
    assert endpoint is not None
    assert endpoint.base == "https://generativelanguage.googleapis.com/v1beta"
    assert endpoint.path == "models/gemini-2.5-flash"
    assert gemini.create_url(endpoint).endswith(
        "/v1beta/models/gemini-2.5-flash:batchGenerateContent"
    )
    assert gemini.cancel_url(endpoint, "abc").endswith("/v1beta/batches/abc:cancel")
    files = gemini.files_of({"metadata": {"output": {"responsesFile": "files/out1"}}})
    assert gemini.results_urls(endpoint, "abc", files) == [
        "https://generativelanguage.googleapis.com/download/v1beta/files/out1:download?alt=media"
    ]
    assert gemini.endpoint(urlsplit("https://x/v1beta/models/m:streamGenerateContent")) is None


def test_a_row_its_answer_and_its_error() -> None:
    gemini = Gemini()
    endpoint = gemini.endpoint(urlsplit(LIVE))
    assert endpoint is not None
    line = json.loads(gemini.request_line(endpoint, 7, {"contents": []}, "a" * 12))
    assert line == {"key": "aaaaaaaaaaaa-7", "request": {"contents": []}}
    ok = gemini.answer_of(
        {
            "key": "aaaaaaaaaaaa-7",
            "response": {"usageMetadata": {"promptTokenCount": 5, "candidatesTokenCount": 9}},
        },
        "a" * 12,
    )
    assert ok is not None and ok.ok and gemini.usage_of(ok.data) == (5, 9)
    failed = gemini.answer_of(
        {"key": "aaaaaaaaaaaa-8", "error": {"code": 8, "message": "busy"}}, "a" * 12
    )
    assert failed is not None and (failed.status_code, failed.error_kind) == (429, "batch_errored")


def test_a_batch_its_state_and_its_part() -> None:
    gemini = Gemini()
    batch = {
        "name": "batches/b1",
        "metadata": {
            "state": "BATCH_STATE_RUNNING",
            "createTime": "2026-12-07T10:00:00Z",
            "inputConfig": {"fileName": "files/in1"},
        },
    }
    assert gemini.batch_id(batch) == "b1"
    assert gemini.status_of(batch) == "BATCH_STATE_RUNNING"
    assert gemini.belongs_to(batch, Part(1, 1, "gemini", ((0, 1),), input_file="in1"))
    assert not gemini.belongs_to(batch, Part(1, 1, "gemini", ((0, 1),), input_file="in2"))
    page, more, token = gemini.listed({"operations": [batch], "nextPageToken": "t2"})
    assert (page, more, token) == ([batch], True, "t2")
    assert gemini.list_params("t2") == {"pageSize": 100, "pageToken": "t2"}
