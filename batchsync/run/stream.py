"""Results as they come: a run carried on in a thread of its own while the caller's loop takes
each Result the moment it is journaled; leaving the loop stops the run as Ctrl-C does.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Generator, Iterator
from typing import Final

from ..core.result import Result
from .assembly import Stoppable

log = logging.getLogger("batchsync")

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


def streamed(run: Running) -> Generator[Result]:
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


class Stream(Iterator[Result]):
    """The Results of ``streamed``, and how to stop its run: ``close()``, or leaving a ``with``
    block. A stream dropped unclosed (the loop over ``b.stream()`` left) is closed as it is
    collected, and what its run raised then is logged, having no caller left to reach."""

    def __init__(self, results: Generator[Result]) -> None:
        self._results = results

    def __iter__(self) -> Stream:
        return self

    def __next__(self) -> Result:
        return next(self._results)

    def close(self) -> None:
        """Stop the run (if it goes on) and wait for it; what it raised is raised."""
        self._results.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except BaseException as exc:  # (collected: no caller to raise it to)
            log.error("a stream left unclosed stopped its run, which failed: %s", exc)
