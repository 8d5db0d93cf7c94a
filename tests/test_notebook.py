"""examples/quickstart.ipynb run end to end on a real IPython kernel."""

from __future__ import annotations

import ast
import time
import uuid
from collections.abc import Callable
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
    _, fetched, summary, frame, bodies, retried, streamed, _ = code
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
    assert "10 yielded, then the loop left;" in texts(streamed)
    assert "30 yielded in all, each item once: True" in texts(streamed)


def test_the_interrupt_button_stops_a_batch_and_leaves_no_thread(
    server: MockServerProcess,
) -> None:
    """The kernel's interrupt during Batch.run: prompt stop, finished results kept, no threads."""
    jupyter_client = pytest.importorskip("jupyter_client")
    marker = uuid.uuid4().hex[:8]
    targets = [f"/ok/nb-{marker}-{n}?delay=1" for n in range(40)]

    def sent() -> int:
        counts: dict[str, int] = server.stats()["counts"]
        return sum(counts.get(target, 0) for target in targets)

    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        run = (
            "from batchsync import Batch\n"
            f"b = Batch([{server.url!r} + t for t in {targets!r}], concurrency=4, timeout=30)\n"
            "b.run()\n"
        )
        run_id = client.execute(run)
        # Eight sent, four at a time, each answered after 1 s: at least four have finished
        # (a worker delivers its result before it takes the next item), more are in flight.
        wait_until(lambda: sent() >= 8)
        at_interrupt = sent()
        interrupted_at = time.monotonic()
        manager.interrupt_kernel()
        reply = shell_reply(client, run_id)
        stopped_after = time.monotonic() - interrupted_at
        # Prompt: before the items not yet sent could have been fetched, at the server's pace
        # of four a second (a floor that no machine, however fast, goes under).
        assert stopped_after < (40 - at_interrupt) // 4
        assert reply["content"]["status"] == "error"
        assert reply["content"]["ename"] == "KeyboardInterrupt"
        check = (
            "import threading\n"
            "f'{len(b.results)} {b.pending} "
            '{[t.name for t in threading.enumerate() if t.name.startswith("batchsync")]}\''
        )
        output = evaluate(client, check)
        done, pending, threads = output.split(" ", 2)
        assert 4 <= int(done) < 40
        assert int(done) + int(pending) == 40
        assert threads.strip() == "[]"
        # Nothing taken after the interrupt but what was in flight, nothing sent twice.
        counts: dict[str, int] = server.stats()["counts"]
        assert all(counts.get(target, 0) <= 1 for target in targets)
        assert sent() <= int(done) + 4
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def test_a_cell_the_kernel_aborted_after_an_error_is_sent_again() -> None:
    """evaluate's own check: the interrupt test's next cell can reach an aborting kernel."""
    jupyter_client = pytest.importorskip("jupyter_client")
    manager, client = jupyter_client.manager.start_new_kernel(kernel_name="python3")
    try:
        # (a second's work first: the next cell reaches the kernel while this one runs)
        client.execute("import time; time.sleep(1); raise ValueError('a failed cell')")
        sent: list[str] = []
        execute = client.execute

        def counted(code: str) -> str:
            sent.append(code)
            message_id: str = execute(code)
            return message_id

        client.execute = counted
        # Queued behind the failing cell, before its reply: the kernel aborts it unrun.
        assert evaluate(client, "'ran'") == "ran"
        assert sent == ["'ran'", "'ran'"], "the first was not aborted: nothing was sent again"
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)


def wait_until(condition: Callable[[], bool], timeout: float = 30) -> None:
    give_up = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < give_up, "condition not reached in time"
        time.sleep(0.02)


def shell_reply(client: Any, message_id: str, timeout: float = 30) -> dict[str, Any]:
    """The shell channel's reply to ``message_id``, past any other reply queued before it.

    A kernel slow to start (a loaded machine, the suite's parallel workers) leaves replies to
    the extra kernel_info requests that jupyter_client's wait_for_ready sends each second it
    waits: read blindly, the next shell message can be one of those (status ok).
    """
    give_up = time.monotonic() + timeout
    while True:
        left = max(0.01, give_up - time.monotonic())  # (a negative timeout waits forever)
        message: dict[str, Any] = client.get_shell_msg(timeout=left)
        if message["parent_header"].get("msg_id") == message_id:
            return message


def evaluate(client: Any, code: str) -> str:
    """Run ``code`` in the kernel and return the string its last line evaluates to.

    A value, not a print: the kernel publishes it before going idle, where printed text may
    come after on a loaded machine. An error in the cell fails the test, saying which.

    After a cell's error the kernel aborts the requests that reach it before it has finished
    the error's reply (ipykernel's stop_on_error): one sent right after that reply can be
    aborted, unrun, on a loaded machine. An aborted cell is sent again.
    """
    for _ in range(10):
        message_id = client.execute(code)
        if shell_reply(client, message_id)["content"]["status"] != "aborted":
            break
    value = None
    while True:
        message = client.get_iopub_msg(timeout=30)
        if message["parent_header"].get("msg_id") != message_id:
            continue
        if message["msg_type"] == "execute_result":
            value = ast.literal_eval(message["content"]["data"]["text/plain"])
        if message["msg_type"] == "error":
            raise AssertionError(f"{message['content']['ename']}: {message['content']['evalue']}")
        if message["msg_type"] == "status" and message["content"]["execution_state"] == "idle":
            assert isinstance(value, str), value
            return value
