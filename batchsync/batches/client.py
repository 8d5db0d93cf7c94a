"""The calls a batch takes at the provider (upload, create, retrieve, list, cancel, download,
delete), each sent through the run's ``Transport`` (the one way out a live run's requests take:
the guard, TLS options, proxies, the watchdog, secrets kept to their origin), classified and
retried by the live attempts' own rules (``classify_status``, ``decide``, ``retry_statuses``,
``retry_if``; a Retry-After the deadline leaves no time for is not waited), and sent to the
endpoint's own origin only: no redirect is followed, and a results URL elsewhere is refused,
so the API key goes nowhere else.
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence, Set
from contextlib import AbstractContextManager, closing, suppress
from dataclasses import dataclass, field, replace
from email.utils import parsedate_to_datetime
from typing import IO, Any
from urllib.parse import urlsplit

import requests

from ..core.backoff import Backoff
from ..core.budget import Allowance
from ..core.decide import Attempted, decide
from ..core.redact import Secrets
from ..core.verdict import Verdict, terminal
from ..http.classify import SHOULD_RETRY, classify_http_exception, classify_status
from ..http.decode import InvalidBody, decode_body
from ..http.exchange import BodyTooLarge, Recipe, Reply
from ..http.guard import PrivateAddress
from ..http.quota import retry_after_of
from ..http.retries import RETRYABLE, RetryIf, judged
from ..http.transport import Transport
from ..store.submissions import well_formed
from .protocol import Endpoint, Files, Start, error_message, index_of, is_row_id
from .providers import provider_of

# The most pages of a provider's list read for one look (a list that goes on: refused).
_MOST_PAGES = 1000
# A results download's bound, if the deadline is not sooner (each read's: the timeout).
_DOWNLOAD_SECONDS = 3600.0
# The most a provider's answer to a control call may be (a batch object, a list of them).
_CONTROL_BYTES = 4 * 2**20
# How much of a line longer than max_bytes is kept, to read its custom_id.
_PREFIX = 4096
_CONFLICT = (
    "the batch's results list this row more than once, with different answers: none is taken"
)


class ProviderRefused(Exception):
    """A call the provider refused for good, or that ran out of tries (one line, secrets
    masked): ``status`` if one came, ``retryable`` whether trying later may help, no sooner
    than ``retry_after`` (the provider's Retry-After)."""

    def __init__(
        self,
        text: str,
        status: int | None = None,
        retryable: bool = False,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(text)
        self.status, self.retryable, self.retry_after = status, retryable, retry_after


class Stopped(Exception):
    """The run was stopped while a call waited to be tried again."""


@dataclass(frozen=True)
class Calls:
    """How each call is sent: the live run's headers (the API key), timeout, tries, backoff
    and retry policy, the largest results line, and what masks every text that leaves."""

    headers: Mapping[str, str]
    timeout: float
    attempts: int
    backoff: Backoff
    max_bytes: int
    secrets: Secrets
    retryable: frozenset[int] = RETRYABLE
    retry_if: RetryIf | None = None


@dataclass(frozen=True)
class Clocks:
    """What a run waits on and reads the time from: ``stop`` ends it (a wait, a download),
    ``ends`` is its deadline by ``clock`` (None: none), ``rand`` draws the jitter."""

    stop: threading.Event = field(default_factory=threading.Event)
    ends: float | None = None
    rand: Callable[[], float] = random.random
    unix_time: Callable[[], float] = time.time
    clock: Callable[[], float] = time.monotonic

    def pause(self, seconds: float) -> bool:
        """Wait ``seconds``; False when the run was stopped meanwhile."""
        return not self.stop.wait(max(0.0, seconds))

    def left(self) -> float | None:
        """Seconds to the deadline (None: there is none)."""
        return None if self.ends is None else self.ends - self.clock()

    def over(self) -> bool:
        """Whether the run must end now: it was stopped, or its deadline came."""
        left = self.left()
        return self.stop.is_set() or (left is not None and left < 0)


@dataclass
class Client:
    """One provider's batch calls for one endpoint (see the module docstring)."""

    endpoint: Endpoint
    transport: Transport
    calls: Calls
    clocks: Clocks = field(default_factory=Clocks)
    # How far the provider's clock is ahead of this one, from its last ``Date`` header
    # (None until one came): times the provider stamps are compared in its own clock.
    clock_offset: float | None = field(default=None, init=False)
    # The seconds the slowest call so far took to be answered (its headers).
    longest_call: float = field(default=0.0, init=False)

    def __post_init__(self) -> None:
        self.provider = provider_of(self.endpoint)
        self._batches = self.provider.batches_url(self.endpoint)
        self._files = f"{self.endpoint.base}/files" if self.provider.shape.uploads else None

    def refusal(self) -> str | None:
        """Why the endpoint's host may not be sent to (deny_private, as for a live row)."""
        guard = self.transport.guard
        try:
            if guard is not None:
                guard.check(urlsplit(self.endpoint.url).hostname or "")
        except PrivateAddress as exc:
            return str(exc)
        return None

    # --- submitting ----------------------------------------------------------------------------
    def upload(self, lines: Sequence[bytes], name: str) -> str:
        """The id of the rows uploaded as a JSONL file under ``name`` (the provider's Files
        API: one form, or a resumable upload's start then its bytes)."""
        content = b"".join(line + b"\n" for line in lines)
        provider, url = self.provider, self.provider.upload_url(self.endpoint)
        start = provider.upload_start(name, len(content))
        if start is None:
            form = {"file": (name, content, "application/jsonl")}
            answer = self._json(
                "POST", url, "upload the rows", data={"purpose": "batch"}, files=form
            )
        else:
            answer = self._resumed(url, start, content)
        file_id = well_formed(provider.name, "file", provider.file_id(answer))
        if file_id is None:
            raise ProviderRefused("the Files API answered without a file id")
        return file_id

    def _resumed(self, url: str, start: Start, content: bytes) -> Any:
        """A resumable upload: its start, answered with where its bytes go (on the endpoint's
        origin only), then the bytes in one call that finishes it."""
        headers, body, said = start
        with self._send("POST", url, "start the upload", headers=headers, data=body) as answer:
            assert answer.reply is not None
            where = answer.reply.headers.get(said)
        if not isinstance(where, str) or not self.endpoint.same_origin(where):
            raise ProviderRefused(
                "the Files API answered the upload's start without a place on the endpoint's "
                "origin to send the rows to",
                retryable=True,
            )
        finish = self.provider.upload_finish()
        return self._json("POST", where, "upload the rows", data=content, headers=finish,
                          retry=False)  # fmt: skip

    def create(self, *, input_file: str | None, lines: Sequence[bytes], part: int) -> Any:
        """The batch object the provider made of the uploaded file or of the rows."""
        body = self.provider.create_body(self.endpoint, input_file, lines, part)
        headers = {"Content-Type": "application/json"}
        # (not retried: a create that got no answer may have been made, it is looked for first)
        made = self.provider.create_url(self.endpoint)
        return self._json("POST", made, "create the batch", data=body, headers=headers, retry=False)

    def retrieve(self, batch: str) -> Any:
        return self._json("GET", self.provider.batch_url(self.endpoint, batch), "poll the batch")

    def cancel(self, batch: str) -> Any:
        url = self.provider.cancel_url(self.endpoint, batch)
        return self._json("POST", url, "cancel the batch")

    def recent(self, since: float) -> Iterator[Mapping[str, Any]]:
        """The provider's batches, newest first, back to the page that reaches ``since``
        (``made_since``): to find one a create made unsaid. A list that cannot be followed
        so far is a retryable ProviderRefused: the part is never submitted again on a guess."""
        provider = self.provider
        for page in self._pages(self._batches, "batches", provider.list_params, provider.listed):
            yield from page
            if page and not self.made_since(provider.created_at(page[-1]), since):
                return

    def _pages(
        self,
        url: str,
        what: str,
        params_of: Callable[[str | None], dict[str, Any]],
        listed: Callable[[Any], tuple[list[Mapping[str, Any]], bool, str | None]],
    ) -> Iterator[list[Mapping[str, Any]]]:
        """Each page of a list of ``what`` the provider pages by cursor, to its end; one that
        cannot be followed (a page without a cursor, a cursor that repeats, more than
        ``_MOST_PAGES`` pages) is a retryable ProviderRefused."""
        cursor: str | None = None
        seen: set[str] = set()
        for _ in range(_MOST_PAGES):
            if self.clocks.over():
                raise ProviderRefused(f"the run ended while listing the {what}", retryable=True)
            answer = self._json("GET", url, f"list the {what}", params=params_of(cursor))
            page, more, cursor = listed(answer)
            yield page
            if not more:
                return
            if cursor is None or cursor in seen:
                break
            seen.add(cursor)
        raise ProviderRefused(
            f"the provider's list of {what} cannot be followed to its end (a page without a "
            f"cursor, a cursor that repeats, or more than {_MOST_PAGES} pages)",
            retryable=True,
        )

    def made_since(self, created: float | None, since: float) -> bool:
        """Whether a batch ``created`` (the provider's clock) may be made since ``since`` (this
        clock's): yes when either time is not known (the list is then read to its end)."""
        offset = self.clock_offset
        return offset is None or created is None or created >= since + offset

    def file_name(self, file_id: str) -> str | None:
        """The name a file was uploaded under (None: it is gone)."""
        assert self._files is not None
        answer = self._json("GET", f"{self._files}/{file_id}", "look at a file", missing_ok=True)
        name = self.provider.file_label(answer) if isinstance(answer, Mapping) else None
        return name if isinstance(name, str) else None

    def file_named(self, name: str) -> str | None:
        """The id of the batch file uploaded under ``name`` (a part's own), if there is one."""
        assert self._files is not None
        provider = self.provider
        for page in self._pages(self._files, "files", provider.file_params, provider.files_listed):
            found = next((file for file in page if provider.file_label(file) == name), None)
            if found is not None:
                return well_formed(provider.name, "file", provider.file_id(found))
        return None

    # --- collecting ----------------------------------------------------------------------------
    def results(
        self, files: Files, batch: str, size: int, nonce: str, rows: Set[int]
    ) -> Iterator[Any]:
        """The results lines of an ended batch of ``size`` rows that name the ``rows`` of the
        part ``nonce`` this run reads (``Unread``: too large or not JSON), and the first naming
        another part's row. All are downloaded first, each row's first line kept in a file, so
        that a row listed again with another answer is known before any is taken: it comes as
        an ``Unread`` naming the conflict (a line over ``max_bytes`` cannot be compared)."""
        listing = _Listing(nonce, rows)
        with self._kept_results(files, batch, size, listing) as spool:
            for stored in spool:
                line = self._parsed(stored[2:-1], stored[:1] == b"1")
                given = self.row_of(line)
                yield Unread(given, _CONFLICT, again=False) if given in listing.conflicts else line

    def _kept_results(self, files: Files, batch: str, rows: int, listing: _Listing) -> IO[bytes]:
        """The lines ``listing`` keeps, in a rewound temporary file (a full disk: retryable)."""
        try:
            spool = tempfile.TemporaryFile()  # noqa: SIM115 (closed by results, or below)
        except OSError as exc:
            raise _unkept(exc) from None
        try:
            for url in self._results_urls(files, batch):
                for raw, oversized in self._lines(url, rows):
                    given = self.row_of(self._parsed(raw, oversized))
                    if listing.keeps(given, raw, oversized):
                        spool.write(b"%d %s\n" % (oversized, raw))
            spool.flush()
            spool.seek(0)
        except BaseException as exc:
            with suppress(OSError):  # (a flush that failed fails again as it closes)
                spool.close()
            if isinstance(exc, OSError):
                raise _unkept(exc) from None
            raise
        return spool

    def first_result(self, files: Files, batch: str, rows: int) -> Any:
        """The first results line of an ended batch (None: none), as ``results`` gives it."""
        for url in self._results_urls(files, batch):
            with closing(self._lines(url, rows)) as lines:
                for raw, oversized in lines:
                    return self._parsed(raw, oversized)
        return None

    def row_of(self, line: Any) -> str | None:
        """The custom_id a results line names (parsed or not), if any."""
        return custom_id_of(line, self.provider.row_key)

    def _parsed(self, line: bytes, oversized: bool) -> Any:
        """One results line read as a live body, else an ``Unread`` named by its custom_id."""
        most = self.calls.max_bytes
        if oversized:
            reason = f"its answer in the batch's results is larger than max_bytes ({most})"
        else:
            try:
                return decode_body(line, "json", None)
            except InvalidBody as exc:
                reason = f"its line in the batch's results cannot be read: {exc}"
        key = re.escape(json.dumps(self.provider.row_key).encode())
        found = re.search(key + rb'\s*:\s*"([A-Za-z0-9_-]{1,64})"', line[:_PREFIX])
        return Unread(found.group(1).decode() if found else None, reason)

    def _results_urls(self, files: Files, batch: str) -> Iterator[str]:
        """Each place the provider keeps a batch's results; another origin is refused."""
        for url in self.provider.results_urls(self.endpoint, batch, files):
            if not self.endpoint.same_origin(url):
                raise ProviderRefused(
                    "the batch's results URL is on another origin than the endpoint: not "
                    "fetched (the API key goes to the endpoint's origin only)"
                )
            yield url

    def delete(self, url: str) -> None:
        """Delete what ``url`` names at the provider (gone already: nothing to do)."""
        self._json("DELETE", url, "delete at the provider", missing_ok=True)

    def delete_file(self, file_id: str) -> None:
        assert self._files is not None
        self.delete(f"{self._files}/{file_id}")

    # --- one call ------------------------------------------------------------------------------
    def _json(self, method: str, url: str, doing: str, **how: Any) -> Any:
        """The JSON answer of one call (a 404 with ``missing_ok``: None); one unreadable says
        nothing of what the call did, so its ProviderRefused is retryable."""
        with self._send(method, url, doing, **how) as answer:
            if answer.reply is None:
                return None
            try:
                body = self.transport.read_body(answer.reply, answer.wall_end, _CONTROL_BYTES)
            except BodyTooLarge:
                why = "the provider's answer is larger than expected"
                raise self._passing(doing, why) from None
            except Exception as exc:  # (cut short, or too slow)
                raise self._passing(doing, classify_http_exception(exc).error) from None
        try:
            return decode_body(body, "json", None)
        except InvalidBody as exc:
            raise self._passing(doing, f"the provider's answer cannot be read ({exc})") from None

    def _lines(self, url: str, rows: int) -> Generator[tuple[bytes, bool]]:
        """Each line of a results download (``_split_lines``), bounded by ``max_bytes`` a row."""
        total = rows * self.calls.max_bytes + 2**20
        with self._send("GET", url, "download the results", download=True) as answer:
            chunks = self._bounded(self._chunks(answer), total)
            yield from _split_lines(chunks, self.calls.max_bytes)

    def _bounded(self, chunks: Iterator[bytes], total: int) -> Iterator[bytes]:
        """A download's chunks; a ProviderRefused once the run is over or past ``total``."""
        read = 0
        for chunk in chunks:
            if self.clocks.over():
                raise ProviderRefused("the run ended during the download", retryable=True)
            read += len(chunk)
            if read > total:
                raise ProviderRefused("the results are larger than the rows can be")
            yield chunk

    def _send(
        self,
        method: str,
        url: str,
        doing: str,
        *,
        retry: bool = True,
        missing_ok: bool = False,
        download: bool = False,
        **sent: Any,
    ) -> _Answer:
        """The answer to one call whose headers came, tried again as a live attempt is (without
        ``retry``: only once the provider said it did nothing, as a POST); else ProviderRefused."""
        calls, clocks = self.calls, self.clocks
        headers = {**calls.headers, **sent.pop("headers", {})}
        request = requests.Request(method, url, headers=headers, **sent)
        recipe = replace(self.transport.prepare(request), follow=False)
        # (a wait before the next try may not pass the deadline; the budget is not a call's)
        allowance = Allowance(math.inf, clocks.ends)
        number = 0
        while True:
            number += 1
            wall_end = self._attempt_end(doing, download)
            began = clocks.clock()
            tried = self._try(recipe, wall_end, missing_ok)
            self.longest_call = max(self.longest_call, clocks.clock() - began)
            if isinstance(tried, _Answer):
                return tried
            verdict, status, said = tried
            if calls.retry_if is not None:
                verdict = judged(verdict, calls.retry_if)
            most = calls.attempts if retry else 1
            attempted = Attempted(number, most, calls.attempts, clocks.clock())
            decision = decide(verdict, attempted, calls.backoff, clocks.rand(), allowance)
            if decision.wait is None:
                final = decision.verdict
                text = calls.secrets.text(f"could not {doing}: {decision.error}{said}")
                again = final.outcome == "retry" or final.error_kind in ("budget", "deadline")
                raise ProviderRefused(text, status, retryable=again, retry_after=final.retry_after)
            if not clocks.pause(decision.wait):
                raise Stopped

    def _try(
        self, recipe: Recipe, wall_end: float, missing_ok: bool
    ) -> _Answer | tuple[Verdict, int | None, str]:
        """One try: its answer (a 2xx, a 404 allowed), or the Verdict, status and message."""
        try:
            reply = self.transport.send(recipe, wall_end)
        except Exception as exc:  # every failure is classified, none escapes
            self.transport.finish()
            return classify_http_exception(exc), None, ""
        self._read_clock(reply.headers)
        if 200 <= reply.status < 300:
            return _Answer(self.transport, reply, wall_end)
        if reply.status == 404 and missing_ok:
            self.transport.discard(reply, wall_end)
            return _Answer(self.transport, None, wall_end)
        said, now = self._error_text(reply, wall_end), self.clocks.unix_time()
        return _judged(reply.status, reply.headers, now, self.calls.retryable), reply.status, said

    def _attempt_end(self, doing: str, download: bool) -> float:
        """When the next try ends: its timeout (a download's: longer) from now, or the deadline."""
        left = self.clocks.left()
        if left is not None and left <= 0:
            raise self._passing(doing, "the run's time is over")
        seconds = _DOWNLOAD_SECONDS if download else self.calls.timeout
        return self.clocks.clock() + (seconds if left is None else min(seconds, left))

    def _chunks(self, answer: _Answer) -> Iterator[bytes]:
        """A download's chunks; a body cut short or too slow is a retryable ProviderRefused."""
        assert answer.reply is not None
        chunks = self.transport.stream(answer.reply, answer.wall_end, self.calls.timeout)
        try:
            yield from chunks
        except Exception as exc:
            why = classify_http_exception(exc).error
            raise self._passing("download the results", why) from None

    def _error_text(self, reply: Reply, wall_end: float) -> str:
        """': message' from an error body (its first 16 KiB), the answer closed."""
        try:
            body = self.transport.read_body(reply, wall_end, 2**14)
        except Exception:  # (too large, cut short: the status says enough)
            return ""
        finally:
            reply.close()
            self.transport.finish()
        try:
            message = error_message(decode_body(body, "json", None))
        except InvalidBody:
            return ""
        return f": {' '.join(message.split())[:200]}" if isinstance(message, str) else ""

    def _read_clock(self, headers: Mapping[str, str]) -> None:
        """The provider's clock against this one, from the answer's ``Date``."""
        try:
            said = parsedate_to_datetime(headers.get("Date", ""))
        except (TypeError, ValueError, IndexError):
            return
        if said.tzinfo is not None:
            self.clock_offset = said.timestamp() - self.clocks.unix_time()

    def _passing(self, doing: str, why: str | None) -> ProviderRefused:
        """A call that could not ``doing`` for a reason that may pass: tried again later."""
        return ProviderRefused(self.calls.secrets.text(f"could not {doing}: {why}"), retryable=True)


@dataclass
class _Answer(AbstractContextManager["_Answer"]):
    """An answer whose headers have come (``reply`` None: a 404 allowed), to be read within
    ``wall_end``; closed, and its attempt over, on leaving."""

    transport: Transport
    reply: Reply | None
    wall_end: float

    def __exit__(self, *exc: object) -> None:
        if self.reply is not None:
            self.reply.close()
        self.transport.finish()


def _unkept(exc: OSError) -> ProviderRefused:
    return ProviderRefused(
        f"could not keep the batch's results on this machine to read them ({exc.strerror or exc})",
        retryable=True,
    )


@dataclass
class _Listing:
    """What a batch's results list: a digest of each row's first line (None: too large to
    compare), the rows listed again with another answer, and whether another part's was."""

    nonce: str
    rows: Set[int]
    first: dict[str, bytes | None] = field(default_factory=dict)
    conflicts: set[str] = field(default_factory=set)
    other: bool = False

    def keeps(self, given: str | None, raw: bytes, oversized: bool) -> bool:
        """Whether a line named ``given`` is kept: the first of each row read, and the first
        naming another part's row; no other (what is kept stays within the rows read)."""
        index = index_of(given, self.nonce)
        if index is None:
            keep = not self.other and is_row_id(given)
            self.other = self.other or keep
            return keep
        if index not in self.rows:
            return False
        assert given is not None
        digest = None if oversized else hashlib.blake2b(raw, digest_size=16).digest()
        if given not in self.first:
            self.first[given] = digest
            return True
        earlier = self.first[given]
        if None not in (earlier, digest) and earlier != digest:
            self.conflicts.add(given)
        return False


@dataclass(frozen=True)
class Unread:
    """A results line not taken as its row's answer, and why; ``again``: reading the batch
    again may give it (a larger ``max_bytes``), so the batch is kept."""

    custom_id: str | None
    reason: str
    again: bool = True


def custom_id_of(line: Any, key: str) -> str | None:
    """The row a results line names by ``key`` (its custom_id; parsed or not), if any."""
    given = line.custom_id if isinstance(line, Unread) else None
    if isinstance(line, Mapping):
        given = line.get(key)
    return given if isinstance(given, str) else None


def _split_lines(chunks: Iterable[bytes], limit: int) -> Iterator[tuple[bytes, bool]]:
    """Each line of a download that is not blank, and whether it is longer than ``limit``
    (then only its start is kept, to read its custom_id)."""
    line = bytearray()
    for chunk in chunks:
        *ended, rest = chunk.split(b"\n")
        for piece in ended:
            if len(line) <= limit:
                line += piece
            if len(line) > limit or line.strip():
                yield bytes(line), len(line) > limit
            line = bytearray()
        if len(line) <= limit:
            line += rest
    if len(line) > limit or line.strip():
        yield bytes(line), len(line) > limit


def _judged(
    status: int, headers: Mapping[str, str], now: float, retryable: frozenset[int]
) -> Verdict:
    """A live attempt's Verdict on a non-2xx answer; a redirect, not followed, is final."""
    after, said = retry_after_of(headers), headers.get(SHOULD_RETRY)
    verdict = classify_status(status, after, now, None, retryable, should_retry=said)
    if verdict is None:
        return terminal("redirect", f"HTTP {status} (a redirect: not followed)")
    return verdict
