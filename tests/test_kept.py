"""The bounded memo the HTTP layer's caches share (core/kept.py)."""

from __future__ import annotations

import pickle
import threading

from batchsync.core.kept import Kept


def test_it_starts_afresh_at_its_bound_and_keeps_a_stored_none() -> None:
    kept: Kept[str, str | None] = Kept(3)
    for key in "abc":
        kept.keep(key, None)
    assert kept.get("a", "missing") is None
    kept.keep("a", "again")  # a key it holds replaces its value: nothing cleared
    assert len(kept) == 3
    kept.keep("d", "new")
    assert kept.copy() == {"d": "new"}
    kept.forget("d")
    assert kept.get("d") is None and len(kept) == 0


def test_threads_storing_at_once_never_grow_it_past_its_bound() -> None:
    kept: Kept[tuple[int, int], int] = Kept(64)
    start = threading.Barrier(8)
    largest: list[int] = []

    def store(worker: int) -> None:
        start.wait()
        for n in range(5_000):
            kept.keep((worker, n), n)
            largest.append(len(kept))

    threads = [threading.Thread(target=store, args=(worker,)) for worker in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert max(largest) <= 64


def test_it_pickles_empty() -> None:
    kept: Kept[str, int] = Kept(5)
    kept.keep("a", 1)
    copy = pickle.loads(pickle.dumps(kept))
    assert len(copy) == 0
    copy.keep("b", 2)
    assert copy.get("b") == 2
