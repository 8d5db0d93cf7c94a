"""The real CLI in a subprocess against the mock server: exit codes, files, order, secrets."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest

from .mockserver import MockServerProcess

pytestmark = pytest.mark.integration


def batchsync(
    *args: str, cwd: Path, stdin: str | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.run(
        [sys.executable, "-m", "batchsync", *args],
        cwd=cwd, input=stdin, capture_output=True, text=True, timeout=timeout, env=env,
        check=False,
    )  # fmt: skip


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()]


def key() -> str:
    return uuid.uuid4().hex[:10]


def test_all_ok_exits_0_with_both_files_in_input_order(
    server: MockServerProcess, tmp_path: Path
) -> None:
    urls = [f"{server.url}/ok/{key()}?delay={d}" for d in (0.3, 0, 0.1, 0)]
    (tmp_path / "urls.txt").write_text("\n".join(urls) + "\n")
    done = batchsync("urls.txt", "-c", "4", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = read_jsonl(tmp_path / "urls-results.jsonl")
    assert [r["url"] for r in results] == urls
    assert [r["index"] for r in results] == [0, 1, 2, 3]
    assert all(r["ok"] and r["attempts"] == 1 and r["attempt_log"] for r in results)
    assert (tmp_path / "urls-failed.jsonl").read_text() == ""
    assert "4 items: 4 ok, 0 failed" in done.stderr


def test_failures_exit_1_and_the_failed_file_reruns_only_them(
    server: MockServerProcess, tmp_path: Path
) -> None:
    good, missing, down = f"/ok/{key()}", f"/404/{key()}", f"/503/{key()}"
    post = {
        "url": f"{server.url}/503/{key()}", "method": "POST", "json": {"n": 1},
        "id": "order-1", "idempotency_key": "k-1",
    }  # fmt: skip
    lines = [server.url + good, server.url + missing, server.url + down, json.dumps(post)]
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    first = batchsync("urls.txt", "--attempts", "2", cwd=tmp_path)
    assert first.returncode == 1, first.stderr
    failed = read_jsonl(tmp_path / "urls-failed.jsonl")
    assert failed == [
        {"url": server.url + missing},
        {"url": server.url + down},
        post,
    ]
    before = server.stats()["counts"]
    # Without -o the rerun is named after its input: the first run's files stay as they were.
    first_files = [
        (tmp_path / f"urls-{name}").read_bytes() for name in ("results.jsonl", "failed.jsonl")
    ]
    again = batchsync("urls-failed.jsonl", "--attempts", "2", cwd=tmp_path)
    assert again.returncode == 1
    after = server.stats()["counts"]
    assert after[good] == before[good] == 1
    assert after[missing] == before[missing] + 1
    assert after[down] == before[down] + 2
    assert first_files == [
        (tmp_path / f"urls-{name}").read_bytes() for name in ("results.jsonl", "failed.jsonl")
    ]
    retried = read_jsonl(tmp_path / "urls-failed-results.jsonl")
    assert [r["url"] for r in retried] == [server.url + missing, server.url + down, post["url"]]
    assert retried[2]["id"] == "order-1"
    assert retried[2]["attempts"] == 2  # the idempotency key survived the round trip


def test_stdin_input(server: MockServerProcess, tmp_path: Path) -> None:
    urls = [f"{server.url}/ok/{key()}" for _ in range(3)]
    done = batchsync("-", "-o", "piped", cwd=tmp_path, stdin="\n".join(urls))
    assert done.returncode == 0, done.stderr
    assert [r["url"] for r in read_jsonl(tmp_path / "piped-results.jsonl")] == urls


def test_json_array_input(server: MockServerProcess, tmp_path: Path) -> None:
    items = [f"{server.url}/ok/{key()}", {"url": f"{server.url}/ok/{key()}", "id": 5}]
    (tmp_path / "items.json").write_text("  \n" + json.dumps(items, indent=2))
    done = batchsync("items.json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    results = read_jsonl(tmp_path / "items-results.jsonl")
    assert [r["url"] for r in results] == [items[0], items[1]["url"]]  # type: ignore[index]
    assert results[1]["id"] == 5


def test_bad_lines_become_invalid_request_results_with_their_line_numbers(
    server: MockServerProcess, tmp_path: Path
) -> None:
    good = f"{server.url}/ok/{key()}"
    text = f"# header comment\n{good}\n\n{{not json\nftp://files.test/x\n" + '{"method": "GET"}\n'
    (tmp_path / "urls.txt").write_text(text)
    done = batchsync("urls.txt", cwd=tmp_path)
    assert done.returncode == 1
    results = read_jsonl(tmp_path / "urls-results.jsonl")
    assert [r["ok"] for r in results] == [True, False, False, False]
    assert [r["error_kind"] for r in results[1:]] == ["invalid_request"] * 3
    assert [r["attempts"] for r in results[1:]] == [0, 0, 0]
    assert results[1]["error"].startswith("line 4: not valid JSON")
    assert results[2]["error"].startswith("line 5: scheme must be http or https")
    assert results[3]["error"] == "line 6: url: Field required"
    assert [r["url"] for r in results[1:]] == [None, "ftp://files.test/x", None]
    # Each failed item as the input gave it; a line that is no item, kept to be mended.
    assert read_jsonl(tmp_path / "urls-failed.jsonl") == [
        {"invalid": results[1]["error"], "given": "{not json"},
        {"url": "ftp://files.test/x"},
        {"method": "GET"},
    ]


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-c", "0"], "'-c' / '--concurrency': 0 is not in the range 1<=x<=10000"),
        (["--timeout", "-1"], "--timeout"),
        (["--budget", "nan"], "Invalid value for '--budget': 'nan' is not a finite number"),
        (["--expect", "xml"], "--expect"),
        (["-H", "no colon here"], "header 1 is not in the form 'Name: value'"),
        (["--no-such-option"], "No such option '--no-such-option'"),
        (["-o", "a-file/sub/out"], "cannot make the output folder a-file/sub: Not a directory"),
    ],
)
def test_usage_errors_exit_2_with_one_line_and_touch_nothing(
    fresh_server: MockServerProcess, tmp_path: Path, args: list[str], message: str
) -> None:
    (tmp_path / "urls.txt").write_text(f"{fresh_server.url}/ok/1\n")
    earlier = tmp_path / "urls-results.jsonl"
    earlier.write_text("earlier run\n")
    (tmp_path / "a-file").write_text("")
    done = batchsync("urls.txt", *args, cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("Error: ")
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert earlier.read_text() == "earlier run\n"
    assert fresh_server.stats()["requests"] == 0


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "cannot read urls.txt: No such file or directory"),
        ('[{"url": "http://h.test"}, ', "the JSON array ends too soon"),
        ("[1 2]", "expected ',' or ']' after element 1 of the JSON array"),
    ],
)
def test_input_errors_exit_2_before_anything_is_sent(
    fresh_server: MockServerProcess, tmp_path: Path, content: str | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "urls.txt").write_text(content)
    done = batchsync("urls.txt", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr == f"Error: {message}\n"
    assert not (tmp_path / "urls-results.jsonl").exists()
    assert fresh_server.stats()["requests"] == 0


def test_a_directory_as_input_is_an_input_error(tmp_path: Path) -> None:
    done = batchsync(".", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.startswith("Error: cannot read .: ")


def test_secrets_stay_out_of_logs_and_files(server: MockServerProcess, tmp_path: Path) -> None:
    item = {
        "url": f"{server.url}/503/{key()}",
        "headers": {"Authorization": "Bearer item-secret-1", "X-Trace": "visible"},
    }
    lines = [json.dumps(item), f"{server.url}/404/{key()}", "http://user:pa55word@127.0.0.1:1/x"]
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    done = batchsync(
        "urls.txt", "-v", "--attempts", "2", "--budget", "5",
        "-H", "Authorization: Bearer cli-secret-2", "-H", "X-Api-Key: cli-secret-3",
        "-H", "Cookie: session=cli-secret-4",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 1
    assert "retry " in done.stderr and "failed " in done.stderr
    shown = done.stderr + (tmp_path / "urls-results.jsonl").read_text()
    for secret in ("item-secret-1", "cli-secret-2", "cli-secret-3", "cli-secret-4", "pa55word"):
        assert secret not in shown
    # The failed file re-runs the items as given (owner-only); the -H values are never in it.
    failed_path = tmp_path / "urls-failed.jsonl"
    assert failed_path.stat().st_mode & 0o777 == 0o600
    assert read_jsonl(failed_path) == [item, {"url": lines[1]}, {"url": lines[2]}]
    assert "cli-secret" not in failed_path.read_text()


def test_header_values_reach_the_server(server: MockServerProcess, tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text(f"{server.url}/echo\n")
    done = batchsync("urls.txt", "-H", "X-Api-Key: abc", "-H", "Accept: text/plain", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    echoed = read_jsonl(tmp_path / "urls-results.jsonl")[0]["data"]["headers"]
    assert echoed["X-Api-Key"] == "abc"
    assert echoed["Accept"] == "text/plain"


def test_secret_headers_are_dropped_on_a_redirect_to_another_host(
    server: MockServerProcess, tmp_path: Path
) -> None:
    port = server.url.rsplit(":", 1)[1]
    other_host = f"http://localhost:{port}/echo"
    (tmp_path / "urls.txt").write_text(f"{server.url}/redirect?to={other_host}\n")
    done = batchsync(
        "urls.txt", "-H", "X-Api-Key: abc", "-H", "Authorization: Bearer t", cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    echoed = read_jsonl(tmp_path / "urls-results.jsonl")[0]["data"]["headers"]
    assert "X-Api-Key" not in echoed
    assert "Authorization" not in echoed


def test_help_shows_every_option_with_defaults(tmp_path: Path) -> None:
    done = batchsync("--help", cwd=tmp_path)
    assert done.returncode == 0
    shown = " ".join(done.stdout.split())
    for text in (
        "--concurrency", "[default: 10", "--attempts", "[default: 3", "--timeout",
        "[default: 10.0", "--budget", "[default: 60.0", "--deadline", "--expect",
        "--max-bytes", "[default: 33554432", "--header", "--output",
        "[default: INPUT's name without its extension; stdin: batch", "as for any pipe]",
        "--resume",
        "--retry-failed [=KIND,...]", "--fresh", "--version",
        "--progress / --no-progress", "--verbose", "--quiet",
    ):  # fmt: skip
        assert text in shown


def test_quiet_prints_nothing_and_progress_is_off_without_a_terminal(
    server: MockServerProcess, tmp_path: Path
) -> None:
    (tmp_path / "urls.txt").write_text(f"{server.url}/ok/{key()}\n")
    assert batchsync("urls.txt", "-q", cwd=tmp_path).stderr == ""
    plain = batchsync("urls.txt", "-o", "plain", cwd=tmp_path)
    assert "item/s" not in plain.stderr
    forced = batchsync("urls.txt", "-o", "forced", "--progress", cwd=tmp_path)
    assert "1/1" in forced.stderr


def test_expect_text_and_bytes(server: MockServerProcess, tmp_path: Path) -> None:
    (tmp_path / "urls.txt").write_text(f"{server.url}/text\n{server.url}/bytes\n")
    text = batchsync("urls.txt", "--expect", "text", "-o", "t", cwd=tmp_path)
    assert text.returncode == 0
    assert read_jsonl(tmp_path / "t-results.jsonl")[0]["data"] == "héllo wörld"
    raw = batchsync("urls.txt", "--expect", "bytes", "-o", "b", cwd=tmp_path)
    assert raw.returncode == 0
    assert read_jsonl(tmp_path / "b-results.jsonl")[1]["data"].startswith("AAECAwQF")


def test_the_console_script_is_installed(tmp_path: Path) -> None:
    script = Path(sys.executable).with_name("batchsync")
    done = subprocess.run(
        [str(script), "--help"], capture_output=True, text=True, check=False, timeout=60
    )
    assert done.returncode == 0
    assert "Usage: batchsync [OPTIONS] INPUT" in done.stdout


def test_fallbacks_dedup_and_the_attempt_log_from_the_shell(
    server: MockServerProcess, tmp_path: Path
) -> None:
    marker = key()
    item = {"url": f"{server.url}/503/{marker}", "fallbacks": [f"{server.url}/ok/{marker}-m"]}
    same = f"{server.url}/ok/{marker}-same?delay=0.3"
    down = f"{server.url}/503/{marker}-down"
    lines = [json.dumps(item), same, same, down]
    (tmp_path / "urls.txt").write_text("\n".join(lines) + "\n")
    done = batchsync("urls.txt", "-v", "--attempts", "2", "-c", "4", "--dedup", cwd=tmp_path)
    assert done.returncode == 1
    results = read_jsonl(tmp_path / "urls-results.jsonl")
    assert results[0]["fallback_used"] == 0
    assert [entry["fallback"] for entry in results[0]["attempt_log"]] == [None, None, 0]
    assert sorted(r["attempts"] for r in results[1:3]) == [0, 1]
    assert server.count(f"/ok/{marker}-same?delay=0.3") == 1
    assert f"failed {down}: HTTP 503 after 2 attempts [#1 503 wait " in done.stderr
    assert read_jsonl(tmp_path / "urls-failed.jsonl") == [{"url": down}]
    again = batchsync("urls.txt", "-o", "nodedup", "-c", "4", cwd=tmp_path)  # (the default)
    assert again.returncode == 1
    assert server.count(f"/ok/{marker}-same?delay=0.3") == 3


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_hedge_delay_is_a_usage_error(tmp_path: Path, value: str) -> None:
    (tmp_path / "urls.txt").write_text("http://127.0.0.1:9/x\n")
    done = batchsync("urls.txt", "--hedge-after", value, cwd=tmp_path)
    assert done.returncode == 2
    assert "expected a number of seconds above 0, or p95" in done.stderr


def test_a_run_that_starts_after_the_first_stop_signal_starts_stopped() -> None:
    """A batch endpoint's run, then the live lane's engine: a signal between the two stops
    the second as it starts, and a second signal still quits."""
    from batchsync.cli.signals import stop_on_signals

    class Run:
        stopped = False

        def stop(self) -> None:
            self.stopped = True

    first, second = Run(), Run()
    with stop_on_signals() as started:
        started(first)
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.05)  # (the handler runs in the main thread, between bytecodes)
        assert first.stopped
        started(second)
        assert second.stopped
