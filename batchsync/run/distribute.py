"""Sending a run's items through something that runs partitions of them elsewhere (a Dask
cluster, this machine's worker processes) and gives back their Results, delivered here, so that
journal, progress and outputs are those of a run sent from here."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from itertools import islice
from typing import TYPE_CHECKING, Any, Protocol

from ..core.engine import Deliver, Earlier, Job
from ..core.result import Result
from ..jobs.fetch import HttpJob
from ..limits.gates import Gates
from .assembly import Ran, Stoppable
from .controller import Send
from .progress import Tally

if TYPE_CHECKING:
    from ..contrib.dask import Partition

# What turns the HTTP job into the one a partition's items need (see ``run_partition``).
Wrap = Callable[[HttpJob], Job]


def partitions(pairs: Iterable[tuple[int, Any]], size: int) -> Iterator[Partition]:
    """The (index, item) pairs cut into lists of at most ``size``, read lazily."""
    source = iter(pairs)
    while chunk := list(islice(source, size)):
        yield chunk


class Distributing(Protocol):
    """What runs partitions elsewhere and yields each one's Results as it finishes: a Dask
    cluster (``contrib.dask.Distributor``) or this machine's worker processes
    (``processes.Workers``); ``stop()`` ends it early."""

    def stop(self) -> None: ...

    @property
    def stopped(self) -> bool: ...

    @property
    def abandoned(self) -> bool: ...

    def run(self, work: Iterable[Partition]) -> Iterator[tuple[Partition, list[Result]]]: ...


def distributed(
    start: Callable[[Gates | None, Earlier | None], Distributing],
    partition_size: int,
    on_start: Callable[[Stoppable], None] = lambda run: None,
) -> Send:
    """What sends a run's items through a ``Distributing`` (``controller.Send``), made by
    ``start`` for the run's ``gates`` (which it may add its waits to) and the items' ``earlier``
    Results (which it may hand on with them: see ``Engine.run``): a partition of at most
    ``partition_size`` at a time, each one's Results counted and delivered here with their
    items as they come back, so that journal, progress and outputs are those of any run.
    ``on_start`` sees what runs it, to stop it on a signal."""

    def send(
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        *,
        gates: Gates | None,
        progress: Tally,
        earlier: Earlier | None = None,
    ) -> Ran:
        distributor = start(gates, earlier)
        on_start(distributor)
        for partition, results in distributor.run(partitions(items, partition_size)):
            sent = dict(partition)
            for result in results:
                progress.item_finished(result)
                deliver(result, sent[result.index])
        return Ran(distributor.stopped, distributor.abandoned, {}, 0)

    return send
