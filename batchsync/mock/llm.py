"""A mock LLM API that limits requests and tokens per minute the way OpenAI and Anthropic do,
served by ``batchsync.mock.server`` under ``/llm/``: a batch can meet it without a key.

Its routes are ``ROUTES`` below (KEY is any name without a slash; each KEY has its own
limits, counters and random completion lengths, so every test and benchmark run gets a
state of its own).

LIMITS is ``name=value`` pairs joined by commas, any of them left out for its default, or
``-`` for all the defaults: ``rpm`` (requests a window, 500), ``tpm`` (tokens a window,
200000), ``itpm`` and ``otpm`` (Anthropic's input and output tokens a window, each ``tpm``
by default), ``window`` (seconds, 60: the period the counts hold over, the providers'
minute; a shorter one makes a test or a benchmark fast, and the resets announced say so,
never more than ``window`` ahead), ``latency`` (seconds before each answer, 0), ``refill``
(``window``, the default, ``oldest`` or ``bucket``: below) and ``retry_after`` (1, the
default, or 0); the knobs of the KEY's batches (``pace``, ``expire``, ``fail``,
``enqueued``, ``shuffle``, ``batch_rows``, ``batch_bytes``, ``stall_upload``,
``stall_create``, ``stall_results``: see batchsync.mock.batch) may be given among them. The
first request of a KEY sets its limits and knobs; a later one naming others is answered 400.
SDK base URLs: ``http://HOST:PORT/llm/KEY/LIMITS/v1`` for ``openai``,
``http://HOST:PORT/llm/KEY/LIMITS`` for ``anthropic``.

With ``refill=window`` (the default) the limits are enforced over a sliding window: what was
admitted in the last ``window`` seconds counts, each request and token leaving the window
``window`` seconds after it was counted. ``refill=oldest`` counts the same way but announces,
as its reset, when the window's OLDEST entry leaves (what some servers and gateways send), so
a reset frees only part of what was used. With ``refill=bucket`` each limit is a token bucket
instead: it starts full (``rpm`` requests, ``tpm`` tokens, ...), refills continuously at its
size / ``window`` a second up to its size, and admits a request only while it holds the
request's count; so a fresh bucket admits its whole size at once, and then its refill a
second. ``retry_after=0`` leaves the ``retry-after`` header off every 429, as OpenAI's often
are: only the rate-limit headers then say when.

The mock counts tokens its own way, deterministic and about as real tokenizers do:
a text is ceil(characters / 4) tokens, a chat message 4 more, a prompt 2 more. As the
services describe their limits:

* OpenAI counts a request when it admits it, at its prompt plus ``max_tokens`` (or
  ``max_completion_tokens``, 16 when neither is given) times ``n``; the tokens the answer
  really uses do not change the count.
* Anthropic counts the input tokens when it admits a request (against ``itpm`` and ``tpm``)
  and the output tokens when the answer is made (against ``otpm`` and ``tpm``); a request
  is admitted while some output budget is left. With ``refill=bucket`` the mock keeps it
  simple and counts Anthropic's requests as OpenAI's: prompt plus ``max_tokens`` at
  admission (against ``tpm``; the prompt against ``itpm``, ``max_tokens`` against ``otpm``),
  nothing when the answer is made.

A request over a limit is answered 429 with the provider's error body and a ``retry-after``
in whole seconds (rounded up) saying when it would fit; one larger than a whole limit is
answered 429 without ``retry-after``, as waiting cannot help. Refused requests count
nothing. Every answer, 200 or 429, carries the provider's headers:

* OpenAI: ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``, resets as Go durations
  (``6m0s``, ``1.5s``, ``20ms``) until the window would be empty again (with
  ``refill=bucket``: remaining is the bucket's level, floored, and reset the time until the
  bucket is full again, "until the rate limit resets to its initial state" as OpenAI says);
* Anthropic: ``anthropic-ratelimit-{requests,tokens,input-tokens,output-tokens}-{limit,
  remaining,reset}``, resets as RFC 3339 times (whole seconds, rounded up) and token counts
  remaining rounded to the nearest thousand, as Anthropic's are.

A completion is as long as a draw between 1 and ``max_tokens`` tokens (for each of ``n``
choices), the draw seeded by the KEY and the request's body (its JSON with the keys sorted):
a rerun gets the same lengths whatever order its requests arrive in, and a batch row
(batchsync.mock.batch) the same answer as the same body sent live. ``finish_reason`` is
``length`` (Anthropic's ``stop_reason`` ``max_tokens``) when the draw is the whole budget,
else ``stop`` (``end_turn``). Every 200 has ``usage``.

The stats are JSON: ``limits``; ``requests`` admitted, ``rejected`` (429s, the too large
among them) and ``too_large``; ``tokens`` counted against ``tpm``; ``prompt_tokens`` and
``completion_tokens`` answered; ``peak_tokens`` and ``peak_requests`` (the most tokens and
requests admitted that any sliding window of ``window`` seconds held, counted when admitted,
on arrival, and Anthropic's output when answered: in any refill mode, so a bucket's
opening burst plus its refill shows there); ``elapsed`` (seconds from the first request to
the last event) and ``windows``: for each window of ``window`` seconds from the first
request, its ``requests``, ``tokens`` and ``rejected``. With ``log=1`` also ``log``:
``[t, kind, tokens]`` for each event (seconds from the first request; kind ``admitted``,
``output`` or ``rejected``; a rejected request's tokens are what it asked).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import threading
import time
import uuid
from collections import deque
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any

DEFAULTS = {"rpm": 500.0, "tpm": 200_000.0, "window": 60.0, "latency": 0.0}
NAMES = {"rpm", "tpm", "itpm", "otpm", "window", "latency", "retry_after"}
# The knobs of the KEY's batches (batchsync.mock.batch), given among the limits: each value's
# range; a batch row never counts against the limits above.
BATCH_KNOBS = {
    "pace": (1e-3, math.inf),
    "expire": (0.0, 1.0),
    "fail": (0.0, 1.0),
    "enqueued": (0.0, math.inf),
    "shuffle": (0.0, 1.0),
    "batch_rows": (1.0, math.inf),
    "batch_bytes": (1.0, math.inf),
    "stall_upload": (0.0, 60.0),
    "stall_create": (0.0, 60.0),
    "stall_results": (0.0, 60.0),
}
# How the limits give back: a sliding window (the default) or a token bucket.
REFILLS = ("window", "bucket", "oldest")
DEFAULT_MAX_TOKENS = 16
WORDS = ["lorem", "ipsum", "dolor", "sit", "amet", "elit", "sed", "do", "tempor"]

COUNTS = [
    "requests",
    "rejected",
    "too_large",
    "tokens",
    "prompt_tokens",
    "completion_tokens",
    "peak_tokens",
    "peak_requests",
]

Reply = tuple[int, dict[str, Any], dict[str, str]]


@dataclass(frozen=True)
class Limits:
    """One KEY's limits, parsed from the path."""

    rpm: int
    tpm: int
    itpm: int
    otpm: int
    window: float
    latency: float
    refill: str = "window"
    retry_after: bool = True
    # (the batch knobs given, sorted by name: the KEY's batches read them)
    batch: tuple[tuple[str, float], ...] = ()

    def sizes(self) -> dict[str, int]:
        """Each sliding window's size: requests, tokens, input and output tokens."""
        return {"requests": self.rpm, "tokens": self.tpm, "input": self.itpm, "output": self.otpm}


def parse_limits(text: str) -> Limits:
    """``rpm=600,tpm=60000,window=6`` (or ``-``) into Limits; ValueError when malformed."""
    given: dict[str, float] = {}
    knobs: dict[str, float] = {}
    refill = "window"
    for pair in text.split(",") if text not in ("", "-") else []:
        name, equals, value = pair.partition("=")
        if name == "refill" and equals:
            if value not in REFILLS:
                raise ValueError(f"refill is one of {', '.join(REFILLS)}: {pair!r}")
            refill = value
            continue
        if name in BATCH_KNOBS and equals:
            low, high = BATCH_KNOBS[name]
            knobs[name] = float(value)
            if not low <= knobs[name] <= high:
                raise ValueError(f"{name} is between {low:g} and {high:g}: {pair!r}")
            continue
        if not equals or name not in NAMES:
            names = ", ".join(sorted(NAMES | {"refill"} | set(BATCH_KNOBS)))
            raise ValueError(f"not a limit: {pair!r} (names: {names})")
        given[name] = float(value)
    values = {**DEFAULTS, "retry_after": 1.0, **given}
    if min(values.values()) < 0 or values["window"] <= 0:
        raise ValueError(f"limits must be positive: {text!r}")
    if values["retry_after"] not in (0.0, 1.0):
        raise ValueError(f"retry_after is 1 or 0: {text!r}")
    tpm = int(values["tpm"])
    return Limits(
        rpm=int(values["rpm"]),
        tpm=tpm,
        itpm=int(given.get("itpm", tpm)),
        otpm=int(given.get("otpm", tpm)),
        window=values["window"],
        latency=values["latency"],
        refill=refill,
        retry_after=bool(values["retry_after"]),
        batch=tuple(sorted(knobs.items())),
    )


def text_tokens(text: str) -> int:
    """The mock's token count of a text: a token per 4 characters, begun ones counted."""
    return math.ceil(len(text) / 4)


def content_text(content: Any) -> str:
    """A message's text: a string, or the text parts of a list of content blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def prompt_tokens(messages: list[Any], system: Any = None) -> int:
    """A chat prompt's tokens: each message's text and 4 for the message, 2 for the prompt."""
    counted = 2 + (text_tokens(content_text(system)) if system else 0)
    for message in messages:
        text = content_text(message.get("content")) if isinstance(message, dict) else ""
        counted += 4 + text_tokens(text)
    return counted


def embedding_tokens(given: Any) -> int:
    """The tokens of an embeddings ``input``: a text or a list of texts."""
    texts = given if isinstance(given, list) else [given]
    return sum(text_tokens(str(text)) for text in texts)


def go_duration(seconds: float) -> str:
    """Seconds as Go prints a duration (``6m0s``, ``1.5s``, ``20ms``), to the millisecond,
    rounded up: OpenAI's reset headers."""
    millis = max(0, math.ceil(seconds * 1000 - 1e-6))
    if millis == 0:
        return "0s"
    if millis < 1000:
        return f"{millis}ms"
    hours, rest = divmod(millis, 3_600_000)
    minutes, rest = divmod(rest, 60_000)
    text = f"{rest / 1000:.3f}".rstrip("0").rstrip(".") + "s"
    if hours:
        return f"{hours}h{minutes}m{text}"
    return f"{minutes}m{text}" if minutes else text


def rfc3339(moment: float) -> str:
    """A Unix time as RFC 3339 in UTC, rounded up to the second: Anthropic's reset headers."""
    return datetime.fromtimestamp(math.ceil(moment), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def nearest_thousand(count: int) -> int:
    return math.floor(count / 1000 + 0.5) * 1000


class Window:
    """A sliding window: amounts counted at times, each leaving it ``span`` seconds later."""

    def __init__(self, span: float) -> None:
        self.span = span
        self.entries: deque[tuple[float, int]] = deque()
        self.total = 0

    def _expire(self, now: float) -> None:
        while self.entries and self.entries[0][0] <= now - self.span:
            self.total -= self.entries.popleft()[1]

    def used(self, now: float) -> int:
        self._expire(now)
        return self.total

    def add(self, now: float, amount: int) -> None:
        self._expire(now)
        if amount:
            self.entries.append((now, amount))
            self.total += amount

    def wait_for(self, now: float, amount: int, limit: int) -> float:
        """Seconds until ``amount`` more fits under ``limit`` (0: now; inf: never)."""
        self._expire(now)
        excess = self.total + amount - limit
        if excess <= 0:
            return 0.0
        if amount > limit:
            return math.inf
        for moment, counted in self.entries:
            excess -= counted
            if excess <= 0:
                return moment + self.span - now
        return math.inf  # (unreachable: the entries hold more than the excess)

    def reset_in(self, now: float) -> float:
        """Seconds until the window is empty again."""
        self._expire(now)
        return self.entries[-1][0] + self.span - now if self.entries else 0.0


class OldestFirst(Window):
    """A sliding window that announces, as its reset, when its oldest entry leaves: a reset
    that frees only part of what is used."""

    def reset_in(self, now: float) -> float:
        self._expire(now)
        return self.entries[0][0] + self.span - now if self.entries else 0.0


class Bucket:
    """A token bucket of ``size`` that starts full and refills in ``span`` seconds: the same
    questions as a ``Window``, answered the way a bucket server answers them."""

    def __init__(self, span: float, size: int) -> None:
        self.rate = size / span
        self.size = size
        self.level = float(size)
        self.at: float | None = None

    def _refill(self, now: float) -> None:
        if self.at is not None:
            self.level = min(self.size, self.level + (now - self.at) * self.rate)
        self.at = now

    def used(self, now: float) -> int:
        self._refill(now)
        return math.ceil(self.size - self.level)

    def add(self, now: float, amount: int) -> None:
        self._refill(now)
        self.level -= amount

    def wait_for(self, now: float, amount: int, limit: int) -> float:
        """Seconds until the bucket holds ``amount`` (0: now; inf: never)."""
        self._refill(now)
        if amount > limit:
            return math.inf
        return max(0.0, (amount - self.level) / self.rate)

    def reset_in(self, now: float) -> float:
        """Seconds until the bucket is full again."""
        self._refill(now)
        return (self.size - self.level) / self.rate


@dataclass
class Refusal:
    """Why a request was refused: the limit's name, its size, what was used, what the
    request asked and the seconds until it would fit (inf: never)."""

    limit: str
    size: int
    used: int
    requested: int
    wait: float


@dataclass
class Account:
    """One KEY: its limits, sliding windows (or buckets) and what it counted; ``held`` are
    sliding windows of requests and tokens whatever the refill, for the stats' peaks."""

    key: str
    limits: Limits
    lock: threading.Lock = field(default_factory=threading.Lock)
    windows: dict[str, Window | Bucket] = field(default_factory=dict)
    started: float | None = None
    events: list[tuple[float, str, int]] = field(default_factory=list)
    counts: dict[str, int] = field(default_factory=dict)
    held: dict[str, Window] = field(default_factory=dict)
    # The bodies (their JSON, keys sorted) answered 200 live, and how often: what the batch
    # stats compare with the rows the KEY's batches answered.
    answered_live: dict[str, int] = field(default_factory=dict)

    def __post_init__(self) -> None:
        span = self.limits.window
        for name, size in self.limits.sizes().items():
            refill = self.limits.refill
            self.windows[name] = (
                Bucket(span, size)
                if refill == "bucket"
                else OldestFirst(span)
                if refill == "oldest"
                else Window(span)
            )
        self.counts = dict.fromkeys(COUNTS, 0)
        self.held = {name: Window(self.limits.window) for name in ("requests", "tokens")}

    def _event(self, now: float, kind: str, tokens: int) -> None:
        if self.started is None:
            self.started = now
        self.events.append((now - self.started, kind, tokens))

    def admit(self, charges: dict[str, int]) -> Refusal | None:
        """Count one request charging ``charges`` (window name: tokens; an ``output`` of 0:
        some output budget must be left) if every limit has room; else count nothing and say
        which limit refused it."""
        sizes = self.limits.sizes()
        asked = {"requests": 1, **charges}
        with self.lock:
            now = time.monotonic()
            for name, amount in asked.items():
                window, size = self.windows[name], sizes[name]
                # (output is counted after the answer: admitted while any of it is left)
                need = max(amount, 1) if name == "output" else amount
                wait = window.wait_for(now, need, size)
                if wait > 0:
                    self.counts["rejected"] += 1
                    self.counts["too_large"] += wait == math.inf
                    self._event(now, "rejected", charges.get("tokens", 0))
                    return Refusal(name, size, window.used(now), need, wait)
            for name, amount in asked.items():
                self.windows[name].add(now, amount)
            self.counts["requests"] += 1
            self.held["requests"].add(now, 1)
            self.counts["peak_requests"] = max(
                self.counts["peak_requests"], self.held["requests"].used(now)
            )
            self._count_tokens(now, "admitted", charges.get("tokens", 0))
        return None

    def charge_output(self, tokens: int) -> None:
        """Count an answer's output tokens (Anthropic's way: when the answer is made)."""
        with self.lock:
            now = time.monotonic()
            self.windows["output"].add(now, tokens)
            self.windows["tokens"].add(now, tokens)
            self._count_tokens(now, "output", tokens)

    def _count_tokens(self, now: float, kind: str, tokens: int) -> None:
        self.counts["tokens"] += tokens
        self.held["tokens"].add(now, tokens)
        self.counts["peak_tokens"] = max(self.counts["peak_tokens"], self.held["tokens"].used(now))
        self._event(now, kind, tokens)

    def usage(self, prompt: int, completion: int) -> None:
        with self.lock:
            self.counts["prompt_tokens"] += prompt
            self.counts["completion_tokens"] += completion

    def state(self) -> dict[str, tuple[int, int, float]]:
        """Per window: (limit, remaining, seconds until it is empty again)."""
        sizes = self.limits.sizes()
        with self.lock:
            now = time.monotonic()
            return {
                name: (sizes[name], max(0, sizes[name] - window.used(now)), window.reset_in(now))
                for name, window in self.windows.items()
            }

    def stats(self, with_log: bool) -> dict[str, Any]:
        with self.lock:
            events = list(self.events)
            limits = asdict(self.limits)
            if not limits["batch"]:
                del limits["batch"]  # (the batch knobs, shown only when given)
            report: dict[str, Any] = {"limits": limits, **self.counts}
        span = self.limits.window
        count = int(events[-1][0] // span) + 1 if events else 0
        windows = [
            {"start": n * span, "requests": 0, "tokens": 0, "rejected": 0} for n in range(count)
        ]
        for moment, kind, tokens in events:
            window = windows[int(moment // span)]
            if kind == "rejected":
                window["rejected"] += 1
            else:
                window["tokens"] += tokens
                window["requests"] += kind == "admitted"
        report["elapsed"] = events[-1][0] if events else 0.0
        report["windows"] = windows
        if with_log:
            report["log"] = [list(event) for event in events]
        return report


def openai_headers(state: dict[str, tuple[int, int, float]]) -> dict[str, str]:
    headers = {}
    for name in ("requests", "tokens"):
        limit, remaining, reset = state[name]
        headers[f"x-ratelimit-limit-{name}"] = str(limit)
        headers[f"x-ratelimit-remaining-{name}"] = str(remaining)
        headers[f"x-ratelimit-reset-{name}"] = go_duration(reset)
    return headers


def anthropic_headers(state: dict[str, tuple[int, int, float]]) -> dict[str, str]:
    headers, now = {}, time.time()
    for name, label in (
        ("requests", "requests"),
        ("tokens", "tokens"),
        ("input", "input-tokens"),
        ("output", "output-tokens"),
    ):
        limit, remaining, reset = state[name]
        shown = remaining if name == "requests" else nearest_thousand(remaining)
        headers[f"anthropic-ratelimit-{label}-limit"] = str(limit)
        headers[f"anthropic-ratelimit-{label}-remaining"] = str(shown)
        headers[f"anthropic-ratelimit-{label}-reset"] = rfc3339(now + reset)
    return headers


def retry_after(refusal: Refusal, limits: Limits) -> dict[str, str]:
    """``retry-after`` in whole seconds, rounded up; none when waiting cannot help, or when the
    limits say to send none (``retry_after=0``: only the rate-limit headers say when)."""
    if refusal.wait == math.inf or not limits.retry_after:
        return {}
    return {"retry-after": str(max(1, math.ceil(refusal.wait)))}


OPENAI_LIMIT_NAMES = {"requests": "requests per min (RPM)", "tokens": "tokens per min (TPM)"}
ANTHROPIC_LIMIT_NAMES = {
    "requests": "requests",
    "tokens": "tokens",
    "input": "input tokens",
    "output": "output tokens",
}


def openai_refusal(model: str, refusal: Refusal) -> dict[str, Any]:
    limit = OPENAI_LIMIT_NAMES[refusal.limit]
    if refusal.wait == math.inf:
        message = (
            f"Request too large for {model} in organization org-mock on {limit}: Limit "
            f"{refusal.size}, Requested {refusal.requested}. The input or output tokens must "
            "be reduced in order to run successfully."
        )
    else:
        message = (
            f"Rate limit reached for {model} in organization org-mock on {limit}: Limit "
            f"{refusal.size}, Used {refusal.used}, Requested {refusal.requested}. Please try "
            f"again in {go_duration(refusal.wait)}."
        )
    return {
        "error": {
            "message": message,
            "type": refusal.limit,
            "param": None,
            "code": "rate_limit_exceeded",
        }
    }


def anthropic_refusal(refusal: Refusal, window: float) -> dict[str, Any]:
    limit = ANTHROPIC_LIMIT_NAMES[refusal.limit]
    period = "minute" if window == 60 else f"{window:g} s"  # (the window it counts over)
    message = (
        f"This request would exceed the mock's rate limit of {refusal.size:,} {limit} per "
        f"{period} (used {refusal.used:,}, requested {refusal.requested:,}). See the response "
        "headers for current usage; reduce the prompt or max_tokens, or try again later."
    )
    return {"type": "error", "error": {"type": "rate_limit_error", "message": message}}


def openai_invalid(message: str) -> Reply:
    error = {"message": message, "type": "invalid_request_error", "param": None, "code": None}
    return 400, {"error": error}, {}


def anthropic_invalid(message: str) -> Reply:
    error = {"type": "invalid_request_error", "message": message}
    return 400, {"type": "error", "error": error}, {}


def completion_text(tokens: int) -> str:
    """A text the mock counts as ``tokens`` tokens (words of about 4 characters)."""
    words = (WORDS[n % len(WORDS)] for n in range(tokens))
    return " ".join(words)[: tokens * 4].rstrip() or "."


class LLMMock:
    """Every KEY's account, and the answers of the ``/llm/`` routes."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._accounts: dict[str, Account] = {}

    def answer(self, method: str, path: str, query: dict[str, str], body: bytes) -> Reply:
        """The status, JSON payload and headers for a request to ``/llm/...``."""
        parts = path.strip("/").split("/")
        if len(parts) == 3 and parts[2] == "stats" and method == "GET":
            account = self._accounts.get(parts[1])
            if account is None:
                return 404, {"error": f"no requests for key {parts[1]!r} yet"}, {}
            return 200, account.stats(with_log=query.get("log") == "1"), {}
        route = "/".join(parts[3:])
        if len(parts) < 5 or method != "POST" or route not in ROUTES:
            return 404, {"error": f"no route {path} for {method}"}, {}
        try:
            account = self.account(parts[1], parse_limits(parts[2]))
        except ValueError as problem:
            return 400, {"error": {"message": str(problem), "type": "invalid_request_error"}}, {}
        try:
            request = json.loads(body or b"{}")
        except ValueError:
            request = None
        invalid = openai_invalid if route != "v1/messages" else anthropic_invalid
        if not isinstance(request, dict):
            return invalid("the body must be a JSON object")
        reply = ROUTES[route][0](account, request, body_seed(account.key, request))
        if reply[0] == 200:
            text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
            with account.lock:
                account.answered_live[text] = account.answered_live.get(text, 0) + 1
        return reply

    def answered_live(self, key: str) -> dict[str, int]:
        """The bodies KEY's live routes answered 200, and how often (none: no request yet)."""
        account = self._accounts.get(key)
        if account is None:
            return {}
        with account.lock:
            return dict(account.answered_live)

    def account(self, key: str, limits: Limits) -> Account:
        """KEY's account, made with ``limits`` by its first request; a ValueError when an
        earlier request of KEY named other limits (or batch knobs)."""
        with self._lock:
            account = self._accounts.setdefault(key, Account(key, limits))
        if account.limits != limits:
            raise ValueError(f"key {key!r} already has the limits {asdict(account.limits)}")
        return account


def max_tokens_of(request: dict[str, Any]) -> int | None:
    given = request.get("max_completion_tokens", request.get("max_tokens", DEFAULT_MAX_TOKENS))
    return given if isinstance(given, int) and given > 0 else None


def body_seed(key: str, request: dict[str, Any]) -> random.Random:
    """The draws of one answer, seeded by the KEY and the body's JSON with its keys sorted: the
    same body gets the same lengths live and as a batch row, whatever its bytes looked like."""
    text = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return random.Random(f"{key}\n{hashlib.sha256(text.encode()).hexdigest()}")


def chat_cost(request: dict[str, Any]) -> int | Reply:
    """A chat request's tokens as OpenAI counts them at admission, or its 400."""
    messages, budget, choices = request.get("messages"), max_tokens_of(request), request.get("n", 1)
    if not isinstance(messages, list) or not messages:
        return openai_invalid("'messages' must be a non-empty list")
    if budget is None or not isinstance(choices, int) or choices < 1:
        return openai_invalid("'max_tokens' and 'n' must be positive integers")
    return prompt_tokens(messages) + budget * choices


def chat_answer(request: dict[str, Any], seed: random.Random) -> dict[str, Any]:
    """The body of a chat completion of a valid request (``chat_cost`` said so), limits aside."""
    model, budget = str(request.get("model", "mock")), max_tokens_of(request) or DEFAULT_MAX_TOKENS
    prompt = prompt_tokens(request["messages"])
    lengths = [seed.randint(1, budget) for _ in range(request.get("n", 1))]
    return {
        "id": f"chatcmpl-{uuid.uuid4().hex[:24]}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": n,
                "message": {"role": "assistant", "content": completion_text(length)},
                "finish_reason": "length" if length == budget else "stop",
            }
            for n, length in enumerate(lengths)
        ],
        "usage": {
            "prompt_tokens": prompt,
            "completion_tokens": sum(lengths),
            "total_tokens": prompt + sum(lengths),
        },
    }


def openai_admission(
    account: Account, model: str, tokens: int
) -> tuple[dict[str, str], Reply | None]:
    """An OpenAI request of ``tokens`` admitted by the KEY's limits (after its latency): the
    answer's rate-limit headers, and the 429 when it is refused."""
    refusal = account.admit({"tokens": tokens})
    headers = openai_headers(account.state())
    if refusal is not None:
        retry = retry_after(refusal, account.limits)
        return headers, (429, openai_refusal(model, refusal), {**headers, **retry})
    time.sleep(account.limits.latency)
    return headers, None


def chat_completion(account: Account, request: dict[str, Any], seed: random.Random) -> Reply:
    model = str(request.get("model", "mock"))
    cost = chat_cost(request)
    if not isinstance(cost, int):
        return cost
    headers, refused = openai_admission(account, model, cost)
    if refused is not None:
        return refused
    answer = chat_answer(request, seed)
    account.usage(answer["usage"]["prompt_tokens"], answer["usage"]["completion_tokens"])
    return 200, answer, {**headers, "x-request-id": f"req_{uuid.uuid4().hex[:24]}"}


def embeddings_cost(request: dict[str, Any]) -> int | Reply:
    """An embeddings request's tokens (its input's), or its 400."""
    given = request.get("input")
    if not given or not isinstance(given, str | list):
        return openai_invalid("'input' must be a text or a non-empty list of texts")
    return embedding_tokens(given)


def embeddings_answer(request: dict[str, Any], seed: random.Random) -> dict[str, Any]:
    """The body of an embeddings answer to a valid request, limits aside."""
    given, model = request["input"], str(request.get("model", "mock-embedding"))
    texts = given if isinstance(given, list) else [given]
    prompt = embedding_tokens(texts)
    size = int(request.get("dimensions") or 8)
    data = [
        {
            "object": "embedding",
            "index": n,
            "embedding": [round(seed.uniform(-1, 1), 6) for _ in range(size)],
        }
        for n in range(len(texts))
    ]
    return {
        "object": "list",
        "data": data,
        "model": model,
        "usage": {"prompt_tokens": prompt, "total_tokens": prompt},
    }


def embeddings(account: Account, request: dict[str, Any], seed: random.Random) -> Reply:
    model = str(request.get("model", "mock-embedding"))
    prompt = embeddings_cost(request)
    if not isinstance(prompt, int):
        return prompt
    headers, refused = openai_admission(account, model, prompt)
    if refused is not None:
        return refused
    account.usage(prompt, 0)
    return 200, embeddings_answer(request, seed), headers


def responses_cost(request: dict[str, Any]) -> int | Reply:
    """A Responses API request's tokens at admission (its input's and its output limit), or
    its 400."""
    given, budget = request.get("input"), request.get("max_output_tokens", 16)
    if not isinstance(budget, int) or budget < 1:
        return openai_invalid("'max_output_tokens' must be a positive integer")
    if isinstance(given, str) and given:
        return text_tokens(given) + budget
    if isinstance(given, list) and given:
        return prompt_tokens(given) + budget
    return openai_invalid("'input' must be a text or a non-empty list of messages")


def responses_answer(request: dict[str, Any], seed: random.Random) -> dict[str, Any]:
    """The body of a response to a valid request, limits aside."""
    given, budget = request["input"], int(request.get("max_output_tokens", 16))
    prompt = text_tokens(given) if isinstance(given, str) else prompt_tokens(given)
    length = seed.randint(1, budget)
    text = {"type": "output_text", "text": completion_text(length), "annotations": []}
    message = {
        "type": "message", "id": f"msg_{uuid.uuid4().hex[:24]}", "status": "completed",
        "role": "assistant", "content": [text],
    }  # fmt: skip
    return {
        "id": f"resp_{uuid.uuid4().hex[:24]}",
        "object": "response",
        "created_at": int(time.time()),
        "status": "completed" if length < budget else "incomplete",
        "model": str(request.get("model", "mock")),
        "output": [message],
        "usage": {"input_tokens": prompt, "output_tokens": length, "total_tokens": prompt + length},
    }


def responses(account: Account, request: dict[str, Any], seed: random.Random) -> Reply:
    cost = responses_cost(request)
    if not isinstance(cost, int):
        return cost
    headers, refused = openai_admission(account, str(request.get("model", "mock")), cost)
    if refused is not None:
        return refused
    answer = responses_answer(request, seed)
    account.usage(answer["usage"]["input_tokens"], answer["usage"]["output_tokens"])
    return 200, answer, headers


# The categories a moderation answers for (none of them flagged by the mock).
CATEGORIES = ("harassment", "hate", "self-harm", "sexual", "violence")


def moderations_cost(request: dict[str, Any]) -> int | Reply:
    """A moderation request's tokens (its input's), or its 400."""
    given = request.get("input")
    if not given or not isinstance(given, str | list):
        return openai_invalid("'input' must be a text or a non-empty list of texts")
    return embedding_tokens(given)


def moderations_answer(request: dict[str, Any], seed: random.Random) -> dict[str, Any]:
    given = request["input"]
    texts = given if isinstance(given, list) else [given]
    result = {
        "flagged": False,
        "categories": dict.fromkeys(CATEGORIES, False),
        "category_scores": {name: round(seed.random() / 100, 6) for name in CATEGORIES},
    }
    return {
        "id": f"modr-{uuid.uuid4().hex[:24]}",
        "model": str(request.get("model", "omni-moderation-latest")),
        "results": [result for _ in texts],
    }


def moderations(account: Account, request: dict[str, Any], seed: random.Random) -> Reply:
    cost = moderations_cost(request)
    if not isinstance(cost, int):
        return cost
    model = str(request.get("model", "omni-moderation-latest"))
    headers, refused = openai_admission(account, model, cost)
    if refused is not None:
        return refused
    account.usage(cost, 0)
    return 200, moderations_answer(request, seed), headers


def messages_invalid(request: dict[str, Any]) -> Reply | None:
    """A messages request's 400, or None when it is valid."""
    given, budget = request.get("messages"), request.get("max_tokens")
    if not isinstance(given, list) or not given:
        return anthropic_invalid("messages: a non-empty list is required")
    if not isinstance(budget, int) or budget < 1:
        return anthropic_invalid("max_tokens: a positive integer is required")
    return None


def messages_answer(request: dict[str, Any], seed: random.Random) -> dict[str, Any]:
    """The body of a message answering a valid request, limits aside."""
    model, budget = str(request.get("model", "mock")), int(request["max_tokens"])
    prompt = prompt_tokens(request["messages"], request.get("system"))
    length = seed.randint(1, budget)
    return {
        "id": f"msg_{uuid.uuid4().hex[:24]}",
        "type": "message",
        "role": "assistant",
        "content": [{"type": "text", "text": completion_text(length)}],
        "model": model,
        "stop_reason": "max_tokens" if length == budget else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": prompt, "output_tokens": length},
    }


def messages(account: Account, request: dict[str, Any], seed: random.Random) -> Reply:
    invalid = messages_invalid(request)
    if invalid is not None:
        return invalid
    prompt, budget = (
        prompt_tokens(request["messages"], request.get("system")),
        request["max_tokens"],
    )
    bucket = account.limits.refill == "bucket"
    # (in bucket mode counted as OpenAI counts: prompt plus max_tokens at admission)
    charges = (
        {"tokens": prompt + budget, "input": prompt, "output": budget}
        if bucket
        else {"tokens": prompt, "input": prompt, "output": 0}
    )
    refusal = account.admit(charges)
    if refusal is not None:
        headers = anthropic_headers(account.state())
        wait = retry_after(refusal, account.limits)
        return 429, anthropic_refusal(refusal, account.limits.window), {**headers, **wait}
    time.sleep(account.limits.latency)
    answer = messages_answer(request, seed)
    length = answer["usage"]["output_tokens"]
    if not bucket:
        account.charge_output(length)
    account.usage(prompt, length)
    headers = anthropic_headers(account.state())
    return 200, answer, {**headers, "request-id": f"req_{uuid.uuid4().hex[:24]}"}


def unlimited_answer(route: str, request: dict[str, Any], key: str) -> Reply:
    """What ``route`` answers ``request`` on KEY with no limit counted (a batch's row): the
    same body a live request gets, or the same 400."""
    seed = body_seed(key, request)
    if route == "v1/chat/completions":
        cost = chat_cost(request)
        return cost if not isinstance(cost, int) else (200, chat_answer(request, seed), {})
    if route == "v1/embeddings":
        cost = embeddings_cost(request)
        return cost if not isinstance(cost, int) else (200, embeddings_answer(request, seed), {})
    if route == "v1/messages":
        invalid = messages_invalid(request)
        return invalid or (200, messages_answer(request, seed), {})
    if route in _OTHERS:
        cost_of, answer_of = _OTHERS[route]
        cost = cost_of(request)
        return cost if not isinstance(cost, int) else (200, answer_of(request, seed), {})
    return openai_invalid(f"the mock does not answer /{route}")


# The OpenAI routes besides chat and embeddings: what each costs, and its answer.
_OTHERS = {
    "v1/responses": (responses_cost, responses_answer),
    "v1/moderations": (moderations_cost, moderations_answer),
}


# The live routes under ``/llm/KEY/LIMITS/``: each one's answer, and what ``--help`` says of it.
ROUTES: dict[str, tuple[Callable[[Account, dict[str, Any], random.Random], Reply], str]] = {
    "v1/chat/completions": (chat_completion, "OpenAI's chat completion."),
    "v1/embeddings": (embeddings, "OpenAI's embeddings."),
    "v1/responses": (
        responses,
        "OpenAI's Responses API (input a text or messages, max_output_tokens, 16 if none).",
    ),
    "v1/moderations": (moderations, "OpenAI's moderations (nothing is flagged)."),
    "v1/messages": (messages, "Anthropic's messages."),
}
ROUTES_HELP = (
    *((f"POST /llm/KEY/LIMITS/{route}", does) for route, (_, does) in ROUTES.items()),
    (
        "GET /llm/KEY/stats?log=1",
        "JSON: what the KEY's limits counted, window by window (with log=1 each event).",
    ),
)
