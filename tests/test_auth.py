"""Tokens that expire (issue 19, item 4): against the mock server's token endpoint, a token
that runs out midway is refreshed once for all workers and the items go on; a token refused
even when fresh ends its items as 401s without a loop; every token stays secret."""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests
from requests.auth import AuthBase

from batchsync import AuthFailed, fetch_all
from batchsync.core.redact import Secrets
from batchsync.http.auth import MAX_RENEWALS, RefreshWaitTimedOut, Token, TokenSource, after_401

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration

REALMS = iter(range(10**6))


def realm() -> str:
    """A realm of tokens of the test's own (the session's server is shared)."""
    return f"r{next(REALMS)}x{os.getpid()}"


class Issuer:
    """auth=: a fresh token from the mock server on each call, every one remembered."""

    def __init__(self, server: MockServerProcess, realm: str, query: str = "uses=20") -> None:
        self.url = f"{server.url}/token/{realm}?{query}"
        self.tokens: list[str] = []
        self.lock = threading.Lock()

    def fetch(self) -> str:
        with urllib.request.urlopen(self.url, timeout=10) as response:
            token: str = json.load(response)["access_token"]
        with self.lock:
            self.tokens.append(token)
        return token

    def __call__(self) -> Mapping[str, str]:
        return {"Authorization": f"Bearer {self.fetch()}"}


def tokens(server: MockServerProcess, realm: str) -> dict[str, int]:
    return server.get(f"/tokens/{realm}")


def plain_items(server: MockServerProcess, realm: str, n: int) -> list[str]:
    return [f"{server.url}/protected/{realm}/{i}" for i in range(n)]


def test_an_expiring_token_is_refreshed_once_per_expiry_for_all_workers(
    server: MockServerProcess,
) -> None:
    # Before auth=, a token given as a header works for its 20 uses and then every remaining
    # item fails with a 401; now each expiry costs exactly one refresh, however many of the
    # 8 workers saw it (the server counts the tokens it issued).
    name = realm()
    issuer = Issuer(server, name)
    rs = fetch_all(plain_items(server, name, 60), concurrency=8, auth=issuer, attempts=1)
    assert [r.status_code for r in rs] == [200] * 60, rs.summary()
    counted = tokens(server, name)
    assert counted["expired"] >= 2
    assert counted["issued"] == counted["expired"] + 1 == len(issuer.tokens)
    assert counted["used"] == 60  # every item went through once with a live token
    # every request the server saw is in some item's attempts (resends after a 401 included)
    assert sum(r.attempts for r in rs) == counted["used"] + counted["unauthorized"]
    assert sum(record.resent for r in rs for record in r.attempt_log) == counted["unauthorized"]


def test_the_requests_path_refreshes_the_same_way(server: MockServerProcess) -> None:
    name = realm()
    issuer = Issuer(server, name, "uses=15")
    url = f"{server.url}/protected/{name}/p"
    items: list[Any] = [{"url": url, "params": {"i": i}} for i in range(30)]
    items += [{"url": url, "method": "POST", "json": {"i": i}} for i in range(30)]
    rs = fetch_all(items, concurrency=8, auth=issuer, attempts=1)
    assert [r.status_code for r in rs] == [200] * 60, rs.summary()
    counted = tokens(server, name)
    assert counted["expired"] >= 2
    assert counted["issued"] == counted["expired"] + 1


def test_a_token_refused_even_when_fresh_ends_its_items_without_a_loop(
    server: MockServerProcess,
) -> None:
    name = realm()
    issuer = Issuer(server, name, "refuse=1")
    started = time.monotonic()
    rs = fetch_all(plain_items(server, name, 40), concurrency=8, auth=issuer)
    assert time.monotonic() - started < 20
    assert {(r.status_code, r.error_kind) for r in rs} == {(401, "status")}
    assert all(r.error is not None and r.error.startswith("HTTP 401") for r in rs)
    # The first token may have gone stale before its first use: one refresh, and no more.
    assert tokens(server, name)["issued"] == 2
    # A resend after the refresh is a request like any other: ``attempts`` counts it.
    assert {r.attempts for r in rs} <= {1, 2}
    assert sum(r.attempts for r in rs) == tokens(server, name)["unauthorized"] <= 40 + 8


def test_a_refresh_that_fails_fails_the_items_that_needed_it_and_the_run_goes_on(
    server: MockServerProcess,
) -> None:
    name = realm()
    issuer = Issuer(server, name, "uses=10")
    calls = 0

    def once_then_down() -> Mapping[str, str]:
        nonlocal calls
        calls += 1
        if calls > 1:  # (a token endpoint's error may quote a token never handed out)
            raise RuntimeError("token service down; last said: Bearer cnryunseen7731")
        return issuer()

    rs = fetch_all(plain_items(server, name, 30), concurrency=4, auth=once_then_down)
    assert sum(r.ok for r in rs) == 10
    failed = rs.failed
    assert len(failed) == 20
    assert {(r.status_code, r.error_kind) for r in failed} == {(401, "status")}
    assert all(
        r.error == "HTTP 401; no new token: auth= raised RuntimeError (its message is not shown)"
        for r in failed
    ), {r.error for r in failed}
    assert "cnryunseen" not in repr(list(rs)) + rs.to_pandas().to_csv()


def test_a_first_token_that_cannot_be_got_stops_the_run_before_anything_is_sent(
    server: MockServerProcess,
) -> None:
    name = realm()

    def broken() -> Mapping[str, str]:
        raise OSError("no route to the vault")

    with pytest.raises(AuthFailed, match=r"^auth= raised OSError \(its message is not shown\)$"):
        fetch_all(plain_items(server, name, 3), auth=broken)
    with pytest.raises(AuthFailed, match="auth= returned no headers"):
        fetch_all(plain_items(server, name, 3), auth=dict)
    with pytest.raises(AuthFailed, match="auth= returned a header value over 16 KiB"):
        fetch_all(plain_items(server, name, 3), auth=lambda: {"Authorization": "a" * 20000})
    with pytest.raises(AuthFailed, match="mapping of header names"):
        fetch_all(plain_items(server, name, 3), auth=lambda: "Bearer x")  # type: ignore[arg-type]
    assert tokens(server, name)["unauthorized"] == 0
    with pytest.raises(ValueError, match="auth"):
        fetch_all([], auth=42)  # type: ignore[arg-type]


class RefreshingBearer(AuthBase):
    """An AuthBase with a refresh(): applied to each request, renewed on a 401."""

    def __init__(self, issuer: Issuer) -> None:
        self.issuer = issuer
        self.token = issuer.fetch()
        self.applied = 0

    def refresh(self) -> None:
        self.token = self.issuer.fetch()

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        self.applied += 1
        request.headers["Authorization"] = f"Bearer {self.token}"
        return request


def test_an_authbase_is_applied_to_each_request_and_refreshed_when_it_can_be(
    server: MockServerProcess,
) -> None:
    name = realm()
    auth = RefreshingBearer(Issuer(server, name, "uses=12"))
    rs = fetch_all(plain_items(server, name, 40), concurrency=8, auth=auth, attempts=1)
    assert [r.status_code for r in rs] == [200] * 40, rs.summary()
    counted = tokens(server, name)
    assert counted["issued"] == counted["expired"] + 1 >= 3
    assert auth.applied == 40 + counted["unauthorized"]

    # Without refresh(), a 401 is an ordinary final one: no loop.
    plain = requests.auth.HTTPBasicAuth("user", "wrong-password")
    rs = fetch_all(plain_items(server, realm(), 5), auth=plain)
    assert {(r.status_code, r.attempts) for r in rs} == {(401, 1)}


def test_every_token_stays_secret_through_failures_and_debug_logs(
    server: MockServerProcess, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    name = realm()
    issuer = Issuer(server, name, "uses=6")
    calls = 0

    def source() -> Mapping[str, str]:
        nonlocal calls
        calls += 1
        if calls == 4:  # a careless token service naming the token it could not renew
            raise RuntimeError(f"cannot renew {issuer.tokens[-1]}")
        return issuer()

    items: list[Any] = plain_items(server, name, 30)
    items += [f"{server.url}/404/{i}" for i in range(5)]
    items += [{"url": f"{server.url}/protected/{name}/q", "params": {"i": i}} for i in range(10)]
    caplog.set_level(logging.DEBUG)
    journal = tmp_path / "journal.sqlite3"
    rs = fetch_all(items, concurrency=4, auth=source, journal=str(journal))
    assert rs.failed and rs.ok
    assert any("no new token" in (r.error or "") for r in rs.failed)
    assert len(issuer.tokens) >= 3
    shown = "\n".join(
        [caplog.text, repr(rs), rs._repr_html_(), str(rs.summary())]
        + [json.dumps(r.to_dict()) + repr(r) for r in rs]
    )
    written = shown + journal.read_bytes().decode("latin-1")
    assert "resent with token" in caplog.text  # the resends are logged at DEBUG
    for token in issuer.tokens:
        assert token not in written and token[4:-4] not in written


def test_the_auth_command_refreshes_the_token_for_the_cli(
    server: MockServerProcess, tmp_path: Path
) -> None:
    name = realm()
    secrets_dir = tmp_path / "secrets"
    secrets_dir.mkdir()
    script = secrets_dir / "get_token.py"
    issued = secrets_dir / "issued.txt"
    script.write_text(
        "import sys, urllib.request\n"
        # (tokens good for twice the concurrency: see the README on tokens used up by resends)
        f"url = {server.url + '/token/' + name + '?uses=16&format=header'!r}\n"
        "value = urllib.request.urlopen(url).read().decode()\n"
        f"open({str(issued)!r}, 'a').write(value.split()[1] + '\\n')\n"
        "print(value)\n"
    )
    out = tmp_path / "out"
    out.mkdir()
    listing = out / "items.txt"
    lines = plain_items(server, name, 40) + [
        json.dumps({"url": f"{server.url}/protected/{name}/j", "params": {"i": i}})
        for i in range(10)
    ]
    lines += [f"{server.url}/404/{i}" for i in range(3)]
    listing.write_text("\n".join(lines) + "\n")
    done = run_cli(
        "items.txt", "-c", "8", "--no-progress", "-vv", "--auth-command",
        f"{sys.executable} {script}", cwd=out,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-2000:]  # (the three 404s)
    results = [json.loads(line) for line in (out / "items-results.jsonl").read_text().splitlines()]
    assert [r["status_code"] for r in results] == [200] * 50 + [404] * 3
    counted = tokens(server, name)
    assert counted["issued"] == counted["expired"] + 1 >= 3
    written = done.stdout + done.stderr
    written += "".join(path.read_bytes().decode("latin-1") for path in out.iterdir())
    for token in issued.read_text().split():
        assert token not in written and token[4:-4] not in written


@pytest.mark.parametrize(
    ("command", "reason"),
    [
        ("echo cnryleaked1234567; exit 3", "the auth command failed (exit status 3"),
        ("true", "the auth command printed nothing"),
        ("echo cnry1; echo cnry2", "the auth command printed more than one line"),
        # what no header can carry: a NUL, beyond latin-1 (a euro sign), not UTF-8 at all
        (r"printf 'Bearer cnry\000x'", "the auth command printed a value Authorization cannot"),
        (r"printf 'Bearer cnry\342\202\254'", "the auth command printed a value Authorization"),
        (r"printf 'Bearer cnry\377'", "the auth command printed text that is not UTF-8"),
    ],
)
def test_an_auth_command_that_fails_at_start_stops_the_cli_with_exit_2(
    server: MockServerProcess, tmp_path: Path, command: str, reason: str
) -> None:
    name = realm()
    (tmp_path / "items.txt").write_text("\n".join(plain_items(server, name, 3)) + "\n")
    earlier = {"items-results.jsonl": "earlier results\n", "items-failed.jsonl": "earlier\n"}
    for file, text in earlier.items():
        (tmp_path / file).write_text(text)
    done = run_cli("items.txt", "--auth-command", command, cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"Error: --auth-command: {reason}"), lines
    assert "Traceback" not in done.stderr and "cnry" not in done.stderr + done.stdout
    assert {p.name: p.read_text() for p in tmp_path.iterdir() if p.name != "items.txt"} == earlier
    assert tokens(server, name)["unauthorized"] == 0


def test_an_auth_command_that_prints_no_header_value_leaves_the_journal(
    server: MockServerProcess, tmp_path: Path
) -> None:
    name = realm()
    (tmp_path / "items.txt").write_text("\n".join(plain_items(server, name, 3)) + "\n")
    first = run_cli("items.txt", "--attempts", "1", cwd=tmp_path)  # (401s: no token)
    assert first.returncode == 1, first.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for how in ("--retry-failed", "--fresh"):
        done = run_cli("items.txt", how, "--auth-command", r"printf 'Bearer \000'", cwd=tmp_path)
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.splitlines()) == 1, done.stderr
        assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_an_auth_command_that_hangs_is_cut_at_its_timeout() -> None:
    from batchsync.http.auth import CommandToken

    started = time.monotonic()
    with pytest.raises(AuthFailed, match=r"did not finish within 0\.5 s"):
        CommandToken("sleep 30 & sleep 30", timeout=0.5).prime()
    assert time.monotonic() - started < 5


def test_an_auth_command_whose_child_leaves_its_group_is_cut_too() -> None:
    """A child that left the process group (setsid) keeps the pipe open after the group is
    killed: the command is given up on, not waited for."""
    from batchsync.http.auth import CommandToken

    started = time.monotonic()
    with pytest.raises(AuthFailed, match=r"did not finish within 0\.5 s"):
        CommandToken("setsid sleep 4 & sleep 30", timeout=0.5).prime()
    assert time.monotonic() - started < 3


def test_an_auth_command_that_prints_too_much_fails_at_once() -> None:
    from batchsync.http.auth import CommandToken

    started = time.monotonic()
    with pytest.raises(AuthFailed, match="printed more than 16 KiB"):
        CommandToken("yes Bearer | head -c 50000000", timeout=20).prime()
    assert time.monotonic() - started < 10


def test_the_resume_line_after_ctrl_c_hides_the_commands_token(
    server: MockServerProcess, tmp_path: Path
) -> None:
    name = realm()
    token = "cnryresume" + os.urandom(8).hex()
    urls = [f"{server.url}/ok/{name}-{i}?delay=0.3" for i in range(40)]
    (tmp_path / "items.txt").write_text("\n".join(urls) + "\n")
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", "items.txt", "-c", "2", "--no-progress",
         "--auth-command", f"echo Bearer {token}"],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 30
    while server.count(f"/ok/{name}-0?delay=0.3") == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    process.send_signal(signal.SIGINT)
    out, err = process.communicate(timeout=60)
    assert process.returncode == 130, err
    assert "resume with:" in err
    assert token not in out + err
    assert "--auth-command 'echo ***" in err  # (the whole value masked, its scheme too)


def test_a_401_from_another_origin_after_a_redirect_refreshes_nothing(
    server: MockServerProcess,
) -> None:
    """The token never went there (it stays with the item's origin): that 401 says nothing of
    the token."""
    name = realm()
    issuer = Issuer(server, name, "uses=1000")
    port = server.url.rsplit(":", 1)[1]
    elsewhere = f"http://localhost:{port}/protected/{name}/x"
    items = [f"{server.url}/redirect?to={quote(elsewhere, safe='')}&i={i}" for i in range(20)]
    rs = fetch_all(items, concurrency=4, auth=issuer, attempts=1)
    assert {(r.status_code, r.attempts) for r in rs} == {(401, 1)}
    assert tokens(server, name)["issued"] == 1


def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args], cwd=cwd, capture_output=True, text=True,
        timeout=120, check=False, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


# The rules, without a network.


def test_after_401_resends_refreshes_or_gives_up() -> None:
    assert after_401(sent=2, current=3, accepted=2, renewals=0) == "resend"
    assert after_401(sent=2, current=3, accepted=2, renewals=1) == "resend"
    assert after_401(sent=3, current=3, accepted=3, renewals=0) == "refresh"
    assert after_401(sent=3, current=3, accepted=3, renewals=1) == "refresh"  # used up again
    assert after_401(sent=0, current=0, accepted=-1, renewals=0) == "refresh"  # stale at start
    assert after_401(sent=0, current=0, accepted=-1, renewals=1) == "give_up"
    assert after_401(sent=3, current=3, accepted=2, renewals=0) == "give_up"  # never worked
    assert after_401(sent=3, current=4, accepted=4, renewals=MAX_RENEWALS) == "give_up"


def test_a_token_source_refreshes_once_for_every_worker_that_saw_the_same_token() -> None:
    gate = threading.Event()
    fetched: list[int] = []

    def slow() -> Mapping[str, str]:
        fetched.append(1)
        gate.wait(5)
        return {"Authorization": f"Bearer secret-token-{len(fetched)}"}

    secrets = Secrets()
    source = TokenSource(slow, secrets)
    gate.set()
    first = source.start()
    gate.clear()
    got: list[Token] = []
    workers = [threading.Thread(target=lambda: got.append(source.refresh(first))) for _ in range(8)]
    for worker in workers:
        worker.start()
    time.sleep(0.2)
    gate.set()
    for worker in workers:
        worker.join(5)
    assert len(fetched) == 2 and {token.generation for token in got} == {1}
    assert secrets.text("sent Bearer secret-token-2 and secret-token-1") == "sent *** and ***"


def test_waiting_for_another_workers_refresh_ends_with_the_attempt() -> None:
    gate = threading.Event()

    def slow() -> Mapping[str, str]:
        gate.wait(5)
        return {"Authorization": "Bearer slow-token"}

    source = TokenSource(slow, Secrets())
    gate.set()
    first = source.start()
    gate.clear()
    refresher = threading.Thread(target=source.refresh, args=(first,))
    refresher.start()
    time.sleep(0.1)
    started = time.monotonic()
    with pytest.raises(RefreshWaitTimedOut):
        source.refresh(first, wait=0.2)
    assert time.monotonic() - started < 2
    gate.set()
    refresher.join(5)
    assert source.refresh(first, wait=0.2).generation == 1  # (taken, not fetched again)


@pytest.mark.parametrize("name", ["Authorization", "X-Api-Token"])
def test_a_token_goes_to_the_items_own_origin_only(server: MockServerProcess, name: str) -> None:
    port = server.url.rsplit(":", 1)[1]
    seen = []
    for to in (f"{server.url}/echo", f"http://localhost:{port}/echo"):
        items: list[Any] = [f"{server.url}/redirect?to={quote(to, safe='')}"]  # fast lane
        items.append({"url": f"{server.url}/redirect", "params": {"to": to}})  # requests path
        rs = fetch_all(items, auth=lambda: {name: "Bearer tokentoken"})
        seen.append([name.lower() in map(str.lower, r.data["headers"]) for r in rs])
    assert seen == [[True, True], [False, False]]
