"""The broker's data pipeline on Spark (PySpark over the PostgreSQL database, read over JDBC).

- ``session``: the SparkSession and JDBC options, from Django settings and the live connection.
- ``readers``: partitioned JDBC readers for the broker tables (secret columns are never read).
- ``dataset``: jobs, attempts and transitions as one table each, whatever their age: the ``facts``
  of the days already read, the archive, and the database for the other days (``days``: when a
  day is finished); days that lost rows to retention are reported incomplete.
- ``report``: delivery analytics over any window; Parquet plus an HTML page (``charts``: hand-written
  SVG; ``percentiles``: exact percentiles in two scans).
- ``archive`` and ``prune``: archive-and-prune of finished messages, crash-safe and re-runnable.
- ``latest``: where the latest report is, for the admin dashboard link.

Entry point: ``python manage.py pipeline {report,archive}``. See pipeline/README.md.
"""
