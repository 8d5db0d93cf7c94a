"""Results as they come: a run carried on in a thread of its own while the caller's loop takes
each Result the moment it is journaled; leaving the loop stops the run as Ctrl-C does.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from typing import Final

from ..core.result import Result
from .assembly import Stoppable

# How long the loop waits for a Result before it looks again (a timed wait lets Ctrl-C in).
_LOOK_SECONDS: Final = 0.2


class Stopper:
    """Stops what a run started (``started`` is its ``on_start``), now or as soon as it starts."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs: list[Stoppable] = []
        self._wanted = False

    def started(self, run: Stoppable) -> None:
        with self._lock:
            self._runs.append(run)
            if self._wanted:
                run.stop()

    def stop(self) -> None:
        with self._lock:
            self._wanted = True
            for run in self._runs:
                run.stop()


# What ``streamed`` runs: a run given where each Result goes and what sees it start.
Running = Callable[[Callable[[Result], None], Callable[[Stoppable], None]], object]


def streamed(run: Running) -> Iterator[Result]:
    """Each Result ``run`` gives, as it gives it; the run goes on in its own thread. Leaving
    the loop (a ``break``, an exception, Ctrl-C) stops the run and waits for it to end as a
    stopped run ends (attempts in flight get their grace); what the run raised is raised."""
    arrived: queue.SimpleQueue[Result | None] = queue.SimpleQueue()
    stopper = Stopper()
    failed: list[BaseException] = []

    def carry_on() -> None:
        try:
            run(arrived.put, stopper.started)
        except BaseException as exc:  # (raised again in the caller's thread)
            failed.append(exc)
        finally:
            arrived.put(None)

    thread = threading.Thread(target=carry_on, name="batchsync-stream", daemon=True)
    thread.start()
    try:
        while True:
            try:
                result = arrived.get(timeout=_LOOK_SECONDS)
            except queue.Empty:
                continue
            if result is None:
                break
            yield result
    finally:
        if thread.is_alive():
            stopper.stop()
        while thread.is_alive():
            thread.join(_LOOK_SECONDS)
        if failed:
            raise failed[0]
