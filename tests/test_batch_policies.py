"""The pure parts of a run through a batch endpoint: where each call goes, how a row is
written and read back, the parts' runs of indexes, and what a journal's submissions row must
hold to be trusted."""

from __future__ import annotations

import json
import math
from dataclasses import replace

import pytest

from batchsync import Batch
from batchsync.batches.client import _Listing
from batchsync.batches.protocol import Answer, custom_id, index_of, row_failure
from batchsync.batches.providers import PROVIDERS, endpoint_of
from batchsync.http.httpfacts import HttpFacts
from batchsync.http.retries import RETRYABLE
from batchsync.store.submissions import (
    Covered,
    Part,
    indexes_in,
    new_tag,
    overlap_problem,
    part_of,
    ranges_of,
    row_of,
    submission_problem,
    times_sent,
)

OPENAI = "https://api.openai.com/v1/chat/completions"
ANTHROPIC = "https://api.anthropic.com/v1/messages"


def test_the_provider_is_told_by_the_urls_path() -> None:
    openai = endpoint_of(OPENAI, "auto")
    assert (openai.provider, openai.base, openai.path) == (
        "openai",
        "https://api.openai.com/v1",
        "/v1/chat/completions",
    )
    anthropic = endpoint_of(ANTHROPIC, "auto")
    assert (anthropic.provider, anthropic.base) == ("anthropic", ANTHROPIC)
    compatible = endpoint_of("http://127.0.0.1:8/llm/k/-/v1/embeddings", "openai")
    assert compatible.base == "http://127.0.0.1:8/llm/k/-/v1"
    assert compatible.path == "/v1/embeddings"


@pytest.mark.parametrize(
    ("url", "asked", "said"),
    [
        ("https://example.com/v1/other", "auto", "cannot tell the provider"),
        ("https://example.com/v1/other", "openai", "must end in one of the endpoints"),
        (OPENAI, "anthropic", "must be a Messages endpoint"),
        (f"{OPENAI}?model=x", "auto", "without a query"),
        ("https://{host}/v1/messages", "auto", "without {fields}"),
    ],
)
def test_an_endpoint_no_batch_runs_is_refused_in_one_line(url: str, asked: str, said: str) -> None:
    with pytest.raises(ValueError, match=said.replace("{", r"\{").replace("}", r"\}")):
        endpoint_of(url, asked)


NONCE = "0123456789ab"


def test_a_rows_custom_id_is_its_parts_nonce_and_index_and_nothing_else_is_taken_for_one() -> None:
    assert index_of(custom_id(1234, NONCE), NONCE) == 1234
    assert index_of(custom_id(1234, NONCE), "ba9876543210") is None, "another part's row"
    for other in (
        f"{NONCE}-01",
        f"{NONCE}--1",
        f"{NONCE}-1a",
        "1",
        None,
        7,
        f"{NONCE}-" + "9" * 19,
    ):
        assert index_of(other, NONCE) is None


def test_each_row_is_written_as_its_provider_takes_it() -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "é"}]}
    line = json.loads(PROVIDERS["openai"].request_line(endpoint_of(OPENAI, "auto"), 3, body, NONCE))
    assert line == {
        "custom_id": f"{NONCE}-3",
        "method": "POST",
        "url": "/v1/chat/completions",
        "body": body,
    }
    line = json.loads(
        PROVIDERS["anthropic"].request_line(endpoint_of(ANTHROPIC, "auto"), 3, body, NONCE)
    )
    assert line == {"custom_id": f"{NONCE}-3", "params": body}
    # The bytes of a submission: a newline after each OpenAI line; Anthropic's JSON around.
    assert PROVIDERS["openai"].submission_size(2, 10) == 12
    assert PROVIDERS["anthropic"].submission_size(2, 10) == 10 + 1 + len('{"requests":[]}')


def test_openai_results_lines_read_as_a_live_calls_would() -> None:
    ok = {"custom_id": f"{NONCE}-1", "response": {"status_code": 200, "body": {"usage": {}}}}
    assert PROVIDERS["openai"].answer_of(ok, NONCE) == PROVIDERS["openai"].answer_of(ok, NONCE)
    answered = PROVIDERS["openai"].answer_of(ok, NONCE)
    assert answered is not None and (answered.index, answered.ok, answered.status_code) == (
        1,
        True,
        200,
    )
    refused = {
        "custom_id": f"{NONCE}-2",
        "response": {"status_code": 400, "body": {"error": {"message": "bad\nmodel"}}},
    }
    failed = PROVIDERS["openai"].answer_of(refused, NONCE)
    assert failed is not None
    assert (failed.ok, failed.error_kind, failed.error) == (False, "status", "HTTP 400: bad model")
    for code, kind in (("batch_expired", "batch_expired"), ("batch_cancelled", "batch_cancelled"),
                       ("other", "batch_errored")):  # fmt: skip
        line = {
            "custom_id": f"{NONCE}-3",
            "response": None,
            "error": {"code": code, "message": "m"},
        }
        said = PROVIDERS["openai"].answer_of(line, NONCE)
        assert said is not None and said.error_kind == kind and said.status_code is None
    assert PROVIDERS["openai"].answer_of({"custom_id": "someone-else"}, NONCE) is None
    assert PROVIDERS["openai"].answer_of(["not", "a", "line"], NONCE) is None


def test_anthropic_results_lines_read_as_a_live_calls_would() -> None:
    message = {"content": [], "usage": {"input_tokens": 3, "output_tokens": 4}}
    ok = PROVIDERS["anthropic"].answer_of(
        {"custom_id": f"{NONCE}-0", "result": {"type": "succeeded", "message": message}},
        NONCE,
    )
    assert ok is not None and (ok.ok, ok.status_code, ok.data) == (True, 200, message)
    assert PROVIDERS["anthropic"].usage_of(ok.data) == (3, 4)
    error = {"type": "error", "error": {"type": "invalid_request_error", "message": "no"}}
    errored = PROVIDERS["anthropic"].answer_of(
        {"custom_id": f"{NONCE}-1", "result": {"type": "errored", "error": error}},
        NONCE,
    )
    assert errored is not None
    assert (errored.error_kind, errored.status_code) == ("batch_errored", 400)
    for kind, ours in (("expired", "batch_expired"), ("canceled", "batch_cancelled")):
        said = PROVIDERS["anthropic"].answer_of(
            {"custom_id": f"{NONCE}-2", "result": {"type": kind}}, NONCE
        )
        assert said is not None and said.error_kind == ours


def test_usage_that_is_not_counts_counts_nothing() -> None:
    assert PROVIDERS["openai"].usage_of(
        {"usage": {"prompt_tokens": 2, "completion_tokens": 5}}
    ) == (2, 5)
    assert PROVIDERS["openai"].usage_of(
        {"usage": {"prompt_tokens": -1, "completion_tokens": True}}
    ) == (0, 0)
    assert PROVIDERS["openai"].usage_of(None) == (0, 0)


def test_a_batch_refused_for_the_enqueued_token_cap_is_told_apart() -> None:
    capped = {"errors": {"data": [{"code": "token_limit_exceeded", "message": "m"}]}}
    assert PROVIDERS["openai"].refused_for_tokens(capped)
    assert not PROVIDERS["openai"].refused_for_tokens(
        {"errors": {"data": [{"code": "invalid_file"}]}}
    )
    assert not PROVIDERS["openai"].refused_for_tokens({"errors": None})


def test_a_parts_rows_are_kept_as_runs_and_found_again() -> None:
    rows = [0, 1, 2, 5, 7, 8]
    runs = ranges_of(rows)
    assert runs == ((0, 2), (5, 5), (7, 8))
    assert list(indexes_in(runs)) == rows
    covered = Covered([Part(1, 1, "openai", runs), Part(2, 1, "openai", ((10, 19),))])
    assert [covered.part_of(i) for i in (0, 2, 3, 5, 6, 8, 9, 10, 19, 20)] == [
        1, 1, None, 1, None, 1, None, 2, 2, None,
    ]  # fmt: skip


def test_a_row_sent_again_in_a_later_part_is_the_later_parts() -> None:
    ended = Part(1, 1, "openai", ((0, 9),), state="expired")
    again = Part(2, 1, "openai", ((3, 3), (7, 8)))
    other = Part(3, 1, "openai", ((10, 12),))
    covered = Covered([again, ended, other])  # (in any order)
    assert [covered.part_of(i) for i in range(14)] == [
        1, 1, 1, 2, 1, 1, 1, 2, 2, 1, 3, 3, 3, None,
    ]  # fmt: skip
    third = Part(4, 1, "openai", ((0, 12),))  # (newest over everything)
    assert {Covered([ended, again, other, third]).part_of(i) for i in range(13)} == {4}
    sent = times_sent([0, 3, 7, 11, 13], [ended, again, other, third])
    assert {index: count for index, (count, _) in sent.items()} == {
        0: 2, 3: 3, 7: 3, 11: 2, 13: 0,
    }  # fmt: skip
    dropped = Part(5, 1, "openai", ((3, 3),), state="dropped", submitted=1.0)
    assert times_sent([3], [ended, dropped]) == {3: (1, math.inf)}, "(none submitted)"
    first = replace(ended, submitted=50.0)
    later = replace(again, submitted=80.0)
    assert times_sent([3, 5], [later, first]) == {3: (2, 50.0), 5: (1, 50.0)}


def test_a_row_may_be_in_a_later_part_of_its_pass_only_once_its_earlier_batch_ended() -> None:
    running = Part(1, 1, "openai", ((0, 4),)).moved("in_progress", 1.0)
    ended = running.moved("expired", 2.0)
    again = Part(2, 1, "openai", ((3, 4),))
    twice = overlap_problem([running, again])
    assert twice is not None and "another part" in twice
    assert overlap_problem([ended, again]) is None
    # (and once its own batch ended, a third part may hold them again; not before)
    assert (
        overlap_problem([ended, again.moved("completed", 3.0), Part(3, 1, "openai", ((4, 4),))])
        is None
    )
    third = overlap_problem(
        [ended, again.moved("in_progress", 3.0), Part(3, 1, "openai", ((4, 4),))]
    )
    assert third is not None
    # (one failed for the queue's cap, waiting to be submitted again, has not ended)
    refused = ended.moved("failed", 3.0).moved("waiting", 4.0)
    assert overlap_problem([refused, again]) is not None
    assert overlap_problem([ended.moved("collected", 5.0).moved("cleaned", 6.0), again]) is None


@pytest.mark.parametrize(
    ("kind", "status", "retry_if", "again"),
    [
        ("batch_expired", None, None, True),  # (never ran: nothing paid)
        ("status", 503, None, True),
        ("status", 429, None, True),
        ("status", 400, None, False),
        ("batch_errored", 500, None, True),  # (a provider's own error standing for a 500)
        ("batch_errored", None, None, False),  # (no status: may have run)
        ("batch_cancelled", None, None, False),
        ("invalid_body", 200, None, False),  # (an answer that ran, and was paid for)
        ("status", 503, lambda status, kind: False, False),  # (retry_if asked, as live)
        ("status", 418, lambda status, kind: True, False),  # (answered: may be paid, never)
        ("status", 400, lambda status, kind: True, False),
        ("batch_errored", 500, lambda status, kind: False, False),  # (both providers alike)
        ("batch_errored", 502, lambda status, kind: kind == "status", True),
        ("status", 500, lambda status, kind: 1 / 0, False),  # (raises: no)
        ("status", 500, lambda status, kind: "yes", False),  # (no answer: no)
        ("batch_expired", None, lambda status, kind: False, True),  # (not asked: never ran)
    ],
)
def test_a_failed_row_is_sent_again_only_when_the_retry_policy_says_and_it_was_not_paid_for(
    kind: str, status: int | None, retry_if: object, again: bool
) -> None:
    answer = Answer(4, False, status, None, kind, "said")  # type: ignore[arg-type]
    verdict = row_failure(answer, HttpFacts(status), RETRYABLE, retry_if)  # type: ignore[arg-type]
    assert (verdict.outcome == "retry") is again
    assert verdict.error_kind == kind and verdict.error == "said"


def test_a_part_round_trips_through_its_journal_row_and_is_trusted() -> None:
    part = Part(1, 1, "openai", ((0, 9),), tag=new_tag(1)).moved("planned", 1.7e9)
    part = part.moved(
        "in_progress", 1.7e9 + 1, batch="batch_1", input_file="file-1", submitted=1.7e9 + 1
    )
    row = row_of(part)
    assert submission_problem(row, 10, {1}) is None
    assert part_of(row) == part
    assert [state for _, state in part.history] == ["planned", "in_progress"]


@pytest.mark.parametrize(
    ("column", "value", "said"),
    [
        (1, 2, "pass"),
        (2, "azure", "provider"),
        (3, "[[0, 10]]", "rows"),
        (3, "[[5, 2]]", "rows"),
        (3, "[[0, 3], [3, 5]]", "rows"),
        (4, "In Progress", "state"),
        (6, "../../v1/files", "id"),
        (6, "batch_1", "batch is set for a part the provider has not"),
        (5, "file-1", "input_file is set for a part with no upload"),
        (5, "batch_1", "not a file id"),
        (14, None, "tag"),
        (14, "batchsync-part-2-0123456789ab", "tag"),
        (4, "uploaded", "last of its history"),
        (0, 11, "part"),
        (10, "NaN", "time"),
        (11, '[[1, "x y"]]', "history"),
        (12, -1, "tokens"),
    ],
)
def test_a_tampered_submissions_row_is_not_trusted(column: int, value: object, said: str) -> None:
    part = Part(1, 1, "openai", ((0, 9),), tag=new_tag(1)).moved("planned", 1.7e9)
    row = list(row_of(part))
    row[column] = value
    problem = submission_problem(row, 10, {1})
    assert problem is not None and said in problem


def test_batch_options_go_with_batch_api_and_refuse_what_a_batch_cannot_honour() -> None:
    with pytest.raises(ValueError, match="go with batch_api"):
        Batch([], poll=1.0)
    with pytest.raises(ValueError, match="needs url="):
        Batch([], batch_api="openai")
    with pytest.raises(ValueError, match="dedup cannot apply"):
        Batch([], url=OPENAI, method="POST", batch_api="auto", dedup=True)
    with pytest.raises(ValueError, match="cannot tell the provider"):
        Batch([], url="https://example.com/x", method="POST", batch_api="auto")


def test_no_row_is_in_two_parts_of_a_pass_and_parts_are_numbered_in_turn() -> None:
    first = Part(1, 1, "openai", ((0, 4),), state="in_progress")
    assert overlap_problem([first, Part(2, 1, "openai", ((5, 9),))]) is None
    assert overlap_problem([first, Part(2, 2, "openai", ((0, 4),))]) is None, "a retry pass"
    dropped = Part(1, 1, "openai", ((0, 4),), state="dropped")
    assert overlap_problem([dropped, Part(2, 1, "openai", ((0, 4),))]) is None
    twice = overlap_problem([first, Part(2, 1, "openai", ((4, 6),))])
    assert twice is not None and "another part" in twice
    gap = overlap_problem([first, Part(3, 1, "openai", ((5, 9),))])
    assert gap is not None and "next number" in gap


def test_a_batch_at_the_provider_is_taken_for_a_part_only_when_it_was_made_of_it() -> None:
    part = Part(1, 1, "openai", ((0, 9),), input_file="file-a")
    assert PROVIDERS["openai"].belongs_to({"input_file_id": "file-a"}, part)
    assert not PROVIDERS["openai"].belongs_to({"input_file_id": "file-b"}, part)
    rows = Part(1, 1, "anthropic", ((0, 9),))
    counts = {"processing": 4, "succeeded": 6, "errored": 0, "canceled": 0, "expired": 0}
    assert PROVIDERS["anthropic"].belongs_to({"request_counts": counts}, rows)
    assert not PROVIDERS["anthropic"].belongs_to(
        {"request_counts": {**counts, "processing": 5}}, rows
    )


def test_what_a_results_download_keeps_stays_within_the_rows_read() -> None:
    """Each row's first line, and one line of another part's; nothing else, however many
    lines a provider lists (what the download keeps on disk and in memory is bounded by the
    rows read); a row listed again with another answer is a conflict, alike it is one."""
    listing = _Listing("0123456789ab", {0, 1, 2})
    ours = [custom_id(n, "0123456789ab") for n in range(4)]
    others = [custom_id(n, "ba9876543210") for n in range(1000)]
    assert listing.keeps(ours[0], b"first", False)
    assert not listing.keeps(ours[0], b"first", False)  # (listed again alike)
    assert listing.keeps(ours[1], b"first", False)
    assert not listing.keeps(ours[1], b"another", False)
    assert listing.keeps(ours[2], b"a line too large to compare", True)
    assert not listing.keeps(ours[2], b"the same line, cut elsewhere", True)
    assert not listing.keeps(ours[3], b"a row of the part this run does not read", False)
    assert [listing.keeps(given, b"x", False) for given in others].count(True) == 1
    assert not listing.keeps(None, b"no custom_id", False)
    assert not listing.keeps("not-a-row-id", b"x", False)
    assert listing.conflicts == {ours[1]}
    assert len(listing.first) == 3
