"""The circuit breaker as resilience4j and Polly define it: a failure ratio over a sliding
window with a minimum number of calls; an open circuit holds its host's items and lets one
probe through after the break. In-process on an injected clock, through the gates, against
the mock server, and shared through a real Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from batchsync import Breaker, fetch_all
from batchsync.core.budget import Allowance
from batchsync.core.verdict import retry, success, terminal
from batchsync.http.classify import host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.limits.breaker import BreakerGate, CircuitBreaker
from batchsync.limits.gates import Admission, Gates

from .mockserver import MockServerProcess
from .services import redis_server


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class ClockStop(threading.Event):
    """A stop event whose waits pass on the fake clock at once; ``during_wait`` runs on each."""

    def __init__(self, clock: Clock, during_wait: list[object] | None = None) -> None:
        super().__init__()
        self.clock = clock
        self.waited: list[float] = []
        self.during_wait = during_wait

    def wait(self, timeout: float | None = None) -> bool:
        assert timeout is not None
        self.clock.now += timeout
        self.waited.append(timeout)
        if self.during_wait:
            action = self.during_wait.pop(0)
            if callable(action):
                action()
        return self.is_set()


FAIL = retry("status", "HTTP 503", HttpFacts(503))
OK = success(None, HttpFacts(200))


def record(breaker: CircuitBreaker, *failures: bool) -> None:
    for failed in failures:
        breaker.record("h", failed=failed, probe=False)


# --- the in-process breaker on a fake clock ----------------------------------------------


def test_the_circuit_opens_at_the_ratio_only_after_the_minimum_calls() -> None:
    breaker = CircuitBreaker(Breaker(ratio=0.5, window=10, min_calls=6, reset=10), Clock())
    record(breaker, *[True] * 5)
    assert breaker.check("h") == ("closed", 0.0)  # 5 of 5 failed, but 6 calls are the minimum
    record(breaker, True)
    assert breaker.check("h") == ("open", 10.0)
    assert breaker.opened == 1

    below = CircuitBreaker(Breaker(ratio=0.5, window=10, min_calls=6, reset=10), Clock())
    record(below, False, False, False, False, True, True, True)
    assert below.check("h")[0] == "closed"  # 3 of 7 failed: under half
    record(below, True)
    assert below.check("h")[0] == "open"  # 4 of 8
    assert below.check("other") == ("closed", 0.0)


def test_only_the_last_window_of_calls_counts() -> None:
    breaker = CircuitBreaker(Breaker(ratio=0.5, window=4, min_calls=4, reset=10), Clock())
    record(breaker, *[False] * 6, True)
    assert breaker.check("h")[0] == "closed"  # 1 of the last 4
    record(breaker, True)
    assert breaker.check("h")[0] == "open"  # 2 of the last 4, though only 2 of all 8
    sliding = CircuitBreaker(Breaker(ratio=0.5, window=4, min_calls=4, reset=10), Clock())
    record(sliding, True, False, False, False, False, True)
    assert sliding.check("h")[0] == "closed"  # the first failure slid out: 1 of the last 4


def test_what_counts_for_the_breaker() -> None:
    unwell = [
        FAIL,
        retry("status", "HTTP 500", HttpFacts(500)),
        terminal("status", "HTTP 501", HttpFacts(501)),
        retry(
            "status", "HTTP 503", HttpFacts(503), retry_after=5
        ),  # a 5xx is a 5xx, Retry-After or not
        retry("status", "HTTP 429", HttpFacts(429)),  # a 429 without Retry-After: "I am overloaded"
        retry("timeout", "timed out"),
        retry("connection", "refused"),
    ]
    answered = [
        OK,
        terminal("status", "HTTP 404", HttpFacts(404)),
        terminal("invalid_body", "not JSON"),
    ]
    not_counted = [
        retry("status", "HTTP 429", HttpFacts(429), retry_after=30),  # the cooldown's business
        terminal("cancelled", "lost the race to a hedged request"),
        terminal("deadline", "cut short"),
    ]
    assert [host_feedback(v).unwell for v in unwell] == [True] * len(unwell)
    assert [host_feedback(v).unwell for v in answered] == [False] * len(answered)
    assert [host_feedback(v).unwell for v in not_counted] == [None] * len(not_counted)


def test_429s_with_retry_after_never_open_the_circuit() -> None:
    breaker = CircuitBreaker(Breaker(ratio=0.5, window=10, min_calls=2, reset=10), Clock())
    gates = Gates([BreakerGate(breaker)])
    for _ in range(30):
        admission = gates.admit("h", Allowance(time.monotonic() + 10), threading.Event())
        assert isinstance(admission, Admission)
        gates.release(
            admission, host_feedback(retry("status", "HTTP 429", HttpFacts(429), retry_after=1))
        )
    assert breaker.check("h")[0] == "closed"
    assert breaker.opened == 0


def test_after_the_break_one_probe_closes_or_reopens_the_circuit() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(ratio=0.5, window=10, min_calls=3, reset=10), clock)
    record(breaker, True, True, True)
    clock.now += 4
    assert breaker.check("h") == ("open", 6.0)  # held for what is left of the break
    clock.now += 6
    assert breaker.check("h") == ("probe", 0.0)
    assert breaker.check("h") == ("probing", 0.0)  # one probe at a time
    breaker.record("h", failed=False, probe=False)  # an attempt sent before it opened: ignored
    assert breaker.check("h") == ("probing", 0.0)
    breaker.record("h", failed=True, probe=True)  # the probe failed: another break
    assert breaker.check("h") == ("open", 10.0)
    clock.now += 10
    assert breaker.check("h")[0] == "probe"
    breaker.record("h", failed=False, probe=True)
    assert breaker.check("h") == ("closed", 0.0)
    # Closed with a fresh window that starts with the probe's success: the failures before
    # the break are forgotten.
    record(breaker, True)
    assert breaker.check("h")[0] == "closed"  # 1 of 2: under the minimum of 3
    record(breaker, True)
    assert breaker.check("h")[0] == "open"  # 2 of 3
    assert breaker.opened == 2


def test_a_probe_that_says_nothing_is_given_to_the_next_caller() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=1), clock)
    record(breaker, True)
    clock.now += 1
    assert breaker.check("h")[0] == "probe"
    breaker.abandon("h", probe=True)
    assert breaker.check("h")[0] == "probe"
    breaker.record("h", failed=None, probe=True)  # e.g. a 429 with Retry-After
    assert breaker.check("h")[0] == "probe"


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"ratio": 0}, "ratio"),
        ({"ratio": 1.5}, "ratio"),
        ({"window": 0}, "window"),
        ({"min_calls": 0}, "min_calls"),
        ({"window": 2.5}, "window"),
    ],
)
def test_breaker_settings_are_checked(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Breaker(**fields)  # type: ignore[arg-type]


def test_the_defaults_follow_resilience4j_and_polly() -> None:
    settings = Breaker()
    assert (settings.ratio, settings.window, settings.min_calls, settings.reset) == (
        0.5, 100, 20, 5.0,
    )  # fmt: skip
    assert Breaker(window=10).threshold_calls == 10  # min_calls above the window acts as it


# --- the gates: an open circuit holds, and gives up only when the budget can't cover it ---


def open_gates(reset: float = 30) -> tuple[Clock, CircuitBreaker, Gates]:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=reset), clock)
    record(breaker, True)
    return clock, breaker, Gates([BreakerGate(breaker)], clock=clock)


def test_a_held_item_ends_circuit_open_only_when_its_budget_cannot_cover_the_break() -> None:
    clock, _, gates = open_gates(reset=30)
    stop = ClockStop(clock)
    assert gates.admit("h", Allowance(clock.now + 20), stop) == "circuit_open"
    assert stop.waited == []  # gave up at once, without waiting
    assert gates.admit("h", Allowance(clock.now + 100, deadline_end=clock.now + 25), stop) == (
        "circuit_open"
    )  # the deadline cannot cover it either
    assert gates.circuit_refusals == 2
    probe = gates.admit("h", Allowance(clock.now + 60), stop)
    assert isinstance(probe, Admission) and probe.probe  # held for the break, then the probe
    assert stop.waited == [30]
    assert gates.waits.seconds["breaker"] == 30
    assert isinstance(gates.admit("other", Allowance(clock.now + 1), stop), Admission)


def test_held_items_wait_for_the_probe_and_resume_when_it_succeeds() -> None:
    clock, breaker, gates = open_gates(reset=30)
    clock.now += 30
    probe = gates.admit("h", Allowance(clock.now + 60), ClockStop(clock))
    assert isinstance(probe, Admission) and probe.probe
    # Another item polls while the probe is in flight; on its third round the probe succeeds.
    stop = ClockStop(clock, [None, None, lambda: gates.release(probe, host_feedback(OK))])
    held = gates.admit("h", Allowance(clock.now + 60), stop)
    assert isinstance(held, Admission) and not held.probe
    assert len(stop.waited) == 3 and max(stop.waited) <= 0.05
    assert breaker.check("h") == ("closed", 0.0)


def test_a_failed_probe_holds_the_items_for_another_break() -> None:
    clock, _, gates = open_gates(reset=30)
    clock.now += 30
    probe = gates.admit("h", Allowance(clock.now + 60), ClockStop(clock))
    assert isinstance(probe, Admission) and probe.probe
    # An item polls while the probe is in flight; on its first round the probe fails, and the
    # item's 20 s cannot cover another break of 30.
    stop = ClockStop(clock, [lambda: gates.release(probe, host_feedback(FAIL))])
    assert gates.admit("h", Allowance(clock.now + 20), stop) == "circuit_open"
    assert stop.waited == [0.05]
    # 40 s can: held for the break, then the next probe.
    stop = ClockStop(clock)
    patient = gates.admit("h", Allowance(clock.now + 40), stop)
    assert isinstance(patient, Admission) and patient.probe
    assert stop.waited == [pytest.approx(30)]


def test_an_item_held_behind_a_probe_gives_up_when_its_budget_runs_out() -> None:
    clock, _, gates = open_gates(reset=30)
    clock.now += 30
    assert isinstance(gates.admit("h", Allowance(clock.now + 60), ClockStop(clock)), Admission)
    stop = ClockStop(clock)
    assert gates.admit("h", Allowance(clock.now + 1), stop) == "circuit_open"
    assert sum(stop.waited) == pytest.approx(1)


def test_a_stop_ends_a_wait_for_the_breaker() -> None:
    clock, _, gates = open_gates(reset=30)
    stop = ClockStop(clock)
    stop.set()
    assert gates.admit("h", Allowance(clock.now + 60), stop) == "cancelled"


# --- against the mock server, default options ----------------------------------------------


@pytest.mark.integration
def test_failing_paths_do_not_fail_the_healthy_items_of_their_host(
    server: MockServerProcess,
) -> None:
    """The reported batch: 12 items on a path that always fails, then 20 healthy items of the
    same host. The failures open the circuit; it holds the host's items, probes, and closes
    when a healthy item's probe succeeds."""
    marker = uuid.uuid4().hex[:8]
    broken = [f"{server.url}/503/{marker}/{n}" for n in range(12)]
    healthy = [f"{server.url}/ok/{marker}-{n}" for n in range(20)]
    rs = fetch_all(broken + healthy)
    assert [r.error_kind for r in rs[12:]] == [None] * 20
    assert all(r.ok and r.attempts == 1 for r in rs[12:])
    assert {r.error_kind for r in rs[:12]} <= {"status", "circuit_open"}
    assert rs.summary().circuits_opened >= 1
    assert rs.summary().waits["breaker"] > 0  # held, not failed


@pytest.mark.integration
def test_a_host_that_is_really_down_stops_being_hit(server: MockServerProcess) -> None:
    """200 items of a host that answers only 503, with a budget that cannot outlast many
    breaks: after the minimum calls the host sees one probe per break, and items whose budget
    cannot cover the break end circuit_open without being sent."""
    marker = uuid.uuid4().hex[:8]
    rs = fetch_all([f"{server.url}/503/{marker}/{n}" for n in range(200)], budget=3)
    sent = len(server.log(marker))
    # min_calls (20) and the attempts in flight when it opened (concurrency 10), plus a
    # probe per 5-s break: far below the 600 that 200 items x 3 attempts would send.
    assert sent <= 20 + 10 + 10
    refused = [r for r in rs if r.error_kind == "circuit_open"]
    assert len(refused) >= 150
    assert {r.error_kind for r in rs} <= {"status", "budget", "circuit_open"}
    assert rs.summary().circuits_opened == 1
    assert rs.summary().waits.get("breaker", 0) > 0  # items that could cover a break waited


# --- shared through a real Redis ------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_url() -> Iterator[str]:
    with redis_server() as url:
        yield url


def two_processes(redis_url: str, settings: Breaker, lease_ttl: float = 10.0) -> list[Any]:
    """Two RedisBreakers on one namespace, as two processes would hold them."""
    from batchsync.contrib.redis import RedisLimits

    quota = uuid.uuid4().hex[:10]
    return [RedisLimits(redis_url, quota, lease_ttl=lease_ttl).breaker(settings) for _ in range(2)]


@pytest.mark.integration
def test_processes_share_one_window_break_and_probe(redis_url: str) -> None:
    first, second = two_processes(redis_url, Breaker(ratio=0.5, window=10, min_calls=6, reset=0.5))
    for failed in (False, False, False, True, None, None):  # two 429s with Retry-After
        first.record("h", failed, probe=False)
    second.record("h", True, probe=False)
    assert second.check("h")[0] == "closed"  # 2 of 5 counted: under the minimum of 6
    second.record("h", False, probe=False)
    first.record("h", True, probe=False)
    assert first.check("h")[0] == "closed"  # 3 of 7
    first.record("h", True, probe=False)  # 4 of 8, across both processes
    state, wait = second.check("h")
    assert state == "open" and 0.3 < wait <= 0.5
    assert (first.opened, second.opened) == (1, 0)
    assert first.check("other")[0] == "closed"
    time.sleep(wait + 0.05)
    assert second.check("h")[0] == "probe"
    assert first.check("h")[0] == "probing"  # one probe across the processes
    second.record("h", True, probe=True)  # failed: another break for everyone
    state, wait = first.check("h")
    assert state == "open" and 0.3 < wait <= 0.5
    time.sleep(wait + 0.05)
    assert first.check("h")[0] == "probe"
    first.record("h", False, probe=True)
    assert second.check("h")[0] == "closed"
    for _ in range(3):  # a fresh window: 3 failures of 4 calls are under the minimum
        second.record("h", True, probe=False)
    assert first.check("h")[0] == "closed"


@pytest.mark.integration
def test_the_probe_of_a_process_that_died_expires(redis_url: str) -> None:
    first, second = two_processes(redis_url, Breaker(min_calls=1, reset=0.2), lease_ttl=0.5)
    first.record("h", True, probe=False)
    time.sleep(0.25)
    assert first.check("h")[0] == "probe"
    assert second.check("h")[0] == "probing"
    time.sleep(0.6)  # the first process never answers: its probe token expires
    assert second.check("h")[0] == "probe"
    second.abandon("h", probe=True)
    assert first.check("h")[0] == "probe"


@pytest.mark.integration
def test_a_host_that_is_down_stops_being_hit_by_every_process(
    server: MockServerProcess, redis_url: str
) -> None:
    marker, quota = uuid.uuid4().hex[:8], uuid.uuid4().hex[:10]
    urls = [f"{server.url}/503/{marker}/{n}" for n in range(200)]
    results: list[Any] = []
    opened: list[int] = []
    held: list[float] = []

    def run(part: list[str]) -> None:
        rs = fetch_all(part, budget=3, limits=redis_url, namespace=quota)
        results.extend(rs)
        opened.append(rs.summary().circuits_opened)
        held.append(rs.summary().waits.get("breaker", 0.0))

    threads = [threading.Thread(target=run, args=(part,)) for part in (urls[:100], urls[100:])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 200
    assert sum(opened) == 1  # one shared circuit, opened once
    assert sum(held) > 0  # items that could cover the break waited for it
    # One shared window (min_calls 20) and two processes' attempts in flight, plus probes.
    assert len(server.log(marker)) <= 20 + 2 * 10 + 10
