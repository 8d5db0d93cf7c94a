"""``run_all`` driving real clients (the openai SDK, requests, httpx) against the mock server's
OpenAI-compatible endpoint: what the server saw says whether the rate, the Retry-After floor
and the shared cooldown held."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from collections.abc import Callable
from typing import Any

import boto3
import httpx
import openai
import pytest
import requests
from botocore.config import Config

from batchsync import Backoff, run_all

from .mockserver import ROOT, MockServerProcess, busiest_second

RATE = 20.0
CONCURRENCY = 4
NO_JITTER = Backoff(base=0.05, max=0.2, jitter=0.0)


def plan(count: int) -> list[dict[str, Any]]:
    """Items: every 6th gets a 429 with Retry-After: 1 on its first call, the next a 500."""
    key = uuid.uuid4().hex[:8]
    faults = {1: "429-once", 2: "500-once"}
    return [
        {"n": n, "content": f"{faults.get(n % 6, 'ok')}:{key}-{n}", "key": key}
        for n in range(count)
    ]


def asked(server: MockServerProcess, key: str) -> list[dict[str, Any]]:
    """The chat completions the server answered for this test's items, by arrival."""
    return [e for e in server.log("/v1/chat/completions") if f"key={key}" in e["target"]]


def openai_call(server: MockServerProcess) -> Callable[[dict[str, Any]], str]:
    # max_retries=0: the retrying is batchsync's, not the SDK's.
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="sk-test", max_retries=0)

    def complete(item: dict[str, Any]) -> str:
        reply = client.chat.completions.create(
            model="mock",
            messages=[{"role": "user", "content": item["content"]}],
            extra_query={"n": item["n"], "key": item["key"]},
        )
        return str(reply.choices[0].message.content)

    return complete


def requests_call(server: MockServerProcess) -> Callable[[dict[str, Any]], str]:
    session = requests.Session()

    def complete(item: dict[str, Any]) -> str:
        response = session.post(
            f"{server.url}/v1/chat/completions",
            params={"n": item["n"], "key": item["key"]},
            json={"model": "mock", "messages": [{"role": "user", "content": item["content"]}]},
            timeout=10,
        )
        response.raise_for_status()  # requests.HTTPError, the response on it
        return str(response.json()["choices"][0]["message"]["content"])

    return complete


def httpx_call(server: MockServerProcess) -> Callable[[dict[str, Any]], str]:
    client = httpx.Client(timeout=10)

    def complete(item: dict[str, Any]) -> str:
        response = client.post(
            f"{server.url}/v1/chat/completions",
            params={"n": item["n"], "key": item["key"]},
            json={"model": "mock", "messages": [{"role": "user", "content": item["content"]}]},
        )
        response.raise_for_status()  # httpx.HTTPStatusError, the response on it
        return str(response.json()["choices"][0]["message"]["content"])

    return complete


@pytest.mark.integration
@pytest.mark.parametrize("client", [openai_call, requests_call, httpx_call])
def test_run_all_keeps_the_rate_the_retry_after_floor_and_the_cooldown(
    server: MockServerProcess, client: Callable[[MockServerProcess], Callable[[Any], str]]
) -> None:
    items = plan(36)
    rs = run_all(
        client(server), items, concurrency=CONCURRENCY, rate=RATE, attempts=3, backoff=NO_JITTER
    )
    assert [r.index for r in rs] == list(range(36))
    assert [r.data for r in rs] == [f"echo: {item['content']}" for item in items]
    by_item: dict[int, list[dict[str, Any]]] = {}
    log = asked(server, items[0]["key"])
    for entry in log:
        number = int(entry["target"].split("n=")[1].split("&")[0])
        by_item.setdefault(number, []).append(entry)
    faulty = {n for n in range(36) if n % 6 in (1, 2)}
    assert {n: len(entries) for n, entries in by_item.items()} == {
        n: 2 if n in faulty else 1 for n in range(36)
    }
    assert {r.index for r in rs if r.attempts == 2} == faulty
    # The rate: at most RATE a second, plus the bucket's burst of CONCURRENCY.
    assert busiest_second([entry["t"] for entry in log]) <= RATE + CONCURRENCY
    for n in faulty:
        first, second = by_item[n]
        if first["status"] == 429:
            # The Retry-After floor: the item's own retry came no sooner than 1 s after.
            assert second["t"] - first["end"] >= 0.95, n
            # The cooldown: no call of any item started during that second.
            held = [e for e in log if first["end"] + 0.1 < e["t"] < first["end"] + 0.9]
            assert held == [], n
        else:  # (its retry waits its backoff, and any cooldown another item's 429 began)
            assert first["status"] == 500


@pytest.mark.integration
def test_a_status_error_the_budget_cannot_wait_for_ends_as_budget(
    server: MockServerProcess,
) -> None:
    """A Retry-After beyond what the item's budget has left: given up at once, as ``budget``."""
    items = plan(2)[1:]  # the 429-once item
    rs = run_all(openai_call(server), items, budget=0.5, backoff=NO_JITTER)
    (result,) = rs
    assert (result.ok, result.error_kind, result.status_code, result.attempts) == (
        False,
        "budget",
        429,
        1,
    )
    assert len(asked(server, items[0]["key"])) == 1


@pytest.mark.integration
def test_run_all_with_boto3_waits_out_a_slowdown_and_keeps_a_404_final(
    server: MockServerProcess,
) -> None:
    key = uuid.uuid4().hex[:8]
    keys = [f"slowdown-once-{key}-a", f"ok-{key}-b", f"missing-{key}-c"]
    s3 = boto3.client(
        "s3", endpoint_url=server.url, region_name="us-east-1", aws_access_key_id="mock",
        aws_secret_access_key="mock",
        config=Config(retries={"total_max_attempts": 1}, s3={"addressing_style": "path"}),
    )  # fmt: skip
    rs = run_all(
        lambda k: s3.get_object(Bucket="s3-mock", Key=k)["Body"].read().decode(),
        keys, backoff=NO_JITTER,
    )  # fmt: skip
    assert [(r.ok, r.data, r.status_code, r.attempts) for r in rs] == [
        (True, f"object {keys[0]}", None, 2),
        (True, f"object {keys[1]}", None, 1),
        (False, None, 404, 1),
    ]
    first, second = server.log(keys[0])
    assert first["status"] == 503 and second["t"] - first["end"] >= 0.95  # its Retry-After
    assert len(server.log(keys[2])) == 1


@pytest.mark.integration
@pytest.mark.parametrize(
    ("script", "settings", "first_line"),
    [
        # (the 429s held every worker: the summary shows time waited for the cooldown)
        ("sdk_openai.py", ("OPENAI_",), r"20 items: 20 ok, 0 failed; .*cooldown"),
        ("sdk_boto3.py", ("S3_ENDPOINT_URL", "BUCKET"), r"13 items: 12 ok, 1 failed \(status 1\)"),
    ],
)
def test_the_examples_run_against_the_bundled_mock_api(
    script: str, settings: tuple[str, ...], first_line: str
) -> None:
    env = {key: value for key, value in os.environ.items() if not key.startswith(settings)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert re.match(first_line, done.stdout), done.stdout
