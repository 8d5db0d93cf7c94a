"""A caller's session is lent to a run, fitted for it, and handed back exactly as it was."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import requests
import requests.auth
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.util import Retry

from batchsync import fetch_all
from batchsync.core.redact import Secrets
from batchsync.http.connections import fit_session
from batchsync.http.guard import Guard
from batchsync.http.session import auth_secrets, lent_secrets
from batchsync.http.transport import Transport
from tests.mockserver import MockServerProcess


def adapter_state(session: requests.Session) -> list[tuple[Any, ...]]:
    """What a run could change in a session's adapters, by identity where objects."""
    state = []
    for prefix, adapter in session.adapters.items():
        assert isinstance(adapter, HTTPAdapter)
        manager = adapter.poolmanager
        state.append(
            (prefix, id(adapter), {name: id(value) for name, value in vars(adapter).items()},
             adapter._pool_connections, adapter._pool_maxsize, dict(manager.connection_pool_kw),
             dict(manager.pool_classes_by_scheme))
        )  # fmt: skip
    return state


class TunedAdapter(HTTPAdapter):
    """A caller's adapter that sets its own pool options, as TLS-tuning adapters do."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        kwargs["socket_options"] = [(6, 1, 1)]  # TCP_NODELAY
        super().init_poolmanager(*args, **kwargs)


@pytest.mark.integration
def test_a_callers_session_is_the_same_after_a_run(server: MockServerProcess) -> None:
    session = requests.Session()
    session.mount("http://", TunedAdapter(max_retries=Retry(2)))
    session.headers["X-Caller"] = "1"
    hooks = dict(session.hooks)
    before = adapter_state(session)
    items = [f"{server.url}/ok/lent-{i}" for i in range(6)]
    rs = fetch_all(items, session=session, concurrency=24)
    assert all(r.ok for r in rs)
    # deny_private refuses 127.0.0.1 during the run only.
    refused = fetch_all(items[:1], session=session, deny_private=True)
    assert refused[0].error_kind == "invalid_request"
    assert adapter_state(session) == before
    assert session.hooks == hooks
    assert session.get(f"{server.url}/ok/after", timeout=10).status_code == 200


def test_during_a_run_pools_fit_the_concurrency_and_retries_are_off() -> None:
    session = requests.Session()
    session.mount("http://", TunedAdapter())
    ledger = Transport(None, 1).ledger
    restore = fit_session(session, 48, ledger)
    try:
        for prefix, adapter in session.adapters.items():
            assert isinstance(adapter, HTTPAdapter)
            manager = adapter.poolmanager
            assert manager.connection_pool_kw["maxsize"] == 48
            assert adapter.max_retries.total == 0
            assert manager.pool_classes_by_scheme == ledger.pool_classes
            if prefix == "http://":  # the adapter's own pool options stay
                assert manager.connection_pool_kw["socket_options"] == [(6, 1, 1)]
    finally:
        restore()


def test_every_run_gets_its_own_ledger_and_peer_check() -> None:
    session = requests.Session()
    adapter = session.adapters["http://"]
    assert isinstance(adapter, HTTPAdapter)
    for guard in (None, Guard()):
        transport = Transport(session, 4, guard=guard)
        pool_class: Any = adapter.poolmanager.pool_classes_by_scheme["http"]
        connection_class = pool_class.ConnectionCls
        assert connection_class.ledger is transport.ledger
        assert connection_class.ledger.guard is guard
        transport.close()


def test_a_session_serves_one_run_at_a_time() -> None:
    session = requests.Session()
    first = Transport(session, 2)
    with pytest.raises(ValueError, match="in use by another batchsync run"):
        Transport(session, 2)
    first.close()
    Transport(session, 2).close()  # free again once the first run is over


@pytest.mark.integration
def test_two_runs_with_one_session_from_two_threads_leave_it_as_it_was(
    server: MockServerProcess,
) -> None:
    session = requests.Session()
    before = adapter_state(session)
    outcomes: list[str] = []

    def run(name: str) -> None:
        try:
            rs = fetch_all([f"{server.url}/ok/{name}?delay=0.2"] * 3, session=session)
            outcomes.append("ok" if all(r.ok for r in rs) else "failed")
        except ValueError:
            outcomes.append("refused")

    threads = [threading.Thread(target=run, args=(f"t{i}",)) for i in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert "ok" in outcomes and set(outcomes) <= {"ok", "refused"}
    assert adapter_state(session) == before


@pytest.mark.integration
def test_an_adapter_mounted_twice_is_lent_once_and_handed_back(server: MockServerProcess) -> None:
    adapter = HTTPAdapter(max_retries=Retry(3))
    session = requests.Session()
    session.mount("http://", adapter)
    session.mount("https://", adapter)
    before = adapter_state(session)
    url = f"{server.url}/ok/mounted-twice"
    assert fetch_all([url], session=session)[0].ok
    assert fetch_all([url], session=session, deny_private=True)[0].error_kind == "invalid_request"
    assert adapter_state(session) == before
    assert adapter.max_retries.total == 3
    assert session.get(url, timeout=10).status_code == 200
    assert fetch_all([url], session=session)[0].ok  # no guard left over from the last run


class OwnPool(HTTPConnectionPool):
    """A caller's own pool class, as some adapters install."""


def test_an_adapters_own_pool_classes_are_watched_and_checked(
    monkeypatch: pytest.MonkeyPatch, server: MockServerProcess
) -> None:
    session = requests.Session()
    adapter = session.adapters["http://"]
    assert isinstance(adapter, HTTPAdapter)
    adapter.poolmanager.pool_classes_by_scheme = {"http": OwnPool, "https": OwnPool}
    # The name check passes (as after DNS rebinding); the connection's peer must still fail.
    monkeypatch.setattr(Guard, "check", lambda self, host: None)
    rs = fetch_all([f"{server.url}/ok/own-pool"], session=session, deny_private=True)
    assert rs[0].error_kind == "invalid_request"
    assert "connected to 127.0.0.1" in (rs[0].error or "")
    assert adapter.poolmanager.pool_classes_by_scheme["http"] is OwnPool


class TokenAuth(requests.auth.AuthBase):
    """A caller's own auth, its token in a header whose name says nothing of secrets."""

    def __init__(self, token: str) -> None:
        self.token = token

    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        request.headers["X-Auth-Token"] = f"tok {self.token}"
        return request


class BrokenAuth(requests.auth.AuthBase):
    def __call__(self, request: requests.PreparedRequest) -> requests.PreparedRequest:
        raise RuntimeError("needs a real request")


def test_what_a_lent_session_holds_is_secret() -> None:
    session = requests.Session()
    session.headers.update(
        {"Authorization": "Bearer s3cr3t-bearer", "X-Declared": "decl4red", "X-Plain": "visible"}
    )
    session.params = {"api_key": "par4mkey", "page": "2"}
    session.proxies = {"http": "http://puser:ppassword@127.0.0.1:3128", "no_proxy": "x"}
    session.cookies.set("sid", "c00kie-value", domain="example.test")
    session.auth = ("ann", "basicpass")
    found = lent_secrets(session, Secrets.of(declared=["X-Declared"]))
    assert found >= {
        "Bearer s3cr3t-bearer", "decl4red", "par4mkey", "puser", "ppassword",
        "puser:ppassword", "sid=c00kie-value", "basicpass", "ann:basicpass",
    }  # fmt: skip
    assert not found & {"visible", "2", "x"}


def test_what_an_auth_sends_is_secret_whatever_it_is() -> None:
    assert auth_secrets(None) == set()
    assert auth_secrets(requests.auth.HTTPBasicAuth("user1", "pa55word")) >= {
        "user1",
        "pa55word",
        "user1:pa55word",
        "Basic dXNlcjE6cGE1NXdvcmQ=",
    }
    assert auth_secrets(requests.auth.HTTPDigestAuth("user2", "digestpw")) >= {"digestpw"}
    assert auth_secrets(TokenAuth("t0ken-attr")) == {"tok t0ken-attr"}
    assert auth_secrets(BrokenAuth()) == set()  # masked by shape only


@pytest.mark.integration
@pytest.mark.parametrize("lent", ["instance", "factory"])
def test_a_lent_sessions_secret_headers_are_masked_in_what_leaves(
    server: MockServerProcess, caplog: pytest.LogCaptureFixture, lent: str
) -> None:
    """Issue 34: a hook raising with the session's Authorization and a declared header in
    its message showed them verbatim in the error, the Result's repr and the log."""

    def made() -> requests.Session:
        session = requests.Session()
        session.headers["Authorization"] = "Bearer canaryAuthZ0123"
        session.headers["X-Sess-Secret"] = "canary2"
        session.auth = TokenAuth("canaryTok3n")

        def hook(response: requests.Response, *args: Any, **kwargs: Any) -> None:
            sent = {name: str(value) for name, value in response.request.headers.items()}
            raise RuntimeError(
                f"{sent['Authorization']} and {sent['X-Sess-Secret']} and {sent['X-Auth-Token']}"
            )

        session.hooks["response"].append(hook)
        return session

    source: Any = made() if lent == "instance" else made
    with caplog.at_level(logging.DEBUG):
        rs = fetch_all(
            [f"{server.url}/ok/lent-secret"], session=source, secret_headers=("X-Sess-Secret",),
            attempts=1,
        )  # fmt: skip
    assert rs[0].error == "RuntimeError: *** and *** and ***"
    shown = f"{rs[0].error} {rs[0]!r} {rs!r} {rs[0].to_dict()} {caplog.text}"
    assert "canary" not in shown
    assert "failed " in caplog.text
