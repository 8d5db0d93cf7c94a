"""What outlives a run: the ``journal`` (SQLite, one row per finished item) and ``resume``
(what a journal leaves, and how each item goes on from it).

May import: core, http.
"""
