"""The broker's data pipeline on Spark (PySpark over the PostgreSQL database, read over JDBC).

- ``session``: the SparkSession and JDBC options, from Django settings and the live connection.
- ``readers``: partitioned JDBC readers for the broker tables (secret columns are never read).
- ``report``: delivery analytics; Parquet plus an HTML page (``charts``: hand-written SVG).
- ``archive`` and ``prune``: archive-and-prune of finished messages, crash-safe and re-runnable.
- ``latest``: where the latest report is, for the admin dashboard link.

Entry point: ``python manage.py pipeline {report,archive}``. See pipeline/README.md.
"""
