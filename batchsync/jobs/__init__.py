"""What a run does for each item: ``fetch`` (the HTTP job, with ``pages`` for an item's
pages) and ``calls`` (a callable per item), and the ``options`` they and the runs are built
from: each declared once, with its command-line ``flags``; ``settings``, the library's typed
keywords, is generated from them.

May import: core, limits, http.
"""
