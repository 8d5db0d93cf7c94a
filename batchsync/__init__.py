"""batchsync: call an API many times from plain Python, bounded and retried, one result each."""

import os as _os
import signal as _signal
import sys as _sys
from pathlib import Path as _Path


def _interrupted_while_loading(signum: int, frame: object) -> None:
    """Ctrl-C before the command line has its own handler: nothing was sent yet."""
    _sys.stderr.write("Interrupted before the run started: nothing was sent\n")
    _os._exit(130)


# (the command line, while the package loads: a Ctrl-C then is exit 130, not a traceback;
# the command sets its own handler once it runs, and a library import is left as it is)
if (_sys.argv[:1] == ["-m"] or _Path(_sys.argv[0]).name == "batchsync") and (
    _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler
):
    _signal.signal(_signal.SIGINT, _interrupted_while_loading)

import logging

from .core.backoff import Backoff
from .core.result import AttemptRecord, Result, Summary
from .core.verdict import ErrorKind, Retryable
from .http.auth import AuthFailed
from .http.spec import RequestSpec
from .limits.breaker import Breaker
from .output.resultset import ResultSet
from .run.api import fetch_all, fetch_iter, run_all, run_iter
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
    "fetch_iter",
    "resilient",
    "run_all",
    "run_iter",
]

logging.getLogger("batchsync").addHandler(logging.NullHandler())
