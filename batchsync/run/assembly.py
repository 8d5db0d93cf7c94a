"""The one place an engine run is put together: job, gates, observers and engine.

The library (``fetch_all``, ``Batch``, ``run_all``), the command line and Dask partitions all
run through ``fetch`` or ``run_calls``; they differ only in where the Results go. What goes
around a run (its journal, pass, progress and stint) is ``controller``'s.
"""

from __future__ import annotations

import contextlib
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol, cast

from urllib3.exceptions import InsecureRequestWarning

from .. import contrib
from ..core.clock import SYSTEM, Clock
from ..core.engine import Deliver, Earlier, Engine, Job
from ..core.observe import Observer
from ..core.redact import Secrets, watching
from ..core.result import Result
from ..http.guard import Guard
from ..http.transport import Transport
from ..jobs.calls import CallJob
from ..jobs.fetch import HttpJob
from ..jobs.options import CallOptions, Connection, FetchOptions, FlowOptions, Spend
from ..limits.adaptive import Adaptive
from ..limits.cooldown import Cooldown, Holds
from ..limits.gate import GateOption
from ..limits.gates import Gates
from ..limits.quota import QuotaReset
from ..limits.shared import SharedLimits
from ..limits.slots import PerHost
from ..limits.window import RateWindow


class Stoppable(Protocol):
    """What runs a batch, as a signal handler sees it (the engine, or a cluster's feeder)."""

    def stop(self) -> None: ...

    @property
    def stopped(self) -> bool: ...


@dataclass(frozen=True)
class Ran:
    """How a run's fetching ended: stopped early, attempts abandoned in flight, time waited at
    each gate and circuits opened."""

    stopped: bool
    abandoned: bool
    waits: dict[str, float]
    circuits_opened: int
    # Seconds waited at each gate by (gate, unix second), for the report.
    timeline: dict[tuple[str, int], float] = field(default_factory=dict)


def shared_limits(options: FlowOptions) -> SharedLimits | None:
    """The backend keeping limits shared by several processes; connecting checks it answers
    (ValueError when it does not)."""
    if options.limits is None or not isinstance(options.limits, str):
        return options.limits
    return contrib.shared_limits(options.limits, options.namespace, options.lease_ttl)


def gates_for(options: FlowOptions, clock: Clock = SYSTEM) -> Gates:
    """The limits a run's attempts pass, each built by the option that asks for it (kept by
    the shared backend when there is one): a new limit is its module and a line here."""
    holds = Holds()  # the cooldown and the quota's resets are kept on one board
    asked: list[GateOption | None] = [
        options.breaker,
        Adaptive() if options.adaptive else None,
        None if options.slots is None else PerHost(options.slots),
        None if options.cooldown == "off" else Cooldown(options.cooldown, holds),
        QuotaReset(holds),
        None if options.rate_window is None else RateWindow(options.rate_window),
        options.announced_rates,
        *options.token_rates,
        options.spend_cap if isinstance(options, Spend) else None,
    ]
    shared = shared_limits(options)
    built = (
        option.gate(concurrency=options.concurrency, shared=shared, clock=clock)
        for option in asked
        if option is not None
    )
    return Gates(built, clock=clock)


def observers_for(options: FlowOptions, gates: Gates, progress: Observer | None) -> list[Observer]:
    """Who watches a run: the progress counts, and metrics and traces when asked for."""
    from ..contrib.otel import Tracing, tracer_for  # (no import of OpenTelemetry without it)

    observers: list[Observer] = [] if progress is None else [progress]
    if options.metrics is not None:
        from ..contrib.prometheus import metrics_for

        observers.append(metrics_for(options.metrics, gates))
    tracer = tracer_for(options.tracer)
    if tracer is not None:
        observers.append(Tracing(tracer))
    return observers


def fetch(
    options: FetchOptions,
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    gates: Gates | None = None,
    progress: Observer | None = None,
    observed: bool = True,
    wrap: Callable[[HttpJob], Job] | None = None,
    on_start: Callable[[Stoppable], None] = lambda run: None,
    clock: Clock = SYSTEM,
    earlier: Earlier | None = None,
) -> Ran:
    """One HTTP run: transport, job, gates, observers and engine, set up and taken down
    together. ``gates`` carry limits across runs (a ``Batch``'s); ``observed=False`` leaves
    metrics and traces out (a Dask partition's: its client observes the run); ``wrap`` turns
    the HTTP job into the one the items need (the command line's input entries); ``on_start``
    sees the engine before it starts; ``clock`` measures every wait (a test's own);
    ``earlier``: an item's Result from an earlier pass (``Engine.run``)."""
    gates = gates_for(options, clock) if gates is None else gates
    # One Secrets for the transport and the job: the tokens auth= hands out join it as they come.
    secrets = options.secrets()
    transport = transport_for(options, options.concurrency, secrets)
    try:
        job = HttpJob(options, transport, gates, secrets=secrets)
    except BaseException:  # (auth='s first token could not be got)
        transport.close()
        raise
    try:
        with insecure_said_once(options.verify is False):
            return _run(
                options,
                job if wrap is None else wrap(job),
                items,
                deliver,
                gates=gates,
                progress=progress,
                observed=observed,
                secrets=job.secrets,
                abort=transport.abort,
                on_start=on_start,
                clock=clock,
                earlier=earlier,
            )
    finally:
        job.close()
        transport.close()


def transport_for(connection: Connection, pool_size: int, secrets: Secrets) -> Transport:
    """The run's one way out: every byte any lane sends goes through it (the guard, TLS
    options, proxies, cookies, the watchdog, secret headers kept to their origin)."""
    return Transport(
        connection.session,
        pool_size,
        secrets,
        guard=Guard() if connection.deny_private else None,
        verify=connection.verify,
        cert=connection.cert,
        cookies=connection.cookies,
    )


class _PerRequestWarnings:
    """urllib3's warning at each unverified request, silenced while runs with verify=False are
    under way (by the first to start, until the last ends): one filter of batchsync's own,
    matching only that warning's text, so the caller's filters stay as they are."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._runs = 0
        self._filter: Any = None

    def silence(self) -> None:
        with self._lock:
            self._runs += 1
            if self._runs == 1:
                warnings.filterwarnings(
                    "ignore", "Unverified HTTPS request", InsecureRequestWarning
                )
                self._filter = warnings.filters[0]

    def restore(self) -> None:
        with self._lock:
            self._runs -= 1
            # ("ignore" leaves nothing in the warning registries: removing it is enough)
            if self._runs == 0 and self._filter in warnings.filters:
                cast("list[Any]", warnings.filters).remove(self._filter)


_PER_REQUEST = _PerRequestWarnings()


@contextlib.contextmanager
def insecure_said_once(insecure: bool) -> Iterator[None]:
    """For a run with verify=False: one InsecureRequestWarning, instead of urllib3's at each
    request (thousands of the same line say no more than one)."""
    if not insecure:
        yield
        return
    warnings.warn(
        "verify=False: TLS certificates are not checked in this run (said once, not for each "
        "request)",
        InsecureRequestWarning,
        stacklevel=4,
    )
    _PER_REQUEST.silence()
    try:
        yield
    finally:
        _PER_REQUEST.restore()


def run_calls(
    options: CallOptions,
    fn: Callable[[Any], Any],
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    gates: Gates | None = None,
    progress: Observer | None = None,
    observed: bool = True,
    on_start: Callable[[Stoppable], None] = lambda run: None,
    clock: Clock = SYSTEM,
    earlier: Earlier | None = None,
) -> Ran:
    """One run of calls of ``fn`` (``calls.CallJob``): the same gates, observers and engine as
    an HTTP run (``observed``, ``on_start``, ``clock`` as for ``fetch``)."""
    gates = gates_for(options, clock) if gates is None else gates
    secrets = options.secrets()
    job = CallJob(fn, options, secrets, gates)
    try:
        return _run(
            options,
            job,
            items,
            deliver,
            gates=gates,
            progress=progress,
            observed=observed,
            secrets=secrets,
            abort=None,
            on_start=on_start,
            clock=clock,
            earlier=earlier,
        )
    finally:
        job.close()


def call_once(
    options: CallOptions,
    fn: Callable[[Any], Any],
    item: object,
    *,
    gates: Gates | None,
    secrets: Secrets,
) -> Result:
    """One call of ``fn`` carried to its Result in the calling thread, through ``gates``
    shared with other calls (none: no limits), masking ``secrets``."""
    job = CallJob(fn, options, secrets, gates)
    try:
        with watching(secrets):
            return Engine(options, gates=gates).run_one(job, item)
    finally:
        job.close()


def _run(
    options: FlowOptions,
    job: Job,
    items: Iterable[tuple[int, object]],
    deliver: Deliver,
    *,
    gates: Gates,
    progress: Observer | None,
    observed: bool,
    secrets: Secrets,
    abort: Callable[[], None] | None,
    on_start: Callable[[Stoppable], None],
    clock: Clock,
    earlier: Earlier | None,
) -> Ran:
    observers = observers_for(options, gates, progress) if observed else []
    engine = Engine(options, gates=gates, observers=observers, abort=abort, clock=clock)
    on_start(engine)
    with watching(secrets):
        finished = engine.run(job, items, deliver, earlier=earlier)
    return Ran(
        engine.stopped,
        not finished,
        gates.waits.seconds,
        gates.circuits_opened,
        gates.waits.timeline,
    )
