"""Answers worth paying for (issue 43, opt-in): with ``retry_answers``, an LLM answer cut short
by its token limit, held back by the provider's filter, or failing ``expect=`` is tried again
within the attempts, whatever the method, its tokens counted; one still so after the last
attempt fails with a kind of its own. Against the mock LLM API, whose completions are cut
short (``finish_reason: length``, ``stop_reason: max_tokens``) when their drawn length is the
whole ``max_tokens``: a body of ``max_tokens`` 1 always is, and the same body draws the same."""

from __future__ import annotations

from typing import Any

import pytest
from pydantic import BaseModel

import batchsync
from batchsync import fetch_all
from batchsync.http.answers import answer_flaw

from .mockserver import MockServerProcess
from .test_cli import batchsync as run_cli
from .test_llm_batches import prefix


@pytest.mark.parametrize(
    ("answer", "flaw"),
    [
        ({"choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}]},
         ("truncated", "finish_reason length")),
        ({"choices": [{"finish_reason": "content_filter"}]},
         ("filtered", "finish_reason content_filter")),
        ({"choices": [{"finish_reason": "stop", "message": {"refusal": "I can't"}}]},
         ("filtered", "message refusal")),
        ({"stop_reason": "max_tokens", "content": []}, ("truncated", "stop_reason max_tokens")),
        ({"stop_reason": "refusal"}, ("filtered", "stop_reason refusal")),
        ({"status": "incomplete", "incomplete_details": {"reason": "max_output_tokens"}},
         ("truncated", "incomplete_details.reason max_output_tokens")),
        ({"choices": [{"finish_reason": "stop", "message": {"refusal": None}}]}, None),
        ({"stop_reason": "end_turn"}, None),
        ({"choices": "length"}, None),
        ([{"finish_reason": "length"}], None),
        ("length", None),
    ],
)  # fmt: skip
def test_what_an_answer_says_of_how_it_ended(answer: object, flaw: object) -> None:
    assert answer_flaw(answer) == flaw


def chat(url: str, max_tokens: int, n: int) -> dict[str, Any]:
    body = {"model": "gpt-mock", "max_tokens": max_tokens,
            "messages": [{"role": "user", "content": f"question {n}"}]}  # fmt: skip
    return {"url": url, "method": "POST", "json": body, "id": n}


def test_a_truncated_answer_is_tried_again_and_ends_truncated_paid_for(
    server: MockServerProcess,
) -> None:
    """Without the option every answer is ok; with it, a POST (no idempotency key) cut short
    is sent again up to the attempts, and each attempt's usage is billed and counted."""
    base, key = prefix(server, "rpm=100000,tpm=10000000")
    url = f"{base}/v1/chat/completions"
    items = [chat(url, 1, n) for n in range(4)] + [chat(url, 500, n) for n in range(4, 8)]
    prices = {"models": {"gpt-mock": {"input": "1", "output": "1"}}}
    taken = fetch_all(items, concurrency=4)
    assert all(r.ok for r in taken)
    cut = [r.index for r in taken if r.data["choices"][0]["finish_reason"] == "length"]
    assert set(range(4)) <= set(cut)
    before = server.get(f"/llm/{key}/stats")
    rs = fetch_all(items, concurrency=4, attempts=3, retry_answers="truncated",
                   max_cost="1", prices=prices)  # fmt: skip
    after = server.get(f"/llm/{key}/stats")
    assert [r.ok for r in rs] == [r.index not in cut for r in rs]
    for result in (rs[index] for index in cut):
        assert result.error_kind == "truncated" and result.attempts == 3, result
        assert result.error == "answer truncated (finish_reason length) after 3 attempts"
        assert result.data is None
    assert after["requests"] - before["requests"] == 3 * len(cut) + 8 - len(cut)
    tokens = (after["prompt_tokens"] - before["prompt_tokens"]) + (
        after["completion_tokens"] - before["completion_tokens"]
    )
    assert sum(r.cost or 0 for r in rs) == pytest.approx(tokens / 10**6, abs=1e-12)


def test_anthropics_max_tokens_stop_is_truncated_too(server: MockServerProcess) -> None:
    base, _ = prefix(server, "rpm=100000,tpm=10000000")
    item = {"url": f"{base}/v1/messages", "method": "POST",
            "json": {"model": "claude-mock", "max_tokens": 1,
                     "messages": [{"role": "user", "content": "hi"}]}}  # fmt: skip
    (result,) = fetch_all([item], attempts=2, retry_answers={"truncated", "filtered"})
    assert result.error_kind == "truncated" and result.attempts == 2
    assert "stop_reason max_tokens" in (result.error or "")
    (kept,) = fetch_all([item], attempts=2, retry_answers={"filtered"})
    assert kept.ok and kept.attempts == 1


class Strict(BaseModel):
    answer: str


def test_an_answer_failing_expect_is_tried_again_only_when_asked(
    server: MockServerProcess,
) -> None:
    base, _ = prefix(server, "rpm=100000,tpm=10000000")
    items = [chat(f"{base}/v1/chat/completions", 5, 0)]
    (once,) = fetch_all(items, attempts=3, expect=Strict)
    assert once.error_kind == "invalid_body" and once.attempts == 1
    (thrice,) = fetch_all(items, attempts=3, expect=Strict, retry_answers=["invalid"])
    assert thrice.error_kind == "invalid_body" and thrice.attempts == 3


def test_a_name_that_is_no_answer_to_retry_is_refused_in_one_line(tmp_path: Any) -> None:
    with pytest.raises(ValueError, match="'partial' is not one of truncated, filtered, invalid"):
        fetch_all(["http://127.0.0.1:9/"], retry_answers="truncated,partial")
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/\n")
    refused = run_cli("urls.txt", "--retry-answers", "cut", cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "'cut' is not one of truncated, filtered, invalid" in refused.stderr
    assert "Traceback" not in refused.stderr


class Completion(BaseModel):
    """An SDK's completion, as the function of ``run_all`` returns it."""

    choices: list[dict[str, Any]]


def test_run_all_tries_again_what_a_function_returns_cut_short() -> None:
    """A mapping or an SDK's object (read through ``model_dump``): the flaw named is retried,
    by the same rule as an HTTP answer; one not named is taken."""
    calls: list[int] = []

    def complete(n: int) -> object:
        calls.append(n)
        choice = {"finish_reason": "length" if n < 2 else "stop"}
        return Completion(choices=[choice]) if n == 0 else {"choices": [choice]}

    rs = batchsync.run_all(complete, [0, 1, 2], attempts=3, retry_answers="truncated")
    assert [r.error_kind for r in rs] == ["truncated", "truncated", None]
    assert sorted(calls) == [0, 0, 0, 1, 1, 1, 2]
    assert rs[0].error == "answer truncated (finish_reason length) after 3 attempts"
    taken = batchsync.run_all(complete, [0, 1], attempts=3, retry_answers="filtered")
    assert all(r.ok and r.attempts == 1 for r in taken)
