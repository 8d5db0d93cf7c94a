"""Batches too big for one machine, split across a Dask cluster (the optional ``dask`` extra).

The items are cut into partitions; each partition runs on a worker with the normal engine
(its own thread pool), and the limits are shared through Redis (``limits="redis://..."``) so
that the whole cluster keeps to one quota. A worker lost mid-partition has its partition run
again by Dask. On the client, each finished partition goes to the journal, so a restarted
client redoes only the partitions that had not finished.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, Unpack

from ..contrib.dask import Distributor, Partition, PartitionRun, profiler_off
from ..core.result import Result
from ..jobs.options import CallOptions, FetchOptions, FlowOptions, build
from ..jobs.settings import CallSettings, FetchSettings
from ..output.resultset import ResultSet
from ..store.resume import Items, Left
from .assembly import Stoppable, fetch, run_calls
from .batch import Item, encode_result, identity_of
from .controller import Journaled, Plan, RunController, Send
from .distribute import Wrap, distributed


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


def on_cluster(
    client: Any,
    task: PartitionRun,
    partition_size: int,
    on_start: Callable[[Stoppable], None] = lambda run: None,
) -> Send:
    """What sends a run's items to the cluster of ``client`` (``controller.Send``): each
    partition run there by ``task``; the limits are the workers' (the run's ``gates`` are
    left alone). A cluster's run keeps one pass, so its items have no earlier Results to
    hand on: each worker's breaker judges its hosts by what it sees."""
    profiler_off(client)
    return distributed(lambda gates, earlier: Distributor(client, task), partition_size, on_start)


def fetch_on_cluster(
    items: Iterable[Item],
    client: Any,
    *,
    partition_size: int = 1000,
    journal: str | Path | None = None,
    **options: Unpack[FetchSettings],
) -> ResultSet:
    """``batchsync.fetch_all`` on a Dask cluster: one Result per item, in input order.

    ``client`` is a ``distributed.Client``; ``options`` are those of ``fetch_all`` (give
    ``limits="redis://..."`` so that all workers share one quota), sent to the workers as
    they are: hooks and fallbacks run there. With ``journal=``, each
    finished partition is recorded, and a new call over the same items after a client
    restart runs only what is left, as ``Batch`` does: the items whose partitions had not
    finished, and the paginated ones that stopped partway, from their next page.
    """
    settings = _checked(FetchOptions, options)
    task = partial(run_partition, settings=settings)
    paging = build(FetchOptions, **settings).paging_identity()
    return _on_cluster(
        task, list(items), client, partition_size, journal, strict=False, paging=paging
    )


def run_on_cluster(
    fn: Callable[[Any], Any],
    items: Iterable[Any],
    client: Any,
    *,
    partition_size: int = 1000,
    journal: str | Path | None = None,
    **options: Unpack[CallSettings],
) -> ResultSet:
    """``batchsync.run_all`` on a Dask cluster: ``fn`` (pickled to the workers) called for
    every item, one Result per item, in input order; ``options`` and ``journal`` as for
    ``fetch_on_cluster`` (what ``fn`` returns must be JSON to be journaled, and the items
    JSON)."""
    task = partial(run_call_partition, fn=fn, settings=_checked(CallOptions, options))
    return _on_cluster(task, list(items), client, partition_size, journal, strict=True)


def _checked(model: type[FlowOptions], options: Mapping[str, object]) -> dict[str, Any]:
    """The library's options for the workers, as given, checked here before anything is
    sent."""
    settings = dict(options)
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
    paging: dict[str, str] | None = None,
) -> ResultSet:
    """``strict``: the items must be JSON to be journaled (``batch.identity_of``); ``paging``:
    how they are paginated, which a resumed journal must have been made with."""
    if partition_size < 1:
        raise ValueError(f"partition_size must be at least 1, got {partition_size}")
    journaled = None
    if journal is not None:
        identity = identity_of(listed, strict=strict) | (paging or {})
        journaled = Journaled(Path(journal), encode_result, identity)
    with RunController(journaled) as controller:
        kept = controller.kept(len(listed), Result.from_dict, "give another journal, or delete it")
        done = kept.done
        ended = controller.run(
            on_cluster(client, task, partition_size),
            enumerate(listed),
            _collector(done),
            plan=Plan(kept.passing, Left(kept.marks, Items(), done.get)),
            gates=None,
            progress=False,
        )
    return ResultSet([done[index] for index in range(len(listed))], ended.stint.elapsed)
