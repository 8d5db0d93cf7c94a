"""``make demo`` as a newcomer runs it: the bundled list against the bundled mock server."""

from __future__ import annotations

import subprocess
import sys

import pytest

from .mockserver import ROOT

pytestmark = pytest.mark.integration


def test_the_demo_shows_each_outcome_and_the_failed_file() -> None:
    done = subprocess.run(
        [sys.executable, "scripts/demo.py"], cwd=ROOT, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    out = done.stdout
    assert "7 items: 4 ok, 3 failed (invalid_body 1, status 2)" in out
    assert "HTTP 503 after 3 attempts" in out
    assert "body is not JSON" in out
    assert "retry " in out and "HTTP 429" in out
    failed_section = out.split("batch-failed.jsonl   #", 1)[1].split("\n\n")[0].splitlines()[1:]
    hint = failed_section.pop()
    assert [line.split("/")[3] for line in failed_section] == ["404", "503", "broken-json"]
    assert hint.endswith("demo-out/urls.txt -o demo-out/batch --retry-failed")
    # the second run: a row per customer, every page of each, under the announced quota
    orders = out.split("# A CSV of customers", 1)[1]
    assert "6 items: 6 ok, 0 failed" in orders and "quota " in orders
    rows = [line.split() for line in orders.splitlines() if line.startswith("c-")]
    assert [(row[0], row[2], row[3]) for row in rows] == [
        ("c-1001", "3", "5"), ("c-1002", "1", "2"), ("c-1003", "4", "7"),
        ("c-1004", "2", "4"), ("c-1005", "1", "0"), ("c-1006", "2", "3"),
    ]  # fmt: skip
