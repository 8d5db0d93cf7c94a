"""``python -m batchsync.mock``: the mock server on 127.0.0.1 (``--help`` lists its routes)."""

from .server import main

main()
