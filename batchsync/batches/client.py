"""The calls a batch takes at the provider (upload, create, retrieve, list, cancel, download,
delete), each through one ``requests`` session, retried on 429, 5xx, timeouts and dropped
connections as a live attempt is, and sent to the endpoint's own origin only: no redirect
is followed, and a results URL elsewhere is refused, so the API key goes nowhere else.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

import requests

from ..core.backoff import Backoff, parse_retry_after
from ..core.redact import Secrets
from ..http.decode import InvalidBody, decode_body
from ..store.submissions import well_formed
from .providers import Endpoint, Files, created_at

# Waits between tries of a call; False from ``pause`` means the run was stopped meanwhile.
Pause = Callable[[float], bool]
_RETRIED = frozenset({408, 409, 429, 500, 502, 503, 504, 520, 529})
# The most a provider's answer to a control call may be (a batch object, a list of them).
_CONTROL_BYTES = 4 * 2**20
# How much of a line longer than max_bytes is kept, to read its custom_id.
_PREFIX = 4096
_CUSTOM_ID = re.compile(rb'"custom_id"\s*:\s*"([A-Za-z0-9_-]{1,64})"')


class ProviderRefused(Exception):
    """A call the provider answered with a final error (or that ran out of tries): one line,
    secrets masked; ``status`` the HTTP status when one came, ``retryable`` whether trying
    later may help (a 429 or 5xx that outlasted the tries, no answer at all)."""

    def __init__(self, text: str, status: int | None = None, retryable: bool = False) -> None:
        super().__init__(text)
        self.status = status
        self.retryable = retryable


class Stopped(Exception):
    """The run was stopped while a call waited to be tried again."""


@dataclass(frozen=True)
class Calls:
    """How each call is sent: the run's headers (the API key), timeout, tries and backoff, the
    largest results line, and what masks every text that leaves."""

    headers: Mapping[str, str]
    timeout: float
    attempts: int
    backoff: Backoff
    max_bytes: int
    secrets: Secrets
    verify: Any = None
    cert: Any = None


class Client:
    """One provider's batch calls for one endpoint (see the module docstring). ``pause``
    waits between tries (False: the run was stopped); ``over`` says the run must end now (it
    was stopped, or its deadline came), checked as a download goes."""

    def __init__(
        self,
        endpoint: Endpoint,
        session: requests.Session,
        calls: Calls,
        pause: Pause,
        *,
        over: Callable[[], bool] = lambda: False,
        left: Callable[[], float | None] = lambda: None,
        rand: Callable[[], float] = random.random,
        unix_time: Callable[[], float] = time.time,
    ) -> None:
        self.endpoint = endpoint
        self._session = session
        self._calls = calls
        self._pause = pause
        self._over = over
        self._left = left
        self._rand = rand
        self._unix_time = unix_time
        # How far the provider's clock is ahead of this one, from its last ``Date`` header
        # (None until one came): times the provider stamps are compared in its own clock.
        self.clock_offset: float | None = None
        openai = endpoint.provider == "openai"
        self._batches = f"{endpoint.base}/batches"
        self._files = f"{endpoint.base}/files" if openai else None

    # --- submitting ----------------------------------------------------------------------------
    def upload(self, lines: Sequence[bytes], name: str) -> str:
        """OpenAI: the rows uploaded as a JSONL file of purpose batch; its id."""
        assert self._files is not None
        content = b"".join(line + b"\n" for line in lines)
        answer = self._json(
            "POST",
            self._files,
            "upload the rows",
            data={"purpose": "batch"},
            files={"file": (name, content, "application/jsonl")},
        )
        file_id = well_formed("openai", "file", answer.get("id"))
        if file_id is None:
            raise ProviderRefused("the Files API answered without a file id")
        return file_id

    def create(self, *, input_file: str | None, lines: Sequence[bytes], part: int) -> Any:
        """A batch created from the uploaded file (OpenAI) or from the rows themselves
        (Anthropic): the provider's batch object."""
        if self.endpoint.provider == "openai":
            body = json.dumps(
                {
                    "input_file_id": input_file,
                    "endpoint": self.endpoint.path,
                    "completion_window": "24h",
                    "metadata": {"batchsync_part": str(part)},
                }
            ).encode()
        else:
            body = b'{"requests":[' + b",".join(lines) + b"]}"
        return self._json(
            "POST",
            self._batches,
            "create the batch",
            data=body,
            headers={"Content-Type": "application/json"},
            retry=False,  # (a create that got no answer may have been made: looked for first)
        )

    def retrieve(self, batch: str) -> Any:
        return self._json("GET", f"{self._batches}/{batch}", "poll the batch")

    def cancel(self, batch: str) -> Any:
        return self._json("POST", f"{self._batches}/{batch}/cancel", "cancel the batch")

    def recent(self, since: float) -> Iterator[Mapping[str, Any]]:
        """The provider's batches, newest first, back to the first page that reaches
        ``since`` (unix seconds by this clock, compared with the provider's stamps in the
        provider's clock), however many others made meanwhile: to find one this run created
        but could not record. A list that cannot be followed to ``since`` (a cursor missing or
        repeated, the run's end) is a ProviderRefused to try later: the part waits, it is
        never submitted again on a guess."""
        openai = self.endpoint.provider == "openai"
        params: dict[str, Any] = {"limit": 100}
        cursors: set[str] = set()
        while True:
            if self._over():
                raise ProviderRefused("the run ended while listing the batches", retryable=True)
            answer = self._json("GET", self._batches, "list the batches", params=params)
            data = answer.get("data") if isinstance(answer, Mapping) else None
            page = [batch for batch in data or () if isinstance(batch, Mapping)]
            yield from page
            last = page[-1].get("id") if page else None
            if not (isinstance(answer, Mapping) and answer.get("has_more")):
                return
            oldest = created_at(self.endpoint.provider, page[-1]) if page else None
            offset = self.clock_offset  # (not known: the list is read to its end)
            if oldest is not None and offset is not None and oldest < since + offset:
                return
            if not isinstance(last, str) or last in cursors:
                raise ProviderRefused(
                    "the provider's list of batches cannot be followed back to the part's "
                    "submission (a page without a last id, or a cursor that repeats)",
                    retryable=True,
                )
            cursors.add(last)
            params = {"limit": 100, ("after" if openai else "after_id"): last}

    def file_name(self, file_id: str) -> str | None:
        """OpenAI: the name a file was uploaded under (None: it is gone)."""
        assert self._files is not None
        answer = self._json("GET", f"{self._files}/{file_id}", "look at a file", missing_ok=True)
        name = answer.get("filename") if isinstance(answer, Mapping) else None
        return name if isinstance(name, str) else None

    def file_named(self, name: str) -> str | None:
        """OpenAI: the id of the batch file uploaded under ``name`` (a part's own, with its
        nonce), or None when there is none."""
        assert self._files is not None
        answer = self._json(
            "GET", self._files, "list the files", params={"purpose": "batch", "limit": 10000}
        )
        data = answer.get("data") if isinstance(answer, Mapping) else None
        for found in data or ():
            if isinstance(found, Mapping) and found.get("filename") == name:
                return well_formed("openai", "file", found.get("id"))
        return None

    # --- collecting ----------------------------------------------------------------------------
    def results(self, files: Files, batch: str, rows: int) -> Iterator[Any]:
        """Every results line of an ended batch, parsed (``Unread`` for a line that is too
        large or not JSON Python can read, named by the custom_id at its start):
        OpenAI's output file then its error file, or Anthropic's results. Each line is at most
        ``max_bytes``, and a file at most that much a row, so a hostile answer stays bounded."""
        if self._files is not None:
            for file_id in (files.output, files.error):
                if file_id is not None:
                    yield from self._lines(f"{self._files}/{file_id}/content", rows)
            return
        url = files.results_url or f"{self._batches}/{batch}/results"
        if not self.endpoint.same_origin(url):
            raise ProviderRefused(
                "the batch's results URL is on another origin than the endpoint: not fetched "
                "(the API key goes to the endpoint's origin only)"
            )
        yield from self._lines(url, rows)

    def delete_file(self, file_id: str) -> None:
        assert self._files is not None
        self._json("DELETE", f"{self._files}/{file_id}", "delete a file", missing_ok=True)

    def delete_batch(self, batch: str) -> None:
        self._json("DELETE", f"{self._batches}/{batch}", "delete the batch", missing_ok=True)

    # --- one call ------------------------------------------------------------------------------
    def _json(
        self,
        method: str,
        url: str,
        doing: str,
        *,
        retry: bool = True,
        missing_ok: bool = False,
        **sent: Any,
    ) -> Any:
        """The JSON answer of one call, tried again as the run's retries say; ProviderRefused
        when it cannot be had (a 404 with ``missing_ok``: None). An answer that cannot be
        read (too large, not JSON, nested too deeply) is the provider's fault, and may pass:
        it says nothing of what the call did (a create may have made its batch)."""
        with self._send(method, url, doing, retry=retry, missing_ok=missing_ok, **sent) as response:
            if response is None:
                return None
            body = _read(response, _CONTROL_BYTES, self._calls.timeout)
        if body is None:
            raise ProviderRefused(
                f"could not {doing}: the provider's answer is larger than expected", retryable=True
            )
        try:
            return decode_body(body, "json", None)
        except InvalidBody as exc:
            raise ProviderRefused(
                f"could not {doing}: the provider's answer cannot be read ({exc})", retryable=True
            ) from None

    def _lines(self, url: str, rows: int) -> Iterator[Any]:
        limit = self._calls.max_bytes
        total = rows * limit + 2**20
        with self._send("GET", url, "download the results") as response:
            assert response is not None
            read, line, oversized = 0, bytearray(), False
            for chunk in _chunks(response, "download the results"):
                if self._over():
                    raise ProviderRefused("the run ended during the download", retryable=True)
                read += len(chunk)
                if read > total:
                    raise ProviderRefused("the results are larger than the rows can be")
                start = 0
                while start <= len(chunk):
                    end = chunk.find(b"\n", start)
                    piece = chunk[start:] if end == -1 else chunk[start:end]
                    if not oversized:
                        line += piece
                        oversized = len(line) > limit
                    if end == -1:
                        break
                    if oversized or line.strip():
                        yield _parsed(bytes(line), oversized, limit)
                    line, oversized = bytearray(), False
                    start = end + 1
            if oversized or line.strip():
                yield _parsed(bytes(line), oversized, limit)

    def _send(
        self,
        method: str,
        url: str,
        doing: str,
        *,
        retry: bool = True,
        missing_ok: bool = False,
        **sent: Any,
    ) -> _Answer:
        calls = self._calls
        headers = {**calls.headers, **sent.pop("headers", {})}
        tries = calls.attempts if retry else 1
        for attempt in range(1, tries + 1):
            try:
                response = self._session.request(
                    method,
                    url,
                    headers=headers,
                    timeout=calls.timeout,
                    allow_redirects=False,
                    stream=True,
                    verify=calls.verify,
                    cert=calls.cert,
                    **sent,
                )
            except (requests.ConnectionError, requests.Timeout) as exc:
                if attempt == tries:
                    raise ProviderRefused(
                        self._masked(f"could not {doing}: {type(exc).__name__}"), retryable=True
                    ) from None
                self._wait(attempt, None)
                continue
            self._read_clock(response)
            status = response.status_code
            if status < 300:
                return _Answer(response)
            if status == 404 and missing_ok:
                response.close()
                return _Answer(None)
            said = self._masked(_error_text(response))
            if status in _RETRIED and attempt < tries:
                self._wait(attempt, parse_retry_after(response.headers.get("Retry-After"), 0))
                continue
            raise ProviderRefused(
                f"could not {doing}: HTTP {status}{said}", status, retryable=status in _RETRIED
            )
        raise AssertionError("unreachable: the last try returns or raises")

    def _wait(self, attempt: int, retry_after: float | None) -> None:
        """Wait before the next try; a wait the deadline leaves no time for is not begun
        (ProviderRefused, to be tried later: the run's end takes over)."""
        seconds = self._calls.backoff.wait(attempt, retry_after, self._rand())
        left = self._left()
        if left is not None and seconds >= left:
            raise ProviderRefused(
                f"the provider asked to wait {seconds:.0f} s, more than the deadline leaves",
                retryable=True,
            )
        if not self._pause(seconds):
            raise Stopped

    def _read_clock(self, response: requests.Response) -> None:
        """The provider's clock against this one, from the answer's ``Date``."""
        try:
            said = parsedate_to_datetime(response.headers.get("Date", ""))
        except (TypeError, ValueError, IndexError):
            return
        if said.tzinfo is not None:
            self.clock_offset = said.timestamp() - self._unix_time()

    def _masked(self, text: str) -> str:
        return self._calls.secrets.text(text)


class _Answer:
    """A response (None: a 404 allowed), closed on leaving."""

    def __init__(self, response: requests.Response | None) -> None:
        self.response = response

    def __enter__(self) -> requests.Response | None:
        return self.response

    def __exit__(self, *exc: object) -> None:
        if self.response is not None:
            self.response.close()


class Unread:
    """A results line that could not be read (longer than ``max_bytes``, or JSON that Python
    cannot read): the custom_id at its start (where the providers write it) says which row's
    answer it was; ``reason`` why it was not read."""

    def __init__(self, start: bytes, reason: str) -> None:
        found = _CUSTOM_ID.search(start[:_PREFIX])
        self.custom_id = found.group(1).decode() if found else None
        self.reason = reason


def _chunks(response: requests.Response, doing: str) -> Iterator[bytes]:
    """The body's chunks; a body cut short or too slow (as a live attempt's would be) is a
    ProviderRefused that trying again may cure."""
    try:
        yield from response.iter_content(chunk_size=2**16)
    except (requests.RequestException, OSError) as exc:
        raise ProviderRefused(f"could not {doing}: {type(exc).__name__}", retryable=True) from None


def _read(response: requests.Response, limit: int, seconds: float | None = None) -> bytes | None:
    """The body, or None when it is larger than ``limit``; ProviderRefused (to be tried
    again) when it takes longer than ``seconds`` (a body trickled to hold the run)."""
    body = bytearray()
    ends = None if seconds is None else time.monotonic() + seconds
    for chunk in _chunks(response, "read the answer"):
        body += chunk
        if len(body) > limit:
            return None
        if ends is not None and time.monotonic() > ends:
            raise ProviderRefused("the answer came too slowly", retryable=True)
    return bytes(body)


def _parsed(line: bytes, oversized: bool, limit: int) -> Any:
    """One results line, read as the live lane reads a body (``Unread`` when it cannot be)."""
    if oversized:
        return Unread(line, f"its answer in the batch's results is larger than max_bytes ({limit})")
    try:
        return decode_body(line, "json", None)
    except InvalidBody as exc:
        return Unread(line, f"its line in the batch's results cannot be read: {exc}")


def _error_text(response: requests.Response) -> str:
    """': message' from a provider's error body (OpenAI's and Anthropic's ``error.message``),
    read no further than a few KiB."""
    try:
        body = _read(response, 2**14) or b""
    except ProviderRefused:  # (cut short: the status says enough)
        body = b""
    response.close()
    try:
        payload = decode_body(body, "json", None)
    except InvalidBody:
        return ""
    error = payload.get("error") if isinstance(payload, Mapping) else None
    message = error.get("message") if isinstance(error, Mapping) else None
    if not isinstance(message, str):
        return ""
    flat = " ".join(message.split())
    return f": {flat[:200]}"
