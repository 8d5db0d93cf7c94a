"""Output files: what is written for each Result and failed item, and writing files atomically."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import IO, Any

from .inputs import Entry
from .redact import Secrets, redact_url
from .result import Result
from .spec import InvalidItem, parse_item


def output_paths(prefix: str) -> tuple[Path, Path]:
    """The results and failed files for an output prefix."""
    return Path(f"{prefix}-results.jsonl"), Path(f"{prefix}-failed.jsonl")


def public_record(result: Result) -> dict[str, Any]:
    """A Result as written out: its dict form with any URL password masked."""
    record = result.to_dict()
    if result.url:
        record["url"] = redact_url(result.url)
    return record


def failed_request(entry: Entry, secrets: Secrets) -> dict[str, Any]:
    """The request object that re-runs a failed entry: valid INPUT, without secret headers.

    Batch-wide ``-H`` headers are never part of it; an item's own secret headers
    (Authorization, Cookie, Proxy-Authorization and any declared secret) are dropped too.
    An entry that was not a valid item is written back as given, so that it is not lost.
    """
    if entry.problem is None:
        try:
            spec = parse_item(entry.item)
        except InvalidItem:
            pass
        else:
            request = spec.to_item()
            request["url"] = redact_url(spec.url)
            headers = secrets.public(spec.headers)
            if headers:
                request["headers"] = headers
            else:
                request.pop("headers", None)
            return request
    if isinstance(entry.item, Mapping):
        request = dict(entry.item)
        if isinstance(request.get("headers"), Mapping):
            request["headers"] = secrets.public(request["headers"])
        if isinstance(request.get("url"), str):
            request["url"] = redact_url(request["url"])
        return request
    return {"url": redact_url(str(entry.item))}


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[IO[str]]:
    """Write to a temporary file beside ``path`` and rename it over ``path`` only on success."""
    # A plain exclusive open, so the file gets the usual permissions (umask), not 0600.
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{secrets.token_hex(4)}.tmp")
    try:
        with temporary.open("x", encoding="utf-8") as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        temporary.replace(path)
    except BaseException:
        with contextlib.suppress(OSError):
            temporary.unlink()
        raise


def write_outputs(prefix: str, rows: Iterable[tuple[str, str | None]]) -> tuple[Path, Path]:
    """Write both output files from (result JSON, failed request JSON or None) rows in order."""
    results_path, failed_path = output_paths(prefix)
    with atomic_file(results_path) as results, atomic_file(failed_path) as failed:
        for record, request in rows:
            results.write(record)
            results.write("\n")
            if request is not None:
                failed.write(request)
                failed.write("\n")
    return results_path, failed_path


def dumps(value: object) -> str:
    """Compact JSON, UTF-8 kept as is."""
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
