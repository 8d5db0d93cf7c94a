"""The provider's announced limits (``rate="auto"``): the requests and tokens a minute that
OpenAI's and Anthropic's rate-limit headers announce, each held as a window (``window``) sized
by the latest answer that tells it, following them as they change.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from ..core.admission import Admission
from ..core.clock import Clock
from ..core.verdict import Announced, ErrorKind, Feedback
from .gate import GateOption, Waiting
from .rates import Window
from .shared import SharedLimits, WindowLimiter
from .window import LocalWindow, enter

log = logging.getLogger("batchsync")
# The period of the limits a provider's headers announce: requests and tokens a minute.
ANNOUNCED_PERIOD = 60.0


@dataclass(frozen=True)
class AnnouncedRates(GateOption):
    """``rate="auto"``: the requests and tokens a minute a provider's headers announce (OpenAI's
    and Anthropic's limits), each a window sized by the latest answer that tells it; the
    tokens' only when the run has no ``token_rate`` of its own."""

    tokens: bool = True

    def gate(self, *, concurrency: int, shared: SharedLimits | None, clock: Clock) -> AnnouncedGate:
        def limiter(name: str) -> WindowLimiter:
            return LocalWindow(clock.now) if shared is None else shared.window(name)

        tokens = limiter("announced-tokens") if self.tokens else None
        return AnnouncedGate(limiter("announced-requests"), tokens)


class AnnouncedGate:
    """Passes every attempt until an answer announces the provider's limits, then holds them
    to windows of those (as ``rate`` and ``token_rate`` hold theirs): each answer that
    announces a limit sets its window, down at once and up as the answers say. A value that
    cannot be a limit (0, unreadable) is ignored, with one warning a host and header."""

    name = "announced"
    rank = 62
    recheck = False

    def __init__(self, requests: WindowLimiter, tokens: WindowLimiter | None) -> None:
        self._limiters = {"requests": requests, "tokens": tokens}
        self.windows: dict[str, Window] = {}
        self._warned: set[tuple[str, str]] = set()
        self._lock = threading.Lock()

    def admit(self, admission: Admission, waiting: Waiting) -> ErrorKind | None:
        for kind, amount in (("requests", 1), ("tokens", admission.cost)):
            limiter, window = self._limiters[kind], self.windows.get(kind)
            if limiter is None or window is None or amount <= 0:
                continue
            name, share = f"announced {kind}", min(amount, window.count)
            entry, refusal = enter(
                limiter, window, share, name=name, admission=admission, waiting=waiting
            )
            if entry is None:
                self.abandon(admission)
                return refusal
            admission.held[name] = entry
        return None

    def release(self, admission: Admission, feedback: Feedback) -> None:
        for kind, used in (("requests", None), ("tokens", feedback.used)):
            entry, limiter = admission.held.get(f"announced {kind}"), self._limiters[kind]
            if entry is not None and limiter is not None:
                limiter.finish(entry, used)
        if feedback.announced is not None:
            self._learn(admission.host, feedback.announced)

    def abandon(self, admission: Admission) -> None:
        for kind, limiter in self._limiters.items():
            entry = admission.held.pop(f"announced {kind}", None)
            if entry is not None and limiter is not None:
                limiter.cancel(entry)

    def _learn(self, host: str, said: Announced) -> None:
        for header in said.unreadable:
            self._warn(host, header, "an unreadable value")
        for kind, limit in (("requests", said.requests_limit), ("tokens", said.tokens_limit)):
            if limit is None or self._limiters[kind] is None:
                continue
            if limit <= 0:
                self._warn(host, kind, limit)
                continue
            window = Window(float(limit), ANNOUNCED_PERIOD)
            if self.windows.get(kind) != window:
                with self._lock:
                    self.windows[kind] = window

    def _warn(self, host: str, kind: str, value: object) -> None:
        with self._lock:
            if (host, kind) in self._warned:
                return
            self._warned.add((host, kind))
        log.warning(
            "%s announced a %s limit of %r, which cannot be a limit: ignored", host, kind, value
        )
