"""One benchmark run in its own process: METHOD fetches COUNT distinct URLs under BASE with
CONCURRENCY workers, parsing each JSON body, and prints one JSON line with what it measured.

    python scripts/bench_client.py baseline http://127.0.0.1:8080 32 5000

Methods: baseline (ThreadPoolExecutor + one requests.Session per thread), requests-futures,
httpx (threads sharing one Client), urllib3 (threads sharing one PoolManager), aiohttp, and
batchsync (``fetch_all``). Each is written the way its documentation suggests.
"""

from __future__ import annotations

import importlib
import json
import resource
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any


def run_baseline(urls: list[str], concurrency: int) -> int:
    import requests

    local = threading.local()

    def fetch(url: str) -> Any:
        session = getattr(local, "session", None)
        if session is None:
            session = local.session = requests.Session()
        response = session.get(url, timeout=10)
        response.raise_for_status()
        return response.json()

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(1 for body in pool.map(fetch, urls) if body)


def run_requests_futures(urls: list[str], concurrency: int) -> int:
    from requests_futures.sessions import FuturesSession

    with FuturesSession(max_workers=concurrency) as session:
        futures = [session.get(url, timeout=10) for url in urls]
        return sum(1 for future in futures if future.result().json())


def run_httpx(urls: list[str], concurrency: int) -> int:
    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    with httpx.Client(limits=limits, timeout=10) as client:

        def fetch(url: str) -> Any:
            response = client.get(url)
            response.raise_for_status()
            return response.json()

        with ThreadPoolExecutor(concurrency) as pool:
            return sum(1 for body in pool.map(fetch, urls) if body)


def run_urllib3(urls: list[str], concurrency: int) -> int:
    import urllib3

    manager = urllib3.PoolManager(maxsize=concurrency, retries=False, timeout=10)

    def fetch(url: str) -> Any:
        response = manager.request("GET", url)
        return json.loads(response.data)

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(1 for body in pool.map(fetch, urls) if body)


def run_aiohttp(urls: list[str], concurrency: int) -> int:
    import asyncio

    import aiohttp

    async def main() -> int:
        connector = aiohttp.TCPConnector(limit=concurrency)
        timeout = aiohttp.ClientTimeout(total=10)
        async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
            gate = asyncio.Semaphore(concurrency)

            async def fetch(url: str) -> Any:
                async with gate, session.get(url) as response:
                    response.raise_for_status()
                    return await response.json()

            bodies = await asyncio.gather(*(fetch(url) for url in urls))
            return sum(1 for body in bodies if body)

    return asyncio.run(main())


def run_batchsync(urls: list[str], concurrency: int) -> int:
    from batchsync import fetch_all

    return len(fetch_all(urls, concurrency=concurrency).ok)


METHODS: dict[str, Callable[[list[str], int], int]] = {
    "baseline": run_baseline,
    "requests-futures": run_requests_futures,
    "httpx": run_httpx,
    "urllib3": run_urllib3,
    "aiohttp": run_aiohttp,
    "batchsync": run_batchsync,
}


# What each method imports, done before the clock starts so that start-up is not measured.
IMPORTS = {
    "baseline": "requests",
    "requests-futures": "requests_futures.sessions",
    "httpx": "httpx",
    "urllib3": "urllib3",
    "aiohttp": "aiohttp",
    "batchsync": "batchsync",
}


def main() -> None:
    method, base, concurrency, count = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    urls = [f"{base}/item/{n}" for n in range(count)]
    run = METHODS[method]
    importlib.import_module(IMPORTS[method])
    before = resource.getrusage(resource.RUSAGE_SELF)
    started = time.perf_counter()
    ok = run(urls, concurrency)
    elapsed = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    print(json.dumps({"ok": ok, "seconds": elapsed, "cpu": cpu, "rss_mib": after.ru_maxrss / 1024}))


if __name__ == "__main__":
    main()
