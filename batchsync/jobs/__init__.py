"""What a run does for each item: ``fetch`` (the HTTP job) and ``calls`` (a callable per
item), and the ``options`` they and the runs are built from.

May import: core, limits, http.
"""
