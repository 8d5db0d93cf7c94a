"""Differential tests: batchsync puts on the wire exactly what plain ``requests`` would.

Every case sends the same item twice to a recording raw-socket server (``tests.rawserver``):
once through a fresh ``requests.Session().request(...)`` (the reference) and once through
``fetch_all``, and compares the raw bytes of every request the server received (request line,
headers in order and case, body). TLS cases compare outcomes (ok / failed) first, and bytes
when both succeed. The cases of issue 26 compare what the caller observes as well: ``ok``,
``status_code``, ``final_url`` and ``redirects`` with ``r.ok``, ``r.status_code``, ``r.url`` and
``r.history``, ``data`` with ``r.json()`` / ``r.text`` / ``r.content``, and what hooks saw.
"""

from __future__ import annotations

import base64
import contextlib
import difflib
import json
import os
import re
import ssl
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import certifi
import pytest
import requests
import trustme
from urllib3.exceptions import InsecureRequestWarning

from batchsync import Backoff, ResultSet, fetch_all
from batchsync.http import fastlane as transport_module
from batchsync.http.transport import Transport
from tests.rawserver import RawServer

pytestmark = pytest.mark.integration

# Everything in the environment that changes what requests sends or whom it trusts. Each test
# starts without them; a case that needs one sets it.
_ENVIRONMENT = (
    "REQUESTS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "NETRC",
    *(
        name
        for proxy in ("http_proxy", "https_proxy", "all_proxy", "no_proxy")
        for name in (proxy, proxy.upper())
    ),
)

TItem = str | Mapping[str, Any]


@pytest.fixture(autouse=True)
def clean_environment(
    monkeypatch: pytest.MonkeyPatch, tmp_path_factory: pytest.TempPathFactory
) -> None:
    for name in _ENVIRONMENT:
        monkeypatch.delenv(name, raising=False)
    # No ~/.netrc of the machine's either.
    monkeypatch.setenv("HOME", str(tmp_path_factory.mktemp("home")))


@dataclass(frozen=True)
class Call:
    """One ``Session.request`` of the reference run."""

    method: str
    url: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def reference(calls: list[Call], **kwargs: Any) -> list[requests.Response]:
    """The reference run: one fresh Session doing ``calls`` in order, redirects followed."""
    with requests.Session() as session:
        return [
            session.request(call.method, call.url, timeout=10, **call.kwargs, **kwargs)
            for call in calls
        ]


def batch(items: list[TItem], **options: Any) -> ResultSet:
    """The batchsync run: one fresh ``fetch_all``, one worker, one attempt, bytes kept."""
    settings: dict[str, Any] = {"concurrency": 1, "attempts": 1, "expect": "bytes"} | options
    return fetch_all(items, **settings)


@dataclass
class Exchange:
    responses: list[requests.Response]
    results: ResultSet
    expected: list[bytes]  # what the server saw from requests
    seen: list[bytes]  # what the server saw from batchsync


def exchange(
    recorder: RawServer, items: list[TItem], calls: list[Call], **options: Any
) -> Exchange:
    """Both runs against ``recorder``, each with a clean recording."""
    recorder.clear()
    responses = reference(calls)
    expected = recorder.requests()
    recorder.clear()
    results = batch(items, **options)
    seen = recorder.requests()
    recorder.clear()
    return Exchange(responses, results, expected, seen)


def difference(seen: list[bytes], expected: list[bytes]) -> str:
    """The first request that differs, line by line (- requests, + batchsync)."""
    if len(seen) != len(expected):
        return f"batchsync sent {len(seen)} requests, requests {len(expected)}"
    for index, (mine, theirs) in enumerate(zip(seen, expected, strict=True)):
        if mine != theirs:
            diff = difflib.ndiff(
                [repr(line) for line in theirs.split(b"\r\n")],
                [repr(line) for line in mine.split(b"\r\n")],
            )
            changed = [line for line in diff if line[:1] in "-+?"]
            return f"request {index} differs (- requests, + batchsync):\n" + "\n".join(changed)
    return "same"


def assert_same_bytes(done: Exchange) -> None:
    assert done.expected, "the reference run sent nothing: a harness bug"
    assert all(response.ok for response in done.responses)
    assert done.seen == done.expected, difference(done.seen, done.expected)
    assert [r.error for r in done.results if not r.ok] == []


@dataclass(frozen=True)
class Case:
    """Items for fetch_all and the equivalent reference calls. In URLs, ``{base}`` stands for
    the server's URL and ``{port}`` for its port."""

    id: str
    items: list[TItem]
    calls: list[Call]
    host: str = "127.0.0.1"
    # A check on the harness: what the reference's last request must hold.
    reference_has: bytes = b""


def url_case(case_id: str, url: str, host: str = "127.0.0.1", reference_has: bytes = b"") -> Case:
    return Case(case_id, [url], [Call("GET", url)], host, reference_has)


CASES = [
    url_case("plain", "{base}/plain"),
    Case("head", [{"url": "{base}/head", "method": "HEAD"}], [Call("HEAD", "{base}/head")]),
    url_case(
        "credentials",
        "http://user:pw@127.0.0.1:{port}/basic",
        reference_has=b"\r\nAuthorization: Basic dXNlcjpwdw==\r\n",
    ),
    url_case("dot-segments", "{base}/anything/a/../b/./c", reference_has=b"GET /anything/b/c "),
    url_case("percent-escapes", "{base}/p%41th?a=%41&b=%7e", reference_has=b"GET /pAth?a=A&b=~ "),
    url_case("ipv6", "{base}/v6", host="::1"),
    url_case("unicode", "{base}/ünïcode/ä?q=ö"),
    url_case("query", "{base}/q?x=1&y=two&empty="),
    url_case("empty-query", "{base}/ends?"),
    url_case("uppercase-scheme", "HTTP://127.0.0.1:{port}/Up"),
    Case(
        "params",
        [{"url": "{base}/p", "params": {"a": "1", "b": "x y"}}],
        [Call("GET", "{base}/p", {"params": {"a": "1", "b": "x y"}})],
    ),
    Case(
        "headers",
        [{"url": "{base}/h", "headers": {"X-Custom": "1", "Accept": "text/plain"}}],
        [Call("GET", "{base}/h", {"headers": {"X-Custom": "1", "Accept": "text/plain"}})],
    ),
    url_case("redirect", "{base}/redirect?to=/target", reference_has=b"GET /target "),
    Case(
        "cookies",
        ["{base}/set-cookie?name=flavour&value=oat", "{base}/later"],
        [Call("GET", "{base}/set-cookie?name=flavour&value=oat"), Call("GET", "{base}/later")],
        reference_has=b"\r\nCookie: flavour=oat\r\n",
    ),
    Case(
        "post-json",
        [{"url": "{base}/post", "method": "POST", "json": {"a": 1}}],
        [Call("POST", "{base}/post", {"json": {"a": 1}})],
    ),
]


def fill(text: str, recorder: RawServer) -> str:
    return text.replace("{base}", recorder.url).replace("{port}", str(recorder.port))


def filled(case: Case, recorder: RawServer) -> tuple[list[TItem], list[Call]]:
    items: list[TItem] = [
        fill(item, recorder)
        if isinstance(item, str)
        else {**item, "url": fill(item["url"], recorder)}
        for item in case.items
    ]
    calls = [Call(call.method, fill(call.url, recorder), call.kwargs) for call in case.calls]
    return items, calls


def raw_server(host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None) -> RawServer:
    try:
        return RawServer(host, ssl_context)
    except OSError as exc:  # no IPv6 loopback on this machine
        pytest.skip(f"cannot listen on {host}: {exc}")


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_same_bytes_as_requests(case: Case) -> None:
    with raw_server(case.host) as recorder:
        items, calls = filled(case, recorder)
        done = exchange(recorder, items, calls)
        assert case.reference_has in done.expected[-1]
        assert_same_bytes(done)


def test_netrc(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login nu password np\n")
    monkeypatch.setenv("NETRC", str(netrc))
    with raw_server() as recorder:
        url = f"{recorder.url}/netrc"
        done = exchange(recorder, [url], [Call("GET", url)])
        assert b"\r\nAuthorization: Basic " in done.expected[0]  # requests read the file
        assert_same_bytes(done)


def test_proxy_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    with raw_server() as proxy:
        monkeypatch.setenv("HTTP_PROXY", proxy.url)
        url = "http://127.0.0.1:1/via-proxy"  # nothing listens there: only the proxy answers
        done = exchange(proxy, [url], [Call("GET", url)])
        assert done.expected[0].startswith(b"GET http://127.0.0.1:1/via-proxy HTTP/1.1\r\n")
        assert_same_bytes(done)


# -- where the response came from ------------------------------------------------------------


@pytest.mark.parametrize(
    ("path", "redirects"), [("/plain", 0), ("/redirect?to=/target", 1)], ids=["plain", "redirect"]
)
def test_final_url_and_redirects(path: str, redirects: int) -> None:
    with raw_server() as recorder:
        url = recorder.url + path
        done = exchange(recorder, [url], [Call("GET", url)])
        response = done.responses[0]
        assert len(response.history) == redirects
        assert done.results[0].final_url == response.url
        assert done.results[0].redirects == redirects


def test_final_url_masks_the_password() -> None:
    with raw_server() as recorder:
        url = f"http://user:pw@127.0.0.1:{recorder.port}/basic"
        done = exchange(recorder, [url], [Call("GET", url)])
        assert ":pw@" in done.responses[0].url
        assert done.results[0].final_url == done.responses[0].url.replace("user:pw@", "***@")
        assert done.results[0].redirects == 0


# -- the fast lane ---------------------------------------------------------------------------


@pytest.fixture
def session_sends(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The URLs the session prepared a request for: the fast lane prepares none. (Spying on
    ``Session.send`` itself would rightly turn the fast lane off.)"""
    sent: list[str] = []
    original = requests.Session.prepare_request

    def counting(self: requests.Session, request: requests.Request) -> Any:
        sent.append(str(request.url))
        return original(self, request)

    monkeypatch.setattr(requests.Session, "prepare_request", counting)
    return sent


def test_plain_gets_take_the_fast_lane(session_sends: list[str]) -> None:
    with raw_server() as recorder:
        urls = [f"{recorder.url}/fast/{i}" for i in range(20)]
        rs = fetch_all(urls, concurrency=4, attempts=1, expect="bytes")
        assert [r.error for r in rs if not r.ok] == []
        assert len(recorder.requests()) == 20
        assert session_sends == []
        # The counter works: an item with params goes through Session.send.
        assert fetch_all([{"url": f"{recorder.url}/slow", "params": {"a": "1"}}])[0].ok
        assert len(session_sends) == 1


def test_credentials_step_aside_from_the_fast_lane(session_sends: list[str]) -> None:
    with raw_server() as recorder:
        rs = fetch_all([f"http://user:pw@127.0.0.1:{recorder.port}/basic"], attempts=1)
        assert rs[0].ok
        assert len(session_sends) > 0


# -- TLS: whom batchsync trusts --------------------------------------------------------------


@dataclass(frozen=True)
class Authority:
    """A test CA whose certificate is in ``pem`` and a server context with a certificate from
    it for 127.0.0.1 (trusted by nobody unless told)."""

    pem: Path
    server_context: ssl.SSLContext


@pytest.fixture(scope="module")
def authority(tmp_path_factory: pytest.TempPathFactory) -> Authority:
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1", "::1", "localhost").configure_cert(context)
    pem = tmp_path_factory.mktemp("ca") / "ca.pem"
    ca.cert_pem.write_to_path(str(pem))
    return Authority(pem, context)


@pytest.fixture
def tls_server(authority: Authority) -> Iterator[RawServer]:
    with raw_server(ssl_context=authority.server_context) as recorder:
        yield recorder


LANES = ["plain-url", "params"]


def tls_item(recorder: RawServer, lane: str) -> tuple[TItem, Call]:
    """An item and its reference call; a plain URL and an item with params take different
    ways through batchsync (the fast lane, and a request prepared by the session)."""
    if lane == "plain-url":
        url = f"{recorder.url}/tls"
        return url, Call("GET", url)
    params = {"lane": "params"}
    return {"url": f"{recorder.url}/tls", "params": params}, Call(
        "GET", f"{recorder.url}/tls", {"params": params}
    )


def reference_ok(call: Call, **kwargs: Any) -> bool:
    """Whether plain requests succeeds; False only for an SSLError (anything else is a bug)."""
    try:
        reference([call], **kwargs)
    except requests.exceptions.SSLError:
        return False
    return True


def compare_tls(
    recorder: RawServer, lane: str, expect_ok: bool, reference_kwargs: Mapping[str, Any],
    **options: Any,
) -> ResultSet:  # fmt: skip
    """Same outcome as requests (which must be ``expect_ok``), and same bytes when ok."""
    item, call = tls_item(recorder, lane)
    recorder.clear()
    assert reference_ok(call, **reference_kwargs) is expect_ok, "the reference run surprised"
    expected = recorder.requests()
    recorder.clear()
    rs = batch([item], **options)
    seen = recorder.requests()
    assert rs[0].ok is expect_ok, f"{rs[0].error_kind}: {rs[0].error}"
    if expect_ok:
        assert seen == expected, difference(seen, expected)
    return rs


@pytest.mark.parametrize("lane", LANES)
def test_tls_ca_from_requests_ca_bundle(
    lane: str, tls_server: RawServer, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(authority.pem))
    compare_tls(tls_server, lane, True, {})


@pytest.mark.parametrize("lane", LANES)
def test_tls_explicit_verify_wins_over_the_environment(
    lane: str, tls_server: RawServer, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())  # valid, but not our CA
    _, call = tls_item(tls_server, lane)
    assert not reference_ok(call), "the environment's bundle must not trust the test CA"
    compare_tls(tls_server, lane, True, {"verify": str(authority.pem)}, verify=str(authority.pem))


@pytest.mark.parametrize("lane", LANES)
def test_tls_ssl_cert_file_is_not_trusted(
    lane: str, tls_server: RawServer, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    # requests trusts certifi (or REQUESTS_CA_BUNDLE / CURL_CA_BUNDLE), never OpenSSL's
    # SSL_CERT_FILE.
    monkeypatch.setenv("SSL_CERT_FILE", str(authority.pem))
    rs = compare_tls(tls_server, lane, False, {})
    assert rs[0].error_kind == "tls"


@pytest.mark.filterwarnings("ignore::urllib3.exceptions.InsecureRequestWarning")
@pytest.mark.parametrize("lane", LANES)
def test_tls_verify_false(lane: str, tls_server: RawServer) -> None:
    compare_tls(tls_server, lane, True, {"verify": False}, verify=False)


@pytest.mark.parametrize("lane", ["fast", "session"])
def test_verify_false_warns_once_a_run_not_once_a_request(lane: str, tls_server: RawServer) -> None:
    """requests warns at each request; batchsync's docs promise nothing per request: one
    InsecureRequestWarning for the run, and the caller's filters as they were after it."""
    urls: list[TItem] = [f"{tls_server.url}/insecure/{n}" for n in range(4)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        filters = list(warnings.filters)
        session = requests.Session() if lane == "session" else None
        rs = batch(urls, verify=False, concurrency=2, session=session)
        assert warnings.filters == filters
    assert [r.ok for r in rs] == [True] * 4
    insecure = [w for w in caught if issubclass(w.category, InsecureRequestWarning)]
    assert [str(w.message) for w in insecure] == [
        "verify=False: TLS certificates are not checked in this run (said once, not for each "
        "request)"
    ]


@pytest.mark.parametrize("lane", LANES)
def test_tls_unknown_ca_fails_once_as_tls(lane: str, tls_server: RawServer) -> None:
    rs = compare_tls(tls_server, lane, False, {}, attempts=3)
    assert (rs[0].error_kind, rs[0].attempts) == ("tls", 1)


# -- client certificates and the command line --------------------------------------------------


@pytest.fixture(scope="module")
def mutual(tmp_path_factory: pytest.TempPathFactory) -> tuple[Authority, Path, Path]:
    """A server that asks for a client certificate from its CA, and one such certificate's
    certificate and key files."""
    ca = trustme.CA()
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ca.issue_cert("127.0.0.1").configure_cert(context)
    ca.configure_trust(context)
    context.verify_mode = ssl.CERT_REQUIRED
    folder = tmp_path_factory.mktemp("mutual")
    pem, cert, key = folder / "ca.pem", folder / "client.pem", folder / "client.key"
    ca.cert_pem.write_to_path(str(pem))
    client = ca.issue_cert("client@batchsync.test")
    client.cert_chain_pems[0].write_to_path(str(cert))
    client.private_key_pem.write_to_path(str(key))
    return Authority(pem, context), cert, key


@pytest.mark.parametrize("lane", LANES)
def test_tls_client_certificate(lane: str, mutual: tuple[Authority, Path, Path]) -> None:
    authority, cert, key = mutual
    with raw_server(ssl_context=authority.server_context) as recorder:
        ca = str(authority.pem)
        pair = (str(cert), str(key))
        compare_tls(recorder, lane, True, {"verify": ca, "cert": pair}, verify=ca, cert=pair)
        refused = batch([tls_item(recorder, lane)[0]], verify=ca)
        assert not refused[0].ok
        assert refused[0].error_kind in ("tls", "connection")  # the server hangs up


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args, "-q", "--attempts", "1"],
        cwd=cwd, capture_output=True, text=True, timeout=120, check=False, env=dict(os.environ),
    )  # fmt: skip


def test_cli_tls_options(
    tls_server: RawServer, authority: Authority, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", certifi.where())  # the options must win over it
    (tmp_path / "urls.txt").write_text(f"{tls_server.url}/a\n")
    untrusted = cli("urls.txt", cwd=tmp_path)
    assert untrusted.returncode == 1
    result = json.loads((tmp_path / "urls-results.jsonl").read_text())
    assert (result["error_kind"], result["attempts"]) == ("tls", 1)
    assert cli("urls.txt", "--fresh", "--cacert", str(authority.pem), cwd=tmp_path).returncode == 0
    insecure = cli("urls.txt", "--fresh", "--insecure", cwd=tmp_path)
    assert insecure.returncode == 0
    assert "InsecureRequestWarning" not in insecure.stderr
    for wrong in (
        ["--insecure", "--cacert", str(authority.pem)],
        ["--key", str(authority.pem)],
        ["--cacert", str(tmp_path / "missing.pem")],
    ):
        refused = cli("urls.txt", *wrong, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert "Traceback" not in refused.stderr
    assert "--cacert" in cli("--help", cwd=tmp_path).stdout


def test_library_tls_options_are_checked_before_anything_is_sent(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="no CA bundle"):
        fetch_all(["https://127.0.0.1:1/"], verify=str(tmp_path / "missing.pem"))
    with pytest.raises(ValueError, match="no certificate or key file"):
        fetch_all(["https://127.0.0.1:1/"], cert=str(tmp_path / "missing.pem"))


@pytest.mark.parametrize("variable", ["REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"])
def test_a_ca_bundle_the_environment_names_must_be_there(
    variable: str,
    tls_server: RawServer,
    authority: Authority,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """requests raises an OSError naming the path at each https request and still sends plain
    http ones; batchsync ends each https item as a `tls` failure naming the path, not retried,
    and sends the http ones (it had each item end as an `exception`, "internal error:
    OSError", 0 attempts)."""
    missing = str(tmp_path / "gone.pem")
    monkeypatch.setenv(variable, missing)
    url = f"{tls_server.url}/a"
    with pytest.raises(OSError, match=re.escape(missing)):
        reference([Call("GET", url)])
    plain = "http://127.0.0.1:9/never"  # (refused at connect: it is tried, not refused up front)
    for session in (None, requests.Session()):
        rs = fetch_all([url, plain], session=session, attempts=2, timeout=2)
        assert (rs[0].error_kind, rs[0].attempts) == ("tls", 1), rs[0]
        assert missing in (rs[0].error or "")
        assert rs[1].error_kind == "connection"
    assert tls_server.requests() == []
    # Where the variable is not read (a session that does not trust the environment, an
    # explicit verify), it does not matter.
    untrusting = requests.Session()
    untrusting.trust_env = False
    assert batch([url], session=untrusting)[0].error_kind == "tls"  # certifi's bundle
    assert batch([url], verify=str(authority.pem))[0].ok
    (tmp_path / "urls.txt").write_text(url + "\n")
    done = cli("urls.txt", cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    result = json.loads((tmp_path / "urls-results.jsonl").read_text())
    assert result["error_kind"] == "tls" and missing in result["error"]
    assert "Traceback" not in done.stderr


def test_the_fast_lane_survives_forgetting_origins(monkeypatch: pytest.MonkeyPatch) -> None:
    """More origins than the look-up cache keeps, and than the pool manager keeps pools for:
    a request prepared before its origin was forgotten (an item about to retry) still goes."""
    monkeypatch.setattr(transport_module, "_MAX_CACHED_ORIGINS", 4)
    with contextlib.ExitStack() as stack:
        servers = [stack.enter_context(raw_server()) for _ in range(12)]
        transport = Transport(None, 1)
        headers = transport.headers_with()
        wires = [transport.wire("GET", f"{s.url}/many/{i}", headers) for i, s in enumerate(servers)]
        try:
            for wire in wires:
                assert wire is not None
                reply = transport.send(wire, time.monotonic() + 10)
                assert (
                    reply.status,
                    bytes(transport.read_body(reply, time.monotonic() + 10, 99)),
                ) == (
                    200,
                    b'{"ok": true}',
                )
        finally:
            transport.close()
        assert [len(s.requests()) for s in servers] == [1] * 12


# -- what an adversarial review found ----------------------------------------------------------


FOUND_CASES = [
    Case(  # a cookie set on the requests path, then a plain URL (a login, then GETs)
        "cookie-from-a-prepared-request",
        [{"url": "{base}/set-cookie?name=sid&value=abc", "params": {"a": "1"}}, "{base}/later"],
        [
            Call("GET", "{base}/set-cookie?name=sid&value=abc", {"params": {"a": "1"}}),
            Call("GET", "{base}/later"),
        ],
        reference_has=b"\r\nCookie: sid=abc\r\n",
    ),
    Case(  # a None value leaves the header out, as in requests
        "none-header",
        [{"url": "{base}/h", "headers": {"Accept": None, "X-A": "1"}}],
        [Call("GET", "{base}/h", {"headers": {"Accept": None, "X-A": "1"}})],
    ),
]


@pytest.mark.parametrize("case", FOUND_CASES, ids=[case.id for case in FOUND_CASES])
def test_same_bytes_as_requests_found_by_review(case: Case) -> None:
    test_same_bytes_as_requests(case)


@pytest.mark.parametrize("lane", ["fast", "requests"])
def test_a_retry_carries_the_cookie_its_first_try_was_given(lane: str) -> None:
    """A new request would carry it: so does the retry of one prepared before it came."""
    with raw_server() as recorder:
        url = f"{recorder.url}/cookie-gate?name=sid&value=abc"
        item: TItem = url if lane == "fast" else {"url": url, "params": {"a": "1"}}
        rs = fetch_all([item], attempts=2, backoff=Backoff(base=0.01, jitter=0))
        seen = recorder.requests()
    assert [r.status_code for r in rs] == [200]
    assert len(seen) == 2 and b"\r\nCookie: sid=abc\r\n" in seen[1]


def two_servers_exchange(items: list[TItem], calls: list[Call]) -> tuple[Any, Any]:
    """Both runs against two recorders (the second is ``{other}``); each recorder's bytes."""
    with raw_server() as first, raw_server() as second:

        def filled_url(url: str) -> str:
            return fill(url, first).replace("{other}", second.url)

        batch_items: list[TItem] = [
            filled_url(i) if isinstance(i, str) else {**i, "url": filled_url(i["url"])}
            for i in items
        ]
        reference([Call(c.method, filled_url(c.url), c.kwargs) for c in calls])
        expected = (first.requests(), second.requests())
        first.clear()
        second.clear()
        rs = batch(batch_items)
        assert [r.error for r in rs if not r.ok] == []
        return expected, (first.requests(), second.requests())


def test_a_redirect_to_another_port_keeps_what_requests_rebuilds(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests strips auth on a redirect to another origin, then adds the new one's from
    .netrc: batchsync must not strip that again. Cookies, which ignore ports in requests, are
    one jar per origin in batchsync: the one set by the first port stays there."""
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login nu password np\n")
    monkeypatch.setenv("NETRC", str(netrc))
    items: list[TItem] = [
        "{base}/set-cookie?name=flavour&value=oat",
        "{base}/redirect?to={other}/landed",
    ]
    calls = [Call("GET", url) for url in items if isinstance(url, str)]
    expected, seen = two_servers_exchange(items, calls)
    assert b"\r\nAuthorization: Basic " in expected[1][0]
    assert b"\r\nCookie: flavour=oat\r\n" in expected[1][0]
    assert seen[0] == expected[0]
    assert seen[1][0] == expected[1][0].replace(b"Cookie: flavour=oat\r\n", b"")


def test_batch_headers_still_stay_off_other_origins() -> None:
    with raw_server() as first, raw_server() as second:
        url = f"{first.url}/redirect?to={second.url}/landed"
        rs = batch([url], headers={"X-Api-Key": "k1", "Authorization": "Bearer t1"})
        assert rs[0].ok and rs[0].redirects == 1
        assert b"X-Api-Key" in first.requests()[0]
        landed = second.requests()[0]
        assert b"X-Api-Key" not in landed and b"Bearer t1" not in landed


def test_a_wrapped_session_send_sees_every_request(monkeypatch: pytest.MonkeyPatch) -> None:
    """Instrumentation (OpenTelemetry's for requests) wraps Session.send to add headers."""
    original = requests.Session.send

    def traced(self: requests.Session, request: requests.PreparedRequest, **kwargs: Any) -> Any:
        request.headers["traceparent"] = "00-trace-span-01"
        return original(self, request, **kwargs)

    monkeypatch.setattr(requests.Session, "send", traced)
    with raw_server() as recorder:
        assert batch([f"{recorder.url}/traced"])[0].ok
        assert b"\r\ntraceparent: 00-trace-span-01\r\n" in recorder.requests()[0]


def test_a_factory_may_hand_out_one_session() -> None:
    shared = requests.Session()
    with raw_server() as recorder:
        urls = [f"{recorder.url}/shared/{i}" for i in range(6)]
        rs = fetch_all(urls, concurrency=3, session=lambda: shared)
    assert [r.error for r in rs if not r.ok] == []


def test_final_url_is_the_same_whichever_lane() -> None:
    with raw_server() as recorder:
        for path in ("?q=1#frag", "/p#frag", "", "/P/q?x=1"):
            url = f"HTTP://127.0.0.1:{recorder.port}{path}"
            response = reference([Call("GET", url)])[0]
            lanes = batch([url, {"url": url, "params": {}}], concurrency=2)
            assert [r.final_url for r in lanes] == [response.url] * 2, url


@pytest.mark.parametrize("lane", LANES)
def test_tls_verify_true_in_so_many_words_means_certifi(
    lane: str, tls_server: RawServer, authority: Authority, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("REQUESTS_CA_BUNDLE", str(authority.pem))
    item, _ = tls_item(tls_server, lane)
    assert batch([item])[0].ok  # the environment's bundle, as in requests
    rs = batch([item], verify=True)  # explicit: certifi, which does not know the test CA
    assert rs[0].error_kind == "tls"


class ContextAdapter(requests.adapters.HTTPAdapter):
    """The usual recipe for an adapter with its own TLS settings."""

    def __init__(self, context: ssl.SSLContext) -> None:
        self.ssl_context = context
        super().__init__()

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["ssl_context"] = self.ssl_context
        super().init_poolmanager(*args, **kwargs)


def test_an_adapters_own_tls_context_is_kept(tls_server: RawServer, authority: Authority) -> None:
    context = ssl.create_default_context(cafile=str(authority.pem))
    session = requests.Session()
    session.trust_env = False
    session.mount("https://", ContextAdapter(context))
    url = f"{tls_server.url}/own-context"
    assert session.get(url, timeout=10).ok  # requests trusts it through the adapter
    rs = batch([url, {"url": url, "params": {"a": "1"}}], session=session, concurrency=2)
    assert [r.error for r in rs if not r.ok] == []
    assert session.adapters["https://"].ssl_context is context  # type: ignore[attr-defined]


# -- what the caller observes (issue 26) -------------------------------------------------------


def observed(response: requests.Response) -> tuple[bool, int, str, int]:
    """What a requests caller sees of a response: ok, status, final URL, redirects."""
    return response.ok, response.status_code, response.url, len(response.history)


def result_observed(rs: ResultSet, index: int = 0) -> tuple[bool, int | None, str | None, int]:
    result = rs[index]
    return result.ok, result.status_code, result.final_url, result.redirects


def test_head_of_a_large_file_has_no_body_to_bound() -> None:
    """A HEAD's Content-Length describes a body that never comes: max_bytes does not apply."""
    with raw_server() as recorder:
        url = f"{recorder.url}/sized?bytes={40 * 2**20}"
        done = exchange(recorder, [{"url": url, "method": "HEAD"}], [Call("HEAD", url)])
        assert done.responses[0].headers["Content-Length"] == str(40 * 2**20)
        assert result_observed(done.results) == observed(done.responses[0])
        assert done.results[0].data is None
        assert_same_bytes(done)
        # a GET of it is still bounded by its declared length, before any byte of it is read
        refused = batch([url], max_bytes=1000)
        assert refused[0].error_kind == "invalid_body"


@pytest.mark.parametrize("lane", LANES)
@pytest.mark.parametrize("status", [300, 301, 302, 303, 304, 305, 307, 308])
def test_a_3xx_without_location_is_an_answer(status: int, lane: str) -> None:
    """Nothing to follow: requests hands the 3xx over as it came, ``r.ok`` True."""
    with raw_server() as recorder:
        url = f"{recorder.url}/status/{status}"
        item: TItem = url if lane == "plain-url" else {"url": url, "params": {"lane": lane}}
        call = Call("GET", url, {} if lane == "plain-url" else {"params": {"lane": lane}})
        done = exchange(recorder, [item], [call], expect="json")
        response = done.responses[0]
        assert result_observed(done.results) == observed(response) == (
            True, status, response.url, 0,
        )  # fmt: skip
        assert done.results[0].data == (None if status == 304 else response.json())
        assert done.seen == done.expected, difference(done.seen, done.expected)


def test_a_407_to_connect_is_final(monkeypatch: pytest.MonkeyPatch) -> None:
    """The proxy refused the tunnel: requests raises ProxyError; trying again is no use."""
    with raw_server() as proxy:
        monkeypatch.setenv("HTTPS_PROXY", proxy.url)
        url = "https://127.0.0.1:1/tunnel"  # nothing listens there: only the proxy answers
        with pytest.raises(requests.exceptions.ProxyError, match="407"):
            reference([Call("GET", url)])
        proxy.clear()
        rs = batch([url], attempts=3, backoff=Backoff(base=0.01, jitter=0))
        assert (rs[0].ok, rs[0].error_kind, rs[0].status_code, rs[0].attempts) == (
            False, "status", 407, 1,
        )  # fmt: skip
        assert rs[0].final_url is None  # the answer came from the proxy, not from the URL
        assert [head.split(b" ")[:2] for head in proxy.requests()] == [[b"CONNECT", b"127.0.0.1:1"]]


def hooked_session(*hooks: Any) -> requests.Session:
    session = requests.Session()
    session.hooks["response"] = list(hooks)
    return session


@pytest.mark.parametrize("path", ["/status/503", "/redirect?to=/status/503"])
def test_a_hooks_raise_for_status_is_judged_by_the_status(path: str) -> None:
    """requests raises the hook's HTTPError; batchsync judges its response: 503 is retried."""

    def raise_for_status(response: requests.Response, *args: Any, **kwargs: Any) -> None:
        response.raise_for_status()

    with raw_server() as recorder:
        url = recorder.url + path
        with (
            hooked_session(raise_for_status) as session,
            pytest.raises(requests.HTTPError) as raised,
        ):
            session.get(url, timeout=10)
        answer = raised.value.response
        assert answer is not None and answer.status_code == 503
        rs = batch(
            [url], session=hooked_session(raise_for_status), attempts=2,
            backoff=Backoff(base=0.01, jitter=0),
        )  # fmt: skip
        assert (rs[0].ok, rs[0].error_kind, rs[0].status_code, rs[0].attempts) == (
            False, "status", 503, 2,
        )  # fmt: skip
        assert (rs[0].final_url, rs[0].redirects) == (answer.url, path.count("redirect"))


PROXY_AUTHORIZATION = b"\r\nProxy-Authorization: Basic cHVzZXI6cHBhc3M=\r\n"


@pytest.mark.parametrize("start", ["proxied", "direct"])
def test_a_redirect_hop_goes_through_the_proxy_requests_uses(
    start: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """requests keeps the first request's proxy for a hop to a NO_PROXY host (and takes the
    environment's for a hop from one): the same hops through the same proxy, and the proxy's
    credentials never reach the origin."""
    with raw_server() as proxy, raw_server() as origin:
        monkeypatch.setenv("HTTP_PROXY", f"http://puser:ppass@127.0.0.1:{proxy.port}")
        monkeypatch.setenv("NO_PROXY", "127.0.0.1")
        if start == "proxied":  # nothing resolves proxied.test: only the proxy can answer
            url = f"http://proxied.test/redirect?to={origin.url}/landed"
        else:
            url = f"{origin.url}/redirect?to=http://proxied.test/landed"
        for item in (url, {"url": url, "params": {"lane": "requests"}}):
            call = Call("GET", url, {} if isinstance(item, str) else {"params": item["params"]})
            with requests.Session() as session:
                response = session.request(call.method, call.url, timeout=10, **call.kwargs)
            expected = (proxy.requests(), origin.requests())
            proxy.clear()
            origin.clear()
            rs = batch([item])
            seen = (proxy.requests(), origin.requests())
            proxy.clear()
            origin.clear()
            assert result_observed(rs) == observed(response) == (True, 200, response.url, 1)
            assert len(expected[0]) == 2 if start == "proxied" else 1
            assert all(PROXY_AUTHORIZATION in head for head in expected[0])
            assert seen == expected, difference(seen[0] + seen[1], expected[0] + expected[1])
            assert not any(b"Proxy-Authorization" in head for head in seen[1])


def test_proxy_credentials_never_reach_an_origin_server() -> None:
    """A session whose proxies exempt a host with an empty entry: requests adds the proxy's
    Proxy-Authorization on the hop to it, then sends it there directly. batchsync leaves it
    out (a documented difference, docs/fidelity.md); the rest of the request is the same."""
    with raw_server() as proxy, raw_server() as origin:

        def session() -> requests.Session:
            made = requests.Session()
            made.proxies = {
                "http": f"http://puser:ppass@127.0.0.1:{proxy.port}",
                "http://127.0.0.1": "",
            }
            return made

        url = f"http://proxied.test/redirect?to={origin.url}/landed"
        with session() as reference_session:
            response = reference_session.get(url, timeout=10)
        expected = (proxy.requests(), origin.requests())
        proxy.clear()
        origin.clear()
        rs = batch([url], session=session)
        seen = (proxy.requests(), origin.requests())
        assert result_observed(rs) == observed(response) == (True, 200, response.url, 1)
        assert PROXY_AUTHORIZATION in expected[1][0]  # requests' own leak, still there
        assert seen[0] == expected[0]
        assert seen[1] == [expected[1][0].replace(PROXY_AUTHORIZATION, b"\r\n")]


RUN_HEADERS = {"X-Api-Key": "k1", "User-Agent": "mine/1", "accept": "application/json"}


@pytest.mark.parametrize("lane", LANES)
def test_run_headers_leave_a_redirect_to_another_origin_as_requests_sends_it_without_them(
    lane: str,
) -> None:
    """``-H`` / ``headers=`` go only to the item's origin (a documented difference: requests
    keeps them); the hop elsewhere is the one requests sends without them, its User-Agent and
    Accept included, never urllib3's bare defaults."""
    with raw_server() as first, raw_server() as second:
        url = f"{first.url}/redirect?to={second.url}/landed"
        params = {} if lane == "plain-url" else {"params": {"lane": lane}}
        item: TItem = url if lane == "plain-url" else {"url": url, **params}
        reference([Call("GET", url, {"headers": RUN_HEADERS, **params})])
        assert b"\r\nX-Api-Key: k1\r\n" in second.requests()[0]  # requests keeps them
        expected_first = first.requests()
        first.clear()
        second.clear()
        reference([Call("GET", url, params)])
        expected_hop = second.requests()
        first.clear()
        second.clear()
        rs = batch([item], headers=RUN_HEADERS)
        assert result_observed(rs) == (True, 200, f"{second.url}/landed", 1)
        assert first.requests() == expected_first, difference(first.requests(), expected_first)
        assert second.requests() == expected_hop, difference(second.requests(), expected_hop)


@pytest.mark.parametrize("expect", ["json", "text", "bytes"])
def test_a_hook_that_reads_the_body_sees_it_and_so_does_the_caller(expect: str) -> None:
    """A session response hook reading ``r.content`` (as requests_toolbelt's dump_all does):
    hooks see every response's body, the redirect's too, and the caller still gets it."""
    with raw_server() as recorder:
        urls = [f"{recorder.url}/plain", f"{recorder.url}/redirect?to=/target"]
        calls = [Call("GET", url) for url in urls]

        def reading(seen: list[tuple[int, bytes]]) -> requests.Session:
            def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
                seen.append((response.status_code, response.content))

            return hooked_session(hook)

        theirs: list[tuple[int, bytes]] = []
        with reading(theirs) as session:
            responses = [session.get(call.url, timeout=10) for call in calls]
        expected = recorder.requests()
        recorder.clear()
        mine: list[tuple[int, bytes]] = []
        rs = batch([*urls], session=reading(mine), expect=expect)
        for index, response in enumerate(responses):
            assert result_observed(rs, index) == observed(response)
            data = {
                "json": response.json(),
                "text": response.text,
                "bytes": base64.b64encode(response.content).decode(),
            }
            assert rs[index].data == data[expect]
        assert mine == theirs == [
            (200, b'{"ok": true}'), (302, b"redirecting"), (200, b'{"ok": true}'),
        ]  # fmt: skip
        assert recorder.requests() == expected
        # what a hook read is still bounded by max_bytes
        bounded = batch([urls[0]], session=reading([]), expect=expect, max_bytes=5)
        assert (bounded[0].error_kind, bounded[0].status_code) == ("invalid_body", 200)
