"""Transport policy that needs no socket."""

from __future__ import annotations

import time
from urllib.parse import urlsplit

import pytest
import requests
from hypothesis import given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict
from requests.utils import default_headers
from urllib3.connection import HTTPConnection

from batchsync.core.redact import Secrets
from batchsync.http.connections import ConnectionLedger
from batchsync.http.exchange import BodyReader, Recipe, Wire, _passes_end
from batchsync.http.fastlane import FastLane, lane_split
from batchsync.http.origins import host_key, host_of
from batchsync.http.session import SessionLane, leave_origin
from batchsync.http.transport import Lane, Transport
from tests.rawserver import RawServer


@pytest.mark.parametrize(
    ("timeout", "left", "passes"),
    [
        (None, 5.0, True),  # a blocking socket always gets a timeout
        (10.0, 10.0, False),  # the reply came at once: the send-time timeout still fits
        (10.0, 9.85, False),  # 0.15 s over: within 2 % of the attempt's 10 s
        (10.0, 9.7, True),  # late headers: re-arm to the time left
        (1.0, 0.97, False),  # within the 50 ms floor
        (1.0, 0.94, True),
        (0.5, 3.0, False),  # already shorter than the time left
    ],
)
def test_a_read_timeout_is_re_armed_only_when_it_could_pass_the_attempt_end(
    timeout: float | None, left: float, passes: bool
) -> None:
    assert _passes_end(timeout, left) is passes


# Characters a URL's path and query are drawn from: mostly those sent as they are, and now and
# then one of every other class that requests treats in its own way.
URL_CHARACTERS = list("aZ09-._~!$&'()*+,;=:@/?#" * 8 + '%[] "<>\\^`{|}\x00\x7fé')


@settings(max_examples=600, deadline=None)
@given(
    scheme=st.sampled_from(["http", "https", "HTTP", "ftp"]),
    userinfo=st.sampled_from(["", "u:p@", "u@", ":@"]),
    host=st.sampled_from(["h.test", "H.Test", "127.0.0.1", "[::1]", ".h", "h..t", "-h", "é.test"]),
    port=st.sampled_from(["", ":8080", ":80", ":", ":0", ":99999", ":08"]),
    rest=st.tuples(st.sampled_from(["", "/", "?", "#"]), st.text(URL_CHARACTERS, max_size=24)),
)
def test_the_fast_lane_takes_only_urls_that_requests_sends_unchanged(
    scheme: str, userinfo: str, host: str, port: str, rest: tuple[str, str]
) -> None:
    url = f"{scheme}://{userinfo}{host}{port}{''.join(rest)}"
    split = lane_split(url)
    if split is None:
        return
    (lane_scheme, lane_host, lane_port), target = split
    prepared = requests.Request("GET", url).prepare()  # must not raise: requests takes it
    assert prepared.url == url  # sent and reported as written (Result.final_url)
    assert (prepared.path_url, "Authorization" in prepared.headers) == (target, False)
    parts = urlsplit(prepared.url)
    assert (parts.scheme, parts.hostname, parts.port) == (lane_scheme, lane_host, lane_port)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8080/ok",
        "https://api.example.com/v2/customers/42/orders?since=2024-01-01&page=3",
        "http://h.test/a/b.json?x=1&y=a,b;c=d:e@f/g?h",
        "http://h.test/",
        "http://h.test/p/.hidden/..x",
    ],
)
def test_common_urls_take_the_fast_lane(url: str) -> None:
    assert lane_split(url) is not None


@pytest.mark.parametrize(
    "url",
    [
        "http://user:pw@h.test/",  # requests sends Basic auth
        "http://h.test/anything/a/../b/./c",  # requests removes dot segments
        "http://h.test/p?a=%41",  # requests unquotes unreserved escapes
        "http://h.test/p?",  # requests drops an empty query
        "http://h.test",  # requests adds the path
        "http://H.test/",  # requests writes the host in lower case
        "http://h.test:080/",  # requests drops the zero
        "http://h.test/p#section",  # requests' URL keeps it, its target does not
        "http://[::1]:8080/",
        "http://h.test/ünï",
        "http://h.test/a b",
    ],
)
def test_urls_that_requests_rewrites_step_aside(url: str) -> None:
    assert lane_split(url) is None


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("http://H.test/x", "h.test"),
        ("http://h.test:80/x", "h.test"),
        ("https://h.test:443/x", "h.test"),
        ("http://h.test:8080/x", "h.test:8080"),
        ("https://h.test:80/x", "h.test:80"),
        ("http://[::1]:8080/x", "[::1]:8080"),
        ("http://[::1]/x", "[::1]"),
        ("http://u:p@h.test:8080/x", "h.test:8080"),
    ],
)
def test_one_host_key_whichever_lane(url: str, key: str) -> None:
    assert host_of(url) == key
    split = lane_split(url)
    if split is not None:
        assert host_key(*split[0]) == key


def test_leaving_the_origin_drops_secrets_and_puts_the_sessions_defaults_back() -> None:
    headers: CaseInsensitiveDict[str | bytes] = CaseInsensitiveDict(
        {"user-agent": "mine/1", "Accept": "a/b", "X-Api-Key": "k1", "X-Kept": "1", "Extra": "e"}
    )
    declared = {"user-agent", "accept", "x-api-key", "extra"}
    defaults = default_headers()
    del defaults["Accept"]  # a session without one: nothing stands in its place
    defaults["Extra"] = "session"  # not one of requests' defaults: a secret name still goes
    leave_origin(headers, lambda name: name.lower() in declared, defaults)
    assert list(headers.items()) == [("User-Agent", defaults["User-Agent"]), ("X-Kept", "1")]


def test_both_lanes_send_the_same_request_through_the_one_interface() -> None:
    """The fast lane and the requests way are each a ``Lane`` (mypy checks the assignments),
    and the same GET sent through either puts the same bytes on the wire and reads the same
    answer."""
    ledger = ConnectionLedger()
    reader = BodyReader(ledger.watchdog, time.monotonic)
    sessions = SessionLane(None, pool_size=1, secrets=Secrets(), ledger=ledger, reader=reader)
    fast = FastLane(sessions, reader)
    recipe_lane: Lane[Recipe] = sessions
    wire_lane: Lane[Wire] = fast
    try:
        with RawServer() as server:
            url = f"{server.url}/lanes?n=1"
            wire = fast.wire("GET", url, sessions.headers_with())
            assert wire is not None
            recipe = sessions.prepare(requests.Request("GET", url))
            end = time.monotonic() + 10
            replies = [wire_lane.send(wire, end)]
            answers = [(replies[0].status, replies[0].url, bytes(reader.read(replies[0], end, 99)))]
            ledger.watchdog.disarm()
            replies.append(recipe_lane.send(recipe, end))
            answers.append(
                (replies[1].status, replies[1].url, bytes(reader.read(replies[1], end, 99)))
            )
            ledger.watchdog.disarm()
            first, second = server.requests()
    finally:
        ledger.watchdog.close()
        sessions.close()
    assert answers[0] == answers[1] == (200, url, b'{"ok": true}')
    assert first == second


def test_a_header_line_made_once_a_run_puts_the_same_bytes_and_steps_aside_for_a_patch(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The second request's header lines come from the run's kept lines: the bytes are those
    of the first and of plain requests; a patched ``putheader`` sees every header again."""
    seen: list[str] = []
    stock = HTTPConnection.putheader

    def watched(self: HTTPConnection, header: str, *values: str) -> None:
        seen.append(header)
        stock(self, header, *values)

    with RawServer() as server:
        transport = Transport(None, 1)
        try:
            for n in range(3):
                if n == 2:
                    monkeypatch.setattr(HTTPConnection, "putheader", watched)
                wire = transport.wire("GET", f"{server.url}/same", transport.headers_with())
                assert wire is not None
                end = time.monotonic() + 10
                transport.read_body(transport.send(wire, end), end, 99)
                transport.finish()
                assert len(transport.ledger.header_lines) == 5  # (Host and the session's four)
        finally:
            transport.close()
        monkeypatch.undo()
        requests.get(f"{server.url}/same", timeout=10).close()
        sent = server.requests()
    assert len(set(sent)) == 1 and len(sent) == 4
    assert [name.lower() for name in seen] == [
        "host",
        "user-agent",
        "accept-encoding",
        "accept",
        "connection",
    ]
