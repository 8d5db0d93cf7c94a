"""The quota gate, in every run: a host whose headers said its quota is spent is held until the
reset (``quota_headers``), and each attempt until the host has the requests and tokens its
rate-limit headers say are left (``AnnouncedCounts``), kept per host between its answers, so
that an attempt waits before it would overdraw them rather than after a 429.

Each answer that tells them (``provider.Announced``: OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``, its input and output tokens counts of their own) sets the host's
count anew, less what attempts let through after the
answered one took (the answer could not count those yet).

What a reset gives back differs between servers, and one answer cannot tell which a host is:
the whole count (OpenAI's and Anthropic's word, and a bucket, full again by then), or, from a
sliding window that announces when its OLDEST entry leaves, only that entry. So a host is
first held as the latter: nothing is assumed back before the reset, and after it capacity
comes back only as far as an answer confirms (one attempt, a probe, goes, and its answer tells
the count anew). A host is read as the former once its answers show it (``_moved_later``):
a reset that moved later, by more than an answer's own latency can explain, while the entry
that would have been its oldest was still counted, which a window announcing its oldest entry
cannot do. Then, between answers, no more is assumed back than either kind of full-reset
server would have given:

* a server that refills as a bucket gives back evenly until the reset;
* one that counts over a sliding window gives back an amount only when the request that took
  it leaves the window: the attempts of ours that the spent part can be, each no sooner than
  its end plus the window, the rest (other clients') at the reset. The window is at most the
  reset plus the answered attempt's age, for any answer the server counted (one that says what
  it used): the least of these bounds, over the host's answers, stands.

The smaller of the two stands, and after the reset the whole count is back, less what was
taken since the answer. A refusal (a 429 with the provider's headers) from a host read so
puts it back to the first reading, for good.

A limit announced alone (a ``limit`` header, no remaining) is held as a sliding window of a
minute, the providers' period: each attempt counts from when it is let through until a minute
after it ended.

Until a host's first answer, its requests that weigh tokens go one at a time: with many workers
a blind start would send a period's worth before the first count came back.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from itertools import chain

from ..core.admission import Admission, Sides, weight_of
from ..core.clock import Clock
from ..core.verdict import Announced, ErrorKind, Feedback
from .cooldown import Holds
from .gate import POLL_SECONDS, GateOption, Waiting
from .shared import CooldownBoard, SharedLimits
from .taken import TakenLog, Taking
from .window import INFINITE

# The cooldown board's key of a host's quota reset (beside its cooldown's, the host itself).
_QUOTA = "quota "
_RESET = "the server's reset is"
# The providers' period: how long an attempt stays counted when no answer tells again, and the
# window a limit announced alone is held over.
_PERIOD = 60.0
# How long an attempt still in flight is kept: no attempt lasts longer.
_KEPT_FOR = 2 * _PERIOD
# How much later than the instant it means a reset may be written (OpenAI's to the millisecond).
_ROUNDING = 0.001


@dataclass
class _Count:
    """One count of a host as the answer to the taking ``mark`` (sent at ``since``) told it at
    ``told_at``: ``left`` then, ``whole`` back at ``back_at`` (its reset), and in between, on a
    host whose resets are full, what ``back()`` gives back: (instant, amount back by then)."""

    left: int
    whole: int | None
    told_at: float
    back_at: float
    mark: int
    since: float
    own: int  # what the answered attempt took of it
    # what attempts that ended after ``since`` took that it holds for sure: their answers told
    # more left than it does, so the server counted them first (or freed more than they took)
    held: int = 0
    # what ``back()`` is reckoned from, at its first need: most counts are replaced by the next
    # answer before an attempt needs more than they left
    reckon: Callable[[], list[tuple[float, int]]] | None = None
    _back: list[tuple[float, int]] = field(default_factory=list)

    def back(self) -> list[tuple[float, int]]:
        if self.reckon is not None:
            self._back, self.reckon = self.reckon(), None
        return self._back


@dataclass
class _Host:
    counts: dict[str, _Count] = field(default_factory=dict)
    alone: dict[str, int] = field(default_factory=dict)  # per kind: a limit told alone
    log: TakenLog = field(default_factory=lambda: TakenLog(kept=_PERIOD, longest=_KEPT_FOR))
    marks: int = 0
    heard: bool = False  # an attempt to it has ended
    windows: dict[str, float] = field(default_factory=dict)  # per kind: the least bound told
    # per kind: the first count told since the last reset passed, whose reset later ones move
    anchors: dict[str, _Count] = field(default_factory=dict)
    probe: int | None = None  # the taking whose answer is awaited to tell the counts anew
    full: bool = False  # its answers showed its resets give the whole count back
    refused: bool = False  # it refused an attempt while read so: never read so again

    def told_of(self) -> bool:
        return bool(self.counts or self.alone)

    def needs_probe(self, cost: int, now: float) -> bool:
        """Whether the next attempt must be answered before any other: the first weighing
        tokens, or, on a host not known to give the whole count back, the first after a
        reset."""
        if cost > 0 and not self.heard:
            return True
        return not self.full and any(now >= count.back_at for count in self.counts.values())


def available(count: _Count, now: float) -> float:
    """What ``count`` of a host whose resets are full holds at ``now`` by the rules above
    (before what was taken since)."""
    if now >= count.back_at:
        return float(count.whole if count.whole is not None else max(count.left, 0))
    spent = 0 if count.whole is None else max(count.whole - count.left, 0)
    evenly = spent * (now - count.told_at) / (count.back_at - count.told_at)
    window = 0
    for instant, amount in count.back():
        if instant > now:
            break
        window = amount
    return count.left + min(evenly, window)


def count_wait(count: _Count, taken: int, amount: int, now: float, *, full: bool) -> float:
    """Seconds until ``amount`` fits in ``count`` beside the ``taken`` amount it does not know of
    yet (0: now; infinite: only a later answer can tell). On a host not known to give the
    whole count back, nothing comes back before the reset, and after it a probe's answer
    tells. On one that does, more than the whole count fits once the whole count is free; a
    count of a size never said, once it is back."""
    if not full:
        return 0.0 if now >= count.back_at or taken + amount <= count.left else count.back_at - now
    whole = count.whole if count.whole is not None else max(count.left, 0)
    need = taken + min(amount, max(whole, 1))
    if now >= count.back_at:
        return 0.0 if whole <= 0 or whole >= need else INFINITE
    if count.left >= need:  # (it holds no less than it left: most takes)
        return 0.0
    return 0.0 if available(count, now) >= need else _back_wait(count, need, now)


def _back_wait(count: _Count, need: int, now: float) -> float:
    """Seconds until a full-reset host's ``count`` holds ``need``: the later of a bucket's and
    a window's giving back, the reset at the latest."""
    missing = need - count.left
    spent = 0 if count.whole is None else max(count.whole - count.left, 0)
    evenly_at = (
        count.told_at + missing * (count.back_at - count.told_at) / spent if spent else INFINITE
    )
    window_at = next((instant for instant, back in count.back() if back >= missing), INFINITE)
    return min(max(evenly_at, window_at), count.back_at) - now


def window_wait(log: TakenLog, kind: str, limit: int, amount: int, now: float) -> float:
    """Seconds until ``amount`` of ``kind`` fits under ``limit`` a period, each attempt counted
    until a period after it ended (infinite: until one in flight ends). More than the limit
    fits once nothing is counted."""
    start = now - _PERIOD
    excess = log.in_flight(kind) + log.ended_after(start, kind) + min(amount, limit) - limit
    if excess <= 0:
        return 0.0
    for took in log.ended_since(start):
        excess -= took.amounts.get(kind, 0)
        if excess <= 0:
            assert took.ended_at is not None
            return took.ended_at + _PERIOD - now
    return INFINITE


class AnnouncedCounts:
    """Per host: the requests and tokens left, as its headers last said and attempts took since."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._lock = threading.Lock()
        self._changed: threading.Event | None = None

    def take(self, host: str, cost: int, sides: Sides | None = None) -> tuple[int | None, float]:
        """Take one request and ``cost`` tokens of the host's (``sides``: those by side, when
        known apart): (the mark of the taking, 0), or (None, the seconds to wait first;
        infinite until an answer tells)."""
        known = self._hosts.get(host)
        if (known is None or not known.told_of()) and (cost <= 0 or (known and known.heard)):
            return 0, 0.0  # (most hosts: nothing told, nothing to wait for, nothing kept)
        amounts = {"requests": 1, "tokens": cost}
        if cost > 0:  # (and so each side's share, kept for a provider that counts them apart)
            amounts["input"] = weight_of(cost, sides, "input")
            amounts["output"] = weight_of(cost, sides, "output")
        with self._lock:
            return _take(self._host(host), amounts, self._clock())

    def ended(
        self,
        host: str,
        mark: int,
        said: Announced | None,
        sent: float | None,
        *,
        counted: bool,
        refused: bool = False,
    ) -> None:
        """The attempt taken as ``mark`` was sent at ``sent`` (None: now) and ended; ``said``:
        what its answer's headers told; ``counted``: the server counted it (its answer said what
        it used), so the answer bounds the window; ``refused``: the host refused it (a 429)."""
        known = self._hosts.get(host)
        if mark == 0 and said is None and (known is None or known.heard):
            return
        with self._lock:
            state, now = self._host(host), self._clock()
            state.heard = True
            taking = _ended(state, mark, said, sent, now)
            if said is not None:
                if refused:
                    state.full, state.refused = False, True
                _told(state, said, taking, now, counted=counted)
            self._wake()

    def give_back(self, host: str, mark: int) -> None:
        """The attempt taken as ``mark`` was never sent."""
        with self._lock:
            state = self._host(host)
            if state.probe == mark:
                state.probe = None
            state.log.drop(mark)
            self._wake()

    def _host(self, host: str) -> _Host:
        """(under the lock) The host's state, made at its first attempt."""
        state = self._hosts.get(host)
        if state is None:
            state = self._hosts[host] = _Host()
        return state

    def _wake(self) -> None:
        """(under the lock) Wake every waiter for an answer, if any: the next one to wait makes
        a new event (most answers have no waiter, and then make none)."""
        if self._changed is not None:
            self._changed.set()
            self._changed = None

    def changed(self) -> threading.Event:
        """Set at the next answer or giving back: what a waiter for an answer waits on, taken
        before it takes again (an answer between its take and this would not wake it)."""
        with self._lock:
            if self._changed is None:
                self._changed = threading.Event()
            return self._changed


def _take(state: _Host, amounts: dict[str, int], now: float) -> tuple[int | None, float]:
    """(under the lock) ``AnnouncedCounts.take`` of the host's ``state``."""
    state.log.forget(now)
    wait = max(_wait(state, kind, amount, now) for kind, amount in amounts.items())
    if wait > 0:
        return None, wait
    probe = state.needs_probe(amounts["tokens"], now)
    if probe and state.probe is not None:
        return None, INFINITE  # (until the probe's answer)
    state.marks += 1
    state.log.take(Taking(state.marks, amounts, now))
    if probe:
        state.probe = state.marks
    return state.marks, 0.0


def _wait(state: _Host, kind: str, amount: int, now: float) -> float:
    """Seconds until ``amount`` of ``kind`` fits in what the host told of it."""
    count, limit = state.counts.get(kind), state.alone.get(kind)
    wait = 0.0
    if count is not None:
        wait = count_wait(count, _uncounted(state, count, kind, now), amount, now, full=state.full)
    if limit is not None:
        wait = max(wait, window_wait(state.log, kind, limit, amount, now))
    return wait


def _ended(
    state: _Host, mark: int, said: Announced | None, sent: float | None, now: float
) -> Taking:
    """The taking ``mark`` out of flight and into the log as ended (one sent before anything
    was told is kept now, when its answer tells), and no longer the probe."""
    if state.probe == mark:
        state.probe = None
    taking = state.log.drop(mark)
    if taking is None:
        taking = Taking(mark, {"requests": 1}, now)
        if said is None:
            return taking
    state.log.end(taking, now if sent is None else sent, now)
    return taking


def _told(state: _Host, said: Announced, answered: Taking, now: float, *, counted: bool) -> None:
    """Set the host's counts from what the answer to ``answered`` told."""
    for kind, (left, reset, whole) in said.budgets():
        if left is None:
            if whole is not None:
                state.alone[kind] = whole
            continue
        known = state.counts.get(kind)
        answered.told[kind] = left
        count = _count_of(
            known, left=left, reset=reset, whole=whole, answered=answered, kind=kind, now=now
        )
        if count is None:
            assert known is not None
            known.held += answered.amounts.get(kind, 0) if left > known.left else 0
            continue
        count.held = _held_by(state.log, kind, count, answered)
        _read_resets(state, kind, count)
        state.counts[kind] = count
        if count.whole is not None:
            count.reckon = _ours_back(state, kind, count, answered, counted=counted)


def _count_of(
    known: _Count | None,
    *,
    left: int,
    reset: float | None,
    whole: int | None,
    answered: Taking,
    kind: str,
    now: float,
) -> _Count | None:
    """The count an answer told, None when older than ``known`` (told by an answer to an
    attempt sent later); its size, when it said none, the last one said."""
    if known is not None and known.since > answered.sent_at:
        return None
    if whole is None and known is not None:
        whole = known.whole
    until = reset if reset is not None else _PERIOD
    own = answered.amounts.get(kind, 0)
    return _Count(left, whole, now, now + until, answered.mark, answered.sent_at, own=own)


def _held_by(log: TakenLog, kind: str, count: _Count, answered: Taking) -> int:
    """What the attempts but ``answered`` that ended after ``count``'s was sent took, of those
    whose answers told more left than ``count`` does. Whatever the order the server took them
    in, not counting them again bounds what it holds: an attempt it took before the counted
    one is in the count, and one it took after could have told more left only if more than
    it took had left the count in between."""
    if not log.ended_after(count.since, kind):  # (most answers: none took any, or none ended)
        return 0
    return sum(
        taking.amounts.get(kind, 0)
        for taking in log.ended_since(count.since)
        if taking is not answered
        and taking.ended_at != count.since  # (only those ended after it, as ``_uncounted``)
        and taking.told.get(kind, count.left) > count.left
    )


def _read_resets(state: _Host, kind: str, count: _Count) -> None:
    """What ``count`` shows of the host's resets (``_moved_later``), beside the first count
    told since the last reset passed, its anchor."""
    anchor = state.anchors.get(kind)
    if anchor is not None and not state.refused and not state.full:
        state.full = _moved_later(anchor, count)
    if anchor is None or count.since >= anchor.back_at:
        state.anchors[kind] = count


def _ours_back(
    state: _Host, kind: str, count: _Count, answered: Taking, *, counted: bool
) -> Callable[[], list[tuple[float, int]]] | None:
    """When our attempts in ``count``'s spent part come back, on a full-reset host (None:
    none of ours is in it): its window bound now, the rest when first asked, of the attempts
    that had ended when the answer came (one that ended later, even at the same clock reading,
    is in no count it told), as far as the log still keeps them (it only forgets: never more
    back than at the answer)."""
    assert count.whole is not None
    since, back_at, own, spent = count.since, count.back_at, count.own, count.whole - count.left
    until, age = back_at - count.told_at, count.told_at - since
    window = reset_window(state, kind, until, age, counted=counted)
    log, start = state.log, since - window  # (what ended by then had left the window)
    if own + log.ended_after(start, kind) - log.ended_after(since, kind) <= 0:
        return None  # (nothing of ours to give back: requests that weigh no tokens)
    ended = log.ended_count

    def reckon() -> list[tuple[float, int]]:  # (of plain values: no cycle through ``count``)
        earlier = (t for t in log.ended_by(since) if t.order < ended and t is not answered)
        ours = chain([answered], earlier)
        return _given_back(ours, kind, spent=spent, window=window, since=since, back_at=back_at)

    return reckon


def _moved_later(anchor: _Count, count: _Count) -> bool:
    """Whether the reset moved later from ``anchor`` to ``count`` by more than the time
    ``count``'s answer took to come (an answer read late reads its reset late), ``count`` told
    before ``anchor``'s reset less the time its answer took: a window announcing its oldest
    entry would have announced the same instant, that entry not having left. (A full-reset
    window's reset moves with its newest entry: by at least the time between ``anchor``'s
    answer and the sending of ``count``'s attempt.)"""
    if count.told_at >= anchor.back_at - (anchor.told_at - anchor.since):
        return False
    return count.back_at - anchor.back_at > count.told_at - count.since + _ROUNDING


def reset_window(state: _Host, kind: str, until: float, age: float, *, counted: bool) -> float:
    """The longest a full-reset host's sliding window can be, by this answer (its reset plus
    the answered attempt's age) and the least bound a counted answer told before."""
    window = until + age
    least = min(window, state.windows.get(kind, window))
    if counted:
        state.windows[kind] = least
    return least


def _uncounted(state: _Host, count: _Count, kind: str, now: float) -> int:
    """What attempts took of ``kind`` that ``count`` may not hold yet: every one but its own
    and those it holds for sure (on a host not read as giving the whole count back: on one
    that is, what ``back`` gives back is reckoned from its own and older ones only) that had
    not ended when its attempt was sent (sent concurrently, it may have reached the server
    later), each until a period after it ended."""
    log = state.log
    taken = log.in_flight(kind) + log.ended_after(count.since, kind)
    if count.since <= now - _PERIOD:  # (some of those it holds may be forgotten)
        return taken
    counted_own = count.own if count.since < count.told_at else 0
    return taken - counted_own - (0 if state.full else count.held)


def _given_back(
    counted: Iterable[Taking], kind: str, *, spent: int, window: float, since: float, back_at: float
) -> list[tuple[float, int]]:
    """When a sliding window would give back the ``spent`` part of a count whose attempt was
    sent at ``since`` and whose reset is ``back_at``: the newest of our attempts that it holds
    for sure (``counted``: the answered one, then those that had ended before it was sent,
    newest first, as far as those that may still have been in the window when the answer was
    made: so as many as the limit lets through a window, however long the run), each at its
    end plus ``window``; (instant, amount back by then), in order."""
    returns: list[tuple[float, int]] = []
    explained = 0
    for taking in counted:
        amount = taking.amounts.get(kind, 0)
        # (one that had left the window before the answer was made, and so all older ones,
        # is not in the spent part; nor is what goes beyond it)
        left_before = taking.ended_at is not None and taking.ended_at + window <= since
        if left_before or explained + amount > spent:
            break
        explained += amount
        if taking.ended_at is not None and taking.ended_at + window < back_at:
            returns.append((taking.ended_at + window, amount))
    back, total = [], 0
    for instant, amount in sorted(returns):
        total += amount
        back.append((instant, total))
    return back


@dataclass(frozen=True)
class QuotaReset(GateOption):
    """The quota gate, its resets kept on the board of ``holds`` (the cooldown's)."""

    holds: Holds

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> QuotaGate:
        return QuotaGate(self.holds.board(shared=shared, clock=clock), clock.now)


class QuotaGate:
    """Holds a host's attempts until the reset of a quota its headers said is spent (the
    host's own, whatever the cooldown's scope, "off" included: a quota is one host's), and
    each attempt until the host has the requests and tokens it needs, as its provider's
    headers said (``AnnouncedCounts``). Its hold: the mark of what it took."""

    name = "quota"
    rank = 50
    recheck = True

    def __init__(self, board: CooldownBoard, clock: Callable[[], float] = time.monotonic) -> None:
        self.board = board
        self.counts = AnnouncedCounts(clock)

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        host = admission.host
        held = self.board.remaining(_QUOTA + host)
        refusal = waiting.sleep(self.name, held, admission, _RESET) if held > 0 else None
        if refusal is not None or self.name in admission.held:
            return refusal
        change: threading.Event | None = None  # (taken only once a take says to wait for one)
        while True:
            mark, wait = self.counts.take(host, admission.cost, admission.sides)
            if mark is not None:
                if mark:
                    admission.held[self.name] = mark
                return None
            if wait < INFINITE:
                refusal = waiting.sleep(self.name, wait, admission, _RESET)
            elif change is None:  # (then takes again, so that no answer goes unseen)
                change = self.counts.changed()
                continue
            else:  # until an answer to the host tells what is left
                left, limit = admission.allowance.tightest(waiting.now())
                if left <= 0:
                    return limit
                admission.waited = True
                admission.holding()
                waiting.clock.wait(change, min(left, POLL_SECONDS))
                refusal = "cancelled" if admission.stop.is_set() else None
            change = None
            if refusal is not None:
                return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        if feedback.quota:
            self.board.hold(_QUOTA + admission.host, feedback.quota)
        mark = admission.held.get(self.name, 0)
        self.counts.ended(
            admission.host,
            mark,
            feedback.announced,
            sent=admission.sent,
            counted=feedback.used is not None,
            refused=feedback.congested,
        )

    def abandon(self, admission: Admission) -> None:
        mark = admission.held.pop(self.name, None)
        if mark is not None:
            self.counts.give_back(admission.host, mark)
