"""The private parts of http.client, email, urllib3 and http.cookiejar that batchsync stands
on, each looked up here, once, at import. (Four fields are read in place on every header line
or answer, where a call between would cost more than the quick path saves: a connection's
``_buffer`` and state, a message's ``_headers`` and ``_payload``, a header dict's
``_container``; their shape is checked here and gates every such read.)

Each is checked for the shape the code relies on (it exists, takes the parameters expected,
holds the fields expected). Where a quick path's piece is not so, its name here is None (or
its flag False) and the callers take the public way: the same bytes, slower. The hooks a run
overrides (urllib3's ``_new_conn`` and ``_get_conn``, http.cookiejar's ``_cookies_for_request``
and a jar's ``_policy``) have no public way that keeps the contract (a peer checked before its
first byte, one cookie jar per origin): without them the import fails, saying what is missing.
"""

from __future__ import annotations

import http.client
import inspect
import operator
import socket
import time
import types
from collections.abc import Callable, Collection, Iterable, Mapping
from http.cookiejar import Cookie, CookieJar, CookiePolicy
from typing import TYPE_CHECKING, Any, BinaryIO

import urllib3.connection
import urllib3.connectionpool
from requests.cookies import RequestsCookieJar
from requests.structures import CaseInsensitiveDict
from urllib3 import HTTPHeaderDict


def takes(function: object, *parameters: str, defaults: tuple[object, ...] | None = None) -> bool:
    """Whether ``function`` is Python code taking exactly ``parameters`` (no ``*args``,
    ``**kwargs`` or keyword-only ones), with ``defaults`` for the last of them."""
    code = getattr(function, "__code__", None)
    return (
        code is not None
        and code.co_varnames[: code.co_argcount] == parameters
        and not code.co_kwonlyargcount
        and not code.co_flags & (inspect.CO_VARARGS | inspect.CO_VARKEYWORDS)
        and getattr(function, "__defaults__", None) == defaults
    )


def rebound(function: Callable[..., Any], **replacements: object) -> Callable[..., Any] | None:
    """``function``'s own code run with ``replacements`` in place of the globals of those
    names, every other global as its module holds it; None unless the code names them all."""
    code = function.__code__
    if not set(replacements) <= set(code.co_names):
        return None
    globals_ = {**function.__globals__, **replacements}
    return types.FunctionType(
        code, globals_, function.__name__, function.__defaults__, function.__closure__
    )


def _require(found: bool, what: str) -> None:
    if not found:
        raise ImportError(f"batchsync needs {what}, which this release does not have")


# http.client: ``putheader`` appends a line with ``_output`` to the connection's ``_buffer``,
# in the state ``_CS_REQ_STARTED`` alone (between putrequest and endheaders). (Read in place,
# on every header line, by ``connections._Tracked.putheader``, as ``StdlibConnection`` types
# them, while ``HEADER_LINES_KEPT`` says they are as found here.)
_OUTPUT = "_output"
STDLIB_OUTPUT: object = vars(http.client.HTTPConnection).get(_OUTPUT)
REQUEST_STARTED: object = getattr(http.client, "_CS_REQ_STARTED", None)


_CONNECTION_FIELDS = vars(http.client.HTTPConnection("localhost"))
HEADER_LINES_KEPT = (
    takes(STDLIB_OUTPUT, "self", "s")
    and REQUEST_STARTED is not None
    and type(_CONNECTION_FIELDS.get("_buffer")) is list
    and _CONNECTION_FIELDS.get("_HTTPConnection__state") is not None
)


def stock_header_lines(connection: type, stock: tuple[type, ...]) -> bool:
    """Whether ``connection`` makes its header lines with ``putheader`` and ``_output`` of the
    ``stock`` classes alone: no class of its own (a signing mixin, say) between them, whose
    line could differ from one request or origin to the next."""
    return not any(
        "putheader" in vars(cls) or _OUTPUT in vars(cls)
        for cls in connection.__mro__
        if cls not in stock
    )


# http.client's header reading: ``begin(self)`` reads the block through a global
# ``parse_headers(fp, _class=HTTPMessage)``, whose lines ``_read_headers(fp)`` reads.
_READ_HEADERS = getattr(http.client, "_read_headers", None)
READ_HEADERS: Callable[[BinaryIO], list[bytes]] | None = (
    _READ_HEADERS if takes(_READ_HEADERS, "fp") else None
)


STDLIB_BEGIN = http.client.HTTPResponse.begin
STDLIB_PARSE_HEADERS = http.client.parse_headers
_HTTP_CLIENT_NAMES = vars(http.client)  # (live: a later patch of a name is seen)


def header_reading_unchanged() -> bool:
    """Whether http.client's ``begin``, ``parse_headers`` and ``_read_headers`` are still the
    ones found at import (a patch is honoured by stepping aside)."""
    return (
        http.client.HTTPResponse.begin is STDLIB_BEGIN
        and http.client.parse_headers is STDLIB_PARSE_HEADERS
        and _HTTP_CLIENT_NAMES.get("_read_headers") is _READ_HEADERS
    )


def begin_parsing_with(
    begin: Callable[..., Any], parse_headers: Callable[..., http.client.HTTPMessage]
) -> Callable[[http.client.HTTPResponse], None] | None:
    """``begin`` (http.client's own) run with ``parse_headers`` in place of the stdlib's; None
    for a ``begin`` (or a header reading) not built the way this expects."""
    if not (
        takes(begin, "self")
        and not begin.__code__.co_freevars
        and READ_HEADERS is not None
        and takes(STDLIB_PARSE_HEADERS, "fp", "_class", defaults=(http.client.HTTPMessage,))
        and MESSAGE_FIELDS
    ):
        return None
    return rebound(begin, parse_headers=parse_headers)


# email.message.Message: its header fields, a list of (name, value), in ``_headers``, and its
# body in ``_payload`` (an HTTPMessage's is ""). (Read and set in place, on every answer, by
# ``headers.QuickMessage`` and ``headers.parse_headers``, while ``MESSAGE_FIELDS`` holds: a
# call between costs more than the quick reading saves.)
def _message_fields_shape() -> bool:
    probe = http.client.HTTPMessage()
    probe["Name"] = "value"
    fields = vars(probe)
    return fields.get("_headers") == [("Name", "value")] and "_payload" in fields


MESSAGE_FIELDS = _message_fields_shape()


# urllib3.connection's ``getresponse`` and the module's names it reads a response's headers
# with (``_normalize_header_values`` came with urllib3 2.8: an older one has none).
URLLIB3_GETRESPONSE: Callable[..., Any] = urllib3.connection.HTTPConnection.getresponse
_URLLIB3_NAMES = vars(urllib3.connection)  # (live: a later patch of a name is seen)
_GETRESPONSE_NAMES = ("assert_header_parsing", "_normalize_header_values", "HTTPHeaderDict")
URLLIB3_ASSERT_HEADER_PARSING: Any = _URLLIB3_NAMES.get(_GETRESPONSE_NAMES[0])
URLLIB3_NORMALIZE: Any = _URLLIB3_NAMES.get(_GETRESPONSE_NAMES[1])
URLLIB3_HEADER_DICT: Any = _URLLIB3_NAMES.get(_GETRESPONSE_NAMES[2])


def getresponse_with(
    getresponse: Callable[..., Any], *stand_ins: Callable[..., Any]
) -> Callable[[Any], Any] | None:
    """urllib3's ``getresponse`` run with ``stand_ins`` for its ``assert_header_parsing``,
    ``_normalize_header_values`` and ``HTTPHeaderDict``; None for a ``getresponse`` not built
    the way this expects (urllib3 2.x's) or a release without one of those names."""
    originals = (URLLIB3_ASSERT_HEADER_PARSING, URLLIB3_NORMALIZE, URLLIB3_HEADER_DICT)
    if getresponse.__code__.co_freevars != ("__class__",) or None in originals:
        return None
    return rebound(getresponse, **dict(zip(_GETRESPONSE_NAMES, stand_ins, strict=True)))


def getresponse_names_unchanged() -> bool:
    """Whether urllib3.connection's names that a quick ``getresponse`` stands in for are
    still the ones found at import (a caller may patch ``assert_header_parsing``)."""
    names = _URLLIB3_NAMES
    return (
        names.get("assert_header_parsing") is URLLIB3_ASSERT_HEADER_PARSING
        and names.get("_normalize_header_values") is URLLIB3_NORMALIZE
        and names.get("HTTPHeaderDict") is URLLIB3_HEADER_DICT
    )


# urllib3's HTTPHeaderDict keeps each name under its lower case, as [name, value, value, ...].
def _container_shape() -> bool:
    probe = HTTPHeaderDict()
    probe.add("Name", "a")
    probe.add("name", "b")
    return vars(probe).get("_container") == {"name": ["Name", "a", "b"]}


# (``type(headers) is QUICK_HEADER_DICT``: a header dict whose ``_container`` may be read in
# place, as ``headers``, ``fastlane`` and ``lower_names`` read it on every answer)
QUICK_HEADER_DICT: type[HTTPHeaderDict] | None = HTTPHeaderDict if _container_shape() else None
# requests' CaseInsensitiveDict keeps each name under its lower case, as (name, value).
_STORE_SHAPE = vars(CaseInsensitiveDict({"Name": "a"})).get("_store") == {"name": ("Name", "a")}


def lower_names(headers: Mapping[str, str]) -> Collection[str] | None:
    """The names of ``headers`` in lower case, as the case-insensitive dicts of urllib3 (an
    answer of the fast lane) and requests (of the requests way) keep them: looked up at a
    dict's cost, not a method call each. None for any other mapping."""
    if type(headers) is QUICK_HEADER_DICT:
        return headers._container.keys()
    if type(headers) is CaseInsensitiveDict and _STORE_SHAPE:
        store: dict[str, tuple[str, str]] = vars(headers)["_store"]
        return store.keys()
    return None


def items_named(headers: Mapping[str, str], wanted: frozenset[str]) -> Iterable[tuple[str, str]]:
    """The (name, value) pairs of ``headers.items()`` whose lower-case name is in ``wanted``,
    as it gives them (urllib3's each value apart, requests' joined): looked up in urllib3's and
    requests' dicts, not a walk over every header of every answer. Another mapping: all of
    its pairs."""
    if type(headers) is QUICK_HEADER_DICT:
        container = headers._container
        return [
            (name, value) for name in wanted & container.keys() for value in container[name][1:]
        ]
    if type(headers) is CaseInsensitiveDict and _STORE_SHAPE:
        store: dict[str, tuple[str, str]] = vars(headers)["_store"]
        return [store[name] for name in wanted & store.keys()]
    return headers.items()


# urllib3's hooks: a connection opens its socket in ``_new_conn(self)``, a pool hands out a
# kept-alive connection in ``_get_conn(self, timeout=None)``.
_require(takes(vars(urllib3.connection.HTTPConnection).get("_new_conn"), "self"), "_new_conn")
_GET_CONN = vars(urllib3.connectionpool.HTTPConnectionPool).get("_get_conn")
_require(takes(_GET_CONN, "self", "timeout", defaults=(None,)), "_get_conn")

if TYPE_CHECKING:

    class StdlibConnection:
        """What the mixins into urllib3's connection classes read or reach through ``super()``."""

        _buffer: list[bytes]
        _HTTPConnection__state: object
        _output: object

        def _new_conn(self) -> socket.socket: ...
        def putheader(self, header: str, *values: str) -> None: ...
        def getresponse(self) -> Any: ...

    _Pool = urllib3.connectionpool.HTTPConnectionPool
else:
    StdlibConnection = _Pool = object


class ConnectionHooks(StdlibConnection):
    """Mixed into urllib3's connection classes: ``connected`` sees a socket before any byte."""

    def connected(self, sock: socket.socket) -> None:
        """Called with a new connection's socket (closed and raised from on a refusal)."""

    def _new_conn(self) -> socket.socket:
        sock = super()._new_conn()
        self.connected(sock)
        return sock


class PoolHooks(_Pool):
    """Mixed into urllib3's pool classes: ``taken`` sees the socket of each connection
    handed out (a function set on the class, called without the pool)."""

    taken: Callable[[socket.socket | None], object]

    def _get_conn(self, timeout: float | None = None) -> Any:
        connection: Any = super()._get_conn(timeout)
        self.taken(connection.sock)
        return connection


# http.cookiejar: a jar works out a request's cookies in ``_cookies_for_request`` (after it
# sets its policy's and its own ``_now``), keeps its policy in ``_policy`` and its cookies in
# ``_cookies``, {domain: {path: {name: cookie}}}.
_STDLIB_COOKIES_FOR_REQUEST: Any = vars(CookieJar).get("_cookies_for_request")
_NOW = "_now"


def _jar_shape() -> bool:
    probe = CookieJar()
    return (
        takes(_STDLIB_COOKIES_FOR_REQUEST, "self", "request")
        and "_cookies_for_request" in CookieJar.add_cookie_header.__code__.co_names
        and isinstance(vars(probe).get("_policy"), CookiePolicy)
        and vars(probe).get("_cookies") == {}
    )


_require(_jar_shape(), "http.cookiejar's _cookies_for_request and _policy")
jar_policy: Callable[[CookieJar], CookiePolicy] = operator.attrgetter("_policy")
# (read without the jar's lock or a walk of its cookies: empty, the jar holds none)
jar_cookies: Callable[[CookieJar], dict[str, dict[str, dict[str, Cookie]]]] = operator.attrgetter(
    "_cookies"
)


def jar_holds(jar: CookieJar, domain: str, path: str, name: str) -> bool:
    return name in jar_cookies(jar).get(domain, {}).get(path, {})


# (the time the jar set on a policy before asking it)
policy_now: Callable[[CookiePolicy], int] = operator.attrgetter(_NOW)


def set_policy_now(policy: CookiePolicy, now: int) -> None:
    setattr(policy, _NOW, now)


def cookies_to_send(jar: CookieJar, request: Any) -> list[Cookie]:
    """The cookies of ``jar`` its policy lets go to ``request``, worked out as the jar's
    ``add_cookie_header`` does (the caller holds the jar's lock)."""
    now = int(time.time())
    set_policy_now(jar_policy(jar), now)
    setattr(jar, _NOW, now)
    found: list[Cookie] = _STDLIB_COOKIES_FOR_REQUEST(jar, request)
    return found


class JarHooks(RequestsCookieJar):
    """A requests jar whose Cookie header takes ``more_cookies(request)`` too."""

    def more_cookies(self, request: Any) -> list[Cookie]:
        return []

    def _cookies_for_request(self, request: Any) -> list[Cookie]:
        found: list[Cookie] = _STDLIB_COOKIES_FOR_REQUEST(self, request)
        return found + self.more_cookies(request)
