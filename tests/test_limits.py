"""The flow-control pieces on a fake clock, and the gates' order and refusals."""

from __future__ import annotations

import threading
import time

import pytest

from batchsync.core.budget import Allowance
from batchsync.core.stop import Stop
from batchsync.core.verdict import retry, success, terminal
from batchsync.http.classify import host_feedback
from batchsync.http.httpfacts import HttpFacts
from batchsync.limits.adaptive import AdaptiveLimit
from batchsync.limits.breaker import Breaker, BreakerGate, CircuitBreaker
from batchsync.limits.cooldown import _HOSTS_KEPT, CooldownGate, Cooldowns
from batchsync.limits.gates import Admission, Gates, Refusal
from batchsync.limits.quota import QuotaGate
from batchsync.limits.rates import Window, parse_rate
from batchsync.limits.shared import LimitsUnavailable
from batchsync.limits.slots import HostSlots, SlotGate
from batchsync.limits.window import LocalWindow, RateWindow

from .fakeclock import FakeClock


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_host_slots_count_per_host() -> None:
    slots = HostSlots(2)
    assert slots.enter("a", 0) and slots.enter("a", 0)
    assert not slots.enter("a", 0.01)
    assert slots.enter("b", 0)
    slots.leave("a")
    assert slots.enter("a", 0)


def test_a_freed_host_slot_wakes_a_waiter_at_once() -> None:
    slots = HostSlots(1)
    slots.enter("a", 0)
    threading.Timer(0.1, slots.leave, args=("a",)).start()
    started = time.monotonic()
    assert slots.enter("a", 5)
    assert time.monotonic() - started < 1


def test_cooldowns_keep_the_latest_end_and_expire() -> None:
    clock = Clock()
    board = Cooldowns(clock)
    assert board.remaining("h") == 0.0
    board.hold("h", 5)
    board.hold("h", 2)
    assert board.remaining("h") == 5.0
    assert board.remaining("other") == 0.0
    clock.now += 5
    assert board.remaining("h") == 0.0


def test_breaker_opens_on_the_failure_ratio_of_its_window_only() -> None:
    breaker = CircuitBreaker(Breaker(ratio=0.5, window=10, min_calls=5), clock=Clock())
    for _ in range(2):
        breaker.record("h", failed=True, probe=False)
    for _ in range(4):  # successes count against the ratio
        breaker.record("h", failed=False, probe=False)
    breaker.record("h", failed=True, probe=False)
    assert breaker.check("h")[0] == "closed"  # 3 of 7
    breaker.record("h", failed=True, probe=False)
    assert breaker.check("h")[0] == "open"  # 4 of 8: half
    assert breaker.check("other")[0] == "closed"
    assert breaker.opened == 1


def test_breaker_half_opens_for_one_probe_after_the_reset() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=10), clock=clock)
    breaker.record("h", failed=True, probe=False)
    clock.now += 9.9
    state, left = breaker.check("h")
    assert (state, left) == ("open", pytest.approx(0.1))  # type: ignore[comparison-overlap]
    clock.now += 0.1
    assert breaker.check("h") == ("probe", 0.0)
    assert breaker.check("h") == ("probing", 0.0)  # one probe at a time
    breaker.record("h", failed=True, probe=True)  # the probe failed: open again, for 10 s more
    clock.now += 5
    assert breaker.check("h") == ("open", 5.0)
    clock.now += 5
    assert breaker.check("h")[0] == "probe"
    breaker.record("h", failed=False, probe=True)
    assert breaker.check("h") == ("closed", 0.0)
    assert breaker.opened == 1


def test_an_abandoned_probe_lets_another_one_through() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=1), clock=clock)
    breaker.record("h", failed=True, probe=False)
    clock.now += 1
    assert breaker.check("h")[0] == "probe"
    breaker.abandon("h", probe=True)
    assert breaker.check("h")[0] == "probe"


@pytest.mark.parametrize(
    ("fields", "message"),
    [({"ratio": 0}, "ratio"), ({"min_calls": 0}, "min_calls"), ({"reset": 0}, "reset")],
)
def test_breaker_settings_are_checked(fields: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Breaker(**fields)  # type: ignore[arg-type]


def test_what_counts_for_the_breaker_and_for_congestion() -> None:
    assert host_feedback(retry("status", "HTTP 503", HttpFacts(503))).unwell is True
    assert host_feedback(retry("timeout", "timed out")).unwell is True
    assert (
        host_feedback(retry("status", "HTTP 429", HttpFacts(429))).unwell is True
    )  # overloaded, no end
    assert (
        host_feedback(retry("status", "HTTP 429", HttpFacts(429), retry_after=5)).unwell is None
    )  # cooldown
    assert host_feedback(terminal("status", "HTTP 404", HttpFacts(404))).unwell is not True
    assert host_feedback(success(None, HttpFacts(200))).unwell is not True
    assert host_feedback(retry("status", "HTTP 429", HttpFacts(429))).congested
    assert host_feedback(retry("status", "HTTP 503", HttpFacts(503))).congested
    assert host_feedback(retry("timeout", "timed out")).congested
    assert not host_feedback(retry("status", "HTTP 500", HttpFacts(500))).congested


def test_adaptive_limit_slow_starts_then_halves_once_per_round() -> None:
    clock = Clock()
    limit = AdaptiveLimit(ceiling=16, clock=clock)
    assert limit.limit == 1
    for _ in range(5):
        started = limit.enter(0)
        assert started is not None
        limit.leave(started, congested=False)
    assert limit.limit == 6
    sent = [limit.enter(0) for _ in range(6)]
    assert None not in sent
    assert limit.enter(0) is None  # full
    clock.now += 1
    for started in sent:  # all six were sent before the cut: only the first one counts
        assert started is not None
        limit.leave(started, congested=True)
    assert limit.limit == 3
    for _ in range(3):  # after slow start: +1 per round of `limit` successes
        started = limit.enter(0)
        assert started is not None
        limit.leave(started, congested=False)
    assert limit.limit == 4


def test_adaptive_limit_stays_between_one_and_the_ceiling() -> None:
    limit = AdaptiveLimit(ceiling=2, clock=Clock())
    for _ in range(10):
        started = limit.enter(0)
        assert started is not None
        limit.leave(started, congested=False)
    assert limit.limit == 2
    clock = Clock()
    low = AdaptiveLimit(ceiling=8, clock=clock)
    for _ in range(3):
        clock.now += 1
        started = low.enter(0)
        assert started is not None
        low.leave(started, congested=True)
    assert low.limit == 1


def admitted(
    gates: Gates, host: str = "h", budget: float = 10.0, clock: FakeClock | None = None
) -> Admission | str:
    now = time.monotonic() if clock is None else clock.now()
    return gates.admit(host, Allowance(now + budget), threading.Event())


def test_an_open_circuit_the_budget_cannot_cover_refuses_at_once() -> None:
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=60))
    breaker.record("h", failed=True, probe=False)
    gates = Gates([BreakerGate(breaker)])
    started = time.monotonic()
    assert admitted(gates) == "circuit_open"  # a 60-s break, 10 s of budget: no wait
    assert time.monotonic() - started < 0.1
    assert gates.circuit_refusals == 1
    assert isinstance(admitted(gates, host="other"), Admission)


def test_a_cooldown_longer_than_the_budget_gives_up_without_waiting() -> None:
    board = Cooldowns()
    board.hold("h", 60)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board)])
    started = time.monotonic()
    assert admitted(gates, budget=1.0) == "budget"
    assert time.monotonic() - started < 0.1
    assert isinstance(admitted(gates, host="elsewhere"), Admission)


def test_a_global_cooldown_holds_every_host() -> None:
    board = Cooldowns()
    gates = Gates([CooldownGate(board, "global"), QuotaGate(board)])
    admission = admitted(gates, host="a")
    assert isinstance(admission, Admission)
    gates.release(
        admission, host_feedback(retry("status", "HTTP 429", HttpFacts(429), retry_after=60))
    )
    assert admitted(gates, host="b", budget=1.0) == "budget"


def test_release_starts_a_cooldown_only_for_429_or_503_with_retry_after() -> None:
    board = Cooldowns()
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board)])
    for verdict in (
        retry("status", "HTTP 500", HttpFacts(500), retry_after=5),
        retry("status", "HTTP 429", HttpFacts(429)),
        success(None, HttpFacts(200)),
    ):
        admission = admitted(gates)
        assert isinstance(admission, Admission)
        gates.release(admission, host_feedback(verdict))
        assert board.remaining("h") == 0
    admission = admitted(gates)
    assert isinstance(admission, Admission)
    gates.release(
        admission, host_feedback(retry("status", "HTTP 503", HttpFacts(503), retry_after=5))
    )
    assert 4 < board.remaining("h") <= 5


def test_a_wait_hint_without_a_slow_down_status_is_the_items_alone() -> None:
    """``Retryable(retry_after=…)`` delays that item's next try; other items go on."""
    board = Cooldowns()
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board)])
    admission = admitted(gates)
    assert isinstance(admission, Admission)
    gates.release(admission, host_feedback(retry("exception", "Retryable: busy", None, 5)))
    assert board.remaining("h") == 0


def test_a_cooldown_that_begins_while_an_attempt_waits_for_its_token_holds_it() -> None:
    """Passing the cooldown gate and then waiting for a rate token must not let an attempt
    out during a cooldown that began meanwhile (a 429 answered to another worker)."""
    clock = FakeClock()
    board = Cooldowns(clock.now)
    gates = Gates(
        [
            CooldownGate(board, "host"),
            QuotaGate(board, clock.now),
            RateWindow(Window(4, 1)).kept_in(LocalWindow(clock.now)),
        ],
        clock=clock,
    )
    assert isinstance(admitted(gates, clock=clock), Admission)  # the next send is 0.25 s off
    held_at: list[float] = []

    def hold() -> None:  # (the attempt is past the cooldown gate, waiting for its token)
        held_at.append(clock.now())
        board.hold("h", 1.0)

    clock.at(0.05, hold)
    assert isinstance(admitted(gates, clock=clock), Admission)
    assert held_at and clock.now() - held_at[0] >= 0.95


def test_cooldown_off_ignores_retry_after() -> None:
    gates = Gates([QuotaGate(Cooldowns())])
    admission = admitted(gates)
    assert isinstance(admission, Admission)
    gates.release(
        admission, host_feedback(retry("status", "HTTP 429", HttpFacts(429), retry_after=60))
    )
    assert isinstance(admitted(gates, budget=1.0), Admission)


def test_a_rate_wait_past_the_budget_gives_up_at_once_and_says_why() -> None:
    clock = FakeClock()
    rate = RateWindow(Window.of(parse_rate(0.5)))
    gates = Gates([rate.kept_in(LocalWindow(clock.now))], clock=clock)
    first = admitted(gates, clock=clock)
    assert isinstance(first, Admission)
    gates.release(first, host_feedback(success(None, HttpFacts(200))))
    began = clock.now()
    refused = gates.enter("h", Allowance(clock.now() + 1.0), threading.Event())
    assert refused == Refusal(
        "budget", "the rate limit of 1 per 2 s has room again in 2.0 s, more than the budget left"
    )
    assert clock.now() == began  # (refused without waiting for what cannot come in time)
    clock.time += 2.0  # the refused attempt took nothing: the next one goes at once
    assert isinstance(admitted(gates, clock=clock), Admission)


def test_gates_record_time_spent_waiting() -> None:
    clock = FakeClock()
    gates = Gates([RateWindow(Window(10, 1)).kept_in(LocalWindow(clock.now))], clock=clock)
    for _ in range(3):
        admission = admitted(gates, clock=clock)
        assert isinstance(admission, Admission)
        gates.release(admission, host_feedback(success(None, HttpFacts(200))))
    # the first goes at once; the next two are paced 0.1 s apart
    assert gates.waits.seconds["rate"] == pytest.approx(0.2, abs=0.05)


def test_a_host_slot_is_held_during_the_attempt_and_given_back() -> None:
    slots = HostSlots(1)
    gates = Gates([SlotGate(slots)])
    first = admitted(gates)
    assert isinstance(first, Admission)
    assert admitted(gates, budget=0.2) == "budget"  # no slot came within the budget
    gates.release(first, host_feedback(success(None, HttpFacts(200))))
    assert isinstance(admitted(gates), Admission)


def test_a_stop_cancels_a_wait_at_the_gates() -> None:
    clock = FakeClock()
    board = Cooldowns(clock.now)
    board.hold("h", 30)
    stop = Stop()  # (the engine's: its set wakes every wait at once)
    clock.at(0.1, stop.set)
    gates = Gates([CooldownGate(board, "host"), QuotaGate(board, clock.now)], clock=clock)
    assert gates.admit("h", Allowance(clock.now() + 60), stop) == "cancelled"
    assert clock.now() - 1000.0 == pytest.approx(0.1)


def test_a_refused_probe_is_given_back() -> None:
    clock = Clock()
    breaker = CircuitBreaker(Breaker(min_calls=1, reset=1), clock=clock)
    breaker.record("h", failed=True, probe=False)
    clock.now += 1
    board = Cooldowns()
    board.hold("h", 60)
    gates = Gates([BreakerGate(breaker), CooldownGate(board, "host"), QuotaGate(board)])
    assert admitted(gates, budget=1) == "budget"
    assert breaker.check("h")[0] == "probe"


class FlakyWindow:
    """A shared window whose backend is down until ``up`` is set."""

    poll = 0.02

    def __init__(self) -> None:
        self.up = threading.Event()
        self.asked = 0

    def take(
        self, amount: float, window: Window, turn: threading.Event, longest: float
    ) -> tuple[object | None, float]:
        self.asked += 1
        if not self.up.is_set():
            raise LimitsUnavailable("Redis at redis://127.0.0.1:1/0: connection refused")
        return object(), 0.0

    def finish(self, entry: object, used: float | None, *, exact: bool = False) -> None:
        """Nothing to end."""

    def cancel(self, entry: object) -> None:
        """Nothing to give back."""

    def withdraw(self, turn: threading.Event) -> None:
        """No line."""

    def recheck(self) -> None:
        """No waiter to wake."""

    def queued(self) -> bool:
        return False


def test_a_backend_that_is_down_holds_attempts_until_it_answers() -> None:
    clock, bucket = FakeClock(), FlakyWindow()
    gates = Gates([RateWindow(Window(10, 1)).kept_in(bucket)], clock=clock)
    clock.at(0.8, bucket.up.set)
    started = clock.now()
    assert isinstance(admitted(gates, budget=10, clock=clock), Admission)
    assert 0.7 < clock.now() - started < 3
    assert bucket.asked >= 2


def test_a_backend_down_for_the_whole_budget_never_lets_the_attempt_through() -> None:
    clock, bucket = FakeClock(), FlakyWindow()
    started = clock.now()
    gates = Gates([RateWindow(Window(10, 1)).kept_in(bucket)], clock=clock)
    assert admitted(gates, budget=1.2, clock=clock) == "budget"
    assert clock.now() - started < 2


def test_a_stop_set_before_a_slot_wait_ends_it_at_once() -> None:
    """The stop's wake-up came before the wait began and was lost: the wait slept its round."""
    slots = HostSlots(1)
    assert slots.enter("a", 0)
    stop = threading.Event()
    stop.set()
    began = time.monotonic()
    assert not slots.enter("a", 5.0, stop)
    assert time.monotonic() - began < 1.0


REFUSED = retry("status", "HTTP 429", HttpFacts(429), retry_after=30)
ANSWERED = success(None, HttpFacts(200))


def sent_at(gate: CooldownGate, moment: float, verdict: object, host: str = "h") -> None:
    """An attempt sent at ``moment`` that came to ``verdict``, told to the cooldown."""
    admission = Admission(host, Allowance(1e9), threading.Event(), sent=moment)
    gate.release(admission, host_feedback(verdict))  # type: ignore[arg-type]


def test_an_answer_to_an_attempt_sent_after_the_refusal_ends_the_hold() -> None:
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    sent_at(gate, 10.0, REFUSED)
    assert board.remaining("h") > 29
    sent_at(gate, 9.0, ANSWERED)  # (sent before the refusal: no news)
    assert board.remaining("h") > 29
    sent_at(gate, 10.5, ANSWERED, host="other")  # (another host's answer: no news of this one)
    assert board.remaining("h") > 29
    sent_at(gate, 10.1, retry("status", "HTTP 503", HttpFacts(503)))  # (a refusal too)
    assert board.remaining("h") > 29
    sent_at(gate, 10.2, ANSWERED)  # the host served an attempt sent after it refused one
    assert board.remaining("h") == 0


def test_a_refusal_of_an_attempt_sent_before_an_answered_one_holds_nothing() -> None:
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    sent_at(gate, 10.2, ANSWERED)
    sent_at(gate, 10.0, REFUSED)  # (its answer came later, but it was sent before)
    assert board.remaining("h") == 0
    sent_at(gate, 10.3, REFUSED)  # a refusal after the last answer holds the host
    assert board.remaining("h") > 29


def test_a_host_that_refuses_every_caller_stays_held_and_a_global_hold_lasts() -> None:
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    for moment in (10.0, 10.1, 10.2):
        sent_at(gate, moment, REFUSED)
    assert board.remaining("h") > 29
    everyone = Cooldowns()
    wide = CooldownGate(everyone, "global")
    sent_at(wide, 10.0, REFUSED)
    sent_at(wide, 10.2, ANSWERED)
    assert everyone.remaining("*") > 29


def test_only_an_answer_ends_a_hold_not_a_lost_connection_or_a_cut_attempt() -> None:
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    sent_at(gate, 10.0, REFUSED)
    sent_at(gate, 10.1, retry("connection", "connection refused"))
    sent_at(gate, 10.2, terminal("budget", "cut short by the budget"))
    sent_at(gate, 10.3, retry("status", "HTTP 403", HttpFacts(403), retry_after=5))
    assert board.remaining("h") > 29


def test_a_hold_on_a_shared_board_is_never_lifted_here() -> None:
    shared = Cooldowns()
    board = type("Elsewhere", (), {"hold": shared.hold, "remaining": shared.remaining})()
    gate = CooldownGate(board, "host")
    sent_at(gate, 10.0, REFUSED)
    sent_at(gate, 10.2, ANSWERED)
    assert shared.remaining("h") > 29


def test_the_hosts_the_cooldown_remembers_are_bounded() -> None:
    gate = CooldownGate(Cooldowns(), "host")
    for n in range(10_000):
        sent_at(gate, float(n), ANSWERED, host=f"h{n}")
    assert len(gate._answered) <= 4096


def test_the_cooldown_keeps_the_refusals_of_a_bounded_number_of_hosts() -> None:
    """A run over many hosts that refuse and never answer again does not keep them all; a
    hold it forgot stays, and passes as it would have."""
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    for n in range(_HOSTS_KEPT + 10):
        sent_at(gate, 10.0, REFUSED, host=f"h{n}")
    assert len(gate._refused) <= _HOSTS_KEPT
    assert board.remaining("h0") > 0
    sent_at(gate, 11.0, ANSWERED, host="h0")
    assert board.remaining("h0") > 0


def test_an_answer_told_while_a_refusal_is_told_still_ends_its_hold() -> None:
    """An answer to an attempt sent after the refused one, told (by another thread) just after
    the refusal looked for such an answer and before it set the hold: the answer still ends
    the hold (on the code before, it looked for the refusal too early, and the host stayed
    held for the whole Retry-After)."""
    board = Cooldowns()
    gate = CooldownGate(board, "host")
    answering = threading.Thread(target=sent_at, args=(gate, 10.2, ANSWERED))

    class AnsweredMeanwhile(dict[str, float]):
        def get(self, host: str, default: float | None = None) -> float | None:  # type: ignore[override]
            seen = super().get(host, default)
            if answering.ident is None:  # (the first look: the refusal's)
                answering.start()
                answering.join(timeout=2.0)  # (it may wait for the refusal's lock)
            return seen

    gate._answered = AnsweredMeanwhile()
    sent_at(gate, 10.0, REFUSED)
    answering.join()
    assert board.remaining("h") == 0
