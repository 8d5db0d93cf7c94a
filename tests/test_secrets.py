"""Canary secrets in every place a secret can be given, every error path run, every byte written
searched: no canary leaves the process except in the two owner-only files that keep items as
the input gave them (the failed file, and the journal's copy of its lines)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from batchsync import Batch, fetch_all
from batchsync.cli.inputs import MAX_LINE_BYTES
from batchsync.redact import MASK

from .mockserver import MockServerProcess
from .rawserver import RawServer
from .services import redis_server

pytestmark = pytest.mark.integration

# Where the run is told about them (never written anywhere) ...
RUN_TAGS = ("cli_auth", "cli_key", "redis")
# ... and where an item holds them (kept only in the failed file and the journal's copy of it).
ITEM_TAGS = (
    "qkey", "qtoken", "qcustom", "item_auth", "item_cookie", "declared", "fb_pass", "param",
    "user", "pass", "qkey2", "badport", "unsplit", "crlf", "nul", "unread", "non_utf8", "long",
    "badshape", "typo", "trickle", "body", "connect", "trace", "nan", "fastsig", "deep",
    "pctname", "frag", "at1", "at2", "quote", "pathseg", "nested", "basic", "echoed", "words",
    "echostatus", "echolocation",
)  # fmt: skip


def canaries() -> dict[str, str]:
    """A distinct canary per place, letters and digits only (so it reads the same escaped)."""
    return {
        tag: f"cnry{tag.replace('_', '')}{uuid.uuid4().hex[:12]}" for tag in (*RUN_TAGS, *ITEM_TAGS)
    }


def leaks(text: str, canary: str) -> bool:
    """Whether ``text`` holds ``canary`` whole, percent-encoded, or its random part in part."""
    core = canary[-12:]
    return any(piece in text for piece in (canary, quote(canary), core, core[:8], core[-8:]))


def leaked(text: str, secrets: dict[str, str], tags: Iterable[str]) -> list[str]:
    return [tag for tag in tags if leaks(text, secrets[tag])]


def hostile_input(server: MockServerProcess, raw: str, c: dict[str, str]) -> list[bytes]:
    """One line per error path known to have leaked, each carrying its canaries (``raw``: a
    raw server's URL, whose /echo-auth quotes the Authorization header in a bad status line)."""
    port = server.url.rsplit(":", 1)[1]
    k = uuid.uuid4().hex[:8]
    echo = f"{server.url}/echo"

    def line(value: object) -> bytes:
        return json.dumps(value).encode()

    def bearer(tag: str, after: str = "") -> dict[str, str]:
        return {"Authorization": f"Bearer {c[tag]}{after}"}

    first = {  # 503 retried, then a fallback with a password that fails too; secret params
        "url": f"{server.url}/503/{k}?api_key={c['qkey']}&access_token={c['qtoken']}"
        f"&my_sig={c['qcustom']}",
        "headers": {**bearer("item_auth"), "Cookie": f"sid={c['item_cookie']}",
                    "X-Session": c["declared"]},
        "params": {"token": c["param"]},
        "fallbacks": [f"http://fb:{c['fb_pass']}@127.0.0.1:{port}/503/{k}-fb"],
    }  # fmt: skip
    return [
        line(first),
        f"http://{c['user']}:{c['pass']}@127.0.0.1:1/x?key={c['qkey2']}".encode(),  # refused
        f"http://u:{c['badport']}@127.0.0.1:99999/".encode(),  # a port out of range
        f"http://u:{c['unsplit']}@[::1/".encode(),  # cannot be split at all
        line({"url": echo, "headers": bearer("crlf", "\r\nInjected: yes")}),
        line({"url": echo, "headers": {"X-Session": f"{c['nul']}\u0000x"}}),
        (json.dumps({"url": echo, "headers": bearer("unread")})[:-1] + ",}").encode(),
        f"{echo}?api_key={c['non_utf8']}".encode() + b"\xff\xfe",
        line({"url": echo, "headers": bearer("long"), "pad": "x" * MAX_LINE_BYTES}),
        line({"url": echo, "headers": [list(bearer("badshape").popitem())]}),
        line({"url": echo, "header": bearer("typo")}),  # a key misspelt
        f"{server.url}/trickle-headers?interval=0.2&lines=60&api_key={c['trickle']}".encode(),
        f"{server.url}/broken-json?token={c['body']}".encode(),
        line({"url": echo, "method": "CONNECT", "headers": bearer("connect")}),
        line({"url": echo, "method": "TRACE", "headers": bearer("trace")}),
        line({"url": echo, "id": float("nan"), "headers": bearer("nan")}),
        f"{server.url}/404/{k}?sig={c['fastsig']}".encode(),  # the fast lane's path
        f"{server.url}/deep?depth=100000&secret={c['deep']}".encode(),
        f"{server.url}/404/{k}?api%5Fkey={c['pctname']}".encode(),  # requests sends api_key
        f"{server.url}/404/{k}?x=1#access_token={c['frag']}".encode(),
        f"http://user:{c['at1']}@{c['at2']}@127.0.0.1:{port}/404/{k}".encode(),
        line({"url": f"http://user:a'\"{c['quote']}@127.0.0.1:{port}/404/{k}"}),
        line({"url": f"{server.url}/404/{c['pathseg']}", "headers": bearer("pathseg")}),
        f"{server.url}/redirect?to=/404/{k}%3Fapi_key%3D{c['nested']}".encode(),
        f"http://u:{c['basic']}@{raw[len('http://') :]}/echo-auth".encode(),  # Basic, base64
        line({"url": f"{raw}/echo-auth", "headers": bearer("echoed")}),
        # a short user name that is also a path segment and a start of a word: not a secret there
        f"http://user:{c['words']}@127.0.0.1:{port}/404/{k}/user/useronly?q=username".encode(),
        # the fast lane's plain URLs, their key echoed by the server: its status line, Location
        f"{server.url}/echo-values?style=status&api_key={c['echostatus']}".encode(),
        f"{server.url}/echo-values?style=location&api_key={c['echolocation']}".encode(),
    ]


def batchsync_cli(*args: str, cwd: Path) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def journal_dump(path: Path) -> tuple[str, list[str]]:
    """The journal's whole dump without its ``request`` column, and that column's values."""
    with sqlite3.connect(path) as db:
        requests = [
            row[0] for row in db.execute("SELECT request FROM results ORDER BY idx") if row[0]
        ]
        db.execute("UPDATE results SET request = NULL")
        return "\n".join(db.iterdump()), requests


@pytest.fixture(scope="module")
def redis_with_password() -> Iterator[tuple[str, str]]:
    password = f"cnryredis{uuid.uuid4().hex[:12]}"
    with redis_server(password) as url:
        yield url, password


def test_no_canary_leaves_the_cli_on_any_error_path(
    server: MockServerProcess, tmp_path: Path, redis_with_password: tuple[str, str]
) -> None:
    c = canaries()
    redis_url, c["redis"] = redis_with_password
    with RawServer() as raw:
        lines = hostile_input(server, raw.url, c)
        (tmp_path / "urls.txt").write_bytes(b"\n".join(lines) + b"\n")
        stdout, stderr, code = run_hostile(tmp_path, c, redis_url)
    assert code == 1, stderr
    check_hostile_run(tmp_path, c, lines, stdout, stderr)


def run_hostile(tmp_path: Path, c: dict[str, str], redis_url: str) -> tuple[str, str, int]:
    process = batchsync_cli(
        "urls.txt", "-v", "--attempts", "2", "--timeout", "2", "--budget", "20",
        "-vH", f"Authorization: Bearer {c['cli_auth']}", f"--header=X-Api-Key: {c['cli_key']}",
        "--secret-header", "X-Session", "--secret-param", "MY_SIG", "--redis", redis_url,
        "--no-progress", "-o", "run", cwd=tmp_path,
    )  # fmt: skip
    stdout, stderr = process.communicate(timeout=240)
    return stdout, stderr, process.returncode


def check_hostile_run(
    tmp_path: Path, c: dict[str, str], lines: list[bytes], stdout: str, stderr: str
) -> None:
    assert "Traceback" not in stderr
    results = [
        json.loads(line) for line in (tmp_path / "run-results.jsonl").read_text().splitlines()
    ]
    assert len(results) == len(lines)
    assert all(not r["ok"] for r in results)
    kinds = [r["error_kind"] for r in results]
    assert kinds == [
        "status", "connection", "invalid_request", "invalid_request", "invalid_request",
        "invalid_request", "invalid_request", "invalid_request", "invalid_request",
        "invalid_request", "invalid_request", "timeout", "invalid_body", "invalid_request",
        "invalid_request", "invalid_request", "status", "invalid_body",
        "status", "status", "status", "status", "status", "status", "connection", "connection",
        "status", "connection", "status",
    ]  # fmt: skip
    assert [r["attempts"] for r in results][2:11] == [0] * 9
    # Every error path ran; now every byte written: stdout, stderr, every file in the folder.
    shown = stdout + stderr
    for path in sorted(tmp_path.iterdir()):
        if path.name in ("urls.txt", "run-failed.jsonl", "run-journal.sqlite3"):
            continue
        shown += path.read_bytes().decode("utf-8", "replace")
    journal, kept = journal_dump(tmp_path / "run-journal.sqlite3")
    shown += journal
    assert leaked(shown, c, c) == []
    assert_only_secrets_masked(results, lines, c)
    # The failed file re-runs the items as given (the run's own secrets are never in it) ...
    failed_path = tmp_path / "run-failed.jsonl"
    failed = failed_path.read_text().splitlines()
    assert failed == kept
    assert leaked(failed_path.read_text(), c, RUN_TAGS) == []
    assert json.loads(failed[0]) == json.loads(lines[0])
    unreadable = {"invalid": results[6]["error"], "given": lines[6].decode()}
    assert json.loads(failed[6]) == unreadable  # kept as given, to be mended
    assert json.loads(failed[7]) == {"invalid": "line 8: not UTF-8 text", "given": None}
    # ... so it and the journal (with its -wal and -shm, if any) are the owner's only.
    for path in tmp_path.glob("run-*"):
        if (
            path.name.endswith((".jsonl", ".sqlite3", "-wal", "-shm", ".lock"))
            and "results" not in path.name
        ):
            assert path.stat().st_mode & 0o077 == 0, path
    # Errors name the line and the header, never the text.
    assert results[4]["error"] == (
        "line 5: headers: header Authorization: its value has a line break, a NUL or leading "
        "whitespace"
    )
    assert results[6]["error"].startswith("line 7: not valid JSON: ")
    assert results[6]["url"] is None


def masked_as_expected(url: str, c: dict[str, str]) -> str:
    """``url`` with its userinfo and every canary masked, and every other byte as it was."""
    shown = re.sub(r"//[^/?#\s]*@", f"//{MASK}@", url, count=1)
    for canary in c.values():
        shown = shown.replace(canary, MASK)
    return shown


def assert_only_secrets_masked(
    results: list[dict[str, Any]], lines: list[bytes], c: dict[str, str]
) -> None:
    """Each result's ``url`` (and ``final_url`` when it is that URL again) keeps every byte
    of the item's URL but its secrets: masking a short value never corrupts a path or word."""
    for result, given in zip(results, lines, strict=True):
        if result["url"] is None:
            continue
        item = json.loads(given) if given.startswith(b"{") else {"url": given.decode()}
        assert result["url"] == masked_as_expected(item["url"], c)
        if result["final_url"] is not None and not result["redirects"] and "fallbacks" not in item:
            # (requests sends a parameter's name percent-decoded: api%5Fkey is api_key)
            assert result["final_url"] == result["url"].replace("%5F", "_")


def test_the_interrupt_line_masks_what_the_command_line_holds(
    server: MockServerProcess, tmp_path: Path, redis_with_password: tuple[str, str]
) -> None:
    c = canaries()
    redis_url, c["redis"] = redis_with_password
    k = uuid.uuid4().hex[:8]
    urls = [f"{server.url}/ok/{k}-{n}?delay=0.3&api_key={c['qkey']}" for n in range(60)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    process = batchsync_cli(
        "urls.txt", "-c", "2", "-qvH", f"Authorization: Bearer {c['cli_auth']}",
        "--redis", redis_url, "-o", "run", cwd=tmp_path,
    )  # fmt: skip
    give_up = time.monotonic() + 30
    while server.stats()["counts"].get(f"/ok/{k}-3?delay=0.3&api_key={c['qkey']}", 0) == 0:
        assert time.monotonic() < give_up
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=30)
    assert process.returncode == 130
    assert "resume with: python -m batchsync urls.txt -c 2 -q -v -H 'Authorization: ***' " in stderr
    assert leaked(stderr, c, c) == []


def test_no_canary_leaves_the_library(
    server: MockServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from prometheus_client import CollectorRegistry, generate_latest

    c = canaries()
    port = server.url.rsplit(":", 1)[1]
    k = uuid.uuid4().hex[:8]
    items: list[Any] = [
        f"http://{c['user']}:{c['pass']}@127.0.0.1:{port}/503/{k}?api_key={c['qkey']}",
        f"{server.url}/404/{k}?my_sig={c['qcustom']}&token={c['qtoken']}",
        {"url": f"{server.url}/503/{k}-2", "headers": {"Authorization": f"Bearer {c['item_auth']}"},
         "params": {"access_token": c["param"]},
         "fallbacks": [f"http://fb:{c['fb_pass']}@127.0.0.1:1/"]},
        {"url": f"http://u:{c['badport']}@127.0.0.1:99999/"},
        {"url": f"{server.url}/echo", "headers": {"X-Session": f"{c['crlf']}\r\nInjected: yes"}},
        {"url": f"{server.url}/echo", "method": "TRACE", "headers": {"Cookie": f"a={c['trace']}"}},
    ]  # fmt: skip
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    registry = CollectorRegistry()
    options: dict[str, Any] = {
        "attempts": 2, "timeout": 5, "headers": {"X-Api-Key": c["cli_key"]},
        "secret_headers": ("X-Session",), "secret_params": ("my_sig",), "metrics": registry,
        "tracer": provider.get_tracer("test"), "progress": False,
    }  # fmt: skip
    with caplog.at_level(logging.DEBUG):
        rs = fetch_all(items, **options)
        batch = Batch(items, journal=tmp_path / "lib.sqlite3", **{**options, "metrics": None})
        batch.run()
    assert [r.ok for r in rs] == [False] * len(items)
    shown = "\n".join([
        repr(rs), *map(repr, rs), *(str(r.to_dict()) for r in rs), rs._repr_html_(),
        str(rs.summary()), rs.to_pandas().to_csv(), caplog.text, generate_latest(registry).decode(),
        *(json.dumps(dict(span.attributes or {})) for span in exporter.get_finished_spans()),
        *map(repr, batch.results), journal_dump(tmp_path / "lib.sqlite3")[0],
    ])  # fmt: skip
    assert any(record.name == "urllib3.connectionpool" for record in caplog.records)
    assert leaked(shown, c, c) == []
    assert (tmp_path / "lib.sqlite3").stat().st_mode & 0o077 == 0


@pytest.mark.integration
def test_a_short_key_a_server_copies_into_a_location_is_masked(server: MockServerProcess) -> None:
    url = f"{server.url}/echo-values?style=location&api_key=k3yab"
    rs = fetch_all([url], attempts=1)
    shown = json.dumps(rs[0].to_dict())
    assert "k3yab" not in shown, shown
    assert rs[0].final_url is not None and rs[0].final_url.endswith("/404/***")
