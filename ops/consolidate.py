"""Consolidation: sum the diffs of equal ``(data, time)`` and drop the zeros.

Algebra: a collection is a function ``data -> sum of diffs``, so replacing the updates of one
``(data, time)`` by their sum changes nothing any reader can observe; dropping zero sums
neither. Consolidating with ``time`` dropped (``by_time=False``) gives the net change over the
whole interval, which is what a readable table applies.

From scratch vs incremental: the from-scratch contents of a collection at ``t`` is
``consolidate(updates with time <= t, by_time=False)``; incrementally, each epoch consolidates
only its own updates.
"""

from __future__ import annotations

from collections.abc import Sequence

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from ops import DIFF, TIME


def consolidate(df: DataFrame, columns: Sequence[str], *, by_time: bool = True) -> DataFrame:
    """Sum ``_diff`` per ``(columns, _time)`` (or per ``columns``) and drop zero sums.

    Returns:
        ``columns..., [_time,] _diff`` with ``_diff`` a non-zero ``bigint``.
    """
    keys = [F.col(f"`{c}`") for c in columns]
    if by_time:
        keys.append(F.col(TIME))
    summed = df.groupBy(*keys).agg(F.sum(F.col(DIFF)).cast("bigint").alias(DIFF))
    return summed.where(F.col(DIFF) != 0)
