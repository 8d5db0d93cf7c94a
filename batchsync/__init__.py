"""batchsync: call an API many times from plain Python, bounded and retried, one result each."""

import logging

from .core.backoff import Backoff
from .core.result import AttemptRecord, Result, Summary
from .core.verdict import ErrorKind, Retryable
from .http.auth import AuthFailed
from .http.spec import RequestSpec
from .limits.breaker import Breaker
from .output.resultset import ResultSet
from .run.api import fetch_all, run_all
from .run.batch import Batch, CallBatch
from .run.once import Limits, call, resilient
from .store.journal import JournalFailed, JournalInUse, JournalMismatch, JournalUnusable

__version__ = "0.1.0"

__all__ = [
    "AttemptRecord",
    "AuthFailed",
    "Backoff",
    "Batch",
    "Breaker",
    "CallBatch",
    "ErrorKind",
    "JournalFailed",
    "JournalInUse",
    "JournalMismatch",
    "JournalUnusable",
    "Limits",
    "RequestSpec",
    "Result",
    "ResultSet",
    "Retryable",
    "Summary",
    "call",
    "fetch_all",
    "resilient",
    "run_all",
]

logging.getLogger("batchsync").addHandler(logging.NullHandler())
