"""Dask for a batch across a cluster (the optional ``dask`` extra): a client of the scheduler,
and the ``Distributor`` that keeps a bounded number of partitions running on it. The cluster
runner (``run.cluster``) decides what the partitions are and what is done with their Results;
Dask itself is imported only when a run asks for a cluster.
"""

from __future__ import annotations

import logging
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..core.result import Result

log = logging.getLogger("batchsync")

# A run of (index, item) pairs; the indexes are the items' places in the whole batch.
Partition = list[tuple[int, Any]]

# Partitions in flight at once, per worker thread of the cluster: enough to keep every worker
# busy, few enough that the client holds little.
_OUTSTANDING_PER_WORKER = 2


# What runs one partition on a worker (sent there pickled): its Results, batch indexes kept.
PartitionRun = Callable[[Partition], list[Result]]


# Dask's workers sample the stack of every thread (``sys._current_frames``) every 10 ms; on
# CPython 3.11 that can deadlock a worker whose threads are busy (python/cpython#106883,
# dask/distributed#8616: a LocalCluster worker hung in 2 of 7 trials on 3.11.7), and a
# partition runs a thread per item in flight. Clusters made for batchsync set this; the
# workers of any other are told by ``profiler_off``.
PROFILER_OFF = {"distributed.worker.profile.enabled": False}


def _stop_profiler(dask_worker: Any) -> bool:
    """Run on a worker: its profiler stopped when its Python is 3.11; whether it was."""
    if sys.version_info[:2] != (3, 11):
        return False
    for name in ("profile", "profile-cycle"):
        callback = dask_worker.periodic_callbacks.pop(name, None)
        if callback is not None:
            callback.stop()
    return True


def profiler_off(client: Any) -> None:
    """Stop the profiler of the cluster's workers that run CPython 3.11 (see
    ``PROFILER_OFF``): a run is not worth a hung worker. A cluster that cannot say is left as
    it is."""
    try:
        stopped = client.run(_stop_profiler)
    except Exception as exc:  # (an old scheduler, a worker gone: the run goes on)
        log.debug("could not stop the Dask workers' profiler: %s", exc)
        return
    if any(stopped.values()):
        log.info("stopped the profiler of the Dask workers on Python 3.11 (cpython#106883)")


def cluster_client(address: str) -> Any:
    """A client of the Dask scheduler at ``address``; ValueError when it cannot be reached."""
    try:
        from distributed import Client
    except ImportError:
        raise ValueError("--dask needs dask.distributed: pip install 'batchsync[dask]'") from None
    try:
        return Client(address, timeout=10)
    except (OSError, TimeoutError) as exc:
        raise ValueError(f"cannot reach the Dask scheduler at {address}: {exc}") from None


class Distributor:
    """Submits partitions to a cluster, a bounded number at a time, and yields each one's
    Results as it finishes. ``stop()`` ends it early: nothing more is submitted, what is
    outstanding is cancelled."""

    def __init__(self, client: Any, task: PartitionRun) -> None:
        self._client = client
        self._task = task
        self._stop = threading.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    @property
    def abandoned(self) -> bool:
        """Never: a cancelled partition leaves nothing running here."""
        return False

    def run(self, work: Iterable[Partition]) -> Iterator[tuple[Partition, list[Result]]]:
        from distributed import as_completed

        threads = sum(self._client.nthreads().values()) or 1
        outstanding = _OUTSTANDING_PER_WORKER * threads
        source = iter(work)
        submitted: dict[Any, Partition] = {}
        finished = as_completed()

        def submit_next() -> None:
            partition = next(source, None)
            if partition is not None and not self._stop.is_set():
                future = self._client.submit(self._task, partition, pure=False)
                submitted[future] = partition
                finished.add(future)

        for _ in range(outstanding):
            submit_next()
        try:
            for future in finished:
                partition = submitted.pop(future)
                yield partition, future.result()
                if self._stop.is_set():
                    break
                submit_next()
        finally:
            for future in submitted:
                future.cancel()
