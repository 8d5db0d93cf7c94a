"""``Batch``: a fetch that can be interrupted and continued, for notebooks and long scripts."""

from __future__ import annotations

import contextlib
import hashlib
import json
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from .assembly import fetch, gates_for, open_journal
from .backoff import Backoff
from .hedge import HedgeAfter
from .journal import locked, resumed
from .limits import Breaker, CooldownScope
from .observe import log_summary
from .options import DEFAULT, Expect, FetchOptions, build
from .progress import counter, wanted
from .records import dumps, public_record
from .result import AttemptRecord, Result, ResultSet, Summary
from .spec import RequestSpec
from .transport import Cert, SessionSource, Verify

Item = str | Mapping[str, Any] | RequestSpec


def identity_of(items: Iterable[Item]) -> dict[str, str]:
    """The identity a journal records for a list of items: their count and a SHA-256."""
    digest = hashlib.sha256()
    count = 0
    for item in items:
        value = item.to_item() if isinstance(item, RequestSpec) else item
        digest.update(json.dumps(value, sort_keys=True, default=repr).encode())
        digest.update(b"\n")
        count += 1
    return {"entries": str(count), "sha256": digest.hexdigest()}


def _check_ids(items: list[Item]) -> None:
    """ValueError naming the first item whose ``id`` a journal cannot store as JSON."""
    for index, item in enumerate(items):
        # The id as given (item_label reports a NaN one as None).
        if isinstance(item, RequestSpec):
            item_id = item.id
        elif isinstance(item, Mapping):
            item_id = item.get("id")
        else:
            continue
        try:
            json.dumps(item_id, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise ValueError(
                f"item {index}: its id {item_id!r} cannot be stored in the journal ({exc})"
            ) from None


def encode_result(result: Result, item: object) -> tuple[str, str | None]:
    """The journal's stored text for a library Result (there is no failed file to feed)."""
    return dumps(public_record(result)), None


class Batch:
    """Fetch ``items`` in one or more ``run()`` calls; every finished Result is kept.

    A KeyboardInterrupt (a notebook's interrupt button) during ``run()`` stops taking new
    items, gives requests in flight a short grace, keeps every finished Result in
    ``results`` and raises; ``run()`` again fetches only the rest. With ``journal=`` each
    final Result is also written to that SQLite file as it is made, so a new ``Batch`` over
    the same items (after a crash, or in a new session) continues where the last one stopped.
    A journal that another run is using, or items whose ``id`` JSON cannot store, are a
    ``ValueError`` before anything is sent.
    """

    def __init__(
        self,
        items: Iterable[Item],
        *,
        journal: str | Path | None = None,
        progress: bool | None = None,
        concurrency: int = DEFAULT.concurrency,
        attempts: int = DEFAULT.attempts,
        timeout: float = DEFAULT.timeout,
        budget: float = DEFAULT.budget,
        deadline: float | None = DEFAULT.deadline,
        expect: Expect = DEFAULT.expect,
        headers: Mapping[str, str] | None = DEFAULT.headers,
        session: SessionSource | None = DEFAULT.session,
        verify: Verify | None = DEFAULT.verify,
        cert: Cert | None = DEFAULT.cert,
        max_bytes: int = DEFAULT.max_bytes,
        backoff: Backoff = DEFAULT.backoff,
        rate: float | None = DEFAULT.rate,
        per_host: int | None = DEFAULT.per_host,
        cooldown: CooldownScope = DEFAULT.cooldown,
        breaker: Breaker | None = DEFAULT.breaker,
        adaptive: bool = DEFAULT.adaptive,
        fallbacks: tuple[Callable[[RequestSpec, Result | None], Any], ...] = DEFAULT.fallbacks,
        dedup: bool = DEFAULT.dedup,
        hedge_after: HedgeAfter | None = DEFAULT.hedge_after,
        on_attempt: Callable[[RequestSpec, AttemptRecord], None] | None = DEFAULT.on_attempt,
        on_result: Callable[[Result], None] | None = DEFAULT.on_result,
        secret_headers: tuple[str, ...] = DEFAULT.secret_headers,
        secret_params: tuple[str, ...] = DEFAULT.secret_params,
        cookies: bool = DEFAULT.cookies,
        deny_private: bool = DEFAULT.deny_private,
        metrics: Any = DEFAULT.metrics,
        tracer: Any = DEFAULT.tracer,
        limits: Any = DEFAULT.limits,
        namespace: str = DEFAULT.namespace,
        lease_ttl: float = DEFAULT.lease_ttl,
    ) -> None:
        given = locals()
        self.items: list[Item] = list(items)
        self._progress = progress
        self.options = build(
            FetchOptions, **{name: given[name] for name in FetchOptions.model_fields}
        )
        self._done: dict[int, Result] = {}
        self.elapsed = 0.0
        self._gates = gates_for(self.options)
        self.journal = None if journal is None else Path(journal)
        self._identity = {} if journal is None else identity_of(self.items)
        if self.journal is not None:
            _check_ids(self.items)
            with locked(self.journal):
                if self.journal.exists():
                    self._load(self.journal)

    def _load(self, path: Path) -> None:
        with resumed(path, self._identity, "items", "give another journal, or delete it") as reader:
            for index, record in reader.records():
                self._done[index] = self._restore(index, json.loads(record))

    def _restore(self, index: int, record: dict[str, Any]) -> Result:
        """A journaled Result as this session would have made it: its data as given."""
        result = Result.from_dict(record)
        expect = self.options.expect
        data = result.data
        if result.ok and isinstance(expect, type) and issubclass(expect, BaseModel):
            data = expect.model_validate(data)
        return replace(result, data=data)

    @property
    def results(self) -> ResultSet:
        """The finished Results in input order (all of them once ``pending`` is 0)."""
        return ResultSet(
            [self._done[i] for i in sorted(self._done)],
            elapsed=self.elapsed,
            waits=self._gates.waits.seconds,
            circuits_opened=self._gates.circuits_opened,
        )

    def _summary(self) -> Summary:
        return self.results.summary()

    @property
    def pending(self) -> int:
        """How many items have no final Result yet."""
        return len(self.items) - len(self._done)

    def run(self) -> ResultSet:
        """Fetch every item without a final Result; returns ``results``."""
        todo = ((i, item) for i, item in enumerate(self.items) if i not in self._done)
        with contextlib.ExitStack() as held:
            journal = None
            if self.journal is not None:
                held.enter_context(locked(self.journal))  # JournalInUse: another run has it
                journal = open_journal(self.journal, encode_result, self._identity)
                held.callback(journal.close)
            started = time.monotonic()
            try:
                with counter(self.pending, wanted(self._progress)) as bar:
                    fetch(
                        self.options, todo, self._keep, gates=self._gates, progress=bar,
                        journal=journal,
                    )  # fmt: skip
            finally:
                self.elapsed += time.monotonic() - started
                log_summary(self._summary)
        return self.results

    def _keep(self, result: Result, item: object) -> None:
        if result.final:
            self._done[result.index] = result
