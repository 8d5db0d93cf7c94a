"""The breaker judges a host by evidence a retry pass does not bias: an item sent again that
fails as it failed before is its own news, not the host's. Counted by the server."""

from __future__ import annotations

import contextvars
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from batchsync import Backoff, Batch, Breaker
from batchsync.core.engine import Engine
from batchsync.core.result import ATTEMPT_EARLIER, Result, added_to, judged_by, repeats
from batchsync.core.verdict import Verdict
from batchsync.jobs.calls import CallJob
from batchsync.jobs.options import CallOptions, build
from batchsync.limits.gate import HeldNow, Hold
from batchsync.limits.gates import TURNED_OFF_BY
from batchsync.run.assembly import gates_for
from batchsync.run.progress import held_words

from .mockserver import MockServerProcess, start_mock_server


class _Answered:
    def __init__(self, status: int | None) -> None:
        self.status_code = status
        self.final_url = None
        self.redirects = 0


def failed(kind: str, status: int | None) -> Result:
    return Result(0, "u", False, error_kind=kind, status_code=status)  # type: ignore[arg-type]


def attempt(outcome: str, kind: str | None, status: int | None) -> Verdict:
    return Verdict(outcome, kind, "e", facts=_Answered(status))  # type: ignore[arg-type]


def test_a_failure_repeated_is_the_items_own() -> None:
    assert repeats(failed("status", 503), attempt("retry", "status", 503))
    assert repeats(failed("invalid_body", 200), attempt("terminal", "invalid_body", 200))


def test_a_failure_a_limit_ended_is_repeated_by_its_last_answer() -> None:
    """An item whose last answer was a 503 and that a limit then ended (the budget could not
    wait its Retry-After, its circuit was open) failed as a 503: a 503 again is a repeat (on
    the code before, the kinds differed and the retry pass opened the breaker)."""
    for ended in ("budget", "deadline", "circuit_open"):
        assert repeats(failed(ended, 503), attempt("retry", "status", 503))
    assert not repeats(failed("budget", 503), attempt("retry", "status", 500))
    assert not repeats(failed("budget", None), attempt("retry", "status", 503))


def test_another_failure_or_a_success_is_news_of_the_host() -> None:
    assert not repeats(failed("status", 503), attempt("retry", "connection", None))
    assert not repeats(failed("status", 404), attempt("retry", "status", 503))
    assert not repeats(failed("status", 503), attempt("success", None, 200))
    ok = Result(0, "u", True, status_code=200)
    assert not repeats(ok, attempt("retry", "status", 503))


def test_what_goes_to_a_worker_is_what_the_breaker_judges_by_and_nothing_else() -> None:
    earlier = Result(
        3, "http://h.test/?key=canary-7f3", False, status_code=503, error_kind="status",
        data={"body": "big"}, continuation={"Authorization": "Bearer canary-7f3"},
    )  # fmt: skip
    sent = judged_by(earlier)
    assert (sent.index, sent.ok, sent.error_kind, sent.status_code) == (3, False, "status", 503)
    assert "canary" not in repr((sent, sent.continuation)) and sent.data is None
    verdict = attempt("retry", "status", 503)
    assert repeats(sent, verdict) == repeats(earlier, verdict) is True


# A ratio and a number of calls the first pass's mix (a quarter of its items failing) stays
# under however its answers come, and a pass of only failures goes over.
BREAKER = Breaker(ratio=0.75, window=20, min_calls=10, reset=30)


def items_of(url: str, marker: str, query: str = "") -> list[str]:
    """80 items, every 4th always 503 (with ``query``): a quarter failing, which the breaker
    tolerates."""
    return [
        f"{url}/503/{marker}-{n}{query}" if n % 4 == 0 else f"{url}/ok/{marker}-{n}"
        for n in range(80)
    ]


def batch_of(items: list[str], journal: Path, **options: Any) -> Batch:
    options = {"breaker": BREAKER, **options}
    return Batch(items, journal=journal, concurrency=4, attempts=2, cooldown="off",
                 backoff=Backoff(base=0.01), budget=10, **options)  # fmt: skip


def first_run(url: str, marker: str, journal: Path, query: str = "", **options: Any) -> Batch:
    """The items of ``items_of`` run once: their 20 failures, no circuit opened."""
    batch = batch_of(items_of(url, marker, query), journal, **options)
    rs = batch.run()
    assert [r.ok for r in rs].count(False) == 20
    assert rs.summary().circuits_opened == 0
    return batch


@pytest.mark.integration
@pytest.mark.parametrize(
    "case",
    [
        ("", {}, 40, "status"),  # each of the 20 sent its 2 attempts again
        # Each worker process is handed its items' earlier Results with them.
        ("", {"processes": 2}, 40, "status"),
        # A Retry-After past the budget: each 503 ended its item as budget, after one attempt.
        ("?retry_after=100", {}, 20, "budget"),
    ],
    ids=["known-failures", "worker-processes", "failures-a-limit-ended"],
)
def test_a_retry_pass_of_known_failures_does_not_open_the_breaker(
    server: MockServerProcess, tmp_path: Path, case: tuple[str, dict[str, Any], int, str]
) -> None:
    """None held, none ended circuit_open: on the code before each case's fix, the circuit
    opened (in each worker process, for the second) and held the rest past their budget;
    they ended circuit_open, fewer sent. A case: the 503s' query, the run's options, the
    requests the pass sends, the kind its failures end with."""
    query, options, resent, kind = case
    marker = uuid.uuid4().hex[:10]
    batch = first_run(server.url, marker, tmp_path / "j.sqlite3", query, **options)
    before = len(server.log(marker))
    rs = batch.run(retry_failed=True)
    assert len(server.log(marker)) - before == resent
    assert {r.error_kind for r in rs if not r.ok} == {kind}
    assert rs.summary().circuits_opened == 0


@pytest.mark.integration
def test_a_hedges_second_request_in_a_retry_pass_is_judged_as_its_attempt_is(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """A slow 503 is hedged: its second request, a 503 again, repeats the item's earlier
    Result as its first does. (Only the retry pass is hedged: a first pass whose every 503
    is sent twice over could open the circuit itself.)"""
    marker, journal = uuid.uuid4().hex[:10], tmp_path / "j.sqlite3"
    first_run(server.url, marker, journal, "?delay=0.3")
    hedged = batch_of(items_of(server.url, marker, "?delay=0.3"), journal, hedge_after=0.05)
    before = len(server.log(marker))
    rs = hedged.run(retry_failed=True)
    sent = Counter(entry["target"] for entry in server.log(marker)[before:])
    # Every item's 2 attempts sent again, hedged: on the code before, the hedges' 503s
    # counted for the breaker, and the circuit opened.
    assert len(sent) == 20 and min(sent.values()) >= 3, sent
    assert {r.error_kind for r in rs if not r.ok} == {"status"}
    assert rs.summary().circuits_opened == 0


@pytest.mark.integration
def test_a_host_that_went_down_still_opens_it_in_a_retry_pass(tmp_path: Path) -> None:
    own = start_mock_server()
    try:
        batch = first_run(own.url, uuid.uuid4().hex[:10], tmp_path / "j.sqlite3")
    finally:
        own.process.terminate()
        own.process.wait()
    rs = batch.run(retry_failed=True)  # every connection refused: the host's failure
    assert rs.summary().circuits_opened >= 1
    assert "circuit_open" in {r.error_kind for r in rs}


def test_the_bar_names_a_hold_once_it_has_lasted_with_what_turns_it_off() -> None:
    held = HeldNow()
    first = held.begin("breaker", "api.test:443", now=100.0)
    held.begin("breaker", "api.test:443", now=101.0)
    held.begin("cooldown", "other.test:443", now=102.0)
    hold = held.longest(now=104.5)
    assert hold == Hold("breaker", "api.test:443", 2, 4.5)
    assert held_words(hold, TURNED_OFF_BY["breaker"]) == (
        "breaker holds api.test:443 (2 waiting, 4 s; --breaker off turns it off)"
    )
    assert held_words(Hold("cooldown", "h", 1, 2.9), "--cooldown off") is None  # (no news yet)
    held.end(first)
    held.end(first)
    assert held.longest(now=105.0) == Hold("cooldown", "other.test:443", 1, 3.0)


@pytest.mark.integration
def test_the_progress_line_says_which_gate_holds_which_host(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = uuid.uuid4().hex[:10]
    (tmp_path / "urls.txt").write_text(
        "".join(f"{server.url}/503/{marker}-{n}\n" for n in range(6)), encoding="utf-8"
    )
    run = subprocess.run(
        [sys.executable, "-m", "batchsync", "urls.txt", "--progress", "-c", "2",
         "--attempts", "1", "--breaker", "0.5:4:2:6", "--budget", "8"],
        cwd=tmp_path, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    host = server.url.removeprefix("http://")
    assert f"breaker holds {host} (" in run.stderr
    assert "--breaker off turns it off)" in run.stderr


def test_no_answer_is_never_the_items_own() -> None:
    assert not repeats(failed("connection", None), attempt("retry", "connection", None))
    assert not repeats(failed("timeout", None), attempt("retry", "timeout", None))


def test_the_attempts_in_all_are_said_once_however_often_a_result_is_added_to() -> None:
    first = Result(
        0, "u", False, attempts=2, error_kind="status", error="HTTP 503 after 2 attempts"
    )
    second = Result(0, "u", False, attempts=1, error_kind="status", error="HTTP 503")
    third = Result(
        0, "u", False, attempts=2, error_kind="status", error="HTTP 503 after 2 attempts"
    )
    twice = added_to(first, added_to(second, third))
    assert twice.attempts == 5
    assert twice.error == "HTTP 503 after 2 attempts; 5 attempts in all"


class _Unavailable(Exception):
    status_code = 503


def slow_unavailable(item: object) -> None:
    time.sleep(1.0)  # (long past hedge_after however loaded the machine)
    raise _Unavailable("unavailable")


def test_an_item_with_no_earlier_result_counts_its_hedge_whatever_its_thread_was_given() -> None:
    """A thread that inherited another item's earlier Result (a free-threaded Python 3.14
    starts a thread with a copy of its starter's context: an engine's worker started by an
    attempt of a retry pass) carries an item with none: its hedge's 503 counts, as its own
    attempt's does. (On the code before, the hedge read the other item's Result: the
    circuit, which two failures open, saw one.)"""
    options = build(CallOptions, attempts=1, hedge_after=0.05, cooldown="off",
                    breaker=Breaker(ratio=1.0, window=2, min_calls=2, reset=30))  # fmt: skip
    gates = gates_for(options)
    job = CallJob(slow_unavailable, options, options.secrets(), gates)

    def in_an_inherited_context() -> Result:
        ATTEMPT_EARLIER.set(Result(7, None, False, status_code=503, error_kind="status"))
        return Engine(options, gates=gates).run_one(job, "item")

    try:
        result = contextvars.copy_context().run(in_an_inherited_context)
        assert result.status_code == 503 and result.attempt_log[-1].hedged, result
        give_up = time.monotonic() + 10
        while gates.circuits_opened == 0 and time.monotonic() < give_up:
            time.sleep(0.01)
    finally:
        job.close()
    assert gates.circuits_opened == 1
