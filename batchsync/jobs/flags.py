"""How an option is spelled on the command line, kept in the option's own declaration.

An option of ``FetchOptions`` that the CLI offers carries a ``Flag`` in its annotation
(``timeout: Annotated[Seconds, Flag("--timeout", ...)] = 10.0``): the CLI makes its click
option from the field (type and bounds, default) and the flag (names, help, how its text
reads). The parsers here read that text without click, raising ValueError with the line
the CLI shows; ``Takes`` says what a caller may give when it is more than the field keeps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, TypeVar

from ..http.retries import parse_statuses
from ..limits.breaker import Breaker
from ..limits.rates import parse_rate
from ..limits.spend import Prices, dollars

# The most seconds a timeout, budget, deadline or lease may be, about 31 years: well within
# what a thread or a socket can wait (``threading.TIMEOUT_MAX``, some 9.2e9 s), even added to
# the clock. Beyond it, an attempt's timer overflows: a Result of OverflowError, not a timeout.
MAX_SETTING_SECONDS = 1_000_000_000


@dataclass(frozen=True)
class Flag:
    """An option's command-line spelling: its name (``"--dedup/--no-dedup"`` for a pair), a
    ``short`` one (``-c``), its help, and what differs from what the field says: a metavar,
    the default as typed (``--breaker on``), ``parse`` reading the text (a tuple of texts when
    the field holds several: tuples and mappings are repeatable) into the value, ValueError
    with the line to show. Without ``parse``, click reads the text by the field's type and
    bounds."""

    name: str
    help: str  # (click's word for it)
    short: str | None = None
    metavar: str | None = None
    typed_default: str | None = None
    show_default: bool | None = None
    parse: Callable[[Any], object] | None = None

    @property
    def names(self) -> tuple[str, ...]:
        """The names click takes, the short one first."""
        return (self.name,) if self.short is None else (self.short, self.name)


@dataclass(frozen=True)
class Takes:
    """What a caller may give for an option, when it is more than the field keeps (a
    ``Mapping`` of headers kept as a dict, a rate's text kept as a ``TokenRate``): the type
    of its keyword in the library's signatures."""

    given: object


@dataclass(frozen=True)
class Honoured:
    """Marks an option, outside the families a batch run takes whole, that a run through a
    provider's batch endpoint honours; any other option given to such a run is refused,
    never ignored: a rate, a concurrency, a fallback cannot apply where the provider runs
    the rows as it will."""


HONOURED = Honoured()


def _header_name(name: str) -> bool:
    """Whether ``name`` can be a header's: ASCII, printable, no space or colon."""
    return (
        name != ""
        and name.isascii()
        and name.isprintable()
        and not any(c.isspace() or c == ":" for c in name)
    )


def header_lines(values: Sequence[str]) -> dict[str, str] | None:
    """-H values (``'Name: value'``) as headers; None when none was given."""
    headers: dict[str, str] = {}
    for number, value in enumerate(values, start=1):
        name, colon, content = value.partition(":")
        if not colon or not _header_name(name.strip()):
            # Never echo the value: it is likely a secret.
            raise ValueError(f"header {number} is not in the form 'Name: value'")
        headers[name.strip()] = content.strip()
    return headers or None


Names = TypeVar("Names", str, tuple[str, ...])


def header_names(value: Names) -> Names:
    """--auth-header and --secret-header: header names (ASCII, no space, colon or control
    character), checked before anything runs."""
    for name in [value] if isinstance(value, str) else value:
        if not _header_name(name):
            raise ValueError(f"{name!r} is not a header name")
    return value


def rate_text(value: str | None) -> str | None:
    """--rate as given, once it reads as a rate (the library reads it again): N a second, or
    N/s, N/min, N/h; or auto."""
    if value is not None and value != "auto":
        parse_rate(value, name="rate")
    return value


def token_rate_text(value: str | None, name: str = "token_rate") -> str | None:
    """--token-rate (or a side's, the option ``name``) as given, once it reads as a rate: N a
    second, or N/s, N/min, N/h."""
    if value is not None:
        parse_rate(value, name=name)
    return value


# The answers ``retry_answers`` may name: an LLM answer's flaws, and one failing ``expect``.
AnswerRetried = Literal["truncated", "filtered", "invalid"]
_ANSWERS_RETRIED: tuple[AnswerRetried, ...] = ("truncated", "filtered", "invalid")


def answers_text(value: object) -> frozenset[AnswerRetried]:
    """--retry-answers (``"truncated,filtered"``) or ``retry_answers`` (names) as the names;
    ValueError naming the first that is none of them."""
    names = value.split(",") if isinstance(value, str) else value
    if not isinstance(names, Iterable):
        raise ValueError(f"must name answers to retry: {', '.join(_ANSWERS_RETRIED)}")
    chosen = {str(name).strip() for name in names} - {""}
    for name in sorted(chosen):
        if name not in _ANSWERS_RETRIED:
            raise ValueError(f"{name!r} is not one of {', '.join(_ANSWERS_RETRIED)}")
    return frozenset(name for name in _ANSWERS_RETRIED if name in chosen)


def cost_text(value: str | None) -> str | None:
    """--max-cost as given, once it reads as dollars (the library reads it again)."""
    if value is not None:
        dollars(value)
    return value


def prices_text(value: object) -> Prices | None:
    """--prices (a file) or ``prices=`` (a table, its fields, a file) as the table."""
    return None if value is None else Prices.of(value)


def statuses_text(value: str) -> str:
    """--retry-statuses as given, once it names statuses (the library reads it again). Blank
    is refused: an unset shell variable would turn off every status's retries; ``none``
    says so."""
    if not value.strip():
        raise ValueError("is empty: give the statuses, or none to retry no status")
    parse_statuses(value)
    return value


_BREAKER_FIELDS = (("ratio", float), ("window", int), ("min_calls", int), ("reset", float))
BREAKER_DEFAULT = ":".join(str(getattr(Breaker(), name)) for name, _ in _BREAKER_FIELDS)


def breaker_text(value: str) -> Breaker | None:
    """``off``, ``on`` (the defaults) or RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]], the fields
    left out taking their defaults."""
    if value == "off":
        return None
    parts = [] if value == "on" else value.split(":")
    try:
        if len(parts) > len(_BREAKER_FIELDS):
            raise ValueError(f"at most {len(_BREAKER_FIELDS)} fields")
        fields = zip(_BREAKER_FIELDS, parts, strict=False)
        return Breaker(**{name: kind(part) for (name, kind), part in fields})
    except ValueError as exc:
        raise ValueError(
            f"expected RATIO[:WINDOW[:MIN_CALLS[:SECONDS]]], on or off ({exc})"
        ) from None


def processes_text(value: object) -> int | str:
    """--processes: a count of at least 1 (text read as ``int`` reads it, as -c's), or auto
    (one per core)."""
    if isinstance(value, str) and value != "auto":
        with contextlib.suppress(ValueError):  # ("²" is a digit that int() refuses)
            value = int(value)
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"expected a number of processes of at least 1, or auto, got {value!r}")


def hedge_text(value: str | None) -> float | str | None:
    """--hedge-after: seconds, or p95."""
    if value is None or value == "p95":
        return value
    try:
        seconds = float(value)
    except ValueError:
        seconds = -1.0
    if not 0 < seconds <= MAX_SETTING_SECONDS:
        raise ValueError(
            f"expected a number of seconds above 0, or p95 (at most {MAX_SETTING_SECONDS} s)"
        )
    return seconds
