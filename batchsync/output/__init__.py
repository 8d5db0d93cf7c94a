"""The results written out: ``resultset`` (``ResultSet``), ``columnar`` (CSV, Parquet) and
``report`` (the HTML report).

May import: core, store.
"""
