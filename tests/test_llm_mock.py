"""The mock LLM API (batchsync.mock.llm, served by the mock server) driven by the real
``openai`` and ``anthropic`` clients: answers as theirs are, limits as the services count
them, 429s that the SDKs raise as their RateLimitError with the providers' headers, and a
window that slides (server-side counts)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest
import requests

from batchsync.mock.llm import Bucket, Window, go_duration, nearest_thousand, parse_limits, rfc3339

from .mockserver import ROOT, MockServerProcess

pytestmark = pytest.mark.integration

GO_DURATION = re.compile(r"^(\d+h)?(\d+m)?(\d+(\.\d+)?s|\d+ms)$")
OPENAI_HEADERS = [
    f"x-ratelimit-{what}-{name}"
    for what in ("limit", "remaining", "reset")
    for name in ("requests", "tokens")
]
ANTHROPIC_HEADERS = [
    f"anthropic-ratelimit-{name}-{what}"
    for name in ("requests", "tokens", "input-tokens", "output-tokens")
    for what in ("limit", "remaining", "reset")
]


def prefix(server: MockServerProcess, limits: str) -> tuple[str, str]:
    """A fresh KEY's base URL with these limits, and the KEY."""
    key = uuid.uuid4().hex[:10]
    return f"{server.url}/llm/{key}/{limits}", key


def stats(server: MockServerProcess, key: str) -> dict[str, Any]:
    return server.get(f"/llm/{key}/stats?log=1")


def gpt(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="sk-test", max_retries=0)


def claude(base: str) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=base, api_key="sk-ant-test", max_retries=0)


def ask(client: openai.OpenAI, text: str, max_tokens: int, **extra: Any) -> Any:
    return client.chat.completions.create(
        model="gpt-mock",
        messages=[{"role": "user", "content": text}],
        max_tokens=max_tokens,
        **extra,
    )


# The mock's own token count: ceil(characters / 4) a text, 4 a message, 2 a prompt.
def cost(text: str, max_tokens: int = 0, n: int = 1) -> int:
    return 2 + 4 + math.ceil(len(text) / 4) + max_tokens * n


def test_go_durations_are_printed_as_go_prints_them() -> None:
    assert [go_duration(s) for s in (0, 0.02, 0.0004, 1, 1.5, 59.9991, 360, 3600, 3725.5)] == [
        "0s",
        "20ms",
        "1ms",
        "1s",
        "1.5s",
        "1m0s",
        "6m0s",
        "1h0m0s",
        "1h2m5.5s",
    ]


def test_anthropic_times_and_counts_are_shown_as_theirs_are() -> None:
    assert rfc3339(1_767_225_599.2) == "2026-01-01T00:00:00Z"  # (rounded up)
    assert [nearest_thousand(n) for n in (0, 499, 500, 59_400, 60_000)] == [
        0,
        0,
        1000,
        59_000,
        60_000,
    ]


def test_limits_are_read_from_the_path_with_defaults() -> None:
    limits = parse_limits("rpm=600,tpm=60000,window=6")
    assert (limits.rpm, limits.tpm, limits.itpm, limits.otpm, limits.window) == (
        600,
        60_000,
        60_000,
        60_000,
        6.0,
    )
    assert parse_limits("-") == parse_limits("")
    assert parse_limits("-").window == 60
    for bad in ("rpm", "rpx=5", "window=0", "tpm=-1"):
        with pytest.raises(ValueError):
            parse_limits(bad)


def test_a_window_says_when_an_amount_fits_again() -> None:
    window = Window(10.0)
    window.add(100.0, 40)
    window.add(104.0, 50)
    assert window.used(105.0) == 90
    assert window.wait_for(105.0, 10, 100) == 0
    assert window.wait_for(105.0, 11, 100) == 5.0  # the first 40 leave at 110
    assert window.wait_for(105.0, 60, 100) == 9.0  # both must leave: at 114
    assert window.wait_for(105.0, 101, 100) == math.inf
    assert window.reset_in(105.0) == 9.0
    assert window.used(110.0) == 50  # (what was counted at 100 has left at 110)


def test_openai_chat_completion_with_usage_and_headers(server: MockServerProcess) -> None:
    base, key = prefix(server, "rpm=10,tpm=10000")
    raw = gpt(base).chat.completions.with_raw_response.create(
        model="gpt-mock", messages=[{"role": "user", "content": "hello there"}], max_tokens=100
    )
    reply = raw.parse()
    assert reply.object == "chat.completion" and reply.model == "gpt-mock"
    assert reply.usage is not None and reply.usage.prompt_tokens == cost("hello there") == 9
    completion = reply.usage.completion_tokens
    assert 1 <= completion <= 100
    assert reply.usage.total_tokens == 9 + completion
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and choice.message.content
    assert choice.finish_reason == ("length" if completion == 100 else "stop")
    headers = raw.headers
    assert all(name in headers for name in OPENAI_HEADERS), dict(headers)
    assert (headers["x-ratelimit-limit-requests"], headers["x-ratelimit-limit-tokens"]) == (
        "10",
        "10000",
    )
    # OpenAI counts a request at admission: its prompt and the whole max_tokens.
    assert headers["x-ratelimit-remaining-requests"] == "9"
    assert headers["x-ratelimit-remaining-tokens"] == str(10_000 - 109)
    assert GO_DURATION.match(headers["x-ratelimit-reset-tokens"])
    assert re.fullmatch(r"59\.\d+s|1m0s", headers["x-ratelimit-reset-requests"])
    counted = stats(server, key)
    assert (counted["requests"], counted["tokens"], counted["completion_tokens"]) == (
        1,
        109,
        completion,
    )


def test_openai_counts_max_tokens_times_n_and_answers_n_choices(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "-")
    reply = ask(gpt(base), "abcd" * 10, 50, n=3)
    assert len(reply.choices) == 3
    assert reply.usage is not None and reply.usage.prompt_tokens == 16
    lengths = reply.usage.completion_tokens
    assert 3 <= lengths <= 150
    assert stats(server, key)["tokens"] == 16 + 50 * 3  # not what the answer used


def test_openai_over_tpm_raises_rate_limit_error_with_headers(server: MockServerProcess) -> None:
    base, key = prefix(server, "rpm=100,tpm=1000,window=30")
    client = gpt(base)
    ask(client, "hello there", 100)
    with pytest.raises(openai.RateLimitError) as raised:
        ask(client, "hi", 950)
    error = raised.value
    assert error.status_code == 429
    headers = error.response.headers
    assert all(name in headers for name in OPENAI_HEADERS), dict(headers)
    assert headers["x-ratelimit-remaining-tokens"] == str(1000 - 109)
    # It fits when the first request leaves the window: in about 30 s, rounded up.
    assert 29 <= int(headers["retry-after"]) <= 30
    body = error.body
    assert isinstance(body, dict)
    assert (body["type"], body["code"], body["param"]) == ("tokens", "rate_limit_exceeded", None)
    assert re.fullmatch(
        r"Rate limit reached for gpt-mock in organization \S+ on tokens per min \(TPM\): "
        r"Limit 1000, Used 109, Requested 957\. Please try again in (29\.\d+|30)s\.",
        body["message"],
    ), body["message"]
    counted = stats(server, key)
    assert (counted["requests"], counted["rejected"], counted["tokens"]) == (1, 1, 109)


def test_openai_over_rpm_is_refused_on_requests(server: MockServerProcess) -> None:
    base, _ = prefix(server, "rpm=2,tpm=100000")
    client = gpt(base)
    ask(client, "a", 5)
    ask(client, "b", 5)
    with pytest.raises(openai.RateLimitError) as raised:
        ask(client, "c", 5)
    body = raised.value.body
    assert isinstance(body, dict) and body["type"] == "requests", body
    assert "on requests per min (RPM): Limit 2, Used 2, Requested 1." in body["message"]
    assert raised.value.response.headers["x-ratelimit-remaining-requests"] == "0"
    assert "retry-after" in raised.value.response.headers


def test_a_request_larger_than_the_limit_is_refused_without_retry_after(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "tpm=500")
    with pytest.raises(openai.RateLimitError) as raised:
        ask(gpt(base), "x", 600)
    assert "retry-after" not in raised.value.response.headers
    body = raised.value.body
    assert isinstance(body, dict) and body["message"].startswith("Request too large")
    assert stats(server, key)["too_large"] == 1


def test_openai_embeddings_with_usage(server: MockServerProcess) -> None:
    base, key = prefix(server, "-")
    reply = gpt(base).embeddings.create(model="text-embedding-mock", input=["abcdefgh", "x"])
    assert [item.index for item in reply.data] == [0, 1]
    assert len(reply.data[0].embedding) == 8
    assert (reply.usage.prompt_tokens, reply.usage.total_tokens) == (3, 3)
    assert stats(server, key)["tokens"] == 3


def test_anthropic_message_with_usage_and_headers(server: MockServerProcess) -> None:
    base, key = prefix(server, "rpm=50,tpm=40000,itpm=30000,otpm=8000")
    before = time.time()
    raw = claude(base).messages.with_raw_response.create(
        model="claude-mock",
        max_tokens=200,
        system="Be brief.",
        messages=[{"role": "user", "content": "hello there"}],
    )
    message = raw.parse()
    assert (message.type, message.role, message.model) == ("message", "assistant", "claude-mock")
    assert message.content[0].type == "text" and message.content[0].text
    # 2 + ceil(9 / 4) for the system prompt, 4 + ceil(11 / 4) for the message
    assert message.usage.input_tokens == 2 + 3 + 4 + 3
    output = message.usage.output_tokens
    assert 1 <= output <= 200
    assert message.stop_reason == ("max_tokens" if output == 200 else "end_turn")
    headers = raw.headers
    assert all(name in headers for name in ANTHROPIC_HEADERS), dict(headers)
    assert [
        headers[f"anthropic-ratelimit-{name}-limit"]
        for name in ("requests", "tokens", "input-tokens", "output-tokens")
    ] == [
        "50",
        "40000",
        "30000",
        "8000",
    ]
    assert headers["anthropic-ratelimit-requests-remaining"] == "49"
    # Token counts remaining are rounded to the nearest thousand, as Anthropic's are.
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == str(
        nearest_thousand(8000 - output)
    )
    reset = datetime.fromisoformat(headers["anthropic-ratelimit-tokens-reset"])
    assert reset.tzinfo is not None and reset.utcoffset() == UTC.utcoffset(None)
    assert before + 59 <= reset.timestamp() <= time.time() + 61
    # Anthropic counts the input at admission and the output when the answer is made.
    counted = stats(server, key)
    assert counted["tokens"] == 12 + output
    assert [kind for _, kind, _ in counted["log"]] == ["admitted", "output"]


def test_anthropic_over_a_limit_raises_rate_limit_error_with_headers(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "rpm=50,tpm=100000,otpm=50")
    client = claude(base)
    answered = 0
    with pytest.raises(anthropic.RateLimitError) as raised:
        for number in range(20):
            reply = client.messages.create(
                model="claude-mock",
                max_tokens=40,
                messages=[{"role": "user", "content": f"question {number}"}],
            )
            answered += reply.usage.output_tokens
    # Admitted while output budget was left; refused once the answers had used it all.
    assert answered >= 50
    error = raised.value
    assert error.status_code == 429
    headers = error.response.headers
    assert all(name in headers for name in ANTHROPIC_HEADERS), dict(headers)
    assert headers["anthropic-ratelimit-output-tokens-remaining"] == "0"
    assert 1 <= int(headers["retry-after"]) <= 60
    body = error.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "rate_limit_error"
    assert "output tokens" in body["error"]["message"]
    assert stats(server, key)["completion_tokens"] == answered


def test_completion_lengths_are_random_and_reproducible(server: MockServerProcess) -> None:
    base, _ = prefix(server, "-")
    client = gpt(base)
    lengths = []
    for number in range(12):
        reply = ask(client, f"question {number}", 64)
        assert reply.usage is not None
        lengths.append(reply.usage.completion_tokens)
    assert len(set(lengths)) > 3 and all(1 <= n <= 64 for n in lengths)
    again = ask(client, "question 5", 64)
    assert again.usage is not None and again.usage.completion_tokens == lengths[5]


def test_a_key_keeps_its_limits(server: MockServerProcess) -> None:
    base, key = prefix(server, "rpm=5")
    ask(gpt(base), "a", 1)
    with pytest.raises(openai.BadRequestError, match="already has the limits"):
        ask(gpt(f"{server.url}/llm/{key}/rpm=6"), "a", 1)
    with pytest.raises(openai.BadRequestError, match="not a limit"):
        ask(gpt(f"{server.url}/llm/{key}-2/rpx=6"), "a", 1)
    with pytest.raises(urllib.error.HTTPError) as missing:
        server.get(f"/llm/{key}-3/stats")
    assert missing.value.code == 404


def test_the_window_slides(server: MockServerProcess) -> None:
    """Two requests of 487 tokens fit under 1000 a 4-s window. Each leaves the window 4 s
    after it was admitted, not when a fixed window turns over: at 5 s the first has left and
    the second has not, so one more fits and a second one does not."""
    base, key = prefix(server, "rpm=100,tpm=1000,window=4")
    client = gpt(base)
    started = time.monotonic()

    def at(moment: float) -> None:
        time.sleep(max(0.0, started + moment - time.monotonic()))

    ask(client, "a", 480)  # admitted at 0, leaves at 4
    at(2.0)
    ask(client, "b", 480)  # admitted at 2, leaves at 6
    with pytest.raises(openai.RateLimitError) as refused:
        ask(client, "c", 480)
    assert 1 <= int(refused.value.response.headers["retry-after"]) <= 3  # (when "a" leaves)
    at(5.0)
    reply = ask(client, "d", 480)  # "a" has left
    assert reply.usage is not None
    with pytest.raises(openai.RateLimitError):
        ask(client, "e", 480)  # "b" has not
    counted = stats(server, key)
    log = counted["log"]
    assert [kind for _, kind, _ in log] == [
        "admitted",
        "admitted",
        "rejected",
        "admitted",
        "rejected",
    ]
    assert 4 < log[3][0] < 6, log  # (the server's clock: after "a" left, before "b" did)
    assert counted["peak_tokens"] <= 1000
    assert [(w["requests"], w["rejected"]) for w in counted["windows"]] == [(2, 1), (1, 1)]


def test_the_cookbook_peer_runs_its_batch_against_the_mock(
    server: MockServerProcess, tmp_path: Path
) -> None:
    """scripts/llm_peer.py (the benchmark's peer) answers every row, in its output with its
    metadata, and counts as rate-limit errors exactly the 429s the mock sent: its buckets
    start a minute's worth full, so the sliding window refuses it in its first minute."""
    base, key = prefix(server, "rpm=600,tpm=3000,window=2")
    rows = tmp_path / "rows.jsonl"
    with rows.open("w", encoding="utf-8") as out:
        for number in range(40):
            message = {"role": "user", "content": "x" * (40 + 10 * number)}
            body = {
                "model": "gpt-mock",
                "max_tokens": 60,
                "messages": [message],
                "metadata": {"row_id": number},
            }
            out.write(json.dumps(body) + "\n")
    output = tmp_path / "results.jsonl"
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "llm_peer.py"),
            str(rows),
            "--url",
            f"{base}/v1/chat/completions",
            "--rpm",
            "600",
            "--tpm",
            "3000",
            "--window",
            "2",
            "-o",
            str(output),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    summary = json.loads(done.stdout.splitlines()[-1])
    answers = [json.loads(line) for line in output.read_text().splitlines()]
    assert sorted(row[2]["row_id"] for row in answers) == list(range(40))
    assert all(
        row[1]["object"] == "chat.completion" and "metadata" not in row[0] for row in answers
    )
    counted = stats(server, key)
    assert (summary["num_tasks_succeeded"], counted["requests"]) == (40, 40)
    assert summary["num_rate_limit_errors"] == counted["rejected"] > 0


# The token bucket (refill=bucket) and the 429s without retry-after (retry_after=0), driven by
# plain requests.


def seconds(duration: str) -> float:
    """A Go duration of OpenAI's reset headers (``1.5s``, ``20ms``, ``1m2s``) in seconds."""
    match = GO_DURATION.match(duration)
    assert match, duration
    hours, minutes, rest = match.group(1), match.group(2), match.group(3)
    total = int(hours[:-1]) * 3600 if hours else 0.0
    total += int(minutes[:-1]) * 60 if minutes else 0
    return total + (float(rest[:-2]) / 1000 if rest.endswith("ms") else float(rest[:-1]))


def chat(base: str, text: str = "hi", max_tokens: int = 10) -> requests.Response:
    body: dict[str, Any] = {"model": "gpt-mock", "max_tokens": max_tokens,
                            "messages": [{"role": "user", "content": text}]}  # fmt: skip
    return requests.post(f"{base}/v1/chat/completions", json=body, timeout=10)


def test_refill_and_retry_after_are_read_from_the_path() -> None:
    assert parse_limits("-").refill == "window"
    assert parse_limits("-").retry_after is True
    limits = parse_limits("rpm=5,refill=bucket,retry_after=0")
    assert (limits.rpm, limits.refill, limits.retry_after) == (5, "bucket", False)
    assert parse_limits("refill=window,retry_after=1") == parse_limits("-")
    for bad in ("refill=leaky", "refill", "retry_after=2"):
        with pytest.raises(ValueError):
            parse_limits(bad)


def test_a_bucket_starts_full_and_refills_evenly() -> None:
    bucket = Bucket(10.0, 100)  # 10 a second
    assert bucket.wait_for(0.0, 100, 100) == 0
    bucket.add(0.0, 100)
    assert bucket.used(0.0) == 100
    assert bucket.wait_for(0.0, 20, 100) == 2.0
    assert bucket.reset_in(0.0) == 10.0
    assert bucket.used(2.5) == 75  # 25 back after 2.5 s
    assert bucket.wait_for(2.5, 101, 100) == math.inf
    assert bucket.reset_in(2.5) == 7.5
    assert bucket.used(30.0) == 0  # never more than full
    assert bucket.reset_in(30.0) == 0


def test_a_bucket_admits_its_full_count_at_once_then_refills(server: MockServerProcess) -> None:
    """5 requests a 2-s window as a bucket: all 5 at once, then one each 0.4 s (a sliding
    window would admit none until 2 s after the first)."""
    base, key = prefix(server, "rpm=5,tpm=1000000,window=2,refill=bucket")
    remaining = []
    for _ in range(5):
        reply = chat(base)
        assert reply.status_code == 200, reply.text
        remaining.append(int(reply.headers["x-ratelimit-remaining-requests"]))
    assert remaining == [4, 3, 2, 1, 0]
    refused = chat(base)
    assert refused.status_code == 429
    assert refused.json()["error"]["code"] == "rate_limit_exceeded"
    assert refused.headers["retry-after"] == "1"  # (one request back in 0.4 s, rounded up)
    assert 0 < seconds(refused.headers["x-ratelimit-reset-requests"]) <= 2.0
    time.sleep(0.5)  # 1.25 requests back
    assert chat(base).status_code == 200
    assert chat(base).status_code == 429
    counted = stats(server, key)
    assert (counted["requests"], counted["rejected"]) == (6, 2)
    assert counted["peak_requests"] == 6  # more than rpm in a window: the bucket's way
    assert [kind for _, kind, _ in counted["log"]] == ["admitted"] * 5 + [
        "rejected",
        "admitted",
        "rejected",
    ]


def test_a_sliding_window_holds_no_more_than_its_limit(server: MockServerProcess) -> None:
    base, key = prefix(server, "rpm=5,tpm=1000000,window=2")
    assert [chat(base).status_code for _ in range(6)] == [200] * 5 + [429]
    time.sleep(0.5)
    assert chat(base).status_code == 429  # (a bucket would have given one back)
    counted = stats(server, key)
    assert (counted["requests"], counted["rejected"], counted["peak_requests"]) == (5, 2, 5)


def test_a_bucket_says_remaining_and_when_it_is_full_again(server: MockServerProcess) -> None:
    """1000 tokens a 4-s window as a bucket, 250 back a second: after 600 tokens, 400 are
    left and it is full again in 600 / 250 = 2.4 s (a sliding window would say 4 s)."""
    base, key = prefix(server, "rpm=1000,tpm=1000,window=4,refill=bucket")
    text = "x" * (4 * (600 - 6 - 10))  # 600 tokens with max_tokens 10
    reply = chat(base, text, 10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-ratelimit-remaining-tokens"] == "400"  # floored: never 401
    assert 2.3 <= seconds(reply.headers["x-ratelimit-reset-tokens"]) <= 2.4
    assert 0 < seconds(reply.headers["x-ratelimit-reset-requests"]) <= 0.004  # 1 of 1000
    time.sleep(0.4)  # 100 back
    second = chat(base, text, 10)
    assert second.status_code == 429
    assert 0.8 <= seconds(second.headers["x-ratelimit-reset-tokens"]) * 250 / 600 <= 1
    assert 490 <= int(second.headers["x-ratelimit-remaining-tokens"]) <= 520
    assert second.headers["retry-after"] == "1"
    counted = stats(server, key)
    assert (counted["tokens"], counted["rejected"], counted["peak_tokens"]) == (600, 1, 600)


def test_retry_after_0_leaves_it_off_a_429_but_keeps_the_rate_limit_headers(
    server: MockServerProcess,
) -> None:
    for refill in ("window", "bucket"):
        base, _ = prefix(server, f"rpm=1,tpm=100000,window=5,retry_after=0,refill={refill}")
        assert chat(base).status_code == 200
        refused = chat(base)
        assert refused.status_code == 429, refill
        assert "retry-after" not in refused.headers, refill
        assert all(name in refused.headers for name in OPENAI_HEADERS), refill
        assert refused.headers["x-ratelimit-remaining-requests"] == "0"
        assert 4 <= seconds(refused.headers["x-ratelimit-reset-requests"]) <= 5, refill
    base, _ = prefix(server, "rpm=1,tpm=100000,window=5")
    chat(base)
    assert chat(base).headers["retry-after"] == "5"  # (the default: retry-after sent)


def test_anthropic_in_a_bucket_is_counted_at_admission_as_openai_is(
    server: MockServerProcess,
) -> None:
    base, key = prefix(server, "rpm=100,tpm=1000,window=10,refill=bucket")
    body: dict[str, Any] = {
        "model": "claude-mock",
        "max_tokens": 100,
        "messages": [{"role": "user", "content": "x" * 376}],
    }  # 100 + 100 tokens
    headers = {"x-api-key": "sk-ant-test", "anthropic-version": "2023-06-01"}  # fmt: skip
    reply = requests.post(f"{base}/v1/messages", json=body, headers=headers, timeout=10)
    assert reply.status_code == 200, reply.text
    assert reply.headers["anthropic-ratelimit-tokens-remaining"] == "1000"  # 800: nearest 1000
    assert reply.headers["anthropic-ratelimit-output-tokens-remaining"] == "1000"  # 900
    counted = stats(server, key)
    assert [(kind, tokens) for _, kind, tokens in counted["log"]] == [("admitted", 200)]
    assert counted["tokens"] == counted["peak_tokens"] == 200
