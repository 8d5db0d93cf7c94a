"""The requests way: a ``requests.Session`` (batchsync's own, a caller's, or one per worker
from a factory) sends the request; redirects are followed here, hop by hop within the attempt's
end, with each hop's proxies and the run's cookies and secret headers settled as requests would.
Also the fast lane's answers that need the session (a cookie set, a redirect) end here.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Mapping, MutableMapping
from typing import Any
from urllib.parse import urlsplit

import requests
from requests.adapters import HTTPAdapter
from requests.cookies import extract_cookies_to_jar
from requests.structures import CaseInsensitiveDict
from requests.utils import DEFAULT_CA_BUNDLE_PATH, default_headers, resolve_proxies, select_proxy
from urllib3.response import BaseHTTPResponse

from ..core.kept import Kept
from ..core.redact import Secrets
from .classify import BadRedirect
from .connections import ConnectionLedger, fit_session
from .cookies import OriginJars, lend
from .exchange import CHUNK_BYTES, AnswerRefused, BodyReader, BodyTooLarge, Recipe, Reply, Wire
from .internals import jar_cookies
from .origins import host_of

SessionSource = requests.Session | Callable[[], requests.Session]
# As in requests: verify a path to a CA bundle (or directory), True (certifi), or False; cert
# a client certificate file, or a (certificate, key) pair of files.
Verify = bool | str
Cert = str | tuple[str, str]

# Per-origin settings kept at most; past that the cache starts afresh (entries are re-derived
# on demand, so forgetting one costs a look-up, never a request).
_MAX_CACHED_SETTINGS = 4096

# The headers requests sends by default (User-Agent, Accept-Encoding, Accept, Connection).
_DEFAULT_HEADERS = frozenset(name.lower() for name in default_headers())


def leave_origin(
    headers: MutableMapping[str, str | bytes],
    is_secret: Callable[[str], bool],
    defaults: Mapping[str, str | bytes],
) -> None:
    """Make a redirect hop's ``headers`` fit for another origin: the run's secret headers go,
    and one that stood for a header requests sends by default (a ``-H 'User-Agent: …'``) gives
    its place to the session's value, so the hop is the one requests sends without them."""
    fallback = {name.lower(): (name, value) for name, value in defaults.items()}
    for name in list(headers):
        if not is_secret(name):
            continue
        standing = fallback.get(name.lower()) if name.lower() in _DEFAULT_HEADERS else None
        if standing is None:
            del headers[name]
        else:
            headers[standing[0]] = standing[1]  # (in the place it had)


def _unreadable_location(exc: UnicodeDecodeError) -> BadRedirect:
    return BadRedirect(f"cannot follow a redirect: {exc.reason} in its Location")


def lent_secrets(session: requests.Session, secrets: Secrets) -> frozenset[str]:
    """The secret values a caller's session holds, which its requests carry as an item's own
    would: its secret headers' (Authorization, Cookie, Proxy-Authorization, ``secret_headers``
    names), its secret ``params``', its proxies' userinfo, its cookies', and its ``auth``'s."""
    headers = {str(name): _text(value) for name, value in session.headers.items()}
    params = session.params if isinstance(session.params, Mapping) else None
    proxies = [value for value in (session.proxies or {}).values() if isinstance(value, str)]
    found = set(secrets.of_item(proxies, headers, params))
    found.update(f"{cookie.name}={cookie.value}" for cookie in session.cookies if cookie.value)
    found.update(auth_secrets(session.auth))
    return frozenset(found)


def auth_secrets(auth: object) -> set[str]:
    """What a session's ``auth`` holds and sends: a (user, password) pair, an auth's
    ``username`` and ``password`` (requests' Basic, Digest and proxy auths), and the header
    values it sets on a request (a custom AuthBase's token, however it writes it)."""
    if auth is None:
        return set()
    pair = auth if isinstance(auth, tuple) and len(auth) == 2 else None
    user = pair[0] if pair else getattr(auth, "username", None)
    password = pair[1] if pair else getattr(auth, "password", None)
    given = [_text(value) for value in (user, password) if isinstance(value, str | bytes)]
    found = set(given)
    if len(given) == 2:
        found.add(":".join(given))  # (what Basic auth sends, base64-encoded)
    if callable(auth):
        found.update(_sent_by(auth))
    return found


def _sent_by(auth: Callable[[requests.PreparedRequest], Any]) -> set[str]:
    """The header values ``auth`` sets on a probe request (none if it fails on one)."""
    probe = requests.Request("GET", "http://auth-probe.invalid/").prepare()  # (to nowhere)
    before = dict(probe.headers)
    try:
        applied = auth(probe)
    except Exception:  # (an auth that needs a real request: it is masked by shape only)
        return set()
    headers = getattr(applied, "headers", None) or {}
    return {
        _text(value)
        for name, value in headers.items()
        if isinstance(value, str | bytes) and before.get(name) != value
    }


def _text(value: str | bytes) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else value


class SessionLane:
    """Sends ``Recipe``s through a requests session, following redirects, each attempt within
    its wall-clock end (a ``Lane``: see ``transport``).

    A ``requests.Session`` instance is shared by all workers (and left as it was when the run
    closes); a factory is called once per worker thread. Environment settings (proxies, CA
    bundle) are looked up once per origin instead of on every request, and still honoured;
    an explicit ``verify`` / ``cert`` wins over them and over the session's own.
    """

    def __init__(
        self,
        session: SessionSource | None,
        *,
        pool_size: int,
        secrets: Secrets,
        ledger: ConnectionLedger,
        reader: BodyReader,
        verify: Verify | None = None,
        cert: Cert | None = None,
        cookies: bool = True,
    ) -> None:
        self._factory: Callable[[], requests.Session] | None = None
        self.shared: requests.Session | None = None
        self._ledger = ledger
        self._reader = reader
        self._pool_size = pool_size
        self._restores: list[Callable[[], None]] = []
        self._sessions: list[requests.Session] = []
        self._lock = threading.Lock()
        # Each fitted session's jars of the run's cookies, one per origin (see cookies.py).
        self._keep_cookies = cookies
        self._cookie_jars: dict[int, OriginJars] = {}
        # Sessions batchsync made (its own, or a factory's) are closed with the run.
        self._owns_sessions = not isinstance(session, requests.Session)
        # (a lent session's secrets are learned into it)
        self._secrets = secrets
        if session is None:
            self.shared = self._fitted(requests.Session())
        elif isinstance(session, requests.Session):
            self.shared = self._fitted(session)
        else:
            self._factory = session
        self._local = threading.local()
        self._settings: Kept[tuple[int, str], dict[str, Any]] = Kept(_MAX_CACHED_SETTINGS)
        # True said in so many words means certifi's bundle, whatever the environment says.
        self._verify = DEFAULT_CA_BUNDLE_PATH if verify is True else verify
        self._cert = cert

    def _fitted(self, session: requests.Session) -> requests.Session:
        """``session``, fitted for this run once (a factory may hand out one session twice)."""
        with self._lock:
            if not any(session is fitted for fitted in self._sessions):
                self._restores.append(fit_session(session, self._pool_size, self._ledger))
                jars, restore = lend(session.cookies, keep=self._keep_cookies)
                self._restores.append(restore)
                self._cookie_jars[id(session)] = jars
                self._sessions.append(session)
                # (the caller's secrets, masked in every text from the run's first request on)
                self._secrets.learn(lent_secrets(session, self._secrets))
        return session

    def session(self) -> requests.Session:
        """The session this worker thread uses."""
        if self.shared is not None:
            return self.shared
        session: requests.Session | None = getattr(self._local, "session", None)
        if session is None:
            assert self._factory is not None
            made = self._factory()
            if not isinstance(made, requests.Session):
                raise TypeError(f"session factory returned {type(made).__name__}, not a Session")
            session = self._fitted(made)
            self._local.session = session
        return session

    def close(self) -> None:
        """Put every session back as it was (its run's connections closed), and close the
        sessions batchsync made; a caller's own session stays open."""
        for restore in self._restores:
            restore()
        self._restores.clear()
        if self._owns_sessions:
            for session in self._sessions:
                session.close()
        self._sessions.clear()
        self._cookie_jars.clear()

    def environment(self, session: requests.Session, url: str) -> dict[str, Any]:
        """proxies, verify and cert for a URL, as ``Session.request`` would merge them, but
        with an explicit ``verify`` / ``cert`` of the run winning over the environment."""
        parts = urlsplit(url)
        key = (id(session), f"{parts.scheme}://{parts.netloc}".lower())
        settings = self._settings.get(key)
        if settings is None:
            merged = session.merge_environment_settings(url, {}, None, self._verify, self._cert)
            settings = {name: merged[name] for name in ("proxies", "verify", "cert")}
            self._settings.keep(key, settings)
        return settings

    def has_cookies(self, session: requests.Session) -> bool:
        """Whether the session's jar or the run's jars of its origins hold anything (lock-free)."""
        if jar_cookies(session.cookies):
            return True
        jars = self._cookie_jars.get(id(session))
        return jars is not None and bool(jars.by_origin)

    def headers_with(self, *layers: Mapping[str, str | None] | None) -> Mapping[str, str]:
        """The session's default headers overlaid with ``layers``, as requests merges them."""
        merged: CaseInsensitiveDict[str | bytes | None] = CaseInsensitiveDict(
            self.session().headers
        )
        for layer in layers:
            merged.update(layer or {})
        return {name: value for name, value in merged.items() if isinstance(value, str)}

    def prepare(self, request: requests.Request) -> Recipe:
        """``request`` prepared by the session (headers merged, auth and cookies applied),
        with the redirect drain (see ``drain_redirect``)."""
        session = self.session()
        prepared = session.prepare_request(request)
        prepared.hooks["response"].insert(0, self.drain_redirect)
        jars = self._cookie_jars.get(id(session))
        if jars is not None:  # the run's cookies: each to its own origin only
            prepared.hooks["response"].insert(0, jars.keep)
            jars.fit(prepared, session.headers, request.headers)
        return Recipe(request, prepared, host_of(str(request.url)))

    def recipe(self, wire: Wire) -> Recipe:
        """The request the fast-lane ``wire`` stands for, for the requests way."""
        return self.prepare(requests.Request(wire.method, wire.url, headers=dict(wire.headers)))

    def send(self, recipe: Recipe, wall_end: float) -> Reply:
        """Send ``recipe``, following redirects, until a final response's headers arrive.

        Secret headers go only to the request's own host: a redirect elsewhere drops them.
        """
        session = self.session()
        prepared = recipe.prepared
        if self.has_cookies(session):  # as fresh as the jar, as a new request would be
            prepared = self.prepare(recipe.request).prepared
        if recipe.auth is not None:
            prepared = recipe.auth(prepared)
        assert prepared.url is not None
        response = self._send_once(session, prepared, wall_end)
        return self._settle(
            session, prepared.url, response, wall_end, follow_redirects=recipe.follow
        )

    def take_over(self, wire: Wire, raw: BaseHTTPResponse, wall_end: float) -> Reply:
        """The fast lane's answer ``raw`` to ``wire``, its cookies and redirects settled here."""
        session = self.session()
        prepared = self.recipe(wire).prepared
        adapter = session.get_adapter(wire.url)
        assert isinstance(adapter, HTTPAdapter)
        response = self.drain_redirect(adapter.build_response(prepared, raw))
        jars = self._cookie_jars.get(id(session))
        if jars is not None:  # (as its hook would, before the next hop is worked out)
            jars.keep(response)
        extract_cookies_to_jar(session.cookies, prepared, raw)
        # With yield_requests=True, resolve_redirects yields the next PreparedRequest.
        proxies = self.environment(session, wire.url)["proxies"]
        hops = session.resolve_redirects(response, prepared, proxies=proxies, yield_requests=True)
        try:
            response._next = next(hops, None)
        except UnicodeDecodeError as exc:
            raise _unreadable_location(exc) from None
        return self._settle(session, wire.url, response, wall_end)

    def drain_redirect(self, response: requests.Response, *args: Any, **kwargs: Any) -> Any:
        """A response hook, run before any other: reads a redirect's body within the
        attempt's end and ``CHUNK_BYTES``, for the hooks after it to see as the response's
        content (a larger one drops the connection, and they see none). requests would read
        it whole, however large or slow, to follow the redirect."""
        end = self._ledger.watchdog.end()
        if not response.is_redirect or end is None:
            return response
        reply = Reply(response.status_code, response.headers, response.raw, "", 0, response.close)
        body = b""
        # Past CHUNK_BYTES read closes it: the connection goes instead of the rest.
        with contextlib.suppress(BodyTooLarge):
            body = bytes(self._reader.read(reply, end, CHUNK_BYTES, rearm=True))
        response._content = body
        response._content_consumed = True
        return response

    def _send_once(
        self,
        session: requests.Session,
        request: requests.PreparedRequest,
        wall_end: float,
        redirects: int = 0,
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """One request, no redirect followed, through ``proxies`` (a redirect hop's) if given."""
        assert request.url is not None
        settings = self.environment(session, request.url)
        if proxies is not None:
            settings = {**settings, "proxies": proxies}
        self._ledger.watchdog.arm(wall_end)
        left = self._reader.left(wall_end)
        try:
            return session.send(
                request, allow_redirects=False, stream=True, timeout=left, **settings
            )
        except UnicodeDecodeError as exc:  # requests decodes Location as UTF-8
            raise _unreadable_location(exc) from None
        except requests.HTTPError as exc:
            if exc.response is None:
                raise
            exc.response.close()  # (its body is not read: the connection goes)
            raise AnswerRefused(exc, exc.response, redirects) from exc

    def _settle(
        self,
        session: requests.Session,
        first_url: str,
        response: requests.Response,
        wall_end: float,
        *,
        follow_redirects: bool = True,
    ) -> Reply:
        """Follow redirects from ``response`` to the final one (none: ``follow_redirects`` False),
        each hop through the proxies requests would use (``Session.rebuild_proxies``)."""
        hops = 0
        proxies = self.environment(session, first_url)["proxies"]
        while follow_redirects and response.is_redirect and response.next is not None:
            follow = response.next
            response.close()
            hops += 1
            proxies = self._hop(session, first_url, follow, hops, proxies)
            response = self._send_once(session, follow, wall_end, hops, proxies)
        return Reply(
            response.status_code,
            response.headers,
            response.raw,
            response.url or first_url,
            hops,
            response.close,
            response.content if response._content_consumed else None,
        )

    def _hop(
        self,
        session: requests.Session,
        first_url: str,
        follow: requests.PreparedRequest,
        hops: int,
        proxies: dict[str, str],
    ) -> dict[str, str]:
        """The redirect ``follow`` checked (the session's limit, the guard) and made ready (secret
        headers dropped when it leaves the origin); returns the proxies it goes through."""
        if hops > session.max_redirects:
            raise requests.TooManyRedirects(f"more than {session.max_redirects} redirects")
        assert follow.url is not None
        if self._ledger.guard is not None:
            self._ledger.guard.check(urlsplit(follow.url).hostname or "")
        # requests has already dealt with Authorization, Cookie and Proxy-Authorization
        # for the new URL; the run's own secret headers are batchsync's to drop.
        if session.should_strip_auth(first_url, follow.url):
            leave_origin(follow.headers, self._secrets.is_declared, session.headers)
        proxies = resolve_proxies(follow, proxies, session.trust_env)
        # Proxy-Authorization is for a proxy that reads the headers: one that a plain-HTTP
        # request goes to in the clear (over HTTPS a proxy only tunnels: the origin reads them).
        if urlsplit(follow.url).scheme.lower() != "http" or not select_proxy(follow.url, proxies):
            follow.headers.pop("Proxy-Authorization", None)
        return proxies
