"""The command-line run: INPUT -> engine -> journal -> output files. No option parsing here."""

from __future__ import annotations

import contextlib
import json
import logging
import sqlite3
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from ..assembly import Ran, Stoppable, fetch, journaling, open_journal
from ..engine import Task
from ..fetch import WrappedJob
from ..journal import (
    JournalFailed,
    JournalInUse,
    JournalMismatch,
    JournalReader,
    JournalUnusable,
    locked,
    remove,
    resumed,
)
from ..options import FetchOptions
from ..paginate import Continued
from ..progress import Tally, counter
from ..records import dumps, public_record
from ..report import report_journal
from ..result import Result, Summary
from ..verdict import InvalidItem
from .inputs import Entry, Input
from .output import failed_request, write_outputs

log = logging.getLogger("batchsync")


class EntryJob(WrappedJob):
    """The HTTP job over input Entries; an entry that is no item fails with its line number."""

    def label(self, entry: object) -> tuple[str | None, Any]:
        assert isinstance(entry, Entry)
        # A line that is no item has no URL to show: only its number and what is wrong.
        return (None, None) if entry.problem is not None else self._inner.label(entry.item)

    def prepare(self, entry: object) -> Task:
        assert isinstance(entry, Entry)
        if entry.problem is not None:
            raise InvalidItem(f"{entry.where}: {entry.problem}")
        try:
            return self._inner.prepare(entry.item if entry.going_on is None else entry.going_on)
        except InvalidItem as exc:
            raise InvalidItem(f"{entry.where}: {exc}") from None


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
    # PREFIX-report.html, or None: not asked for (--no-report), or it could not be written.
    report_path: Path | None = None


def journal_path(prefix: str) -> Path:
    return Path(f"{prefix}-journal.sqlite3")


def report_path(prefix: str) -> Path:
    return Path(f"{prefix}-report.html")


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
    report: bool = False,
    form: str = "jsonl",
    flatten: bool = False,
) -> Outcome:
    """Run every entry of ``source`` that has no final Result yet, journal each Result as it is
    made, then write the output files from the journal in input order.

    ``on_start`` sees what runs the batch before it starts, so the caller can stop it (on a
    signal). With ``dask`` (a ``distributed.Client``), partitions of the input run on that
    cluster instead of here. ``form`` and ``flatten``: the results file's format (see
    ``write_outputs``). Before anything is sent, raises JournalUnusable when the prefix
    is in use by another run, its folder cannot be written, or (resuming) the journal was made
    for other input or is not a journal of this batchsync. Raises OSError (JournalFailed,
    MissingResults) when the run cannot be completed; the output files are then left as
    they were. With ``report``, PREFIX-report.html is written from the journal after the
    output files; a report that cannot be written is a logged warning, not a failed run.
    """
    identity = source.identity() | options.paging_identity()
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
        done, unfinished = bytearray(entries), dict[int, tuple[Any, str]]()
        replaced = False
        if resume and path.exists():
            done, unfinished = _finished(path, identity, entries)
        else:
            replaced = remove(path)
        pending = (
            (index, _going_on(entry, unfinished.get(index)))
            for index, entry in enumerate(source)
            if not done[index]
        )
        journal = open_journal(path, encode, identity)
        bar = counter(entries - sum(done), progress)
        started = time.monotonic()
        try:
            with bar:
                if dask is None:
                    ran = fetch(
                        options, pending, _stored, progress=bar, journal=journal, wrap=EntryJob,
                        on_start=on_start,
                    )  # fmt: skip
                else:
                    ran = _run_on_cluster(
                        dask, partition_size, options=options, pending=pending,
                        deliver=journaling(journal, _stored), bar=bar, on_start=on_start,
                    )  # fmt: skip
        finally:
            journal.close()
        elapsed = time.monotonic() - started
        results_path, failed_path, stored = _write(
            path, prefix, entries, ran.stopped,
            form=form, flatten=flatten, paged="paging" in identity,
        )  # fmt: skip
        summary = replace(
            stored,
            run_requests=bar.requests,
            elapsed=elapsed,
            waits=stored.waits | ran.waits,
            circuits_opened=ran.circuits_opened,
        )
        written = _write_report(path, prefix, summary, ran.timeline) if report else None
    return Outcome(
        summary, entries, results_path, failed_path, replaced, ran.stopped, ran.abandoned,
        written,
    )  # fmt: skip


def _write_report(
    path: Path, prefix: str, summary: Summary, timeline: Mapping[tuple[str, int], float]
) -> Path | None:
    """PREFIX-report.html from the journal (every finished item, earlier runs' too when
    resumed); None, with a warning, when it cannot be written: the results are written
    already, and a report is not worth failing the run for."""
    target = report_path(prefix)
    try:
        reader = JournalReader(path)
        try:
            return report_journal(
                reader.db, summary, target, title=f"batchsync report: {Path(prefix).name}",
                timeline=timeline,
            )  # fmt: skip
        finally:
            reader.close()
    except Exception as exc:  # whatever it is, the run's results stand
        log.warning("the report %s could not be written: %s", target, exc)
        return None


def _stored(result: Result, entry: object) -> None:
    """Nothing more to do with a Result once the journal has it: the outputs are written
    from the journal."""


def _finished(
    path: Path, identity: Mapping[str, str], entries: int
) -> tuple[bytearray, dict[int, tuple[Any, str]]]:
    """The entries a journal being resumed has final Results for, and the paginated ones
    that stopped partway (see ``JournalReader.unfinished``); read-only."""
    with resumed(path, identity, "input", "run without --resume to start over") as reader:
        return reader.done(entries), reader.unfinished(entries)


def _going_on(entry: Entry, stored: tuple[Any, str] | None) -> Entry:
    """The entry, made to go on from the page where an earlier run stopped it, if it did."""
    if stored is None:
        return entry
    continuation, record = stored
    going_on = Continued.of(entry.item, continuation, json.loads(record).get("data"))
    return replace(entry, going_on=going_on)


def _write(
    path: Path,
    prefix: str,
    entries: int,
    stopped: bool,
    *,
    form: str = "jsonl",
    flatten: bool = False,
    paged: bool = False,
) -> tuple[Path, Path, Summary]:
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
        results_path, failed_path = write_outputs(
            prefix, reader.rows, form=form, flatten=flatten, paged=paged
        )
    except sqlite3.Error as exc:
        raise JournalFailed(f"the journal {path} cannot be read: {exc}") from None
    finally:
        reader.close()
    return results_path, failed_path, stored


def _run_on_cluster(
    client: Any,
    partition_size: int,
    *,
    options: FetchOptions,
    pending: Iterator[tuple[int, Entry]],
    deliver: Callable[[Result, object], None],
    bar: Tally,
    on_start: Callable[[Stoppable], None],
) -> Ran:
    """Fetch on a Dask cluster, a partition at a time; Results come back to this journal."""
    from ..contrib.dask import Distributor, partitions, run_partition, worker_settings

    task = partial(run_partition, settings=worker_settings(options), wrap=EntryJob)
    distributor = Distributor(client, task)
    on_start(distributor)
    for partition, results in distributor.run(partitions(pending, partition_size)):
        entries = dict(partition)
        for result in results:
            bar.item_finished(result)
            deliver(result, entries[result.index])
    return Ran(distributor.stopped, False, {}, 0)
