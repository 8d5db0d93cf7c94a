"""``batchsync.call`` and ``@batchsync.resilient``: one call, the same envelope as a batch's."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

import pytest

import batchsync
from batchsync import Backoff, Breaker, Limits, Result, Retryable, call, resilient

from .services import redis_server

QUICK = Backoff(base=0.01, max=0.02, jitter=0.0)


class Flaky:
    """Fails with ``errors`` in order, then returns what it was called with."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []
        self.lock = threading.Lock()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with self.lock:
            self.calls.append((args, kwargs))
            if self.errors:
                raise self.errors.pop(0)
        return {"args": list(args), "kwargs": kwargs}


def test_call_retries_and_returns_the_envelope() -> None:
    fn = Flaky(TimeoutError("slow"), ConnectionError("reset"))
    result = call(fn, 1, "two", attempts=3, backoff=QUICK, extra=True)
    assert isinstance(result, Result)
    assert (result.ok, result.attempts, result.error, result.fallback_used) == (True, 3, None, None)
    assert result.data == {"args": [1, "two"], "kwargs": {"extra": True}}
    assert [record.error_kind for record in result.attempt_log] == ["timeout", "connection", None]
    assert len(fn.calls) == 3


def test_call_never_raises_what_fn_raises() -> None:
    result = call(Flaky(ValueError("bad input")), attempts=3, backoff=QUICK)
    assert (result.ok, result.error_kind, result.attempts) == (False, "exception", 1)
    assert result.error == "ValueError: bad input"


def test_fallbacks_take_the_same_arguments_after_the_retries() -> None:
    primary = Flaky(*[TimeoutError("down")] * 2)
    result = call(primary, "q", attempts=2, backoff=QUICK, fallbacks=[lambda q: f"cached {q}"])
    assert (result.ok, result.data, result.fallback_used, result.attempts) == (
        True,
        "cached q",
        0,
        3,
    )


def test_the_idempotency_key_is_the_same_on_every_attempt() -> None:
    fn = Flaky(Retryable("again"))
    result = call(fn, attempts=2, backoff=QUICK, idempotency_key="order-17")
    assert result.ok
    assert [kwargs for _, kwargs in fn.calls] == [{"idempotency_key": "order-17"}] * 2


def test_a_wait_hint_beyond_the_budget_ends_the_call_as_budget() -> None:
    started = time.monotonic()
    result = call(Flaky(Retryable("later", retry_after=60)), budget=2.0, backoff=QUICK)
    assert (result.ok, result.error_kind, result.attempts) == (False, "budget", 1)
    assert time.monotonic() - started < 1.5


class TooManyRequests(Exception):
    """An SDK's 429: a status of its own and a wait."""

    status_code = 429
    retry_after = 1.0


def test_calls_sharing_limits_share_the_cooldown() -> None:
    """One call's 429 "come back in 1 s" holds the next call that shares its Limits."""
    shared = Limits()
    first = call(Flaky(TooManyRequests()), attempts=1, limits=shared)
    assert (first.error_kind, first.status_code) == ("status", 429)
    started = time.monotonic()
    assert call(lambda: "ok", limits=shared).ok
    assert time.monotonic() - started >= 0.9
    started = time.monotonic()
    assert call(lambda: "ok").ok  # no Limits: nothing shared
    assert time.monotonic() - started < 0.5


def test_the_decorator_shares_one_breaker_across_threads() -> None:
    calls = 0
    lock = threading.Lock()

    @resilient(attempts=1, breaker=Breaker(ratio=0.5, window=4, min_calls=4, reset=60), budget=1)
    def down(n: int) -> int:
        nonlocal calls
        with lock:
            calls += 1
        raise ConnectionError(f"refused {n}")

    results: list[Result] = []
    threads = [threading.Thread(target=lambda n=n: results.append(down(n))) for n in range(12)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 12 and not any(r.ok for r in results)
    assert calls <= 8  # the circuit opened after 4 failures; later calls were never made
    assert {r.error_kind for r in results} >= {"connection", "circuit_open"}
    assert down.__name__ == "down"


def test_the_decorated_function_checks_its_options_once() -> None:
    with pytest.raises(ValueError, match="attempts"):
        resilient(attempts=0)
    assert "call" in batchsync.__all__ and "resilient" in batchsync.__all__


def test_an_interrupt_during_a_probe_leaves_shared_limits_usable() -> None:
    """A Ctrl-C while a call is the circuit's one probe must give the probe back."""
    shared = Limits(breaker=Breaker(ratio=0.5, window=2, min_calls=2, reset=0.2))
    for _ in range(2):
        assert not call(Flaky(ConnectionError("down")), attempts=1, limits=shared).ok
    time.sleep(0.3)  # the break is over: the next call is the probe

    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        call(interrupted, limits=shared)
    started = time.monotonic()
    result = call(lambda: "ok", limits=shared, budget=5)
    assert result.ok, result.error
    assert time.monotonic() - started < 1


def test_the_redis_password_of_shared_limits_never_shows(tmp_path: Path) -> None:
    password = "R3d1sCanary-pw"
    with redis_server(password) as url:
        shared = Limits(limits=url)

        def leaky() -> None:
            raise ValueError(f"could not log in with {password}")

        result = call(leaky, limits=shared)
        decorated = resilient(limits=shared)(leaky)()
    assert password not in (result.error or "") and password not in repr(result)
    assert password not in (decorated.error or "")


def test_the_decorator_without_parentheses_and_what_it_refuses() -> None:
    @resilient
    def double(n: int) -> int:
        return 2 * n

    assert double(21).data == 42
    with pytest.raises(ValueError, match="to the Limits"):
        resilient(limits=Limits(), rate=5)

    async def later() -> None:
        return None

    with pytest.raises(ValueError, match="async"):
        call(later)
    with pytest.raises(ValueError, match="list of callables"):
        call(double, 1, fallbacks=double)  # type: ignore[arg-type]
