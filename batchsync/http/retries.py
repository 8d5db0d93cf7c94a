"""Which failed HTTP attempts are tried again, as the caller sets it: the retryable statuses
(urllib3's ``Retry(status_forcelist=…)``) and a ``retry_if`` predicate. By default, the rule
of the design (408, 429 and 5xx; a timeout or a connection error) and each error kind's own
(``kinds.KINDS``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace

from ..core.kinds import KINDS
from ..core.verdict import ErrorKind, Verdict
from .httpfacts import facts_of

# The statuses retried unless the caller says otherwise, as ``retry_statuses`` writes them.
RETRY_STATUSES = "408,429,5xx"

# ``retry_if(status_code, error_kind)``: True retries a failed attempt, False ends its route,
# None leaves it to the statuses and the kind.
RetryIf = Callable[[int | None, ErrorKind], bool | None]

_PART = re.compile(r"([45])xx|(\d{3})(?:-(\d{3}))?")
_FAILURES = range(400, 600)


def parse_statuses(spec: str | Iterable[int]) -> frozenset[int]:
    """The statuses ``spec`` names: a text such as ``"429,502-504"`` or ``"408,429,5xx"``
    (``""`` or ``"none"``: no status), or the numbers themselves. ValueError for anything
    else, and for a status that is no failure (below 400: an answer, never retried)."""
    if not isinstance(spec, str):
        numbers = list(spec)
        for number in numbers:
            if isinstance(number, bool) or not isinstance(number, int):
                raise ValueError(f"a status is a number, not {number!r}")
        return _failures(numbers, str(numbers))
    if spec.strip().lower() in ("", "none"):
        return frozenset()
    found: list[int] = []
    for part in spec.split(","):
        found += _statuses_of_part(part.strip())
    return _failures(found, repr(spec))


def _statuses_of_part(part: str) -> range:
    """The statuses one comma-separated part names: ``429``, ``502-504`` or ``5xx``."""
    match = _PART.fullmatch(part)
    if match is None:
        raise ValueError(f"{part!r} is not a status, a range (502-504) or 4xx/5xx")
    family, first, last = match.groups()
    if family is not None:
        return range(int(family) * 100, int(family) * 100 + 100)
    if last is not None and int(last) < int(first):
        raise ValueError(f"{part!r}: a range goes from the lower status up")
    return range(int(first), int(last or first) + 1)


def _failures(numbers: list[int], shown: str) -> frozenset[int]:
    outside = [number for number in numbers if number not in _FAILURES]
    if outside:
        raise ValueError(f"{outside[0]} in {shown}: a retried status is 400 to 599")
    return frozenset(numbers)


RETRYABLE = parse_statuses(RETRY_STATUSES)


def judged(verdict: Verdict, retry_if: RetryIf) -> Verdict:
    """A failed attempt's Verdict as ``retry_if`` says (given its status and error kind):
    retried, final, or (None) as it was; asked only of kinds that are the attempt's own failure
    (``Kind.asked``: not a limit, a stop or a race lost to a hedge). A ``retry_if`` that
    raises, or answers anything but True, False or None, ends the route, saying so."""
    kind = verdict.error_kind
    if verdict.ok or kind is None or not KINDS[kind].asked:
        return verdict
    try:
        say = retry_if(facts_of(verdict).status_code, kind)
    except Exception as broken:
        error = f"{verdict.error} (retry_if raised {type(broken).__name__}: {broken})"
        return replace(verdict, outcome="terminal", error=error)
    unsaid = no_answer(retry_if, say)
    if unsaid is not None:
        return replace(verdict, outcome="terminal", error=f"{verdict.error} ({unsaid})")
    if say is None or (verdict.outcome == "retry") == bool(say):
        return verdict
    return replace(verdict, outcome="retry" if say else "terminal")


def no_answer(retry_if: Callable[..., object], said: object) -> str | None:
    """Why what ``retry_if`` returned is no answer, or None when it is one (True, False or
    None): taken by its truth, a "no" would retry. Names the function and the type it
    returned, never the value (it may hold a secret)."""
    if said is None or isinstance(said, bool):
        return None
    kind = type(said)
    shown = (
        kind.__qualname__
        if kind.__module__ == "builtins"
        else f"{kind.__module__}.{kind.__qualname__}"
    )
    name = getattr(retry_if, "__qualname__", None) or type(retry_if).__qualname__
    return f"retry_if {name} returned {shown}, not True, False or None"
