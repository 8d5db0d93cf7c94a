"""``Batch``: a fetch that can be interrupted and continued, for notebooks and long scripts;
``CallBatch``, the same for calls."""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import json
import math
import sqlite3
import threading
import typing
from collections.abc import Callable, Generator, Iterable, Mapping
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Generic, Self, TypeVar, Unpack

from pydantic import BaseModel

from ..batches.providers import endpoint_of
from ..core.engine import Deliver
from ..core.history import DONE, Pass, Stint, merged_timeline, totals
from ..core.observe import log_summary
from ..core.records import dumps, public_record
from ..core.result import Result, Summary, error_kinds
from ..http.classify import describe
from ..http.spec import RequestSpec
from ..http.template import Template
from ..jobs.options import CallOptions, FetchOptions, spelled_out, taken
from ..jobs.settings import CallSettings, FetchSettings
from ..limits import spend
from ..output.resultset import ResultSet
from ..store.journal import JournalMismatch
from ..store.resume import Items, Left, marks_of
from ..store.submissions import Ledger, Part
from .assembly import Stoppable, gates_for, run_calls
from .batched import journal_parts
from .controller import Journaled, Plan, RunController, Send
from .plan import Lane, TemplateRows, Words, plan_send, refuse_fresh
from .processes import (
    calls_in_worker,
    check_callable,
    fetch_processes,
    on_processes,
    process_options,
)
from .progress import wanted
from .stream import Stream, streamed

Item = str | Mapping[str, Any] | RequestSpec


def identity_of(items: Iterable[Any], *, strict: bool = False) -> dict[str, str]:
    """The identity a journal records for a list of items: their count and a SHA-256;
    ``strict``: every item must be JSON (ValueError naming the first that is not), as the
    items of calls must, whose ``repr`` may change from one process to the next."""
    digest = hashlib.sha256()
    count = 0
    for item in items:
        value = item.to_item() if isinstance(item, RequestSpec) else item
        try:
            text = json.dumps(value, sort_keys=True, default=None if strict else repr)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"item {count} cannot be journaled: a journal knows items by their JSON, and "
                f"{type(value).__name__} has none ({exc}); give JSON items (an id, a dict)"
            ) from None
        digest.update(text.encode() + b"\n")
        count += 1
    return {"entries": str(count), "sha256": digest.hexdigest()}


def _check_ids(items: list[Item]) -> None:
    """ValueError naming the first item whose ``id`` a journal cannot store as JSON."""
    for index, item in enumerate(items):
        if not isinstance(item, RequestSpec | Mapping):
            continue
        # The id as given (item_label reports a NaN one as None).
        item_id = item.id if isinstance(item, RequestSpec) else item.get("id")
        try:
            json.dumps(item_id, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"item {index}: its id {item_id!r} cannot be stored in the journal ({exc})"
            ) from None


def encode_result(result: Result, item: object) -> tuple[str, str | None]:
    """The journal's stored text for a library Result (there is no failed file to feed)."""
    return dumps(public_record(result)), None


def _kinds_of(retry_failed: bool | Iterable[str]) -> frozenset[str] | None:
    """The error kinds a retry pass sends again (empty: all; None: no retry pass);
    ValueError for an empty list."""
    if retry_failed is False:
        return None
    kinds = frozenset() if retry_failed is True else error_kinds(retry_failed)
    if retry_failed is not True and not kinds:
        raise ValueError("retry_failed: name at least one error kind, or give True")
    return kinds


OptionsT = TypeVar("OptionsT", FetchOptions, CallOptions)


class Resumable(Generic[OptionsT]):
    """What ``Batch`` and ``CallBatch`` share: items run in one or more ``run()`` calls,
    every final Result kept (and journaled: see ``Batch``)."""

    items: list[Any]
    options: OptionsT
    journal: Path | None
    # What the batch was made with (its items aside), to make it again with other options.
    _arguments: dict[str, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> Self:
        batch = super().__new__(cls)
        batch._arguments = kwargs
        return batch

    def _start(
        self,
        items: Iterable[Any],
        options: OptionsT,
        journal: str | Path | None,
        progress: bool | None,
        *,
        fresh: bool = False,
        strict: bool = False,
        template: Template | None = None,
    ) -> None:
        self.items, self.options, self._progress = list(items), options, progress
        self._done: dict[int, Result] = {}
        # The Result of each item a ``stream()`` of this batch yielded last; held while it runs.
        self._streamed: dict[int, Result] = {}
        self._running = threading.Lock()
        # The pass this batch is in, and what it does with each item (``Pass.does``).
        self._pass = Pass()
        self._marks = bytearray(len(self.items))
        # What each run() did (those of earlier processes too, from the journal), and the
        # seconds earlier processes waited at each gate by second.
        self._stints: list[Stint] = []
        self._timeline: dict[tuple[str, int], float] = {}
        self._gates = gates_for(options)
        # What a spend cap reserved and spent, for a batch without a journal (a journal or a
        # Redis server keeps its own): its next run() and a batch retry_failed remakes count
        # from it.
        self._spend_here = spend.KeptHere()
        # The submissions to a batch endpoint of a batch without a journal.
        self._ledger = Ledger()
        self.journal = None if journal is None else Path(journal)
        self._form = Items(None if template is None else template.url)
        # What a journal of these items is made for: the items, template rows, pagination.
        self._identity: dict[str, str] = {}
        if self.journal is not None:
            self._identity = identity_of(self.items, strict=strict)
            if template is not None:
                self._identity["template"] = f"rows {template.identity()}"
            if isinstance(options, FetchOptions):
                self._identity |= options.paging_identity()
            self._open(fresh=fresh, template=template)

    def _controller(self) -> RunController:
        """What runs this batch, holding its journal's lock while entered."""
        if self.journal is None:
            return RunController(None)
        return RunController(Journaled(self.journal, self._stored, self._identity))

    def _open(self, *, fresh: bool, template: Template | None) -> None:
        """Check the items' ids, then replace the journal (``fresh``) or take back its state."""
        if template is None:  # (a template's rows: each id is checked when it is built)
            _check_ids(self.items)
        hint = "give another journal, or fresh=True to replace it"
        with self._controller() as controller:
            if fresh:
                refuse_fresh(journal_parts(self.journal), _WORDS)
                controller.replace()
            else:
                kept = controller.kept(len(self.items), self._restore, hint)
                self._done, self._pass, self._marks = kept.done, kept.passing, kept.marks
                self._stints, self._timeline = kept.stints, kept.timeline

    def _restore(self, record: dict[str, Any]) -> Result:
        """A journaled Result as this session would have made it: its data as given."""
        raise NotImplementedError

    def _stored(self, result: Result, item: object) -> tuple[str, str | None]:
        """The journal's texts for a Result."""
        return encode_result(result, item)

    def _send(self, on_start: Callable[[Stoppable], None]) -> Send:
        """What sends this batch's items: the assembly's engine run for its job (``on_start``
        sees what runs them)."""
        raise NotImplementedError

    @property
    def elapsed(self) -> float:
        """Seconds spent in ``run()``, by this batch and the processes its journal knew."""
        return totals(self._stints).elapsed or 0.0

    @property
    def results(self) -> ResultSet:
        """The finished Results in input order (all of them once ``pending`` is 0)."""
        ran = totals(self._stints)
        return ResultSet(
            [self._done[i] for i in sorted(self._done)],
            elapsed=ran.elapsed,
            waits=ran.waits,
            circuits_opened=ran.circuits_opened,
            wait_timeline=merged_timeline(self._timeline, self._gates.waits.timeline),
            stints=self._stints,
            retry=self._retried,
            submissions=self._reported,
        )

    def _reported(self) -> list[Part]:
        """The parts sent through a provider's batch endpoint, for the report (none here)."""
        return []

    def report(self, path: str | Path, *, charts: bool = True) -> Path:
        """Write the report of the Results so far to ``path`` (see ``ResultSet.report``)."""
        return self.results.report(path, charts=charts)

    def _summary(self) -> Summary:
        return self.results.summary()

    @property
    def pending(self) -> int:
        """How many items have no final Result yet, failures this pass has still to send
        again, or paginated items with pages still to fetch."""
        return len(self.items) - self._marks.count(DONE)

    def run(self, *, retry_failed: bool | Iterable[str] = False) -> ResultSet:
        """Run every item without a final Result (and go on with the paginated ones that
        stopped partway); returns ``results``.

        ``retry_failed``: first start a new pass that sends the failed items again (True),
        or those failed with these error kinds (e.g. ``["status", "timeout"]``), each with
        a fresh budget; a retried item's Result counts the attempts of every pass. An
        interrupted pass is finished by ``run()`` again."""
        kinds = _kinds_of(retry_failed)
        if kinds is not None:
            self._retry_pass(kinds)
        self._go(self._keep, lambda run: None)
        return self.results

    def stream(self, *, retry_failed: bool | Iterable[str] = False) -> Stream:
        """Run as ``run()`` does (once iterated), yielding each Result as it is kept (on disk
        first, with a journal), in the order they finish; ``result.index`` is its item's. The
        kept Results no stream of this batch has yielded yet come first, in input order (those
        of an earlier ``run()``, of the journal, or that finished while an earlier stream
        stopped), so that over one batch every item's Result is yielded once. Leaving the loop
        over ``b.stream()`` (``break``, an exception, Ctrl-C), or closing the stream (``with
        b.stream() as results:``), stops the run as an interrupt does: what finished is kept,
        a later ``stream()`` or ``run()`` goes on with the rest."""
        return Stream(self._streaming(_kinds_of(retry_failed)))

    def _streaming(self, kinds: frozenset[str] | None) -> Generator[Result]:
        if kinds is not None:
            self._retry_pass(kinds)
        for index, kept in sorted(self._done.items()):
            if self._marks[index] == DONE and self._streamed.get(index) is not kept:
                self._streamed[index] = kept
                yield kept

        def go(give: Callable[[Result], None], on_start: Callable[[Stoppable], None]) -> None:
            self._go(self._keep, on_start, kept=give)

        with contextlib.closing(streamed(go)) as results:  # (its run stopped as this one is)
            for result in results:
                self._streamed[result.index] = result
                yield result

    def _go(
        self,
        keep: Deliver,
        on_start: Callable[[Stoppable], None],
        kept: Callable[[Result], None] | None = None,
    ) -> None:
        """Send what this pass has left, each Result given to ``keep`` (and each final one to
        ``kept`` once it is on disk); ``on_start`` sees what runs it (to stop it). One run of
        a batch at a time: a ValueError while another (a stream not ended) goes on."""
        if not self._running.acquire(blocking=False):
            raise ValueError(
                "this batch is running already (a stream() not ended, or run() in another "
                "thread): one run of a batch at a time; close the stream first"
            )
        try:
            self._run_pass(keep, on_start, kept)
        finally:
            self._running.release()

    def _run_pass(
        self,
        keep: Deliver,
        on_start: Callable[[Stoppable], None],
        kept: Callable[[Result], None] | None,
    ) -> None:
        plan = Plan(self._pass, Left(self._marks, self._form, self._done.get))
        if self.journal is None and isinstance(self._gates.spend_ledger, spend.Ledger):
            self._gates.keep_spend(self._spend_here)  # (a shared ledger keeps its own)
        with self._controller() as controller:  # JournalInUse: another run has the journal
            try:
                controller.run(
                    self._send(on_start),
                    enumerate(self.items),
                    keep,
                    plan=plan,
                    gates=self._gates,
                    progress=wanted(self._progress),
                    stints=self._stints,
                    kept=kept,
                )
            finally:
                log_summary(self._summary)

    def _retry_pass(self, kinds: frozenset[str]) -> None:
        """Start a new pass that sends again the failures of ``kinds`` (empty: all)."""
        self._pass = self._pass.retrying(kinds)
        self._marks = marks_of(self._done, len(self.items), self._pass)

    def _retried(self, kinds: frozenset[str], changes: dict[str, Any]) -> ResultSet:
        """``ResultSet.retry_failed``: the failures sent again, by a batch remade if ``changes``."""
        if {"journal", "fresh"} & set(changes):
            raise ValueError(
                "retry_failed keeps the batch's journal: journal and fresh cannot change"
            )
        batch = self
        if changes:
            arguments = self._arguments | changes | {"fresh": False}
            batch = type(self)(*self._remade_with(), **arguments)
            if batch.journal is None:  # (else it has read the same state from the journal)
                batch._done, batch._pass, batch._ledger = dict(self._done), self._pass, self._ledger
                batch._spend_here = self._spend_here
                batch._stints, batch._timeline = list(self._stints), self.results.wait_timeline
        batch._retry_pass(kinds)
        return batch.run()

    def _remade_with(self) -> tuple[Any, ...]:
        """The positional arguments that make this batch again."""
        return (self.items,)

    def _keep(self, result: Result, item: object) -> None:
        # (most Results are answers, with no page to go on from: final, done in any pass)
        plain_answer = result.ok and result.continuation is None
        if plain_answer or result.final:
            self._done[result.index] = result
            made, paged = self._pass.number, result.continuation is not None
            self._marks[result.index] = self._pass.does(result.ok, result.error_kind, made, paged)


class Batch(Resumable[FetchOptions]):
    """Fetch ``items`` in one or more ``run()`` calls; every finished Result is kept.

    A KeyboardInterrupt (a notebook's interrupt button) during ``run()`` stops taking new
    items, gives requests in flight a short grace, keeps every finished Result in
    ``results`` and raises; ``run()`` again fetches only the rest. With ``journal=`` each
    final Result is also written to that SQLite file as it is made, so a new ``Batch`` over
    the same items (after a crash, or in a new session) continues where the last one stopped.
    A journal that another run is using, or items whose ``id`` JSON cannot store, are a
    ``ValueError`` before anything is sent.
    """

    @spelled_out(FetchSettings, FetchOptions)
    def __init__(
        self,
        items: Iterable[Item] | Iterable[Mapping[str, Any]],
        *,
        url: str | None = None,
        method: str = "GET",
        body: Any = None,
        id_field: str | None = None,
        journal: str | Path | None = None,
        fresh: bool = False,
        progress: bool | None = None,
        **options: Unpack[FetchSettings],
    ) -> None:
        checked = taken(FetchOptions, options, "Batch.__init__")
        if url is None and (method != "GET" or body is not None or id_field is not None):
            raise ValueError("method, body and id_field go with url= (a template for rows)")
        self._template = None if url is None else Template.parse(url, method, body, id_field)
        if checked.batch_api is not None:
            if url is None:
                raise ValueError("batch_api needs url= (the endpoint) and the rows as items")
            if method.upper() not in ("GET", "POST"):  # (GET: the default, not asked for)
                raise ValueError(
                    f"batch_api sends every row as a POST: method={method!r} cannot apply to it"
                )
            endpoint_of(url, checked.batch_api)
            # Every row a POST; without body=, the row itself less its metadata (as the
            # command line's --row-as-body).
            self._template = Template.parse(url, "POST", body, id_field, row_as_body=body is None)
        self._cancelling = False
        fetch_processes(checked)  # (ValueError: what cannot go to other processes)
        self._start(items, checked, journal, progress, fresh=fresh, template=self._template)

    def _restore(self, record: dict[str, Any]) -> Result:
        result, expect = Result.from_dict(record), self.options.expect
        if result.ok and isinstance(expect, type) and issubclass(expect, BaseModel):
            return replace(result, data=expect.model_validate(result.data))
        return result

    def _send(self, on_start: Callable[[Stoppable], None]) -> Send:
        template = self._template
        rows = None if template is None else TemplateRows(template)
        lane = Lane(self.options, rows, self._submissions(), _WORDS)
        return plan_send(
            lane,
            url=None if template is None else template.url,
            journal=self.journal,
            passing=self._pass.number,
            ledger=self._ledger,
            cancel=self._cancelling,
            again=lambda: enumerate(self.items),
            stored=self._done.get,
            on_start=on_start,
            cluster=fetch_processes(self.options),
        )

    def _submissions(self) -> list[Part]:
        """The parts of its rows sent through a batch endpoint: the journal's, or its own."""
        return journal_parts(self.journal) if self.journal is not None else self._ledger.parts()

    def _reported(self) -> list[Part]:
        """The parts for the report (none when the journal cannot be read: no failing)."""
        try:
            parts = self._submissions()
        except (JournalMismatch, sqlite3.Error):
            return []
        return [part.shown(self.options.secrets().text) for part in parts]

    def cancel(self) -> ResultSet:
        """Cancel the batches this batch's rows are in at the provider (``batch_api=``), then
        collect what they ran: the rows they did not run end ``batch_cancelled``."""
        if self.options.batch_api is None:
            raise ValueError("cancel() is for a batch sent with batch_api=")
        self._cancelling = True
        try:
            return self.run()
        finally:
            self._cancelling = False


# How the library's refusals name the ways on.
_WORDS = Words(
    go_on="run with batch_api= to go on with them (or cancel() to cancel them), not live",
    forget="fresh=True would forget them; cancel them first (batch_api=..., cancel()) or "
    "give another journal",
)


class CallBatch(Resumable[CallOptions]):
    """Call ``fn(item)`` for ``items`` in one or more ``run()`` calls, as ``Batch`` fetches:
    every finished Result kept, an interrupt keeping what finished, ``journal=`` to continue
    in a new session. ``run_all(fn, items, **options)`` is ``CallBatch(...).run()``.

    What ``fn`` returned is journaled as JSON, through ``encode`` when given (and read back
    through ``decode``); a function that says it returns what JSON cannot hold is refused
    before anything runs, and a value JSON cannot hold, or would give back as another value (a
    tuple as a list, an int key as a str, NaN as null), fails the run at its first Result
    (``JournalFailed``), not at the end: a resumed run gives back what a first run did.
    """

    @spelled_out(CallSettings, CallOptions)
    def __init__(
        self,
        fn: Callable[[Any], Any],
        items: Iterable[Any],
        *,
        journal: str | Path | None = None,
        fresh: bool = False,
        encode: Callable[[Any], Any] | None = None,
        decode: Callable[[Any], Any] | None = None,
        progress: bool | None = None,
        **options: Unpack[CallSettings],
    ) -> None:
        checked = taken(CallOptions, options, "CallBatch.__init__")
        refuse_async(fn)
        if journal is None and (encode or decode):
            raise ValueError("encode and decode are for a journal: give journal= too")
        if journal is not None and encode is None and not _json_type(_returned_type(fn)):
            raise ValueError(
                f"{getattr(fn, '__name__', 'fn')} returns {_returned_type(fn)!r}, which the "
                "journal cannot store as JSON: give encode= (and decode=)"
            )
        if process_options(checked)[1:]:  # (ValueError: what cannot go to other processes)
            check_callable(fn)
        self._fn, self._encode, self._decode = fn, encode, decode
        self._start(items, checked, journal, progress, fresh=fresh, strict=True)

    def _restore(self, record: dict[str, Any]) -> Result:
        result = Result.from_dict(record)
        if result.ok and self._decode is not None:
            return replace(result, data=self._decode(result.data))
        return result

    def _stored(self, result: Result, item: object) -> tuple[str, str | None]:
        if result.ok and self._encode is not None:
            try:
                result = replace(result, data=self._encode(result.data))
            except Exception as exc:  # its message reaches the run's error: masked
                reason = self.options.secrets().text(describe(exc))
                raise ValueError(f"encode failed on item {result.index}: {reason}") from None
        changed = _json_changes(result.data) if result.ok else None
        if changed is not None:  # (a resumed run would give back another value)
            raise ValueError(f"item {result.index} returned {changed}: give encode= (and decode=)")
        return encode_result(result, item)

    def _send(self, on_start: Callable[[Stoppable], None]) -> Send:
        shares = process_options(self.options)
        if len(shares) > 1:
            return on_processes([calls_in_worker(share, self._fn) for share in shares], on_start)
        return partial(run_calls, self.options, self._fn, on_start=on_start)

    def _remade_with(self) -> tuple[Any, ...]:
        return (self._fn, self.items)


def _json_changes(value: Any) -> str | None:
    """What in ``value`` JSON would give back as another value (None: nothing; what JSON
    cannot hold at all is the encoder's to say)."""
    if isinstance(value, tuple):
        return "a tuple, which JSON gives back as a list"
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN or an infinity, which JSON gives back as null"
    if isinstance(value, list):
        return next(filter(None, map(_json_changes, value)), None)
    if isinstance(value, dict):
        if not all(isinstance(key, str) for key in value):
            return "a key that is not a str, which JSON gives back as a str"
        return next(filter(None, map(_json_changes, value.values())), None)
    return None


def refuse_async(fn: Callable[..., Any]) -> None:
    """ValueError for an ``async def``: called, it would return a coroutine never run."""
    if inspect.iscoroutinefunction(fn):
        raise ValueError(f"{fn.__name__} is async: batchsync makes blocking calls")


def _returned_type(fn: Callable[..., Any]) -> object:
    """What ``fn`` says it returns (Any when it does not say, or says it unreadably)."""
    try:
        return typing.get_type_hints(fn).get("return", Any)
    except Exception:  # a hint naming what cannot be imported here, or no hints at all
        return Any


def _json_type(hint: object) -> bool:
    """False only for a hint JSON cannot hold as it is: a class none of JSON's types (nor a
    TypedDict, str or int Enum), a tuple or a dict keyed by other than str, even inside."""
    origin, arguments = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin is tuple or (origin is dict and arguments and arguments[0] is not str):
        return False
    if origin is not None:  # (a container: what its arguments say)
        return all(_json_type(arg) for arg in arguments if isinstance(arg, type))
    if not isinstance(hint, type) or typing.is_typeddict(hint):
        return True  # Any, a NewType, a TypeVar: they do not say
    return issubclass(hint, str | int | float | bool | list | dict | type(None))
