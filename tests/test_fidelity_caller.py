"""Differential tests of what a caller observes, beside ``test_fidelity``'s bytes on the wire:
the same items through plain ``requests`` and through batchsync, comparing what each hands
back (``r.text`` / ``r.json()`` with ``data``)."""

from __future__ import annotations

from typing import Any, Literal
from urllib.parse import urlencode

import pytest
import requests

from batchsync import fetch_all
from tests.mockserver import MockServerProcess

pytestmark = pytest.mark.integration

# (query of /encoded, expect): bodies whose charset is declared, missing or wrong.
BODIES = [
    # text/* without a charset is ISO-8859-1 to requests (RFC 2616), UTF-8 bytes included.
    ("text-latin-1-unlabelled", {"type": "text/plain", "charset": "latin-1"}, "text"),
    ("text-utf-8-unlabelled", {"type": "text/plain"}, "text"),
    ("text-latin-1", {"type": "text/html; charset=iso-8859-1", "charset": "latin-1"}, "text"),
    ("text-unknown-charset", {"type": "text/plain; charset=klingon"}, "text"),  # UTF-8, replaced
    ("octets-as-text", {"type": "application/octet-stream", "charset": "latin-1"}, "text"),
    ("text-no-type", {"charset": "latin-1", "text": "déjà vu, café crème"}, "text"),  # guessed
    ("json-latin-1", {"type": "application/json; charset=iso-8859-1", "charset": "latin-1",
                      "text": '{"name": "café"}'}, "json"),
    ("json-utf-8", {"type": "application/json", "text": '{"name": "café"}'}, "json"),
    ("json-latin-1-unlabelled", {"type": "application/json", "charset": "latin-1",
                                 "text": '{"name": "café"}'}, "json"),  # U+FFFD, as requests
    ("json-utf-16", {"type": "application/json; charset=utf-16", "charset": "utf-16",
                     "text": '{"name": "café"}'}, "json"),
    ("json-as-text-plain", {"type": "text/plain", "charset": "latin-1",
                            "text": '{"name": "café"}'}, "json"),
    ("json-utf-16-le-no-type", {"charset": "utf-16-le", "text": '{"name": "café"}'}, "json"),
    ("json-bom-no-type", {"charset": "utf-8-sig", "text": '{"name": "café"}'}, "json"),
]  # fmt: skip


def reference_data(response: requests.Response, expect: Literal["json", "text"]) -> Any:
    """What a caller of plain requests reads for ``expect``."""
    return response.json() if expect == "json" else response.text


@pytest.mark.parametrize("lane", ["fast", "session"])
@pytest.mark.parametrize(("case", "query", "expect"), BODIES, ids=[case for case, *_ in BODIES])
def test_bodies_decode_as_requests_decodes_them(
    server: MockServerProcess,
    case: str,
    query: dict[str, str],
    expect: Literal["json", "text"],
    lane: str,
) -> None:
    url = f"{server.url}/encoded?{urlencode(query)}"
    with requests.Session() as session:
        expected = reference_data(session.get(url, timeout=10), expect)
        own = session if lane == "session" else None
        (result,) = fetch_all([url], expect=expect, attempts=1, session=own)
    assert (result.ok, result.error) == (True, None)
    assert result.data == expected
