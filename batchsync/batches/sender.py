"""A run through a provider's batch endpoint: the rows left are checked, split into parts at
the caps, each part uploaded and submitted, the batches polled until they end, and each
row's answer delivered as its Result, in whatever order the provider lists them (the
journal and the outputs put them in input order).

Every step is recorded in the ledger before the next depends on it: a part is planned, then
uploaded, then marked ``submitting`` before the create is sent, then holds its batch id.
A run that goes on with the ledger follows each open part from where it stood (a part
caught ``submitting`` is looked for at the provider before anything is sent again), so a
part is never submitted twice. A stop (Ctrl-C) leaves the batches running at the provider.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from ..core.backoff import Backoff
from ..core.observe import Observer
from ..core.result import AttemptRecord, Result, result_of
from ..core.verdict import ErrorKind, InvalidItem, success, terminal
from ..http.decode import InvalidBody, decode_value
from ..http.spec import RequestSpec
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
    Covered,
    Ledger,
    Part,
    indexes_in,
    new_tag,
    ranges_of,
    well_formed,
)
from .client import Client, ProviderRefused, Stopped, Unread, custom_id_of
from .protocol import Answer, BatchProvider, Endpoint, index_of, is_row_id
from .providers import provider_of

log = logging.getLogger("batchsync")

# Polling when --poll is not given: from a few seconds to a minute.
POLL_BACKOFF = Backoff(base=5.0, factor=1.5, max=60.0, jitter=0.1)
_UNLISTED = "do not list this row"
# How long before its submission (in the provider's clock, read off its ``Date``) a batch
# found in the provider's list may have been created to be taken for a part caught
# ``submitting``: the ``Date``'s second and the create's time on the way.
_CLOCK_SKEW = 120.0


@dataclass(frozen=True)
class Plan:
    """What the run was asked: the endpoint, the caps, how to poll, what bounds the wait, and
    whether to cancel the batches it follows (``--cancel``) or keep the files."""

    endpoint: Endpoint
    passing: int
    max_rows: int | None = None
    max_bytes: int | None = None
    poll: float | None = None
    deadline: float | None = None
    budget: float | None = None
    keep_files: bool = False
    cancel: bool = False
    max_line: int = 32 * 2**20
    expect: object = "json"

    @property
    def rows_cap(self) -> int:
        """The most rows a part holds: as asked, never beyond the provider's cap."""
        most = provider_of(self.endpoint).caps[0]
        return min(self.max_rows or most, most)

    @property
    def bytes_cap(self) -> int:
        """The most bytes a submission takes: as asked, never beyond the provider's cap."""
        most = provider_of(self.endpoint).caps[1]
        return min(self.max_bytes or most, most)


@dataclass
class _Followed:
    """The parts this run follows, and what it knows of their rows: each row's id, and
    the lines of parts it has still to submit."""

    parts: dict[int, Part] = field(default_factory=dict)
    ids: dict[int, Any] = field(default_factory=dict)
    lines: dict[int, list[bytes]] = field(default_factory=dict)
    # When each waiting part may be submitted again (the monotonic clock).
    retry_at: dict[int, float] = field(default_factory=dict)
    # The rows of each earlier part that this run was given (a part of its own: all of them);
    # the others have their Results already.
    rows: dict[int, set[int]] = field(default_factory=dict)
    # The rows of each part delivered so far, and the tokens their answers used.
    delivered: dict[int, set[int]] = field(default_factory=dict)
    tokens: dict[int, list[int]] = field(default_factory=dict)

    def given(self, part: Part) -> set[int]:
        """The rows of ``part`` this run is to deliver."""
        return self.rows.get(part.number) or set(indexes_in(part.rows))


class BatchApiFailed(OSError):
    """The run cannot go on without risking a row twice or another's results as its own."""


class BatchRun:
    """Sends the rows left through the batch endpoint (see the module docstring); stoppable
    from a signal handler (``stop``)."""

    def __init__(
        self,
        plan: Plan,
        client: Client,
        ledger: Ledger,
        request_of: Callable[[object], RequestSpec],
        url_shown: str,
        *,
        observer: Observer | None = None,
        again: Callable[[], Iterable[tuple[int, object]]] | None = None,
        mask: Callable[[str], str] = str,
        stop: threading.Event | None = None,
        clock: Callable[[], float] = time.monotonic,
        unix_time: Callable[[], float] = time.time,
    ) -> None:
        self._plan = plan
        self._client = client
        self._provider: BatchProvider = client.provider
        self._ledger = ledger
        self._request_of = request_of
        self._url = url_shown
        self._observer = observer or Observer()
        self._clock = clock
        self._unix_time = unix_time
        self._stop = stop or threading.Event()
        self._again = again
        self._mask = mask
        self._started = clock()

    # --- Stoppable ----------------------------------------------------------------------------
    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def pause(self, seconds: float) -> bool:
        return pause(self._stop, seconds)

    # --- the run --------------------------------------------------------------------------------
    def run(
        self, items: Iterable[tuple[int, object]], deliver: Callable[[Result, object], None]
    ) -> bool:
        """Send what is left of ``items``, delivering each row's Result; True when stopped
        before every row had one."""
        self._deliver = deliver
        followed = _Followed()
        try:
            self._take(items, followed)
            if self._plan.cancel:
                self._cancel_all(followed)
            self._follow(followed)
        except Stopped:
            pass
        except ProviderRefused as exc:  # (a part it could not tell the state of)
            raise BatchApiFailed(str(exc)) from None
        return self.stopped

    def _take(self, items: Iterable[tuple[int, object]], followed: _Followed) -> None:
        """Read the rows left: each that cannot go in a batch gets its Result now; each in a
        part still open is followed there; the rest are cut into new parts, each submitted as
        soon as it is full (so the input is read once, a part at a time)."""
        open_parts = self._settled([part for part in self._ledger.parts() if part.open])
        covered = Covered(open_parts)
        known = {part.number: part for part in open_parts}
        numbers = [part.number for part in self._ledger.parts()]
        next_number = max(numbers, default=0) + 1
        cut: list[tuple[int, bytes]] = []
        cut_bytes, tag = 0, new_tag(next_number)
        provider, plan = self._provider, self._plan
        refusal = self._client.refusal()
        for index, item in items:
            if self.stopped:
                return
            try:
                spec = self._request_of(item)
                if refusal is not None:
                    raise InvalidItem(refusal)
                body = _body_of(spec, plan.endpoint)
            except InvalidItem as exc:
                self._give(_unsent(index, self._url, None, str(exc)), item)
                continue
            if spec.id is not None:
                followed.ids[index] = spec.id
            number = covered.part_of(index)
            if number is not None:
                earlier = followed.parts[number] = known[number]
                followed.rows.setdefault(number, set()).add(index)
                if earlier.batch is None:  # (to be submitted once it is known to have none)
                    own = provider.request_line(plan.endpoint, index, body, earlier.nonce)
                    followed.lines.setdefault(number, []).append(own)
                continue
            line = provider.request_line(plan.endpoint, index, body, tag.rpartition("-")[2])
            if plan.cancel:  # (nothing new is submitted to be cancelled)
                reason = "cancelled (--cancel) before it was submitted"
                self._give(_unsent(index, self._url, spec.id, reason, kind="batch_cancelled"), item)
                continue
            if provider.submission_size(1, len(line)) > plan.bytes_cap:
                reason = f"the row is larger than a submission may be ({plan.bytes_cap} bytes)"
                self._give(_unsent(index, self._url, spec.id, reason), item)
                continue
            if cut and (
                len(cut) >= plan.rows_cap
                or provider.submission_size(len(cut) + 1, cut_bytes + len(line)) > plan.bytes_cap
            ):
                self._plan_part(next_number, tag, cut, followed)
                next_number, cut, cut_bytes = next_number + 1, [], 0
                tag = new_tag(next_number)
                line = provider.request_line(plan.endpoint, index, body, tag.rpartition("-")[2])
            cut.append((index, line))
            cut_bytes += len(line)
        if cut:
            self._plan_part(next_number, tag, cut, followed)
        for part in open_parts:
            if part.number not in followed.parts and part.state in provider.shape.ended:
                # (every row has its Result from this ended batch: a run stopped before it
                # could say so; the part is closed, and cleaned once this run ends)
                self._ledger.save(part.moved(COLLECTED, self._unix_time()))

    def _settled(self, parts: list[Part]) -> list[Part]:
        """The open parts of earlier runs that have a batch at the provider: one whose create
        was sent but not answered (caught ``submitting``, or ``waiting`` after a create that
        got no answer) is looked for there first; the others never made one, and are dropped
        (their rows go into new parts, their uploaded file, found by its name when the run
        was killed during the upload, is deleted with the rest)."""
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
                    part = replace(part, input_file=self._client.file_named(_file_name(part)))
                self._ledger.save(part.moved(DROPPED, self._unix_time()))
            else:
                kept.append(part)
        return kept

    def _plan_part(
        self, number: int, tag: str, cut: list[tuple[int, bytes]], followed: _Followed
    ) -> None:
        """A new part of these rows (``tag``: its own name, in their custom_ids), recorded,
        then submitted."""
        part = Part(
            number,
            self._plan.passing,
            self._plan.endpoint.provider,
            ranges_of(index for index, _ in cut),
            tag=tag,
        ).moved(PLANNED, self._unix_time())
        self._ledger.save(part)
        followed.parts[number] = part
        followed.lines[number] = [line for _, line in cut]
        self._submit(part, followed)

    # --- submitting -------------------------------------------------------------------------------
    def _submit(self, part: Part, followed: _Followed) -> None:
        """Upload (OpenAI) and create the part's batch, recording each step first; a part
        refused for the provider's queue waits (``WAITING``) to be submitted again. A part
        whose earlier create got no answer (``submitted`` kept) is looked for at the
        provider before it is created again."""
        # (an OpenAI part submitted again after the token cap refused it has its file)
        lines = followed.lines.get(part.number, [])
        unanswered = part.submitted is not None
        try:
            if self._plan.cancel and not unanswered:
                self._withdraw(part, followed)  # (--cancel submits nothing)
                return
            if part.input_file is None and self._provider.shape.uploads:
                file_id = self._client.upload(lines, _file_name(part))
                part = part.moved(UPLOADED, self._unix_time(), input_file=file_id)
                self._save(part, followed)
                if self.stopped:  # (stopped during the upload: nothing is created)
                    raise Stopped
            batch = self._find(part) if unanswered else None
            if batch is not None:
                recorded = self._record(part, batch)
            elif self._plan.cancel:  # (its create made no batch: there is none to cancel)
                self._withdraw(part, followed)
                return
            else:
                part = part.moved(SUBMITTING, self._unix_time(), submitted=self._unix_time())
                self._save(part, followed)
                try:
                    recorded = self._record(
                        part,
                        self._client.create(
                            input_file=part.input_file, lines=lines, part=part.number
                        ),
                    )
                except ProviderRefused as exc:
                    if exc.status is not None and exc.status < 500:
                        raise  # (answered: no batch was made)
                    unanswered = True  # (no answer, or none that names a batch)
                    batch = self._find(part)
                    if batch is None:
                        raise
                    recorded = self._record(part, batch)
            self._save(recorded, followed)
            followed.lines.pop(part.number, None)
        except ProviderRefused as exc:
            if exc.retryable:
                log.warning("part %d not submitted yet (%s): trying again later", part.number, exc)
                # (``submitted`` kept only when a create may have made a batch after all)
                sent = part.submitted if unanswered else None
                self._save(part.moved(WAITING, self._unix_time(), submitted=sent), followed)
                self._later(part, followed, exc)
                return
            self._fail_part(part, followed, str(exc), exc.status)
            return
        if self._plan.cancel and recorded.batch is not None:  # (found after the cancels)
            self._cancel(recorded)

    def _cancel(self, part: Part) -> None:
        """Ask the provider to cancel ``part``'s batch; one it will not cancel (ended
        already, say) is followed as it is."""
        try:
            self._client.cancel(part.batch or "")
        except ProviderRefused as exc:
            log.warning("could not cancel the batch %s: %s", part.batch, exc)

    def _withdraw(self, part: Part, followed: _Followed) -> None:
        """--cancel of a part with no batch at the provider: its rows end ``batch_cancelled``
        unsent, and the part is dropped (a file it uploaded is deleted with the rest)."""
        reason = "cancelled (--cancel) before it was submitted"
        done = followed.delivered.get(part.number, set())
        self._give_failures(
            {
                index: _unsent(
                    index, self._url, followed.ids.get(index), reason, kind="batch_cancelled"
                )
                for index in followed.given(part) - done
            }
        )
        self._ledger.save(part.moved(DROPPED, self._unix_time(), submitted=None))
        followed.parts.pop(part.number, None)

    def _later(self, part: Part, followed: _Followed, refused: ProviderRefused) -> None:
        """Look at ``part`` again after the next poll's wait, and never before the
        provider's Retry-After."""
        wait = max(self._poll_wait(1), refused.retry_after or 0.0)
        followed.retry_at[part.number] = self._clock() + wait

    def _find(self, part: Part) -> Mapping[str, Any] | None:
        """The batch the provider made of a part whose create got no answer, or None when it
        made none. OpenAI's is the one made of the part's file. Anthropic's list names nothing
        of a batch's rows: one made since the part's create with as many rows is the part's
        only when its results carry the part's nonce, so while such a batch has not ended the
        part waits (a retryable ProviderRefused), neither created again nor taking another's.
        A look that fails (the list or a candidate's results refused) decides nothing: the
        part waits the same way."""
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
        known = {p.batch for p in self._ledger.parts() if p.batch is not None}
        provider = self._provider
        candidates, unsure = [], False
        since = (part.submitted or 0.0) - _CLOCK_SKEW
        for batch in self._client.recent(since):
            offset = self._client.clock_offset
            if (
                well_formed(provider.name, "batch", batch.get("id")) is None
                or batch.get("id") in known
            ):
                continue
            if provider.refused_for_tokens(batch) or not provider.belongs_to(batch, part):
                continue
            if provider.identifies_rows:
                candidates.append(batch)
            elif _made_since(provider.created_at(batch), since, offset):
                status = provider.status_of(batch)
                if status is None or status not in provider.shape.ended:
                    unsure = True
                elif self._carries_nonce(batch, part):
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

    def _carries_nonce(self, batch: Mapping[str, Any], part: Part) -> bool:
        """Whether an ended batch's results are rows of ``part`` (its nonce)."""
        batch_id = str(batch.get("id"))
        files = self._provider.files_of(batch)
        given = custom_id_of(self._client.first_result(files, batch_id, part.size))
        return given is not None and given.startswith(f"{part.nonce}-")

    def _record(self, part: Part, batch: Any) -> Part:
        """``part`` with the batch the provider made of it, recorded with its status (one the
        provider did not document is recorded as its first, and read again at the next
        poll); a ProviderRefused to try later when the answer names no batch: the batch may
        have been made all the same, and is looked for before the part is sent again."""
        provider = self._provider
        batch_id = (
            well_formed(provider.name, "batch", batch.get("id"))
            if isinstance(batch, Mapping)
            else None
        )
        if batch_id is None:
            raise ProviderRefused("the provider answered the create without a batch id")
        status = provider.status_of(batch) or provider.shape.statuses[0]
        part = part.moved(status, self._unix_time(), batch=batch_id)
        self._ledger.save(part)
        return part

    def _save(self, part: Part, followed: _Followed) -> None:
        self._ledger.save(part)
        followed.parts[part.number] = part

    # --- following -----------------------------------------------------------------------------
    def _follow(self, followed: _Followed) -> None:
        """Poll every open part until each is collected, the run is stopped, or the deadline
        or budget ends the wait."""
        rounds = 0
        while True:
            waiting = [part for part in followed.parts.values() if part.open]
            if not waiting:
                return
            for part in waiting:
                if self.stopped:
                    return
                self._step(part, followed)
            if not any(part.open for part in followed.parts.values()):
                return
            ended = self._out_of_time(followed)
            if ended:
                return
            rounds += 1
            if not self.pause(self._until_next(rounds)):
                return

    def _step(self, part: Part, followed: _Followed) -> None:
        """One look at ``part``: submit it (again), poll it, collect it once it ended."""
        if self._clock() < followed.retry_at.get(part.number, 0.0):
            return
        if part.batch is None:  # (refused for the provider's queue: submitted again)
            self._submit(part, followed)
            return
        try:
            batch = self._client.retrieve(part.batch)
        except ProviderRefused as exc:
            if exc.retryable:
                log.warning("could not poll the batch %s (%s): trying again", part.batch, exc)
                self._later(part, followed, exc)
            else:  # (a 404, a key refused, a redirect: this run cannot read it)
                self._hold(part, followed, f"could not poll the batch {part.batch}: {exc}")
            return
        provider = self._provider
        status = provider.status_of(batch) if isinstance(batch, Mapping) else None
        if status is None:
            log.warning("the batch %s answered without a known status: polling again", part.batch)
            return
        if not provider.belongs_to(batch, part):
            raise BatchApiFailed(
                f"the provider's batch {part.batch} does not match part {part.number} as the "
                "journal records it (another file or row count): nothing of it is taken"
            )
        part = part.moved(status, self._unix_time())
        self._save(part, followed)
        if status not in provider.shape.ended:
            return
        if provider.refused_for_tokens(batch):
            log.warning(
                "part %d was refused for the enqueued-token cap: submitting it again once other "
                "batches have finished",
                part.number,
            )
            self._save(part.moved(WAITING, self._unix_time(), batch=None), followed)
            followed.retry_at[part.number] = self._clock() + self._poll_wait(1)
            return
        if status == provider.failed_status:
            self._fail_part(part, followed, provider.failure_text(batch), None)
            return
        self._collect(part, batch, followed)

    def _collect(self, part: Part, batch: Mapping[str, Any], followed: _Followed) -> None:
        """Every row of an ended batch delivered as its Result (one whose answer is longer
        than ``max_bytes`` or cannot be read: ``invalid_body``). Results that could not all
        be read are read again at the next round, each row delivered once; rows the results
        do not list (an empty or cut answer, a file missing) or list unread hold the batch
        for a later run to read again (``--retry-failed``, a larger ``max_bytes``). A batch
        whose results list no row of the part but others' is not the part's: nothing of it
        is taken. The part is closed (``collected``) by ``finish``, once the journal holds
        its rows' Results."""
        provider = self._provider
        files = provider.files_of(batch)
        rows = followed.given(part)
        done = followed.delivered.setdefault(part.number, set())
        tokens = followed.tokens.setdefault(part.number, [0, 0])
        elapsed = self._elapsed(part)
        failures: dict[int, Result] = {}
        others, unread = 0, False
        try:
            for line in self._client.results(files, part.batch or "", part.size):
                answer = _answer(provider, line, part.nonce)
                if answer is None:
                    others += _names_a_row(line)
                    continue
                if answer.index not in rows or answer.index in done:
                    continue
                done.add(answer.index)
                unread = unread or (isinstance(line, Unread) and line.again)
                used = provider.usage_of(answer.data)
                tokens[0] = min(tokens[0] + used[0], MOST_TOKENS - 1)
                tokens[1] = min(tokens[1] + used[1], MOST_TOKENS - 1)
                result = self._result(answer, elapsed, followed)
                if result.ok:
                    self._give(result, None)
                else:
                    failures[result.index] = result
        except ProviderRefused as exc:
            self._give_failures(failures)
            if not exc.retryable:  # (a 404, a refusal, another origin: this run cannot read them)
                self._hold(
                    part, followed, f"could not read the results of the batch {part.batch}: {exc}"
                )
                return
            log.warning(
                "could not read the results of the batch %s (%s): trying again", part.batch, exc
            )
            return
        if others and not done:
            raise BatchApiFailed(
                f"the batch {part.batch} lists rows of another part, none of part "
                f"{part.number}: it is not this part's batch, and nothing of it is taken"
            )
        self._give_failures(failures)
        if rows - done or unread:  # (a paid answer not read: kept for a later run to read)
            self._hold(part, followed, f"the results of the batch {part.batch} {_UNLISTED}")
            return
        self._ledger.save(replace(part, tokens=(tokens[0], tokens[1])))
        followed.parts.pop(part.number)  # (every row delivered: closed once they are journaled)

    def _fail_part(self, part: Part, followed: _Followed, reason: str, status: int | None) -> None:
        """Every row of a part that never ran (its create refused, its batch failed as a
        whole) and has no Result yet gets a ``batch_errored`` one saying why."""
        done = followed.delivered.get(part.number, set())
        self._give_failures(
            {
                index: _unsent(
                    index,
                    self._url,
                    followed.ids.get(index),
                    reason,
                    kind="batch_errored",
                    status=status,
                )
                for index in followed.given(part) - done
            }
        )
        self._save(part.moved(COLLECTED, self._unix_time()), followed)

    def _cancel_all(self, followed: _Followed) -> None:
        """--cancel: ask the provider to cancel every batch of the run still open (and its
        own: one the journal names that is not its part's is left alone); what the followed
        ones ran is still collected. One whose rows all have Results already (the deadline or
        budget ended their wait) is done with once cancelled: its rows keep them. One gone at
        the provider is closed: its followed rows end ``batch_errored``."""
        for part in self._ledger.parts():
            if part.batch is None or not part.open:
                continue
            try:
                batch = self._client.retrieve(part.batch)
                if not (isinstance(batch, Mapping) and self._provider.belongs_to(batch, part)):
                    log.warning(
                        "the batch %s is not part %d's: not cancelled", part.batch, part.number
                    )
                    continue
                self._client.cancel(part.batch)
            except ProviderRefused as exc:
                if exc.status != 404:
                    log.warning("could not cancel the batch %s: %s", part.batch, exc)
                    continue
                if part.number in followed.parts:
                    gone = f"the batch {part.batch} is gone at the provider"
                    self._fail_part(part, followed, gone, 404)
                    continue
            if part.number not in followed.parts:
                self._ledger.save(part.moved(COLLECTED, self._unix_time()))

    def _out_of_time(self, followed: _Followed) -> bool:
        """End the wait of the parts the deadline or budget leaves no time for: each of their
        rows gets a ``deadline``/``budget`` Result (the batch goes on at the provider, and a
        later run polls it again). True when the deadline has passed."""
        now = self._clock()
        plan = self._plan
        if plan.deadline is not None and now - self._started >= plan.deadline:
            for part in list(followed.parts.values()):
                if part.open:
                    self._ran_out(part, followed, "deadline")
            return True
        if plan.budget is not None:
            unix = self._unix_time()
            for part in list(followed.parts.values()):
                since = part.submitted if part.submitted is not None else None
                if part.open and since is not None and unix - since >= plan.budget:
                    self._ran_out(part, followed, "budget")
        return False

    def _ran_out(self, part: Part, followed: _Followed, kind: ErrorKind) -> None:
        where = f"the batch {part.batch}" if part.batch else f"part {part.number}"
        reason = f"{where} was still {part.state} at the provider when the {kind} ran out"
        self._hold(part, followed, reason, kind)

    def _hold(
        self, part: Part, followed: _Followed, reason: str, kind: ErrorKind = "batch_errored"
    ) -> None:
        """End this run's wait for ``part`` without its answers: each of its rows without a
        Result gets a ``kind`` one saying why, and the part stays open (``held`` once it has a
        batch), kept at the provider, so that a later run given its rows (``--retry-failed``)
        reads the same batch again and never submits them twice."""
        done = followed.delivered.get(part.number, set())
        reason = f"{reason}: --retry-failed reads it again, --cancel cancels it"
        self._give_failures(
            {
                index: _unsent(index, self._url, followed.ids.get(index), reason, kind=kind)
                for index in followed.given(part) - done
            }
        )
        if part.batch is not None:
            self._ledger.save(part.moved(HELD, self._unix_time()))
        followed.parts.pop(part.number)

    def finish(self) -> None:
        """Once the Results are journaled (the controller calls this after the journal is
        closed): close each part whose rows were all delivered (its batch ended, nothing
        held), then delete what the provider keeps of each closed part, unless asked to keep
        it; a part that cannot be cleaned is tried again by a later run."""
        for found in self._ledger.parts():
            if self.stopped:  # (a later run closes and cleans what is left)
                return
            part = found
            if part.state in self._provider.shape.ended:
                part = part.moved(COLLECTED, self._unix_time())
                self._ledger.save(part)
            if part.state not in (COLLECTED, DROPPED):
                continue
            try:
                if not self._plan.keep_files:
                    self._clean(part)
            except (ProviderRefused, Stopped) as exc:
                log.warning(
                    "could not delete part %d's files at the provider: %s", part.number, exc
                )
                continue
            self._ledger.save(part.moved(CLEANED, self._unix_time()))

    def _clean(self, part: Part) -> None:
        """Delete what the provider keeps of ``part``: only what its batch names as its own,
        or the file uploaded under the part's own name, so that an id altered in the journal
        never deletes another's file or batch."""
        provider = self._provider
        if part.batch is None:
            named = part.input_file and self._client.file_name(part.input_file) == _file_name(part)
            if part.input_file and named:
                self._client.delete_file(part.input_file)
            return
        try:
            batch = self._client.retrieve(part.batch)
        except ProviderRefused as exc:
            if exc.status == 404:  # (gone at the provider already: nothing to delete)
                return
            raise
        if not (isinstance(batch, Mapping) and provider.belongs_to(batch, part)):
            return
        for url in provider.leftovers(self._plan.endpoint, part.batch, batch):
            self._client.delete(url)

    # --- Results ---------------------------------------------------------------------------------
    def _give(self, result: Result, item: object) -> None:
        if result.error is not None:  # (a provider's message may echo the key)
            result = replace(result, error=self._mask(result.error))
        self._deliver(result, item)  # (journaled first: an observer that raises loses none)
        self._observer.item_finished(result)

    def _give_failures(self, failures: Mapping[int, Result]) -> None:
        """Deliver failed Results with their items, read again from the input (``again``):
        what a failure is stored with (the failed file's line) is made from its item, and
        the items are not all kept in memory while the batches run."""
        if not failures:
            return
        items: dict[int, object] = {}
        if self._again is not None:
            for index, item in self._again():
                if index in failures:
                    items[index] = item
                    if len(items) == len(failures):
                        break
        for index in sorted(failures):
            self._give(failures[index], items.get(index))

    def _result(self, answer: Answer, elapsed: float, followed: _Followed) -> Result:
        """A row's Result from its answer, made as a live attempt's is: one attempt (none
        for a row the batch never ran), its body decoded as a live answer's (``expect=`` a
        model gives models)."""
        facts = _Row(answer.status_code, self._url if answer.status_code is not None else None)
        if answer.ok:
            try:
                verdict = success(decode_value(answer.data, self._plan.expect), facts)
            except InvalidBody as exc:
                verdict = terminal("invalid_body", str(exc), facts)
        else:
            verdict = terminal(answer.error_kind or "batch_errored", answer.error or "", facts)
        ran = verdict.error_kind not in ("batch_expired", "batch_cancelled")
        record = AttemptRecord(1, answer.status_code, verdict.error_kind, elapsed)
        return result_of(
            index=answer.index,
            url=self._url,
            item_id=followed.ids.get(answer.index),
            verdict=verdict,
            error=verdict.error or None,
            data=verdict.data,
            records=(record,) if ran else (),
            elapsed=elapsed,
            finished=self._unix_time(),
        )

    def _elapsed(self, part: Part) -> float:
        """Seconds from the part's submission to now (its rows' time in the batch)."""
        if part.submitted is None:
            return 0.0
        return max(0.0, self._unix_time() - part.submitted)

    def _poll_wait(self, rounds: int) -> float:
        if self._plan.poll is not None:
            return self._plan.poll
        return POLL_BACKOFF.wait(rounds, None, 0.5)

    def _until_next(self, rounds: int) -> float:
        """Seconds to the next round of polls, never past the deadline."""
        wait = self._poll_wait(rounds)
        if self._plan.deadline is not None:
            left = self._plan.deadline - (self._clock() - self._started)
            wait = min(wait, max(left, 0.0))
        return wait


def _answer(provider: BatchProvider, line: Any, nonce: str) -> Answer | None:
    """The Answer of one results line (``Unread``: its row's ``invalid_body``), or None
    when it names no row of the part with ``nonce``."""
    if isinstance(line, Unread):
        index = index_of(line.custom_id, nonce)
        return (
            None if index is None else Answer(index, False, None, None, "invalid_body", line.reason)
        )
    return provider.answer_of(line, nonce)


def _names_a_row(line: Any) -> bool:
    """Whether a results line that is none of the part's names a row of some other part (a
    line that cannot be read or names nothing says nothing of whose batch it is)."""
    return is_row_id(custom_id_of(line))


def _file_name(part: Part) -> str:
    """The name a part's rows are uploaded under (OpenAI)."""
    return f"{part.tag}.jsonl"


def pause(stop: threading.Event, seconds: float) -> bool:
    """Wait ``seconds``; False when ``stop`` was set meanwhile (the run was stopped)."""
    return not stop.wait(max(0.0, seconds))


def _body_of(spec: RequestSpec, endpoint: Endpoint) -> Mapping[str, Any]:
    """The row's request body, or InvalidItem when the row is no request a batch can carry:
    one POST of a JSON object to the endpoint, with nothing of its own besides."""
    if spec.url != endpoint.url:
        raise InvalidItem(
            f"a batch goes to one endpoint ({endpoint.path}): this row is for another URL"
        )
    if spec.method != "POST":
        raise InvalidItem(f"a batch sends POSTs: this row is a {spec.method}")
    if not isinstance(spec.json_body, Mapping):
        raise InvalidItem("a batch row's body must be a JSON object")
    extra = [
        name for name in ("headers", "params", "data", "fallbacks") if getattr(spec, name, None)
    ]
    if extra:
        raise InvalidItem(f"a batch row carries only its body: it has {', '.join(extra)}")
    return spec.json_body


def _unsent(
    index: int,
    url: str,
    item_id: Any,
    reason: str,
    *,
    kind: ErrorKind = "invalid_request",
    status: int | None = None,
) -> Result:
    """The Result of a row that no batch ran."""
    return result_of(
        index=index,
        url=url,
        item_id=item_id,
        verdict=terminal(kind, reason, _Row(status, None)),
        error=reason,
        data=None,
        records=(),
        elapsed=0.0,
        finished=time.time(),
    )


@dataclass(frozen=True)
class _Row:
    """What a row's answer in a batch gives its Result as a live attempt's facts would: the
    status its request had, and where it went (no redirect in a batch)."""

    status_code: int | None
    final_url: str | None
    redirects: int = 0


def _made_since(created: float | None, since: float, offset: float | None) -> bool:
    """Whether a batch ``created`` (in the provider's clock, ``offset`` ahead of this one;
    None: not known, so any may) may have been created since ``since`` (this clock's unix
    seconds)."""
    return offset is None or created is None or created >= since + offset
