"""One cookie jar per origin (issue 16), against real local servers.

Two recording raw-socket servers on two ports of 127.0.0.1 are two origins of one host: the
case http.cookiejar gets wrong, since cookie domains ignore ports. Runs use one worker, so the
order of requests is the order of the items.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from http.cookiejar import DefaultCookiePolicy
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, quote, urlsplit

import pytest
import requests

from batchsync import fetch_all
from batchsync.http import cookies as cookies_module
from batchsync.http.transport import Transport
from tests import rawserver
from tests.rawserver import RawServer

pytestmark = pytest.mark.integration

Lane = Callable[[str], Any]

# How items reach the wire: batchsync's fast lane (plain URLs on its own session), the full
# requests way (a mapping with params), a caller's session, and a factory of sessions.
LANES = ["fast", "requests", "session", "factory"]


def item_for(lane: str) -> Lane:
    if lane == "requests":
        return lambda url: {"url": url, "params": {"lane": "requests"}}
    return lambda url: url


def session_for(lane: str) -> Any:
    if lane == "session":
        return requests.Session()
    if lane == "factory":
        return requests.Session  # called once per worker thread
    return None


def _answer(status: int, headers: list[tuple[str, str]]) -> bytes:
    lines = [f"HTTP/1.1 {status} {'Found' if status == 302 else 'OK'}"]
    lines += [f"{name}: {value}" for name, value in headers]
    lines.append("Content-Length: 2")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + b"{}"


@pytest.fixture(autouse=True)
def more_answers(monkeypatch: pytest.MonkeyPatch) -> None:
    """Two more answers of the raw servers: a redirect that sets a cookie, and a deletion."""
    plain = rawserver.answer

    def answer(method: str, target: str, head: bytes = b"") -> bytes:
        parts = urlsplit(target)
        query = {name: values[0] for name, values in parse_qs(parts.query).items()}
        if parts.path == "/set-and-redirect":
            cookie = f"{query['name']}={query['value']}; Path=/"
            return _answer(302, [("Set-Cookie", cookie), ("Location", query["to"])])
        if parts.path == "/delete-cookie":
            return _answer(200, [("Set-Cookie", f"{query['name']}=; Max-Age=0; Path=/")])
        return plain(method, target, head)

    monkeypatch.setattr(rawserver, "answer", answer)


@pytest.fixture
def origins() -> Iterator[tuple[RawServer, RawServer]]:
    """Two origins of one host: http://127.0.0.1 on two ports."""
    with RawServer() as a, RawServer() as b:
        yield a, b


def cookies(recorded: bytes) -> list[str]:
    """The Cookie header values of one recorded request."""
    return [
        line.partition(b":")[2].strip().decode()
        for line in recorded.split(b"\r\n")[1:]
        if line.lower().startswith(b"cookie:")
    ]


def seen(server: RawServer) -> list[tuple[str, list[str]]]:
    """(path, Cookie headers) of every request the server received, in order."""
    return [
        (urlsplit(request.split(b" ", 2)[1].decode()).path, cookies(request))
        for request in server.requests()
    ]


def run(items: list[Any], **options: Any) -> None:
    settings: dict[str, Any] = {"concurrency": 1, "attempts": 1} | options
    results = fetch_all(items, **settings)
    assert [r.error for r in results if not r.ok] == []


def test_an_origin_is_scheme_and_host_key_a_default_port_the_same_as_none() -> None:
    from batchsync.http.origins import origin_of

    assert origin_of("http://Example.COM/a") == "http://example.com"
    assert origin_of("http://example.com:80/b?c") == "http://example.com"
    assert origin_of("HTTPS://example.com") == "https://example.com"
    assert origin_of("https://example.com:443") == "https://example.com"
    assert origin_of("https://example.com:8443") == "https://example.com:8443"
    assert origin_of("http://example.com:443") == "http://example.com:443"
    assert origin_of("http://u:p@[::1]:8080/") == "http://[::1]:8080"
    assert origin_of("http://example.com:99999/") is None
    assert origin_of("http:///path") is None


@pytest.mark.parametrize("lane", LANES)
def test_a_cookie_goes_back_only_to_the_origin_that_set_it(
    origins: tuple[RawServer, RawServer], lane: str
) -> None:
    """Fails on a jar shared by the run: the other port of the host got sid=A1."""
    a, b = origins
    item = item_for(lane)
    urls = [f"{a.url}/set-cookie?name=sid&value=A1", f"{b.url}/x", f"{a.url}/y", f"{b.url}/z"]
    run([item(url) for url in urls], session=session_for(lane))
    assert seen(a) == [("/set-cookie", []), ("/y", ["sid=A1"])]
    assert seen(b) == [("/x", []), ("/z", [])]


@pytest.mark.parametrize("lane", LANES)
def test_two_origins_that_set_the_same_cookie_keep_their_own(
    origins: tuple[RawServer, RawServer], lane: str
) -> None:
    """One jar per origin, not one jar with an origin check: fails on a shared jar, where
    B's sid replaced A's, and also on a stamped single jar (A would get nothing)."""
    a, b = origins
    item = item_for(lane)
    urls = [
        f"{a.url}/set-cookie?name=sid&value=A1",
        f"{b.url}/set-cookie?name=sid&value=B1",
        f"{a.url}/y",
        f"{b.url}/z",
    ]
    run([item(url) for url in urls], session=session_for(lane))
    assert seen(a)[1] == ("/y", ["sid=A1"])
    assert seen(b)[1] == ("/z", ["sid=B1"])


@pytest.mark.parametrize("lane", LANES)
def test_a_redirect_to_another_port_does_not_carry_the_cookie_and_its_return_does(
    origins: tuple[RawServer, RawServer], lane: str
) -> None:
    """A -> B -> A, A setting sid on the first hop (as the fast lane hands it to requests, or
    on the requests path). Fails on a shared jar: the hop to B carried sid=A1."""
    a, b = origins
    back = f"{b.url}/redirect?to={a.url}/final"
    url = f"{a.url}/set-and-redirect?name=sid&value=A1&to={back}"
    run([item_for(lane)(url), item_for(lane)(f"{b.url}/later")], session=session_for(lane))
    assert seen(b) == [("/redirect", []), ("/later", [])]
    assert seen(a) == [("/set-and-redirect", []), ("/final", ["sid=A1"])]


@pytest.mark.parametrize("lane", LANES)
def test_a_cookie_set_on_a_redirect_hop_goes_to_its_origin_only(
    origins: tuple[RawServer, RawServer], lane: str
) -> None:
    """A -> B -> A where both set a cookie: B's goes neither to A's last hop nor to later
    items for A; A's goes to A's last hop. Fails on a shared jar (A got b=B1, B got a=A1)."""
    a, b = origins
    via_b = f"{b.url}/set-and-redirect?name=b&value=B1&to={a.url}/final"
    url = f"{a.url}/set-and-redirect?name=a&value=A1&to={quote(via_b, safe='')}"
    items = [item_for(lane)(url), item_for(lane)(f"{a.url}/later"), item_for(lane)(f"{b.url}/z")]
    run(items, session=session_for(lane))
    assert seen(b) == [("/set-and-redirect", []), ("/z", ["b=B1"])]
    assert seen(a) == [("/set-and-redirect", []), ("/final", ["a=A1"]), ("/later", ["a=A1"])]


@pytest.mark.parametrize("lane", LANES)
def test_a_deleted_cookie_is_no_longer_sent(
    origins: tuple[RawServer, RawServer], lane: str
) -> None:
    """A Set-Cookie with Max-Age=0 deletes it from its origin's jar. (Passes on the old code
    too, where the shared jar deleted it: a guard for the per-origin jars.)"""
    a, _ = origins
    item = item_for(lane)
    urls = [
        f"{a.url}/set-cookie?name=sid&value=A1",
        f"{a.url}/delete-cookie?name=sid",
        f"{a.url}/y",
    ]
    run([item(url) for url in urls], session=session_for(lane))
    assert seen(a) == [("/set-cookie", []), ("/delete-cookie", ["sid=A1"]), ("/y", [])]


@pytest.mark.parametrize("lane", LANES)
def test_no_cookies_keeps_none(origins: tuple[RawServer, RawServer], lane: str) -> None:
    """``cookies=False``: nothing a response sets is sent back, across items or on a
    redirect. Fails on the old code: no such option."""
    a, b = origins
    item = item_for(lane)
    items = [
        item(f"{a.url}/set-cookie?name=sid&value=A1"),
        item(f"{a.url}/set-and-redirect?name=r&value=1&to={a.url}/final"),
        item(f"{a.url}/y"),
        item(f"{b.url}/z"),
    ]
    run(items, session=session_for(lane), cookies=False)
    assert all(sent == [] for _, sent in seen(a) + seen(b))


def test_with_no_cookies_the_fast_lane_stays_open_after_a_set_cookie(
    origins: tuple[RawServer, RawServer],
) -> None:
    """Nothing kept, so nothing for the fast lane to step aside for. Fails on the old code:
    Transport takes no ``cookies``."""
    a, _ = origins
    transport = Transport(None, 1, cookies=False)
    try:
        wire = transport.wire("GET", f"{a.url}/set-cookie?name=sid&value=A1", {})
        assert wire is not None
        reply = transport.send(wire, time.monotonic() + 10)
        transport.read_body(reply, time.monotonic() + 10, 1024)
        transport.finish()
        assert transport.fast
        assert transport.wire("GET", f"{a.url}/y", {}) is not None
    finally:
        transport.close()


@pytest.mark.parametrize("keep", [True, False])
def test_a_callers_own_cookies_go_out_as_plain_requests_sends_them(
    origins: tuple[RawServer, RawServer], keep: bool
) -> None:
    """Cookies put in the caller's session before the run (no origin known) follow requests'
    rules: to both ports, byte for byte as ``requests`` sends them, with or without
    ``cookies``. (Passes on the old code with keep=True; keep=False fails there: no option.)"""

    def preset() -> requests.Session:
        session = requests.Session()
        session.cookies.set("pre", "p1", domain="127.0.0.1", path="/")
        session.cookies.set("anywhere", "1")  # no domain: sent everywhere
        return session

    a, b = origins
    urls = [f"{a.url}/x", f"{b.url}/y", f"{a.url}/z?q=1"]
    with preset() as plain:
        for url in urls:
            plain.get(url, timeout=10)
    expected = (a.requests(), b.requests())
    a.clear()
    b.clear()
    with preset() as session:
        run(urls, session=session, **({} if keep else {"cookies": False}))
    assert (a.requests(), b.requests()) == expected
    assert cookies(expected[1][0]) == ["pre=p1; anywhere=1"]


def test_a_callers_cookies_and_the_runs_go_together_each_where_it_belongs(
    origins: tuple[RawServer, RawServer],
) -> None:
    """Fails on the old code: B got A's sid along with the caller's cookie."""
    a, b = origins
    with requests.Session() as session:
        session.cookies.set("pre", "p1", domain="127.0.0.1", path="/")
        urls = [f"{a.url}/set-cookie?name=sid&value=A1", f"{b.url}/x", f"{a.url}/y"]
        run(urls, session=session)
    assert seen(b) == [("/x", ["pre=p1"])]
    assert sorted(seen(a)[1][1][0].split("; ")) == ["pre=p1", "sid=A1"]


@pytest.mark.parametrize("where", ["item", "run"])
def test_an_explicit_cookie_header_is_sent_as_given(
    origins: tuple[RawServer, RawServer], where: str
) -> None:
    """An item's (or the run's) Cookie header wins over the jar, as in requests. (Passes on
    the old code too: a guard for the header worked out again from the run's jars.)"""
    a, _ = origins
    later: Any = f"{a.url}/y"
    options: dict[str, Any] = {}
    if where == "item":
        later = {"url": later, "headers": {"Cookie": "mine=1"}}
    else:
        options["headers"] = {"Cookie": "mine=1"}
    run([f"{a.url}/set-cookie?name=sid&value=A1", later], **options)
    assert seen(a)[1] == ("/y", ["mine=1"])


def test_the_callers_session_is_handed_back_with_its_policy_and_the_cookies(
    origins: tuple[RawServer, RawServer],
) -> None:
    """After the run the session's jar has its own policy again and holds what the run
    received, as plain requests would leave it; a session used afterwards follows requests'
    rules. (Passes on the old code, which never lent a policy: a guard for the lending.)"""
    a, b = origins
    with requests.Session() as session:
        policy = session.cookies.get_policy()
        run([f"{a.url}/set-cookie?name=sid&value=A1"], session=session)
        assert session.cookies.get_policy() is policy
        assert session.cookies.get("sid") == "A1"
        session.get(f"{b.url}/after", timeout=10)
    assert seen(b) == [("/after", ["sid=A1"])]


def test_the_callers_cookies_differ_from_plain_requests_only_by_their_origin(
    origins: tuple[RawServer, RawServer],
) -> None:
    """The same items through a plain requests session and through batchsync with another:
    the two jars end with the same cookies, attribute for attribute, but the origin each
    cookie the run received carries (docs/fidelity.md: a difference on purpose), which keeps
    it to that origin in a copy of the jar too."""
    a, b = origins
    urls = [
        f"{a.url}/set-cookie?name=sid&value=A1",
        f"{a.url}/set-and-redirect?name=hop&value=1&to={quote(f'{b.url}/x')}",
        f"{b.url}/set-cookie?name=other&value=B1",
    ]
    with requests.Session() as plain, requests.Session() as session:
        for url in urls:
            plain.get(url, timeout=10)
        run(urls, session=session)
        kept = [vars(cookie).copy() for cookie in session.cookies]
        origins_of = [entry.pop("_batchsync_origin") for entry in kept]
        assert kept == [vars(cookie) for cookie in plain.cookies]
        assert origins_of == [a.url, a.url, b.url]
        copied = session.cookies.copy()
        assert [cookies_module.stamp_of(cookie) for cookie in copied] == origins_of


def setting_each(server: RawServer, count: int) -> list[str]:
    """Items whose answers each set a new cookie (c0, c1, …), then one that sets none."""
    return [f"{server.url}/set-cookie?name=c{n}&value=v{n}" for n in range(count)] + [
        f"{server.url}/last"
    ]


@pytest.mark.parametrize("lane", LANES)
def test_an_origins_cookies_are_bounded_the_oldest_going_first(
    origins: tuple[RawServer, RawServer], lane: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A server that sets a new cookie on every answer: past the bound, the least recently set
    goes (from the run's jar and the session's alike), and a cookie over 4096 bytes is not
    kept. Fails on the old code: every cookie ever set went back, the big one too."""
    monkeypatch.setattr(cookies_module, "MAX_COOKIES_PER_ORIGIN", 5)
    a, _ = origins
    big = f"{a.url}/set-cookie?name=big&value={'x' * 4096}"
    session = session_for(lane)
    run([big, *map(item_for(lane), setting_each(a, 8))], session=session)
    assert seen(a)[-1] == ("/last", ["; ".join(f"c{n}=v{n}" for n in range(3, 8))])
    if isinstance(session, requests.Session):
        assert sorted(cookie.name for cookie in session.cookies) == [f"c{n}" for n in range(3, 8)]


def test_the_bound_is_180_cookies_an_origin(origins: tuple[RawServer, RawServer]) -> None:
    a, _ = origins
    run(setting_each(a, 190))
    (sent,) = seen(a)[-1][1]
    assert sent == "; ".join(f"c{n}=v{n}" for n in range(10, 190))


def test_a_callers_own_policy_still_decides_what_is_kept(
    origins: tuple[RawServer, RawServer],
) -> None:
    """A policy that blocks the host keeps nothing, on the next item or the next hop. (On the
    old code requests kept a redirect's cookie for the next hop: fails there.)"""
    a, _ = origins
    with requests.Session() as session:
        blocking = DefaultCookiePolicy(blocked_domains=["127.0.0.1"])
        session.cookies.set_policy(blocking)
        urls = [
            f"{a.url}/set-and-redirect?name=r&value=1&to={a.url}/final",
            f"{a.url}/set-cookie?name=sid&value=A1",
            f"{a.url}/y",
        ]
        run(urls, session=session)
        assert session.cookies.get_policy() is blocking
        assert len(session.cookies) == 0
    assert seen(a) == [("/set-and-redirect", []), ("/final", []), ("/set-cookie", []), ("/y", [])]


def test_a_second_run_with_the_session_keeps_each_cookie_to_its_origin(
    origins: tuple[RawServer, RawServer],
) -> None:
    """Cookies a run left in the caller's session still go only to their origin in the next
    run with it. Fails on the old code: B got sid=A1."""
    a, b = origins
    with requests.Session() as session:
        run([f"{a.url}/set-cookie?name=sid&value=A1"], session=session)
        run([f"{b.url}/x", f"{a.url}/y"], session=session)
    assert seen(b) == [("/x", [])]
    assert seen(a)[1] == ("/y", ["sid=A1"])


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


@pytest.mark.parametrize("flag", ["--cookies", "--no-cookies"])
def test_the_cli_keeps_cookies_per_origin_or_none(
    origins: tuple[RawServer, RawServer], tmp_path: Path, flag: str
) -> None:
    """Fails on the old code: no such option (exit 2)."""
    a, b = origins
    urls = [f"{a.url}/set-cookie?name=sid&value=A1", f"{b.url}/x", f"{a.url}/y"]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    done = _cli("urls.txt", "-c", "1", "--attempts", "1", "--expect", "text", flag, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert seen(b) == [("/x", [])]
    assert seen(a)[1] == ("/y", ["sid=A1"] if flag == "--cookies" else [])
