"""What one attempt came to, in terms any job can give and the engine acts on.

Nothing here knows of HTTP: a job (the HTTP one in ``jobs.fetch``, a callable's in
``jobs.calls``) makes its Verdicts with these constructors, and says through ``Feedback`` what
an attempt tells the limits about the host it went to.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

Ruling = Literal["success", "retry", "terminal"]

# By line: what an attempt met, what an LLM answer said of itself, what ended an item before
# its next one, a callable's own failure, how a batch endpoint ended a row (``kinds.KINDS``
# says what each one means).
ErrorKind = Literal[
    "status", "timeout", "connection", "invalid_body", "invalid_request", "redirect", "tls",
    "truncated", "filtered",
    "budget", "deadline", "circuit_open", "cancelled", "cost",
    "exception",
    "batch_expired", "batch_cancelled", "batch_errored",
]  # fmt: skip


# An LLM answer's input, output and total tokens, each None when it does not say them.
Usage = tuple[int | None, int | None, int | None]
# What a token budget counts: all of a request's tokens, or only its input's or its output's.
TokenSide = Literal["tokens", "input", "output"]
# What a provider's headers told of one budget: what is left, seconds to its reset, its size.
Told = tuple[int | None, float | None, int | None]


@dataclass(frozen=True)
class Announced:
    """What one answer's headers say of the provider's limits; any part None when not said.

    The resets are seconds from the answer until that budget is full again (OpenAI) or resets
    (Anthropic); ``retry_after`` is Azure's millisecond wait, in seconds.
    """

    requests_limit: int | None = None
    requests_remaining: int | None = None
    requests_reset: float | None = None
    tokens_limit: int | None = None
    tokens_remaining: int | None = None
    tokens_reset: float | None = None
    retry_after: float | None = None
    # The limit headers that were sent but cannot be a count (-1, text, hundreds of digits).
    unreadable: tuple[str, ...] = ()
    # Anthropic's input and output tokens, budgets of their own beside its requests.
    input_tokens_limit: int | None = None
    input_tokens_remaining: int | None = None
    input_tokens_reset: float | None = None
    output_tokens_limit: int | None = None
    output_tokens_remaining: int | None = None
    output_tokens_reset: float | None = None

    def budgets(self) -> tuple[tuple[TokenSide | Literal["requests"], Told], ...]:
        """Each budget's name with what was told of it: (remaining, reset, limit)."""
        return (
            ("requests", (self.requests_remaining, self.requests_reset, self.requests_limit)),
            ("tokens", (self.tokens_remaining, self.tokens_reset, self.tokens_limit)),
            (
                "input",
                (self.input_tokens_remaining, self.input_tokens_reset, self.input_tokens_limit),
            ),
            (
                "output",
                (self.output_tokens_remaining, self.output_tokens_reset, self.output_tokens_limit),
            ),
        )


@dataclass(slots=True)  # built per attempt, never changed (frozen would cost 6x to build)
class Verdict:
    """The outcome of one attempt, as the engine needs to see it.

    ``facts`` is the job's own record of what the attempt met (the HTTP job's: the status,
    where the answer came from, what its headers said), carried by the engine as it is and
    read back by the job; of it the engine reads only what a Result reports
    (``result.Answer``).
    """

    outcome: Ruling
    error_kind: ErrorKind | None = None
    error: str | None = None
    facts: Any = None
    data: Any = None
    retry_after: float | None = None
    hedged: bool = False
    # Requests sent again within this attempt (each after renewing a refused token).
    resent: int = 0
    # Bytes of the body read (after decompression): an item's pages are bounded in total.
    size: int = 0
    # It may be sent again whatever its method: the server did not act on it (a 429) or said
    # to try again, or the caller asked for another answer (``retry_answers``). Retried as
    # often as any attempt, even on a route not retried for fear of acting twice (a POST).
    resendable: bool = False

    @property
    def ok(self) -> bool:
        return self.outcome == "success"


def success(data: Any, facts: Any = None) -> Verdict:
    return Verdict("success", facts=facts, data=data)


def terminal(kind: ErrorKind, error: str, facts: Any = None) -> Verdict:
    return Verdict("terminal", kind, error, facts)


def retry(
    kind: ErrorKind, error: str, facts: Any = None, retry_after: float | None = None
) -> Verdict:
    return Verdict("retry", kind, error, facts, retry_after=retry_after)


class InvalidItem(ValueError):
    """An item that cannot be run at all (it ends ``kind``, with no attempt)."""

    kind: ErrorKind = "invalid_request"


class Retryable(Exception):
    """Raise from a ``run_all`` callable to have the item retried.

    ``retry_after`` (seconds, or the datetime to wait until) is a floor under the next wait,
    like an HTTP Retry-After.
    """

    def __init__(self, message: str = "", retry_after: float | datetime | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@dataclass(frozen=True, slots=True)
class Feedback:
    """What an attempt tells the limits of the host it went to."""

    congested: bool = False  # the host says it is overloaded (the adaptive limit backs off)
    unwell: bool | None = None  # True: a failure the breaker counts; False: an answer; None: not
    hold: float | None = None  # seconds the host asked every caller to wait (the shared cooldown)
    quota: float | None = None  # seconds until the host's quota resets, none being left (as hold)
    announced: Announced | None = None  # the provider's limits its headers announced (left, when)
    used: int | None = None  # what the answer says it cost (an LLM answer's ``usage``, in tokens)
    usage: Usage | None = None  # the same by side, under a spend cap or a budget of one side

    def used_of(self, side: TokenSide) -> int | None:
        """What the answer says it used of ``side``'s tokens (None: it does not say)."""
        if side == "tokens":
            return self.used
        return None if self.usage is None else self.usage[side == "output"]
