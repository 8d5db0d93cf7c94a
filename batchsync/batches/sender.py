"""A run through a provider's batch endpoint: the rows left are checked, split into parts at
the caps, each part uploaded and submitted, the batches polled until they end, and each
row's answer delivered as its Result, in whatever order the provider lists them (the
journal and the outputs put them in input order).

Every step is recorded in the ledger before the next depends on it: a part is planned (under
a spend cap, with its reservation: every row's worst case at the batch price), then uploaded,
then marked ``submitting`` before the create is sent, then holds its batch id. A row whose
worst case does not fit in what the cap leaves waits for the parts in flight to be settled by
what their answers used, and ends ``cost`` if it never fits.
A run that goes on with the ledger follows each open part from where it stood (a part
caught ``submitting`` is looked for at the provider before anything is sent again), so a
part is never submitted twice. A stop (Ctrl-C) leaves the batches running at the provider.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import KW_ONLY, dataclass, field, replace
from typing import Any, Literal

from ..core.admission import PICO
from ..core.backoff import Backoff
from ..core.observe import Observer
from ..core.result import AttemptRecord, Result, added_to, result_of
from ..core.verdict import ErrorKind, InvalidItem, Verdict, success, terminal
from ..http.decode import InvalidBody, decode_value
from ..http.httpfacts import HttpFacts
from ..http.spec import RequestSpec
from ..limits import spend
from ..limits.tokens import estimate_tokens, usage_parts
from ..store.submissions import (
    CLEANED,
    COLLECTED,
    DROPPED,
    HELD,
    MOST_TOKENS,
    PLANNED,
    SUBMITTING,
    UPLOADED,
    WAITING,
    Charge,
    Covered,
    Ledger,
    Part,
    indexes_in,
    new_tag,
    ranges_of,
    times_sent,
    well_formed,
)
from .client import Client, ProviderRefused, Stopped, Unread, custom_id_of
from .lanes import LivePace, goes_live
from .protocol import Answer, BatchProvider, Endpoint, index_of, is_row_id, row_failure
from .providers import provider_of

log = logging.getLogger("batchsync")

# Polling when --poll is not given: from a few seconds to a minute.
POLL_BACKOFF = Backoff(base=5.0, factor=1.5, max=60.0, jitter=0.1)
_WITHDRAWN = "cancelled (--cancel) before it was submitted"
# How long before a part's submission (in the provider's clock) a batch in the provider's
# list may have been made to be the part's: the ``Date``'s second, the create on its way.
_CLOCK_SKEW = 120.0


@dataclass(frozen=True)
class Plan:
    """What the run was asked: endpoint, caps, polling, limits, --cancel, --keep-files."""

    endpoint: Endpoint
    passing: int
    max_rows: int | None = None
    max_bytes: int | None = None
    poll: float | None = None
    budget: float | None = None
    keep_files: bool = False
    cancel: bool = False
    expect: object = "json"
    prices: spend.Prices | None = None  # (with a spend cap)
    retries: int = 0  # (--batch-retries: the new parts a row the policy retries may go in)
    live: LivePace | None = None  # (lanes="auto": the live lane's pace, to plan the deadline)

    @property
    def caps(self) -> tuple[int, int]:
        """The most rows and bytes a submission takes: as asked, never beyond the provider's."""
        rows, size = provider_of(self.endpoint).caps
        return min(self.max_rows or rows, rows), min(self.max_bytes or size, size)


@dataclass
class _Followed:
    """What this run knows of the parts it follows, by part number (``ids``: by row index)."""

    parts: dict[int, Part] = field(default_factory=dict)
    ids: dict[int, Any] = field(default_factory=dict)
    lines: dict[int, list[bytes]] = field(default_factory=dict)
    retry_at: dict[int, float] = field(default_factory=dict)
    rows: dict[int, set[int]] = field(default_factory=dict)
    delivered: dict[int, set[int]] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)
    # Under a spend cap: each row's worst case and prices, the rows waiting for room under the
    # cap (their bodies), and by part what the rows read so far spent.
    priced: dict[int, spend.Priced] = field(default_factory=dict)
    deferred: dict[int, Mapping[str, Any]] = field(default_factory=dict)
    spent: dict[int, int] = field(default_factory=dict)
    # Rows whose failure the retry policy lets a new part redo (their failures), and the
    # failure of each row sent again, added to its next Result.
    redo: dict[int, Result] = field(default_factory=dict)
    earlier: dict[int, Result] = field(default_factory=dict)
    # With lanes="auto": each part's rows' estimated tokens, and the rows moved to the live
    # lane (their batch cancelled, or never made), for it to send once this run has ended.
    tokens_in: dict[int, int] = field(default_factory=dict)
    moved: set[int] = field(default_factory=set)

    def given(self, part: Part) -> set[int]:
        """The rows of ``part`` this run is to deliver."""
        return self.rows.get(part.number) or set(indexes_in(part.rows))


@dataclass
class _Cut:
    """The new part being filled: its number, its own name, its rows' lines and their bytes."""

    number: int
    lines: list[tuple[int, bytes]] = field(default_factory=list)
    size: int = 0
    worst: int = 0  # (under a spend cap: what its rows may cost at most)
    tokens: int = 0  # (with lanes="auto": its rows' estimated tokens)

    def __post_init__(self) -> None:
        self.tag = new_tag(self.number)
        self.nonce = self.tag.rpartition("-")[2]

    def fits(self, provider: BatchProvider, plan: Plan, line: int) -> bool:
        """Whether one more line of ``line`` bytes stays within the caps of one submission."""
        rows, size = len(self.lines) + 1, self.size + line
        most_rows, most_bytes = plan.caps
        return rows == 1 or (
            rows <= most_rows and provider.submission_size(rows, size) <= most_bytes
        )


@dataclass
class _Sending:
    """A part on its way to the provider, and whether a create may have made its batch unsaid."""

    part: Part
    unanswered: bool


@dataclass
class _Reading:
    """What a part's results reads found, over every read (``unread``: the batch is kept)."""

    nonce: str
    rows: set[int]
    done: set[int]
    tokens: list[int]
    failures: dict[int, Result] = field(default_factory=dict)
    redoable: set[int] = field(default_factory=set)
    others: int = 0
    unread: bool = False

    def take(self, provider: BatchProvider, line: Any) -> Answer | None:
        """The answer of a results line for an undelivered row of the part (others: counted)."""
        if not isinstance(line, Unread):
            answer = provider.answer_of(line, self.nonce)
        elif (index := index_of(line.custom_id, self.nonce)) is not None:
            answer = Answer(index, False, None, None, "invalid_body", line.reason)
        else:
            answer = None
        if answer is None:
            self.others += is_row_id(custom_id_of(line, provider.row_key))
            return None
        if answer.index not in self.rows or answer.index in self.done:
            return None
        self.done.add(answer.index)
        self.unread = self.unread or (isinstance(line, Unread) and line.again)
        used = zip(self.tokens, provider.usage_of(answer.data), strict=True)
        self.tokens[:] = [min(had + more, MOST_TOKENS - 1) for had, more in used]
        return answer


# What ends a row's wait for its part without its answer (``_hold``): the deadline, the
# budget, or a ``batch_errored`` saying so. Such a part is kept for a later run given its rows.
_WAITED = frozenset({"deadline", "budget"})
_HELD = ": --retry-failed reads it again, --cancel cancels it"
# A row's attempt under a spend cap: dollars spent and reserved, the model priced (or Nones).
Spent = tuple[float | None, float | None, str | None]


class BatchApiFailed(OSError):
    """The run cannot go on without risking a row twice or another's results as its own."""


@dataclass
class BatchRun:
    """Sends the rows left through the batch endpoint (see the module docstring), by the
    client's ``clocks``; stoppable from a signal handler. ``url``: as Results show it."""

    plan: Plan
    client: Client
    ledger: Ledger
    request_of: Callable[[object], RequestSpec]
    url: str
    _: KW_ONLY
    observer: Observer = field(default_factory=Observer)
    again: Callable[[], Iterable[tuple[int, object]]] | None = None
    mask: Callable[[str], str] = str
    spending: spend.Ledger | None = None  # (the spend cap's, with ``plan.prices``)
    # The Result each row had when the run began (a part's rows an earlier run read).
    stored: Callable[[int], Result | None] = lambda index: None

    def __post_init__(self) -> None:
        self._provider: BatchProvider = self.client.provider
        self._clocks = clocks = self.client.clocks
        self._clock, self._unix_time = clocks.clock, clocks.unix_time

    # --- Stoppable ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._clocks.stop.set()

    @property
    def stopped(self) -> bool:
        return self._clocks.stop.is_set()

    @property
    def moved(self) -> list[int]:
        """The rows moved to the live lane (``lanes="auto"``), in input order: no batch of
        this run answered them, nor will."""
        return sorted(self._followed.moved)

    def tries_of_moved(self) -> dict[int, Result]:
        """What the batches tried of the rows moved live (their failures), by row: to add to
        each one's live Result."""
        earlier = self._followed.earlier
        return {index: earlier[index] for index in self._followed.moved if index in earlier}

    # --- the run --------------------------------------------------------------------------------
    def run(
        self,
        items: Iterable[tuple[int, object]],
        deliver: Callable[[Result, object], None],
        *,
        expected: int = 0,
    ) -> bool:
        """Send what is left of ``items`` (``expected`` of them, when known), delivering each
        Result; True when stopped first."""
        self._deliver = deliver
        self._followed = _Followed()
        self._moving = False
        self._expected, self._taken = expected, 0
        try:
            self._take(items)
            if self.plan.cancel:
                self._cancel_all()
            self._follow()
        except Stopped:
            pass
        except ProviderRefused as exc:  # (a part it could not tell the state of)
            raise BatchApiFailed(str(exc)) from None
        return self.stopped

    def _take(self, items: Iterable[tuple[int, object]]) -> None:
        """Read the rows left: one no batch can carry fails, the others join an open or new part."""
        open_parts = self._settled([part for part in self.ledger.parts() if part.open])
        covered, known = Covered(open_parts), {part.number: part for part in open_parts}
        cut = self._new_cut()
        refusal = self.client.refusal()
        for index, item in items:
            if self.stopped:
                return
            self._taken += 1
            body = self._body(index, item, refusal)
            if body is None:
                continue
            number = covered.part_of(index)
            if number is not None:
                self._rejoin(known[number], index, body)
            else:
                cut = self._place(index, item, body, cut)
        if cut.lines:
            self._plan_part(cut)
        for part in open_parts:
            if part.number not in self._followed.parts and part.state in self._provider.shape.ended:
                self._close_unfollowed(part, covered)

    def _close_unfollowed(self, part: Part, covered: Covered) -> None:
        """An ended part none of the rows given to this run is in: closed when an earlier run
        read its answers, else kept (held) for the run given its rows: never sent again."""
        if self._waited_for(part, covered):
            self.ledger.save(part.moved(HELD, self._unix_time()))
            return
        self._settle(part, None)
        self.ledger.save(part.moved(COLLECTED, self._unix_time()))

    def _new_cut(self) -> _Cut:
        return _Cut(max((part.number for part in self.ledger.parts()), default=0) + 1)

    def _body(self, index: int, item: object, refusal: str | None) -> Mapping[str, Any] | None:
        """The row's body, its id noted; None for a row no batch can carry (its Result given)."""
        try:
            spec = self.request_of(item)
            if refusal is not None:
                raise InvalidItem(refusal)
            body = _body_of(spec, self.plan.endpoint)
        except InvalidItem as exc:
            self._give(self._unsent(index, str(exc)), item)
            return None
        if spec.id is not None:
            self._followed.ids[index] = spec.id
        return body

    def _rejoin(self, earlier: Part, index: int, body: Mapping[str, Any]) -> None:
        """Follow a row in the earlier run's open part that holds it (with its line, if unsent)."""
        self._followed.parts[earlier.number] = earlier
        self._followed.rows.setdefault(earlier.number, set()).add(index)
        if self.plan.live is not None:
            tokens = self._followed.tokens_in
            tokens[earlier.number] = tokens.get(earlier.number, 0) + estimate_tokens(body)
        if self.ledger.charge_of(earlier.number) is not None:  # (sent under a cap)
            with contextlib.suppress(spend.Unpriced):  # (its cost then stays at its worst)
                self._price(index, body)
        if earlier.batch is None:
            line = self._provider.request_line(self.plan.endpoint, index, body, earlier.nonce)
            self._followed.lines.setdefault(earlier.number, []).append(line)

    def _place(self, index: int, item: object, body: Mapping[str, Any], cut: _Cut) -> _Cut:
        """The cut with the row (a full cut submitted first); a row too big, withdrawn or that
        cannot be priced fails; one the spend cap has no room for waits (``deferred``)."""
        provider, plan = self._provider, self.plan
        if plan.cancel:
            self._give(self._unsent(index, _WITHDRAWN, "batch_cancelled"), item)
            return cut
        try:
            worst = self._price(index, body)
        except spend.Unpriced as exc:
            self._give(self._unsent(index, str(exc), exc.kind), item)
            return cut
        line = provider.request_line(plan.endpoint, index, body, cut.nonce)
        if provider.submission_size(1, len(line)) > plan.caps[1]:
            reason = f"the row is larger than a submission may be ({plan.caps[1]} bytes)"
            self._give(self._unsent(index, reason), item)
            return cut
        if not cut.fits(provider, plan, len(line)):
            self._plan_part(cut)
            cut = _Cut(cut.number + 1)
            line = provider.request_line(plan.endpoint, index, body, cut.nonce)
        if self.spending is not None and not self.spending.fits(cut.worst + worst):
            self._followed.deferred[index] = body
            return cut
        cut.lines.append((index, line))
        cut.size += len(line)
        cut.worst += worst
        cut.tokens += 0 if plan.live is None else estimate_tokens(body)
        return cut

    def _price(self, index: int, body: Mapping[str, Any]) -> int:
        """The row's worst case at the batch price (0 without a cap); Unpriced when the
        price table cannot say it."""
        if self.plan.prices is None:
            return 0
        priced = self._followed.priced.get(index)  # (a row waiting for room: priced already)
        if priced is not None:
            return priced.worst
        priced = spend.priced(body, self.plan.prices, batch=True)
        self._followed.priced[index] = priced
        return priced.worst

    def _settled(self, parts: list[Part]) -> list[Part]:
        """The open parts of earlier runs with a batch at the provider (one whose create got no
        answer looked for first); the others are dropped (file deleted), their rows cut again."""
        kept = []
        for earlier in parts:
            part = earlier
            if part.batch is None and part.submitted is not None:  # (a create was sent)
                try:
                    found = self._find(part)
                except ProviderRefused as exc:
                    if not exc.retryable:
                        raise
                    kept.append(part)  # (not known yet: its rows wait for it, not cut again)
                    continue
                if found is not None:
                    part = self._record(part, found)
            if part.batch is None:
                if part.input_file is None and self._provider.shape.uploads:
                    part = replace(part, input_file=self.client.file_named(_file_name(part)))
                self._settle(part, 0)  # (no batch was made of it: nothing billed)
                self.ledger.save(part.moved(DROPPED, self._unix_time()))
            else:
                kept.append(part)
        return kept

    def _plan_part(self, cut: _Cut) -> None:
        """A new part of the rows cut, recorded, then submitted."""
        rows, plan = ranges_of(index for index, _ in cut.lines), self.plan
        part = Part(cut.number, plan.passing, plan.endpoint.provider, rows, tag=cut.tag)
        part = part.moved(PLANNED, self._unix_time())
        self._save(part, self._reserve(cut.worst))
        self._followed.lines[cut.number] = [line for _, line in cut.lines]
        self._followed.tokens_in[cut.number] = cut.tokens
        self._check_live(self._poll_wait(1))  # (a part that may not be sent at all)
        self._submit(part)

    # --- submitting -------------------------------------------------------------------------------
    def _submit(self, part: Part) -> None:
        """Upload (OpenAI) and create the part's batch, recording each step first; one refused
        for now waits, ``submitted`` kept if a create may have made its batch (looked for first)."""
        sending = _Sending(part, unanswered=part.submitted is not None)
        try:
            recorded = self._submitted(sending)
        except ProviderRefused as exc:
            if not exc.retryable:
                self._fail_part(sending.part, str(exc), exc.status)
                return
            part = sending.part
            log.warning("part %d not submitted yet (%s): trying again later", part.number, exc)
            sent = part.submitted if sending.unanswered else None
            self._save(part.moved(WAITING, self._unix_time(), submitted=sent))
            self._later(part, exc)
            return
        if recorded is None or not self._withdrawing:
            return
        try:  # (found after the cancels; one it will not cancel, ended already, is followed)
            self.client.cancel(recorded.batch or "")
        except ProviderRefused as exc:
            log.warning("could not cancel the batch %s: %s", recorded.batch, exc)

    def _submitted(self, sending: _Sending) -> Part | None:
        """The part with its batch recorded; None when --cancel withdrew it (it has none)."""
        part = sending.part
        # (an OpenAI part submitted again after the token cap refused it has its file)
        lines = self._followed.lines.get(part.number, [])
        if self._withdrawing and not sending.unanswered:
            self._withdraw(part)  # (--cancel, or rows going live, submit nothing)
            return None
        if part.input_file is None and self._provider.shape.uploads:
            file_id = self.client.upload(lines, _file_name(part))
            sending.part = part = part.moved(UPLOADED, self._unix_time(), input_file=file_id)
            self._save(part)
            if self.stopped:  # (stopped during the upload: nothing is created)
                raise Stopped
        batch = self._find(part) if sending.unanswered else None
        if batch is not None:
            recorded = self._record(part, batch)
        elif self._withdrawing:  # (its create made no batch: there is none to cancel)
            self._withdraw(part)
            return None
        else:
            recorded = self._create(sending, lines)
        self._save(recorded)
        self._followed.lines.pop(part.number, None)
        return recorded

    def _create(self, sending: _Sending, lines: list[bytes]) -> Part:
        """The part with its new batch (``submitting`` first; a create unanswered: looked for)."""
        part = sending.part.moved(SUBMITTING, self._unix_time(), submitted=self._unix_time())
        sending.part = part
        self._save(part)
        try:
            made = self.client.create(input_file=part.input_file, lines=lines, part=part.number)
            return self._record(part, made)
        except ProviderRefused as exc:
            if exc.status is not None and exc.status < 500:
                raise  # (answered: no batch was made)
            sending.unanswered = True
            batch = self._find(part)
            if batch is None:
                raise
            return self._record(part, batch)

    @property
    def _withdrawing(self) -> bool:
        """Whether parts are cancelled rather than submitted: --cancel, or rows going live."""
        return self.plan.cancel or self._moving

    def _withdraw(self, part: Part) -> None:
        """A part with no batch dropped (nothing billed): its rows end ``batch_cancelled``
        (--cancel), or go live."""
        if self.plan.cancel:
            self._fail_rest(part, _WITHDRAWN, "batch_cancelled", None)
        else:
            self._followed.moved |= self._rest_of(part)
        self._settle(part, 0)
        self.ledger.save(part.moved(DROPPED, self._unix_time(), submitted=None))
        self._followed.parts.pop(part.number, None)

    def _later(self, part: Part, refused: ProviderRefused) -> None:
        """Look at ``part`` again after a poll's wait, never before the Retry-After."""
        wait = max(self._poll_wait(1), refused.retry_after or 0.0)
        self._followed.retry_at[part.number] = self._clock() + wait

    def _find(self, part: Part) -> Mapping[str, Any] | None:
        """The batch made of a part whose create got no answer (None: none, see ``_whose``); a
        look that fails is retryable: the part waits, never made twice nor taking another's."""
        try:
            return self._look_for(part)
        except ProviderRefused as exc:
            if exc.retryable:
                raise
            raise ProviderRefused(
                f"part {part.number}: the provider refused the look for the batch its create may "
                f"have made ({exc}): it waits, not submitted again",
                retryable=True,
            ) from None

    def _look_for(self, part: Part) -> Mapping[str, Any] | None:
        known = {p.batch for p in self.ledger.parts() if p.batch is not None}
        since = (part.submitted or 0.0) - _CLOCK_SKEW
        candidates, unsure = [], 0
        for batch in self.client.recent(since):
            whose = self._whose(batch, part, known, since)
            unsure += whose == "unsure"
            if whose == "mine":
                candidates.append(batch)
        if len(candidates) > 1:
            raise ProviderRefused(
                f"part {part.number}: {len(candidates)} batches at the provider were made of "
                "its rows; none is taken"
            )
        if not candidates and unsure:
            raise ProviderRefused(
                f"part {part.number}: a batch that may be its own has not ended yet", retryable=True
            )
        return candidates[0] if candidates else None

    def _whose(
        self, batch: Mapping[str, Any], part: Part, known: set[str], since: float
    ) -> Literal["mine", "unsure"] | None:
        """What a batch in the provider's list is to ``part`` (made ``since``): its batch,
        one that may be and has not ended (``unsure``), or none (None)."""
        provider = self._provider
        batch_id = well_formed(provider.name, "batch", provider.batch_id(batch))
        not_mine = batch_id is None or batch_id in known or not provider.belongs_to(batch, part)
        if not_mine or provider.refused_for_tokens(batch):
            return None
        if provider.identifies_rows:
            return "mine"
        if not self.client.made_since(provider.created_at(batch), since):
            return None
        if provider.status_of(batch) not in provider.shape.ended:
            return "unsure"
        files = provider.files_of(batch)  # (an ended one is the part's if its rows carry its nonce)
        given = self.client.row_of(self.client.first_result(files, str(batch_id), part.size)) or ""
        return "mine" if given.startswith(f"{part.nonce}-") else None

    def _record(self, part: Part, batch: Any) -> Part:
        """``part`` with the batch made of it, recorded; an answer naming none: ProviderRefused."""
        provider = self._provider
        found = batch if isinstance(batch, Mapping) else {}
        batch_id = well_formed(provider.name, "batch", provider.batch_id(found))
        if batch_id is None:
            raise ProviderRefused("the provider answered the create without a batch id")
        status = provider.status_of(found) or provider.shape.statuses[0]
        part = part.moved(status, self._unix_time(), batch=batch_id)
        self.ledger.save(part)
        return part

    def _save(self, part: Part, charge: Charge | None = None) -> None:
        self.ledger.save(part, charge)
        self._followed.parts[part.number] = part

    # --- the spend cap ---------------------------------------------------------------------
    def _reserve(self, amount: int) -> Charge | None:
        """A new part's charge: ``amount`` reserved under the cap (None without one)."""
        if self.spending is None:
            return None
        mark = self.spending.reserve(amount)
        if mark is None or mark is False:  # (its rows were placed only while it had room)
            raise BatchApiFailed("the spend cap refused a part its rows were placed within")
        return mark, amount

    def _settle(self, part: Part, spent: int | None) -> None:
        """Settle ``part``'s charge at ``spent`` when known (0: nothing of it was billed);
        else (None) at what its rows read here spent, those an earlier run read at their
        Results' cost, the others at their worst case by today's prices (at the whole
        reservation when the items cannot be read again)."""
        charge = self.ledger.charge_of(part.number)
        if charge is None or self.spending is None:
            return
        mark, reserved = charge
        if spent is None:
            read = self._followed.spent.get(part.number, 0)
            unread = set(indexes_in(part.rows)) - self._followed.delivered.get(part.number, set())
            rest = self._unread_cost(unread)
            spent = read + (reserved if rest is None else rest)
        self.spending.settle(mark, reserved, spent)
        self.ledger.settled(part.number)

    def _unread_cost(self, unread: set[int]) -> int | None:
        """What rows of a part this run did not read may have cost (``_row_cost``); None
        when one cannot be read again or priced."""
        if not unread:
            return 0
        if self.again is None or self.plan.prices is None:
            return None
        costs = [self._row_cost(index, item) for index, item in self.again() if index in unread]
        if len(costs) < len(unread) or None in costs:
            return None
        return sum(cost for cost in costs if cost is not None)

    def _row_cost(self, index: int, item: object) -> int | None:
        """A row's answer's cost by its Result (over every pass: no less than its part's),
        else its worst case; None when it cannot be priced."""
        stored = self.stored(index)
        if stored is not None and stored.ok and stored.cost is not None:
            return math.ceil(stored.cost * PICO)
        assert self.plan.prices is not None
        try:
            body = _body_of(self.request_of(item), self.plan.endpoint)
            return spend.priced(body, self.plan.prices, batch=True).worst
        except InvalidItem:  # (Unpriced among them)
            return None

    def _waited_for(self, part: Part, covered: Covered) -> bool:
        """Whether some row of ``part`` (not sent again in a later open part) has no answer of
        it yet: no Result, or one that ended its wait for the part (the deadline, the budget, a
        batch that could not be read)."""
        for index in indexes_in(part.rows):
            if covered.part_of(index) != part.number:
                continue
            stored = self.stored(index)
            if stored is None or stored.error_kind in _WAITED:
                return True
            if stored.error_kind == "batch_errored" and (stored.error or "").endswith(_HELD):
                return True
        return False

    def _charged(self, answer: Answer, part: Part, *, again: bool) -> Spent:
        """What a row's answer cost and had reserved, in dollars, and its model, counted for
        its part (None: no cap): its usage at the batch price; an error line nothing (failures
        are not billed), an unread one its worst case, unless read ``again`` later (its part
        then kept, its cost counted when it is read)."""
        priced = self._followed.priced.get(answer.index)
        if priced is None or again:
            return None, None, None
        if answer.ok:
            cost = priced.spent(usage_parts(answer.data, cached=True))
        else:
            cost = priced.worst if answer.error_kind == "invalid_body" else 0
        spent = self._followed.spent
        spent[part.number] = spent.get(part.number, 0) + cost
        return cost / PICO, priced.worst / PICO, priced.model

    def _place_deferred(self) -> None:
        """Put the rows waiting for room under the cap in a new part, as many as fit now."""
        waiting, self._followed.deferred = self._followed.deferred, {}
        cut = self._new_cut()
        for index, body in sorted(waiting.items()):
            cut = self._place(index, None, body, cut)
        if cut.lines:
            self._plan_part(cut)

    def _end_deferred(self) -> None:
        """The rows the cap never had room for end ``cost``, to run again with a larger cap
        (or ``deadline``, when it came while they waited)."""
        waiting, self._followed.deferred = self._followed.deferred, {}
        left = self._clocks.left()
        if left is not None and left <= 0:
            kind: ErrorKind = "deadline"
            reason = "the deadline came while it waited for room under max_cost"
        else:
            kind, reason = "cost", "its worst case did not fit in what max_cost left"
        self._give_failures({index: self._unsent(index, reason, kind) for index in waiting})

    # --- following -----------------------------------------------------------------------------
    def _follow(self) -> None:
        """Poll the open parts until all end, it stops or time is out (never waiting past it)."""
        rounds = 0
        while self._going_on() and not self._out_of_time():
            rounds += 1
            wait, left = self._poll_wait(rounds), self._clocks.left()
            self._check_live(wait)
            if not self._clocks.pause(wait if left is None else min(wait, left)):
                return
        if not self.stopped:
            self._end_deferred()
            self._give_failures(self._followed.redo)  # (no time left to send them again)

    def _going_on(self) -> bool:
        """One round; then the rows to redo sent in a new part, and the rows waiting under the
        cap placed as far as the parts settled so far leave room. True while some part is still
        open."""
        still = self._round()
        left = self._clocks.left()
        if self.stopped or (left is not None and left <= 0):
            return still
        if self._followed.redo:
            self._send_again()
        if self._followed.deferred:
            self._place_deferred()
        return any(part.open for part in self._followed.parts.values())

    def _end_failures(self, reading: _Reading, part: Part) -> None:
        """Deliver the failures read so far (of ``part``), but those sent again: the rows the
        retry policy lets a new part redo wait for it (``redo``, ``_keep_to_redo``); with
        ``lanes="auto"``, a row no batch ran (cancelled) goes live, as does one to redo once
        the rows are going live or when the deadline holds no other part."""
        failures, reading.failures = reading.failures, {}
        if self.plan.live is not None and not self.plan.cancel:
            self._move_cancelled(failures)
        redoable = [index for index in failures if index in reading.redoable]
        if redoable and self.plan.retries and self.again is not None:
            self._keep_to_redo(redoable, failures, part)
        self._give_failures(failures)

    def _move_cancelled(self, failures: dict[int, Result]) -> None:
        """Take out of ``failures`` the rows no batch ran (cancelled): they go live
        (lanes="auto")."""
        for index in [i for i, failure in failures.items() if failure.error_kind ==
                      "batch_cancelled"]:  # fmt: skip
            self._move(index, failures.pop(index))

    def _keep_to_redo(self, redoable: list[int], failures: dict[int, Result], part: Part) -> None:
        """Take out of ``failures`` the rows a new part may redo (or, that going live, the live
        lane): each in at most ``plan.retries`` parts so far, its budget not spent since its
        first submission."""
        live = self._redone_live(part)
        if live is None:
            return
        parts = [p for p in self.ledger.parts() if p.passing == self.plan.passing]
        budget = math.inf if self.plan.budget is None else self.plan.budget
        now = self._unix_time()
        for index, (count, first) in times_sent(redoable, parts).items():
            if count <= self.plan.retries and now - first < budget:
                self._redo(index, failures.pop(index), live=live)

    def _redone_live(self, part: Part) -> bool | None:
        """Whether rows of ``part`` are redone live (True: the rows are going live, or the
        deadline no longer leaves the time ``part`` took, with lanes="auto"), in a new part
        (False), or not at all (None: the deadline cannot hold a part)."""
        left = self._clocks.left()
        took = 0.0 if part.submitted is None else max(0.0, self._unix_time() - part.submitted)
        live = self._moving or (left is not None and left < took)
        return None if live and self.plan.live is None else live

    def _redo(self, index: int, failure: Result, *, live: bool) -> None:
        if live:
            self._move(index, failure)
        else:
            self._followed.redo[index] = failure

    def _live_due(self, left: float | None, poll: float) -> bool:
        """Whether what is left of the deadline no longer holds a live pass of the rows still
        open, after their batches' cancel is seen through (``lanes.goes_live``)."""
        live = self.plan.live
        if live is None or left is None or self._moving or self.plan.cancel:
            return False
        rows, tokens = self._still_open()
        return goes_live(left, live.seconds_for(rows, tokens), poll, self._settling())

    def _check_live(self, poll: float) -> None:
        """The rows still open moved live now, when the deadline no longer holds more."""
        if self._live_due(self._clocks.left(), poll):
            self._go_live()

    def _still_open(self) -> tuple[int, int]:
        """The rows no batch of this run has answered yet (those still to be read among them),
        and their estimated tokens."""
        followed = self._followed
        rows = len(followed.redo) + len(followed.deferred)
        tokens = placed = 0
        for part in followed.parts.values():
            if part.open:
                given, left = len(followed.given(part)), len(self._rest_of(part))
                rows += left
                placed += given
                tokens += followed.tokens_in.get(part.number, 0) * left // max(given, 1)
        coming = max(0, self._expected - self._taken)
        each = sum(followed.tokens_in.values()) // max(placed, 1)
        return rows + coming, tokens + coming * each

    def _settling(self) -> float:
        """About how long seeing a cancel through takes: the longest a batch of this run
        waited in one status of the provider's (not one it runs its rows in) before the next,
        or the slowest call to the provider, whichever is longer."""
        statuses = set(self._provider.shape.statuses) - self._provider.working
        longest = self.client.longest_call
        for part in self._followed.parts.values():
            stays = part.history
            for (began, state), (ended, _) in itertools.pairwise(stays):
                if state in statuses:
                    longest = max(longest, ended - began)
        return longest

    def _go_live(self) -> None:
        """The rows still open go live: their batches cancelled (followed to their end, the
        rows they answered delivered), the parts without one withdrawn, the rows waiting for a
        new part moved."""
        self._moving = True
        rows, _ = self._still_open()
        log.warning(
            "the deadline leaves too little time for the batches: the %d rows still open go "
            "live once their batches are cancelled",
            rows,
        )
        followed = self._followed
        for index, failure in followed.redo.items():
            self._move(index, failure)
        followed.moved |= set(followed.deferred)
        followed.redo, followed.deferred = {}, {}
        for part in [part for part in followed.parts.values() if part.open]:
            if part.batch is not None:
                self._cancel_for_live(part.batch)
            elif part.submitted is None:  # (no create sent: nothing to cancel)
                self._withdraw(part)
            else:  # (a create may have made it: looked for at once, cancelled if found)
                followed.retry_at.pop(part.number, None)

    def _cancel_for_live(self, batch: str) -> None:
        try:
            self.client.cancel(batch)
        except ProviderRefused as exc:  # (followed still: what it ran is collected)
            log.warning("could not cancel the batch %s: %s", batch, exc)

    def _move(self, index: int, failure: Result | None = None) -> None:
        """Row ``index`` moved live, what a batch tried of it (``failure``) kept for its
        Result."""
        self._followed.moved.add(index)
        if failure is not None and failure.attempts:
            prior = self._followed.earlier.get(index)
            self._followed.earlier[index] = failure if prior is None else added_to(prior, failure)

    def _send_again(self) -> None:
        """The rows to redo in a new part of the run (their items read again), each keeping
        its failure to add to its next Result."""
        redo, self._followed.redo = self._followed.redo, {}
        cut = self._new_cut()
        assert self.again is not None  # (``_end_failures`` keeps none without it)
        for index, item in self.again():
            failure = redo.pop(index, None)
            if failure is None:
                continue
            log.info("row %d sent again in a new part: %s", index, failure.error)
            prior = self._followed.earlier.get(index)
            self._followed.earlier[index] = failure if prior is None else added_to(prior, failure)
            body = self._body(index, item, None)
            if body is not None:
                cut = self._place(index, item, body, cut)
            if not redo:
                break
        if cut.lines:
            self._plan_part(cut)
        self._give_failures(redo)  # (rows the items read again no longer hold)

    def _round(self) -> bool:
        """One look at each open part; True when some are still open (and not stopped)."""
        for part in [part for part in self._followed.parts.values() if part.open]:
            if self.stopped:
                return False
            self._step(part)
        return any(part.open for part in self._followed.parts.values())

    def _step(self, part: Part) -> None:
        """One look at ``part``: submit it (again), poll it, collect it once it ended."""
        if self._clock() < self._followed.retry_at.get(part.number, 0.0):
            return
        if part.batch is None:  # (refused for the provider's queue: submitted again)
            self._check_live(self._poll_wait(1))
            self._submit(part)
            return
        polled = self._poll(part)
        if polled is None:
            return
        batch, status = polled
        part = part.moved(status, self._unix_time())
        self._save(part)
        provider = self._provider
        if status not in provider.shape.ended:
            return
        if provider.refused_for_tokens(batch):
            log.warning(
                "part %d was refused for the enqueued-token cap: submitting it again once other "
                "batches have finished",
                part.number,
            )
            self._save(part.moved(WAITING, self._unix_time(), batch=None))
            self._followed.retry_at[part.number] = self._clock() + self._poll_wait(1)
        elif status == provider.failed_status:
            self._fail_part(part, provider.failure_text(batch), None)
        else:
            self._collect(part, batch)

    def _poll(self, part: Part) -> tuple[Mapping[str, Any], str] | None:
        """The batch of ``part`` and its status now; None when the poll tells nothing new."""
        try:
            batch = self.client.retrieve(part.batch or "")
        except ProviderRefused as exc:
            if exc.retryable:
                log.warning("could not poll the batch %s (%s): trying again", part.batch, exc)
                self._later(part, exc)
            else:  # (a 404, a key refused, a redirect: this run cannot read it)
                self._hold(part, f"could not poll the batch {part.batch}: {exc}")
            return None
        status = self._provider.status_of(batch) if isinstance(batch, Mapping) else None
        if status is None:
            log.warning("the batch %s answered without a known status: polling again", part.batch)
            return None
        if not self._provider.belongs_to(batch, part):
            raise BatchApiFailed(
                f"the provider's batch {part.batch} does not match part {part.number} as the "
                "journal records it (another file or row count): nothing of it is taken"
            )
        return batch, status

    def _collect(self, part: Part, batch: Mapping[str, Any]) -> None:
        """Every row of an ended batch delivered once (cut short: read again next round); one not
        listed or unread holds the batch: a paid answer is never thrown away."""
        followed = self._followed
        done = followed.delivered.setdefault(part.number, set())
        tokens = followed.tokens.setdefault(part.number, [0, 0])
        reading = _Reading(part.nonce, followed.given(part), done, tokens)
        # (its rows' time in the batch: from the part's submission to now)
        elapsed = 0.0 if part.submitted is None else max(0.0, self._unix_time() - part.submitted)
        files = self._provider.files_of(batch)
        try:
            lines = self.client.results(
                files, str(part.batch), part.size, reading.nonce, reading.rows
            )
            for line in lines:
                answer = reading.take(self._provider, line)
                if answer is None:
                    continue
                again = isinstance(line, Unread) and line.again
                result, redoable = self._result(
                    answer, elapsed, self._charged(answer, part, again=again)
                )
                if result.ok:
                    self._give(result, None)
                else:
                    reading.failures[result.index] = result
                if redoable:
                    reading.redoable.add(result.index)
        except ProviderRefused as exc:
            self._end_failures(reading, part)
            if not exc.retryable:  # (a 404, a refusal, another origin: this run cannot read them)
                self._hold(part, f"could not read the results of the batch {part.batch}: {exc}")
                return
            log.warning(
                "could not read the results of the batch %s (%s): trying again", part.batch, exc
            )
            return
        if reading.others and not reading.done:
            raise BatchApiFailed(
                f"the batch {part.batch} lists rows of another part, none of part "
                f"{part.number}: it is not this part's batch, and nothing of it is taken"
            )
        self._end_failures(reading, part)
        if reading.rows - reading.done or reading.unread:  # (a paid answer not read: kept)
            self._hold(part, f"the results of the batch {part.batch} do not list this row")
            return
        self._settle(part, None)
        self.ledger.save(replace(part, tokens=(reading.tokens[0], reading.tokens[1])))
        self._followed.parts.pop(part.number)  # (every row delivered: closed once journaled)

    def _fail_part(self, part: Part, reason: str, status: int | None, *, ran: bool = False) -> None:
        """A ``batch_errored`` Result for each row left of a part that never ran (nothing
        billed), or whose batch is gone (``ran``: its rows unread at their worst case)."""
        self._fail_rest(part, reason, "batch_errored", status)
        self._settle(part, None if ran else 0)
        self._save(part.moved(COLLECTED, self._unix_time()))

    def _fail_rest(self, part: Part, reason: str, kind: ErrorKind, status: int | None) -> None:
        """A ``kind`` Result for each row of ``part`` this run is to deliver and has not."""
        rest = self._rest_of(part)
        self._give_failures({index: self._unsent(index, reason, kind, status) for index in rest})

    def _rest_of(self, part: Part) -> set[int]:
        """The rows of ``part`` this run is to deliver and has not."""
        return self._followed.given(part) - self._followed.delivered.get(part.number, set())

    def _cancel_all(self) -> None:
        """--cancel: cancel every open batch of the journal that is its part's (the followed
        ones are collected still, the others closed); one gone ends its rows ``batch_errored``."""
        for part in self.ledger.parts():
            if part.batch is None or not part.open:
                continue
            try:
                batch = self.client.retrieve(part.batch)
                if not (isinstance(batch, Mapping) and self._provider.belongs_to(batch, part)):
                    log.warning(
                        "the batch %s is not part %d's: not cancelled", part.batch, part.number
                    )
                    continue
                self.client.cancel(part.batch)
            except ProviderRefused as exc:
                if exc.status != 404:
                    log.warning("could not cancel the batch %s: %s", part.batch, exc)
                    continue
                if part.number in self._followed.parts:
                    gone = f"the batch {part.batch} is gone at the provider"
                    self._fail_part(part, gone, 404, ran=True)
                    continue
            if part.number not in self._followed.parts:
                self._settle(part, None)
                self.ledger.save(part.moved(COLLECTED, self._unix_time()))

    def _out_of_time(self) -> bool:
        """Hold the parts the deadline or budget leaves no time for; True past the deadline."""
        left, budget, now = self._clocks.left(), self.plan.budget, self._unix_time()
        if left is not None and left <= 0:
            self._run_out("deadline", lambda part: True)
            return True
        if budget is not None:  # (a part's wait counts from its submission)
            self._run_out(
                "budget", lambda p: p.submitted is not None and now - p.submitted >= budget
            )
        return False

    def _run_out(self, kind: ErrorKind, spent: Callable[[Part], bool]) -> None:
        """End the wait of each open part ``spent`` says has no time left."""
        for part in list(self._followed.parts.values()):
            if part.open and spent(part):
                where = f"the batch {part.batch}" if part.batch else f"part {part.number}"
                reason = f"{where} was still {part.state} at the provider when the {kind} ran out"
                self._hold(part, reason, kind)

    def _hold(self, part: Part, reason: str, kind: ErrorKind = "batch_errored") -> None:
        """End this run's wait for ``part``: its rows left fail as ``kind``, it stays open (held),
        so that a later run given its rows reads the same batch again, never submitting twice."""
        reason = f"{reason}{_HELD}"
        self._fail_rest(part, reason, kind, None)
        if part.batch is not None:
            self.ledger.save(part.moved(HELD, self._unix_time()))
        self._followed.parts.pop(part.number)

    def finish(self) -> None:
        """Once the Results are journaled: close each part whose batch ended, then delete
        what the provider keeps of each closed one (unless kept; a later run tries again)."""
        for found in self.ledger.parts():
            if self.stopped:  # (a later run closes and cleans what is left)
                return
            part = found
            if part.state in self._provider.shape.ended:
                part = part.moved(COLLECTED, self._unix_time())
                self.ledger.save(part)
            if part.state not in (COLLECTED, DROPPED):
                continue
            try:
                if not self.plan.keep_files:
                    self._clean(part)
            except (ProviderRefused, Stopped) as exc:
                log.warning(
                    "could not delete part %d's files at the provider: %s", part.number, exc
                )
                continue
            self.ledger.save(part.moved(CLEANED, self._unix_time()))

    def _clean(self, part: Part) -> None:
        """Delete what the provider keeps of ``part``: only what its batch names, or the file
        uploaded under its own name (an id altered in the journal deletes nothing else)."""
        provider = self._provider
        if part.batch is None:
            named = part.input_file and self.client.file_name(part.input_file) == _file_name(part)
            if part.input_file and named:
                self.client.delete_file(part.input_file)
            return
        try:
            batch = self.client.retrieve(part.batch)
        except ProviderRefused as exc:
            if exc.status == 404:  # (gone at the provider already: nothing to delete)
                return
            raise
        if not (isinstance(batch, Mapping) and provider.belongs_to(batch, part)):
            return
        for url in provider.leftovers(self.plan.endpoint, part.batch, batch):
            self.client.delete(url)

    # --- Results ---------------------------------------------------------------------------------
    def _give(self, result: Result, item: object) -> None:
        earlier = self._followed.earlier.pop(result.index, None)
        if earlier is not None:  # (a row sent again: its Result tells both tries)
            result = added_to(earlier, result)
        if result.error is not None:  # (a provider's message may echo the key)
            result = replace(result, error=self.mask(result.error))
        self._deliver(result, item)  # (journaled first: an observer that raises loses none)
        self.observer.item_finished(result)

    def _give_failures(self, failures: Mapping[int, Result]) -> None:
        """Deliver failed Results with their items read again (none is kept while batches run)."""
        if not failures:
            return
        items: dict[int, object] = {}
        if self.again is not None:
            for index, item in self.again():
                if index in failures:
                    items[index] = item
                    if len(items) == len(failures):
                        break
        for index in sorted(failures):
            self._give(failures[index], items.get(index))

    def _result(self, answer: Answer, elapsed: float, spent: Spent) -> tuple[Result, bool]:
        """A row's Result, made as a live attempt's is: one attempt (none if the batch never
        ran it) with what it ``spent`` under a spend cap, its body decoded as ``expect``
        says; and whether the retry policy lets a new part redo it (``row_failure``)."""
        # (a row's answer as a live attempt's facts: its status, where it went, no redirect)
        facts = HttpFacts(answer.status_code, self.url if answer.status_code is not None else None)
        if answer.ok:
            try:
                verdict = success(decode_value(answer.data, self.plan.expect), facts)
            except InvalidBody as exc:
                verdict = terminal("invalid_body", str(exc), facts)
        else:
            calls = self.client.calls
            verdict = row_failure(answer, facts, calls.retryable, calls.retry_if)
        ran = verdict.error_kind not in ("batch_expired", "batch_cancelled")
        record = AttemptRecord(1, answer.status_code, verdict.error_kind, elapsed, None, None,
                               False, 0, *spent, lane="batch")  # fmt: skip
        result = self._row_result(answer.index, verdict, (record,) if ran else (), elapsed)
        return result, verdict.outcome == "retry"

    def _unsent(
        self,
        index: int,
        reason: str,
        kind: ErrorKind = "invalid_request",
        status: int | None = None,
    ) -> Result:
        """The Result of a row that no batch ran."""
        return self._row_result(index, terminal(kind, reason, HttpFacts(status)), (), 0.0)

    def _row_result(
        self, index: int, verdict: Verdict, records: tuple[AttemptRecord, ...], elapsed: float
    ) -> Result:
        return result_of(
            index=index,
            url=self.url,
            id=self._followed.ids.get(index),
            verdict=verdict,
            error=verdict.error or None,
            data=verdict.data,
            records=records,
            elapsed=elapsed,
            finished=self._unix_time(),
        )

    def _poll_wait(self, rounds: int) -> float:
        poll = self.plan.poll
        return POLL_BACKOFF.wait(rounds, None, 0.5) if poll is None else poll


def _file_name(part: Part) -> str:
    """The name a part's rows are uploaded under (OpenAI)."""
    return f"{part.tag}.jsonl"


def _body_of(spec: RequestSpec, endpoint: Endpoint) -> Mapping[str, Any]:
    """The row's body; InvalidItem unless it is one POST of a JSON object to the endpoint."""
    if spec.url != endpoint.url:
        raise InvalidItem(
            f"a batch goes to one endpoint ({endpoint.path}): this row is for another URL"
        )
    if spec.method != "POST":
        raise InvalidItem(f"a batch sends POSTs: this row is a {spec.method}")
    if not isinstance(spec.json_body, Mapping):
        raise InvalidItem("a batch row's body must be a JSON object")
    others = ("headers", "params", "data", "fallbacks")
    extra = [name for name in others if getattr(spec, name, None)]
    if extra:
        raise InvalidItem(f"a batch row carries only its body: it has {', '.join(extra)}")
    return spec.json_body
