"""The tokens a host's rate-limit headers say are left, kept per host between its answers, so
that an attempt waits before it would overdraw them rather than after a 429.

Each answer that tells them (``provider.Announced``: OpenAI's ``x-ratelimit-*-tokens``,
Anthropic's ``anthropic-ratelimit-tokens-*``) sets the host's count anew, less what attempts
sent after the answered one took (the answer could not count those yet). Between answers the
count comes back at the pace the provider's reset implies: all its tokens by the reset, evenly,
as the token buckets OpenAI and Anthropic describe. Each attempt takes its cost (its
``Admission.cost``) from the count, waiting first for what is missing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

from .provider import Announced


@dataclass
class _Count:
    """A host's tokens as last told, and since when they come back at ``pace`` a second."""

    left: float
    pace: float
    limit: float
    at: float
    taken: int = 0  # by every attempt on the host since the count began (see ``told``)


class AnnouncedTokens:
    """Per host: the tokens left, as its headers last said and its attempts took since."""

    def __init__(self, clock: Callable[[], float]) -> None:
        self._clock = clock
        self._hosts: dict[str, _Count] = {}
        self._lock = threading.Lock()

    def take(self, host: str, cost: int) -> tuple[float, int]:
        """Take ``cost`` tokens of the host's; the seconds to wait first for the missing ones
        (0 when the host told nothing), and the mark of this taking (for ``told``)."""
        with self._lock:
            count = self._hosts.get(host)
            if count is None:
                return 0.0, 0
            now = self._clock()
            count.left = min(count.limit, count.left + (now - count.at) * count.pace)
            count.at = now
            count.left -= cost
            count.taken += cost
            wait = 0.0 if count.left >= 0 or count.pace <= 0 else -count.left / count.pace
            return wait, count.taken

    def give_back(self, host: str, cost: int) -> None:
        """Tokens taken by an attempt that was never sent."""
        with self._lock:
            count = self._hosts.get(host)
            if count is not None:
                count.left += cost

    def told(self, host: str, said: Announced, mark: int) -> None:
        """An answer to the attempt whose taking was ``mark`` said what is left: the host's
        count from now on, less what was taken after that attempt."""
        left, reset, limit = said.tokens_remaining, said.tokens_reset, said.tokens_limit
        if left is None or reset is None:
            return
        ceiling = float(limit if limit is not None and limit > left else left)
        pace = (ceiling - left) / reset if reset > 0 else 0.0
        if reset <= 0:  # all back already
            left = int(ceiling)
        with self._lock:
            count = self._hosts.get(host)
            since = 0 if count is None or mark == 0 else count.taken - mark
            taken = 0 if count is None else count.taken
            self._hosts[host] = _Count(left - since, pace, ceiling, self._clock(), taken)
