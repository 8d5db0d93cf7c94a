"""Record checks as data: each kind of record a table of field rules, one walker for them all.

A rule names a field, what its value must be (a type and its bounds, or a relation to the
record's other fields and to what the check knows, such as the input's size) and the problem
it states otherwise: named by the field, never by its value (a secret, say). The journal's
rows, the submissions table and the results files' records are checked so; a new check is a
rule in its record's table, not another branch of code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..core.kinds import KINDS

# What a check knows of a record: its fields, and what it is checked against.
Facts = Mapping[str, Any]
# Whether a field's value (``MISSING`` when the record lacks it) is right, given the facts.
Test = Callable[[Any, Facts], bool]

# A field the record does not have: no type test takes it.
MISSING: Any = object()
# The largest count (attempts, items, a pass, tokens) and the most seconds a record holds:
# far beyond any run, small enough that no sum of them overflows or loses its units.
MOST = 2**53
MOST_SECONDS = 1e9
# The unix seconds a record's times lie within (1970 to 2514).
LAST_MOMENT = 2.0**34


@dataclass(frozen=True, slots=True)
class Rule:
    """``key``'s value must pass ``test``; otherwise the problem is ``says``, formatted with
    the facts (``{size}``, ``{row[idx]}``)."""

    key: str
    test: Test
    says: str


def problem(rules: Iterable[Rule], facts: Facts) -> str | None:
    """The problem of the first rule the facts break, in the table's order, or None."""
    for rule in rules:
        if not rule.test(facts.get(rule.key, MISSING), facts):
            return rule.says.format_map(facts)
    return None


def first_problem(rules: Sequence[Rule], records: Iterable[Facts]) -> str | None:
    """The problem of the first of ``records`` (the facts of each) that breaks ``rules``."""
    return next(filter(None, (problem(rules, facts) for facts in records)), None)


def count(least: int = 0, most: int | str = MOST) -> Test:
    """An int (not a bool) from ``least`` to ``most``: a number, or the fact of that name."""

    def test(value: Any, facts: Facts) -> bool:
        top = facts[most] if isinstance(most, str) else most
        return type(value) is int and least <= value <= top

    return test


def number(least: float = 0.0, most: float = MOST_SECONDS) -> Test:
    """An int or a float (not a bool, not NaN, not infinite) from ``least`` to ``most``."""

    def test(value: Any, _: Facts) -> bool:
        real = type(value) is int or (type(value) is float and math.isfinite(value))
        return real and least <= value <= most

    return test


def optional(test: Test) -> Test:
    """None, or what ``test`` takes."""
    return lambda value, facts: value is None or test(value, facts)


def absent_or(test: Test) -> Test:
    """A field the record may lack; when it has it, what ``test`` takes."""
    return lambda value, facts: value is MISSING or test(value, facts)


def text(value: Any, _: Facts) -> bool:
    return isinstance(value, str)


def line(value: Any, _: Facts) -> bool:
    """One line of text."""
    return isinstance(value, str) and "\n" not in value and "\r" not in value


def boolean(value: Any, _: Facts) -> bool:
    return isinstance(value, bool)


def kind(value: Any, _: Facts) -> bool:
    """The name of an error kind."""
    return isinstance(value, str) and value in KINDS


def status(value: Any, _: Facts) -> bool:
    """None or an HTTP status."""
    return value is None or (type(value) is int and 100 <= value <= 999)


def present(value: Any, _: Facts) -> bool:
    return value is not MISSING


SECONDS = number()
DOLLARS = number()  # what a record says it spent
MOMENT = number(most=LAST_MOMENT)
EVER = number(-math.inf, math.inf)  # (any finite number)


def shaped(*rules: Rule, closed: bool = True) -> Test:
    """A mapping that breaks none of ``rules`` (a rule's key is there unless its test takes
    ``MISSING``); ``closed``: with no key they do not name."""
    keys = frozenset(rule.key for rule in rules)

    def test(value: Any, _: Facts) -> bool:
        if not isinstance(value, dict) or (closed and not value.keys() <= keys):
            return False
        return problem(rules, value) is None

    return test


def each(test: Test) -> Test:
    """A list whose every entry passes ``test``."""
    return lambda value, facts: isinstance(value, list) and all(test(v, facts) for v in value)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)
# A stored value no reader can take back: a text that is not UTF-8, or a JSON text that strict
# JSON is not.
UNREADABLE: Any = object()


def json_value(stored: object) -> Any:
    """The value of a stored JSON text; ``UNREADABLE`` for anything strict JSON is not."""
    if not isinstance(stored, str):
        return UNREADABLE
    try:
        return _DECODER.decode(stored)
    except (ValueError, RecursionError):
        return UNREADABLE


def json_of(test: Test) -> Test:
    """A JSON text (strict: no NaN) whose value passes ``test``."""
    return lambda value, facts: test(json_value(value), facts)
