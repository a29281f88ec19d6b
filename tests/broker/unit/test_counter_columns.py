"""The admin's counter columns (``broker.counters.counter_column``), without a database: each
variant in use is a fixed named query with its parameters, and any other is refused."""

from __future__ import annotations

import pytest

from broker.counters import counter_column
from broker.queries import Q


@pytest.mark.parametrize(("owner", "status", "query", "params"), [
    ("consumer", 1001, Q.counter_column_consumer_status, (1, 1001, 1, 1001)),
    ("channel", None, Q.counter_column_channel, (2, None, None, 2, None, None)),
    ("channel", 101, Q.counter_column_channel, (2, 101, 101, 2, 101, 101)),
])
def test_each_variant_is_its_named_query(owner, status, query, params):
    scope = params[0]
    column = counter_column(owner=owner, scope=scope, status=status)
    assert column.sql == query.sql and tuple(column.params) == params
    assert column.sql.count("%s") == len(params)
    table = "consumers_consumer" if owner == "consumer" else "broker_channel"
    assert f"owner_id = {table}.id" in column.sql  # correlated to the annotated queryset's rows


@pytest.mark.parametrize(("owner", "status"), [("consumer", None), ("producer", 1), ("broker_channel", None)])
def test_a_variant_without_a_query_is_refused(owner, status):
    with pytest.raises(ValueError, match="no counter column"):
        counter_column(owner=owner, scope=1, status=status)
