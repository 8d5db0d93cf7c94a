"""What an HTTP attempt met, in the HTTP job's own record: the engine carries it opaque in
``Verdict.facts`` and reads off it only what a Result reports (``result.Answer``)."""

from __future__ import annotations

from typing import NamedTuple

from ..core.verdict import Announced, Usage, Verdict


class HttpFacts(NamedTuple):
    """The status of an answer (or the one an exception carried), where the answer came from
    after redirects (already masked) and how many, seconds until the host's quota resets when
    its headers said none is left, and its Link header (kept when items are paged by links).

    A tuple: built once per attempt, never changed."""

    status_code: int | None = None
    final_url: str | None = None
    redirects: int = 0
    quota: float | None = None
    link: str | None = None
    # The provider's rate-limit headers, the tokens its answer says it used, and, under a
    # spend cap, what its usage says by side (``limits.spend.NOTHING``: an error's, unbilled).
    announced: Announced | None = None
    used: int | None = None
    usage: Usage | None = None


NO_FACTS = HttpFacts()


def facts_of(verdict: Verdict) -> HttpFacts:
    """The HTTP facts a Verdict carries (none: an attempt that met no answer)."""
    facts = verdict.facts
    return facts if isinstance(facts, HttpFacts) else NO_FACTS


def facts_of_status(code: int | None) -> HttpFacts | None:
    """The facts of a status alone (None for no status)."""
    return None if code is None else HttpFacts(code)
