"""The named queries of sources (``queries.sql`` beside this file, format: broker.db.queries)."""

from broker.db.queries import app_queries

ALL, Q = app_queries(__file__)
