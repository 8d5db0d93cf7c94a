"""The quota gate, in every run: a host whose headers said its quota is spent is held until the
reset (``quota_headers``), and each attempt until the host has the requests and tokens its
rate-limit headers say are left (``AnnouncedCounts``), kept per host between its answers, so
that an attempt waits before it would overdraw them rather than after a 429.

Each answer that tells them (``provider.Announced``: OpenAI's ``x-ratelimit-*``, Anthropic's
``anthropic-ratelimit-*``) sets the host's count anew, less what attempts let through after the
answered one took (the answer could not count those yet). The reset is read as OpenAI and
Anthropic define it, the time until the whole count is back; until then no more is assumed back
than both kinds of server would have given:

* a server that refills as a bucket gives back evenly until the reset;
* one that counts over a sliding window gives back an amount only when the request that took
  it leaves the window: the attempts of ours that the spent part can be, each no sooner than
  its end plus the window, the rest (other clients') at the reset. The window is at most the
  reset plus the answered attempt's age, for any answer the server counted (one that says what
  it used): the least of these bounds, over the host's answers, stands.

The smaller of the two stands, so neither kind of server is overdrawn. After the reset the whole
count is back, less what was taken since the answer.

Until a host's first answer, its requests that weigh tokens go one at a time: with many workers
a blind start would send a period's worth before the first count came back.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import Announced, ErrorKind, Feedback
from .cooldown import Holds
from .gate import POLL_SECONDS, GateOption, Waiting
from .shared import CooldownBoard, SharedLimits
from .window import INFINITE

# The cooldown board's key of a host's quota reset (beside its cooldown's, the host itself).
_QUOTA = "quota "
_RESET = "the server's reset is"
# How long an attempt taken after the last answer stays counted when no answer tells again.
_COUNTED_FOR = 60.0
# How long what attempts took is kept: what a window of a provider's minute can still hold.
_KEPT_FOR = 2 * _COUNTED_FOR
KINDS = ("requests", "tokens")


@dataclass
class _Count:
    """One count of a host as an answer told it at ``told_at``: ``left`` then, ``whole`` back at
    ``back_at``, and in between what ``back`` gives back: (instant, amount back by then)."""

    left: int
    whole: int | None
    told_at: float
    back_at: float
    mark: int  # the taking whose answer told it
    since: float  # when that taking was sent: what had ended before then, the count counted
    back: list[tuple[float, int]] = field(default_factory=list)


@dataclass
class _Taking:
    """What one attempt took, when it was let through (then sent) and when it ended."""

    mark: int
    amounts: dict[str, int]
    sent_at: float
    ended_at: float | None = None


@dataclass
class _Host:
    counts: dict[str, _Count] = field(default_factory=dict)
    taken: deque[_Taking] = field(default_factory=deque)  # oldest first
    marks: int = 0
    heard: bool = False  # an attempt to it has ended
    windows: dict[str, float] = field(default_factory=dict)  # per kind: the least bound told
    probing: bool = False  # its first attempt that weighs tokens is in flight


def available(count: _Count, now: float) -> float:
    """What ``count`` holds at ``now`` by the rules above (before what was taken since)."""
    if now >= count.back_at:
        return float(count.whole if count.whole is not None else max(count.left, 0))
    spent = 0 if count.whole is None else max(count.whole - count.left, 0)
    evenly = spent * (now - count.told_at) / (count.back_at - count.told_at)
    window = 0
    for instant, amount in count.back:
        if instant > now:
            break
        window = amount
    return count.left + min(evenly, window)


def count_wait(count: _Count, taken: int, amount: int, now: float) -> float:
    """Seconds until ``amount`` fits in ``count`` beside the ``taken`` amount it does not know of
    yet (0: now; infinite: only a later answer can tell). More than the whole count fits once
    the whole count is free; a count of a size never said, once it is back."""
    whole = count.whole if count.whole is not None else max(count.left, 0)
    need = taken + min(amount, max(whole, 1))
    if now >= count.back_at:
        return 0.0 if whole <= 0 or whole >= need else INFINITE
    if available(count, now) >= need:
        return 0.0
    missing = need - count.left
    spent = 0 if count.whole is None else max(count.whole - count.left, 0)
    evenly_at = (
        count.told_at + missing * (count.back_at - count.told_at) / spent if spent else INFINITE
    )
    window_at = next((instant for instant, back in count.back if back >= missing), INFINITE)
    return min(max(evenly_at, window_at), count.back_at) - now


class AnnouncedCounts:
    """Per host: the requests and tokens left, as its headers last said and attempts took since."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._hosts: dict[str, _Host] = {}
        self._lock = threading.Lock()
        self._changed = threading.Event()

    def take(self, host: str, cost: int) -> tuple[int | None, float]:
        """Take one request and ``cost`` tokens of the host's: (the mark of the taking, 0), or
        (None, the seconds to wait first; infinite until an answer tells)."""
        known = self._hosts.get(host)
        if (known is None or not known.counts) and (cost <= 0 or (known and known.heard)):
            return 0, 0.0  # (most hosts: nothing told, nothing to wait for, nothing kept)
        with self._lock:
            state = self._hosts.setdefault(host, _Host())
            now = self._clock()
            if cost > 0 and not state.heard:
                if state.probing:
                    return None, INFINITE
                state.probing = True
            while state.taken and state.taken[0].sent_at <= now - _KEPT_FOR:
                state.taken.popleft()
            amounts = {"requests": 1, "tokens": cost}
            wait = 0.0
            for kind, count in state.counts.items():
                uncounted = _uncounted(state.taken, count, kind, now)
                wait = max(wait, count_wait(count, uncounted, amounts[kind], now))
            if wait > 0:
                if cost > 0 and not state.heard:
                    state.probing = False
                return None, wait
            state.marks += 1
            state.taken.append(_Taking(state.marks, amounts, now))
            return state.marks, 0.0

    def ended(
        self, host: str, mark: int, said: Announced | None, sent: float | None, *, counted: bool
    ) -> None:
        """The attempt taken as ``mark`` was sent at ``sent`` (None: now) and ended; ``said``:
        what its answer's headers told; ``counted``: the server counted it (its answer said what
        it used), so the answer bounds the window."""
        known = self._hosts.get(host)
        if mark == 0 and said is None and (known is None or known.heard):
            return
        with self._lock:
            state = self._hosts.setdefault(host, _Host())
            now = self._clock()
            state.heard, state.probing = True, False
            taking = self._taking(state, mark)
            if taking is not None:
                taking.sent_at, taking.ended_at = now if sent is None else sent, now
            if said is not None:
                self._told(state, said, mark, taking, now, counted=counted)
            self._wake()

    def give_back(self, host: str, mark: int) -> None:
        """The attempt taken as ``mark`` was never sent."""
        with self._lock:
            state = self._hosts.setdefault(host, _Host())
            state.probing = False
            taking = self._taking(state, mark)
            if taking is not None:
                state.taken.remove(taking)
            self._wake()

    @staticmethod
    def _taking(state: _Host, mark: int) -> _Taking | None:
        return next((took for took in reversed(state.taken) if took.mark == mark), None)

    def _wake(self) -> None:
        """(under the lock) Wake every waiter for an answer; the next one sets a new event."""
        self._changed.set()
        self._changed = threading.Event()

    def changed(self) -> threading.Event:
        """Set at the next answer or giving back: what a waiter for an answer waits on."""
        return self._changed

    @staticmethod
    def _told(
        state: _Host,
        said: Announced,
        mark: int,
        answered: _Taking | None,
        now: float,
        *,
        counted: bool,
    ) -> None:
        for kind, left, reset, said_whole in (
            ("requests", said.requests_remaining, said.requests_reset, said.requests_limit),
            ("tokens", said.tokens_remaining, said.tokens_reset, said.tokens_limit),
        ):
            known = state.counts.get(kind)
            since = now if answered is None else answered.sent_at
            if left is None or (known is not None and known.since > since):
                continue  # not said, or older than what an answer already told
            whole = said_whole if said_whole is not None or known is None else known.whole
            until = reset if reset is not None else _COUNTED_FOR
            count = _Count(left, whole, now, now + until, mark, since)
            if whole is not None and answered is not None:
                window = until + (now - answered.sent_at)  # the longest the window can be
                if counted:
                    window = state.windows[kind] = min(window, state.windows.get(kind, window))
                else:
                    window = min(window, state.windows.get(kind, window))
                count.back = _given_back(
                    state.taken, mark, kind, spent=whole - left, window=window, count=count
                )
            state.counts[kind] = count


def _uncounted(taken: deque[_Taking], count: _Count, kind: str, now: float) -> int:
    """What attempts took of ``kind`` that ``count`` may not hold yet: every one but its own
    that had not ended when its attempt was sent (sent concurrently, it may have reached the
    server later), each for a minute at most."""
    return sum(
        taking.amounts.get(kind, 0)
        for taking in taken
        if taking.mark != count.mark
        and (taking.ended_at is None or taking.ended_at > count.since)
        and taking.sent_at > now - _COUNTED_FOR
    )


def _given_back(
    taken: deque[_Taking], mark: int, kind: str, *, spent: int, window: float, count: _Count
) -> list[tuple[float, int]]:
    """When a sliding window would give back the ``spent`` part of ``count``: the newest of our
    attempts that it holds for sure (the answered one, and those that had ended before it was
    sent), each at its end plus ``window``; (instant, amount back by then), in order."""
    returns: list[tuple[float, int]] = []
    explained = 0
    for taking in reversed(taken):
        counted = taking.ended_at is not None and taking.ended_at <= count.since
        if taking.mark != mark and not counted:
            continue
        amount = taking.amounts.get(kind, 0)
        if explained + amount > spent:
            break
        explained += amount
        if taking.ended_at is not None and taking.ended_at + window < count.back_at:
            returns.append((taking.ended_at + window, amount))
    returns.sort()
    back, total = [], 0
    for instant, amount in returns:
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
        while True:
            change = self.counts.changed()
            mark, wait = self.counts.take(host, admission.cost)
            if mark is not None:
                if mark:
                    admission.held[self.name] = mark
                return None
            if wait < INFINITE:
                refusal = waiting.sleep(self.name, wait, admission, _RESET)
            else:  # until an answer to the host tells what is left
                left, limit = admission.allowance.tightest(waiting.now())
                if left <= 0:
                    return limit
                waiting.clock.wait(change, min(left, POLL_SECONDS))
                refusal = "cancelled" if admission.stop.is_set() else None
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
        )

    def abandon(self, admission: Admission) -> None:
        mark = admission.held.pop(self.name, None)
        if mark is not None:
            self.counts.give_back(admission.host, mark)
