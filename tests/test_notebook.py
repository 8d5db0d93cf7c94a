"""examples/quickstart.ipynb run end to end on a real IPython kernel."""

from __future__ import annotations

import time
from typing import Any

import pytest

from .mockserver import ROOT, MockServerProcess

pytestmark = pytest.mark.integration


def texts(cell: Any) -> str:
    """Everything a cell showed, as text: stream output, plain text and HTML."""
    shown = []
    for output in cell.get("outputs", []):
        shown.append(output.get("text", ""))
        data = output.get("data", {})
        shown.append(data.get("text/plain", ""))
        shown.append(data.get("text/html", ""))
    return "\n".join(shown)


def test_the_quickstart_notebook_runs_and_shows_the_batch() -> None:
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    notebook = nbformat.read(ROOT / "examples" / "quickstart.ipynb", as_version=4)
    client = nbclient.NotebookClient(
        notebook, timeout=120, kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "examples")}},
    )  # fmt: skip
    client.execute()
    code = [cell for cell in notebook.cells if cell.cell_type == "code"]
    errors = [o for cell in code for o in cell.get("outputs", []) if o.output_type == "error"]
    assert errors == []
    _, fetched, summary, frame, bodies, retried, _ = code
    assert "<table>" in texts(fetched) and "First failures" in texts(fetched)
    assert "HTTP 503 after 2 attempts" in texts(fetched)
    progress = [
        o
        for o in fetched.outputs
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert progress, "no progress widget was shown"
    assert texts(summary).startswith("23 items: 20 ok, 3 failed (invalid_body 1, status 2)")
    assert "invalid_body" in texts(frame) and "product-z" in texts(frame)
    assert "path" in texts(bodies) and "/ok/product-0" in texts(bodies)
    assert "3 items: 0 ok, 3 failed" in texts(retried)


def test_the_interrupt_button_stops_a_batch_and_leaves_no_thread(
    server: MockServerProcess,
) -> None:
    """The kernel's interrupt during Batch.run: prompt stop, finished results kept, no threads."""
    jupyter_client = pytest.importorskip("jupyter_client")
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        run = (
            "from batchsync import Batch\n"
            f"b = Batch([f'{server.url}/ok/nb-{{n}}?delay=1' for n in range(40)], concurrency=4,"
            " timeout=30)\n"
            "b.run()\n"
        )
        client.execute(run)
        time.sleep(2.5)  # a few rounds of four have finished, four more are in flight
        interrupted_at = time.monotonic()
        manager.interrupt_kernel()
        reply = client.get_shell_msg(timeout=30)
        assert time.monotonic() - interrupted_at < 6
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        check = (
            "import threading\n"
            "print(len(b.results), b.pending,"
            " [t.name for t in threading.enumerate() if t.name.startswith('batchsync')])"
        )
        output = execute_and_read(client, check)
        done, pending, threads = output.split(" ", 2)
        assert 4 <= int(done) < 40
        assert int(done) + int(pending) == 40
        assert threads.strip() == "[]"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def execute_and_read(client: Any, code: str) -> str:
    """Run ``code`` in the kernel and return what it printed."""
    message_id = client.execute(code)
    printed = []
    while True:
        message = client.get_iopub_msg(timeout=30)
        if message["parent_header"].get("msg_id") != message_id:
            continue
        if message["msg_type"] == "stream":
            printed.append(message["content"]["text"])
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            return "".join(printed).strip()
