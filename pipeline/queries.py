"""The pipeline's SQL, by name: ``Q.<name>`` from ``pipeline/queries.sql`` (format:
``broker.db.queries``). ``ALL`` maps each name to its Query."""

from broker.db.queries import app_queries

ALL, Q = app_queries(__file__)
