"""The HTTP retry policy a caller sets: the retryable statuses (``retry_statuses``,
``--retry-statuses``) and ``retry_if``; by default the design's 408, 429 and 5xx."""

from __future__ import annotations

from pathlib import Path

import pytest

from batchsync import Backoff, fetch_all
from batchsync.core.verdict import ErrorKind, Verdict, retry, terminal
from batchsync.http.classify import classify_status
from batchsync.http.httpfacts import HttpFacts, facts_of
from batchsync.http.retries import RETRY_STATUSES, RETRYABLE, judged, parse_statuses

from .mockserver import MockServerProcess
from .test_cli import batchsync, read_jsonl

FAST = Backoff(base=0.01, max=0.01, jitter=0)


def answering(server: MockServerProcess, *codes: int) -> list[str]:
    """URLs the mock server answers with these statuses and nothing else."""
    return [f"{server.url}/status/{code}" for code in codes]


def test_the_default_is_the_designs_table() -> None:
    assert parse_statuses(RETRY_STATUSES) == RETRYABLE == {408, 429, *range(500, 600)}


@pytest.mark.parametrize(
    ("spec", "statuses"),
    [
        ("429", {429}),
        (" 429 , 503 ", {429, 503}),
        ("502-504", {502, 503, 504}),
        ("4xx", set(range(400, 500))),
        ("", set()),
        ("none", set()),
        ([429, 503], {429, 503}),
        (frozenset(), set()),
    ],
)
def test_statuses_are_numbers_ranges_or_families(spec: str | list[int], statuses: set[int]) -> None:
    assert parse_statuses(spec) == statuses


@pytest.mark.parametrize(
    ("spec", "says"),
    [
        ("abc", "'abc' is not a status"),
        ("429,,503", "'' is not a status"),
        ("2xx", "'2xx' is not a status"),
        ("200", "200 in '200': a retried status is 400 to 599"),
        ("399-401", "399 in '399-401'"),
        ("504-502", "'504-502': a range goes from the lower status up"),
        ([600], "600 in [600]"),
        ([True], "a status is a number, not True"),
    ],
)
def test_what_names_no_failing_status_is_refused(spec: str | list[int], says: str) -> None:
    with pytest.raises(ValueError) as raised:
        parse_statuses(spec)
    assert says in str(raised.value)


def test_a_bad_option_is_one_value_error_before_anything_is_sent() -> None:
    with pytest.raises(ValueError, match=r"^invalid option: retry_statuses: 'x' is not a status"):
        fetch_all(["http://127.0.0.1:1/never"], retry_statuses="x", progress=False)


def test_the_statuses_decide_a_status_and_a_rate_limited_403_stays_retried() -> None:
    only_404 = frozenset({404})
    assert classify_status(404, None, 0.0, retryable=only_404).outcome == "retry"  # type: ignore[union-attr]
    assert classify_status(503, None, 0.0, retryable=only_404).outcome == "terminal"  # type: ignore[union-attr]
    assert classify_status(403, "5", 0.0, retryable=only_404).outcome == "retry"  # type: ignore[union-attr]
    assert classify_status(503, None, 0.0).outcome == "retry"  # type: ignore[union-attr]
    assert classify_status(404, None, 0.0).outcome == "terminal"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("verdict", "say", "outcome"),
    [
        (terminal("status", "HTTP 404", HttpFacts(404)), True, "retry"),
        (retry("status", "HTTP 503", HttpFacts(503)), False, "terminal"),
        (retry("timeout", "read timed out"), None, "retry"),
        (terminal("invalid_body", "not JSON", HttpFacts(200)), True, "retry"),
    ],
)
def test_retry_if_says_retried_final_or_as_it_was(
    verdict: Verdict, say: bool | None, outcome: str
) -> None:
    asked: list[tuple[int | None, ErrorKind]] = []

    def retry_if(status: int | None, kind: ErrorKind) -> bool | None:
        asked.append((status, kind))
        return say

    judgement = judged(verdict, retry_if)
    assert judgement.outcome == outcome
    assert asked == [(facts_of(verdict).status_code, verdict.error_kind)]
    assert (judgement.error, judgement.facts) == (verdict.error, verdict.facts)


def test_retry_if_is_not_asked_about_a_limit_a_stop_or_a_success() -> None:
    def never(status: int | None, kind: ErrorKind) -> bool:
        raise AssertionError(kind)

    for verdict in (
        Verdict("terminal", "cancelled", "lost the race to a hedged request"),
        Verdict("terminal", "budget", "no time left in the budget"),
        Verdict("success", facts=HttpFacts(200)),
    ):
        assert judged(verdict, never) is verdict


def test_a_retry_if_that_raises_ends_the_route_saying_so() -> None:
    def broken(status: int | None, kind: ErrorKind) -> bool:
        raise KeyError("oops")

    judgement = judged(retry("status", "HTTP 503", HttpFacts(503)), broken)
    assert (judgement.outcome, judgement.error_kind, facts_of(judgement).status_code) == (
        "terminal",
        "status",
        503,
    )
    assert judgement.error == "HTTP 503 (retry_if raised KeyError: 'oops')"


@pytest.mark.parametrize("said", ["no", 1, 0, ["sk-secret"], 0.5])
def test_a_retry_if_that_answers_no_bool_ends_the_item_naming_it_and_the_type(
    server: MockServerProcess, said: object
) -> None:
    """Taken by its truth, "no" would retry and 0 would not: neither is an answer. The
    value itself is never shown (it may hold a secret), its type is."""

    def policy(status: int | None, kind: ErrorKind) -> bool | None:
        return said  # type: ignore[return-value]

    urls = answering(server, 503, 404)
    rs = fetch_all(urls, attempts=3, backoff=FAST, retry_if=policy, progress=False)
    shown = type(said).__name__
    for result, status in zip(rs, (503, 404), strict=True):
        assert (result.ok, result.attempts, result.error_kind, result.status_code) == (
            False,
            1,
            "status",
            status,
        )
        assert result.error == (
            f"HTTP {status} (retry_if test_a_retry_if_that_answers_no_bool_ends_the_item_naming_"
            f"it_and_the_type.<locals>.policy returned {shown}, not True, False or None)"
        )
        assert "sk-secret" not in result.error


def test_a_status_not_retried_by_default_is_retried_when_listed_and_a_default_one_not(
    server: MockServerProcess,
) -> None:
    urls = answering(server, 404, 503)
    rs = fetch_all(urls, attempts=3, backoff=FAST, retry_statuses="404", progress=False)
    assert [(r.status_code, r.attempts, r.error_kind) for r in rs] == [
        (404, 3, "status"), (503, 1, "status")
    ]  # fmt: skip
    assert rs[0].error == "HTTP 404 after 3 attempts"
    default = fetch_all(urls, attempts=3, backoff=FAST, progress=False)
    assert [(r.status_code, r.attempts) for r in default] == [(404, 1), (503, 3)]


def test_retry_if_decides_through_the_library(server: MockServerProcess) -> None:
    def retry_if(status: int | None, kind: ErrorKind) -> bool | None:
        return {404: True, 503: False}.get(status or 0)

    urls = answering(server, 404, 503, 502)
    rs = fetch_all(urls, attempts=2, backoff=FAST, retry_if=retry_if, progress=False)
    assert [(r.status_code, r.attempts) for r in rs] == [(404, 2), (503, 1), (502, 2)]


@pytest.mark.integration
def test_the_cli_retries_the_statuses_it_is_given(
    server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text("\n".join(answering(server, 404, 503)) + "\n")
    done = batchsync(
        "urls.txt", "--retry-statuses", "404,418", "--attempts", "2", "-q", cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    results = read_jsonl(tmp_path / "urls-results.jsonl")
    assert [(r["status_code"], r["attempts"]) for r in results] == [(404, 2), (503, 1)]


@pytest.mark.integration
def test_the_cli_refuses_what_names_no_status_in_one_line(tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:1/never\n")
    done = batchsync("urls.txt", "--retry-statuses", "429,2xx", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "Error: Invalid value for '--retry-statuses': '2xx' is not a status, a range (502-504)"
        " or 4xx/5xx"
    )
    assert not (tmp_path / "urls-results.jsonl").exists()
