"""Runs put together: ``assembly`` (the one place an engine run's job, gates, observers and
engine are assembled), ``controller`` (one run's lifecycle around it: the journal's lock, the
pass, progress, the stint and the close, for every runner), ``batch`` (``Batch``,
``CallBatch``), ``api`` (``fetch_all``, ``run_all``), ``once`` (``call``, ``resilient``),
``progress`` and ``cluster`` (a batch across a Dask cluster).

May import: core, limits, http, jobs, store, output, contrib, batches.
"""
