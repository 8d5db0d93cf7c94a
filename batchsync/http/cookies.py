"""One cookie jar per origin for a run (``cookies=False`` / ``--no-cookies``: none kept).

http.cookiejar matches a cookie's domain and path but never its port, so with one jar a cookie
from ``http://h:8001`` would go to ``http://h:8002`` too, on later items and on redirects
alike. For a run, a session's jar is lent a policy (``_LentPolicy``) and each prepared request
gets a jar of its own (``_RunJar``): a cookie a response sets during the run goes to the jar of
the origin (scheme, host, port) that set it, and only that jar's cookies go back to that
origin, across items and on every hop of a redirect. The caller's own cookies (put in the
session before the run, no origin known) go out as plain requests sends them. An origin's
cookies in a run are bounded as a browser bounds a site's (``MAX_COOKIES_PER_ORIGIN``).
"""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping
from functools import partial
from http.cookiejar import Cookie, CookieJar, CookiePolicy, DefaultCookiePolicy
from typing import TYPE_CHECKING, Any, cast

import requests
from requests.cookies import MockRequest, RequestsCookieJar, extract_cookies_to_jar

from .internals import JarHooks, cookies_to_send, jar_holds, jar_policy, policy_now, set_policy_now
from .origins import origin_of

if TYPE_CHECKING:
    import urllib.request

# Where a cookie that a response set during a run notes its origin. An attribute rather than
# a nonstandard cookie attribute (``_rest``), which a FileCookieJar would write out; it goes
# with every copy of the cookie (requests' per-request copies, ``jar.copy()``, a pickle), so
# that a cookie never reaches another origin, in this run or a later one with the jar. It
# stays on the caller's cookies after the run: taken off, a copied jar or a second run
# sharing the jar sent them everywhere.
_STAMP = "_batchsync_origin"


# The bound of an origin's cookies in a run, as browsers bound a site's (Chromium: 180 per
# site, 4096 bytes of name and value each): past it the least recently set goes, and a larger
# cookie is not kept. Without it, a server that sets a new cookie on every response makes
# every later request carry all of them.
MAX_COOKIES_PER_ORIGIN = 180
MAX_COOKIE_BYTES = 4096


def _oversized(cookie: Cookie) -> bool:
    return len(cookie.name) + len(cookie.value or "") > MAX_COOKIE_BYTES


class _Recent:
    """The cookies one origin set in one jar, least recently set first; ``set`` makes room
    for one more by dropping the oldest (called with the jar's lock held)."""

    def __init__(self) -> None:
        # (domain, path, name): what a jar keeps one cookie under
        self._keys: OrderedDict[tuple[str, str, str], None] = OrderedDict()

    def set(self, jar: CookieJar, cookie: Cookie) -> None:
        key = (cookie.domain, cookie.path, cookie.name)
        self._keys[key] = None
        self._keys.move_to_end(key)
        if len(self._keys) <= MAX_COOKIES_PER_ORIGIN:
            return
        # Forget cookies the jar no longer holds (deleted, expired) before dropping any.
        self._keys = OrderedDict((k, None) for k in self._keys if k == key or jar_holds(jar, *k))
        while len(self._keys) > MAX_COOKIES_PER_ORIGIN:
            oldest, _ = self._keys.popitem(last=False)
            jar.clear(*oldest)


class _OriginJar(RequestsCookieJar):
    """One origin's jar for a run, bounded as a browser bounds a site's."""

    def __init__(self, policy: CookiePolicy) -> None:
        super().__init__(policy)
        self._recent = _Recent()

    def set_cookie(self, cookie: Cookie, *args: Any, **kwargs: Any) -> None:
        if _oversized(cookie):
            return
        with self._cookies_lock:
            super().set_cookie(cookie, *args, **kwargs)
            self._recent.set(self, cookie)


def _origin_of_request(request: Any) -> str | None:
    """The origin a cookie-jar request (requests' MockRequest, a urllib Request) goes to."""
    return origin_of(f"{request.type}://{request.host}")


def stamp_of(cookie: Cookie) -> str | None:
    """The origin that set ``cookie`` during a run; None for a cookie of the caller's."""
    origin: str | None = getattr(cookie, _STAMP, None)
    return origin


class _LentPolicy(CookiePolicy):
    """Lent to a session's jar for a run. The jar still keeps what its own policy accepts
    (so the session ends as plain requests would leave it), but stamped with the origin that
    set it: the run sends it from that origin's jar, never from this shared one."""

    def __init__(self, own: CookiePolicy, jars: OriginJars, jar: CookieJar) -> None:
        self.own = own
        self.jars = jars
        self.jar = jar  # the session's, bounded per origin as the run's jars are
        self.recent: dict[str, _Recent] = {}

    def __getattr__(self, name: str) -> Any:  # netscape, rfc2965, hide_cookie2, ...
        if name in {"own", "jars", "jar", "recent"} or name.startswith("__"):  # (a copy)
            raise AttributeError(name)
        return getattr(self.own, name)

    @property
    def _now(self) -> int:  # the jar sets it before asking; the own policy reads it
        return policy_now(self.own)

    @_now.setter
    def _now(self, value: int) -> None:
        set_policy_now(self.own, value)

    def set_ok(self, cookie: Cookie, request: Any) -> bool:
        """(Asked by the jar's ``extract_cookies``, which holds its lock and sets the cookie
        next: room is made for it now.)"""
        if not (self.jars.keeping and self.own.set_ok(cookie, request)) or _oversized(cookie):
            return False
        origin = _origin_of_request(request)
        if origin is not None:
            setattr(cookie, _STAMP, origin)
            self.recent.setdefault(origin, _Recent()).set(self.jar, cookie)
        return True

    def return_ok(self, cookie: Cookie, request: Any) -> bool:
        return self.own.return_ok(cookie, request)

    def domain_return_ok(self, domain: str, request: Any) -> bool:
        return self.own.domain_return_ok(domain, request)

    def path_return_ok(self, path: str, request: Any) -> bool:
        return self.own.path_return_ok(path, request)


class _RequestPolicy(DefaultCookiePolicy):
    """A prepared request's jar's policy: requests' default for the caller's cookies, none of
    the run's stamped ones (they go out from their origin's jar), and nothing kept from a
    redirect's response (the ``keep`` hook has put its cookies in their origin's jar)."""

    def set_ok(self, cookie: Cookie, request: Any) -> bool:
        return False

    def return_ok(self, cookie: Cookie, request: Any) -> bool:
        return stamp_of(cookie) is None and super().return_ok(cookie, request)


class _RunJar(JarHooks):
    """A prepared request's jar: the caller's cookies, plus, whenever a Cookie header is
    worked out (the first request, each redirect hop), those of the origin it goes to."""

    def __init__(self, jars: OriginJars) -> None:
        super().__init__(jars.request_policy)
        self._origin_jars = jars

    def more_cookies(self, request: Any) -> list[Cookie]:
        return self._origin_jars.cookies_for(request)

    def copy(self) -> _RunJar:
        """As requests copies a request's jar for each redirect hop: still a run's jar."""
        jar = _RunJar(self._origin_jars)
        jar.update(self)
        return jar


class _Asking(MockRequest):
    """A request as the jar sees it, that says it has no Cookie header yet, so that the jar
    tells what it would send (the real header is then replaced in place, keeping its order)."""

    def has_header(self, name: str) -> bool:
        return name.lower() != "cookie" and super().has_header(name)


class OriginJars:
    """The cookies a run received, one jar per origin, each with the session's own policy."""

    def __init__(self, policy: CookiePolicy, *, keep: bool = True) -> None:
        self.keeping = keep
        self.request_policy = _RequestPolicy()
        self._policy = policy
        # Origin -> its jar. Read without the lock (empty: no origin has set a cookie).
        self.by_origin: dict[str, RequestsCookieJar] = {}
        self._lock = threading.Lock()

    def _jar(self, origin: str) -> RequestsCookieJar:
        jar = self.by_origin.get(origin)
        if jar is None:
            with self._lock:
                jar = self.by_origin.setdefault(origin, _OriginJar(self._policy))
        return jar

    def keep(self, response: requests.Response, *args: Any, **kwargs: Any) -> requests.Response:
        """A response hook, run first on every hop: what the response sets (or deletes) goes
        to its origin's jar, before requests works out the next hop's Cookie header."""
        headers = response.headers
        if self.keeping and (
            "set-cookie" in headers or (self._policy.rfc2965 and "set-cookie2" in headers)
        ):
            request = response.request
            origin = origin_of(request.url) if request.url else None
            if origin is not None:
                extract_cookies_to_jar(self._jar(origin), request, response.raw)
        return response

    def cookies_for(self, request: Any) -> list[Cookie]:
        """The cookies of the request's origin's jar that the jar's policy would send it."""
        if not self.by_origin:
            return []
        origin = _origin_of_request(request)
        jar = self.by_origin.get(origin) if origin is not None else None
        if jar is None:
            return []
        with jar._cookies_lock:
            return cookies_to_send(jar, request)

    def fit(self, prepared: requests.PreparedRequest, *headers: Mapping[str, Any] | None) -> None:
        """Give ``prepared`` (just prepared by ``Session.prepare_request``, which used a jar
        of requests' default policy) the run's jar, and its Cookie header from it. A Cookie
        header set in ``headers`` (the session's, then the request's) is kept as given."""
        held = prepared._cookies
        jar = _RunJar(self)
        stamped = False
        # (``_cookies`` is the jar's dict: asking it is cheap, ``len(jar)`` walks every cookie)
        for cookie in held if held is not None and getattr(held, "_cookies", None) else ():
            if stamp_of(cookie) is None:
                jar.set_cookie(cookie)
            else:
                stamped = True
        prepared._cookies = jar
        # With only the caller's cookies, the header requests worked out is the one to send.
        if not (stamped or self.by_origin) or _explicit_cookie(headers):
            return
        asking = _Asking(prepared)
        jar.add_cookie_header(cast("urllib.request.Request", asking))
        value = asking.get_new_headers().get("Cookie")
        if value is not None:
            prepared.headers["Cookie"] = value
        else:
            prepared.headers.pop("Cookie", None)


def _explicit_cookie(layers: tuple[Mapping[str, Any] | None, ...]) -> bool:
    """Whether headers, merged as requests merges them (None leaves one out), set Cookie."""
    value = None
    for layer in layers:
        for name, given in (layer or {}).items():
            if name.lower() == "cookie":
                value = given
    return value is not None


def lend(jar: CookieJar, *, keep: bool = True) -> tuple[OriginJars, Callable[[], None]]:
    """Lend a session's jar the run's policy; returns the run's jars and what puts the jar's
    own policy back. Cookies an earlier run stamped go back to their origin's jar."""
    own = jar_policy(jar)
    if isinstance(own, _LentPolicy):  # two sessions of this run share one jar
        return own.jars, lambda: None
    jars = OriginJars(own, keep=keep)
    for cookie in jar:
        origin = stamp_of(cookie)
        if origin is not None:
            jars._jar(origin).set_cookie(copy.copy(cookie))
    jar.set_policy(_LentPolicy(own, jars, jar))
    return jars, partial(jar.set_policy, own)
