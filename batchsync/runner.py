"""The command-line run: INPUT -> engine -> journal -> output files. No option parsing here."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .engine import Engine, Task
from .fetch import HttpJob
from .inputs import Entry, Input
from .journal import Journal, JournalReader, remove
from .options import FetchOptions
from .output import dumps, failed_request, public_record, write_outputs
from .progress import Progress
from .result import Result, Summary
from .spec import InvalidItem, item_label
from .transport import Transport

log = logging.getLogger("batchsync")


class EntryJob:
    """The HTTP job over input Entries; an entry that is no item fails with its line number."""

    def __init__(self, inner: HttpJob) -> None:
        self._inner = inner

    @property
    def timeout(self) -> float:
        return self._inner.timeout

    def label(self, entry: object) -> tuple[str | None, Any]:
        assert isinstance(entry, Entry)
        return item_label(entry.item)

    def prepare(self, entry: object) -> Task:
        assert isinstance(entry, Entry)
        if entry.problem is not None:
            raise InvalidItem(f"{entry.where}: {entry.problem}")
        try:
            return self._inner.prepare(entry.item)
        except InvalidItem as exc:
            raise InvalidItem(f"{entry.where}: {exc}") from None


def encode(result: Result, entry: object) -> tuple[str, str | None]:
    """The journal's stored texts: the output record, and the re-run request when it failed."""
    request = None
    if not result.ok and isinstance(entry, Entry):
        request = dumps(failed_request(entry))
    return dumps(public_record(result)), request


@dataclass(frozen=True)
class Outcome:
    summary: Summary
    results_path: Path
    failed_path: Path
    replaced_journal: bool


def journal_path(prefix: str) -> Path:
    return Path(f"{prefix}-journal.sqlite3")


def run_batch(
    source: Input, options: FetchOptions, prefix: str, total: int | None, progress: bool
) -> Outcome:
    """Run every entry of ``source``, journal each Result, then write the output files."""
    path = journal_path(prefix)
    replaced = remove(path)
    journal = Journal(path, encode)
    transport = Transport(options.session, options.concurrency, options.headers or ())
    started = time.monotonic()
    try:
        with Progress(total, progress) as bar:

            def deliver(result: Result, entry: object) -> None:
                journal.add(result, entry)
                bar(result)

            Engine(options).run(EntryJob(HttpJob(options, transport)), source, deliver)
    finally:
        transport.close()
        journal.close()
    elapsed = time.monotonic() - started
    reader = JournalReader(path)
    try:
        results_path, failed_path = write_outputs(prefix, reader.rows())
        summary = reader.summary(elapsed)
    finally:
        reader.close()
    return Outcome(summary, results_path, failed_path, replaced)
