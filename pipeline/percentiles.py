"""Exact percentiles (PostgreSQL's ``percentile_cont``) of an integer column over many rows.

Spark's exact ``percentile`` holds every distinct value of a group in memory and sorts them: over
10M distinct latencies it took 40 s per grouping on these 2 cores (195 s for the report's three).
Here, two scans of the column instead, whatever the number of rows:

1. a histogram in buckets that keep a value's three leading decimal digits (each bucket under
   1 % of its values wide; integer arithmetic only, so every executor buckets a value alike),
   searched in Spark for the bucket holding each rank wanted and the rank's offset in it;
2. the values of just those buckets (ranges of values), as (value, count), collected; the value
   at each rank is picked here and interpolated as ``percentile_cont`` does.

Groups: per (channel, consumer), per channel and overall, from the same two scans.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Sequence

DIGITS = 3
REGION = 100_000  # bucket numbers of the values with k + DIGITS - 1 digits start at (k - DIGITS + 1) * REGION
DIRECT_MAX = 100_000  # values collected at once up to this many
LEVELS = (("consumer", ("channel", "consumer")), ("channel", ("channel",)), ("all", ()))


def rank_positions(n: int, q: float) -> tuple[float, int, int]:
    """percentile_cont's position of ``q`` among ``n`` sorted values: (pos, lower rank, upper rank),
    ranks from 0."""
    pos = (n - 1) * q
    return pos, math.floor(pos), math.ceil(pos)


def interpolate(lower: float, upper: float, pos: float) -> float:
    return lower + (upper - lower) * (pos - math.floor(pos))


def value_at(counts: Sequence[tuple[int, int]], offset: int) -> int:
    """The value at ``offset`` (from 0) among values given as sorted (value, count) pairs."""
    for value, count in counts:
        if offset < count:
            return value
        offset -= count
    raise IndexError("offset past the values")


def bucket_column(column: str):
    """A bucket number non-decreasing in the value: the value itself below 10^DIGITS; above, its
    number of digits and its DIGITS leading ones (a CASE over powers of ten, integer division only,
    so every executor buckets a value alike and ``bucket_range`` inverts it exactly)."""
    from pyspark.sql import functions as F

    a = f"abs(`{column}`)"
    whens = [f"WHEN {a} < {10 ** DIGITS} THEN {a}"]
    for k in range(DIGITS, 18):  # a in [10^k, 10^(k+1)): its leading digits, after every shorter value
        r = k - DIGITS + 1
        whens.append(f"WHEN {a} < {10 ** (k + 1)} THEN {r * REGION} + ({a} div {10 ** r})")
    r = 18 - DIGITS + 1  # 19 digits, up to the largest bigint
    key = f"CASE {' '.join(whens)} ELSE {r * REGION} + ({a} div {10 ** r}) END"
    return F.expr(f"CASE WHEN `{column}` >= 0 THEN {key} ELSE -({key}) - 1 END")


def bucket_range(bucket: int) -> tuple[int, int]:
    """The values [low, high) of a bucket of ``bucket_column`` (exact integers)."""
    key = bucket if bucket >= 0 else -bucket - 1
    region, head = divmod(key, REGION)
    low, high = (key, key + 1) if region == 0 else (head * 10 ** region, (head + 1) * 10 ** region)
    return (low, high) if bucket >= 0 else (1 - high, 1 - low)


def _locate(hist, qs: Sequence[float]) -> dict[str, list]:
    """For each level, group and rank the percentiles ``qs`` need: the bucket holding the rank and
    its offset there, as rows (level, channel, consumer, total, rank, bucket, offset). One Spark job:
    the histogram rolled up to the three levels side by side, cumulated per group in bucket order."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    none = F.lit(None).cast("string")
    h = (hist.select(F.lit("consumer").alias("level"), "channel", "consumer", "bucket", "n")
         .unionByName(hist.groupBy("channel", "bucket").agg(F.sum("n").alias("n"))
                      .select(F.lit("channel").alias("level"), "channel", none.alias("consumer"), "bucket", "n"))
         .unionByName(hist.groupBy("bucket").agg(F.sum("n").alias("n"))
                      .select(F.lit("all").alias("level"), none.alias("channel"), none.alias("consumer"), "bucket",
                              "n")))
    group = ("level", "channel", "consumer")
    h = h.withColumn("upto", F.sum("n").over(Window.partitionBy(*group).orderBy("bucket").rowsBetween(
        Window.unboundedPreceding, Window.currentRow)))
    h = h.withColumn("total", F.max("upto").over(Window.partitionBy(*group)))
    last = F.col("total") - 1
    ranks = [F.floor(last * F.lit(q)).cast("long") for q in qs] + [F.ceil(last * F.lit(q)).cast("long") for q in qs]
    h = h.withColumn("rank", F.explode(F.array_distinct(F.array(*ranks))))
    rows = (h.where((F.col("upto") - F.col("n") <= F.col("rank")) & (F.col("rank") < F.col("upto")))
            .select(*group, "total", "rank", "bucket", (F.col("rank") - (F.col("upto") - F.col("n"))).alias("offset"))
            .collect())
    located: dict[str, list] = {name: [] for name, _keys in LEVELS}
    for r in rows:
        located[r["level"]].append(r)
    return located


def _pick(counts: list[tuple[int, int]], qs: Sequence[float], scale: float) -> list[float]:
    """The ``qs`` percentiles of all the values given as sorted (value, count) pairs."""
    total = sum(n for _v, n in counts)
    out = []
    for q in qs:
        pos, lo, hi = rank_positions(total, q)
        out.append(interpolate(value_at(counts, lo) / scale, value_at(counts, hi) / scale, pos))
    return out


def _groups(pairs, keys_len: int) -> dict[tuple, list]:
    """(channel, consumer) pairs by their group at a level (its first ``keys_len`` keys)."""
    groups: dict[tuple, list] = defaultdict(list)
    for pair in pairs:
        groups[pair[:keys_len]].append(pair)
    return groups


def exact_percentiles(frame, *, column: str, qs: Sequence[float], scale: float = 1.0,
                      values: int | None = None) -> dict[tuple, list]:
    """{(level, channel, consumer): [the ``qs`` percentiles of ``column`` / ``scale``]} for every
    group of ``frame`` (channel and consumer columns; rows with a null value left out), at the
    levels consumer (channel, consumer), channel (channel, None) and all (None, None). With
    ``values`` (how many non-null values there are) at most ``DIRECT_MAX``, the values are
    collected at once (one Spark job instead of two)."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    present = frame.where(F.col(column).isNotNull())
    if values is not None and values <= DIRECT_MAX:
        by_pair: dict[tuple, dict[int, int]] = defaultdict(dict)
        for r in present.groupBy("channel", "consumer", column).agg(F.count(F.lit(1)).alias("n")).collect():
            by_pair[(r["channel"], r["consumer"])][r[column]] = r["n"]
        result = {}
        for name, keys in LEVELS:
            for group, pairs in _groups(by_pair, len(keys)).items():
                merged: dict[int, int] = defaultdict(int)
                for pair in pairs:
                    for value, n in by_pair[pair].items():
                        merged[value] += n
                result[(name, *(group + (None,) * (2 - len(group))))] = _pick(sorted(merged.items()), qs, scale)
        return result

    bucketed = present.select("channel", "consumer", column, bucket_column(column).alias("bucket"))
    hist = bucketed.groupBy("channel", "consumer", "bucket").agg(F.count(F.lit(1)).alias("n"))
    hist = hist.persist(StorageLevel.MEMORY_AND_DISK)  # one scan for the three levels
    try:
        located = _locate(hist, qs)
    finally:
        hist.unpersist()
    if not any(located.values()):
        return {}
    pairs = sorted({(r["channel"], r["consumer"]) for r in located["consumer"]})
    wanted: dict[tuple, set] = defaultdict(set)  # (channel, consumer) -> buckets to collect
    for name, keys in LEVELS:
        by_group = _groups(pairs, len(keys))
        for r in located[name]:
            for pair in by_group[tuple(r[k] for k in keys)]:
                wanted[pair].add(r["bucket"])
    test = None  # the values of those buckets, as ranges: no bucket computed again
    for (ch, co), buckets in wanted.items():
        ranges = None
        for low, high in (bucket_range(b) for b in sorted(buckets)):
            one = (F.col(column) >= low) & (F.col(column) < high)
            ranges = one if ranges is None else ranges | one
        one = (F.col("channel") == ch) & (F.col("consumer") == co) & ranges
        test = one if test is None else test | one
    counts: dict[tuple, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # (ch, co, bucket) -> value -> n
    for r in present.where(test).groupBy("channel", "consumer", column).agg(F.count(F.lit(1)).alias("n")).collect():
        bucket = next(b for b in wanted[(r["channel"], r["consumer"])]
                      if bucket_range(b)[0] <= r[column] < bucket_range(b)[1])
        counts[(r["channel"], r["consumer"], bucket)][r[column]] += r["n"]

    result = {}
    for name, keys in LEVELS:
        by_group = _groups(pairs, len(keys))
        at: dict[tuple, dict[int, int]] = defaultdict(dict)
        totals: dict[tuple, int] = {}
        for r in located[name]:
            group = tuple(r[k] for k in keys)
            merged: dict[int, int] = defaultdict(int)
            for ch, co in by_group[group]:
                for value, n in counts.get((ch, co, r["bucket"]), {}).items():
                    merged[value] += n
            at[group][r["rank"]] = value_at(sorted(merged.items()), r["offset"])
            totals[group] = r["total"]
        for group, by_rank in at.items():
            out = []
            for q in qs:
                pos, lo, hi = rank_positions(totals[group], q)
                out.append(interpolate(by_rank[lo] / scale, by_rank[hi] / scale, pos))
            result[(name, *(group + (None,) * (2 - len(group))))] = out
    return result
