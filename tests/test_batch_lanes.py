"""One contract for both lanes: the same rows and options through a live run and through the
provider's batch endpoint (``batch_api=``) give Results of the same types, the same failures
and the same refusals; an option a batch cannot honour is refused in one line, never accepted
and ignored."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
from pydantic import BaseModel

from batchsync import Batch
from batchsync.core.result import Result

from .mockserver import MockServerProcess
from .test_batch_api import KEY_HEADER, stats

pytestmark = pytest.mark.integration

BODY = {"model": "m", "messages": [{"role": "user", "content": "{text}"}], "max_tokens": 5}
ROWS = [{"text": f"question {n}"} for n in range(3)]


class Completion(BaseModel):
    """What the rows' answers hold (OpenAI's chat completion, in part)."""

    object: str
    choices: list[dict[str, Any]]


class Misfit(BaseModel):
    """A model the answers do not fit."""

    missing_field: int


def through(lane: str, server: MockServerProcess, tmp_path: Path, **options: Any) -> list[Result]:
    """The rows' Results through ``lane`` (live, batch) on a fresh KEY of the mock."""
    key = uuid.uuid4().hex[:10]
    url = f"{server.url}/llm/{key}/pace=0.05/v1/chat/completions"
    more: dict[str, Any] = {"batch_api": "auto", "poll": 0.05} if lane == "batch" else {}
    method = options.pop("method", "POST")
    batch = Batch(
        ROWS, url=url, method=method, body=BODY, progress=False, headers=KEY_HEADER,
        journal=tmp_path / f"{lane}.sqlite3", **more, **options,
    )  # fmt: skip
    return list(batch.run())


def shape(results: list[Result]) -> list[tuple[bool, str | None, type]]:
    return [(r.ok, r.error_kind, type(r.data)) for r in results]


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, [(True, None, dict)] * 3),
        ({"expect": Completion}, [(True, None, Completion)] * 3),
        ({"expect": Misfit}, [(False, "invalid_body", type(None))] * 3),
        ({"deny_private": True}, [(False, "invalid_request", type(None))] * 3),
        ({"retry_statuses": "429,5xx"}, [(True, None, dict)] * 3),
    ],
    ids=["json", "model", "misfit", "deny_private", "retry_statuses"],
)
def test_the_same_rows_and_options_give_the_same_results_in_both_lanes(
    server: MockServerProcess, tmp_path: Path, options: dict[str, Any], expected: list[Any]
) -> None:
    live = through("live", server, tmp_path, **options)
    batch = through("batch", server, tmp_path, **options)
    assert shape(live) == shape(batch) == expected
    errors = [(r.error or "").split(":")[0] for r in live]
    assert [(r.error or "").split(":")[0] for r in batch] == errors


def test_nothing_is_sent_to_a_private_address_in_either_lane(
    server: MockServerProcess, tmp_path: Path
) -> None:
    key = uuid.uuid4().hex[:10]
    url = f"{server.url}/llm/{key}/pace=0.05/v1/chat/completions"
    lanes: list[dict[str, Any]] = [{}, {"batch_api": "auto"}]
    for more in lanes:
        Batch(
            ROWS, url=url, method="POST", body=BODY, progress=False, deny_private=True, **more
        ).run()  # fmt: skip
    # (the mock knows no KEY it was never sent: no live request, no batch call)
    with pytest.raises(OSError, match="404"):
        server.get(f"/llm/{key}/stats")
    with pytest.raises(OSError, match="404"):
        stats(server, key)


@pytest.mark.parametrize(
    "options",
    [
        {"concurrency": 4},
        {"rate": "10/s"},
        {"rate": "auto"},
        {"token_rate": "1000/min"},
        {"per_host": 2},
        {"adaptive": True},
        {"expect": "text"},
        {"dedup": True},
        {"on_attempt": print},
    ],
    ids=lambda options: next(iter(options)),
)
def test_an_option_a_batch_cannot_honour_is_refused_in_one_line(
    server: MockServerProcess, tmp_path: Path, options: dict[str, Any]
) -> None:
    """Each is honoured by a live run of the same rows; through the batch endpoint it is a
    ValueError naming it, before anything is sent."""
    assert all(r.ok for r in through("live", server, tmp_path, **options))
    with pytest.raises(ValueError, match="cannot apply to it") as refused:
        through("batch", server, tmp_path, **options)
    assert next(iter(options)) in str(refused.value)
    assert "\n" not in str(refused.value)


def test_a_batch_sends_posts_only(server: MockServerProcess, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="POST"):
        through("batch", server, tmp_path, method="PUT")
