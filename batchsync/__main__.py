"""``python -m batchsync``."""

from .cli import main

main()
