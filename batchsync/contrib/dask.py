"""Batches too big for one machine, split across a Dask cluster (the optional ``dask`` extra).

The items are cut into partitions; each partition runs on a worker with the normal engine
(its own thread pool), and the limits are shared through Redis (``limits="redis://..."``) so
that the whole cluster keeps to one quota. A worker lost mid-partition has its partition run
again by Dask. On the client, each finished partition goes to the journal, so a restarted
client redoes only the partitions that had not finished.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from functools import partial
from itertools import islice
from pathlib import Path
from typing import Any

from ..assembly import fetch, open_journal, run_calls
from ..batch import Item, encode_result, identity_of
from ..engine import Job
from ..fetch import HttpJob
from ..journal import resumed
from ..options import CallOptions, FetchOptions, FlowOptions, build
from ..result import Result
from ..resultset import ResultSet

# What turns the HTTP job into the one a partition's items need (see ``run_partition``).
Wrap = Callable[[HttpJob], Job]

# A run of (index, item) pairs; the indexes are the items' places in the whole batch.
Partition = list[tuple[int, Any]]

# Partitions in flight at once, per worker thread of the cluster: enough to keep every worker
# busy, few enough that the client holds little.
_OUTSTANDING_PER_WORKER = 2


# What runs one partition on a worker (sent there pickled): its Results, batch indexes kept.
PartitionRun = Callable[[Partition], list[Result]]


def run_partition(
    partition: Partition, settings: dict[str, Any], wrap: Wrap | None = None
) -> list[Result]:
    """Run on a worker: the engine over one partition of HTTP items.

    ``wrap`` (sent by reference) turns the HTTP job into the one the items need: the command
    line's, whose items are input entries. The client observes the run (metrics, traces).
    """
    options = build(FetchOptions, **settings)
    collected: dict[int, Result] = {}
    fetch(options, partition, _collector(collected), observed=False, wrap=wrap)
    return [collected[index] for index in sorted(collected)]


def run_call_partition(
    partition: Partition, fn: Callable[[Any], Any], settings: dict[str, Any]
) -> list[Result]:
    """Run on a worker: the engine over one partition of calls of ``fn``."""
    options = build(CallOptions, **settings)
    collected: dict[int, Result] = {}
    run_calls(options, fn, partition, _collector(collected), observed=False)
    return [collected[index] for index in sorted(collected)]


def _collector(collected: dict[int, Result]) -> Callable[[Result, object], None]:
    return lambda result, item: collected.__setitem__(result.index, result)


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


def worker_settings(options: FlowOptions) -> dict[str, Any]:
    """The options a worker needs, in a form that travels: shared limits by their URL; the
    session, hooks, metrics registry and tracer stay on the client."""
    settings = options.model_dump(
        exclude={"session", "on_attempt", "on_result", "metrics", "tracer", "fallbacks"},
        exclude_defaults=True,
    )
    url = getattr(options.limits, "url", options.limits)
    if url is not None:
        settings["limits"] = url
    return settings


def partitions(pairs: Iterable[tuple[int, Any]], size: int) -> Iterator[Partition]:
    """The (index, item) pairs cut into lists of at most ``size``, read lazily."""
    source = iter(pairs)
    while chunk := list(islice(source, size)):
        yield chunk


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


def fetch_on_cluster(
    items: Iterable[Item],
    client: Any,
    *,
    partition_size: int = 1000,
    journal: str | Path | None = None,
    **options: Any,
) -> ResultSet:
    """``batchsync.fetch_all`` on a Dask cluster: one Result per item, in input order.

    ``client`` is a ``distributed.Client``; ``options`` are those of ``fetch_all`` (give
    ``limits="redis://..."`` so that all workers share one quota), sent to the workers as
    they are: hooks and fallbacks run there. With ``journal=``, each
    finished partition is recorded, and a new call over the same items after a client
    restart runs only the items whose partitions had not finished.
    """
    task = partial(run_partition, settings=_checked(FetchOptions, options))
    return _on_cluster(task, list(items), client, partition_size, journal, strict=False)


def run_on_cluster(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    client: Any,
    *,
    partition_size: int = 1000,
    journal: str | Path | None = None,
    **options: Any,
) -> ResultSet:
    """``batchsync.run_all`` on a Dask cluster: ``fn`` (pickled to the workers) called for
    every item, one Result per item, in input order; ``options`` and ``journal`` as for
    ``fetch_on_cluster`` (what ``fn`` returns must be JSON to be journaled, and the items
    JSON)."""
    task = partial(run_call_partition, fn=fn, settings=_checked(CallOptions, options))
    return _on_cluster(task, list(items), client, partition_size, journal, strict=True)


def _checked(model: type[FlowOptions], options: dict[str, Any]) -> dict[str, Any]:
    """The library's options for the workers, as given (a progress bar is the client's),
    checked here before anything is sent."""
    settings = {name: value for name, value in options.items() if name != "progress"}
    build(model, **settings)
    return settings


def _on_cluster(
    task: PartitionRun,
    listed: list[Any],
    client: Any,
    partition_size: int,
    journal: str | Path | None,
    *,
    strict: bool,
) -> ResultSet:
    """``strict``: the items must be JSON to be journaled (``batch.identity_of``)."""
    if partition_size < 1:
        raise ValueError(f"partition_size must be at least 1, got {partition_size}")
    identity = {} if journal is None else identity_of(listed, strict=strict)
    done = _finished(Path(journal), identity) if journal is not None else {}
    store = None
    if journal is not None:
        store = open_journal(Path(journal), encode_result, identity)
    todo = partitions(
        ((index, item) for index, item in enumerate(listed) if index not in done), partition_size
    )
    started = time.monotonic()
    try:
        for _, results in Distributor(client, task).run(todo):
            for result in results:
                done[result.index] = result
                if store is not None:
                    store.add(result, None)
    finally:
        if store is not None:
            store.close()
    return ResultSet([done[index] for index in range(len(listed))], time.monotonic() - started)


def _finished(path: Path, identity: dict[str, str]) -> dict[int, Result]:
    """The Results a journal kept for these items (ValueError for a journal of other items)."""
    if not path.exists():
        return {}
    with resumed(path, identity, "items", "give another journal, or delete it") as reader:
        return {index: Result.from_dict(json.loads(record)) for index, record in reader.records()}
