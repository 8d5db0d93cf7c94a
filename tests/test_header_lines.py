"""The fast lane's savings on header lines never change a byte or skip a caller's own code.

A run keeps the header lines urllib3 and http.client made (``connections._Tracked.putheader``)
and reads a plain answer's headers without urllib3's checks (``headers.QUICK_GETRESPONSE``);
each steps aside for a connection class or a patch of the caller's, as plain requests would
have run it.
"""

from __future__ import annotations

import http.client
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import requests
import urllib3.connection
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool

from batchsync import fetch_all
from batchsync.http.transport import Transport
from tests.rawserver import RawServer

ROOT = Path(__file__).resolve().parent.parent


class _Signer(http.client.HTTPConnection):
    """A caller's layer below urllib3's ``putheader``: it signs for its own origin alone and
    numbers every nonce, so that a line it made is never the same twice."""

    numbers = itertools.count(1)

    def putheader(self, header: str | bytes, *values: Any) -> None:
        if header == "Authorization" and values == ("SIGN-ME",):
            values = ("Bearer SECRET-FOR-A",)
        if header == "X-Nonce":
            values = (f"{values[0]}-{next(self.numbers)}",)
        super().putheader(header, *values)


class _SignedConnection(urllib3.connection.HTTPConnection, _Signer):  # type: ignore[misc]
    pass


class _SignedPool(HTTPConnectionPool):
    ConnectionCls = _SignedConnection


def _lines(server: RawServer, name: bytes) -> list[bytes]:
    return [
        line for head in server.requests() for line in head.split(b"\r\n") if line.startswith(name)
    ]


def test_a_connection_class_of_its_own_makes_each_line_and_none_reaches_another_origin() -> None:
    """A signing layer mounted for origin A: its lines are made on every request (a fresh
    nonce each), and origin B, on the stock adapter, gets what the item gave, never A's
    credential."""
    with RawServer() as a, RawServer() as b:
        session = requests.Session()
        signed = HTTPAdapter()
        signed.poolmanager.pool_classes_by_scheme = {"http": _SignedPool}
        session.mount(a.url + "/", signed)
        items = [
            *({"url": f"{a.url}/x", "headers": {"X-Nonce": "n", "Authorization": "SIGN-ME"}}
              for _ in range(3)),
            {"url": f"{b.url}/y", "headers": {"X-Nonce": "n", "Authorization": "SIGN-ME"}},
        ]  # fmt: skip
        results = fetch_all(items, session=session, concurrency=1)
        assert [result.ok for result in results] == [True] * 4
        nonces = _lines(a, b"X-Nonce")
        assert len(nonces) == 3 and len(set(nonces)) == 3
        assert _lines(b, b"Authorization") == [b"Authorization: SIGN-ME"]
        assert _lines(b, b"X-Nonce") == [b"X-Nonce: n"]


def _send(transport: Transport, url: str, headers: dict[str, str]) -> None:
    wire = transport.wire("GET", url, transport.headers_with(headers))
    assert wire is not None
    end = time.monotonic() + 10
    transport.read_body(transport.send(wire, end), end, 99)
    transport.finish()


def test_long_lines_are_made_each_time_and_never_kept() -> None:
    """A run of long unique values (a signed token per item) keeps nothing of them."""
    with RawServer() as server:
        transport = Transport(None, 1)
        try:
            for n in range(20):
                _send(transport, f"{server.url}/long", {"X-Token": f"{n:04d}" + "t" * 4096})
            kept = transport.ledger.header_lines.copy()
            assert not any(name == "X-Token" for name, _ in kept)
            assert sum(map(len, kept.values())) < 1024
        finally:
            transport.close()
        tokens = _lines(server, b"X-Token")
    assert [token[9:13] for token in tokens] == [f"{n:04d}".encode() for n in range(20)]


def test_a_bytes_value_after_its_text_twin_is_sent_under_python_bb() -> None:
    """Under ``python -bb`` a bytes value is never compared with a kept text line."""
    script = (
        "import requests\n"
        "from batchsync import fetch_all\n"
        "from tests.rawserver import RawServer\n"
        "with RawServer() as server:\n"
        "    session = requests.Session()\n"
        "    session.headers['X-V'] = b'v'\n"
        "    items = [{'url': server.url + '/1', 'headers': {'X-V': 'v'}}, server.url + '/2']\n"
        "    results = fetch_all(items, session=session, concurrency=1)\n"
        "    print([(r.ok, r.error) for r in results])\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-bb", "-c", script], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120, check=True,
    ).stdout  # fmt: skip
    assert shown.strip() == "[(True, None), (True, None)]"


def test_a_patched_header_check_of_urllib3s_runs_on_every_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A caller who replaces ``urllib3.connection.assert_header_parsing`` (to quiet its
    warnings, say) after batchsync was imported has it run on each answer, as urllib3 would."""
    checked: list[object] = []
    monkeypatch.setattr(urllib3.connection, "assert_header_parsing", checked.append)
    with RawServer() as server:
        results = fetch_all([f"{server.url}/{n}" for n in range(3)], concurrency=1)
    assert [result.ok for result in results] == [True] * 3
    assert len(checked) == 3


def test_an_urllib3_without_the_normalising_helper_is_imported_and_read_its_own_way() -> None:
    """urllib3 before 2.8 has no ``connection._normalize_header_values`` (setup.cfg admits
    2.6): ``import batchsync`` works, the quick ``getresponse`` steps aside, and each answer's
    headers and body are the ones plain requests reads from the same server."""
    script = """
import inspect, json, textwrap, requests, urllib3.connection
# urllib3 2.6/2.7's getresponse: the header items taken as http.client gives them
source = textwrap.dedent(inspect.getsource(urllib3.connection.HTTPConnection.getresponse))
source = source.replace("_normalize_header_values(httplib_response.msg)",
                        "httplib_response.msg.items()")
source = source.replace("super()", "super(HTTPConnection, self)")
namespace = vars(urllib3.connection)
exec(compile("from __future__ import annotations\\n" + source, "getresponse", "exec"), namespace)
urllib3.connection.HTTPConnection.getresponse = namespace.pop("getresponse")
namespace.pop("_normalize_header_values", None)
from batchsync import fetch_all
from batchsync.http import headers
from tests.rawserver import RawServer
with RawServer() as server:
    urls = [f"{server.url}/{n}" for n in range(3)] + [f"{server.url}/set-cookie?name=a&value=b"]
    plain = [requests.get(url) for url in urls]
    results = fetch_all(urls, concurrency=2, expect="text")
print(json.dumps({
    "quick": headers.QUICK_GETRESPONSE is not None or headers.quick_getresponse_in_effect(),
    "same": [r.ok and r.status_code == p.status_code and r.data == p.text
             for r, p in zip(results, plain, strict=True)],
}))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    shown = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout) == {"quick": False, "same": [True] * 4}
