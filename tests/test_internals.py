"""The private parts batchsync reads (``batchsync/http/internals.py``) are checked at import.

A release where a quick path's piece has another shape is imported and run the public way,
with the answers plain requests gives; a release without a hook that has no public way fails
the import, naming the hook. Each case runs in a fresh interpreter, the piece changed (its
work kept, its shape not) before batchsync is imported. (An urllib3 without
``_normalize_header_values``: tests/test_header_lines.py.)
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import urllib3.connection

from batchsync.http import headers, internals

ROOT = Path(__file__).resolve().parent.parent

# Each: what changes the piece's shape, and the adapter's flag that then says "the public way".
RESHAPED = {
    "http.client's _output": (
        "import http.client\n"
        "own = http.client.HTTPConnection._output\n"
        "http.client.HTTPConnection._output = lambda self, s, *more: own(self, s)\n",
        "internals.HEADER_LINES_KEPT",
    ),
    "http.client's _read_headers": (
        "import http.client\n"
        "own = http.client._read_headers\n"
        "http.client._read_headers = lambda fp, *more: own(fp)\n",
        "internals.READ_HEADERS is not None or headers.quick_path_in_effect()",
    ),
}

# Each: what takes the hook away, and the name the import error must give.
HOOKS = {
    "_new_conn": (
        "import urllib3.connection\n"
        "own = urllib3.connection.HTTPConnection._new_conn\n"
        "urllib3.connection.HTTPConnection._new_conn = lambda self, *more: own(self)\n"
    ),
    "_cookies_for_request": (
        "import http.cookiejar\n"
        "own = http.cookiejar.CookieJar._cookies_for_request\n"
        "http.cookiejar.CookieJar._cookies_for_request = lambda self, r, *more: own(self, r)\n"
    ),
}

COMPARE = """
import json, requests
from batchsync import fetch_all
from batchsync.http import headers, internals
from tests.rawserver import RawServer
with RawServer() as server:
    urls = [f"{server.url}/{n}" for n in range(3)] + [f"{server.url}/set-cookie?name=a&value=b"]
    plain = [requests.get(url) for url in urls]
    results = fetch_all(urls, concurrency=2, expect="text")
print(json.dumps({
    "quick": bool(FLAG),
    "same": [r.ok and r.status_code == p.status_code and r.data == p.text
             for r, p in zip(results, plain, strict=True)],
}))
"""


def _run(script: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=env,
        cwd=ROOT, timeout=120, check=False,
    )  # fmt: skip


def test_every_quick_piece_has_its_shape_on_this_release() -> None:
    assert internals.HEADER_LINES_KEPT
    assert internals.READ_HEADERS is not None and internals.MESSAGE_FIELDS
    assert internals.QUICK_HEADER_DICT is not None
    assert headers.quick_path_in_effect()
    # (the quick getresponse stands in for urllib3 2.8's ``_normalize_header_values``: on an
    # older release, which setup.cfg admits, urllib3's own runs)
    stands_in = "_normalize_header_values" in vars(urllib3.connection)
    assert (headers.QUICK_GETRESPONSE is not None) is stands_in
    assert headers.quick_getresponse_in_effect() is stands_in


@pytest.mark.parametrize("piece", RESHAPED)
def test_a_reshaped_piece_is_read_the_public_way_with_the_same_answers(piece: str) -> None:
    change, flag = RESHAPED[piece]
    shown = _run(change + COMPARE.replace("FLAG", flag))
    assert shown.returncode == 0, shown.stderr[-2000:]
    assert json.loads(shown.stdout) == {"quick": False, "same": [True] * 4}


@pytest.mark.parametrize("hook", HOOKS)
def test_a_missing_hook_fails_the_import_by_name(hook: str) -> None:
    shown = _run(HOOKS[hook] + "import batchsync\n")
    assert shown.returncode != 0
    assert "ImportError" in shown.stderr and hook in shown.stderr
