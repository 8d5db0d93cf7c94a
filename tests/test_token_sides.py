"""Input and output tokens apart (issue 43, item 2): ``input_token_rate`` and
``output_token_rate`` beside ``token_rate``; Anthropic's announced input and output limits
held apart; the output side reserved at the completion limit and set to what the answer made,
as Anthropic counts it. Judged at the limit itself by the mock's own counts."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from batchsync import Limits, call, fetch_all, run_all
from batchsync.core.admission import Admission
from batchsync.core.budget import Allowance
from batchsync.core.verdict import Announced, Feedback, InvalidItem
from batchsync.jobs.options import FetchOptions, build
from batchsync.limits.gates import Gates
from batchsync.limits.rates import Rate
from batchsync.limits.tokenrate import TokenRate, item_cost

from .fakeclock import FakeClock
from .mockserver import MockServerProcess
from .test_limits_at_the_limit import stats
from .test_llm_batches import prefix

PROMPT = {"role": "user", "content": "word" * 100}  # 100 tokens, 4 a message, 2 a prompt: 106


def message(max_tokens: int | None = 60) -> dict[str, Any]:
    body: dict[str, Any] = {"model": "claude-mock", "messages": [PROMPT]}
    return body if max_tokens is None else {**body, "max_tokens": max_tokens}


def test_an_items_sides_are_its_prompt_and_its_completion_limit() -> None:
    body = {**message(50), "n": 2}
    cost, sides = item_cost(body, body, None, [])
    assert sides == (107, 100) and cost == 207  # (the role counts: 1 more than the mock)


def test_a_cost_function_counts_whole_on_each_side() -> None:
    budgets = [TokenRate(Rate(100, 60), "input"), TokenRate(Rate(100, 60), "output")]
    assert item_cost("x", None, lambda item: 70, budgets) == (70, None)
    with pytest.raises(InvalidItem, match="needs about 170 output tokens, more than the "):
        item_cost("x", None, lambda item: 170, budgets[1:])


@pytest.mark.parametrize(
    ("side", "error"),
    [
        ("input", "needs about 107 input tokens, more than the input_token_rate of 100/min"),
        ("output", "needs about 120 output tokens, more than the output_token_rate of 100/min"),
    ],
)
def test_a_side_larger_than_its_whole_budget_is_invalid(side: Any, error: str) -> None:
    body = message(120)
    with pytest.raises(InvalidItem, match=error):
        item_cost(body, body, None, [TokenRate(Rate(100, 60), side)])
    item_cost(body, body, None, [TokenRate(Rate(200, 60), side)])  # (room enough: no refusal)


def test_an_output_budget_refuses_a_prompt_without_a_completion_limit() -> None:
    body = message(None)
    with pytest.raises(InvalidItem, match=r"sets no max_tokens .* output_token_rate"):
        item_cost(body, body, None, [TokenRate(Rate(1000, 60), "output")])
    item_cost(body, body, None, [TokenRate(Rate(1000, 60), "input")])
    assert item_cost("https://a.example/", None, None, [TokenRate(Rate(9, 60), "output")])[0] == 0


def test_the_options_read_each_side_and_auto_leaves_the_given_sides_to_them() -> None:
    options = build(
        FetchOptions,
        rate="auto",
        input_token_rate="400000/min",
        output_token_rate=TokenRate.of("80000/min"),  # (a side's value, whatever it said)
    )
    assert [(b.side, str(b)) for b in options.token_rates] == [
        ("input", "400000/min"),
        ("output", "80000/min"),
    ]
    assert options.announced_rates is not None
    assert options.announced_rates.own == {"input", "output"}
    assert options.sides_read and options.usage_reader is not None
    with pytest.raises(ValueError, match="input_token_rate"):
        build(FetchOptions, input_token_rate="lots")
    with pytest.raises(ValueError, match="output_token_rate cannot apply"):
        build(FetchOptions, batch_api="openai", output_token_rate="100/s")


def side_gates(clock: FakeClock, **budgets: str) -> Gates:
    options = build(FetchOptions, **budgets)
    built = [b.gate(concurrency=4, shared=None, clock=clock) for b in options.token_rates]
    return Gates(built, clock=clock)


def enter(gates: Gates, clock: FakeClock, sides: tuple[int, int]) -> Admission:
    entered = gates.enter(
        "h", Allowance(clock.now() + 600), threading.Event(), sum(sides), sides=sides
    )
    assert isinstance(entered, Admission)
    return entered


def passed(gates: Gates, clock: FakeClock, sides: tuple[int, int]) -> float:
    """Let a request of ``sides`` through and end it at once; the instant it went."""
    admission = enter(gates, clock, sides)
    gates.release(admission, Feedback())
    return clock.now()


def test_each_side_is_held_by_its_own_share_of_each_request() -> None:
    """Input 6 000 a minute, output 60: requests of 100 in and 10 out are paced by their
    output (one each 10 s), those of 2 000 in and 1 out by their input (20 s apart)."""
    clock = FakeClock()
    gates = side_gates(clock, input_token_rate="6000/min", output_token_rate="60/min")
    started = clock.now()
    went = [passed(gates, clock, sides) for sides in [(100, 10)] * 2 + [(2000, 1)] * 2]
    # (the input side took the third at 10 s, before it waited for the output's pace, and
    # spaces the fourth 20 s after that)
    assert [at - started for at in went] == pytest.approx([0.0, 10.0, 20.0, 30.0])


def test_the_output_is_set_to_what_was_made_and_the_input_only_upwards() -> None:
    """Two requests of 60 in and 60 out fill budgets of 120 a minute; their answers made 10
    output tokens each and read 90 input tokens each: the output budget has 100 back, the
    input budget is over (180) until the first leaves, a minute after it ended."""
    clock = FakeClock()
    gates = side_gates(clock, input_token_rate="120/min", output_token_rate="120/min")
    first, second = enter(gates, clock, (60, 60)), enter(gates, clock, (60, 60))
    clock.time += 60.0  # (past the pace)
    for admission in (first, second):
        gates.release(admission, Feedback(used=100, usage=(90, 10, 100)))
    ended = clock.now()
    enter(gates, clock, (0, 100))  # room on the output side at once: 20 of 120 held
    assert clock.now() == ended
    enter(gates, clock, (10, 0))  # the input side: 180 held until the two leave
    assert clock.now() - ended == pytest.approx(60.0)


def test_the_output_pace_follows_what_answers_made() -> None:
    """60 output tokens a minute: a request allowed 30 is paced 30 s, but its answer made 10,
    so the next goes 10 s after it, not 30 (in-process and through Redis alike: see
    ``test_scaleout``)."""
    clock = FakeClock()
    gates = side_gates(clock, output_token_rate="60/min")
    started = clock.now()
    for _ in range(3):
        gates.release(enter(gates, clock, (0, 30)), Feedback(usage=(0, 10, 10)))
    assert clock.now() - started == pytest.approx(20.0)


def test_auto_holds_anthropics_input_and_output_limits_apart() -> None:
    clock = FakeClock()
    option = build(FetchOptions, rate="auto").announced_rates
    assert option is not None
    gates = Gates([option.gate(concurrency=4, shared=None, clock=clock)], clock=clock)
    said = Announced(input_tokens_limit=6000, output_tokens_limit=60)
    gates.release(enter(gates, clock, (1, 1)), Feedback(announced=said))
    started = clock.now()
    went = [passed(gates, clock, sides) for sides in [(100, 10)] * 2 + [(2000, 1)] * 2]
    # (the input side took the third at 10 s, before it waited for the output's pace, and
    # spaces the fourth 20 s after that)
    assert [at - started for at in went] == pytest.approx([0.0, 10.0, 20.0, 30.0])


def test_run_all_weighs_each_side_and_refuses_an_unbounded_output() -> None:
    """A call's item is its body, weighed by side: a prompt of 107 tokens and 5 out passes an
    output budget of 10 a second (its 112 in all would not) and is refused by an input budget
    of 100 a second; a prompt without a completion limit is refused by an output budget."""
    answer = {"usage": {"input_tokens": 106, "output_tokens": 2}}
    assert run_all(lambda item: answer, [message(5)], output_token_rate="10/s")[0].ok
    too_long = run_all(lambda item: answer, [message(5)], input_token_rate="100/s")[0]
    assert too_long.error_kind == "invalid_request" and "107 input tokens" in (too_long.error or "")
    refused = run_all(lambda item: answer, [message(None)], output_token_rate="100/s")
    assert refused[0].error_kind == "invalid_request" and refused[0].attempts == 0


@pytest.mark.integration
@pytest.mark.parametrize(
    ("prompt", "most", "inputs", "outputs", "headers"),
    [(106, 60, 1272, 360, False), (1006, 600, 20000, 6000, True)],
    ids=["budgets-alone", "with-headers"],
)
def test_input_and_output_budgets_at_anthropics_limits_meet_no_429(  # noqa: PLR0917
    server: MockServerProcess, prompt: int, most: int, inputs: int, outputs: int, headers: bool
) -> None:
    """The mock counts Anthropic's input tokens when it admits a request and its output tokens
    when it answers (a draw up to ``max_tokens``), each over a sliding second, and answers 429
    to anything over either. The budgets alone: the output binds (6 a second at ``max_tokens``,
    12 at an average answer, against 12 by the input). With the headers, whose counts the mock
    rounds to the thousand as Anthropic does (a tiny limit would read as nothing left), the
    input binds; the share they use is not judged: a host whose answers have not shown that its
    resets give the whole count back is held to what they confirm (0.49 of the limit once on a
    loaded machine, 0.87 to 0.90 on a quiet one). The budgets alone: the output's pace, given
    back for what answers did not make, lets the run use its limit, not the half of it that
    ``max_tokens`` alone would allow."""
    base, key = prefix(server, f"rpm=100000,tpm=10000000,itpm={inputs},otpm={outputs},window=1")
    body = {"model": "claude-mock", "max_tokens": most,
            "messages": [{"role": "user", "content": "word" * (prompt - 6)}]}  # fmt: skip
    count = 40 if headers is False else 80
    items = [{"url": f"{base}/v1/messages", "method": "POST", "json": body, "id": n}
             for n in range(count)]  # fmt: skip
    rs = fetch_all(
        items,
        input_token_rate=f"{inputs}/s",
        output_token_rate=f"{outputs}/s",
        concurrency=8,
        budget=60,
        quota_headers=headers,
    )
    counted = stats(server, key)
    assert counted["rejected"] == 0, counted["windows"]
    assert [r.id for r in rs] == list(range(count)) and all(r.ok for r in rs), rs.summary()
    if headers:  # (what the headers let through depends on how they read the resets: no share)
        return
    seconds = float(counted["elapsed"])
    used = (prompt * count / (inputs * seconds), counted["completion_tokens"] / (outputs * seconds))
    assert max(used) >= 0.6, (used, [w["requests"] for w in counted["windows"]])


def test_call_weighs_its_keyword_arguments_by_side() -> None:
    """``call`` reads its keyword arguments as the request body, by side: an output budget
    refuses a prompt without a completion limit, unsent, and holds the output at ``max_tokens``
    alone (not the prompt and the completion together)."""
    limits = Limits(input_token_rate="1000/s", output_token_rate="100/s")
    calls: list[dict[str, Any]] = []

    def sdk(**kwargs: Any) -> dict[str, Any]:
        calls.append(kwargs)
        return {"usage": {"input_tokens": 107, "output_tokens": 5}}

    unbounded = call(sdk, limits=limits, model="m", messages=[PROMPT])
    assert unbounded.error_kind == "invalid_request" and unbounded.attempts == 0 and not calls
    assert "sets no max_tokens" in (unbounded.error or "")
    fits = call(sdk, limits=limits, model="m", messages=[PROMPT], max_tokens=100)
    assert fits.ok and len(calls) == 1  # (107 + 100 on one side would not fit the 100/s)


@pytest.mark.parametrize("budget", ["token_rate", "input_token_rate", "output_token_rate"])
def test_a_token_budget_refuses_the_hedged_copies_it_cannot_weigh(budget: str) -> None:
    """A hedge's second copy was let through unweighed: 12 calls made 176 output tokens a
    second against a budget of 100. Refused in one line instead, as the spend cap does."""
    given: dict[str, Any] = {budget: "100/s", "hedge_after": 0.05}
    with pytest.raises(ValueError, match=f"{budget} .* cannot weigh the second copy"):
        fetch_all(["http://127.0.0.1:9/"], **given)
    with pytest.raises(ValueError, match=f"{budget} .* cannot weigh the second copy"):
        run_all(lambda item: item, [1], **given)


def test_an_attempt_sent_then_given_up_stays_counted() -> None:
    """An attempt the limits hear nothing readable of (an interrupt while it ran, an answer
    the limits could not read) was sent: its tokens stay counted a period, not given back as
    if it never went."""
    clock = FakeClock()
    gates = side_gates(clock, output_token_rate="100/min")
    sent = enter(gates, clock, (0, 100))
    sent.sent = clock.now()
    gates.abandon(sent)
    started = clock.now()
    gates.release(enter(gates, clock, (0, 100)), Feedback())
    assert clock.now() - started == pytest.approx(60.0)
    never = enter(gates, clock, (0, 100))  # (a period on: room again) ...
    assert clock.now() - started == pytest.approx(120.0)
    gates.abandon(never)  # ... and never sent: all of it back at once
    enter(gates, clock, (0, 100))
    assert clock.now() - started == pytest.approx(120.0)
