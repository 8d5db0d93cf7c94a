"""The watchdog: no phase of an attempt outlives the attempt's end.

Socket timeouts bound each read and write, not their sum: a server that sends one byte just
inside each timeout (a TLS handshake, a status line or headers a line at a time, a request
body it reads slowly, a redirect's body) could hold an attempt, and its worker, for ever.
Each thread arms its own slot with its attempt's end before sending; the socket the attempt
uses is attached to that slot as it is opened or reused; a watcher thread that wakes every
``TICK`` seconds shuts down the socket of any slot past its end, which ends the blocked read or
write at once. The attempt then fails as a timeout (see ``Watchdog.disarm``).
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Callable

# How often the watcher looks, and so how far past its end an attempt may run at most.
TICK = 0.05


class _Slot:
    """One thread's attempt: its end, its socket, and whether the watcher cut it."""

    __slots__ = ("cut", "end", "lock", "sock")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.end: float | None = None
        self.sock: socket.socket | None = None
        self.cut = False


class Watchdog:
    """Cuts the socket of any attempt still running at its end; see the module docstring."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._local = threading.local()
        self._slots: list[_Slot] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    def _new_slot(self) -> _Slot:
        """This thread's slot, made on its first attempt (and the watcher, on the first)."""
        slot = self._local.slot = _Slot()
        with self._lock:
            self._slots.append(slot)
            if self._watcher is None and not self._stop.is_set():
                self._watcher = threading.Thread(
                    target=self._watch, name="batchsync-watchdog", daemon=True
                )
                self._watcher.start()
        return slot

    def arm(self, wall_end: float) -> None:
        """This thread's attempt must be over by ``wall_end`` (a reading of the clock).

        The three fields are set under the slot's lock, which the watcher reads them under:
        nothing relies on the order in which another core sees plain stores (which a
        free-threaded build does not promise). Armed with this same end (a redirect's next
        hop), the slot is left as it is.
        """
        slot: _Slot = getattr(self._local, "slot", None) or self._new_slot()
        if slot.end != wall_end:
            with slot.lock:
                slot.sock, slot.cut, slot.end = None, False, wall_end

    def attach(self, sock: socket.socket | None) -> None:
        """The socket this thread's armed attempt now reads or writes."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is not None and slot.end is not None and sock is not None:
            slot.sock = sock

    def end(self) -> float | None:
        """The end this thread's attempt is armed with, if any."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        return None if slot is None else slot.end

    def disarm(self) -> bool:
        """The attempt is over (or its connection is about to be handed back to the pool):
        stop watching it. True when the watcher had cut it, so its connection must not be
        reused and the attempt counts as timed out."""
        slot: _Slot | None = getattr(self._local, "slot", None)
        if slot is None or slot.end is None:  # only this thread arms it: nothing to undo
            return False
        with slot.lock:
            cut = slot.cut
            slot.end, slot.sock, slot.cut = None, None, False
        return cut

    def _watch(self) -> None:
        while not self._stop.wait(TICK):
            now = self._clock()
            with self._lock:
                slots = list(self._slots)
            for slot in slots:
                end = slot.end
                if end is None or end > now:
                    continue
                with slot.lock:
                    end, sock = slot.end, slot.sock
                    if end is None or end > now or sock is None or slot.cut:
                        continue
                    slot.cut = True
                    with contextlib.suppress(OSError):
                        sock.shutdown(socket.SHUT_RDWR)

    def close(self) -> None:
        """Stop the watcher thread."""
        self._stop.set()
        with self._lock:
            watcher, self._watcher = self._watcher, None
        if watcher is not None:
            watcher.join()
