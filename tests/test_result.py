from __future__ import annotations

import json
import sys

import pytest
from pydantic import BaseModel

from batchsync import AttemptRecord, Result, ResultSet


class Product(BaseModel):
    sku: str


def sample() -> ResultSet:
    return ResultSet(
        [
            Result(
                0,
                "http://h.test/a",
                True,
                id="a",
                status_code=200,
                attempts=1,
                data={"v": 1},
                elapsed=0.01,
                attempt_log=(AttemptRecord(1, 200, None, 0.01),),
            ),
            Result(
                1,
                "http://h.test/b",
                False,
                status_code=503,
                attempts=3,
                error_kind="status",
                error="HTTP 503 after 3 attempts",
                elapsed=1.5,
            ),
            Result(
                2,
                "http://h.test/<c>",
                False,
                attempts=0,
                error_kind="invalid_request",
                error="bad <url>",
            ),
            Result(3, "http://h.test/d", True, status_code=200, attempts=2, data=Product(sku="x")),
        ],
        elapsed=2.0,
    )


def test_a_result_set_is_a_sequence_in_input_order() -> None:
    rs = sample()
    assert len(rs) == 4
    assert rs[1].url == "http://h.test/b"
    assert [r.index for r in rs] == [0, 1, 2, 3]
    assert [r.index for r in rs[1:3]] == [1, 2]
    assert [r.index for r in rs.ok] == [0, 3]
    assert [r.index for r in rs.failed] == [1, 2]


def test_summary_counts_outcomes_kinds_and_statuses() -> None:
    summary = sample().summary()
    assert (summary.total, summary.ok, summary.failed) == (4, 2, 2)
    assert summary.error_kinds == {"status": 1, "invalid_request": 1}
    assert summary.status_codes == {200: 2, 503: 1}
    assert summary.requests_sent == 6
    assert summary.requests_per_second == 3.0
    assert str(summary).startswith("4 items: 2 ok, 2 failed (invalid_request 1, status 1)")


def test_to_dict_is_json_ready_and_has_every_field() -> None:
    rows = [r.to_dict() for r in sample()]
    assert json.loads(json.dumps(rows)) == rows
    assert set(rows[0]) == {
        "index",
        "url",
        "final_url",
        "redirects",
        "id",
        "ok",
        "status_code",
        "attempts",
        "error_kind",
        "error",
        "data",
        "elapsed",
        "attempt_log",
        "fallback_used",
    }
    assert rows[0]["attempt_log"] == [
        {
            "attempt": 1,
            "status_code": 200,
            "error_kind": None,
            "elapsed": 0.01,
            "wait": None,
            "fallback": None,
            "hedged": False,
        }
    ]
    assert rows[3]["data"] == {"sku": "x"}


def test_html_shows_the_summary_and_escapes_the_failures() -> None:
    page = sample()._repr_html_()
    assert "First failures" in page
    assert "HTTP 503 after 3 attempts" in page
    assert "bad &lt;url&gt;" in page
    assert "<url>" not in page


def test_to_pandas_has_one_typed_row_per_item() -> None:
    pytest.importorskip("pandas")
    frame = sample().to_pandas()
    assert len(frame) == 4
    assert list(frame["ok"]) == [True, False, False, True]
    assert str(frame["status_code"].dtype) == "Int64"
    assert frame["status_code"].isna().tolist() == [False, False, True, False]


def test_to_pandas_without_pandas_says_how_to_get_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pandas", None)
    with pytest.raises(ImportError, match=r"batchsync\[pandas\]"):
        sample().to_pandas()


def test_summary_has_latency_percentiles_attempts_per_item_and_backoff() -> None:
    results = [
        Result(n, f"http://h.test/{n}", True, attempts=1, elapsed=n / 100) for n in range(1, 101)
    ]
    results.append(
        Result(101, "http://h.test/x", False, attempts=2, elapsed=9.0,
               attempt_log=(AttemptRecord(1, 503, "status", 0.1, wait=1.5),
                            AttemptRecord(2, 503, "status", 0.1)))
    )  # fmt: skip
    summary = ResultSet(results, elapsed=10.0).summary()
    assert summary.latency == {"p50": 0.51, "p95": 0.96, "p99": 1.0}
    assert summary.attempts_per_item == pytest.approx(102 / 101)
    assert summary.waits == {"backoff": 1.5}
    text = str(summary)
    assert "latency p50 0.510 s, p95 0.960 s, p99 1.000 s" in text
    assert "waited: backoff 1.5 s" in text
    page = ResultSet(results).summary()._repr_html_()
    assert "latency p99" in page


def test_to_pandas_can_spread_the_json_bodies_into_columns() -> None:
    pytest.importorskip("pandas")
    rs = ResultSet(
        [
            Result(0, "u0", True, data={"sku": "a", "price": {"eur": 2}}),
            Result(1, "u1", False, error_kind="status"),
            Result(2, "u2", True, data=[1, 2]),
        ]
    )
    bodies = rs.data_frame()
    assert list(bodies.index) == [0, 2]
    assert bodies.loc[0, "price.eur"] == 2
    assert bodies.loc[2, "value"] == [1, 2]
    wide = rs.to_pandas(expand=True)
    assert len(wide) == 3
    assert "data" not in wide.columns
    assert wide.loc[0, "data.sku"] == "a"
    assert wide["data.sku"].isna().tolist() == [False, True, True]
