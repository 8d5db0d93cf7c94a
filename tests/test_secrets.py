"""Canary secrets in every place a secret can be given, every error path run, every byte written
searched: no canary leaves the process except in the two owner-only files that keep items as
the input gave them (the failed file, and the journal's copy of its lines)."""

from __future__ import annotations

import base64
import csv
import io
import json
import logging
import os
import re
import shlex
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
import requests.auth
from requests.utils import get_auth_from_url

from batchsync import Batch, fetch_all
from batchsync.cli.inputs import MAX_LINE_BYTES
from batchsync.core.redact import MASK

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


def canaries(tags: Iterable[str] = (*RUN_TAGS, *ITEM_TAGS)) -> dict[str, str]:
    """A distinct canary per place, letters and digits only (so it reads the same escaped)."""
    return {tag: f"cnry{tag.replace('_', '')}{uuid.uuid4().hex[:12]}" for tag in tags}


def leaks(text: str, canary: str) -> bool:
    """Whether ``text`` holds ``canary`` whole, percent-encoded, or its random part in part."""
    core = canary[-12:]
    return any(piece in text for piece in (canary, quote(canary), core, core[:8], core[-8:]))


def leaked(text: str, secrets: dict[str, str], tags: Iterable[str]) -> list[str]:
    return [tag for tag in tags if leaks(text, secrets[tag])]


def contexts(text: str, secrets: dict[str, str], tags: Iterable[str]) -> dict[str, str]:
    """Where each leaked canary stands in ``text`` (for a failure's message)."""
    found = {}
    for tag in leaked(text, secrets, tags):
        core = secrets[tag][-12:]
        at = text.find(core[:8]) if core[:8] in text else text.find(core[-8:])
        found[tag] = text[max(at - 160, 0) : at + 60]
    return found


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
    """The journal's whole dump without its copies of the items, and its ``request`` column's
    values. The copies: ``request`` (the item as given, as the failed file has it) and
    ``resume`` (where a paginated item goes on: its next page's URL, the item's own secrets in
    it, to be sent again; see journal_continuations)."""
    with sqlite3.connect(path) as db:
        requests = [
            row[0] for row in db.execute("SELECT request FROM results ORDER BY idx") if row[0]
        ]
        db.execute("UPDATE results SET request = NULL, resume = NULL")
        return "\n".join(db.iterdump()), requests


def journal_continuations(path: Path) -> dict[int, str]:
    """The journal's ``resume`` column: an item's index, where it goes on."""
    with sqlite3.connect(path) as db:
        rows = db.execute("SELECT idx, resume FROM results WHERE resume IS NOT NULL")
        return {int(idx): str(resume) for idx, resume in rows}


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


# --- the new paths: pagination hops, templates, the auth command, the report, the columnar
# outputs, and INPUT from a pipe, /dev/stdin or a named FIFO -----------------------------------

# Where a list run's items (PAGED) and a template run's rows (ROWS) hold them, and the run's own.
PAGED_TAGS = (
    "pg_qkey", "pg_user", "pg_pass", "pg_token", "pg_custom", "pg_param", "pg_declared",
    "pg_failpage", "pg_retried", "pg_hopuser", "pg_fastsig",
)  # fmt: skip
ROW_TAGS = ("tp_key1", "tp_key2", "tp_key3", "tp_hopuser")
NEW_RUN_TAGS = ("np_header",)
NEW_TAGS = (*NEW_RUN_TAGS, *PAGED_TAGS, *ROW_TAGS)


def escaped(url: str) -> str:
    """``url`` percent-encoded whole, as a value of another URL's query."""
    return quote(url, safe="")


def paged_items(server: MockServerProcess, c: dict[str, str], realm: str) -> list[str]:
    """A list run's lines under ``--paginate link``: each secret rides on every page's hop
    (the mock server's next page keeps the query), one hop gets a userinfo the server names."""
    port = server.url.rsplit(":", 1)[1]
    k = uuid.uuid4().hex[:8]
    pages = f"{server.url}/pages/link"
    hop_base = escaped(f"http://pg:{c['pg_hopuser']}@127.0.0.1:{port}")
    return [
        f"{pages}/a{k}?total=7&size=3&api_key={c['pg_qkey']}",  # the fast lane, 3 pages
        f"http://{c['pg_user']}:{c['pg_pass']}@127.0.0.1:{port}/pages/link/b{k}"
        f"?total=5&size=2&token={c['pg_token']}",
        f"{pages}/c{k}?total=5&size=2&mysig={c['pg_custom']}",  # --secret-param mysig
        json.dumps(
            {
                "url": f"{pages}/d{k}?total=5&size=2",
                "params": {"access_token": c["pg_param"]},
                "headers": {"X-Session": c["pg_declared"]},
            }
        ),
        f"{pages}/e{k}?total=9&size=2&fail=3&api_key={c['pg_failpage']}",  # page 3 always 503
        f"{pages}/f{k}?total=5&size=2&fail=2&fail_times=1&tag={k}&sig={c['pg_retried']}",
        # the next page on the server ``base`` names: the hop carries a userinfo of its own
        f"{pages}/g{k}?total=5&size=2&base={hop_base}",
        *(f"{server.url}/protected/{realm}/{n}" for n in range(6)),  # tokens used up: refreshed
        f"{server.url}/protected/{realm}other/x",  # refused whatever the token: 401, failed
        f"{server.url}/404/{k}?sig={c['pg_fastsig']}",
    ]


def template_rows(server: MockServerProcess, c: dict[str, str]) -> list[dict[str, str]]:
    """A template run's rows: the key in a secret parameter, a hop's userinfo in ``base``."""
    port = server.url.rsplit(":", 1)[1]
    k = uuid.uuid4().hex[:8]
    here = f"http://127.0.0.1:{port}"  # (an empty value is no value: page 0 never fails)
    return [
        {"id": "1", "name": f"r1{k}", "key": c["tp_key1"], "base": here, "fail": "0"},
        {"id": "2", "name": f"r2{k}", "key": c["tp_key2"],
         "base": f"http://pg:{c['tp_hopuser']}@127.0.0.1:{port}", "fail": "0"},
        {"id": "3", "name": f"r3{k}", "key": c["tp_key3"], "base": here, "fail": "2"},
    ]  # fmt: skip


def table_text(rows: list[dict[str, str]], as_csv: bool) -> str:
    if not as_csv:
        return "".join(json.dumps(row) + "\n" for row in rows)
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=list(rows[0]), lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    return out.getvalue()


def auth_script(server: MockServerProcess, folder: Path, realm: str) -> tuple[str, Path]:
    """An --auth-command that gets a token good for 3 requests, and the file of those issued."""
    script, issued = folder / "get_token.py", folder / "issued.txt"
    script.write_text(
        "import urllib.request\n"
        f"url = {server.url + '/token/' + realm + '?uses=3&format=header'!r}\n"
        "value = urllib.request.urlopen(url).read().decode()\n"
        f"open({str(issued)!r}, 'a').write(value.split()[1] + '\\n')\n"
        "print(value)\n"
    )
    return f"{shlex.quote(sys.executable)} {shlex.quote(str(script))}", issued


def cli_on(kind: str, given: Path, args: Sequence[str], cwd: Path) -> tuple[int, str, str]:
    """The CLI with INPUT ``given`` read as ``kind``: a file, a process substitution
    (``<(cat f)``), ``/dev/stdin`` or a named FIFO; its exit status, stdout and stderr."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PY": sys.executable}
    command = [sys.executable, "-m", "batchsync"]
    feeder: threading.Thread | None = None
    fifo = given.with_name(f"{given.name}.{uuid.uuid4().hex[:6]}.fifo")
    if kind == "file":
        command += [str(given), *args]
    elif kind == "procsub":
        script = f'"$PY" -m batchsync <(cat {shlex.quote(str(given))}) {shlex.join(args)}'
        command = ["bash", "-c", script]
    elif kind == "stdin":
        command += ["/dev/stdin", *args]
    else:
        os.mkfifo(fifo)

        def feed() -> None:
            with fifo.open("wb") as writer:  # (waits for the run to open it)
                writer.write(given.read_bytes())

        feeder = threading.Thread(target=feed, daemon=True)
        feeder.start()
        command += [str(fifo), *args]
    with given.open("rb") as stdin:
        try:
            done = subprocess.run(
                command, cwd=cwd, capture_output=True, text=True, timeout=120, env=env,
                stdin=stdin if kind == "stdin" else subprocess.DEVNULL, check=False,
            )  # fmt: skip
        finally:
            if feeder is not None:  # (a run that never opened the FIFO leaves the feeder)
                os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))
                feeder.join(timeout=5)
    return done.returncode, done.stdout, done.stderr


def read_results(path: Path) -> list[dict[str, Any]]:
    """A results file of any --format, one dict a row, its index an int."""
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in path.read_text().splitlines()]
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as handle:
            return [{**row, "index": int(row["index"])} for row in csv.DictReader(handle)]
    import pyarrow.parquet as pq

    rows: list[dict[str, Any]] = pq.read_table(path).to_pylist()
    return rows


def written_text(path: Path) -> str:
    """What a file written by a run says, decoded as a reader would see it: a Parquet file's
    values and its metadata (its pages may be compressed), any other file's bytes."""
    text = path.read_bytes().decode("utf-8", "replace")
    if path.suffix == ".parquet":
        import pyarrow.parquet as pq

        table = pq.read_table(path)
        text += json.dumps(table.to_pylist(), default=str) + repr(table.schema.metadata)
        text += repr(pq.read_metadata(path).metadata)
    return text


def assert_owner_only(folder: Path, prefix: str) -> None:
    """The failed file and the journal (with its -wal, -shm and .lock) are 0600."""
    kept = [
        path for path in folder.glob(f"{prefix}-*")
        if path.name.endswith(("-failed.jsonl", ".sqlite3", "-wal", "-shm", ".lock"))
    ]  # fmt: skip
    assert {p.name for p in kept} >= {f"{prefix}-failed.jsonl", f"{prefix}-journal.sqlite3"}
    for path in kept:
        try:
            mode = path.stat().st_mode
        except FileNotFoundError:  # (a -wal or -shm the journal's last reader removed on closing)
            if path.name.endswith(("-wal", "-shm")):
                continue
            raise
        assert mode & 0o077 == 0, path


# Each output format once, each input kind at least once.
NEW_PATH_RUNS = [
    ("file", "jsonl", False, True),
    ("procsub", "csv", False, True),
    ("stdin", "csv", True, False),
    ("fifo", "parquet", False, False),
    ("file", "parquet", True, True),
]


@pytest.mark.parametrize(
    "how", NEW_PATH_RUNS, ids=["-".join(map(str, how)) for how in NEW_PATH_RUNS]
)
def test_no_canary_leaves_the_cli_on_the_new_paths(
    server: MockServerProcess, tmp_path: Path, how: tuple[str, str, bool, bool]
) -> None:
    kind, fmt, flatten, table_as_csv = how
    c = canaries(NEW_TAGS)
    realm = f"cn{uuid.uuid4().hex[:10]}"
    given, out = tmp_path / "given", tmp_path / "out"
    given.mkdir()
    out.mkdir()
    auth, issued = auth_script(server, given, realm)
    common = [
        "-v", "--no-progress", "--attempts", "2", "--timeout", "5", "-c", "2",
        "-H", f"X-Api-Key: {c['np_header']}", "--format", fmt, *(["--flatten"] * flatten),
    ]  # fmt: skip
    # 1. A list of items, each followed over its pages, with a token that runs out; then the
    # failures retried once more (a second pass, in the report's Passes table).
    items = paged_items(server, c, realm)
    (given / "items.txt").write_text("\n".join(items) + "\n")
    listed = [
        "--paginate", "link", "--auth-command", auth, "--secret-param", "mysig",
        "--secret-header", "X-Session", "-o", "paged", *common,
    ]  # fmt: skip
    runs = [cli_on(kind, given / "items.txt", listed, out)]
    runs.append(cli_on(kind, given / "items.txt", [*listed, "--retry-failed"], out))
    # 2. A table through a URL template and a body template, each row's key a secret
    # parameter, followed over pages whose next one is named in the body.
    rows = template_rows(server, c)
    table = given / ("rows.csv" if table_as_csv else "rows.jsonl")
    table.write_text(table_text(rows, table_as_csv))
    template = (
        f"{server.url}/pages/next/{{name}}?total=5&size=2&api_key={{key}}&base={{base}}"
        "&fail={fail}"
    )
    templated = [
        "--url", template, "--input-format", "csv" if table_as_csv else "jsonl",
        "--method", "POST", "--body-template", '{"name": "{name}", "n": "{id}"}',
        "--paginate", "json:next", "--items", "items", "-o", "rows", *common,
    ]  # fmt: skip
    runs.append(cli_on(kind, table, templated, out))
    codes = [code for code, _, _ in runs]
    assert codes == [1, 1, 1], [stderr[-3000:] for _, _, stderr in runs]
    shown = "".join(stdout + stderr for _, stdout, stderr in runs)
    assert "Traceback" not in shown

    # Every item has its result, in order, and the paths meant to run did.
    suffix = {"jsonl": ".jsonl", "csv": ".csv", "parquet": ".parquet"}[fmt]
    paged = read_results(out / f"paged-results{suffix}")
    assert [r["index"] for r in paged] == list(range(len(items)))
    assert [r["ok"] in (True, "true") for r in paged] == [
        True, True, True, True, False, True, True, *[True] * 6, False, False,
    ]  # fmt: skip
    assert [str(r["status_code"]) for r in paged][-2:] == ["401", "404"]
    assert paged[0]["final_url"] == items[0].replace(c["pg_qkey"], MASK) + "&page=3"
    assert paged[1]["final_url"].startswith(f"http://{MASK}@127.0.0.1:")
    hop = paged[6]["final_url"]  # on the server the hop named, with the userinfo it gave
    assert hop.startswith(f"http://{MASK}@127.0.0.1:") and hop.endswith("&page=3"), hop
    assert "page 3 (" in str(paged[4]["error"]) and "api_key=***&page=3" in str(paged[4]["error"])
    hops = server.stats()["counts"]
    assert any(f"api_key={c['pg_qkey']}&page=3" in target for target in hops)
    tokens_seen = server.get(f"/tokens/{realm}")
    assert tokens_seen["expired"] >= 1 and tokens_seen["issued"] >= 2, tokens_seen  # refreshed
    templated_results = read_results(out / f"rows-results{suffix}")
    assert [r["index"] for r in templated_results] == [0, 1, 2]
    assert [str(r["id"]) for r in templated_results] == ["1", "2", "3"]
    assert [r["ok"] in (True, "true") for r in templated_results] == [True, True, False]
    assert [r["pages"] for r in templated_results] in ([3, 3, 1], ["3", "3", "1"])
    assert templated_results[1]["final_url"].startswith(f"http://{MASK}@127.0.0.1:")
    assert any(f"api_key={c['tp_key2']}&" in target and "page=3" in target for target in hops)
    for prefix in ("paged", "rows"):
        report = (out / f"{prefix}-report.html").read_text()
        assert "<table id='passes'>" in report
    passes = (out / "paged-report.html").read_text().split("<table id='passes'>", 1)[1]
    assert passes.split("</table>", 1)[0].count("<tr>") == 3  # a head row, two passes

    # Now every byte written: stdout and stderr (-v), every file in the output folder (the
    # results in each format, the report), the journal's dump but for its copy of the items.
    for path in sorted(out.iterdir()):
        if not path.name.endswith(("-failed.jsonl", ".sqlite3")):
            shown += written_text(path)
    for prefix in ("paged", "rows"):
        shown += journal_dump(out / f"{prefix}-journal.sqlite3")[0]
    assert leaked(shown, c, c) == [], contexts(shown, c, c)
    for token in issued.read_text().split():
        assert token not in shown and token[4:-4] not in shown
    # A failed page's URL is kept in the journal (0600) to go on from: with the item's own
    # secret, none of the run's.
    owners = {("paged", 4): ["pg_failpage"], ("rows", 2): ["tp_key3"]}
    for prefix in ("paged", "rows"):
        for index, continuation in journal_continuations(out / f"{prefix}-journal.sqlite3").items():
            assert leaked(continuation, c, c) == owners[prefix, index], continuation
            assert not any(token in continuation for token in issued.read_text().split())
    # The failed files keep the items as given (the run's own secrets never in them) ...
    failed = (out / "paged-failed.jsonl").read_text().splitlines()
    assert [json.loads(line)["url"] for line in failed] == [items[4], items[-2], items[-1]]
    assert leaked("".join(failed), c, NEW_RUN_TAGS) == []
    failed_rows = (out / "rows-failed.jsonl").read_text().splitlines()
    assert len(failed_rows) == 1 and c["tp_key3"] in failed_rows[0]
    # ... and they and the journals are the owner's only.
    for prefix in ("paged", "rows"):
        assert_owner_only(out, prefix)


@pytest.mark.integration
def test_a_long_secret_the_items_own_path_also_holds_keeps_the_path(
    server: MockServerProcess,
) -> None:
    """Masking never corrupts (issue 26): a password of 8 characters or more that the item's
    own path holds too is masked where it stands as the password, never in the path."""
    base = server.url.replace("http://", "http://admin:password@")
    rs = fetch_all([f"{base}/ok/password-reset"], attempts=1)
    expected = server.url.replace("http://", "http://***@") + "/ok/password-reset"
    assert rs[0].url == expected
    assert rs[0].final_url == expected
    assert "admin:password" not in json.dumps(rs[0].to_dict())


# --- a lent session: its headers, auth, params, cookies and proxies are the run's secrets -------

SESSION_TAGS = (
    "s_auth", "s_cookie", "s_proxyauth", "s_declared", "s_param", "s_jar", "s_user", "s_pass",
    "s_puser", "s_ppass", "s_token",
)  # fmt: skip


class TokenAuth(requests.auth.AuthBase):
    """A caller's own auth: its token in a header whose name says nothing of secrets."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["X-Auth-Token"] = self.token
        return request


def quoting_hook(session: requests.Session) -> Callable[..., Any]:
    """A response hook that, for some paths, raises quoting everything the session holds and
    the request it sent: as a plain exception, or as raise_for_status' HTTPError."""

    def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        quoted = (
            f"{dict(session.headers)!r} {session.auth!r} {vars(session.auth)} "
            f"{session.proxies} {get_auth_from_url(session.proxies['http'])} "
            f"{session.params} {list(session.cookies)} "
            f"{dict(response.request.headers)}"
        )
        if "/hooked" in str(response.url):
            raise RuntimeError(f"hook saw {quoted}")
        if "/status/503" in str(response.url):
            raise requests.HTTPError(f"503 with {quoted}", response=response)

    return hook


def lent_session(c: dict[str, str], proxy: str) -> requests.Session:
    """A caller's session with a canary in every place it can hold one, through ``proxy``."""
    session = requests.Session()
    session.headers.update({
        "Authorization": f"Bearer {c['s_auth']}", "Cookie": f"sid={c['s_cookie']}",
        "Proxy-Authorization": f"Basic {c['s_proxyauth']}", "X-Sess-Secret": c["s_declared"],
    })  # fmt: skip
    session.params = {"token": c["s_param"]}
    session.cookies.set("jar", c["s_jar"], domain="origin.test")
    session.auth = requests.auth.HTTPBasicAuth(c["s_user"], c["s_pass"])
    port = proxy.rsplit(":", 1)[1]
    session.proxies = {"http": f"http://{c['s_puser']}:{c['s_ppass']}@127.0.0.1:{port}"}
    session.hooks["response"].append(quoting_hook(session))
    return session


def test_no_canary_of_a_lent_session_leaves_the_run(tmp_path: Path) -> None:
    """A caller's session lent to the command line's own run (journal, outputs, report, a
    retry pass, logging to a file): its secrets are masked wherever an item's would be."""
    from batchsync.cli.inputs import Input
    from batchsync.cli.runner import Continuing, run_batch
    from batchsync.jobs.options import FetchOptions, build

    c = canaries(SESSION_TAGS)
    log_path = tmp_path / "run.log"
    handler = logging.FileHandler(log_path)
    handler.setLevel(logging.DEBUG)
    root = logging.getLogger()
    level = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    shown = ""
    try:
        with RawServer() as raw:  # the proxy every request goes through (it answers them)
            session = lent_session(c, raw.url)
            by_token = lent_session(c, raw.url)
            by_token.auth = TokenAuth(c["s_token"])
            for name, lent, form in (("basic", session, "jsonl"), ("token", by_token, "csv")):
                items = [
                    "http://origin.test/echo-auth",  # the server quotes Authorization
                    "http://origin.test/hooked",  # a hook raises quoting the session
                    "http://origin.test/status/503",  # raise_for_status' HTTPError, retried
                    "http://origin.test/status/200",
                ]
                given = tmp_path / f"{name}.txt"
                given.write_text("\n".join(items) + "\n")
                options = build(
                    FetchOptions, session=lent, attempts=2, timeout=5,
                    secret_headers=("X-Sess-Secret",),
                )  # fmt: skip
                prefix = str(tmp_path / "out" / name)
                (tmp_path / "out").mkdir(exist_ok=True)
                for continuing in (Continuing(), Continuing(retry=frozenset())):
                    source = Input(str(given))
                    try:
                        outcome = run_batch(
                            source, options, prefix, continuing=continuing, progress=False,
                            report=True, form=form,
                        )  # fmt: skip
                    finally:
                        source.close()
                    shown += f"{outcome.summary}\n{outcome!r}\n"
                results = read_results(outcome.results_path)
                assert [r["ok"] in (True, "true") for r in results] == [False, False, False, True]
                shown += journal_dump(tmp_path / "out" / f"{name}-journal.sqlite3")[0]
            sent = b"".join(raw.requests()).decode("latin-1")
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        handler.close()
    # Every canary was sent (each place is a place the session holds one) ...
    for tag in ("s_cookie", "s_declared", "s_param", "s_token"):
        assert c[tag] in sent, tag
    assert base64.b64encode(f"{c['s_user']}:{c['s_pass']}".encode()).decode() in sent
    # ... and every byte written holds none: the log, every output (the failed file and the
    # journal too: the items never held the session's secrets).
    shown += log_path.read_text()
    for path in sorted((tmp_path / "out").iterdir()):
        shown += written_text(path)
    assert "hook saw" in shown and "BadStatusLine('HTTP/1.1 abc " in shown  # (both ran)
    assert leaked(shown, c, c) == [], contexts(shown, c, c)
