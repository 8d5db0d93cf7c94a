"""Stop signals: the first SIGINT/SIGTERM stops the run gracefully, a second one quits."""

from __future__ import annotations

import contextlib
import os
import signal
import threading
from collections.abc import Callable, Iterator
from types import FrameType

from ..run.assembly import Stoppable

EXIT_INTERRUPTED = 130
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)

# A stop signal that came before the run began (see ``main``): the run stops as it starts.
signalled_early = threading.Event()


@contextlib.contextmanager
def signals_deferred() -> Iterator[None]:
    """Until the run's own handlers take over, a stop signal is only noted: Python's default
    raises KeyboardInterrupt wherever the program happens to be, which can leave a lock (the
    logging module's, say) held for ever and the run hung."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {
        number: signal.signal(number, lambda signum, frame: signalled_early.set())
        for number in STOP_SIGNALS
    }
    try:
        yield
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
        signalled_early.clear()


@contextlib.contextmanager
def stop_on_signals() -> Iterator[Callable[[Stoppable], None]]:
    """First SIGINT/SIGTERM: stop the run gracefully. A second one: quit at once."""
    engines: list[Stoppable] = []
    stopping = threading.Event()  # (a run that starts after the first signal starts stopped)

    def started(run: Stoppable) -> None:
        engines.append(run)
        if signalled_early.is_set():
            os.write(2, b"Stopping: interrupted before the run began\n")
            run.stop()
        elif stopping.is_set():
            run.stop()

    def handle(signum: int, frame: FrameType | None) -> None:
        # (what runs the batch: one engine, or a batch endpoint's run then the live lane's)
        if engines and not stopping.is_set():
            # Stop before saying so: a second signal may run this handler again in the middle
            # of the first, and must then find the run stopping.
            stopping.set()
            for engine in engines:
                engine.stop()
            os.write(2, b"Stopping: letting requests in flight finish (Ctrl-C again quits now)\n")
            return
        os.write(2, b"Interrupted: quitting now\n")
        os._exit(EXIT_INTERRUPTED)

    previous = {number: signal.signal(number, handle) for number in STOP_SIGNALS}
    try:
        yield started
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)
