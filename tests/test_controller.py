"""The run controller every runner goes through (``run.controller``): the journal's lock, the
pass and the stint recorded, each Result added to its item's earlier one before it is journaled,
and the journal closed however the run ends."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import pytest

from batchsync.core.engine import Deliver, Earlier
from batchsync.core.history import DONE, TO_REDO, TO_SEND, Pass, Stint
from batchsync.core.result import Result
from batchsync.limits.gates import Gates
from batchsync.run.assembly import Ran
from batchsync.run.batch import encode_result
from batchsync.run.controller import Journaled, Plan, RunController
from batchsync.run.progress import Tally
from batchsync.store.journal import JournalInUse, JournalReader
from batchsync.store.resume import Items, Left

IDENTITY = {"entries": "3", "sha256": "0" * 64}


def journaled(tmp_path: Path) -> Journaled:
    return Journaled(tmp_path / "journal.sqlite3", encode_result, IDENTITY)


def answering(
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    gates: Gates | None,
    progress: Tally,
    earlier: Earlier | None = None,
) -> Ran:
    """A Send that answers every item it is given at its first attempt."""
    for index, item in items:
        result = Result(index, str(item), True, attempts=1)
        progress.item_finished(result)
        deliver(result, item)
    return Ran(False, False, {}, 0)


def interrupted(
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    gates: Gates | None,
    progress: Tally,
    earlier: Earlier | None = None,
) -> Ran:
    """A Send that answers the first item, then is interrupted (a notebook's Ctrl-C)."""
    index, item = next(iter(items))
    result = Result(index, str(item), True, attempts=1)
    progress.item_finished(result)
    deliver(result, item)
    raise KeyboardInterrupt


def plan_of(marks: list[int], stored: dict[int, Result] | None = None) -> Plan:
    return Plan(Pass(), Left(bytearray(marks), Items(), (stored or {}).get))


def stints_in(path: Path) -> list[Stint]:
    reader = JournalReader(path)
    try:
        return reader.stints()
    finally:
        reader.close()


def test_an_interrupted_run_keeps_its_stint_and_closes_its_journal(tmp_path: Path) -> None:
    journal = journaled(tmp_path)
    stints: list[Stint] = []
    with RunController(journal) as controller, pytest.raises(KeyboardInterrupt):
        controller.run(
            interrupted,
            enumerate("abc"),
            lambda result, item: None,
            plan=plan_of([TO_SEND] * 3),
            gates=None,
            progress=False,
            stints=stints,
        )
    assert [stint.items for stint in stints] == [1]
    assert [stint.items for stint in stints_in(journal.path)] == [1]
    with RunController(journal) as again:  # the lock was let go
        assert list(again.kept(3, Result.from_dict, "").done) == [0]


def test_a_journal_a_run_holds_is_refused_to_another(tmp_path: Path) -> None:
    first, second = RunController(journaled(tmp_path)), RunController(journaled(tmp_path))
    with first, pytest.raises(JournalInUse), second:
        pass


def test_a_run_with_nothing_left_records_no_stint(tmp_path: Path) -> None:
    journal = journaled(tmp_path)
    stints: list[Stint] = []
    with RunController(journal) as controller:
        ended = controller.run(
            answering,
            enumerate("abc"),
            lambda result, item: None,
            plan=plan_of([DONE] * 3),
            gates=None,
            progress=False,
            stints=stints,
        )
    assert (ended.ran.stopped, ended.stint.items) == (False, 0)
    assert stints == []
    assert stints_in(journal.path) == []


def test_a_result_sent_again_adds_to_the_earlier_one_before_it_is_journaled(
    tmp_path: Path,
) -> None:
    journal = journaled(tmp_path)
    earlier = Result(1, "b", False, attempts=2, error_kind="status")
    delivered: list[Result] = []
    with RunController(journal) as controller:
        controller.run(
            answering,
            enumerate("abc"),
            lambda result, item: delivered.append(result),
            plan=plan_of([DONE, TO_REDO, TO_SEND], {1: earlier}),
            gates=None,
            progress=False,
        )
        kept = controller.kept(3, Result.from_dict, "")
    assert [(r.index, r.attempts) for r in delivered] == [(1, 3), (2, 1)]
    assert {index: r.attempts for index, r in kept.done.items()} == {1: 3, 2: 1}


def test_only_a_pass_that_sends_an_item_again_looks_up_earlier_results() -> None:
    assert Left(bytearray([TO_SEND, DONE]), Items()).earlier is None
    left = Left(bytearray([TO_SEND, TO_REDO]), Items())
    assert left.earlier == left.taken
