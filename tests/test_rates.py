"""Rates as users write them: a number per second, or N per second, minute or hour."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batchsync.limits.rates import Rate, Window, parse_rate


@pytest.mark.parametrize(
    ("given", "count", "period"),
    [
        (10, 10.0, 1.0),
        (2.5, 2.5, 1.0),
        ("10", 10.0, 1.0),
        ("0.5", 0.5, 1.0),
        (".5/s", 0.5, 1.0),
        ("10/s", 10.0, 1.0),
        ("10/sec", 10.0, 1.0),
        ("10/second", 10.0, 1.0),
        ("500/min", 500.0, 60.0),
        ("500/minute", 500.0, 60.0),
        ("3600/h", 3600.0, 3600.0),
        ("3600/hr", 3600.0, 3600.0),
        ("3600/hour", 3600.0, 3600.0),
        ("200000/min", 200000.0, 60.0),
        ("500/MIN", 500.0, 60.0),  # any case
        ("500/Minute", 500.0, 60.0),
        (" 500 / min ", 500.0, 60.0),  # spaces around the number and the slash
        ("500 /min", 500.0, 60.0),
        ("1e3/min", 1000.0, 60.0),  # an exponent, as str() writes large or tiny counts
        ("1E-3/s", 0.001, 1.0),
        ("2.5e+20/h", 2.5e20, 3600.0),
        ("7./min", 7.0, 60.0),
    ],
)
def test_the_rates_users_write(given: float | str, count: float, period: float) -> None:
    rate = parse_rate(given)
    assert (rate.count, rate.period) == (count, period)
    assert rate == Rate(count=count, period=period)


@pytest.mark.parametrize(
    "given",
    [
        0,
        -1,
        0.0,
        -0.5,
        math.nan,
        math.inf,
        -math.inf,
        10**400,  # beyond any float
        True,
        False,
        "",
        " ",
        "abc",
        "0",
        "0/min",
        "-5/min",
        "+5/min",
        "5/day",
        "5/m",  # a minute or a metre: not guessed
        "5/mins",
        "5/minutes",
        "5/",
        "/min",
        "5 per min",
        "5/min/s",
        "inf",
        "nan",
        "nan/s",
        "1_000/min",
        "1e999/min",  # overflows to inf
        "1e-999/s",  # underflows to 0
        "5 /",
        "0x10/s",
        "auto",
        None,
        [5],
        b"5/min",
    ],
)
def test_what_is_not_a_rate_is_refused_in_one_line(given: object) -> None:
    with pytest.raises(ValueError, match="per second or N/s, N/min, N/h") as raised:
        parse_rate(given)  # type: ignore[arg-type]
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("rate must be a positive number per second")
    assert message.endswith(f": got {given!r}")


def test_the_refusal_names_the_option() -> None:
    with pytest.raises(ValueError, match=r"^token_rate must be .*: got '5/day'$"):
        parse_rate("5/day", name="token_rate")


@pytest.mark.parametrize(
    ("rate", "shown"),
    [
        (Rate(count=500.0, period=60.0), "500/min"),
        (Rate(count=10.0, period=1.0), "10/s"),
        (Rate(count=3600.0, period=3600.0), "3600/h"),
        (Rate(count=2.5, period=1.0), "2.5/s"),
        (Rate(count=200000.0, period=60.0), "200000/min"),
        (Rate(count=0.001, period=1.0), "0.001/s"),
        (Rate(count=1e20, period=60.0), "1e+20/min"),
        (Rate(count=500, period=60), "500/min"),  # ints as given in code
    ],
)
def test_a_rate_is_shown_as_a_user_writes_it(rate: Rate, shown: str) -> None:
    assert str(rate) == shown
    assert parse_rate(shown) == rate


@pytest.mark.parametrize(
    ("rate", "count", "period"),
    [
        (parse_rate("500/min"), 500, 60),
        (parse_rate("3600/h"), 3600, 3600),
        (parse_rate("10/s"), 10, 1),
        (parse_rate(2.5), 2.5, 1),
        (parse_rate(0.5), 1, 2),  # below one a period: one in the period that makes it one
        (parse_rate("0.25/min"), 1, 240),
    ],
)
def test_a_rate_is_held_over_the_window_of_its_period(
    rate: Rate, count: float, period: float
) -> None:
    window = Window.of(rate)
    assert (window.count, window.period) == (count, period)
    assert window.interval == period / count


@pytest.mark.parametrize(
    ("count", "period"),
    [(0.0, 1.0), (-1.0, 60.0), (math.nan, 1.0), (math.inf, 1.0), (True, 1.0), (5.0, 86400.0)],
)
def test_a_rate_made_in_code_is_checked_too(count: float, period: float) -> None:
    with pytest.raises(ValueError, match=r"rate (count|period) must be"):
        Rate(count=count, period=period)


counts = st.floats(min_value=0.0, exclude_min=True, allow_nan=False, allow_infinity=False)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(counts, st.sampled_from([1.0, 60.0, 3600.0]))
def test_every_rate_reads_back_as_shown(count: float, period: float) -> None:
    rate = Rate(count=count, period=period)
    assert parse_rate(str(rate)) == rate
    assert parse_rate(str(rate).upper().replace("/", " / ")) == rate


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.text(max_size=12))
def test_any_text_is_a_rate_or_one_clear_refusal(text: str) -> None:
    try:
        rate = parse_rate(text)
    except ValueError as refused:
        assert str(refused).endswith(f": got {text!r}")
    else:
        assert math.isfinite(rate.count)
        assert rate.count > 0
