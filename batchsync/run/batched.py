"""A run's rows sent through the provider's batch endpoint (``batch_api=``), put together as
``assembly`` puts a live run together: the session, the client, the ledger of submissions
(the journal's, or the batch's own in memory) and the ``batches.sender.BatchRun``, behind the
controller's ``Send``.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from pathlib import Path

from ..batches.client import Calls, Client, Clocks
from ..batches.lanes import LivePace
from ..batches.protocol import Endpoint
from ..batches.providers import endpoint_of
from ..batches.sender import BatchRun, Plan
from ..core.engine import Deliver, Earlier
from ..core.observe import Hooks, Observers
from ..core.redact import watching
from ..core.result import Result, how_many
from ..http.retries import parse_statuses
from ..http.spec import RequestSpec
from ..jobs.options import FetchOptions
from ..limits.gates import Gates
from ..limits.rates import parse_rate
from ..limits.spend import Ledger as SpendLedger
from ..store.journal import JournalMismatch, JournalReader, connect
from ..store.submissions import JournaledLedger, Ledger, Part, indexes_in
from .assembly import Ran, Stoppable, insecure_said_once, transport_for
from .controller import Send, adding_to
from .progress import Tally

log = logging.getLogger("batchsync")


@dataclass
class ThroughBatchApi:
    """``controller.Send`` for a run through the batch endpoint, with ``finish`` to delete
    the files at the provider once the Results are journaled. ``ledger``: the batch's own
    without a journal; ``again``: the items read again (to store failures with them)."""

    options: FetchOptions
    url: str
    request_of: Callable[[object], RequestSpec]
    _: KW_ONLY
    passing: int
    journal: Path | None
    ledger: Ledger | None = None
    cancel: bool = False
    again: Callable[[], Iterable[tuple[int, object]]] | None = None
    stored: Callable[[int], Result | None] = lambda index: None
    on_start: Callable[[Stoppable], None] = lambda run: None
    # What sends rows live, given the options of that pass (used with lanes="auto").
    live: Callable[[FetchOptions], Send] | None = None
    # One stop and deadline for the run and the clean-up after it (made as the run starts).
    _clocks: Clocks | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        assert self.options.batch_api is not None
        self._endpoint: Endpoint = endpoint_of(self.url, self.options.batch_api)
        # (lanes="auto": the rows the deadline moves go live, read again)
        lanes = self.options.lanes
        self._going_live = lanes == "auto" and self.live is not None and self.again is not None

    def __call__(
        self,
        items: Iterable[tuple[int, object]],
        deliver: Deliver,
        *,
        progress: Tally,
        gates: Gates | None = None,
        earlier: Earlier | None = None,
    ) -> Ran:
        """Send the rows (of a live run's gates only the spend cap is theirs: the provider
        paces them); with lanes="auto", then those the deadline moved to the live lane, through
        ``live`` under every gate, in what is left of the deadline (``earlier``: each row's
        Result of an earlier pass, for the live lane's breaker)."""
        spending = None if gates is None else gates.spend_ledger
        assert spending is None or isinstance(spending, SpendLedger)  # (no Redis for batches)
        with self._running(progress, spending) as run:
            self.on_start(run)
            stopped = run.run(items, deliver, expected=progress.total or 0)
            moved, tried = run.moved, run.tries_of_moved()
        if stopped or not moved:
            return Ran(stopped, False, {}, 0)
        return self._live_pass(moved, adding_to(tried.get, deliver), gates, progress, earlier)

    def _live_pass(
        self,
        moved: list[int],
        deliver: Deliver,
        gates: Gates | None,
        progress: Tally,
        earlier: Earlier | None,
    ) -> Ran:
        """The rows ``moved`` sent live, read again, in what is left of the deadline (each
        Result counting what the batches tried of it)."""
        assert self.live is not None and self.again is not None and self._clocks is not None
        left = max(self._clocks.left() or 0.0, 0.001)
        log.warning("%d rows go live, in the %.1f s the deadline leaves", len(moved), left)
        send = self.live(self.options.model_copy(update={"batch_api": None, "deadline": left}))
        chosen = set(moved)
        rows = ((index, row) for index, row in self.again() if index in chosen)
        return send(rows, deliver, gates=gates, progress=progress, earlier=earlier)

    def finish(self) -> None:
        """Delete the collected parts' files at the provider (unless kept)."""
        with self._running(Tally()) as run:
            run.finish()

    @contextlib.contextmanager
    def _running(self, progress: Tally, spending: SpendLedger | None = None) -> Iterator[BatchRun]:
        options = self.options
        secrets = options.secrets()
        transport = transport_for(options, options.concurrency, secrets)
        ledger = self.ledger or Ledger()
        if self.journal is not None:
            ledger = JournaledLedger(self.journal, connect)
        calls = Calls(
            headers=dict(options.headers or {}),
            timeout=options.timeout,
            attempts=options.attempts,
            backoff=options.backoff,
            max_bytes=options.max_bytes,
            secrets=secrets,
            retryable=parse_statuses(options.retry_statuses),
            retry_if=options.retry_if,
        )
        if self._clocks is None:
            deadline = options.deadline
            self._clocks = Clocks(ends=None if deadline is None else time.monotonic() + deadline)
        client = Client(self._endpoint, transport, calls, self._clocks)
        observer = Observers([progress, Hooks(None, options.on_result)])
        run = BatchRun(
            Plan(
                self._endpoint,
                self.passing,
                max_rows=options.batch_rows,
                max_bytes=options.batch_bytes,
                poll=options.poll,
                budget=options.budget if "budget" in options.model_fields_set else None,
                keep_files=options.keep_files,
                cancel=self.cancel,
                expect=options.expect,
                prices=None if spending is None else options.prices,
                retries=options.batch_retries,
                live=live_pace(options) if self._going_live else None,
            ),
            client,
            ledger,
            self.request_of,
            secrets.given(self._endpoint.url, frozenset()),
            observer=observer,
            again=self.again,
            mask=secrets.text,
            spending=spending,
            stored=self.stored,
        )
        try:
            with insecure_said_once(options.verify is False), watching(secrets):
                yield run
        finally:
            ledger.close()
            transport.close()


def live_pace(options: FetchOptions) -> LivePace:
    """How fast the live lane may answer, by the run's live limits (``--live-latency``, or
    the timeout, the most one call may take)."""
    rate = options.rate
    per_second = None
    if rate is not None and rate != "auto":
        given = parse_rate(rate)
        per_second = given.count / given.period
    tokens = options.token_rate
    return LivePace(
        options.concurrency,
        options.live_latency or options.timeout,
        per_second,
        None if tokens is None else tokens.rate.count / tokens.rate.period,
    )


def open_batches(parts: Iterable[Part]) -> str | None:
    """What a live run on a journal would send twice: the rows of batches still open at the
    provider (or maybe made by a create that got no answer), in a few words; None when there
    are none."""
    still = [p for p in parts if p.open and (p.batch is not None or p.submitted is not None)]
    if not still:
        return None
    rows = sum(1 for part in still for _ in indexes_in(part.rows))
    held = f"{how_many(rows, 'row')} {'is' if rows == 1 else 'are'}"
    batches = how_many(len(still), "batch", "batches")
    return f"{held} in {batches} still open at {still[0].provider}"


def journal_parts(path: Path | None) -> list[Part]:
    """The submissions a journal holds (none without one)."""
    if path is None or not path.exists():
        return []
    try:
        reader = JournalReader(path)
    except JournalMismatch:  # (not a journal of ours: no submissions of ours either)
        return []
    with contextlib.closing(reader):
        return reader.parts()
