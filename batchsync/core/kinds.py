"""What each error kind means, in one table that every decision by kind reads.

A new kind is a name in ``verdict.ErrorKind``, its record here and the code that ends an
attempt with it; whether it is retried, what the breaker makes of it, whether a fallback may
follow it and whether a resumed run keeps it are read from ``KINDS``, nowhere else.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from .verdict import ErrorKind, Ruling, Verdict

# What the circuit breaker counts of an attempt ended so: a failure of the host, nothing (the
# attempt got no answer of the host's: a limit or a stop ended it), or what its answer says
# (a 5xx or a retry without Retry-After is a failure, anything else an answer).
Breaker = Literal["failure", "ignored", "answer"]
# Whether fallbacks may follow a route ended so: never (time is up, the run stops), always
# (the route could not be tried), or as its outcome says (retries ran out; any failure of a
# fallback).
Fallback = Literal["never", "always", "outcome"]


@dataclass(frozen=True, slots=True)
class Kind:
    """One error kind's meaning to the retry decision, the limits, fallbacks and resume."""

    retried: bool  # an attempt's failure of this kind is tried again, unless a policy says not
    breaker: Breaker
    fallback: Fallback
    final: bool = True  # False: a run resumed from the journal sends the item again
    asked: bool = True  # a caller's retry_if decides it (False: a limit's or a stop's end)
    congested: bool = False  # the host is slowing down (the adaptive limit backs off)
    cut_short: bool = False  # a budget or deadline that bounded the attempt ends it as theirs
    by_status: bool = False  # the attempt's status says what happened (the attempt log shows it)
    stopped: str = ""  # why a route ended before its next try (``{host}``: the route's host)
    unstarted: str = ""  # why an item was never sent


# One kind a record, a record a line where it fits (``fmt: skip``: the formatter would spread
# the longer ones one field a line). A status is retried as the caller's statuses say.
KINDS: dict[ErrorKind, Kind] = {
    "status": Kind(False, "answer", "outcome", by_status=True),
    "timeout": Kind(True, "failure", "outcome", congested=True, cut_short=True),
    "connection": Kind(True, "failure", "outcome"),
    "invalid_body": Kind(False, "answer", "outcome"),
    "invalid_request": Kind(False, "answer", "outcome"),
    "redirect": Kind(False, "answer", "outcome"),
    "tls": Kind(False, "answer", "outcome"),
    "budget": Kind(False, "ignored", "never", asked=False, stopped="no time left in the budget"),
    "deadline": Kind(
        False, "ignored", "never", asked=False, stopped="no time left before the deadline",
        unstarted="batch deadline passed before the item started",
    ),
    "circuit_open": Kind(
        False, "ignored", "always", asked=False, stopped="the circuit for {host} is open"
    ),
    "cancelled": Kind(
        False, "ignored", "never", final=False, asked=False,
        stopped="stopped before the next try", unstarted="batch stopped before the item started",
    ),
    # What the spend cap (``max_cost``) could not pay for: sent again by a retry of failures.
    "cost": Kind(False, "ignored", "never", asked=False,
                 stopped="the rest of max_cost cannot pay its worst case"),
    # An LLM answer cut short or filtered, that the caller asked to have again
    # (``retry_answers``): paid for, and tried again within the attempts.
    "truncated": Kind(True, "answer", "outcome"),
    "filtered": Kind(True, "answer", "outcome"),
    "exception": Kind(False, "answer", "outcome"),
    # A row sent through a provider's batch endpoint that the batch ended without running
    # (its window ran out, it was cancelled) or that it answered with an error of its own.
    "batch_expired": Kind(False, "ignored", "never", asked=False),
    "batch_cancelled": Kind(False, "ignored", "never", asked=False),
    "batch_errored": Kind(False, "answer", "never", asked=False),
}  # fmt: skip

# The kinds whose Result a resumed run does not keep (unless it holds where to go on).
NOT_FINAL: frozenset[str] = frozenset(name for name, kind in KINDS.items() if not kind.final)


def failed(
    kind: ErrorKind, error: str, facts: Any = None, retry_after: float | None = None
) -> Verdict:
    """An attempt's failure of ``kind``, retried or final as the kind's record says."""
    outcome: Ruling = "retry" if KINDS[kind].retried else "terminal"
    return Verdict(outcome, kind, error, facts, retry_after=retry_after)


def stopped_reason(kind: ErrorKind, host: str | None) -> str:
    """Why a route ended before its next try with ``kind``."""
    return KINDS[kind].stopped.format(host=host or "every call") or kind


def unstarted_reason(kind: ErrorKind) -> str:
    """Why an item ended with ``kind`` before it was sent."""
    return KINDS[kind].unstarted or kind


def may_fall_back(verdict: Verdict, primary: bool) -> bool:
    """Fallbacks follow a route that ran out of retries or met an open circuit; after the
    item's own route, never a final answer (a 404); never once time is up or the run stops."""
    fallback = "outcome" if verdict.error_kind is None else KINDS[verdict.error_kind].fallback
    if fallback != "outcome":
        return fallback == "always"
    return verdict.outcome == "retry" or not primary
