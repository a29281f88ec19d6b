"""The eventtypes app's SQL, by name: ``Q.<name>`` from ``eventtypes/queries.sql`` (format:
``broker.db.queries``). ``ALL`` maps each name to its Query (the plan tests iterate over it)."""

from broker.db.queries import app_queries

ALL, Q = app_queries(__file__)
