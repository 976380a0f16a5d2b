"""Arrangements: a collection's updates stored as a Delta table indexed by a key, and lookups.

Owns the arrangements' files (how Spark and the driver write them: sorted by key, small
pages, :func:`parquet_options`) and every read of them by key: :func:`lookup` for Spark's
plans, whose strategy :func:`lookup_strategy` chooses from sizes known before reading (each
strategy its own function), :func:`lookup_arrow` and :func:`lookup_rows` for the driver's.
Every threshold is a field of the policy in force (:func:`ivm.policy.current`), read at call
time; the measurements behind them are in BENCHMARKS.md ("Policy thresholds: arrangements and
lookups").

An arrangement of collection ``C`` by key ``K`` holds the updates of ``C`` (only the columns
some reader needs) as ``(K..., other columns..., _time, _diff)``. Every commit's files are
sorted by ``K``, so each file's min/max statistics on the first key column bound the keys it
holds and Parquet row groups can be skipped by a pushed-down ``IN`` filter.

Logical time: the table holds every update since its ``since`` epoch; the state at any
``t >= since`` is ``consolidate(updates with _time <= t)``. A lookup reads that state for the
keys present in a stream only: files whose ``_time`` starts after ``t`` or whose key range
misses every key are never opened.

Contract in ``(data, time, diff)`` terms: :func:`lookup` returns ``{(d, r) : d in C(t),
key(d) in keys, r = multiplicity}`` whichever strategy reads it (:func:`lookup_arrow` the
same, on the driver); :func:`lookup_rows` returns the updates ``(d, t', r)`` with ``t' <= t``
behind those, read by the driver; :func:`write_updates`, :func:`write_held_updates` and
:func:`build_by_driver` append the updates of ``(lower, upper]`` once per epoch (txn
``(arrangement, upper)``), in the same files whoever writes them.
"""

from __future__ import annotations

import bisect
import logging
import math
import os
from collections.abc import Collection, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from enum import Enum
from functools import reduce

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ivm.policy import Policy, current
from ops import DIFF, TIME
from ops.consolidate import consolidate
from ops.declines import declined
from ops.ingest import file_rows_declined, read_file_rows, read_files
from ops.rows import SortedKey, cast_loss, in_range, semi_join_null_safe
from ops.sink import append_updates, commit_staged, exact_types, spark_order
from resources.faults import crash_point
from resources.filecache import FILES
from resources.lake import (
    CommitResult,
    DataFile,
    FileStats,
    collect_staged,
    count_driver_read,
    key_ordered,
    local_path,
    spark_compatible_schema,
    stage_arrow,
    staging_uri,
    table_file_stats,
)

log = logging.getLogger("ivm")

LOOKUP_READ: Mapping[str, str] = {"parquet.filter.dictionary.enabled": "false"}
"""Reader options of a pushed-down lookup. Parquet's dictionary filter reads each row
group's dictionary page and probes it with every value of the ``IN`` list before the page
index is consulted; for sorted keys the page index alone finds the pages, and the
dictionary probes cost more than they skip (BENCHMARKS.md, "Policy thresholds:
arrangements and lookups")."""


def parquet_options(policy: Policy | None = None) -> dict[str, object]:
    """How Spark writes arrangement files under ``policy`` (default: the one in force):
    row groups of ``row_group_bytes``, small pages (``page_rows``, ``page_bytes``: with the
    page index, a lookup of k keys reads about k pages of each column), files of
    ``arrangement_file_rows`` rows."""
    policy = policy or current()
    return {
        "parquet.block.size": policy.row_group_bytes,
        "parquet.page.row.count.limit": policy.page_rows,
        "parquet.page.size": policy.page_bytes,
        "maxRecordsPerFile": policy.arrangement_file_rows,
    }


@dataclass
class LookupStats:
    """What lookups into one arrangement read (summed over a refresh)."""

    lookups: int = 0
    keys: int = 0
    files_opened: int = 0
    files_total: int = 0
    rows_in_opened_files: int = 0
    rows_total: int = 0
    rows_scanned: int = 0  # by Spark only when asked (it costs a pass); the driver's decodes
    rows_in_memory: int = 0  # visited in the driver's memory (resources.filecache)

    def add(self, other: LookupStats) -> None:
        for f in self.__dataclass_fields__:
            setattr(self, f, getattr(self, f) + getattr(other, f))

    def as_dict(self) -> dict[str, int]:
        return {f: getattr(self, f) for f in self.__dataclass_fields__}


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
    in_ranges: bool = False,
    small: bool = False,
) -> CommitResult:
    """Append (or, ``overwrite``, start anew with) consolidated updates sorted by ``key``;
    ``in_ranges``: each partition of ``updates`` holds a range of ``key`` that the others
    barely overlap; ``small``: an epoch's change, written by the driver if it has at most
    the policy's ``driver_change_rows`` rows (see :func:`~ops.sink.stage_updates`)."""
    return append_updates(
        sorted_by(updates, key, rows_hint, in_ranges),
        uri,
        app_id=app_id,
        epoch=epoch,
        metadata=metadata,
        overwrite=overwrite,
        description=_description(key),
        parquet_options=parquet_options(),
        small=small,
    )


def build_by_driver(
    files: Sequence[DataFile],
    uri: str,
    key: Sequence[str],
    schema: pa.Schema,
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool = False,
) -> CommitResult | None:
    """Build an arrangement from a source's snapshot: its data ``files`` (local, none with a
    partition column the arrangement holds) as ``+1`` updates at ``epoch``, written and
    committed by the driver, with no Spark job. Returns None, committing nothing, when the
    snapshot is too large (the policy's ``driver_build_rows`` for files laid out by the key,
    :func:`resources.lake.key_ordered`; ``driver_sort_rows`` for others), a file is
    remote, or a file's columns are not read as Spark reads them with ``schema`` (the
    ``(columns..., _time, _diff)`` types Spark's read of the snapshot has): Spark builds it
    (:func:`ops.ingest.file_rows_declined`, checked on every file's footer first, the
    reason recorded: :func:`ops.declines.declined`).

    The files are what :func:`write_updates` writes: sorted by ``(key, _time)`` (NULLs
    first), ``arrangement_file_rows`` rows each, pages of ``page_rows``, the engine's codec.
    Files laid out by the key are taken one at a time, several at once (Arrow's reader and
    writer on the driver's threads); the others are sorted whole. Each file written is
    handed to the driver's cache (:mod:`resources.filecache`) as lookups read it, so the
    refreshes after a build do not decode it again."""
    policy = current()
    rows = sum(f.num_records or 0 for f in files)
    remote = any("://" in f.uri and not f.uri.startswith("file://") for f in files)
    if not files or remote or any(f.num_records is None for f in files):
        return None
    ordered = key_ordered(files, key[0]) if rows <= policy.driver_build_rows else None
    if ordered is None and rows > policy.driver_sort_rows:
        return None
    why = _first_unreadable(
        files, schema_of(schema, [c for c in schema.names if c not in (TIME, DIFF)])
    )
    if why is not None:
        declined(f"an arrangement built by Spark ({why})")
        return None
    staged_uri = staging_uri(uri, epoch, "updates")
    types = spark_compatible_schema(schema)

    def one_file(f: DataFile) -> None:
        updates = _file_updates(local_path(f.uri), schema, epoch)
        _stage_sorted(updates, staged_uri, key, types, policy)

    with _writers(len(files)) as pool:
        if ordered is not None:
            list(pool.map(one_file, ordered))
        else:
            tables = list(
                pool.map(lambda f: _file_updates(local_path(f.uri), schema, epoch), files)
            )
            _stage_sorted(pa.concat_tables(tables), staged_uri, key, types, policy, pool)
    return _commit_sorted(uri, staged_uri, key, schema, app_id, epoch, metadata, overwrite)


def _first_unreadable(files: Sequence[DataFile], data: pa.Schema) -> str | None:
    """Why the driver does not read one of ``files``' ``data`` columns as Spark reads them
    (:func:`ops.ingest.file_rows_declined`, the footers read at once), or None."""
    with _writers(len(files)) as pool:
        found = pool.map(lambda f: file_rows_declined(local_path(f.uri), data), files)
        return next((why for why in found if why is not None), None)


def write_held_updates(
    rows: pa.Table,
    uri: str,
    key: Sequence[str],
    schema: pa.Schema,
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool = False,
) -> CommitResult | None:
    """:func:`write_updates` of updates the driver holds (an epoch's change feed summed on
    the arrangement's columns, a state table's rows, a build's counted state), with no Spark
    job: ``(columns..., _time, _diff)`` sorted by ``(key, _time)``, NULLs first as Spark
    sorts, in files of the policy's ``arrangement_file_rows`` rows written at once on the
    driver's threads, each handed to the driver's cache; the result's ``staged`` holds the
    rows as written.
    None, writing nothing, when the rows lack one of ``schema``'s columns or one's type does
    not convert to ``schema``'s without loss (:func:`ops.rows.cast_loss`; the reason
    recorded: :func:`ops.declines.declined`). ``overwrite``: they replace the table's
    contents (a rebuild), in one commit."""
    why = cast_loss(rows.schema, schema)
    if why is not None:
        declined(f"rows written by Spark ({why})")
        return None
    policy = current()
    file_rows = policy.arrangement_file_rows
    rows = rows.select(schema.names).cast(schema)
    staged_uri = staging_uri(uri, epoch, "updates")
    types = spark_compatible_schema(schema)
    if rows.num_rows <= file_rows:  # an epoch's change: one file, no thread to start
        rows = _stage_sorted(rows, staged_uri, key, types, policy)
    else:
        with _writers(math.ceil(rows.num_rows / file_rows)) as pool:
            rows = _stage_sorted(rows, staged_uri, key, types, policy, pool)
    result = _commit_sorted(uri, staged_uri, key, schema, app_id, epoch, metadata, overwrite)
    result.staged = rows
    return result


def _writers(tasks: int) -> ThreadPoolExecutor:
    """Threads for the driver's Arrow reads and writes (they release the GIL)."""
    return ThreadPoolExecutor(max(1, min(tasks, os.cpu_count() or 1)), "ivm-write")


def _stage_sorted(
    rows: pa.Table,
    staged_uri: str,
    key: Sequence[str],
    types: pa.Schema,
    policy: Policy,
    pool: ThreadPoolExecutor | None = None,
) -> pa.Table:
    """Write ``rows`` sorted by ``(key, _time)`` (NULLs first, as Spark sorts) into
    ``staged_uri`` in files of ``policy.arrangement_file_rows`` rows with the arrangements'
    page settings (``page_rows``, ``page_bytes``; at once on ``pool``), hand each to the
    driver's cache read as ``types``, and return them sorted."""
    rows = rows.sort_by(spark_order([*key, TIME]))
    n = policy.arrangement_file_rows
    parts = [rows.slice(at, n) for at in range(0, rows.num_rows, n)]

    def write(part: pa.Table) -> None:
        path = stage_arrow(
            staged_uri, part, rows_per_page=policy.page_rows, page_bytes=policy.page_bytes
        )
        if path is not None:
            FILES.put(path, types, part)

    list(map(write, parts) if pool is None else pool.map(write, parts))
    return rows


def _commit_sorted(
    uri: str,
    staged_uri: str,
    key: Sequence[str],
    schema: pa.Schema,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool,
) -> CommitResult:
    crash_point("staged")
    staged = collect_staged(uri, staged_uri)
    return commit_staged(staged, uri, app_id, epoch, schema, metadata, _description(key), overwrite)


def _file_updates(path: str, schema: pa.Schema, epoch: int) -> pa.Table:
    """A source data file's rows as ``+1`` updates at ``epoch``: ``schema``'s columns as
    :func:`ops.ingest.read_file_rows` reads them (the caller checked that it can)."""
    data = [c for c in schema.names if c not in (TIME, DIFF)]
    table = read_file_rows(path, schema_of(schema, data))
    n = table.num_rows
    table = table.append_column(TIME, pa.array(np.full(n, epoch, np.int64)))
    table = table.append_column(DIFF, pa.array(np.ones(n, np.int64)))
    return table.cast(schema)


def _description(key: Sequence[str]) -> str:
    return f"ivm arrangement by ({', '.join(key)}): updates (columns..., _time, _diff)"


def sorted_by(
    updates: DataFrame, key: Sequence[str], rows_hint: int | None, in_ranges: bool = False
) -> DataFrame:
    """``updates`` laid out as arrangement files: ranges of ``key``, sorted within each.

    ``in_ranges``: the partitions already hold ranges of ``key`` that barely overlap (a
    source loaded in key order, :func:`ops.ingest.source_snapshot_in_order`): each is sorted
    where it is, with no sampling pass and no shuffle. Files are cut at the policy's
    ``arrangement_file_rows`` rows either way (:func:`parquet_options`)."""
    cols = [F.col(f"`{c}`") for c in key]
    n_files = max(1, math.ceil((rows_hint or 0) / current().arrangement_file_rows))
    if not in_ranges:
        updates = updates.repartitionByRange(n_files, *cols) if n_files > 1 else updates.coalesce(1)
    return updates.sortWithinPartitions(*cols, TIME)


def _table_files(uri: str, k0: str) -> list[FileStats]:
    """The table's files with ``k0``'s and ``_time``'s statistics; the driver's cache
    forgets the files the table no longer has (compacted away)."""
    files = table_file_stats(uri, [k0, TIME])
    FILES.keep_only(local_path(uri), [local_path(f.file.uri) for f in files])
    return files


class Strategy(Enum):
    """How :func:`lookup` reads an arrangement (:func:`lookup_strategy` chooses)."""

    PUSHED_DOWN = "pushed down"
    """``key IN (...)`` in Spark's Parquet scans: the page index skips the pages without a
    key (:data:`LOOKUP_READ`); no key but NULL: an ``IS NULL`` scan; no key: nothing."""
    SPARK_READ_ONCE = "read once by Spark"
    """Spark reads the files whose key range admits a key once and semi-joins them with the
    broadcast keys."""
    DRIVER_READ_ONCE = "read once by the driver"
    """The driver reads those files (:func:`_read_once_by_driver`) and hands the rows to
    Spark as a local relation; Spark's read once when more rows match than the policy's
    ``driver_lookup_rows``."""
    DRIVER_MEMORY = "probed in the driver's memory"
    """Few keys, but the driver holds the files decoded (or can decode and keep them,
    :func:`_in_memory`): probed there as the driver's read-once lookup probes them; pushed
    down when more rows match than ``driver_lookup_rows``."""


def lookup_strategy(
    keys: int,
    null_key: bool,
    live_rows: int,
    candidates: Sequence[DataFile],
    schema: pa.Schema,
    policy: Policy,
) -> tuple[Strategy, str]:
    """How :func:`lookup` reads the arrangement, and why, from what is known before reading:
    the distinct non-NULL values of the first key column (``keys``), whether a key's first
    column is NULL (``null_key``: matched by Spark only), the rows of the files live at the
    time asked, the ``candidates`` (live files whose key range admits a key) and whether the
    driver holds them.

    Pushed down while the pages the keys may touch, ``keys * page_rows``, are under
    ``1 / push_ratio`` of the live rows, unless the driver can probe the candidates in its
    memory; otherwise the candidates are read once, by the driver unless a key is NULL or
    ``driver_lookup_rows`` is 0.

    >>> lookup_strategy(3, False, 1_000_000, [], pa.schema([]), Policy())[0].value
    'pushed down'
    >>> lookup_strategy(3_000, False, 1_000_000, [], pa.schema([]), Policy())[0].value
    'read once by the driver'
    >>> strategy, why = lookup_strategy(3_000, True, 1_000_000, [], pa.schema([]), Policy())
    >>> strategy.value, why
    ('read once by Spark', '3000 keys * 1000 rows a page * 4 >= 1000000 live rows (a NULL key)')
    """
    if keys == 0:
        return Strategy.PUSHED_DOWN, "no key but NULL" if null_key else "no key"
    pages = policy.push_ratio * keys * policy.page_rows
    sizes = f"{keys} keys * {policy.page_rows} rows a page * {policy.push_ratio}"
    driver = not null_key and policy.driver_lookup_rows > 0
    if pages >= live_rows:
        why = f"{sizes} >= {live_rows} live rows"
        if driver:
            return Strategy.DRIVER_READ_ONCE, why
        off = "a NULL key" if null_key else "driver_lookup_rows = 0"
        return Strategy.SPARK_READ_ONCE, f"{why} ({off})"
    why = f"{sizes} < {live_rows} live rows"
    if driver and _in_memory(candidates, schema, policy):
        return Strategy.DRIVER_MEMORY, f"{why}, the driver holds the files (or decodes them)"
    return Strategy.PUSHED_DOWN, why


@dataclass(frozen=True)
class _Asked:
    """One lookup's question, its keys collected to the driver once (Arrow) and made
    distinct there: the semi-joins probe that local copy, so the stream behind the keys is
    not computed again by a scan's job, and no Spark distinct (a shuffle: a second job per
    lookup) is run."""

    key: tuple[str, ...]
    found: pa.Table  # the distinct keys, NULL ones only when ``null_safe``
    as_of: int
    data: tuple[str, ...]  # the columns the state is summed on
    null_safe: bool
    raw: bool
    rows: list[tuple]  # ``found``'s rows
    first: list  # the first key column's distinct non-NULL values, sorted
    null_first: bool  # whether a key's first column is NULL

    @staticmethod
    def of(
        key: Sequence[str],
        keys: DataFrame,
        as_of: int,
        data: Sequence[str],
        null_safe: bool,
        raw: bool,
    ) -> _Asked:
        found = distinct_rows((keys if null_safe else keys.dropna()).toArrow())
        rows = list(zip(*(column.to_pylist() for column in found.columns), strict=True))
        first = sorted({r[0] for r in rows if r[0] is not None})
        null_first = any(r[0] is None for r in rows)
        return _Asked(
            tuple(key), found, as_of, tuple(data), null_safe, raw, rows, first, null_first
        )


def lookup(
    spark: SparkSession,
    uri: str,
    schema: pa.Schema,
    key: Sequence[str],
    keys: DataFrame,
    as_of: int,
    *,
    measure: bool = False,
    null_safe: bool = False,
    raw: bool = False,
    columns: Collection[str] | None = None,
) -> tuple[DataFrame, LookupStats]:
    """The arrangement's state at ``as_of`` for the keys in ``keys`` (columns named ``key``;
    a key may repeat: callers need not make them distinct).

    Collects the stream's distinct keys (proportional to the change) to prune files by their
    key statistics, then reads as :func:`lookup_strategy` chooses: for few keys it pushes
    ``key IN (...)`` into the scan, so Parquet's page index skips the pages holding none of
    them. NULL keys match nothing (SQL).

    Args:
        measure: also run the scans once on their own and record the rows Spark actually
            read (``rows_scanned``); for benchmarks and notes, it costs an extra pass.
        null_safe: NULL keys match NULL keys (grouping semantics: state tables), instead of
            nothing (join semantics).
        raw: return the matching updates themselves (``_time`` kept, nothing summed), for
            state tables whose rows are sums rather than multiplicities.
        columns: return only the key and these columns: the updates are projected before
            they are summed (a multiset projection), so the scans read no other column.
    """
    policy = current()
    keep = None if columns is None else {*columns, *key}
    data = [c for c in schema.names if c not in (TIME, DIFF) and (keep is None or c in keep)]
    files = _table_files(uri, key[0])
    live = [f for f in files if f.mins.get(TIME) is None or f.mins[TIME] <= as_of]
    stats = LookupStats(lookups=1, files_total=len(files))
    stats.rows_total = sum(f.file.num_records or 0 for f in files)
    if not live:  # nothing at ``as_of`` (a state table before its first epoch): no Spark job
        empty = read_files(spark, [], schema)
        return (empty, stats) if raw else (consolidate(empty, data, by_time=False), stats)
    asked = _Asked.of(key, keys, as_of, data, null_safe, raw)
    stats.keys = len(asked.rows)
    candidates = [f.file for f in live if asked.null_first or _may_hold(f, key[0], asked.first)]
    live_rows = sum(f.file.num_records or 0 for f in live)
    strategy, why = lookup_strategy(
        len(asked.first), asked.null_first, live_rows, candidates, schema, policy
    )
    log.debug("lookup in %s: %s (%s)", uri, strategy.value, why)
    if strategy in (Strategy.DRIVER_READ_ONCE, Strategy.DRIVER_MEMORY):
        frame = _lookup_by_driver(spark, candidates, schema, asked, stats, policy)
        if frame is not None:
            return frame, stats
        # too many rows for the driver: Spark reads them as it would have
        pushed = strategy is Strategy.DRIVER_MEMORY
        strategy = Strategy.PUSHED_DOWN if pushed else Strategy.SPARK_READ_ONCE
    if strategy is Strategy.PUSHED_DOWN:
        scans = _pushed_scans(live, asked, policy)
    else:
        scans = [(candidates, None)]
    return _lookup_by_spark(spark, scans, schema, asked, stats, policy, measure), stats


_Scan = tuple[list[DataFile], Column | None]
"""Files Spark reads for a lookup, and the key condition pushed into their scan (None: read
once, the keys semi-joined)."""


def _pushed_scans(live: Sequence[FileStats], asked: _Asked, policy: Policy) -> list[_Scan]:
    """:attr:`Strategy.PUSHED_DOWN`'s scans: per ``pushdown_keys`` values of the first key
    column, the files whose range admits one, with ``IN (...)`` those values (a longer list
    overflows a task's stack); a NULL first key column: every live file, ``IS NULL``. Built
    only when Spark scans: an ``IN`` list is a Py4J call per value."""
    k0 = F.col(f"`{asked.key[0]}`")
    step = policy.pushdown_keys
    out: list[_Scan] = []
    for i in range(0, len(asked.first), step):
        chunk = asked.first[i : i + step]
        chosen = [f.file for f in live if _may_hold(f, asked.key[0], chunk)]
        if chosen:
            out.append((chosen, k0.isin(chunk)))
    if asked.null_first:
        out.append(([f.file for f in live], k0.isNull()))
    return out


def _lookup_by_driver(
    spark: SparkSession,
    files: list[DataFile],
    schema: pa.Schema,
    asked: _Asked,
    stats: LookupStats,
    policy: Policy,
) -> DataFrame | None:
    """:attr:`Strategy.DRIVER_READ_ONCE` and :attr:`Strategy.DRIVER_MEMORY`: ``files``
    probed by the driver (:func:`_read_once_by_driver`), the rows handed to Spark as a local
    relation, summed unless ``raw``; None when more rows match than ``driver_lookup_rows``
    or a key column is not of an exact type (Spark reads them)."""
    data = None if asked.raw else asked.data
    read = _read_once_by_driver(
        files, schema, asked.key, asked.found, asked.as_of, data, stats, policy
    )
    if read is None:
        return None
    table, summed = read
    stats.files_opened = len(files)
    stats.rows_in_opened_files = sum(f.num_records or 0 for f in files)
    frame = spark.createDataFrame(table, schema=from_arrow_schema(table.schema))
    if asked.raw or summed:
        return frame
    return consolidate(frame, list(asked.data), by_time=False)


def _lookup_by_spark(
    spark: SparkSession,
    scans: list[_Scan],
    schema: pa.Schema,
    asked: _Asked,
    stats: LookupStats,
    policy: Policy,
    measure: bool,
) -> DataFrame:
    """:attr:`Strategy.PUSHED_DOWN` and :attr:`Strategy.SPARK_READ_ONCE`: Spark's scans of
    ``scans`` (a key column after the first with few values narrows each, :func:`_narrowing`)
    at ``_time <= as_of``, semi-joined with the broadcast keys unless the pushed-down
    condition is exact, summed unless ``raw``."""
    key = asked.key
    narrow = _narrowing(key, asked.rows, policy)
    if narrow is not None:
        scans = [(chosen, cond if cond is None else cond & narrow) for chosen, cond in scans]
    opened = {f.uri: f for chosen, _ in scans for f in chosen}
    stats.files_opened = len(opened)
    stats.rows_in_opened_files = sum(f.num_records or 0 for f in opened.values())
    parts = []
    for chosen, condition in scans:
        options = LOOKUP_READ if condition is not None else None
        part = read_files(spark, chosen, schema, options=options)
        part = part.where(F.col(TIME) <= asked.as_of)
        parts.append(part if condition is None else part.where(condition))
    df = reduce(DataFrame.unionByName, parts) if parts else read_files(spark, [], schema)
    if measure and parts:
        stats.rows_scanned = sum(_scanned_rows(p) for p in parts)
    wanted = spark.createDataFrame(asked.found)
    if asked.null_safe:
        w = F.broadcast(wanted)
        cond = reduce(lambda a, b: a & b, [df[f"`{k}`"].eqNullSafe(w[f"`{k}`"]) for k in key])
        df = df.join(w, on=cond, how="left_semi")
    elif len(key) > 1 or (scans and scans[0][1] is None):
        df = df.join(F.broadcast(wanted), on=list(key), how="left_semi")
    if asked.raw:
        return df
    return consolidate(df, list(asked.data), by_time=False)


def _read_once_by_driver(
    files: Sequence[DataFile],
    schema: pa.Schema,
    key: Sequence[str],
    found: pa.Table,
    as_of: int,
    data: Sequence[str] | None,
    stats: LookupStats | None,
    policy: Policy,
) -> tuple[pa.Table, bool] | None:
    """:func:`lookup`'s read-once scan by the driver: the updates with ``_time <= as_of``
    whose key equals a row of ``found`` (distinct, NULL equal to NULL), with ``schema``'s
    columns, or, given ``data``, those columns summed per ``data`` with zero sums dropped
    (``(data..., _diff)``; the flag says whether they were summed).

    Each file is probed in the driver's memory (:data:`resources.filecache.FILES`), decoded
    whole on its first read; with the cache off (budget 0), Arrow's multi-threaded Parquet
    scan reads the row groups whose statistics admit a key. ``stats``: where to add the rows
    decoded from Parquet (``rows_scanned``) and those probed in memory (``rows_in_memory``).
    None when a key column is not of an exact type or more than ``policy.driver_lookup_rows``
    rows match the first key column: Spark reads them."""
    types = spark_compatible_schema(schema)
    if not exact_types(from_arrow_schema(schema_of(types, key))):
        return None
    names = types.names if data is None else [*data, TIME, DIFF]
    found = found.cast(schema_of(types, key))
    batches, rows = [], 0
    for part in _probed(files, types, found, as_of, stats, names):
        rows += part.num_rows
        if rows > policy.driver_lookup_rows:
            return None
        if part.num_rows:
            batches.append(part.select(names))
    out = schema_of(types, names)
    matched = pa.concat_tables(batches) if batches else out.empty_table()
    matched = semi_join_null_safe(matched, found, key)
    if data is None or not exact_types(from_arrow_schema(schema_of(types, data))):
        return matched, False  # (floating point is summed by Spark, its own way)
    summed = matched.group_by(list(data), use_threads=False).aggregate([(DIFF, "sum")])
    summed = summed.select([*data, f"{DIFF}_sum"]).rename_columns([*data, DIFF])
    return summed.filter(pc.not_equal(summed.column(DIFF), 0)), True


def _probed(
    files: Sequence[DataFile],
    types: pa.Schema,
    found: pa.Table,
    as_of: int,
    stats: LookupStats | None,
    columns: Sequence[str] | None = None,
) -> Iterator[pa.Table]:
    """The rows of ``files`` (read with ``types``) with ``_time`` at most ``as_of`` whose
    every key column holds one of the values ``found`` has in that column (NULL among them
    if ``found`` has one): a superset of the rows matching a row of ``found``. A file the
    cache holds or would keep is probed in memory (decoded whole on its first read): by
    binary search of its key columns, sorted in every file the engine writes
    (:class:`ops.rows.SortedKey`, checked once per file; a file not so sorted is probed
    row by row), so a warm lookup costs the keys and the rows holding them, not the file's
    rows (``rows_in_memory`` counts the rows visited). The
    others' row groups whose statistics admit the keys are decoded (Arrow's scan), only
    ``columns`` of them when given (the files held keep every column: lookups share them)."""
    values = {c: pc.unique(found.column(c)) for c in found.column_names}
    held = [f for f in files if FILES.would_keep(local_path(f.uri), types)]
    scanned = [f for f in files if f not in held]
    if scanned:  # no cache, or no room for these files: their matching row groups only
        condition = reduce(
            lambda a, b: a & b,
            [pc.field(c).isin(v) for c, v in values.items()],
            pc.field(TIME) <= as_of,
        )
        dataset = ds.dataset([local_path(f.uri) for f in scanned], schema=types, format="parquet")
        for fragment in dataset.get_fragments():  # the row groups whose statistics admit a key
            decoded = sum(
                group.num_rows
                for part in fragment.split_by_row_group(condition)
                for group in part.row_groups
            )
            count_driver_read(fragment.path, decoded)
            if stats is not None:
                stats.rows_scanned += decoded
        read = schema_of(types, columns or types.names)
        for batch in dataset.to_batches(columns=read.names, filter=condition):
            yield pa.Table.from_batches([batch.cast(read)])
    key = tuple(found.column_names)
    for f in held:
        path = local_path(f.uri)
        table, decoded = FILES.read(path, types)
        if decoded:
            count_driver_read(path, table.num_rows)
        whole = table.num_rows
        index = FILES.derived(path, types, ("sorted", key), lambda rows: SortedKey.of(rows, key))
        if index is not None:  # the rows holding the keys only
            table = table.take(index.positions(found))
        if stats is not None:
            stats.rows_scanned += whole if decoded else 0
            stats.rows_in_memory += 0 if decoded else table.num_rows
        hit = pc.less_equal(table.column(TIME), as_of)
        for c, v in values.items():
            hit = pc.and_(hit, pc.is_in(table.column(c), value_set=v))
        yield table.filter(hit)


def _in_memory(files: Sequence[DataFile], schema: pa.Schema, policy: Policy) -> bool:
    """Whether the driver holds ``files`` decoded, so that a lookup probes them in memory
    rather than in a Spark scan: a file of at most ``policy.cold_file_rows`` rows counts as
    held (decoding it whole costs less than a Spark job)."""
    if FILES.budget_bytes == 0 or not files:
        return False
    types = spark_compatible_schema(schema)
    return all(
        (f.num_records or 0) <= policy.cold_file_rows or FILES.holds(local_path(f.uri), types)
        for f in files
    )


def lookup_rows(
    uri: str, schema: pa.Schema, key: Sequence[str], keys: pa.Table, as_of: int, max_rows: int
) -> tuple[pa.Table | None, LookupStats]:
    """:func:`lookup` done by the driver, with no Spark job, for tables of which a lookup
    opens few rows: the table's updates ``(columns..., _time, _diff)`` with ``_time <=
    as_of`` whose key columns equal, NULL equal to NULL (grouping semantics), a row of
    ``keys``, as they are stored (nothing summed), with ``schema``'s columns and types.

    The files are chosen as :func:`lookup` chooses them (``_time`` and the first key
    column's range); None when they hold more than ``max_rows`` rows, unless the driver holds
    them decoded or can decode and keep them (:func:`_in_memory`): Spark reads them.
    """
    files = _table_files(uri, key[0])
    live = [f for f in files if f.mins.get(TIME) is None or f.mins[TIME] <= as_of]
    stats = LookupStats(lookups=1, files_total=len(files))
    stats.rows_total = sum(f.file.num_records or 0 for f in files)
    wanted = distinct_rows(keys.select(list(key)).cast(schema_of(schema, key)))
    stats.keys = wanted.num_rows
    first = wanted.column(key[0])
    values = sorted(v for v in first.to_pylist() if v is not None)
    chosen = [f for f in live if first.null_count or _may_hold(f, key[0], values)]
    stats.files_opened = len(chosen)
    stats.rows_in_opened_files = sum(f.file.num_records or 0 for f in chosen)
    opened = [f.file for f in chosen]
    if stats.rows_in_opened_files > max_rows and not _in_memory(opened, schema, current()):
        return None, stats
    parts = list(_probed(opened, schema, wanted, as_of, stats))
    rows = pa.concat_tables(parts) if parts else schema.empty_table()
    return semi_join_null_safe(rows, wanted, key), stats


def lookup_arrow(
    uri: str,
    schema: pa.Schema,
    key: Sequence[str],
    keys: pa.Table,
    as_of: int,
    *,
    columns: Collection[str] | None = None,
    stats: LookupStats | None = None,
    null_safe: bool = False,
) -> pa.Table | None:
    """:func:`lookup` answered by the driver, for a join computed there (:mod:`ops.join.driver`):
    the arrangement's state at ``as_of`` for the keys in ``keys`` (NULL keys match nothing,
    unless ``null_safe``: then NULL matches NULL, as in :func:`lookup`),
    only the key and ``columns``, summed: ``(data..., _diff)``, no zero sums. The files are
    chosen by their ``_time`` and first key column's ranges and probed as the read-once
    lookup probes them (:func:`_read_once_by_driver`: in the driver's cache, or their
    matching row groups). None when Spark should read them: more than the policy's
    ``driver_lookup_rows`` rows match the first key column, or a column is not of an exact
    type."""
    keep = None if columns is None else {*columns, *key}
    data = [c for c in schema.names if c not in (TIME, DIFF) and (keep is None or c in keep)]
    types = spark_compatible_schema(schema)
    files = _table_files(uri, key[0])
    live = [f for f in files if f.mins.get(TIME) is None or f.mins[TIME] <= as_of]
    st = LookupStats(lookups=1, files_total=len(files))
    st.rows_total = sum(f.file.num_records or 0 for f in files)
    why = cast_loss(keys.schema, schema_of(types, key))
    if why is not None:  # integers or decimals past the key's type match nothing: the rest fit it
        keys = in_range(keys, schema_of(types, key))
        why = cast_loss(keys.schema, schema_of(types, key))
    if why is not None:  # Spark compares keys of two types in a wider one
        declined(f"a lookup in {uri.rsplit('/', 1)[-1]} read by Spark (key {why})")
        return None
    found = keys.select(list(key))
    found = distinct_rows((found if null_safe else found.drop_null()).cast(schema_of(types, key)))
    st.keys = found.num_rows
    firsts = pc.unique(found.column(key[0])).to_pylist()
    first = sorted(v for v in firsts if v is not None)
    if None in firsts:  # a NULL key: no file's min/max rules it out
        chosen = [f.file for f in live]
    else:
        chosen = [f.file for f in live if first and _may_hold(f, key[0], first)]
    st.files_opened = len(chosen)
    st.rows_in_opened_files = sum(f.num_records or 0 for f in chosen)
    read = _read_once_by_driver(chosen, schema, key, found, as_of, data, st, current())
    if read is None or not read[1]:
        return None
    if stats is not None:
        stats.add(st)
    return read[0]


def schema_of(schema: pa.Schema, columns: Sequence[str]) -> pa.Schema:
    """The part of ``schema`` naming ``columns``, in their order."""
    return pa.schema([schema.field(c) for c in columns])


def distinct_rows(table: pa.Table) -> pa.Table:
    """``table``'s distinct rows (NULL equal to NULL), in its column order."""
    if table.num_rows < 2:
        return table
    return (
        table.group_by(table.column_names, use_threads=False)
        .aggregate([])
        .select(table.column_names)
    )


def _narrowing(key: Sequence[str], rows: Sequence[tuple], policy: Policy) -> Column | None:
    """``c IN (...)`` for each key column after the first with at most
    ``policy.pushdown_keys`` distinct values: files are sorted by the whole key, so the page
    index can skip pages within one first-column value (a group's tower buckets, a
    multi-column join key)."""
    out = None
    for j, column in enumerate(key[1:], start=1):
        values = sorted({r[j] for r in rows if r[j] is not None})
        if len(values) > policy.pushdown_keys:
            continue
        col = F.col(f"`{column}`")
        cond = col.isin(values) if values else F.lit(False)
        if any(r[j] is None for r in rows):
            cond = cond | col.isNull()
        out = cond if out is None else out & cond
    return out


def _may_hold(f: FileStats, column: str, sorted_keys: Sequence) -> bool:
    """Whether a file's min/max statistics on ``column`` admit one of ``sorted_keys``."""
    lo, hi = f.mins.get(column), f.maxs.get(column)
    if lo is None or hi is None:
        return True
    i = bisect.bisect_left(sorted_keys, lo)
    return i < len(sorted_keys) and sorted_keys[i] <= hi


def _scanned_rows(df: DataFrame) -> int:
    """Rows the Parquet scans of ``df`` returned (after row-group and page skipping)."""
    df.collect()
    total = 0
    for node in executed_nodes(df):
        if node.nodeName().startswith("Scan parquet"):
            metric = node.metrics().get("numOutputRows")
            if metric.isDefined():
                total += int(metric.get().value())
    return total


def executed_nodes(df: DataFrame) -> list:
    """The physical plan nodes (JVM objects) ``df`` last ran with, through adaptive plans
    and their query stages."""
    out, stack = [], [df._jdf.queryExecution().executedPlan()]
    while stack:
        node = stack.pop()
        out.append(node)
        name = node.getClass().getSimpleName()
        if name == "AdaptiveSparkPlanExec":
            stack.append(node.executedPlan())
        elif name.endswith("QueryStageExec"):
            stack.append(node.plan())
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return out
