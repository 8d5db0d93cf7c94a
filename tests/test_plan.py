"""One plan for every run (run/plan.py): a row becomes a request one way, whichever caller's
rows they are, and the lane's refusals are one policy in each caller's words."""

from __future__ import annotations

from functools import partial
from pathlib import Path

import pytest

from batchsync.cli.inputs import Entry
from batchsync.cli.runner import EntryRows
from batchsync.core.verdict import InvalidItem
from batchsync.http.template import Template
from batchsync.jobs.options import FetchOptions
from batchsync.run.batched import ThroughBatchApi
from batchsync.run.plan import (
    Lane,
    LaneRefused,
    Rows,
    TemplateRows,
    Words,
    plan_send,
    refuse_fresh,
    row_request,
)
from batchsync.store.submissions import COLLECTED, Part

URL = "http://127.0.0.1:9/v1/chat/completions"
WORDS = Words(go_on="GO-ON", forget="FORGET", go_live="GO-LIVE")


def entry(item: object, problem: str | None = None) -> Entry:
    return Entry(item=item, where="line 7", problem=problem)


def part(state: str, *, batch: str | None = "batch_1") -> Part:
    return Part(1, 1, "openai", ((0, 2),), state=state, batch=batch, submitted=1.0)


@pytest.mark.parametrize(
    ("rows", "row", "said"),
    [
        (TemplateRows(Template.parse(URL, "POST", {"q": "{q}"}, None)), {"q": "x"}, None),
        (EntryRows(), entry({"url": URL, "method": "POST", "json": {"q": "x"}}), None),
        (TemplateRows(Template.parse(URL, "POST", {"q": "{q}"}, None)), {"other": 1}, "q"),
        (EntryRows(), entry(None, problem="not JSON"), "line 7: not JSON"),
        (EntryRows(), entry({"url": "ftp://x"}), "line 7: "),
    ],
)
def test_a_row_becomes_a_request_one_way(rows: Rows, row: object, said: str | None) -> None:
    if said is None:
        spec = row_request(row, rows)
        assert (spec.url, spec.method, spec.json_body) == (URL, "POST", {"q": "x"})
    else:
        with pytest.raises(InvalidItem, match=said):
            row_request(row, rows)


def plan(parts: list[Part], *, batch_api: str | None = None, live: bool = True) -> object:
    options = FetchOptions(batch_api=batch_api)
    lane = Lane(options, EntryRows(), parts, WORDS, live=live)
    return plan_send(lane, url=URL, journal=None, passing=1)


def test_a_live_run_is_refused_while_batches_hold_its_rows_in_every_callers_words() -> None:
    with pytest.raises(LaneRefused, match=r"3 rows are in 1 batch.* still open.*: GO-ON"):
        plan([part("in_progress")])
    with pytest.raises(LaneRefused, match="FORGET"):
        refuse_fresh([part("held")], WORDS)
    # (a create that got no answer may have made a batch: its rows are held too)
    with pytest.raises(LaneRefused, match="GO-ON"):
        plan([part("submitting", batch=None)])


def test_going_on_live_from_a_batch_run_is_refused_unless_said() -> None:
    closed = [part(COLLECTED)]
    with pytest.raises(LaneRefused, match="openai's batch endpoint: GO-LIVE"):
        plan(closed, live=False)
    lane = Lane(FetchOptions(), EntryRows(), closed, WORDS, live=False)
    with pytest.raises(LaneRefused, match=r"^in-journal\.sqlite3 holds a run"):
        plan_send(lane, url=URL, journal=Path("in-journal.sqlite3"), passing=1)
    assert isinstance(plan(closed, live=True), partial)


def test_a_batch_run_goes_through_the_batch_endpoint_whatever_its_parts() -> None:
    assert isinstance(plan([part("in_progress")], batch_api="openai"), ThroughBatchApi)
