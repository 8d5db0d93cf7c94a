"""``Gates``: the limits a run's attempts pass, each a ``Gate`` built by its option, run in
rank order for the engine (``core.admission.Admitter``), the time each makes attempts wait
counted by its name. While a shared backend (``shared``) cannot be reached, attempts wait until
it answers: never sent without their limits.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable

from ..core.admission import Admission, Price, Refusal, Sides
from ..core.budget import Allowance
from ..core.clock import SYSTEM, Clock, clock_of
from ..core.verdict import ErrorKind, Feedback
from .breaker import BreakerGate
from .gate import Gate, Hold, Waiting, WaitStats
from .shared import LimitsUnavailable, SpendLedger, SpendStore
from .spend import SpendGate

# (Admission, Refusal and WaitStats are the gates' own, named here too for their callers)
__all__ = ["Admission", "Gates", "Refusal", "WaitStats"]

_BACKEND_RETRY_SECONDS = 0.5
_WARN_EVERY_SECONDS = 10.0
# What turns off (or loosens) each gate that holds a host's attempts: the progress line says it
# when the gate has held the run a while (the library's option has the same name).
TURNED_OFF_BY = {
    "breaker": "--breaker off",
    "cooldown": "--cooldown off",
    "quota": "--no-quota-headers",
    "host_slot": "a higher --per-host",
    "adaptive": "no --adaptive",
    "spend": "a higher --max-cost",
}
log = logging.getLogger("batchsync")


class Gates:
    """The gates an attempt passes, by rank (see ``Gate``), each built by its option
    (``GateOption.gate``); ``clock`` times their waits."""

    def __init__(
        self, gates: Iterable[Gate], *, clock: Clock | Callable[[], float] = SYSTEM
    ) -> None:
        self._waiting = Waiting(clock_of(clock))
        self.gates: list[Gate] = sorted(gates, key=lambda gate: gate.rank)
        self._now = self._waiting.now
        self.waits = self._waiting.stats
        self._breakers = [gate for gate in self.gates if isinstance(gate, BreakerGate)]
        self._last_warning = float("-inf")

    @property
    def spend_ledger(self) -> SpendLedger | None:
        """The spend cap's ledger (None: the run has no ``max_cost``)."""
        gates = [gate for gate in self.gates if isinstance(gate, SpendGate)]
        return gates[0].ledger if gates else None

    def keep_spend(self, store: SpendStore | None) -> None:
        """Keep the spend cap's reservations in ``store`` (a journal's; None: in the process)."""
        ledger = self.spend_ledger
        if ledger is not None:
            ledger.keep(store)

    def holding(self) -> tuple[Hold, str] | None:
        """The gate holding a host's attempts longest right now, and what turns it off
        (None: none holds any)."""
        hold = self._waiting.held_now.longest(self._now())
        return None if hold is None else (hold, TURNED_OFF_BY.get(hold.gate, ""))

    @property
    def circuits_opened(self) -> int:
        return sum(gate.backend.opened for gate in self._breakers)

    @property
    def circuit_refusals(self) -> int:
        return sum(gate.refusals for gate in self._breakers)

    def admit(
        self, host: str, allowance: Allowance, stop: threading.Event, cost: int = 0
    ) -> Admission | ErrorKind:
        """Wait at each gate; an Admission, or the kind that ends the item instead (see
        ``enter``)."""
        entered = self.enter(host, allowance, stop, cost)
        return entered.kind if isinstance(entered, Refusal) else entered

    def enter(
        self,
        host: str,
        allowance: Allowance,
        stop: threading.Event,
        cost: int = 0,
        *,
        price: Price | None = None,
        sides: Sides | None = None,
        going: Callable[[], None] | None = None,
    ) -> Admission | Refusal:
        """Wait at each gate; an Admission, or the Refusal that ends the item instead (what
        the gates passed hold is given back then); ``going``: see ``Admission.going``.

        While a shared backend cannot be reached, wait and ask again (fail closed): an item
        is never sent without its limits; it ends as ``budget``/``deadline`` if time runs out.
        """
        while True:
            admission = Admission(
                host, allowance, stop, cost=cost, price=price, sides=sides, going=going
            )
            try:
                refusal = self._pass(admission)
            except LimitsUnavailable as exc:
                self.abandon(admission)
                self._unavailable(exc)
                left, limit = allowance.tightest(self._now())
                if left <= _BACKEND_RETRY_SECONDS:
                    return Refusal(limit)
                if self._waiting.clock.wait(stop, _BACKEND_RETRY_SECONDS):
                    return Refusal("cancelled")
                continue
            except BaseException:  # (an interrupt while waiting)
                self.abandon(admission)
                raise
            if refusal is None:
                return admission
            self.abandon(admission)
            return Refusal(refusal, admission.why)

    def _unavailable(self, exc: LimitsUnavailable) -> None:
        now = self._now()
        if now - self._last_warning >= _WARN_EVERY_SECONDS:
            self._last_warning = now
            log.warning("shared limits unavailable, holding attempts until they answer: %s", exc)

    def _pass(self, admission: Admission) -> ErrorKind | None:
        waiting = self._waiting
        for gate in self.gates:
            refusal = gate.admit(admission, waiting)
            if refusal is not None:
                return refusal
            if admission.waited:
                admission.waited = False
                if not gate.recheck:  # a hold may have begun while the attempt waited here
                    refusal = self._recheck(admission, self.gates.index(gate))
                    if refusal is not None:
                        return refusal
        return None

    def _recheck(self, admission: Admission, before: int) -> ErrorKind | None:
        """Pass the gates before ``before`` that hold by time again."""
        for gate in self.gates[:before]:
            if gate.recheck:
                refusal = gate.admit(admission, self._waiting)
                if refusal is not None:
                    return refusal
        admission.waited = False
        return None

    def try_admit(self, host: str) -> Admission | None:
        """Admit an extra request (a hedge) only if every gate has room right now."""
        admitted = self.admit(host, Allowance(self._now()), threading.Event())
        return admitted if isinstance(admitted, Admission) else None

    def abandon(self, admission: Admission) -> None:
        """Give back what an admission held when its attempt never came to a Verdict (a
        refusal at a later gate, an interrupt): its slot, its probe; it tells nothing."""
        for gate in self.gates:
            # A backend that cannot be reached forgets on its own: leases and probes expire.
            with contextlib.suppress(LimitsUnavailable):
                gate.abandon(admission)

    def release(self, admission: Admission, feedback: Feedback) -> None:
        """Give back the slots and tell each limit what the attempt came to. A gate that
        cannot learn from it (a value it cannot use) gives back what it holds instead; the
        others still learn."""
        for gate in self.gates:
            try:
                gate.release(admission, feedback)
            except LimitsUnavailable as exc:  # leases expire; what this attempt taught is lost
                self._unavailable(exc)
            except Exception as exc:
                log.warning("the %s limit could not learn from an answer: %s", gate.name,
                            type(exc).__name__)  # fmt: skip
                log.debug("the %s limit's failure", gate.name, exc_info=True)
                with contextlib.suppress(Exception):
                    gate.abandon(admission)
