"""Runs put together: ``assembly`` (the one place a run's job, gates, observers, journal and
engine are assembled), ``batch`` (``Batch``, ``CallBatch``), ``api`` (``fetch_all``,
``run_all``), ``once`` (``call``, ``resilient``), ``progress`` and ``cluster`` (a batch across a
Dask cluster).

May import: core, limits, http, jobs, store, output, contrib.
"""
