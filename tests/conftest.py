"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from .mockserver import MockServerProcess, start_mock_server


@pytest.fixture(scope="session")
def server() -> Iterator[MockServerProcess]:
    running = start_mock_server()
    yield running
    running.process.terminate()
    running.process.wait(timeout=10)


@pytest.fixture
def fresh_server(server: MockServerProcess) -> MockServerProcess:
    """The session's mock server with its stats cleared."""
    server.reset()
    return server


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A Dask client of a local cluster of two worker processes (skipped without dask)."""
    distributed = pytest.importorskip("distributed")
    import dask

    from batchsync.contrib.dask import PROFILER_OFF

    # (the workers take the config as they start, and so does one started again after a
    # worker was lost: it holds for the cluster's whole life)
    with dask.config.set(PROFILER_OFF):
        local = distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        )
        client = distributed.Client(local)
        yield client
        client.close()
        local.close()
