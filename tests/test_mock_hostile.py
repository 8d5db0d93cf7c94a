"""The bundled mock server's hostile answers that issue 26's rows need, for users' tests too:
each gives what plain `requests` gives (a HEAD of a large file, a 3xx with nothing to follow,
a proxy refusing a tunnel)."""

from __future__ import annotations

import pytest
import requests

from batchsync import fetch_all

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration


def test_a_head_of_a_large_file_is_ok(server: MockServerProcess) -> None:
    url = f"{server.url}/sized?bytes={40 * 2**20}"
    assert requests.head(url, timeout=10).status_code == 200
    rs = fetch_all([{"url": url, "method": "HEAD"}], expect="bytes", progress=False)
    assert rs[0].ok and rs[0].status_code == 200, rs[0].error


@pytest.mark.parametrize("code", [300, 301, 304])
def test_a_3xx_with_nothing_to_follow_is_an_answer(server: MockServerProcess, code: int) -> None:
    url = f"{server.url}/status/{code}"
    assert requests.get(url, timeout=10).ok
    rs = fetch_all([url], expect="text", progress=False)
    assert rs[0].ok and rs[0].status_code == code, rs[0].error


def test_a_proxy_refusing_the_tunnel_ends_the_item_at_once(server: MockServerProcess) -> None:
    session = requests.Session()
    session.trust_env = False
    session.proxies = {"https": server.url}
    with pytest.raises(requests.exceptions.ProxyError):
        session.get("https://127.0.0.1:1/x", timeout=10)
    rs = fetch_all(["https://127.0.0.1:1/x"], session=session, progress=False)
    assert (rs[0].error_kind, rs[0].status_code, rs[0].attempts) == ("status", 407, 1)
