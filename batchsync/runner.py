"""The command-line run: INPUT -> engine -> journal -> output files. No option parsing here."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from .batch import run_observers
from .fetch import run_http
from .inputs import Entry, Input
from .journal import (
    Encode,
    Journal,
    JournalFailed,
    JournalInUse,
    JournalMismatch,
    JournalReader,
    JournalUnusable,
    locked,
    remove,
    resumed,
)
from .options import FetchOptions
from .output import dumps, failed_request, public_record, write_outputs
from .progress import Tally, counter
from .result import Result, Summary

log = logging.getLogger("batchsync")


class Stoppable(Protocol):
    """What runs a batch, as a signal handler sees it (the engine, or a cluster's feeder)."""

    def stop(self) -> None: ...

    @property
    def stopped(self) -> bool: ...


def encode(result: Result, entry: object) -> tuple[str, str | None]:
    """The journal's stored texts: the output record, and the failed file's line when it
    failed."""
    request = None
    if not result.ok and isinstance(entry, Entry):
        request = failed_request(entry)
    return dumps(public_record(result)), request


class MissingResults(OSError):
    """The journal does not hold a Result for every item of a run that was not stopped."""


@dataclass(frozen=True)
class Outcome:
    """How a run ended: counts over every finished item (earlier runs included when resumed)."""

    summary: Summary
    entries: int
    results_path: Path
    failed_path: Path
    replaced_journal: bool
    stopped: bool
    abandoned: bool


def journal_path(prefix: str) -> Path:
    return Path(f"{prefix}-journal.sqlite3")


def run_batch(
    source: Input,
    options: FetchOptions,
    prefix: str,
    *,
    resume: bool,
    progress: bool,
    on_start: Callable[[Stoppable], None] = lambda run: None,
    dask: Any = None,
    partition_size: int = 1000,
) -> Outcome:
    """Run every entry of ``source`` that has no final Result yet, journal each Result as it is
    made, then write the output files from the journal in input order.

    ``on_start`` sees what runs the batch before it starts, so the caller can stop it (on a
    signal). With ``dask`` (a ``distributed.Client``), partitions of the input run on that
    cluster instead of here. Before anything is sent, raises JournalUnusable when the prefix
    is in use by another run, its folder cannot be written, or (resuming) the journal was made
    for other input or is not a journal of this batchsync. Raises OSError (JournalFailed,
    MissingResults) when the run cannot be completed; the output files are then left as
    they were.
    """
    identity = source.identity()
    entries = int(identity["entries"])
    path = journal_path(prefix)
    with contextlib.ExitStack() as held:
        try:
            # Held until the outputs are written: a second run with this prefix would
            # remove this run's journal or replace its outputs.
            held.enter_context(locked(path))
        except JournalInUse:
            raise JournalInUse(f"the output prefix {prefix} is in use by another run") from None
        except OSError as exc:
            raise JournalUnusable(
                f"cannot write in the output folder {path.parent}: {exc.strerror or exc}"
            ) from None
        done = bytearray(entries)
        replaced = False
        if resume and path.exists():
            done = _finished(path, identity, entries)
        else:
            replaced = remove(path)
        pending = ((index, entry) for index, entry in enumerate(source) if not done[index])
        journal = _create(path, encode, identity)
        bar = counter(entries - sum(done), progress)
        started = time.monotonic()
        try:
            with bar:

                def deliver(result: Result, entry: object) -> None:
                    if result.final:
                        journal.add(result, entry)

                if dask is None:
                    ran = _run_here(options, pending, deliver, bar, on_start)
                else:
                    ran = _run_on_cluster(
                        dask, partition_size, options=options, pending=pending,
                        deliver=deliver, bar=bar, on_start=on_start,
                    )  # fmt: skip
        finally:
            journal.close()
        elapsed = time.monotonic() - started
        results_path, failed_path, stored = _write(path, prefix, entries, ran.stopped)
    summary = replace(
        stored,
        run_requests=bar.requests,
        elapsed=elapsed,
        waits=stored.waits | ran.waits,
        circuits_opened=ran.circuits_opened,
    )
    return Outcome(
        summary, entries, results_path, failed_path, replaced, ran.stopped, ran.abandoned
    )


def _finished(path: Path, identity: Mapping[str, str], entries: int) -> bytearray:
    """The entries a journal being resumed has final Results for; read-only."""
    with resumed(path, identity, "input", "run without --resume to start over") as reader:
        return reader.done(entries)


def _create(path: Path, store: Encode, identity: Mapping[str, str]) -> Journal:
    """A new (or resumed) journal, or JournalUnusable before anything is sent."""
    try:
        return Journal(path, store, identity)
    except sqlite3.Error as exc:
        raise JournalUnusable(f"cannot create the journal {path}: {exc}") from None


def _write(path: Path, prefix: str, entries: int, stopped: bool) -> tuple[Path, Path, Summary]:
    """Write the output files from the journal; their paths and the stored Results' summary.

    Checks first that the journal holds one Result per entry (unless the run was stopped):
    a results file must never lack a line while the run reports success.
    """
    try:
        reader = JournalReader(path)
    except JournalMismatch as exc:
        raise JournalFailed(str(exc)) from None
    try:
        stored = reader.summary()
        if not stopped and stored.total != entries:
            raise MissingResults(
                f"the journal {path} holds {stored.total} results for {entries} items"
            )
        results_path, failed_path = write_outputs(prefix, reader.rows())
    except sqlite3.Error as exc:
        raise JournalFailed(f"the journal {path} cannot be read: {exc}") from None
    finally:
        reader.close()
    return results_path, failed_path, stored


@dataclass(frozen=True)
class _Ran:
    """How the fetching part of a run ended."""

    stopped: bool
    abandoned: bool
    waits: dict[str, float]
    circuits_opened: int


def _run_here(
    options: FetchOptions,
    pending: Iterator[tuple[int, Entry]],
    deliver: Callable[[Result, object], None],
    bar: Tally,
    on_start: Callable[[Stoppable], None],
) -> _Ran:
    """Fetch on this machine's thread pool."""
    gates = options.gates()
    observers = run_observers(options, gates, bar)
    engine, finished = run_http(
        options, gates, pending, deliver, observers=observers, entries=True, on_start=on_start
    )
    return _Ran(engine.stopped, not finished, gates.waits.seconds, gates.circuits_opened)


def _run_on_cluster(
    client: Any,
    partition_size: int,
    *,
    options: FetchOptions,
    pending: Iterator[tuple[int, Entry]],
    deliver: Callable[[Result, object], None],
    bar: Tally,
    on_start: Callable[[Stoppable], None],
) -> _Ran:
    """Fetch on a Dask cluster, a partition at a time; Results come back to this journal."""
    from .contrib.dask import Distributor, partitions, worker_settings

    distributor = Distributor(client, worker_settings(options), entries=True)
    on_start(distributor)
    for partition, results in distributor.run(partitions(pending, partition_size)):
        entries = dict(partition)
        for result in results:
            bar.item_finished(result)
            deliver(result, entries[result.index])
    return _Ran(distributor.stopped, False, {}, 0)
