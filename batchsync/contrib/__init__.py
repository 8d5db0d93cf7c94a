"""Optional integrations, each with its extra, kept apart from the core as in ``urllib3.contrib``:
``dask`` (a batch across a Dask cluster), ``redis`` (limits shared by processes), ``prometheus``
(metrics) and ``otel`` (OpenTelemetry traces). The core imports one only when a run asks for it.
"""
