"""The command-line run: INPUT -> engine -> journal -> output files. No option parsing here."""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from ..core.engine import Job
from ..core.history import DONE, TO_FINISH, TO_SEND, Pass
from ..core.records import dumps, public_record
from ..core.result import Result, Summary, how_many
from ..core.verdict import InvalidItem
from ..http.paginate import Continued
from ..http.spec import item_label
from ..jobs.fetch import HttpJob
from ..jobs.options import FetchOptions
from ..output.columnar import FORMATS
from ..output.resultset import StoredResults
from ..run.assembly import Ran, Stoppable, gates_for
from ..run.batched import journal_parts
from ..run.controller import Journaled, Plan, RunController, Send
from ..run.plan import Cluster, Lane, Words, plan_send, refuse_fresh
from ..store.journal import (
    JournalFailed,
    JournalInUse,
    JournalMismatch,
    JournalReader,
    JournalUnusable,
    Requests,
    lock_path,
    remove,
    resumed,
)
from ..store.resume import Left, planned, stored_in
from .inputs import Entry, Input, InputError, TableInput
from .output import failed_request, output_paths, remove_stale, write_outputs

log = logging.getLogger("batchsync")


class EntryRows:
    """The command line's rows: input entries, each already its item (or the problem that
    keeps it from being one), said by its line; and its items as a resume sees them
    (``resume.Form``)."""

    def url(self, entry: Entry) -> str | None:
        return item_label(entry.item)[0]

    def where(self, index: int, entry: Entry) -> str:
        return entry.where

    def going_on(self, entry: Entry, continuation: Mapping[str, Any], data: Any) -> Entry:
        return replace(entry, going_on=Continued.of(entry.item, continuation, data))

    def item_of(self, row: object) -> object:
        assert isinstance(row, Entry)
        if row.problem is not None:
            raise InvalidItem(f"{row.where}: {row.problem}")
        return row.item if row.going_on is None else row.going_on

    def located(self, row: object, problem: str) -> str:
        assert isinstance(row, Entry)
        return f"{row.where}: {problem}"


def encode(result: Result, entry: object) -> tuple[str, str | None]:
    """The journal's stored texts: the output record, and the failed file's line when it
    failed."""
    request = failed_request(entry) if not result.ok and isinstance(entry, Entry) else None
    return dumps(public_record(result)), request


class MissingResults(OSError):
    """The journal does not hold a Result for every item of a run that was not stopped."""


class Refused(ValueError):
    """The run would replace another run's work, or write over its own input: nothing is sent."""


@dataclass(frozen=True)
class Continuing:
    """What to do with the journal an output prefix already holds (see DESIGN.md's CLI):
    ``resume`` finishes what has no final Result; ``retry`` (the error kinds, empty: all)
    sends the failures again in a new pass; ``fresh`` replaces it. None of them: a prefix
    that holds a journal is refused. ``cancel`` and ``live``: see the CLI's --cancel, --live."""

    resume: bool = False
    retry: frozenset[str] | None = None
    fresh: bool = False
    # A run through the batch endpoint: cancel its batches still open (--cancel); or a run
    # that went through it, going on live (--live).
    cancel: bool = False
    live: bool = False


@dataclass(frozen=True)
class Outcome:
    """How a run ended: counts over every finished item and every process that worked on
    the run (its earlier ones too when resumed or retried)."""

    summary: Summary
    entries: int
    results_path: Path
    failed_path: Path
    # What the journal that --fresh replaced held (None: it replaced none).
    replaced: str | None
    stopped: bool
    abandoned: bool
    # Items the pass has still to send (when stopped: what --resume sends).
    left: int = 0
    # PREFIX-report.html, or None: not asked for (--no-report), or it could not be written.
    report_path: Path | None = None


def journal_path(prefix: str) -> Path:
    return Path(f"{prefix}-journal.sqlite3")


def report_path(prefix: str) -> Path:
    return Path(f"{prefix}-report.html")


def check_paths(source: Input, prefix: str, form: str) -> None:
    """Refused when an output (or the journal) would be the input itself."""
    if source.path is None:
        return
    journal = journal_path(prefix)
    outputs = (
        *output_paths(prefix, form),
        report_path(prefix),
        journal,
        lock_path(journal),
        *(Path(f"{journal}{suffix}") for suffix in ("-wal", "-shm")),
    )
    for output in outputs:
        if _same_file(output, source.path):
            raise Refused(
                f"the output {output} would be the input {source.name}: give another prefix with -o"
            )


def _same_file(output: Path, given: Path) -> bool:
    """Whether ``output`` names the file ``given`` (by its path, a link, or its inode)."""
    try:
        return output.resolve() == given.resolve() or (output.exists() and output.samefile(given))
    except (OSError, RuntimeError):  # (a pipe that stat cannot follow, a loop of links)
        return False


def run_batch(
    source: Input,
    options: FetchOptions,
    prefix: str,
    *,
    continuing: Continuing = Continuing(),
    progress: bool,
    on_start: Callable[[Stoppable], None] = lambda run: None,
    dask: Any = None,
    partition_size: int = 1000,
    report: bool = False,
    form: str = "jsonl",
    flatten: bool = False,
) -> Outcome:
    """Run every entry of ``source`` that the pass has to send (see ``Continuing``), journal
    each Result as it is made, then write the output files from the journal in input order.

    ``on_start`` sees what runs the batch before it starts, so the caller can stop it (on a
    signal). With ``dask`` (a ``distributed.Client``), partitions of the input run on that
    cluster instead of here. ``form`` and ``flatten``: the results file's format (see
    ``write_outputs``). Before anything is sent, raises Refused when the run would replace
    another's journal or outputs, or an output would be the input, and JournalUnusable when
    the prefix is in use by another run, its folder cannot be written, or (resuming) the
    journal was made for other input or is not a journal of this batchsync. Raises OSError
    (JournalFailed, MissingResults) when the run cannot be completed; the output files are
    then left as they were. With ``report``, PREFIX-report.html is written from the journal
    after the output files (a run that sent nothing leaves an existing one as it was); a
    report that cannot be written is a logged warning, not a failed run.
    """
    check_paths(source, prefix, form)
    identity = source.identity() | options.paging_identity()
    entries = int(identity["entries"])
    path = journal_path(prefix)
    controller = RunController(Journaled(path, encode, identity))
    with contextlib.ExitStack() as held:
        # Held until the outputs are written: a second run with this prefix would
        # remove this run's journal or replace its outputs.
        _lock_prefix(held, controller, prefix)
        if continuing.fresh:
            refuse_fresh(journal_parts(path), _WORDS)
        replaced = _make_way(path, prefix, form, continuing)
        remove_stale(path.parent, _output_names(prefix))
        plan = _plan(held, source, identity, continuing, path)
        to_send = plan.left.count
        # Only the entries counted: lines appended to INPUT while the run goes are not its
        # items (the journal, the marks and the outputs are sized by the count).
        counted = _Counted(islice(source, entries), entries)
        lane = Lane(options, EntryRows(), journal_parts(path), _WORDS, live=continuing.live)
        send = plan_send(
            lane,
            url=source.template.url if isinstance(source, TableInput) else None,
            journal=path,
            passing=plan.passing.number,
            cancel=continuing.cancel,
            again=lambda: enumerate(islice(source, entries)),
            stored=plan.left.stored,
            on_start=on_start,
            cluster=_processes(options)
            if dask is None
            else partial(_cluster, options, dask, partition_size),
        )
        gates = gates_for(options)
        ran = controller.run(
            send, enumerate(counted), _stored, plan=plan, gates=gates, progress=progress
        ).ran
        counted.check_whole(source.name, path)
        return _write(
            path,
            prefix,
            entries,
            ran,
            plan.passing,
            replaced=replaced,
            form=form,
            flatten=flatten,
            paged="paging" in identity,
            report=report,
            sent=bool(to_send),
            mask=options.secrets().text,
        )


# How the command line's refusals name the ways on.
_WORDS = Words(
    go_on="--batch-api --resume goes on with them (add --cancel to cancel them); they cannot "
    "be sent live meanwhile",
    forget="--fresh would forget them; --batch-api --resume --cancel cancels them first, or "
    "give another prefix with -o",
    go_live="add --batch-api to go on with it there, or --live to send the rest live",
)


def _cluster(
    options: FetchOptions,
    dask: Any,
    partition_size: int,
    wrap: Callable[[HttpJob], Job] | None,
    on_start: Callable[[Stoppable], None],
) -> Send:
    """Partitions of the input run on the Dask client ``dask``; ``on_start`` can stop them."""
    from ..run.cluster import on_cluster, run_partition, worker_settings

    task = partial(run_partition, settings=worker_settings(options), wrap=wrap)
    return on_cluster(dask, task, partition_size, on_start)


def _processes(options: FetchOptions) -> Cluster | None:
    """The worker processes --processes asks for (None: the run is sent from here)."""
    from ..run.processes import fetch_processes

    return fetch_processes(options)


def _lock_prefix(held: contextlib.ExitStack, controller: RunController, prefix: str) -> None:
    """Enter ``controller``, holding its journal's lock, until ``held`` closes; errors that
    name the prefix (in use) or its folder (not writable)."""
    try:
        held.enter_context(controller)
    except JournalInUse:
        raise JournalInUse(f"the output prefix {prefix} is in use by another run") from None
    except OSError as exc:
        folder = journal_path(prefix).parent
        raise JournalUnusable(
            f"cannot write in the output folder {folder}: {exc.strerror or exc}"
        ) from None


def _output_names(prefix: str) -> list[str]:
    """The names of every output file a run on ``prefix`` may write, in any format."""
    paths = [path for form in FORMATS for path in output_paths(prefix, form)]
    return sorted({path.name for path in (*paths, report_path(prefix))})


def _make_way(path: Path, prefix: str, form: str, continuing: Continuing) -> str | None:
    """Refused unless the run may use the prefix; with ``fresh``, replace its journal: what
    the replaced journal held, or None."""
    outputs = [p for p in (*output_paths(prefix, form), report_path(prefix)) if p.exists()]
    if not continuing.fresh:
        _check_unreplaced(path, outputs, continuing)
        return None
    if not path.exists():
        return None if not outputs else f"{outputs[0]}, left by a run whose journal is gone"
    held = _holding(path)
    remove(path)
    return f"the journal of {held}"


def _check_unreplaced(path: Path, outputs: list[Path], continuing: Continuing) -> None:
    """Refused when a run without ``fresh`` would replace another's journal or outputs, or
    retry failures that no journal holds."""
    if path.exists():
        if continuing.resume or continuing.retry is not None:
            return
        raise Refused(
            f"{path} holds {_holding(path)}: --resume finishes it, --retry-failed sends its "
            "failures again, --fresh replaces it"
        )
    if continuing.retry is not None:
        raise Refused(f"there are no failures to retry: {path} does not exist")
    if outputs:
        raise Refused(
            f"{outputs[0]} exists, from a run whose journal {path} is gone: --fresh replaces "
            "it, or give another prefix with -o"
        )


def _holding(path: Path) -> str:
    """What the journal at ``path`` holds, in a few words."""
    try:
        reader = JournalReader(path)
    except JournalMismatch as exc:
        return f"something else ({exc})"
    with contextlib.closing(reader):
        return reader.holding()


def _plan(
    held: contextlib.ExitStack,
    source: Input,
    identity: Mapping[str, str],
    continuing: Continuing,
    path: Path,
) -> Plan:
    """What this run sends: all of INPUT, or what the journal at ``path`` leaves (kept open
    until ``held`` closes). Refused for a retry alone over items never finished."""
    entries = int(identity["entries"])
    if not path.exists():
        return Plan(Pass(), Left(bytearray(entries), EntryRows()))
    requests = Requests(islice(source, entries), failed_request)
    reader = held.enter_context(
        resumed(path, identity, "input", "run with --fresh to start over", requests)
    )
    current, marks = planned(reader, entries, continuing.retry)
    never = marks.count(TO_SEND) + marks.count(TO_FINISH)
    if never and not continuing.resume:
        raise Refused(
            f"{never} of the {how_many(entries, 'item')} of {reader.holding().partition(':')[0]} "
            f"{'was' if never == 1 else 'were'} never finished: add --resume to finish them as well"
        )
    return Plan(current, Left(marks, EntryRows(), stored_in(reader, entries)))


class _Counted:
    """The entries of INPUT, counting those read, to tell that INPUT shrank during the run."""

    def __init__(self, entries: Iterable[Entry], expected: int) -> None:
        self._entries = entries
        self._expected = expected
        self.read = 0
        self.shrank = False

    def __iter__(self) -> Iterator[Entry]:
        for entry in self._entries:
            self.read += 1
            yield entry
        self.shrank = self.read < self._expected

    def check_whole(self, name: str, journal: Path) -> None:
        """InputError when INPUT ended before the count, naming the ``journal``."""
        if self.shrank:
            raise InputError(
                f"{name} changed while the run went: it had "
                f"{how_many(self._expected, 'item')}, then "
                f"{self.read}; what finished is journaled in {journal} (--fresh starts over)"
            )


def _report(stored: StoredResults, prefix: str, *, sent: bool) -> Path | None:
    """PREFIX-report.html (the one kept when nothing was sent); None, with a warning, when it
    cannot be written: the results stand, a report is not worth failing the run for."""
    target = report_path(prefix)
    if not sent and target.exists():
        return target
    try:
        return stored.report(target, title=f"batchsync report: {Path(prefix).name}")
    except Exception as exc:  # whatever it is, the run's results stand
        log.warning("the report %s could not be written: %s", target, exc)
        return None


def _stored(result: Result, entry: object) -> None:
    """Nothing more to do once the journal has a Result: the outputs are written from it."""


def _write(
    path: Path,
    prefix: str,
    entries: int,
    ran: Ran,
    current: Pass,
    *,
    replaced: str | None,
    form: str = "jsonl",
    flatten: bool = False,
    paged: bool = False,
    report: bool = False,
    sent: bool = True,
    mask: Callable[[str], str] = str,
) -> Outcome:
    """Write every output from the journal's final Results (``StoredResults``, the one
    source of them all) and say how the run ended. Checks first that the journal holds one
    Result per entry (unless the run was stopped): a results file must never lack a line while
    the run reports success."""
    try:
        reader = JournalReader(path)
    except JournalMismatch as exc:
        raise JournalFailed(str(exc)) from None
    stopped = ran.stopped
    try:
        stored = StoredResults(reader, path)
        summary = stored.summary
        if not stopped and summary.total != entries:
            raise MissingResults(
                f"the journal {path} holds {how_many(summary.total, 'result')} for "
                f"{how_many(entries, 'item')}"
            )
        results_path, failed_path = write_outputs(
            prefix, stored.rows, form=form, flatten=flatten, paged=paged
        )
        left = entries - reader.outstanding(entries, current).count(DONE) if stopped else 0
        stored.submissions = [part.shown(mask) for part in stored.submissions]
        written = _report(stored, prefix, sent=sent) if report else None
    except sqlite3.Error as exc:
        raise JournalFailed(f"the journal {path} cannot be read: {exc}") from None
    finally:
        reader.close()
    return Outcome(
        summary, entries, results_path, failed_path, replaced, stopped, ran.abandoned, left, written
    )
