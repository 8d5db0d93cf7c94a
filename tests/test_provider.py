"""The rate-limit headers of OpenAI, Anthropic and Azure OpenAI, read into what they announce:
the examples are those of the providers' documentation and of answers they sent."""

from __future__ import annotations

import math
from datetime import datetime
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from requests.structures import CaseInsensitiveDict
from urllib3 import HTTPHeaderDict

from batchsync.core.verdict import Announced
from batchsync.http.provider import announced, parse_duration
from batchsync.http.quota import quota_wait


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


NOW = at("2026-12-02T03:04:00+00:00")

# OpenAI's "Rate limits" guide, its sample values.
OPENAI_GUIDE = [
    ("x-ratelimit-limit-requests", "60"),
    ("x-ratelimit-limit-tokens", "150000"),
    ("x-ratelimit-remaining-requests", "59"),
    ("x-ratelimit-remaining-tokens", "149984"),
    ("x-ratelimit-reset-requests", "1s"),
    ("x-ratelimit-reset-tokens", "6m0s"),
]
# An answer of OpenAI's with its other headers, and the usage-based ones it added since.
OPENAI_ANSWER = [
    ("date", "Mon, 26 May 2025 05:00:04 GMT"),
    ("content-type", "application/json"),
    ("openai-processing-ms", "1032"),
    ("x-ratelimit-limit-requests", "5000"),
    ("x-ratelimit-limit-tokens", "160000"),
    ("x-ratelimit-limit-tokens_usage_based", "160000"),
    ("x-ratelimit-remaining-requests", "4999"),
    ("x-ratelimit-remaining-tokens", "159976"),
    ("x-ratelimit-remaining-tokens_usage_based", "159976"),
    ("x-ratelimit-reset-requests", "12ms"),
    ("x-ratelimit-reset-tokens", "9ms"),
    ("x-ratelimit-reset-tokens_usage_based", "9ms"),
    ("x-request-id", "req_deaa3616cbd15d33b4db96b3ba74d2b4"),
]
# An answer of Anthropic's Messages API, all four sets (21 Aug 2025, 12:40:30 here).
ANTHROPIC_NOW = at("2025-08-21T12:40:30+00:00")
ANTHROPIC_ANSWER = [
    ("date", "Thu, 21 Aug 2025 12:41:00 GMT"),
    ("anthropic-ratelimit-input-tokens-limit", "80000"),
    ("anthropic-ratelimit-input-tokens-remaining", "80000"),
    ("anthropic-ratelimit-input-tokens-reset", "2025-08-21T12:40:59Z"),
    ("anthropic-ratelimit-output-tokens-limit", "16000"),
    ("anthropic-ratelimit-output-tokens-remaining", "16000"),
    ("anthropic-ratelimit-output-tokens-reset", "2025-08-21T12:41:00Z"),
    ("anthropic-ratelimit-requests-limit", "1000"),
    ("anthropic-ratelimit-requests-remaining", "999"),
    ("anthropic-ratelimit-requests-reset", "2025-08-21T12:40:59Z"),
    ("anthropic-ratelimit-tokens-limit", "96000"),
    ("anthropic-ratelimit-tokens-remaining", "96000"),
    ("anthropic-ratelimit-tokens-reset", "2025-08-21T12:40:59Z"),
    ("request-id", "req_011CSLsW7mFqvHHnzrKdKjAE"),
]
# Azure OpenAI's 429: its wait in milliseconds, with OpenAI's remaining counts.
AZURE_429 = [
    ("retry-after", "3"),
    ("retry-after-ms", "2500"),
    ("x-ms-retry-after-ms", "2500"),
    ("x-ratelimit-remaining-requests", "0"),
    ("x-ratelimit-remaining-tokens", "1200"),
]
# Azure OpenAI's Responses API, which says -1 where it says nothing.
AZURE_NOTHING = [
    ("x-ratelimit-limit-tokens", "-1"),
    ("x-ratelimit-remaining-tokens", "-1"),
    ("x-ratelimit-reset-tokens", "0"),
]


@pytest.mark.parametrize(
    ("headers", "now", "expected"),
    [
        (
            OPENAI_GUIDE,
            NOW,
            Announced(
                requests_limit=60,
                requests_remaining=59,
                requests_reset=1.0,
                tokens_limit=150000,
                tokens_remaining=149984,
                tokens_reset=360.0,
            ),
        ),
        (
            OPENAI_ANSWER,
            NOW,
            Announced(
                requests_limit=5000,
                requests_remaining=4999,
                requests_reset=0.012,
                tokens_limit=160000,
                tokens_remaining=159976,
                tokens_reset=0.009,
            ),
        ),
        (
            ANTHROPIC_ANSWER,
            ANTHROPIC_NOW,
            Announced(
                requests_limit=1000,
                requests_remaining=999,
                requests_reset=29.0,
                tokens_limit=96000,
                tokens_remaining=96000,
                tokens_reset=29.0,
                input_tokens_limit=80000,
                input_tokens_remaining=80000,
                input_tokens_reset=29.0,
                output_tokens_limit=16000,
                output_tokens_remaining=16000,
                output_tokens_reset=30.0,
            ),
        ),
        (
            AZURE_429,
            NOW,
            Announced(requests_remaining=0, tokens_remaining=1200, retry_after=2.5),
        ),
        (
            AZURE_NOTHING,
            NOW,
            Announced(tokens_reset=0.0, unreadable=("x-ratelimit-limit-tokens",)),
        ),
    ],
)
def test_what_the_providers_answers_announce(
    headers: list[tuple[str, str]], now: float, expected: Announced
) -> None:
    assert announced(headers, now) == expected


def anthropic_tokens(**sets: tuple[str, str, str]) -> list[tuple[str, str]]:
    """Anthropic's token headers: each set's (limit, remaining, reset) by its name."""
    return [
        (f"anthropic-ratelimit-{kind.replace('_', '-')}-{part}", value)
        for kind, values in sets.items()
        for part, value in zip(("limit", "remaining", "reset"), values, strict=True)
    ]


IN_10 = "2026-12-02T03:04:10Z"
IN_50 = "2026-12-02T03:04:50Z"


Budgets = tuple[tuple[int | None, int | None, float | None], ...]


@pytest.mark.parametrize(
    ("headers", "budgets"),
    [
        # Input and output apart, each its own budget, whichever is tighter.
        (
            anthropic_tokens(
                input_tokens=("80000", "75000", IN_10), output_tokens=("16000", "2000", IN_50)
            ),
            ((None, None, None), (80000, 75000, 10.0), (16000, 2000, 50.0)),
        ),
        (
            anthropic_tokens(output_tokens=("16000", "2000", IN_50)),
            ((None, None, None), (None, None, None), (16000, 2000, 50.0)),
        ),
        (
            anthropic_tokens(input_tokens=("80000", "9", IN_10)),
            ((None, None, None), (80000, 9, 10.0), (None, None, None)),
        ),
        # A part that cannot be read is None, the others stand.
        (
            anthropic_tokens(
                input_tokens=("80000", "lots", IN_10), output_tokens=("16000", "", IN_50)
            ),
            ((None, None, None), (80000, None, 10.0), (16000, None, 50.0)),
        ),
        # The combined set beside them, each read as it is.
        (
            anthropic_tokens(
                tokens=("96000", "50000", IN_10),
                input_tokens=("80000", "40000", IN_10),
                output_tokens=("16000", "10", IN_50),
            ),
            ((96000, 50000, 10.0), (80000, 40000, 10.0), (16000, 10, 50.0)),
        ),
        (
            [
                ("anthropic-ratelimit-tokens-reset", IN_10),
                *anthropic_tokens(output_tokens=("16000", "10", IN_50)),
            ],
            ((None, None, 10.0), (None, None, None), (16000, 10, 50.0)),
        ),
    ],
)
def test_anthropics_input_and_output_tokens_are_budgets_of_their_own(
    headers: list[tuple[str, str]], budgets: Budgets
) -> None:
    said = announced(headers, NOW)
    assert said is not None
    told = dict(said.budgets())
    assert (
        tuple(
            (limit, left, reset)
            for left, reset, limit in (told[k] for k in ("tokens", "input", "output"))
        )
        == budgets
    )
    assert told["requests"] == (None,) * 3


@pytest.mark.parametrize(
    ("reset", "seconds"),
    [
        ("2026-12-02T03:04:05Z", 5.0),
        ("2026-12-02T03:04:05.5Z", 5.5),
        ("2026-12-02T03:04:05.250000000Z", 5.25),  # nanoseconds, as Go writes them
        ("2026-12-02T05:04:05+02:00", 5.0),
        ("2026-12-01T22:04:05-05:00", 5.0),
        ("2026-12-02t03:04:05z", 5.0),
        ("2026-12-02 03:04:05Z", 5.0),
        ("2026-12-02T03:05:00Z", 60.0),
        ("2026-12-02T03:03:00Z", 0.0),  # past: no wait
        ("2026-12-02T03:04:00Z", 0.0),
        ("2026-12-02T03:04:60Z", 59.0),  # a leap second: the second before it
        ("2026-12-02T03:04:05", None),  # no offset: not RFC 3339
        ("2026-13-02T03:04:05Z", None),
        ("2026-02-30T03:04:05Z", None),
        ("2026-12-02T24:04:05Z", None),
        ("0000-12-02T03:04:05Z", None),
        ("2026-12-02", None),
        ("1796180645", None),
        ("5s", None),
        ("", None),
    ],
)
def test_anthropics_resets_are_times(reset: str, seconds: float | None) -> None:
    said = announced([("anthropic-ratelimit-requests-reset", reset)], NOW)
    assert said == Announced(requests_reset=seconds)


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1s", 1.0),
        ("6m0s", 360.0),
        ("20ms", 0.02),
        ("12ms", 0.012),
        ("1h2m3.5s", 3723.5),
        ("0s", 0.0),
        ("59.5s", 59.5),
        ("2m", 120.0),
        ("1m30s", 90.0),
        ("1h", 3600.0),
        ("7.66s", 7.66),
        (".5s", 0.5),
        ("250us", 0.00025),
        ("250\u00b5s", 0.00025),  # Go's micro signs
        ("250\u03bcs", 0.00025),
        ("100ns", 1e-7),
        (" 1s ", 1.0),
        ("0", 0.0),  # Go's zero
        ("30", 30.0),  # a bare number: seconds, as Azure OpenAI writes its resets
        ("1.5", 1.5),
        ("", None),
        ("s", None),
        ("-1s", None),
        ("+1s", None),
        ("1S", None),
        ("1 s", None),
        ("1m1", None),
        ("1d", None),
        ("1.2.3s", None),
        ("ms", None),
        ("1e3s", None),
        ("inf", None),
        ("nan", None),
        ("9" * 400 + "s", None),  # not finite
        ("2026-12-02T03:04:05Z", None),
    ],
)
def test_openais_resets_are_go_durations(text: str, seconds: float | None) -> None:
    assert parse_duration(text) == seconds


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_every_duration_go_writes_reads_back(
    hours: int, minutes: int, seconds: int, millis: int
) -> None:
    """Go writes ``1h2m3.004s``; under a minute ``3.004s``; under a second ``4ms``."""
    total = hours * 3600 + minutes * 60 + seconds
    fraction = f".{millis:03d}".rstrip("0").rstrip(".")
    if hours:
        text = f"{hours}h{minutes}m{seconds}{fraction}s"
    elif minutes:
        text = f"{minutes}m{seconds}{fraction}s"
    elif seconds:
        text = f"{seconds}{fraction}s"
    else:
        text = f"{millis}ms"
    parsed = parse_duration(text)
    assert parsed is not None
    assert math.isclose(parsed, total + millis / 1000, rel_tol=1e-12, abs_tol=1e-12)


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        # Names in any case.
        ([("X-RateLimit-Remaining-Tokens", "7")], Announced(tokens_remaining=7)),
        ([("ANTHROPIC-RATELIMIT-REQUESTS-LIMIT", "50")], Announced(requests_limit=50)),
        ([("Retry-After-Ms", "20")], Announced(retry_after=0.02)),
        ([("x-ms-retry-after-ms", "1500.5")], Announced(retry_after=1.5005)),
        # Azure's first name when both say a wait.
        ([("x-ms-retry-after-ms", "1000"), ("retry-after-ms", "200")], Announced(retry_after=0.2)),
        ([("x-ms-retry-after-ms", "1000"), ("retry-after-ms", "x")], Announced(retry_after=1.0)),
        # Bad numbers, each left out alone.
        (
            [
                ("x-ratelimit-limit-requests", "sixty"),
                ("x-ratelimit-remaining-requests", " 59 "),
                ("x-ratelimit-limit-tokens", "1.5e5"),
                ("x-ratelimit-remaining-tokens", "+10"),
                ("x-ratelimit-reset-tokens", "soon"),
                ("retry-after-ms", "-5"),
            ],
            Announced(
                requests_remaining=59,
                unreadable=("x-ratelimit-limit-requests", "x-ratelimit-limit-tokens"),
            ),
        ),
        (  # past int()'s digits
            [("x-ratelimit-limit-requests", "9" * 5000)],
            Announced(unreadable=("x-ratelimit-limit-requests",)),
        ),
        (  # not ASCII digits
            [("x-ratelimit-limit-requests", "\u0661\u0662")],
            Announced(unreadable=("x-ratelimit-limit-requests",)),
        ),
        ([("retry-after-ms", "1" * 400)], Announced()),  # not finite
        # OpenAI's and Anthropic's both: OpenAI's where it says the part.
        (
            [
                ("x-ratelimit-remaining-requests", "5"),
                ("anthropic-ratelimit-requests-remaining", "6"),
                ("anthropic-ratelimit-requests-limit", "50"),
                ("x-ratelimit-limit-requests", "bad"),
            ],
            Announced(
                requests_limit=50,
                requests_remaining=5,
                unreadable=("x-ratelimit-limit-requests",),
            ),
        ),
    ],
)
def test_each_part_is_read_alone(headers: list[tuple[str, str]], expected: Announced) -> None:
    assert announced(headers, NOW) == expected


@pytest.mark.parametrize(
    "headers",
    [
        [],
        [("content-type", "application/json"), ("date", "Mon, 26 May 2025 05:00:04 GMT")],
        [("Retry-After", "30")],
        # The quota headers of other hosts, read by quota, not here.
        [("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "30"), ("X-RateLimit-Limit", "9")],
        [("RateLimit", '"default";r=0;t=20'), ("RateLimit-Policy", '"default";q=100;w=60')],
        # OpenAI's and Anthropic's other rate-limit headers.
        [("x-ratelimit-remaining-tokens_usage_based", "159976")],
        [("anthropic-ratelimit-unified-5h-utilization", "7.26")],
        [("anthropic-ratelimit-unified-reset", "1775474705")],
        [("x-ratelimit-remaining-requestsx", "5"), ("xx-ratelimit-remaining-requests", "5")],
    ],
)
def test_answers_without_these_headers_announce_nothing(headers: list[tuple[str, str]]) -> None:
    assert announced(headers, NOW) is None


def test_quotas_headers_and_openais_do_not_collide() -> None:
    """OpenAI's ``x-ratelimit-remaining-requests: 0`` is not the ``X-RateLimit-Remaining: 0``
    that holds a host until its reset, nor is that one read here."""
    openai = [("x-ratelimit-remaining-requests", "0"), ("x-ratelimit-reset-requests", "30s")]
    assert quota_wait(openai, lambda: NOW) is None
    assert announced(openai, NOW) == Announced(requests_remaining=0, requests_reset=30.0)
    generic = [("X-RateLimit-Remaining", "0"), ("X-RateLimit-Reset", "30")]
    assert quota_wait(generic, lambda: NOW) == 30.0
    assert announced(generic, NOW) is None


@pytest.mark.parametrize(
    "container",
    [
        lambda pairs: HTTPHeaderDict(pairs).items(),  # urllib3's, as requests' answers hold
        lambda pairs: CaseInsensitiveDict(pairs).items(),
        lambda pairs: httpx.Headers(pairs).multi_items(),  # the SDKs' raw responses
    ],
)
def test_the_header_containers_answers_come_in(container: Any) -> None:
    headers = container(
        [(name.title(), value) for name, value in [*OPENAI_GUIDE, ("retry-after-ms", "40")]]
    )
    said = announced(headers, NOW)
    assert said is not None
    assert (said.requests_remaining, said.tokens_reset, said.retry_after) == (59, 360.0, 0.04)


NAMES = [
    *(
        f"x-ratelimit-{part}-{kind}"
        for part in ("limit", "remaining", "reset")
        for kind in ("requests", "tokens")
    ),
    *(
        f"anthropic-ratelimit-{kind}-{part}"
        for kind in ("requests", "tokens", "input-tokens", "output-tokens")
        for part in ("limit", "remaining", "reset")
    ),
    "retry-after-ms",
    "x-ms-retry-after-ms",
    "x-ratelimit-remaining",
    "retry-after",
]
names = st.sampled_from(NAMES).flatmap(
    lambda name: st.sampled_from([name, name.upper(), name.title()])
) | st.text(max_size=30)
values = st.sampled_from(
    ["0", "59", "-1", "6m0s", "20ms", "2026-12-02T03:04:05Z", "1e3"]
) | st.text(max_size=30)


@settings(max_examples=500, deadline=None, derandomize=True)
@given(st.lists(st.tuples(names, values), max_size=12), st.floats(0, 4e9))
def test_any_headers_announce_sound_parts_or_nothing(
    headers: list[tuple[str, str]], now: float
) -> None:
    said = announced(headers, now)
    if said is None:
        return
    counts = (
        said.requests_limit,
        said.requests_remaining,
        said.tokens_limit,
        said.tokens_remaining,
    )
    seconds = (said.requests_reset, said.tokens_reset, said.retry_after)
    assert all(count is None or (type(count) is int and count >= 0) for count in counts)
    assert all(wait is None or (math.isfinite(wait) and wait >= 0) for wait in seconds)


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(NAMES), values), max_size=12))
def test_the_order_and_case_of_distinct_names_do_not_matter(
    headers: list[tuple[str, str]],
) -> None:
    distinct = list(dict(headers).items())
    shuffled = [(name.upper(), value) for name, value in reversed(distinct)]
    assert announced(shuffled, NOW) == announced(distinct, NOW)
