"""Arrangements: a collection's updates stored as a Delta table indexed by a key, and lookups.

An arrangement of collection ``C`` by key ``K`` holds the updates of ``C`` (only the columns
some reader needs) as ``(K..., other columns..., _time, _diff)``. Every commit's files are
sorted by ``K``, so each file's min/max statistics on the first key column bound the keys it
holds and Parquet row groups can be skipped by a pushed-down ``IN`` filter.

Logical time: the table holds every update since its ``since`` epoch; the state at any
``t >= since`` is ``consolidate(updates with _time <= t)``. A lookup reads that state for the
keys present in a stream only: files whose ``_time`` starts after ``t`` or whose key range
misses every key are never opened.

Contract in ``(data, time, diff)`` terms: :func:`lookup` returns ``{(d, r) : d in C(t),
key(d) in keys, r = multiplicity}``; :func:`write_updates` appends the updates of ``(lower,
upper]`` once per epoch (txn ``(arrangement, upper)``).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ops import DIFF, TIME
from ops.consolidate import consolidate
from ops.ingest import read_files
from ops.sink import arrow_schema
from resources.lake import (
    CommitResult,
    collect_staged,
    commit_files,
    staging_uri,
    table_file_stats,
)

PUSHDOWN_KEYS = 20_000
"""Up to this many distinct keys a lookup pushes ``key IN (...)`` into the Parquet scan."""

ROWS_PER_FILE = 500_000
ROW_GROUP_BYTES = 4 * 1024 * 1024
"""Small row groups: a pushed-down key filter skips whatever row groups hold none of the keys."""


@dataclass
class LookupStats:
    """What lookups into one arrangement read (summed over a refresh)."""

    lookups: int = 0
    keys: int = 0
    files_opened: int = 0
    files_total: int = 0
    rows_in_opened_files: int = 0
    rows_total: int = 0

    def add(self, other: LookupStats) -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


@dataclass
class ArrangementStats:
    per_arrangement: dict[str, LookupStats] = field(default_factory=dict)


def write_updates(
    updates: DataFrame,
    uri: str,
    key: Sequence[str],
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool = False,
    rows_hint: int | None = None,
) -> CommitResult:
    """Append (or, ``overwrite``, start anew with) consolidated updates sorted by ``key``."""
    cols = [F.col(f"`{c}`") for c in key]
    n_files = max(1, math.ceil((rows_hint or 0) / ROWS_PER_FILE))
    if n_files > 1:
        updates = updates.repartitionByRange(n_files, *cols)
    else:
        updates = updates.coalesce(1)
    updates = updates.sortWithinPartitions(*cols, TIME)
    staged_uri = staging_uri(uri, epoch, "updates")
    updates.write.option("parquet.block.size", ROW_GROUP_BYTES).mode("errorifexists").parquet(
        staged_uri
    )
    staged = collect_staged(uri, staged_uri)
    result = commit_files(
        uri,
        app_id=app_id,
        epoch=epoch,
        schema=arrow_schema(updates),
        adds=staged.adds,
        metadata=metadata,
        description=f"ivm arrangement by ({', '.join(key)}): updates (columns..., _time, _diff)",
        overwrite=overwrite,
    )
    result.rows, result.bytes = staged.rows, staged.bytes
    return result


def lookup(
    spark: SparkSession,
    uri: str,
    schema: pa.Schema,
    key: Sequence[str],
    keys: DataFrame,
    as_of: int,
) -> tuple[DataFrame, LookupStats]:
    """The arrangement's state at ``as_of`` for the keys in ``keys`` (columns named ``key``).

    Collects the stream's distinct keys (proportional to the change) to prune files by their
    key statistics and push an ``IN`` filter into the scan. NULL keys match nothing (SQL).
    """
    wanted = keys.dropna().distinct()
    rows = wanted.collect()
    stats = LookupStats(lookups=1, keys=len(rows))
    columns = [c for c in schema.names if c not in (TIME, DIFF)]
    files = table_file_stats(uri, [key[0], TIME])
    stats.files_total = len(files)
    stats.rows_total = sum(f.file.num_records or 0 for f in files)
    first = sorted({r[0] for r in rows})
    chosen = []
    for f in files:
        tmin = f.mins.get(TIME)
        if tmin is not None and tmin > as_of:
            continue
        lo, hi = f.mins.get(key[0]), f.maxs.get(key[0])
        if lo is not None and hi is not None:
            i = bisect.bisect_left(first, lo)
            if i == len(first) or first[i] > hi:
                continue
        chosen.append(f.file)
    stats.files_opened = len(chosen)
    stats.rows_in_opened_files = sum(f.num_records or 0 for f in chosen)
    df = read_files(spark, chosen, schema).where(F.col(TIME) <= as_of)
    if not rows:
        df = df.limit(0)
    elif len(first) <= PUSHDOWN_KEYS:
        df = df.where(F.col(f"`{key[0]}`").isin(first))
    if len(key) > 1 or len(first) > PUSHDOWN_KEYS:
        df = df.join(F.broadcast(wanted), on=list(key), how="left_semi")
    return consolidate(df, columns, by_time=False), stats
