"""Tokens that expire: the run's ``auth=``, applied to each request as it is sent, and renewed
once for all workers when the server says the token is no longer good (HTTP 401).

``auth=`` is either a zero-argument callable returning the headers that carry the token
(called for the first token, and again for each refresh), or a ``requests.auth.AuthBase``,
applied afresh to each request as requests would; a 401 refreshes an AuthBase only when it
has a ``refresh()`` method (else the 401 is an ordinary terminal one). Every token value
becomes one of the run's Secrets as soon as it is seen.

The rule for a 401 (``after_401``), per attempt: a request that carried an older token than
the current one is resent with the current one; one that carried the current token has it
refreshed, once for however many workers saw it fail; a 401 to the current token when no
server has ever accepted it is final if that token is fresh (got by a refresh, or this
attempt's renewal). So a token the server refuses outright costs one refresh, not one per
item; and an attempt renews its token MAX_RENEWALS times at most.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from functools import partial
from typing import Literal

import requests
from requests.auth import AuthBase

from ..core.redact import Secrets
from .exchange import Outgoing, Wire
from .spec import check_headers

HeaderSource = Callable[[], Mapping[str, str]]
Auth = HeaderSource | AuthBase

# Token renewals within one attempt at most (each needs a newer token that worked meanwhile).
MAX_RENEWALS = 3
# Seconds an --auth-command may take before it counts as failed.
COMMAND_TIMEOUT = 30.0
# The longest token header value taken (from a command's output or an auth= callable).
MAX_TOKEN_BYTES = 16 * 1024


class AuthFailed(Exception):
    """No token could be got. The message says why, never what the source printed."""


class RefreshWaitTimedOut(TimeoutError):
    """The attempt's time ran out while another worker was getting the new token."""


@dataclass(frozen=True, slots=True)
class Token:
    """A token's headers and its generation: 0 the first, one more on each refresh."""

    generation: int
    headers: Mapping[str, str]


Step = Literal["resend", "refresh", "give_up"]


def after_401(sent: int, current: int, accepted: int, renewals: int) -> Step:
    """What a 401 calls for. ``sent``: the generation the request carried; ``current``: the
    source's now; ``accepted``: the newest generation a server answered without a 401 (-1:
    none); ``renewals``: how often this attempt was already resent with a newer token."""
    if renewals >= MAX_RENEWALS:
        return "give_up"
    if sent != current:
        return "resend"  # someone refreshed it meanwhile
    if accepted < current and (renewals or current > 0):
        return "give_up"  # a fresh token that never worked: refreshing again won't help
    return "refresh"  # the token worked, or the first one went stale before its first use


class TokenSource:
    """The current token, refreshed single-flight: however many workers report the same
    generation stale, one refresh runs; the others wait for it and take its token (or its
    failure). Thread-safe; reading the current token takes no lock."""

    def __init__(self, get: HeaderSource, secrets: Secrets, *, headers: bool = True) -> None:
        self._get = get
        self._secrets = secrets
        self._headers = headers  # (False: an AuthBase's refresh(), which gives none)
        self._lock = threading.Lock()  # held while refreshing: the waiters are the flight
        self._token = Token(0, {})
        self._tries = 0
        self._failure: AuthFailed | None = None
        self._accepted_lock = threading.Lock()
        self.accepted = -1
        self.refreshes = 0

    @property
    def current(self) -> Token:
        return self._token

    def start(self) -> Token:
        """The first token (AuthFailed when it cannot be got; none for an AuthBase's)."""
        self._token = Token(0, self._fetch() if self._headers else {})
        return self._token

    def accept(self, token: Token) -> None:
        """A server answered ``token`` without a 401: it works (see ``after_401``)."""
        if token.generation > self.accepted:
            with self._accepted_lock:
                self.accepted = max(self.accepted, token.generation)

    def refresh(self, stale: Token, wait: float | None = None) -> Token:
        """A token newer than ``stale``: fetched here, or by the refresh this call waited for
        (at most ``wait`` seconds: RefreshWaitTimedOut)."""
        tries = self._tries
        if not self._lock.acquire(timeout=-1 if wait is None else max(wait, 0.0)):
            raise RefreshWaitTimedOut("attempt timed out waiting for a new token")
        try:
            if self._token.generation != stale.generation:
                return self._token
            if self._tries != tries and self._failure is not None:
                raise self._failure  # the refresh this one waited for failed: so does this
            self._tries += 1
            try:
                headers = self._fetch()
            except AuthFailed as exc:
                self._failure = exc
                raise
            self._failure = None
            self._token = Token(stale.generation + 1, headers)
            self.refreshes += 1
            return self._token
        finally:
            self._lock.release()

    def _fetch(self) -> Mapping[str, str]:
        try:
            headers = self._get()
        except AuthFailed:
            raise
        except Exception as exc:  # the caller's source failing is no crash of the run
            # (its type only: a token endpoint's error may quote a token not yet known)
            raise AuthFailed(
                f"auth= raised {type(exc).__name__} (its message is not shown)"
            ) from None
        headers = _returned_headers(headers, wanted=self._headers)
        self._secrets.learn(headers.values(), headers)
        try:
            check_headers(headers)  # (its messages name the header, never the value)
        except ValueError as exc:
            raise AuthFailed(f"auth= returned a header that cannot be sent: {exc}") from None
        return headers


def _returned_headers(headers: object, *, wanted: bool) -> dict[str, str]:
    """A token source's return as headers a request can take; AuthFailed never quotes a value."""
    if not isinstance(headers, Mapping) or not all(
        isinstance(name, str) and isinstance(value, str) for name, value in headers.items()
    ):
        raise AuthFailed("auth= must return a mapping of header names to str values")
    if wanted and not headers:
        raise AuthFailed("auth= returned no headers")
    if any(len(value) > MAX_TOKEN_BYTES for value in headers.values()):
        raise AuthFailed(f"auth= returned a header value over {MAX_TOKEN_BYTES // 1024} KiB")
    return dict(headers)


class RunAuth(TokenSource):
    """A run's ``auth=``: which token each send carries, and what a 401 calls for."""

    def __init__(self, auth: Auth, secrets: Secrets) -> None:
        self.base = auth if isinstance(auth, AuthBase) else None
        refresh = getattr(auth, "refresh", None) if self.base is not None else None
        get = None if isinstance(auth, AuthBase) else auth
        if callable(refresh):
            get = partial(_refreshed, refresh)
        # (an AuthBase without refresh() keeps its one token, a 401 to it final: none is got)
        self._renews = get is not None
        super().__init__(get or dict, secrets, headers=self.base is None)

    @property
    def lane(self) -> bool:
        """Whether requests may take the fast lane: header tokens can, an AuthBase cannot
        (it works on a requests.PreparedRequest)."""
        return self.base is None

    def step(self, token: Token, renewals: int) -> Step:
        if not self._renews:
            return "give_up"
        return after_401(token.generation, self.current.generation, self.accepted, renewals)

    def apply(self, request: Outgoing, token: Token) -> Outgoing:
        """``request`` as it goes out with ``token``; the original is left as it was."""
        if isinstance(request, Wire):  # (only header tokens take the fast lane)
            names = {name.lower() for name in token.headers}  # (replaced in any case)
            kept = {n: v for n, v in request.headers.items() if n.lower() not in names}
            return replace(request, headers={**kept, **token.headers})
        return replace(request, auth=partial(self._authorized, token))

    def _authorized(
        self, token: Token, prepared: requests.PreparedRequest
    ) -> requests.PreparedRequest:
        """A copy of ``prepared`` carrying the token; an AuthBase applied as requests would."""
        request = prepared.copy()
        # (copy() shares the hook lists: an AuthBase that registers hooks must not grow them)
        request.hooks = {event: list(hooks) for event, hooks in prepared.hooks.items()}
        if self.base is None:
            request.headers.update(token.headers)
            return request
        before = dict(request.headers)
        request = self.base(request)
        changed = {
            name: value
            for name, value in request.headers.items()
            if isinstance(value, str) and before.get(name) != value
        }
        self._secrets.learn(changed.values(), changed)
        request.prepare_content_length(request.body)
        return request


def _refreshed(refresh: Callable[[], object]) -> Mapping[str, str]:
    refresh()
    return {}


class CommandToken:
    """``--auth-command``: a shell command (``sh -c``, as git's credential helpers) whose
    output, stripped, is the value of one header (Authorization by default); run for the first
    token and again on each refresh, with stdin closed, stderr discarded and a timeout. What
    it printed never appears in a message: it is a secret."""

    def __init__(
        self, command: str, header: str = "Authorization", timeout: float = COMMAND_TIMEOUT
    ) -> None:
        self._command = command
        self._header = header
        self._timeout = timeout
        self._primed: dict[str, str] | None = None
        self._given: list[str] = []

    def prime(self) -> None:
        """Get the first token now (AuthFailed when the command fails), so that a run can
        refuse to start; the next call hands it out."""
        self._primed = self._run()

    def __call__(self) -> Mapping[str, str]:
        primed, self._primed = self._primed, None
        return primed if primed is not None else self._run()

    @property
    def given(self) -> tuple[str, ...]:
        """Every value the command gave so far (for masking what outlives the run: its
        summary, the line that resumes it)."""
        return tuple(self._given)

    def _run(self) -> dict[str, str]:
        try:
            process = subprocess.Popen(
                self._command,
                shell=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                start_new_session=True,
            )
        except OSError as exc:
            raise AuthFailed(f"the auth command could not be started ({exc.strerror})") from None
        try:
            out = _bounded_output(process, self._timeout)
        finally:
            _end(process)
        if process.returncode != 0:
            raise AuthFailed(
                f"the auth command failed (exit status {process.returncode}; its output is "
                "not shown)"
            )
        try:  # (not UTF-8: a replacement character would be sent in the secret's place)
            value = out.decode("utf-8").strip()
        except UnicodeDecodeError:
            raise AuthFailed("the auth command printed text that is not UTF-8") from None
        if not value:
            raise AuthFailed("the auth command printed nothing")
        if "\n" in value or "\r" in value:
            raise AuthFailed("the auth command printed more than one line")
        try:  # (before the run starts: a token no request can carry must stop it there)
            check_headers({self._header: value})
        except ValueError:  # (its message names what is wrong, never the value)
            raise AuthFailed(
                f"the auth command printed a value {self._header} cannot carry (a NUL, a "
                "control character, or characters beyond latin-1)"
            ) from None
        self._given.append(value)
        return {self._header: value}


def _bounded_output(process: subprocess.Popen[bytes], timeout: float) -> bytes:
    """What the command printed, read until it exits: AuthFailed past ``timeout`` seconds or
    MAX_TOKEN_BYTES bytes (a token that size is a mistake, and masking it would cost more)."""
    assert process.stdout is not None
    deadline = time.monotonic() + timeout
    out = bytearray()
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AuthFailed(f"the auth command did not finish within {timeout:g} s")
            if not selector.select(left):
                continue
            chunk = os.read(process.stdout.fileno(), 65536)
            if not chunk:
                break
            out += chunk
            if len(out) > MAX_TOKEN_BYTES:
                raise AuthFailed(
                    f"the auth command printed more than {MAX_TOKEN_BYTES // 1024} KiB"
                )
    try:
        process.wait(max(deadline - time.monotonic(), 0.0))
    except subprocess.TimeoutExpired:
        raise AuthFailed(f"the auth command did not finish within {timeout:g} s") from None
    return bytes(out)


def _end(process: subprocess.Popen[bytes]) -> None:
    """Make sure the command is over: its process group killed if it runs (a child of the shell
    may too), our end of the pipe closed, never waited on (a detached child may hold it)."""
    if process.returncode is None:
        with contextlib.suppress(OSError):
            os.killpg(process.pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(5)
    if process.stdout is not None:
        process.stdout.close()
