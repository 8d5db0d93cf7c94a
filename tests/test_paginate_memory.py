"""A paginated item holds what it pages: its peak memory stays within a small multiple of
max_bytes, whatever the pages' records (issue 34: 15x for tiny records before)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import tracemalloc
from typing import Any

import pytest

from batchsync import fetch_all
from batchsync.http.paginate import HELD_SHARE, held_size

from .mockserver import ROOT, MockServerProcess

# The peak an item may reach, as a multiple of max_bytes (see paginate.HELD_SHARE): its
# pages decoded, within 2 x max_bytes, and the page in flight (body, text and value).
PEAK_SHARE = 3
MAX_BYTES = 16 * 2**20

# In a fresh interpreter: one warm-up run (imports, pools), then the item under tracemalloc.
_MEASURE = textwrap.dedent(
    """
    import json, sys, tracemalloc
    from batchsync import fetch_all
    url, how, max_bytes, items = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4] or None
    fetch_all([url + "&warm=1"], paginate=how, max_pages=2, progress=False)
    tracemalloc.start()
    (result,) = fetch_all([url], paginate=how, max_bytes=max_bytes, page_items=items,
                          progress=False)
    peak = tracemalloc.get_traced_memory()[1]
    print(json.dumps({"peak": peak, "kind": result.error_kind, "error": result.error,
                      "pages": result.pages, "kept": len(result.data or [])}))
    """
)


def peak_of(url: str, how: str, items: str | None) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, url, how, str(MAX_BYTES), items or ""],
        capture_output=True, text=True, timeout=120, check=False, cwd=ROOT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    measured: dict[str, Any] = json.loads(done.stdout.splitlines()[-1])
    return measured


@pytest.mark.integration
@pytest.mark.parametrize("items", [None, "items"], ids=["pages", "records"])
def test_a_paginated_items_peak_stays_within_three_times_max_bytes(
    server: MockServerProcess, items: str | None
) -> None:
    """Pages of tiny records ({"n": i}, about 16 bytes of JSON, 200 decoded) and pages of
    text, served until a bound stops the item: its tracemalloc peak within 3 x max_bytes."""
    tiny = peak_of(f"{server.url}/pages/link/mem?total=100000000&size=5000", "link", items)
    text = peak_of(f"{server.url}/endless-pages?kb=256&x=1", "json:next", items)
    for measured in (tiny, text):
        assert measured["kind"] == "invalid_body", measured
        assert measured["peak"] <= PEAK_SHARE * MAX_BYTES, (measured, measured["peak"] / MAX_BYTES)
    assert "in memory" in tiny["error"]  # the decoded bound stopped it ...
    assert "over max_bytes" in text["error"]  # ... and text-heavy pages go to max_bytes


def test_held_size_is_what_cpython_holds() -> None:
    """The estimate of a decoded page against tracemalloc's count of json.loads, for the
    shapes that weigh most and least: within a fifth either way."""
    shapes: list[Any] = [
        {"items": [{"n": n} for n in range(20000)], "page": 3},
        {"items": [{"n": n, "name": f"row {n}", "ok": True, "x": n / 7} for n in range(5000)]},
        [{} for _ in range(20000)],
        [[n, [n * 1000, None]] for n in range(5000)],
        {"items": [{"pad": "x" * 4096, f"k{n}": n} for n in range(300)]},
        ["é" * 100 for _ in range(2000)],
        "just text " * 1000,
    ]
    for shape in shapes:
        text = json.dumps(shape)
        tracemalloc.start()
        decoded = json.loads(text)
        held = tracemalloc.get_traced_memory()[0]
        tracemalloc.stop()
        assert 0.8 * held <= held_size(decoded) <= 1.2 * held, (text[:80], held_size(decoded), held)
    assert held_size(None) == held_size(True) == held_size(7) == 0


@pytest.mark.integration
def test_pages_of_tiny_records_stop_at_the_decoded_bound(server: MockServerProcess) -> None:
    """The item ends invalid_body with the pages before the one past the bound, as at
    max_bytes; their bodies took far less than max_bytes."""
    max_bytes = 2**20
    url = f"{server.url}/pages/link/held?total=100000000&size=2000"
    (result,) = fetch_all([url], paginate="link", page_items="items", max_bytes=max_bytes,
                          progress=False)  # fmt: skip
    assert result.error_kind == "invalid_body"
    assert result.error is not None and result.pages is not None
    assert result.error.startswith(f"page {result.pages} makes the pages take about ")
    assert f"over {HELD_SHARE} x max_bytes" in result.error
    assert [record["n"] for record in result.data] == list(range(2000 * (result.pages - 1)))
    assert held_size(result.data) <= HELD_SHARE * max_bytes
    assert len(json.dumps(result.data)) < max_bytes / 4
