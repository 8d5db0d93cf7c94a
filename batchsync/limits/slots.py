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


class _Host:
    """A key's attempts in flight, its waiters, and the slots freed for them (a condition on
    the pool's one lock)."""

    __slots__ = ("freed", "in_flight", "promised", "waiting")

    def __init__(self, lock: threading.Lock) -> None:
        self.in_flight = 0
        self.waiting = 0
        self.promised = 0  # slots freed for a waiter, which no newcomer may take
        self.freed = threading.Condition(lock)


class HostSlots:
    """At most ``limit`` attempts in flight per key.

    Quiet and in turn: a slot that frees while attempts wait is handed to one of them and
    wakes that one alone (waking every waiter of every key, each to find the one slot taken,
    cost more CPU than the requests at high concurrency), and no attempt that arrives
    meanwhile takes it; ``wake`` wakes them all, for the run's stop.
    """

    def __init__(self, limit: int) -> None:
        self._limit = limit
        self._lock = threading.Lock()
        self._hosts: dict[str, _Host] = {}

    def enter(self, key: str, timeout: float, stop: threading.Event | None = None) -> bool:
        """A slot for ``key`` now, or after one wait of at most ``timeout`` (False: none came,
        or the wait was woken for another reason: the caller looks again). ``stop`` is looked
        at under the lock ``wake`` takes: a stop's wake-up is never lost."""
        with self._lock:
            host = self._hosts.get(key)
            if host is None:
                host = self._hosts[key] = _Host(self._lock)
            if host.in_flight + host.promised >= self._limit:
                if timeout <= 0 or (stop is not None and stop.is_set()):
                    self._forget_if_idle(key, host)
                    return False
                host.waiting += 1
                host.freed.wait(timeout)
                host.waiting -= 1
                if host.promised:  # (one freed for the waiters: this one takes it)
                    host.promised -= 1
                elif host.in_flight + host.promised >= self._limit:
                    self._forget_if_idle(key, host)
                    return False
            host.in_flight += 1
            return True

    def leave(self, key: str) -> None:
        with self._lock:
            host = self._hosts[key]
            host.in_flight -= 1
            if host.waiting > host.promised:
                host.promised += 1
                host.freed.notify()
            self._forget_if_idle(key, host)

    def wake(self) -> None:
        with self._lock:
            for host in self._hosts.values():
                host.freed.notify_all()

    def _forget_if_idle(self, key: str, host: _Host) -> None:
        """(under the lock) A key with nothing in flight and no waiter is kept no longer."""
        if not host.in_flight and not host.waiting:
            del self._hosts[key]


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
            self.name,
            lambda timeout: slots.enter(host, timeout, admission.stop) or None,
            admission,
            wake=slots.wake,
        )
        if taken:
            admission.held[self.name] = True
        return refusal

    def release(self, admission: Admission, feedback: Feedback) -> None:
        self.abandon(admission)

    def abandon(self, admission: Admission) -> None:
        if admission.held.get(self.name):
            self.slots.leave(admission.host)
