"""Shared fixtures."""

from __future__ import annotations

from collections.abc import Iterator

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
