"""The one reading of an outside number: a count or seconds, or None, never an exception."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from batchsync.core.numbers import MAX_COUNT, MAX_SECONDS, count_of, seconds_of

HUGE = "1" + "0" * 400

# What int() or float() would read, but is no ASCII number: other scripts' digits, superscripts,
# Python's own syntax, floats' words.
NOT_NUMBERS = [
    "²",
    "\u0661\u0662",  # Arabic-Indic
    "\u06f1\u06f2",  # Extended Arabic-Indic
    "\u0967\u0968",  # Devanagari
    "\uff11\uff12",  # fullwidth
    "1²",
    "NaN",
    "nan",
    "inf",
    "-inf",
    "Infinity",
    "1e5",
    "1E5",
    "1_000",
    "+1",
    "0x10",
    "",
    " ",
    "1 2",
    "12abc",
]


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (0, 0),
        (7, 7),
        ("0", 0),
        ("42", 42),
        (" 42 ", 42),
        ("\t42\r\n", 42),
        ("007", 7),
        (MAX_COUNT, MAX_COUNT),
        (str(MAX_COUNT), MAX_COUNT),
        (MAX_COUNT + 1, None),
        (str(MAX_COUNT + 1), None),
        ("9" * 13, None),
        ("9" * 309, None),
        (HUGE, None),
        (10**400, None),
        (-1, None),
        ("-1", None),
        ("-0", None),
        (True, None),
        (False, None),
        (1.0, None),
        (1.5, None),
        (math.nan, None),
        (math.inf, None),
        (None, None),
        (b"12", None),
        ([12], None),
    ],
)
def test_a_count_is_a_whole_number_within_the_bound(value: object, expected: int | None) -> None:
    assert count_of(value) == expected


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_no_count_is_read_from_what_is_not_ascii_digits(text: str) -> None:
    assert count_of(text) is None


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("12", 12.0),
        ("0.5", 0.5),
        (".25", 0.25),
        ("3.", 3.0),
        (" 3 ", 3.0),
        (0, 0.0),
        (2, 2.0),
        (1.5, 1.5),
        (MAX_SECONDS, MAX_SECONDS),
        (MAX_SECONDS * 2, None),
        (str(int(MAX_SECONDS) + 1), None),
        (-1, None),
        (-0.5, None),
        ("-1", None),
        (math.nan, None),
        (math.inf, None),
        (-math.inf, None),
        (1e308, None),
        (10**400, None),
        (-(10**400), None),
        (HUGE, None),
        ("9" * 309, None),
        ("1" + "0" * 13, None),
        ("0." + "0" * 400 + "1", None),
        (True, None),
        (None, None),
        (b"1", None),
    ],
)
def test_seconds_are_a_finite_decimal_within_the_bound(
    value: object, expected: float | None
) -> None:
    assert seconds_of(value) == expected


@pytest.mark.parametrize("text", NOT_NUMBERS)
def test_no_seconds_are_read_from_what_is_not_an_ascii_decimal(text: str) -> None:
    assert seconds_of(text) is None


def test_milliseconds_are_scaled_and_bounded_after_scaling() -> None:
    assert seconds_of("1500", scale=1e-3) == 1.5
    assert seconds_of("0.5", scale=1e-3) == 0.0005
    assert seconds_of(str(int(MAX_SECONDS) * 1000), scale=1e-3) == MAX_SECONDS
    assert seconds_of(HUGE, scale=1e-3) is None
    assert seconds_of("²", scale=1e-3) is None


def test_the_bound_of_seconds_can_be_set() -> None:
    assert seconds_of("5", most=4) is None
    assert seconds_of("4", most=4) == 4.0
    assert seconds_of("99999999999", most=1e11) == 99999999999.0


@given(st.integers(min_value=0, max_value=MAX_COUNT))
def test_every_count_in_bounds_reads_back(number: int) -> None:
    assert count_of(number) == number
    assert count_of(str(number)) == number
    assert count_of(f" {number}\t") == number


@given(st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none()))
def test_any_value_is_a_bounded_count_or_none(value: object) -> None:
    count = count_of(value)
    assert count is None or (type(count) is int and 0 <= count <= MAX_COUNT)


@given(
    st.one_of(st.text(), st.integers(), st.floats(), st.booleans(), st.none()),
    st.sampled_from([1.0, 1e-3]),
)
def test_any_value_is_bounded_finite_seconds_or_none(value: object, scale: float) -> None:
    seconds = seconds_of(value, scale=scale)
    assert seconds is None or (
        type(seconds) is float and math.isfinite(seconds) and 0 <= seconds <= MAX_SECONDS
    )


@given(st.text(alphabet=st.characters(categories=["Nd", "No"]), min_size=1))
def test_digits_of_other_scripts_are_never_read(text: str) -> None:
    if not text.isascii():
        assert count_of(text) is None
        assert seconds_of(text) is None
