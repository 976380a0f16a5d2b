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


def consolidate_until(df: DataFrame, columns: Sequence[str], since: int) -> DataFrame:
    """Advance a collection's updates to ``since`` (logical compaction, DESIGN's "since").

    Updates at or before ``since`` are summed per data and moved to time ``since`` (zeros
    dropped); later updates are kept as they are. For every ``t >= since`` the contents at
    ``t`` are unchanged; times before ``since`` can no longer be told apart.

    Returns:
        ``columns..., _time, _diff``.
    """
    old = df.where(F.col(TIME) <= since)
    kept = df.where(F.col(TIME) > since).select(*[F.col(f"`{c}`") for c in columns], TIME, DIFF)
    advanced = consolidate(old, columns, by_time=False).select(
        *[F.col(f"`{c}`") for c in columns], F.lit(since).cast("bigint").alias(TIME), DIFF
    )
    return advanced.unionByName(kept)


def accumulate_until(df: DataFrame, key: Sequence[str], since: int) -> DataFrame:
    """:func:`consolidate_until` for a table of per-key sums (no ``_diff``: every column but
    the key and ``_time`` is an additive quantity, read as its sum up to a time).

    Rows at or before ``since`` are summed per key and moved to ``since`` (rows whose sums are
    all zero dropped: they add nothing); later rows are kept.
    """
    values = [c for c in df.columns if c not in (*key, TIME)]
    keys = [F.col(f"`{c}`") for c in key]
    summed = (
        df.where(F.col(TIME) <= since)
        .groupBy(*keys)
        .agg(*[F.sum(F.col(f"`{c}`")).cast(df.schema[c].dataType).alias(c) for c in values])
    )
    nonzero = F.lit(False)
    for c in values:
        nonzero = nonzero | (F.col(f"`{c}`") != 0)
    advanced = summed.where(nonzero).withColumn(TIME, F.lit(since).cast("bigint"))
    return advanced.unionByName(df.where(F.col(TIME) > since)).select(*df.columns)
