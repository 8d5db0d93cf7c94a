"""Hedging: when an attempt is slow to answer, race a second identical request against it."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import replace
from typing import Literal

from ..core.result import ATTEMPT_EARLIER, for_the_limits, percentile
from ..core.verdict import Verdict
from ..limits.gates import Gates
from .classify import host_feedback

HedgeAfter = float | Literal["p95"]

# One request: given an Event that is set once it has lost the race, its Verdict.
Exchange = Callable[[threading.Event], Verdict]

_MIN_SAMPLES = 20
_SAMPLES_KEPT = 1000
_RECOMPUTE_EVERY = 50


class HedgeDelay:
    """How long an attempt may go unanswered before it is hedged.

    A fixed number of seconds, or ``"p95"``: the 95th percentile of the answer times seen so
    far in the batch (no hedging until there are a few to go by).
    """

    def __init__(self, setting: HedgeAfter) -> None:
        self._fixed = None if setting == "p95" else float(setting)
        self._samples: deque[float] = deque(maxlen=_SAMPLES_KEPT)
        self._since_recompute = 0
        self._p95: float | None = None
        self._lock = threading.Lock()

    def current(self) -> float | None:
        return self._fixed if self._fixed is not None else self._p95

    def observe(self, seconds: float) -> None:
        if self._fixed is not None:
            return
        with self._lock:
            self._samples.append(seconds)
            self._since_recompute += 1
            if len(self._samples) >= _MIN_SAMPLES and (
                self._p95 is None or self._since_recompute >= _RECOMPUTE_EVERY
            ):
                self._p95 = percentile(list(self._samples), 0.95)
                self._since_recompute = 0


class Hedger:
    """Runs an exchange; if it has not answered after the hedge delay, starts an identical one
    and takes the first answer. The loser is told so and closes its response.

    The extra request passes the limits (``gates``) like any attempt, but only if they have
    room at once; otherwise there is no hedge.
    """

    def __init__(
        self,
        delay: HedgeDelay,
        workers: int,
        gates: Gates | None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._delay = delay
        self._pool = ThreadPoolExecutor(workers, thread_name_prefix="batchsync-hedge")
        self._gates = gates
        self._clock = clock

    def close(self, wait: bool = True) -> None:
        self._pool.shutdown(wait=wait, cancel_futures=True)

    def run(self, exchange: Exchange, host: str) -> Verdict:
        delay = self._delay.current()
        started = self._clock()
        if delay is None:
            return self._observed(exchange(threading.Event()), started)
        first_lost = threading.Event()
        first = self._pool.submit(exchange, first_lost)
        try:
            return self._observed(first.result(timeout=delay), started)
        except FutureTimeout:
            pass
        gates = self._gates
        room = None if gates is None else gates.try_admit(host)
        if gates is not None and room is None:
            return self._observed(first.result(), started)
        second_lost = threading.Event()
        if room is not None:  # (when it was sent: the cooldown judges a refusal by it)
            room.sent = self._clock()
        second = self._pool.submit(exchange, second_lost)
        if gates is not None and room is not None:
            earlier = ATTEMPT_EARLIER.get()  # (the item's, in a retry pass: as its own attempt)

            def release(done: Future[Verdict]) -> None:
                verdict = done.result()
                gates.release(room, for_the_limits(host_feedback(verdict), verdict, earlier))

            second.add_done_callback(release)
        winner = _first_answer(first, second)
        (second_lost if winner is first else first_lost).set()
        # Slow answers count too: a p95 fed only the fast ones would fall and hedge everything.
        return replace(self._observed(winner.result(), started), hedged=True)

    def _observed(self, verdict: Verdict, started: float) -> Verdict:
        if verdict.ok:
            self._delay.observe(self._clock() - started)
        return verdict


def _first_answer(first: Future[Verdict], second: Future[Verdict]) -> Future[Verdict]:
    """The first to finish with an answer (success or a final failure); failing that, the last."""
    pending = {first, second}
    while True:
        done, pending = wait(pending, return_when=FIRST_COMPLETED)
        for future in done:
            if future.result().outcome != "retry" or not pending:
                return future
