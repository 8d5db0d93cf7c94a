"""Host slots (``per_host=N``): at most N attempts in flight to each host (or limit key)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import ErrorKind, Feedback
from .gate import GateOption, Waiting
from .shared import SharedLimits, SlotPool


@dataclass(frozen=True)
class PerHost(GateOption):
    """``per_host``: at most ``limit`` attempts in flight per host, over all workers (and all
    processes sharing ``--redis``)."""

    limit: int

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> SlotGate:
        return SlotGate(HostSlots(self.limit) if shared is None else shared.slots(self.limit))


class HostSlots:
    """At most ``limit`` attempts in flight per key; waiters wake as soon as a slot frees."""

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._in_flight: dict[str, int] = {}
        self._changed = threading.Condition()

    def enter(self, key: str, timeout: float) -> bool:
        with self._changed:
            if not self._changed.wait_for(
                lambda: self._in_flight.get(key, 0) < self._limit, timeout
            ):
                return False
            self._in_flight[key] = self._in_flight.get(key, 0) + 1
            return True

    def leave(self, key: str) -> None:
        with self._changed:
            left = self._in_flight[key] - 1
            if left:
                self._in_flight[key] = left
            else:
                del self._in_flight[key]
            self._changed.notify_all()


@dataclass(eq=False)
class SlotGate:
    """At most N attempts in flight per host; its hold: the slot."""

    slots: SlotPool
    name = "host_slot"
    rank = 30
    recheck = False

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        host, slots = admission.host, self.slots
        taken, refusal = waiting.poll(
            self.name, lambda timeout: slots.enter(host, timeout) or None, admission
        )
        if taken:
            admission.held[self.name] = True
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        self.abandon(admission)

    def abandon(self, admission: Admission) -> None:
        if admission.held.get(self.name):
            self.slots.leave(admission.host)
