"""The command line's output files: the failed file's lines, and writing files atomically."""

from __future__ import annotations

import contextlib
import os
import re
import secrets
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import IO, Any

from ..core.records import dumps
from ..output.columnar import parsed, write_table
from .inputs import Entry


def output_paths(prefix: str, form: str = "jsonl") -> tuple[Path, Path]:
    """The results file (in ``form``: jsonl, csv or parquet) and the failed file (JSONL,
    valid INPUT, whatever the form) for an output prefix."""
    return Path(f"{prefix}-results.{form}"), Path(f"{prefix}-failed.jsonl")


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
def atomic_files(
    *paths: Path, modes: Sequence[int] | None = None, binary: Sequence[bool] = ()
) -> Iterator[list[IO[Any]]]:
    """Write to temporary files beside ``paths``; rename them over ``paths`` only once every
    one is written and synced, so a failure (a full disk) replaces none of them. ``modes``:
    each file's permissions before the umask (by default 0666, as any new file); ``binary``:
    which ones are opened for bytes (the others for UTF-8 text, newlines untranslated)."""
    modes = modes or [0o666] * len(paths)
    kinds = list(binary) + [False] * (len(paths) - len(binary))
    token = f"{os.getpid()}.{secrets.token_hex(4)}"
    temporaries = [path.with_name(f".{path.name}.{token}.tmp") for path in paths]
    try:
        with contextlib.ExitStack() as stack:
            handles: list[IO[Any]] = [
                stack.enter_context(_created(temporary, mode, is_binary))
                for temporary, mode, is_binary in zip(temporaries, modes, kinds, strict=True)
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


def remove_stale(folder: Path, names: Iterable[str]) -> None:
    """Remove the temporary files that ``atomic_files`` (or the report) left in ``folder``
    for the outputs ``names`` when its process was killed: those named by a process that is
    no longer running (or by this one, which has none open yet: its id was reused). Called
    under the prefix's journal lock, so no run of the prefix is writing them."""
    either = "|".join(re.escape(name) for name in names)
    pattern = re.compile(rf"\.(?:{either})\.(\d+)\.[0-9a-f]{{8}}\.tmp")
    with contextlib.suppress(OSError):  # (a folder that cannot be listed: nothing to do)
        for found in folder.iterdir():
            match = pattern.fullmatch(found.name)
            if match is not None and not _running(int(match[1])):
                with contextlib.suppress(OSError):
                    found.unlink()


def _running(pid: int) -> bool:
    """Whether a process other than this one runs with this id."""
    if pid == os.getpid():
        return False
    try:
        os.kill(pid, 0)
    except PermissionError:  # (another user's)
        return True
    except (OSError, OverflowError):  # (none, or no process id at all)
        return False
    return True


def _created(path: Path, mode: int, binary: bool = False) -> IO[Any]:
    """A new file (never an existing one) for writing UTF-8 text (or bytes), with ``mode``."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, mode)
    if binary:
        return os.fdopen(descriptor, "wb")
    return os.fdopen(descriptor, "w", encoding="utf-8", newline="")


def write_outputs(
    prefix: str,
    rows: Iterable[tuple[str, str | None]] | Callable[[], Iterable[tuple[str, str | None]]],
    *,
    form: str = "jsonl",
    flatten: bool = False,
    paged: bool = False,
) -> tuple[Path, Path]:
    """Write both output files from (result JSON, failed request JSON or None) rows in order.

    ``rows``: the rows, or a function giving them afresh on each call (a results table with
    ``flatten`` reads them twice: once for its columns, once to write them). ``form``: the
    results file's format (see ``columnar``); ``paged``: the run was paginated (a ``pages``
    column).
    """
    if flatten and not callable(rows) and iter(rows) is rows:
        raise ValueError("flatten reads the rows twice: pass a function that gives them")
    results_path, failed_path = output_paths(prefix, form)
    source = rows if callable(rows) else (lambda: rows)
    # The failed file keeps items as given, secrets and all: the owner's only.
    with atomic_files(
        results_path, failed_path, modes=(0o666, 0o600), binary=(form == "parquet",)
    ) as (results, failed):
        if form == "jsonl":
            results.writelines(f"{record}\n" for record in _results(source(), failed))
        else:
            failed_once = iter([failed])  # the failed lines are written on the first pass

            def records() -> Iterator[dict[str, Any]]:
                return parsed(_results(source(), next(failed_once, None)))

            write_table(results, form, records, paged=paged, flatten=flatten)
    return results_path, failed_path


def _results(rows: Iterable[tuple[str, str | None]], failed: IO[str] | None) -> Iterator[str]:
    """The rows' result JSON texts; on the way, the failed requests go to ``failed``."""
    for record, request in rows:
        if request is not None and failed is not None:
            failed.write(f"{request}\n")
        yield record
