"""batchsync: call an API many times from plain Python, bounded and retried, one result each."""

import logging

from .api import fetch_all, run_all
from .auth import AuthFailed
from .backoff import Backoff
from .batch import Batch, CallBatch
from .journal import JournalFailed, JournalInUse, JournalMismatch, JournalUnusable
from .limits import Breaker
from .once import Limits, call, resilient
from .result import AttemptRecord, Result, Summary
from .resultset import ResultSet
from .spec import RequestSpec
from .verdict import ErrorKind, Retryable

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
