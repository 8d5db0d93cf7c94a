"""The command line, above the library: its options, input reader, output files and signals
around one run (``runner``).

May import: every other folder, and the package's public names.
"""

from .command import command, main

__all__ = ["command", "main"]
