"""What outlives a run: the ``journal`` (SQLite, one row per finished item), ``submissions``
(a batch endpoint's parts), ``resume`` (how each item goes on) and ``rules`` (their checks).

May import: core, http.
"""
