"""The quick header parser gives the stdlib's HTTPMessage and response state in every case."""

from __future__ import annotations

import email.message
import http.client
import io
from collections.abc import Callable
from typing import Any

import pytest
import requests
import urllib3.connection
from hypothesis import given, settings
from hypothesis import strategies as st
from urllib3 import HTTPHeaderDict
from urllib3.util.response import assert_header_parsing as urllib3_assert_header_parsing

from batchsync import fetch_all
from batchsync.http.headers import (
    QuickHeadersResponse,
    QuickMessage,
    _header_dict,
    _normalize_header_values,
    _quick_begin_of,
    _QuickItems,
    parse_headers,
    quick_path_in_effect,
)
from tests.mockserver import MockServerProcess


def stdlib_message(block: bytes) -> http.client.HTTPMessage:
    return http.client.parse_headers(io.BytesIO(block))


def quick_message(block: bytes) -> http.client.HTTPMessage:
    return parse_headers(io.BytesIO(block))


# The policy object, and the quick message's index of the names it built (see QuickMessage).
_NOT_STATE = {"policy", "_built", "_names"}


def snapshot(message: email.message.Message) -> dict[str, Any]:
    """Everything a message holds, in comparable form (defects by type, parts recursively)."""
    state = {name: value for name, value in vars(message).items() if name not in _NOT_STATE}
    state["defects"] = [type(defect).__name__ for defect in message.defects]
    if isinstance(message._payload, list):  # type: ignore[attr-defined]
        state["_payload"] = [snapshot(part) for part in message._payload]  # type: ignore[attr-defined]
    state["items"] = message.items()
    return state


def looked_up(message: email.message.Message, names: list[str]) -> list[Any]:
    return [(message.get(name), message.get_all(name)) for name in names]


NAMES = ["Content-Type", "content-length", "Set-Cookie", "X-A", "connection", "Transfer-Encoding"]

EXAMPLES = [
    b"Content-Type: application/json\r\nContent-Length: 11\r\n\r\n",
    b"Server: nginx\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-A:  spaced  \r\n\r\n",
    b"X-A:\r\nX-B:\t\ttabbed\n\n",
    b"X-Folded: one\r\n two\r\nX-A: b\r\n\r\n",  # folded: the email parser's way
    b"no colon here\r\nX-A: b\r\n\r\n",  # malformed: the rest becomes the payload
    b": no name\r\n\r\n",
    b"From nobody\r\nX-A: b\r\n\r\n",
    b"X-A: b\r\n",  # stream ended before the blank line
    b"Content-Type: multipart/byteranges; boundary=3d6b6a416f9b5\r\n\r\n",
    b"Content-Type: message/rfc822\r\n\r\n",
    b"X-A: caf\xe9 \x00 \x7f\r\n\r\n",
    b"X-A: b\rX-B: c\r\n\r\n",  # a bare CR is a line break to the email parser
    b"\r\n",
]


@pytest.mark.parametrize("block", EXAMPLES)
def test_message_matches_the_stdlib(block: bytes) -> None:
    expected, quick = stdlib_message(block), quick_message(block)
    assert isinstance(quick, QuickMessage)
    assert snapshot(quick) == snapshot(expected)
    assert looked_up(quick, NAMES) == looked_up(expected, NAMES)


def _renamed(message: email.message.Message) -> None:
    del message["Content-Length"]  # the same count of lines, another name in its place
    message["X-Late"] = "1"


def _replaced(message: email.message.Message) -> None:
    message.replace_header("content-type", "text/plain")


def _added(message: email.message.Message) -> None:
    message["Content-Type"] = "text/html"


def _private_list_changed(message: email.message.Message) -> None:
    message._headers.pop()  # type: ignore[attr-defined]
    message._headers.append(("Transfer-Encoding", "chunked"))  # type: ignore[attr-defined]


@pytest.mark.parametrize("change", [_renamed, _replaced, _added, _private_list_changed])
def test_lookups_after_a_change_match_the_stdlib(change: Callable[..., None]) -> None:
    """The quick look-up's index of names stands only while the header list is as built."""
    block = b"Content-Type: application/json\r\nContent-Length: 11\r\nX-A: b\r\n\r\n"
    expected, quick = stdlib_message(block), quick_message(block)
    names = [*NAMES, "X-Late"]
    assert looked_up(quick, names) == looked_up(expected, names)
    change(expected)
    change(quick)
    assert looked_up(quick, names) == looked_up(expected, names)


def test_plain_headers_take_the_quick_path(monkeypatch: pytest.MonkeyPatch) -> None:
    """The point of the module: a plain block never reaches the email parser."""

    def refuse(*args: object) -> None:
        raise AssertionError("email parser used")

    monkeypatch.setattr("email.parser.Parser.parsestr", refuse)
    message = quick_message(EXAMPLES[1])
    assert message.get_all("Set-Cookie") == ["a=1", "b=2"]
    assert message["x-a"] == "spaced  "


header_line = st.one_of(
    st.builds(
        lambda name, gap, value, end: name + b":" + gap + value + end,
        st.sampled_from([b"X-A", b"content-type", b"Content-Length", b"Set-Cookie", b"A!#~"]),
        st.sampled_from([b"", b" ", b"\t ", b"  "]),
        st.sampled_from([b"", b"b", b"multipart/mixed", b"Message/Http", b"x \t", b"\xff\x01"]),
        st.sampled_from([b"\r\n", b"\n", b"\r", b"\r\r\n"]),
    ),
    st.sampled_from([b" folded\r\n", b"\tfolded\n", b"From x\r\n", b"junk\r\n", b": v\r\n"]),
    st.binary(max_size=12).map(lambda raw: raw.replace(b"\n", b"") + b"\r\n"),
)


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.lists(header_line, max_size=6), st.sampled_from([b"\r\n", b"\n", b""]))
def test_any_header_block_matches_the_stdlib(lines: list[bytes], end: bytes) -> None:
    block = b"".join(lines) + end
    expected, quick = stdlib_message(block), quick_message(block)
    assert snapshot(quick) == snapshot(expected)
    assert looked_up(quick, NAMES) == looked_up(expected, NAMES)


class _Socket:
    def __init__(self, data: bytes) -> None:
        self._data = data

    def makefile(self, mode: str) -> io.BufferedReader:
        return io.BufferedReader(io.BytesIO(self._data))


RESPONSES = [
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\nhello", "GET"),
    (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n5\r\nhello\r\n0\r\n\r\n", "GET"),
    (b"HTTP/1.0 200 OK\r\n\r\nuntil close", "GET"),
    (b"HTTP/1.1 200 OK\r\nConnection: close\r\nContent-Length: 2\r\n\r\nok", "GET"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", "HEAD"),
    (b"HTTP/1.1 204 No Content\r\n\r\n", "GET"),
    (b"HTTP/1.1 100 Continue\r\nX-A: b\r\n\r\nHTTP/1.1 201 OK\r\nContent-Length: 0\r\n\r\n", "GET"),
    (b"HTTP/1.1 200 OK\r\nContent-Length: -3\r\nX-F: a\r\n b\r\n\r\n", "GET"),
]


@pytest.mark.parametrize(("raw", "method"), RESPONSES)
def test_response_state_matches_the_stdlib(raw: bytes, method: str) -> None:
    states = []
    for response_class in (http.client.HTTPResponse, QuickHeadersResponse):
        response = response_class(_Socket(raw), method=method)  # type: ignore[arg-type]
        response.begin()
        fields = (response.status, response.reason, response.version, response.chunked)
        framing = (response.length, response.will_close, response.msg.items(), response.read())
        states.append((fields, framing))
    assert states[0] == states[1]


def test_the_quick_begin_is_in_effect_on_this_python() -> None:
    """It relies on the stdlib's begin reading headers through parse_headers; on a Python
    where that changes, the stdlib's begin is kept and this test says so."""
    assert "parse_headers" in http.client.HTTPResponse.begin.__code__.co_names
    assert quick_path_in_effect()


def begun(raw: bytes) -> http.client.HTTPResponse:
    response = QuickHeadersResponse(_Socket(raw))  # type: ignore[arg-type]
    response.begin()
    return response


MANY_HEADERS = b"HTTP/1.1 200 OK\r\n" + b"X-A: b\r\n" * 150 + b"Content-Length: 0\r\n\r\n"


def test_the_header_limits_apply_as_set_at_call_time(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(http.client.HTTPException, match="got more than 100 headers"):
        begun(MANY_HEADERS)
    monkeypatch.setattr(http.client, "_MAXHEADERS", 1000)  # the usual workaround
    assert len(begun(MANY_HEADERS).msg.get_all("X-A") or ()) == 150
    monkeypatch.setattr(http.client, "_MAXLINE", 20)
    with pytest.raises(http.client.LineTooLong):
        begun(b"HTTP/1.1 200 OK\r\nX-Long: " + b"x" * 30 + b"\r\n\r\n")


@pytest.mark.parametrize("patched", ["parse_headers", "_read_headers"])
def test_a_patched_stdlib_parser_is_honoured(monkeypatch: pytest.MonkeyPatch, patched: str) -> None:
    """Something that replaced the stdlib's header functions sees every response."""
    seen = []
    original = getattr(http.client, patched)

    def spy(*args: Any) -> Any:
        seen.append(patched)
        return original(*args)

    monkeypatch.setattr(http.client, patched, spy)
    assert not quick_path_in_effect()
    assert begun(RESPONSES[0][0]).read() == b"hello"
    assert seen


def test_an_unexpected_begin_keeps_the_stdlib_parser() -> None:
    """The quick begin is built only from a begin of the exact shape it was written for."""

    def begin_with_a_default(self: Any, strict: bool = False) -> None:
        parse_headers(self.fp)

    for shape in (begin_with_a_default, lambda self, *extra: parse_headers(self.fp)):
        assert _quick_begin_of(shape) is None
    assert _quick_begin_of(http.client.HTTPResponse.begin) is not None


@pytest.mark.integration
def test_the_header_limit_workaround_works_end_to_end(
    server: MockServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    url = f"{server.url}/many-headers?n=150"
    refused = fetch_all([url, {"url": url, "params": {"lane": "requests"}}], attempts=1)
    assert [r.error_kind for r in refused] == ["connection", "connection"]
    assert all("got more than 100 headers" in (r.error or "") for r in refused)
    monkeypatch.setattr(http.client, "_MAXHEADERS", 1000)
    accepted = fetch_all([url, {"url": url, "params": {"lane": "requests"}}], attempts=1)
    assert [r.data for r in accepted] == [{"headers": 150}, {"headers": 150}]


def test_real_responses_skip_the_email_parser(
    server: MockServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end, on the fast lane and through a caller's session: no email parsing, and
    the headers requests needs (cookies, redirects) still work."""

    def refuse(*args: object) -> None:
        raise AssertionError("email parser used")

    monkeypatch.setattr("email.parser.Parser.parsestr", refuse)
    target = f"{server.url}/ok/quick"
    items = [
        target,
        f"{server.url}/redirect?to={target}",
        f"{server.url}/set-cookie?name=a&value=1",
    ]
    assert all(result.ok for result in fetch_all(items))
    with requests.Session() as session:
        assert all(result.ok for result in fetch_all(items, session=session))
        assert session.cookies.get("a") == "1"


@pytest.mark.parametrize(
    ("block", "quick"),
    [
        (b"Set-Cookie: a=1\r\nX-A: 1\r\nset-cookie: b=2\r\nContent-Type: text/plain\r\n\r\n", True),
        (b"X-A: 1\r\n folded\r\nX-B: 2\r\n\r\n", False),  # (email.parser's, urllib3's way)
    ],
)
def test_urllib3_gets_the_header_dict_it_builds_itself(block: bytes, quick: bool) -> None:
    """A block read the quick way skips urllib3's checks and copy, and its HTTPHeaderDict is
    the one urllib3 builds, repeated names and all; any other block goes urllib3's way."""
    urllib3_normalize = vars(urllib3.connection).get("_normalize_header_values")
    if urllib3_normalize is None:
        pytest.skip("urllib3 before 2.8 has no _normalize_header_values: nothing to stand in for")
    message = parse_headers(io.BytesIO(block))
    items = _normalize_header_values(message)
    assert (type(items) is _QuickItems) is quick
    stock = parse_headers(io.BytesIO(block))
    urllib3_assert_header_parsing(stock)
    built, expected = _header_dict(items), HTTPHeaderDict(urllib3_normalize(stock))
    assert built._container == expected._container
    assert list(built.items()) == list(expected.items())
