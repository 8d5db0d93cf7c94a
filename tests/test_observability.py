"""Progress, logs, metrics and traces: what a user or an operator sees of a run."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
import threading
import time
import types
import urllib.request
import uuid
from pathlib import Path
from typing import Any

import pytest

from batchsync import AttemptRecord, Backoff, Result, fetch_all
from batchsync.core.task import Route, Task
from batchsync.run.progress import Progress, in_notebook, wanted

from .mockserver import MockServerProcess

FAST = Backoff(base=0.02, jitter=0.0)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples a Prometheus server would read, by name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_progress_counts_retrying_items_and_requests() -> None:
    progress = Progress(total=2)
    task = Task("u", None, Route(lambda bound, so_far: None))  # type: ignore[arg-type, return-value]
    progress.attempt_finished(0, task, AttemptRecord(1, 503, "status", 0.1, wait=0.5))
    progress.attempt_finished(1, task, AttemptRecord(1, 503, "status", 0.1, wait=0.5))
    assert len(progress._retrying) == 2
    progress.attempt_started(0)
    progress.item_finished(Result(1, "u", False, attempts=3))
    assert len(progress._retrying) == 0
    assert progress.requests == 3


def test_progress_is_on_for_a_notebook_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    assert wanted(True) and not wanted(False)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: False, raising=False)
    assert not in_notebook()
    assert wanted(None) is False
    shell_class = type("ZMQInteractiveShell", (), {"__module__": "ipykernel.zmqshell"})
    fake = types.SimpleNamespace(get_ipython=shell_class)
    monkeypatch.setitem(sys.modules, "IPython", fake)
    assert in_notebook()
    assert wanted(None) is True


def test_a_forced_progress_bar_shows_counts_and_rate(
    server: MockServerProcess, capsys: pytest.CaptureFixture[str]
) -> None:
    fetch_all([f"{server.url}/ok/{n}?delay=0.1" for n in range(10)], progress=True)
    err = capsys.readouterr().err
    assert "10/10" in err
    assert "ok=10" in err and "failed=0" in err and "retrying=0" in err and "req_s=" in err


@pytest.mark.integration
def test_log_records_are_structured_and_redacted(
    server: MockServerProcess, caplog: pytest.LogCaptureFixture
) -> None:
    marker = uuid.uuid4().hex[:8]
    port = server.url.rsplit(":", 1)[1]
    down = f"http://user:hunter2@127.0.0.1:{port}/503/{marker}"
    with caplog.at_level(logging.INFO, logger="batchsync"):
        fetch_all(
            [down, {"url": f"{server.url}/404/{marker}", "headers": {"Cookie": "c=crumb"}}],
            attempts=2, backoff=FAST, headers={"Authorization": "Bearer s3cr3t"},
        )  # fmt: skip
    retries = [r for r in caplog.records if r.getMessage().startswith("retry ")]
    failures = [r for r in caplog.records if r.getMessage().startswith("failed ")]
    summaries = [r for r in caplog.records if r.getMessage().startswith("batch done")]
    assert len(retries) == 1 and len(failures) == 2 and len(summaries) == 1
    retry = retries[0]
    assert (retry.url, retry.attempt, retry.status_code, retry.error_kind) == (  # type: ignore[attr-defined]
        f"http://***@127.0.0.1:{port}/503/{marker}", 1, 503, "status",
    )  # fmt: skip
    assert retry.wait == pytest.approx(0.02)  # type: ignore[attr-defined]
    assert {r.error_kind for r in failures} == {"status"}  # type: ignore[attr-defined]
    assert (summaries[0].total, summaries[0].failed) == (2, 2)  # type: ignore[attr-defined]
    for secret in ("user", "hunter2", "s3cr3t", "crumb"):
        assert secret not in caplog.text


def test_the_library_installs_only_a_null_handler() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import batchsync, logging; "
         "print([type(h).__name__ for h in logging.getLogger('batchsync').handlers])"],
        capture_output=True, text=True, check=True, timeout=60,
    )  # fmt: skip
    assert done.stdout.strip() == "['NullHandler']"


@pytest.mark.integration
def test_metrics_are_served_from_the_callers_registry(server: MockServerProcess) -> None:
    from prometheus_client import CollectorRegistry, start_http_server

    registry = CollectorRegistry()
    port = free_port()
    http_server, _ = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        marker = uuid.uuid4().hex[:8]
        items = [f"{server.url}/ok/{marker}-{n}" for n in range(4)] + [f"{server.url}/503/{marker}"]
        fetch_all(items, concurrency=1, attempts=3, backoff=FAST, metrics=registry, rate=20)
        samples = scrape(port)
    finally:
        http_server.shutdown()
    assert samples[("batchsync_attempts_total", (("error_kind", ""), ("outcome", "ok")))] == 4
    failed = (("error_kind", "status"), ("outcome", "failed"))
    assert samples[("batchsync_attempts_total", failed)] == 3
    assert samples[("batchsync_results_total", failed)] == 1
    assert samples[("batchsync_retries_total", ())] == 2
    assert samples[("batchsync_attempt_seconds_count", ())] == 7
    assert samples[("batchsync_items_in_flight", ())] == 0
    assert samples[("batchsync_wait_seconds_total", (("cause", "backoff"),))] > 0
    assert ("batchsync_wait_seconds_total", (("cause", "rate"),)) in samples


@pytest.mark.integration
def test_the_cli_serves_metrics_while_the_run_goes(
    server: MockServerProcess, tmp_path: Path
) -> None:
    pytest.importorskip("prometheus_client")
    marker = uuid.uuid4().hex[:8]
    (tmp_path / "urls.txt").write_text(
        "".join(f"{server.url}/ok/{marker}-{n}?delay=0.4\n" for n in range(20))
    )
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "batchsync", "urls.txt", "-c", "4", "--metrics-port", str(port)],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    ok = ("batchsync_results_total", (("error_kind", ""), ("outcome", "ok")))
    in_flight = ("batchsync_items_in_flight", ())
    try:
        # Mid-run, as often as the machine lets us look: a first round of four done, four
        # more in flight (each round holds that for most of its 0.4 s).
        seen: list[tuple[float, float]] = []
        give_up = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < give_up:
            try:
                samples = scrape(port)
            except OSError:  # not serving yet
                time.sleep(0.05)
                continue
            seen.append((samples.get(ok, 0.0), samples.get(in_flight, 0.0)))
            if samples.get(ok, 0.0) >= 4 and samples.get(in_flight) == 4:
                break
            time.sleep(0.02)
        assert seen and seen[-1][0] >= 4 and seen[-1][1] == 4, seen
    finally:
        process.communicate(timeout=60)
    assert process.returncode == 0


def test_a_busy_metrics_port_is_a_usage_error(tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [sys.executable, "-m", "batchsync", "urls.txt", "--metrics-port", str(port)],
            cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 2
    assert done.stderr.startswith(f"Error: cannot serve metrics on {port}")


@pytest.mark.integration
def test_each_item_is_a_span_with_a_child_span_per_attempt(server: MockServerProcess) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    marker = uuid.uuid4().hex[:8]
    items: list[str | dict[str, str]] = [
        {"url": f"{server.url}/ok/{marker}", "id": "a"},
        f"{server.url}/503/{marker}",
    ]
    fetch_all(items, attempts=2, backoff=FAST, tracer=provider.get_tracer("test"))
    spans = exporter.get_finished_spans()
    attributes = {id(span): dict(span.attributes or {}) for span in spans}
    roots = {
        attributes[id(span)]["batchsync.index"]: span
        for span in spans
        if span.name == "batchsync.item"
    }
    assert sorted(roots) == [0, 1]  # type: ignore[type-var]
    assert attributes[id(roots[0])]["batchsync.id"] == "a"
    assert attributes[id(roots[0])]["batchsync.ok"] is True
    assert attributes[id(roots[1])]["batchsync.error_kind"] == "status"
    children: dict[object, list[dict[str, Any]]] = {0: [], 1: []}
    for span in spans:
        if span.name == "batchsync.attempt":
            assert span.parent is not None
            (parent,) = [
                i for i, root in roots.items() if root.context.span_id == span.parent.span_id
            ]
            children[parent].append(attributes[id(span)])
    assert [a["batchsync.status_code"] for a in children[0]] == [200]
    failing = sorted(children[1], key=lambda a: int(a["batchsync.attempt"]))
    assert [a["batchsync.status_code"] for a in failing] == [503, 503]
    assert failing[0]["batchsync.retry_wait"] == pytest.approx(0.02)
    assert "batchsync.retry_wait" not in failing[1]


def test_no_tracer_no_spans() -> None:
    from batchsync.contrib.otel import tracer_for

    assert tracer_for(None) is None  # the API is installed, but no provider is configured


def test_hooks_run_on_worker_threads() -> None:
    threads: set[str] = set()
    lock = threading.Lock()

    def on_result(result: Result) -> None:
        with lock:
            threads.add(threading.current_thread().name)

    from batchsync import run_all

    run_all(lambda n: n, range(20), concurrency=4)
    fetch_all(["ftp://nowhere.test/x"], on_result=on_result)
    assert threads and all(name.startswith("batchsync") for name in threads)
