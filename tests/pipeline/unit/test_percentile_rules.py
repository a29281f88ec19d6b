"""The exact percentiles' pure part: percentile_cont's positions, the value at a rank among
(value, count) pairs, the interpolation."""

from __future__ import annotations

import math
import random

import pytest

from pipeline.percentiles import interpolate, rank_positions, value_at


def percentile_cont(values: list[float], q: float) -> float:
    s = sorted(values)
    pos = (len(s) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return s[lo] + (s[hi] - s[lo]) * (pos - lo)


@pytest.mark.parametrize("seed", range(5))
def test_picking_ranks_from_counted_values_is_percentile_cont(seed):
    rng = random.Random(seed)
    values = [rng.choice([-3, 0, 0, 1, 7, 7, 7, 1000, 10**9]) + rng.randint(0, 3) for _ in range(rng.randint(1, 300))]
    counts = sorted({v: values.count(v) for v in values}.items())
    for q in (0.0, 0.5, 0.95, 0.99, 1.0):
        pos, lo, hi = rank_positions(len(values), q)
        got = interpolate(value_at(counts, lo) / 1000, value_at(counts, hi) / 1000, pos)
        assert got == pytest.approx(percentile_cont([v / 1000 for v in values], q), rel=1e-12, abs=1e-12)


def test_an_offset_past_the_values_is_an_error():
    with pytest.raises(IndexError):
        value_at([(1, 2)], 2)
