"""OpenAI's batch endpoint runs more than chat: embeddings, responses and moderations rows go
through the batch lane as chat rows do, each answer mapped to the Result a live call gives,
the tokens each part used read from the usage as each endpoint names it."""

from __future__ import annotations

import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

import pytest

from batchsync import Batch
from batchsync.batches.providers import endpoint_of
from batchsync.limits.tokens import usage_parts

from .mockserver import MockServerProcess
from .test_batch_api import KEY_HEADER, stats

PATHS = (
    "/v1/chat/completions", "/v1/embeddings", "/v1/completions", "/v1/responses",
    "/v1/moderations", "/v1/images/generations", "/v1/images/edits", "/v1/videos",
)  # fmt: skip


@pytest.mark.parametrize("path", PATHS)
def test_each_endpoint_openais_batches_run_is_told_by_its_path(path: str) -> None:
    endpoint = endpoint_of(f"https://api.openai.com{path}", "auto")
    assert (endpoint.provider, endpoint.path) == ("openai", path)
    assert endpoint.base == "https://api.openai.com/v1"


# Each endpoint: a row's body, and what its answer holds.
BODIES: dict[str, tuple[dict[str, Any], Any]] = {
    "embeddings": (
        {"model": "text-embedding-3-small", "input": "{text}"},
        lambda data: data["object"] == "list" and len(data["data"][0]["embedding"]) == 8,
    ),
    "responses": (
        {"model": "m", "input": "{text}", "max_output_tokens": 12},
        lambda data: data["object"] == "response" and data["output"][0]["content"][0]["text"],
    ),
    "moderations": (
        {"model": "omni-moderation-latest", "input": "{text}"},
        lambda data: data["results"][0]["flagged"] is False,
    ),
}


@pytest.mark.integration
@pytest.mark.parametrize("name", list(BODIES))
def test_rows_of_each_endpoint_go_through_the_batch_lane_as_a_live_call_answers_them(
    server: MockServerProcess, tmp_path: Path, name: str
) -> None:
    body, holds = BODIES[name]
    url = f"{server.url}/llm/{uuid.uuid4().hex[:10]}/pace=0.05/v1/{name}"
    rows = [{"text": f"question {n}"} for n in range(6)]
    journal = tmp_path / "j.sqlite3"

    def through(lane: dict[str, Any], journal: Path | None = None) -> list[Any]:
        batch = Batch(
            rows,
            url=url,
            body=body,
            headers=KEY_HEADER,
            progress=False,
            journal=journal,
            **lane,
        )
        return list(batch.run())

    batched = through({"batch_api": "auto", "poll": 0.05}, journal)
    assert [r.index for r in batched] == list(range(6))
    assert all(r.ok and r.status_code == 200 and holds(r.data) for r in batched)
    assert all(r.attempt_log[-1].lane == "batch" for r in batched)
    # The tokens the part used: what the answers' usage says, however the endpoint names it.
    sides = [usage_parts(r.data) or (None, None, None) for r in batched]
    inputs, outputs = (sum(side[n] or 0 for side in sides) for n in (0, 1))
    with closing(sqlite3.connect(journal)) as db:
        used = db.execute("SELECT input_tokens, output_tokens FROM submissions").fetchall()
    assert used == [(inputs, outputs)]
    assert (inputs > 0) is (name != "moderations")
    # The same rows live: the same answers (the mock draws them by body), but the ids.
    live = through({"method": "POST"})
    for through_batch, sent_live in zip(batched, live, strict=True):
        assert through_batch.data.get("usage") == sent_live.data.get("usage")
        assert through_batch.data.keys() == sent_live.data.keys()
    assert stats(server, url.split("/")[4])["twice"] == []
