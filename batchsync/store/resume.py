"""What is left of a run, and how each item left goes on: the one reading of a journal that
``Batch``, the command line and the cluster runners make before they send anything.

A journal says what the run's current pass does with each item (``Pass.does``): nothing, send
it (no final Result yet), send it again (a failure the pass retries) or go on from its next
page (a paginated item stopped partway). ``Left.sent`` turns that into what a runner sends,
each item in the runner's own form (an item, a table row, an input entry), and keeps the
Result each item sent again already has, for the run to add its new one to
(``controller.adding_to``).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar

from ..core.history import DONE, TO_FINISH, TO_GO_ON, TO_SEND, Pass, Stint
from ..core.result import Result
from ..http.paginate import Continued, same_origin
from ..http.spec import item_label
from .journal import JournalReader, JournalUnusable, resumed

log = logging.getLogger("batchsync")

# Logged for an item whose journaled next page is not on its origin (the journal was altered).
STARTS_OVER = "%s: the journal's next page is not on the item's origin: it starts over"

T = TypeVar("T")


class Form(Protocol[T]):
    """How a runner's items look to a resume: the URL an item is sent to (whose origin its
    next page must keep), where it stands (for a warning), and the item going on from a later
    page."""

    def url(self, item: T) -> str | None: ...

    def where(self, index: int, item: T) -> str: ...

    def going_on(self, item: T, continuation: Mapping[str, Any], data: Any) -> T: ...


@dataclass(frozen=True)
class Items:
    """The library's items (``template_url``: rows, each sent where its template says)."""

    template_url: str | None = None

    def url(self, item: Any) -> str | None:
        return self.template_url if self.template_url is not None else item_label(item)[0]

    def where(self, index: int, item: Any) -> str:
        return f"item {index}"

    def going_on(self, item: Any, continuation: Mapping[str, Any], data: Any) -> Any:
        return Continued.of(item, continuation, data)


def trusted_continuation(item_url: str | None, continuation: Any) -> bool:
    """Whether a journaled next page may be taken up for the item at ``item_url``: on the
    item's own origin, as pagination never leaves it (a page elsewhere would get the item's
    headers and secrets)."""
    url = continuation.get("url") if isinstance(continuation, Mapping) else None
    return isinstance(url, str) and item_url is not None and same_origin(url, item_url)


@dataclass
class Left(Generic[T]):
    """What a pass has still to do: ``marks``, what it does with each item (``Pass.does``),
    and ``stored``, the Result each item has so far (None: none), with where a paginated one
    goes on (``Result.continuation``)."""

    marks: bytearray
    form: Form[T]
    stored: Callable[[int], Result | None] = lambda index: None
    # The Results of the items sent again, until their new ones come (``taken``).
    _earlier: dict[int, Result] = field(default_factory=dict, init=False)

    @property
    def count(self) -> int:
        """How many items the pass has still to send."""
        return len(self.marks) - self.marks.count(DONE)

    @property
    def earlier(self) -> Callable[[int], Result | None] | None:
        """``taken``; None when the pass sends no item again and goes on with none, so that
        a run with no Result to add to delivers each new one without a look-up."""
        marks = self.marks
        return None if marks.count(DONE) + marks.count(TO_SEND) == len(marks) else self.taken

    def sent(self, items: Iterable[tuple[int, T]]) -> Iterator[tuple[int, T]]:
        """The (index, item) pairs the pass sends, read lazily: an item with a final Result
        is left out, a failure retried is sent again, a paginated item stopped partway goes
        on from its next page."""
        marks = self.marks
        for index, item in items:
            mark = marks[index]
            if mark == TO_SEND:  # (most items: sent as they are)
                yield index, item
            elif mark != DONE:
                yield index, self._sent(index, item, mark)

    def _sent(self, index: int, item: T, mark: int) -> T:
        """The item as sent, keeping the Result it has for the new one to add to: a paginated
        item goes on from its next page (from its first, adding to none, when not on its origin)."""
        before = None if mark == TO_SEND else self.stored(index)
        if mark in (TO_GO_ON, TO_FINISH):
            url = self.form.url(item)
            if before is None or not trusted_continuation(url, before.continuation):
                log.warning(STARTS_OVER, self.form.where(index, item))
                return item
            item = self.form.going_on(item, before.continuation, before.data)
        if before is not None:
            self._earlier[index] = before
        return item

    @property
    def before(self) -> Callable[[int], Result | None] | None:
        """An item's Result from an earlier pass while it is sent again (its new one not yet
        come); None when the pass sends no item again (see ``earlier``)."""
        return None if self.earlier is None else self._earlier.get

    def taken(self, index: int) -> Result | None:
        """The Result an item sent again had (None: it had none), given once, when its new
        one comes."""
        return self._earlier.pop(index, None)


def planned(
    reader: JournalReader, size: int, retry: frozenset[str] | None
) -> tuple[Pass, bytearray]:
    """The pass a run makes over a journal's ``size`` items, and what it does with each: a
    retry of the failures of ``retry`` (empty: all) starts a new pass; otherwise the last one
    goes on, so a retry that was interrupted is finished by a resume."""
    latest = reader.latest_pass()
    current = latest if retry is None else latest.retrying(retry)
    return current, reader.outstanding(size, current)


def stored_in(reader: JournalReader, size: int) -> Callable[[int], Result | None]:
    """Each item's stored Result, read from the journal when asked for (a run of the command
    line holds no more than it must)."""
    going_on = reader.unfinished(size)

    def stored(index: int) -> Result | None:
        if index in going_on:
            continuation, record = going_on[index]
            return replace(Result.from_dict(json.loads(record)), continuation=continuation)
        text = reader.record(index)
        return None if text is None else Result.from_dict(json.loads(text))

    return stored


@dataclass
class Kept:
    """What a journal holds for a run's items, read back whole (a batch keeps every Result):
    each item's Result, the pass the run is in and what it does with each item, what each
    process did and the seconds they waited at each gate by second."""

    done: dict[int, Result]
    passing: Pass
    marks: bytearray
    stints: list[Stint]
    timeline: dict[tuple[str, int], float]

    @classmethod
    def nothing(cls, size: int) -> Kept:
        """What a run of ``size`` items holds before it starts: nothing."""
        return cls({}, Pass(), bytearray(size), [], {})


def read_back(
    path: Path, identity: Mapping[str, str], restore: Callable[[dict[str, Any]], Result], hint: str
) -> Kept:
    """The journal at ``path``, made for the items of ``identity`` (JournalMismatch naming
    the problem, then ``hint``, otherwise), read back: each Result as ``restore`` makes it
    from its record, with when it finished and where a paginated one goes on; a record
    ``restore`` cannot read is JournalUnusable."""
    size = int(identity["entries"])
    kept = Kept.nothing(size)
    with resumed(path, identity, "items", hint) as reader:
        for index, record, _, finished in reader.finals():
            try:
                result = restore(json.loads(record))
            except Exception as exc:  # the caller's decode, say
                raise JournalUnusable(
                    f"the journal {path}: the Result of item {index} cannot be read back: "
                    f"{type(exc).__name__}"
                ) from None
            if finished is not None:  # (for the report's charts)
                result = replace(result, finished=float(finished))
            kept.done[index] = result
        for index, (continuation, _) in reader.unfinished(size).items():
            kept.done[index] = replace(kept.done[index], continuation=continuation)
        kept.passing, kept.marks = planned(reader, size, None)
        kept.stints = reader.stints()
        kept.timeline = reader.timeline()
    return kept


def marks_of(done: Mapping[int, Result], size: int, current: Pass) -> bytearray:
    """What pass ``current`` does with each of ``size`` items, whose Results so far, all made
    in passes before it, are ``done`` (a batch starting a retry in memory)."""
    marks = bytearray(size)
    earlier = current.number - 1
    for index, result in done.items():
        continued = result.continuation is not None
        marks[index] = current.does(result.ok, result.error_kind, earlier, continued)
    return marks
