"""The summary's words explain themselves: every cause of a wait is documented, and no two of
its labels (causes, error kinds) are a letter apart."""

from __future__ import annotations

import json
import re
import time
from itertools import combinations
from pathlib import Path

from batchsync.core.kinds import KINDS
from batchsync.limits.adaptive import AdaptiveGate
from batchsync.limits.announced import _NAMES as ANNOUNCED_NAMES
from batchsync.limits.breaker import BreakerGate
from batchsync.limits.cooldown import CooldownGate
from batchsync.limits.gates import TURNED_OFF_BY
from batchsync.limits.quota import QuotaGate
from batchsync.limits.rates import Window
from batchsync.limits.slots import SlotGate
from batchsync.limits.spend import SpendGate
from batchsync.limits.tokenrate import _GATES as TOKEN_GATES
from batchsync.limits.window import LocalWindow, RateWindow
from batchsync.store.journal.reader import _by_gate

ROOT = Path(__file__).resolve().parent.parent


def wait_causes() -> set[str]:
    """Every name a wait is counted under: backoff and each gate's."""
    rate = RateWindow(Window(1, 1.0)).kept_in(LocalWindow(time.monotonic))
    held = {gate.name for gate in (AdaptiveGate, BreakerGate, CooldownGate, QuotaGate, SlotGate)}
    return {
        "backoff",
        rate.name,
        SpendGate.name,
        *held,
        *ANNOUNCED_NAMES.values(),
        *(name for name, _ in TOKEN_GATES.values()),
    }


def documented_causes() -> set[str]:
    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    section = page.split("## Reading the summary", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return {name for row in rows for name in re.findall(r"`([^`]+)`", row.split(" | ")[0])}


def test_every_cause_of_a_wait_is_documented() -> None:
    assert wait_causes() == documented_causes()


def test_every_gate_that_holds_says_what_turns_it_off() -> None:
    holding = {gate.name for gate in (AdaptiveGate, BreakerGate, CooldownGate, QuotaGate)}
    assert holding | {SlotGate.name, SpendGate.name} == set(TURNED_OFF_BY)


def one_letter_apart(a: str, b: str) -> bool:
    """One edit (a letter added, dropped or changed) turns ``a`` into ``b``."""
    if abs(len(a) - len(b)) > 1 or a == b:
        return False
    shorter, longer = sorted((a, b), key=len)
    if len(shorter) == len(longer):
        return sum(x != y for x, y in zip(a, b, strict=True)) == 1
    return any(longer[:n] + longer[n + 1 :] == shorter for n in range(len(longer)))


def test_no_two_labels_are_a_letter_apart() -> None:
    labels = wait_causes() | set(KINDS)
    close = [(a, b) for a, b in combinations(sorted(labels), 2) if one_letter_apart(a, b)]
    assert close == []
    assert one_letter_apart("token", "tokens")  # (what the request rate was once called)


def test_a_journal_of_the_old_names_reads_under_the_new() -> None:
    assert _by_gate(json.dumps({"token": 1.5, "rate": 0.5, "cooldown": 2.0})) == {
        "rate": 2.0,
        "cooldown": 2.0,
    }
