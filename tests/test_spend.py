"""The spend cap's arithmetic (issue 43): the user's price table, each request's worst case,
what an answer's usage says it cost, and the ledger that keeps spent plus reserved under the
cap, on their own, without a network."""

from __future__ import annotations

import json
import random
import re
import threading
from decimal import Decimal
from fractions import Fraction
from pathlib import Path

import pytest

from batchsync.core.admission import PICO, Admission
from batchsync.core.budget import Allowance
from batchsync.core.clock import SYSTEM
from batchsync.limits.gate import Waiting
from batchsync.limits.spend import Ledger, Prices, SpendGate, Unpriced, charge, dollars, priced
from batchsync.limits.tokens import usage_parts


def worst_case(body: object, prices: Prices, *, batch: bool = False) -> int:
    return priced(body, prices, batch=batch).worst


def spent_by(answer: object, body: object, prices: Prices) -> int:
    return priced(body, prices).spent(usage_parts(answer, cached=True))


TABLE = {"models": {"gpt-mock": {"input": "2.5", "output": "10"}}, "batch": "0.5"}
PRICES = Prices.of(TABLE)


def chat(text: object, **more: object) -> dict[str, object]:
    return {"model": "gpt-mock", "messages": [{"role": "user", "content": text}], **more}


def test_a_price_file_is_read_exactly(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text('{"models": {"m": {"input": 0.15, "output": 0.6}}, "batch": 0.5}')
    prices = Prices.of(path)
    assert prices.models["m"].input == Decimal("0.15")  # (not the float nearest to it)
    assert prices.per_million("m", batch=True) == (Fraction(75 * 10**9), Fraction(300 * 10**9))


@pytest.mark.parametrize(
    ("table", "said"),
    [
        ({"models": {"m": {"input": -1, "output": 1}}}, "models.m.input"),
        ({"models": {"m": {"input": 1}}}, "models.m.output"),
        ({"models": {}, "batch": 2}, "batch"),
        ({"models": {"m": {"input": 1, "output": 1, "cached": 1}}}, "models.m.cached"),
        ({"model": {}}, "models"),
    ],
)
def test_a_bad_price_table_is_one_line_naming_the_field(table: object, said: str) -> None:
    with pytest.raises(ValueError, match=f"^{said}: ") as raised:
        Prices.of(table)
    assert "\n" not in str(raised.value)


def test_an_unreadable_price_file_is_one_line(tmp_path: Path) -> None:
    path = tmp_path / "prices.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"^cannot read ") as raised:
        Prices.of(path)
    assert "\n" not in str(raised.value)
    with pytest.raises(ValueError, match=r"^cannot read "):
        Prices.of(tmp_path / "missing.json")


@pytest.mark.parametrize("cap", ["-1", "nan", "inf", "ten"])
def test_a_cap_is_a_finite_amount_of_dollars(cap: str) -> None:
    with pytest.raises(ValueError, match=r"^max_cost must be an amount of dollars"):
        dollars(cap)


def test_a_cap_in_dollars_is_exact_pico_dollars() -> None:
    assert dollars("0.1") == PICO // 10
    assert dollars(0.1) == PICO // 10  # (a float as it prints, not its binary value)


def test_the_worst_case_counts_each_byte_sent_and_the_whole_allowance() -> None:
    body = chat("héllo", max_tokens=100, n=2)
    sent = len(json.dumps(body, ensure_ascii=False).encode())
    inputs = sent + 4 + 2  # (a message's framing and the reply's priming)
    assert (
        worst_case(body, PRICES)
        == charge(inputs, PRICES.per_million("gpt-mock", batch=False)[0]) + 200 * 10 * PICO // 10**6
    )
    assert worst_case(body, PRICES, batch=True) * 2 == pytest.approx(
        worst_case(body, PRICES), abs=2
    )


def test_a_worst_case_bounds_any_tokenizer_that_makes_a_token_of_a_byte_at_least() -> None:
    """Whatever the text (emoji, CJK, a lone surrogate), the bound holds the prompt's bytes."""
    for text in ("a" * 1000, "東京" * 300, "🙂" * 250, "\ud800x"):
        body = chat(text, max_tokens=1)
        input_price = PRICES.per_million("gpt-mock", batch=False)[0]
        assert worst_case(body, PRICES) >= charge(
            len(text.encode("utf-8", "surrogatepass")), input_price
        )


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (chat("x"), "no max_tokens"),
        (chat("x", max_tokens=5, model="gpt-other"), "no price for model 'gpt-other'"),
        ({"messages": [], "max_tokens": 5}, "no price for model None"),
        (
            chat(
                [{"type": "image_url", "image_url": {"url": "http://127.0.0.1/a.png"}}],
                max_tokens=5,
            ),
            "images, audio, video, files",
        ),
        ("not a body", "only a JSON request body"),
        *(
            (chat("x", max_tokens=5, **more), "images, audio, video, files")
            for more in (
                {"previous_response_id": "resp_1"},
                {"prompt": {"id": "pmpt_1"}},
                {"conversation": "conv_1"},
                {"cached_content": "cachedContents/1"},
                {"modalities": ["text", "audio"]},
                {"tools": [{"type": "web_search"}]},
                {"tools": [{"type": "web_fetch_20250910", "name": "web_fetch"}]},
                {"messages": [{"role": "user", "content": [{"image_url": {"url": "x"}}]}]},
                {"messages": [{"role": "user", "content": [{"type": "video_url"}]}]},
            )
        ),
    ],
)
def test_a_request_without_a_bound_or_a_price_is_refused(body: object, why: str) -> None:
    with pytest.raises(Unpriced, match=re.escape(why)):
        worst_case(body, PRICES)


def test_the_batch_price_needs_the_tables_factor() -> None:
    prices = Prices.of({"models": TABLE["models"]})
    with pytest.raises(Unpriced, match="no batch factor"):
        worst_case(chat("x", max_tokens=5), prices, batch=True)


@pytest.mark.parametrize(
    ("usage", "pico"),
    [
        (
            {"prompt_tokens": 1000, "completion_tokens": 100, "total_tokens": 1100},
            2_500_000_000 + 1_000_000_000,
        ),
        ({"input_tokens": 1000, "output_tokens": 100}, 2_500_000_000 + 1_000_000_000),
        (
            {
                "input_tokens": 10,
                "cache_creation_input_tokens": 500,
                "cache_read_input_tokens": 490,
                "output_tokens": 100,
            },
            # (a cache write at the dearest rate it is billed at: twice the input price)
            (10 + 2 * 500 + 490) * 2_500_000 + 1_000_000_000,
        ),
        ({"total_tokens": 1000}, 10_000_000_000),  # (the dearer price: it may all be output)
        ({"completion_tokens": 100, "prompt_tokens": 1000}, 2_500_000_000 + 1_000_000_000),
    ],
)
def test_an_answers_usage_is_priced_by_side(usage: dict[str, int], pico: int) -> None:
    assert spent_by({"usage": usage}, chat("x", max_tokens=5), PRICES) == pico


@pytest.mark.parametrize(
    "usage",
    [
        {"completion_tokens": 100},
        {"prompt_tokens": "1000", "completion_tokens": 100},
        {"prompt_tokens": 1000.0, "completion_tokens": 100},
        {"prompt_tokens": -5, "completion_tokens": 100},
        {"prompt_tokens": 10**40, "completion_tokens": 100},
    ],
)
def test_a_side_the_usage_does_not_count_stands_at_its_worst_case(usage: dict[str, int]) -> None:
    body = chat("x" * 4000, max_tokens=5)
    price = priced(body, PRICES)
    assert (
        spent_by({"usage": usage}, body, PRICES)
        == charge(price.inputs, price.input) + 1_000_000_000
    )


@pytest.mark.parametrize("answer", [{}, {"usage": None}, {"usage": {"total_tokens": -1}}, "text"])
def test_an_answer_without_a_usable_usage_is_charged_the_worst_case(answer: object) -> None:
    body = chat("x", max_tokens=5)
    assert spent_by(answer, body, PRICES) == worst_case(body, PRICES)


def test_the_ledger_waits_on_what_is_reserved_and_refuses_on_what_is_spent() -> None:
    ledger = Ledger(100)
    assert ledger.reserve(60) is True
    assert ledger.reserve(50) is None  # (the 60 may come back)
    ledger.settle(True, 60, 10)
    assert ledger.reserve(50) is True
    ledger.settle(True, 50, 50)
    assert ledger.reserve(41) is False  # 60 spent: never
    assert ledger.reserve(40) is True


class Store:
    """A store as the journal's ``spend`` table keeps reservations."""

    def __init__(self, rows: list[list[int | None]]) -> None:
        self.rows = rows

    def total(self) -> int:
        return sum(spent if spent is not None else reserved or 0 for reserved, spent in self.rows)

    def reserve(self, amount: int) -> int:
        self.rows.append([amount, None])
        return len(self.rows)

    def settle(self, number: int, spent: int) -> bool:
        row = self.rows[number - 1]
        if row[1] is not None:
            return False
        row[1] = spent
        return True


def test_a_kept_ledger_counts_what_earlier_runs_spent_and_reserved() -> None:
    """A run killed with a reservation unsettled left it at its worst case: the next counts it."""
    store = Store([[30, 10], [40, None]])
    ledger = Ledger(100)
    ledger.keep(store)
    assert ledger.spent == 50
    number = ledger.reserve(50)
    assert number == 3 and store.rows[-1] == [50, None]  # (stored before it is granted)
    ledger.settle(number, 50, 20)
    assert store.rows[-1] == [50, 20] and ledger.spent == 70
    assert ledger.reserve(31) is False


def test_a_reservation_an_earlier_run_made_is_settled_once_by_a_later_one() -> None:
    """A batch endpoint's part reserved by one run and collected by the next: the next counts
    it at its worst case until it settles it, then at what it spent; settled again (a run
    killed between settling and saying so), nothing changes."""
    store = Store([[30, 10], [40, None]])
    ledger = Ledger(100)
    ledger.keep(store)
    assert (ledger.spent, ledger.reserved) == (50, 0)
    assert ledger.fits(50) and ledger.fits(51) is False
    ledger.settle(2, 40, 15)
    assert store.rows[1] == [40, 15] and (ledger.spent, ledger.reserved) == (25, 0)
    ledger.settle(2, 40, 15)
    assert store.rows[1] == [40, 15] and (ledger.spent, ledger.reserved) == (25, 0)


def test_a_ledger_kept_again_counts_its_open_reservations_once() -> None:
    """A part still open when its run ended is reserved in the store: the next run of the same
    ledger counts it from the store, not twice."""
    store = Store([])
    ledger = Ledger(100)
    ledger.keep(store)
    number = ledger.reserve(60)
    ledger.keep(None)
    ledger.keep(store)
    assert (ledger.spent, ledger.reserved) == (60, 0) and ledger.fits(41) is False
    ledger.settle(number, 60, 5)
    assert (ledger.spent, ledger.reserved) == (5, 0)


def test_many_workers_never_take_the_ledger_over_its_cap() -> None:
    """32 threads reserve random worst cases and settle each at a random spend of at most it:
    the spend never goes over the cap, and the run stops only when what is spent leaves
    no room for the smallest worst case."""
    cap, seen_over = 1_000_000, []
    ledger = Ledger(cap)

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        while True:
            amount = rng.randint(1000, 20_000)
            done = ledger.reserve(amount)
            if done is False:
                if ledger.spent + 1000 > cap:
                    return
                continue
            if done is None:
                ledger.wait(0.001)
                continue
            spent = rng.randint(0, amount)
            ledger.settle(done, amount, spent)
            if ledger.spent > cap:
                seen_over.append(ledger.spent)

    workers = [threading.Thread(target=worker, args=(seed,)) for seed in range(32)]
    for thread in workers:
        thread.start()
    for thread in workers:
        thread.join()
    assert not seen_over
    assert cap - 1000 < ledger.spent <= cap
    assert ledger.reserved == 0


def test_an_attempt_given_back_unsent_spent_nothing_and_one_sent_its_worst_case() -> None:
    """The engine gives back an attempt that was never sent (a later gate refused it) and one
    whose answer the limits could not read: the first spent nothing, the second may have
    been billed."""
    ledger = Ledger(100 * PICO)
    gate = SpendGate(ledger)
    waiting = Waiting(SYSTEM)
    price = priced(chat("x", max_tokens=5), PRICES)
    for sent, spent in ((None, 0), (12.5, price.worst)):
        admission = Admission("h", Allowance(SYSTEM.now() + 5), threading.Event(), price=price)
        assert gate.admit(admission, waiting) is None
        admission.sent = sent
        before = ledger.spent
        gate.abandon(admission)
        assert ledger.spent - before == spent
        assert ledger.reserved == 0


def test_a_body_offering_tools_reserves_the_providers_own_prompt_too() -> None:
    """Tools get a system prompt of the provider's, not in the body's bytes: 1 000 tokens."""
    bare = chat("x", max_tokens=5)
    tools = [{"name": "t", "input_schema": {"type": "object"}}]
    offered, plain = priced({**bare, "tools": tools}, PRICES), priced(bare, PRICES)
    sent = len(json.dumps({**bare, "tools": tools}, ensure_ascii=False).encode())
    extra = sent - len(json.dumps(bare, ensure_ascii=False).encode()) + 1000
    assert offered.worst - plain.worst == pytest.approx(charge(extra, plain.input), abs=1)


def test_the_largest_completion_limit_a_body_names_is_reserved() -> None:
    """Servers differ in which of max_tokens and max_completion_tokens they obey (vLLM: the
    latter); best_of completions are all made and billed."""
    both = priced(chat("hi", max_tokens=1, max_completion_tokens=100000), PRICES)
    assert both.outputs == 100000
    assert priced(chat("hi", max_tokens=0, max_completion_tokens=9), PRICES).outputs == 9
    best = {"model": "gpt-mock", "prompt": "hi", "max_tokens": 10, "n": 2, "best_of": 5}
    assert priced(best, PRICES).outputs == 50


@pytest.mark.parametrize("cap", ["1e999999", "1000000001", 10**12])
def test_a_cap_past_a_billion_dollars_is_refused_in_one_line(cap: object) -> None:
    with pytest.raises(ValueError, match=r"^max_cost must be an amount of dollars from 0 to "):
        dollars(cap)


@pytest.mark.parametrize("price", ["1e999999999", "1e-999999999", "2000000", "0.000000001"])
def test_a_price_that_is_no_price_per_million_is_refused_at_once(
    price: str, tmp_path: Path
) -> None:
    """(a price of a hundred-millionth of a dollar a million tokens is fine; finer, or more
    than a million dollars, is a mistake, and would only make the sums slow)"""
    path = tmp_path / "prices.json"
    path.write_text(f'{{"models": {{"m": {{"input": {price}, "output": 1}}}}}}')
    with pytest.raises(ValueError, match=r"^models\.m\.input: "):
        Prices.of(path)
