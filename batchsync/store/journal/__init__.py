"""The journal: every final Result persisted as soon as it exists, so a crash loses nothing done.

Its rooms: ``schema`` (the tables, how a journal is made, opened and upgraded, and whether a
file is one of this layout), ``writer`` (the writer thread and the lock), ``reader`` (what a
journal holds, for the run that goes on with it and for the outputs) and ``checks`` (every
row trusted before a run goes on with it: ``resumed``).
"""

from .checks import Requests, resumed
from .reader import JournalReader
from .schema import JournalFailed, JournalInUse, JournalMismatch, JournalUnusable, connect, remove
from .writer import Encode, Journal, lock_path, locked

__all__ = ["Encode", "Journal", "JournalFailed", "JournalInUse", "JournalMismatch",
           "JournalReader", "JournalUnusable", "Requests", "connect", "lock_path", "locked",
           "remove", "resumed"]  # fmt: skip
