"""A caller's session is lent to a run, fitted for it, and handed back exactly as it was."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import requests
from requests.adapters import HTTPAdapter
from urllib3.connectionpool import HTTPConnectionPool
from urllib3.util import Retry

from batchsync import fetch_all
from batchsync.guard import Guard
from batchsync.transport import Transport, fit_session
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
