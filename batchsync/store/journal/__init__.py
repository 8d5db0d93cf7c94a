"""The journal: every final Result persisted as soon as it exists, so a crash loses nothing done.

Its rooms: ``schema`` (the tables, how a journal is made, opened and upgraded, and whether a
file is one of this layout), ``writer`` (the writer thread and the lock), ``reader`` (what a
journal holds, for the run that goes on with it and for the outputs) and ``checks`` (every
row trusted before a run goes on with it: ``resumed``).
"""

from .checks import (
    Requests,
    meta_problem,
    meta_shape_problem,
    mismatch,
    pass_problem,
    record_problem,
    result_problem,
    resumed,
    run_problem,
    wait_problem,
)
from .reader import JournalReader
from .schema import (
    LAYOUT,
    SCHEMA,
    SCHEMA_VERSION,
    JournalFailed,
    JournalInUse,
    JournalMismatch,
    JournalUnusable,
    connect,
    layout_problem,
    remove,
)
from .writer import Encode, Journal, linger_for, lock_path, locked

__all__ = [
    "LAYOUT",
    "SCHEMA",
    "SCHEMA_VERSION",
    "Encode",
    "Journal",
    "JournalFailed",
    "JournalInUse",
    "JournalMismatch",
    "JournalReader",
    "JournalUnusable",
    "Requests",
    "connect",
    "layout_problem",
    "linger_for",
    "lock_path",
    "locked",
    "meta_problem",
    "meta_shape_problem",
    "mismatch",
    "pass_problem",
    "record_problem",
    "remove",
    "result_problem",
    "resumed",
    "run_problem",
    "wait_problem",
]
