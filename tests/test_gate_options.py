"""A run's options become its gates in one place (``gates_for``): each limit asked for is a
``GateOption`` that builds its gate, in this process or on a shared backend."""

from __future__ import annotations

from batchsync.jobs.options import CallOptions, FetchOptions, build
from batchsync.limits.breaker import Breaker, CircuitBreaker
from batchsync.limits.cooldown import CooldownGate, Cooldowns
from batchsync.limits.quota import QuotaGate
from batchsync.limits.shared import BreakerSettings
from batchsync.limits.slots import HostSlots
from batchsync.limits.window import LocalWindow
from batchsync.run.assembly import gates_for


def test_every_limit_asked_for_is_a_gate_in_rank_order() -> None:
    options = build(FetchOptions, rate="10/s", per_host=4, adaptive=True, token_rate="1000/min")
    gates = gates_for(options).gates
    assert [(gate.name, gate.rank) for gate in gates] == [
        ("breaker", 10), ("adaptive", 20), ("host_slot", 30), ("cooldown", 40),
        ("quota", 50), ("rate", 60), ("tokens", 65),
    ]  # fmt: skip


def test_the_defaults_and_auto() -> None:
    assert [gate.name for gate in gates_for(build(FetchOptions)).gates] == [
        "breaker", "cooldown", "quota",
    ]  # fmt: skip
    auto = gates_for(build(CallOptions, rate="auto", cooldown="off")).gates
    assert [gate.name for gate in auto] == ["quota", "announced"]


def test_the_cooldown_and_the_quota_reset_keep_one_board() -> None:
    gates = gates_for(build(FetchOptions, cooldown="global")).gates
    cooldown = next(gate for gate in gates if isinstance(gate, CooldownGate))
    quota = next(gate for gate in gates if isinstance(gate, QuotaGate))
    assert isinstance(cooldown.board, Cooldowns) and cooldown.board is quota.board


class Backend:
    """A shared backend that keeps everything in this process, counting what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    def window(self, name: str) -> LocalWindow:
        self.asked.append(f"window {name}")
        return LocalWindow(lambda: 0.0)

    def slots(self, limit: int) -> HostSlots:
        self.asked.append(f"slots {limit}")
        return HostSlots(limit)

    def cooldowns(self) -> Cooldowns:
        self.asked.append("cooldowns")
        return Cooldowns()

    def breaker(self, settings: BreakerSettings) -> CircuitBreaker:
        self.asked.append("breaker")
        assert isinstance(settings, Breaker)
        return CircuitBreaker(settings)


def test_a_shared_backend_keeps_each_limit_but_the_adaptive_one() -> None:
    backend = Backend()
    options = build(
        FetchOptions, rate="10/s", per_host=2, adaptive=True, token_rate="1000/min",
        limits=backend,
    )  # fmt: skip
    assert len(gates_for(options).gates) == 7
    assert sorted(backend.asked) == [
        "breaker", "cooldowns", "slots 2", "window rate", "window tokens",
    ]  # fmt: skip
