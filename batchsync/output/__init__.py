"""The results written out: ``resultset`` (``ResultSet``), ``columnar`` (CSV, Parquet),
``report_data`` (the report's numbers) and ``report`` (the HTML report of them).

May import: core, store.
"""
