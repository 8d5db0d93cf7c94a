"""The command-line run: INPUT -> engine -> journal -> output files. No option parsing here."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

from .batch import run_observers
from .engine import Engine, Task
from .fetch import HttpJob
from .inputs import Entry, Input
from .journal import Journal, JournalMismatch, JournalReader, mismatch, remove
from .options import FetchOptions
from .output import dumps, failed_request, public_record, write_outputs
from .progress import counter
from .redact import Secrets
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


def encode(secrets: Secrets, result: Result, entry: object) -> tuple[str, str | None]:
    """The journal's stored texts: the output record, and the re-run request when it failed."""
    request = None
    if not result.ok and isinstance(entry, Entry):
        request = dumps(failed_request(entry, secrets))
    return dumps(public_record(result)), request


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
    on_start: Callable[[Engine], None] = lambda engine: None,
) -> Outcome:
    """Run every entry of ``source`` that has no final Result yet, journal each Result as it is
    made, then write the output files from the journal in input order.

    ``on_start`` sees the engine before the run, so the caller can stop it (on a signal).
    Raises JournalMismatch when resuming a journal made for other input.
    """
    identity = source.identity()
    entries = int(identity["entries"])
    path = journal_path(prefix)
    done = bytearray(entries)
    replaced = False
    if resume and path.exists():
        reader = JournalReader(path)
        try:
            problem = mismatch(reader.meta(), identity)
            if problem is not None:
                raise JournalMismatch(
                    f"{path} was made for other input ({problem}); run without --resume "
                    "to start over"
                )
            done = reader.done(entries)
        finally:
            reader.close()
    else:
        replaced = remove(path)
    pending = ((index, entry) for index, entry in enumerate(source) if not done[index])
    journal = Journal(path, partial(encode, options.secrets()), identity)
    transport = Transport(options.session, options.concurrency, options.secrets())
    gates = options.gates()
    job = HttpJob(options, transport, gates)
    bar = counter(entries - sum(done), progress)
    observers = run_observers(options, gates, bar)
    engine = Engine(options, gates=gates, observers=observers, abort=transport.abort)
    on_start(engine)
    started = time.monotonic()
    try:
        with bar:

            def deliver(result: Result, entry: object) -> None:
                if result.final:
                    journal.add(result, entry)

            finished = engine.run(EntryJob(job), pending, deliver)
    finally:
        journal.close()
        job.close()
        transport.close()
    elapsed = time.monotonic() - started
    reader = JournalReader(path)
    try:
        results_path, failed_path = write_outputs(prefix, reader.rows())
        stored = reader.summary()
        summary = replace(
            stored,
            run_requests=bar.requests,
            elapsed=elapsed,
            waits=stored.waits | gates.waits.seconds,
            circuits_opened=gates.circuits_opened,
        )
    finally:
        reader.close()
    return Outcome(
        summary, entries, results_path, failed_path, replaced, engine.stopped, not finished
    )
