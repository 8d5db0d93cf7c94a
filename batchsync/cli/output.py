"""The command line's output files: the failed file's lines, and writing files atomically."""

from __future__ import annotations

import contextlib
import os
import secrets
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO

from ..records import dumps
from .inputs import Entry


def output_paths(prefix: str) -> tuple[Path, Path]:
    """The results and failed files for an output prefix."""
    return Path(f"{prefix}-results.jsonl"), Path(f"{prefix}-failed.jsonl")


def failed_request(entry: Entry) -> str:
    """The failed file's line for a failed entry: the request object as the input gave it
    (secrets included: the file is the owner's only), so that the file re-runs it.

    An entry that is no item has no request object: its line is an object that says what
    was wrong and keeps the text as given (None when it could not be kept: not UTF-8, a NUL,
    too long), to be mended; as it stands it fails again.
    """
    if entry.problem is None:
        return dumps({"url": entry.item} if isinstance(entry.item, str) else entry.item)
    return dumps({"invalid": f"{entry.where}: {entry.problem}", "given": entry.item})


@contextlib.contextmanager
def atomic_files(*paths: Path, modes: Sequence[int] | None = None) -> Iterator[list[IO[str]]]:
    """Write to temporary files beside ``paths``; rename them over ``paths`` only once every
    one is written and synced, so a failure (a full disk) replaces none of them. ``modes``:
    each file's permissions before the umask (by default 0666, as any new file)."""
    modes = modes or [0o666] * len(paths)
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    temporaries = [path.with_name(f".{path.name}.{token}.tmp") for path in paths]
    try:
        with contextlib.ExitStack() as stack:
            handles: list[IO[str]] = [
                stack.enter_context(_created(temporary, mode))
                for temporary, mode in zip(temporaries, modes, strict=True)
            ]
            yield handles
            for handle in handles:
                handle.flush()
                os.fsync(handle.fileno())
        for temporary, path in zip(temporaries, paths, strict=True):
            temporary.replace(path)
    except BaseException:
        for temporary in temporaries:
            with contextlib.suppress(OSError):
                temporary.unlink()
        raise


def _created(path: Path, mode: int) -> IO[str]:
    """A new file (never an existing one) opened for writing UTF-8 text, with ``mode``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    return os.fdopen(descriptor, "w", encoding="utf-8")


def write_outputs(prefix: str, rows: Iterable[tuple[str, str | None]]) -> tuple[Path, Path]:
    """Write both output files from (result JSON, failed request JSON or None) rows in order."""
    results_path, failed_path = output_paths(prefix)
    # The failed file keeps items as given, secrets and all: the owner's only.
    with atomic_files(results_path, failed_path, modes=(0o666, 0o600)) as (results, failed):
        for record, request in rows:
            results.write(record)
            results.write("\n")
            if request is not None:
                failed.write(request)
                failed.write("\n")
    return results_path, failed_path
