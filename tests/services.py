"""Real services the tests start on 127.0.0.1."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


@contextlib.contextmanager
def redis_server(password: str | None = None) -> Iterator[str]:
    """A real redis-server on 127.0.0.1 (CI installs it; elsewhere its absence skips); yields
    its URL, with the password in it when one is required."""
    redis = pytest.importorskip("redis", reason="the redis extra is not installed")
    binary = shutil.which("redis-server")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed (the Makefile installs it for CI)")
        pytest.skip("redis-server is not installed")
    port = free_port()
    command = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    if password is not None:
        command += ["--requirepass", password]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"redis://{'' if password is None else f':{password}@'}127.0.0.1:{port}/0"
    client = redis.Redis.from_url(url)
    try:
        for _ in range(100):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        yield url
    finally:
        client.close()
        process.terminate()
        process.wait(timeout=10)
