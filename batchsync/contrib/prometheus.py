"""Prometheus metrics for a run (the optional ``metrics`` extra: prometheus-client).

Counters of attempts and results by outcome and error kind, retries, and seconds waited by
cause (backoff and each gate); a histogram of attempt latency; a gauge of items in flight.
The same registry can serve several runs: the counters keep adding up.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..core.observe import Observer
from ..core.result import AttemptRecord, Result
from ..limits.gates import Gates

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

    from ..core.task import Task

_BY_REGISTRY: weakref.WeakKeyDictionary[Any, Metrics] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
# The bounds (seconds) of the attempt latency histogram's buckets.
_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ImportError(
            "metrics need prometheus-client: pip install 'batchsync[metrics]'"
        ) from exc
    return prometheus_client


def metrics_for(registry: CollectorRegistry, gates: Gates | None) -> Metrics:
    """The Metrics of ``registry`` (made on first use), now also counting ``gates``' waits."""
    with _LOCK:
        metrics = _BY_REGISTRY.get(registry)
        if metrics is None:
            metrics = _BY_REGISTRY[registry] = Metrics(registry)
    metrics.watch(gates)
    return metrics


class Metrics(Observer):
    """Keeps a registry's batchsync metrics up to date as a run reports to it, and collects
    the seconds waited, by cause, when the registry is read."""

    def __init__(self, registry: CollectorRegistry) -> None:
        client = _client()
        self._attempts, self._results = (
            client.Counter(f"batchsync_{name}", f"{what}, by outcome and error kind",
                           ["outcome", "error_kind"], registry=registry)
            for name, what in (("attempts", "Attempts"), ("results", "Final results"))
        )  # fmt: skip
        self._retries = client.Counter("batchsync_retries", "Retries scheduled", registry=registry)
        self._latency = client.Histogram(
            "batchsync_attempt_seconds", "Time of one attempt", registry=registry, buckets=_BUCKETS
        )
        self._in_flight = client.Gauge(
            "batchsync_items_in_flight",
            "Items a worker has taken and not finished",
            registry=registry,
        )
        self._lock = threading.Lock()
        self._started: set[int] = set()
        self._waited: dict[str, float] = {}
        self._gates: Gates | None = None
        registry.register(self)

    def watch(self, gates: Gates | None) -> None:
        """Count the waits of a new run's gates, keeping what earlier runs waited."""
        with self._lock:
            if gates is not self._gates:
                self._waited = self._waits_locked()
                self._gates = gates

    def _waits_locked(self) -> dict[str, float]:
        totals = dict(self._waited)
        if self._gates is not None:
            for cause, seconds in self._gates.waits.seconds.items():
                totals[cause] = totals.get(cause, 0.0) + seconds
        return totals

    def waits(self) -> dict[str, float]:
        with self._lock:
            return self._waits_locked()

    def item_started(self, index: int, task: Task) -> None:
        with self._lock:
            self._started.add(index)
        self._in_flight.inc()

    def attempt_finished(self, index: int, task: Task, record: AttemptRecord) -> None:
        outcome = "ok" if record.error_kind is None else "failed"
        self._attempts.labels(outcome, record.error_kind or "").inc()
        self._latency.observe(record.elapsed)
        if record.wait is not None:
            self._retries.inc()
            with self._lock:
                self._waited["backoff"] = self._waited.get("backoff", 0.0) + record.wait

    def item_finished(self, result: Result) -> None:
        self._results.labels("ok" if result.ok else "failed", result.error_kind or "").inc()
        with self._lock:
            started = result.index in self._started
            self._started.discard(result.index)
        if started:
            self._in_flight.dec()

    def collect(self) -> Iterator[Metric]:
        """The seconds waited, by cause (the registry reads its collectors so)."""
        from prometheus_client.core import CounterMetricFamily

        family = CounterMetricFamily(
            "batchsync_wait_seconds", "Seconds waited, by cause", labels=["cause"]
        )
        for cause, seconds in sorted(self.waits().items()):
            family.add_metric([cause], seconds)
        yield family
