"""Exact percentiles on Spark (pipeline.percentiles) against percentile_cont computed here, both
ways (the values collected at once; the histogram and the few buckets), over values that are
negative, zero, tied, null and spread over many decimal digits."""

from __future__ import annotations

import math
from collections import defaultdict

import pytest

from pipeline.percentiles import bucket_column, bucket_range, exact_percentiles

pytestmark = pytest.mark.spark

N = 3000
VALUE = ("CASE WHEN id % 7 = 0 THEN NULL WHEN id % 11 = 0 THEN -(id * 37 % 1000) WHEN id % 13 = 0 THEN 0 "
         "WHEN id % 17 = 0 THEN 123456 ELSE (id * id * 7919) % 123456789 END")
QS = (0.0, 0.5, 0.95, 0.99, 1.0)


def value(i: int):
    if i % 7 == 0:
        return None
    if i % 11 == 0:
        return -(i * 37 % 1000)
    if i % 13 == 0:
        return 0
    if i % 17 == 0:
        return 123456
    return (i * i * 7919) % 123456789


def percentile_cont(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@pytest.mark.parametrize("collected_at_once", [True, False], ids=["direct", "histogram"])
def test_exact_percentiles_at_every_level(spark, collected_at_once):
    from pyspark.sql import functions as F

    frame = spark.range(N).select(
        F.when(F.col("id") % 3 == 0, "ch-a").otherwise("ch-b").alias("channel"),
        F.concat(F.lit("co-"), (F.col("id") % 5).cast("string")).alias("consumer"),
        F.expr(VALUE).alias("v"))
    groups = defaultdict(list)
    for i in range(N):
        v = value(i)
        if v is None:
            continue
        channel, consumer = ("ch-a" if i % 3 == 0 else "ch-b"), f"co-{i % 5}"
        for key in (("consumer", channel, consumer), ("channel", channel, None), ("all", None, None)):
            groups[key].append(v / 1000)
    values = sum(len(v) for k, v in groups.items() if k[0] == "consumer")
    got = exact_percentiles(frame, column="v", qs=QS, scale=1000.0, values=values if collected_at_once else None)
    assert set(got) == set(groups) and len(got) == 10 + 2 + 1
    for key, vs in groups.items():
        assert got[key] == pytest.approx([percentile_cont(vs, q) for q in QS], rel=1e-12, abs=1e-9), key


def test_buckets_grow_with_the_value_and_invert_exactly(spark):
    from pyspark.sql import functions as F

    edges = sorted({s * (10 ** k + d) for k in range(19) for d in (-1, 0, 1) for s in (1, -1)}
                   | {0, 2 ** 63 - 1, -(2 ** 63 - 1), 123456789, -987654321})
    frame = spark.range(1).select(F.explode(F.array(*[F.lit(v).cast("long") for v in edges])).alias("v"))
    rows = sorted(frame.select("v", bucket_column("v").alias("b")).collect(), key=lambda r: r["v"])
    assert [r["v"] for r in rows] == edges
    for before, after in zip(rows, rows[1:]):
        assert before["b"] <= after["b"]
    for r in rows:
        low, high = bucket_range(r["b"])
        assert low <= r["v"] < high and high - low <= max(1, abs(r["v"]) // 100), r
