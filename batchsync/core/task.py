"""What the engine runs an item as: its Task, made of Routes, each an Attempt to repeat.

Jobs make these (``fetch`` for HTTP, ``calls`` for callables); the engine carries them and
observers are shown them.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import Any

from .admission import Price, Sides
from .result import Result
from .verdict import Verdict

# One attempt: given the instant (of the engine's monotonic clock) it must end by (None: no
# bound) and, on a fallback route, the Result the item has come to so far; says what came of it.
Attempt = Callable[[float | None, Result | None], Verdict]


@dataclass(slots=True)  # built per item, never changed (frozen would cost 6x to build)
class Route:
    """One way to an item's data: its own request, or a fallback tried after it.

    ``max_attempts`` lowers the batch's attempts on this route and ``no_retry_reason`` says
    why; ``host`` is the key of the per-host limits. An ungated route (a local fallback that
    calls no API) passes no rate, slot or breaker.
    """

    attempt: Attempt
    host: str | None = None
    max_attempts: int | None = None
    no_retry_reason: str | None = None
    gated: bool = True
    # A step of a longer item (a page of a paged one): after a success, the item's data so
    # far and the route of its next step (None when it was the last, a Verdict when the item
    # cannot go on); and where the item would start again from this step, kept when it stops
    # here (for ``Result.continuation``).
    then: Callable[[Verdict], tuple[Any, Route | Verdict | None]] | None = None
    continuation: Any = None


@dataclass(slots=True)  # built per item, never changed (frozen would cost 6x to build)
class Task:
    """An item made ready to run.

    ``route`` is the item's own request; ``fallbacks`` are tried in order after it has used
    up its retries on a retryable failure (never after a final one). Items whose
    ``dedup_key`` is equal and in flight together are sent once. ``subject`` is what
    ``on_attempt`` hooks are shown (the RequestSpec for HTTP). An item made of steps (pages)
    counts them from ``steps`` (those done before, by an earlier run; None when it has no
    steps) and starts from the ``data`` they gave. ``cost``: what each of its attempts takes
    from a weighted limit (see ``gates.Admission``).
    """

    url: str | None
    id: Any
    route: Route
    fallbacks: tuple[Route, ...] = ()
    dedup_key: Hashable | None = None
    subject: object = None
    steps: int | None = None
    data: Any = None
    # What each attempt weighs at a weighted limit (an LLM request's estimated tokens), what
    # it may cost under a spend cap, and its tokens by side when they are known apart.
    cost: int = 0
    price: Price | None = None
    sides: Sides | None = None
