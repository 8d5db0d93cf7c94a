"""The retry decision after each attempt, as one pure function (like urllib3's
``Retry.increment``): given what the attempt came to and where the item stands, try again
after a wait, or end the route, with which kind and which error line.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from .backoff import Backoff
from .budget import Allowance, Limit
from .kinds import KINDS
from .result import how_many
from .verdict import Verdict


@dataclass(slots=True)  # made per attempt, never changed (frozen would cost 6x to build)
class Decision:
    """``wait`` seconds before the next attempt, or (``wait`` None) the route's end: its last
    Verdict (outcome ``retry`` only when the retries ran out) and its error line."""

    verdict: Verdict
    wait: float | None = None
    error: str = ""


@dataclass(slots=True)  # as Decision
class Attempted:
    """Where a route stands after its attempt number ``number``."""

    number: int
    max_attempts: int  # this route's (a route may allow fewer than ``attempts``)
    attempts: int  # the run's
    ended: float  # the clock when the attempt ended
    no_retry_reason: str | None = None  # why the route allows fewer attempts


def cut_short(verdict: Verdict, cut_by: Limit | None) -> Verdict:
    """A timeout of an attempt that the budget or the deadline bounded (``cut_by``) is that
    limit's final failure, not the server's slowness (a kind whose record says ``cut_short``)."""
    kind = verdict.error_kind
    if cut_by is None or kind is None or not KINDS[kind].cut_short:
        return verdict
    error = f"{verdict.error} (cut short by the {cut_by})"
    return replace(verdict, outcome="terminal", error_kind=cut_by, error=error)


def decide(
    verdict: Verdict, attempted: Attempted, backoff: Backoff, rand: float, allowance: Allowance
) -> Decision:
    """What follows an attempt (its verdict ``cut_short`` already): a success, a final
    failure or the last allowed attempt ends the route; a retryable failure waits ``backoff``
    (Retry-After a floor), unless that wait would pass the budget or the deadline, which then
    ends the route as ``budget`` / ``deadline``."""
    outcome = verdict.outcome
    if outcome == "success":
        return Decision(verdict, error=verdict.error or "")
    number = attempted.number
    limit = attempted.attempts if verdict.resendable else attempted.max_attempts
    if outcome != "retry" or number >= limit:
        return Decision(verdict, error=_final_error(verdict, attempted))
    wait = backoff.wait(number, verdict.retry_after, rand)
    refused = allowance.refuses_wait(wait, attempted.ended)
    if refused is not None:
        return Decision(
            replace(verdict, outcome="terminal", error_kind=refused),
            error=f"{verdict.error} after {plural(number)}; the next try in {wait:.2f} s would "
            f"pass the {refused}",
        )
    return Decision(verdict, wait=wait)


def _final_error(verdict: Verdict, attempted: Attempted) -> str:
    """The error line of a failed route."""
    error = verdict.error or ""
    number = attempted.number
    # (a 429 is retried as often as any attempt: the route's own limit did not stop it)
    limited = attempted.max_attempts < attempted.attempts and not verdict.resendable
    if verdict.outcome == "retry" and limited and attempted.no_retry_reason:
        return f"{error} after {plural(number)} ({attempted.no_retry_reason})"
    if verdict.outcome == "retry" or number > 1:
        return f"{error} after {plural(number)}"
    return error


def plural(count: int) -> str:
    return how_many(count, "attempt")
