"""The sink: write an epoch's updates to a diff log, and apply them to a readable table.

Follows the persist sink of seed 004: the batch description ``(lower, upper]`` of epochs is
fixed before anything is written; Spark executors write the files in parallel (nothing is
collected to the driver but file names and footers), except an epoch's small change, which
the driver collects and writes as one file, the same Parquet Spark writes; one committer
commits them in a single Delta transaction carrying ``txn(app_id, epoch)``, checked first, so
a rerun is a no-op.

Contracts in ``(data, time, diff)`` terms:

- :func:`append_updates`: the log afterwards holds its previous updates plus ``updates``
  (consolidated per ``(data, time)``, except a computation from scratch: positive diffs,
  equal rows not always summed), exactly once per epoch.
- :func:`apply_to_table`: the readable table holds the multiset ``data -> sum of diffs``:
  a row of multiplicity ``n`` appears ``n`` times. A change inserts rows by appending files and
  deletes rows by rewriting only the files that may hold them (min/max statistics prune the
  rest), in the same transaction. A multiplicity that would go negative is a bug: it raises
  :class:`~ivm.errors.InvariantViolation` and nothing is committed.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from py4j.protocol import Py4JJavaError
from pyspark.errors import PySparkException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

from ivm.errors import InvariantViolation
from ops import DIFF
from ops.ingest import read_files
from ops.rows import null_safe_matches
from resources.faults import crash_point
from resources.filecache import FILES, MAX_CHUNKS
from resources.lake import (
    CommitResult,
    DataFile,
    FileStats,
    StagedFiles,
    collect_staged,
    commit_files,
    count_driver_read,
    local_path,
    remove_action,
    stage_arrow,
    staging_uri,
    table_file_stats,
    transaction_version,
)

PRUNE_COLUMNS = 8
"""How many leading columns the delete path uses to find files by min/max statistics."""

ROWS_PER_FILE = 1_000_000
"""Target rows per file for a readable table's first build."""


def arrow_schema(df: DataFrame, columns: Sequence[str] | None = None) -> pa.Schema:
    """The Arrow schema a DataFrame's Parquet files will have (``columns`` to subset)."""
    schema = to_arrow_schema(df.schema)
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    return schema


def same_columns(a: pa.Schema, b: pa.Schema) -> bool:
    """Same column names and types (nullability and Arrow's string flavours aside)."""
    from resources.lake import spark_compatible_type

    def norm(s: pa.Schema) -> list[tuple[str, pa.DataType]]:
        return [(f.name, spark_compatible_type(f.type)) for f in s]

    return norm(a) == norm(b)


def stage_updates(
    updates: DataFrame,
    table_uri: str,
    epoch: int,
    label: str,
    parquet_options: Mapping[str, object] | None = None,
    *,
    small: bool = False,
) -> StagedFiles:
    """Write ``updates`` as Parquet files into a fresh staging folder under the table, then
    list them with their stats. Nothing is committed: files of a commit that never happens
    are left for vacuum.

    Spark's executors write them (nothing passes through the driver), unless ``small``: the
    caller expects at most :data:`DRIVER_CHANGE_ROWS` rows (an epoch's change), so they are
    collected as Arrow, at most one row more than that, and written by the driver (see
    :data:`DRIVER_WRITE`). Should more rows come, Spark writes them, computing them again.
    """
    staged_uri = staging_uri(table_uri, epoch, label)
    rows = _collect_small(updates) if small else None
    if rows is not None:
        return _stage_rows(table_uri, staged_uri, rows, parquet_options or {})
    writer = updates.write.mode("error")  # (Spark Connect knows no "errorifexists")
    for option, value in (parquet_options or {}).items():
        writer = writer.option(option, value)
    writer.parquet(staged_uri)
    crash_point("staged")
    return collect_staged(table_uri, staged_uri)


DRIVER_WRITE = True
"""Whether small writes (see :func:`stage_updates`) are made by the driver. Spark's write of a
few thousand rows is a job whose file commit protocol (task attempt folders, renames) and
writer set-up cost more than the rows: collecting them (one job, as Arrow) and writing one
file with pyarrow costs less, but not by much. A warm session, SF0.1, whole refreshes after
0.1% batches, rounds alternated (each against the mean of its two neighbours): 12.9s, 13.9s,
14.6s against 14.2s, 15.6s, 15.0s; the JVM's CPU about the same. SF1, the views alone
(``python -m bench.overhead --scale 1 --change 0.001 --writes alternate``): 20.2s against
20.1s, within the noise."""


FLAT_TYPES = (
    T.BooleanType,
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.FloatType,
    T.DoubleType,
    T.DecimalType,
    T.StringType,
    T.BinaryType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
)
"""Column types the driver writes as Spark does; updates with others (nested, intervals) are
written by Spark."""


EXACT_TYPES = tuple(t for t in FLAT_TYPES if t not in (T.FloatType, T.DoubleType))
"""Column types whose order and equality Python's and Arrow's values share with Spark (strings
compare by code point, as UTF-8 bytes do), among those the driver writes; floating point (NaN,
-0.0) is left to Spark."""


def exact_types(schema: T.StructType) -> bool:
    """Whether every column of ``schema`` has one of the :data:`EXACT_TYPES`."""
    return all(isinstance(f.dataType, EXACT_TYPES) for f in schema.fields)


def collect_flat(updates: DataFrame) -> pa.Table | None:
    """All of ``updates`` as Arrow, or None if a column's type is not :data:`FLAT_TYPES`
    (those the driver writes as Spark does). The caller knows there are not too many."""
    if not all(isinstance(f.dataType, FLAT_TYPES) for f in updates.schema):
        return None
    return updates.toArrow()


def _collect_small(updates: DataFrame) -> pa.Table | None:
    """At most :data:`DRIVER_CHANGE_ROWS` rows of ``updates``, collected in their order as one
    partition; None if there are more or a column's type is not :data:`FLAT_TYPES`."""
    if not DRIVER_WRITE or not all(isinstance(f.dataType, FLAT_TYPES) for f in updates.schema):
        return None
    rows = updates.coalesce(1).limit(DRIVER_CHANGE_ROWS + 1).toArrow()
    return None if rows.num_rows > DRIVER_CHANGE_ROWS else rows


def _stage_rows(
    table_uri: str, staged_uri: str, rows: pa.Table, parquet_options: Mapping[str, object]
) -> StagedFiles:
    """Write ``rows`` (if any) as one Parquet file into ``staged_uri`` by the driver, with the
    page settings of ``parquet_options`` (Spark's writer options), and list it; the staged
    files keep the rows (``table``)."""
    if rows.num_rows:

        def setting(key: str) -> int | None:
            value = parquet_options.get(key)
            return None if value is None else int(str(value))

        stage_arrow(
            staged_uri,
            rows,
            rows_per_page=setting("parquet.page.row.count.limit"),
            page_bytes=setting("parquet.page.size"),
        )
    crash_point("staged")
    staged = collect_staged(table_uri, staged_uri)
    staged.table = rows
    return staged


def append_updates(
    updates: DataFrame | pa.Table,
    log_uri: str,
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool = False,
    description: str = "ivm diff log: the view's updates (columns..., _time, _diff)",
    parquet_options: Mapping[str, object] | None = None,
    small: bool = False,
) -> CommitResult:
    """Write updates (consolidated, or a snapshot's) as new files of an update log and commit
    them once (``small``: see :func:`stage_updates`). Updates the driver computed (an Arrow
    table, laid out as the log's rows) are written by the driver.

    Used for views' diff logs and for arrangements (which pass their sort order and Parquet
    page settings). ``overwrite`` replaces the log's whole history (and schema) by these
    updates, in one commit: used when a definition changed its columns.

    The caller has checked that the log does not hold ``epoch`` yet (so it did not compute
    the updates in vain); :func:`~resources.lake.commit_files` checks again under the lock.
    """
    if isinstance(updates, pa.Table):  # computed by the driver (ops.local)
        staged_uri = staging_uri(log_uri, epoch, "updates")
        staged = _stage_rows(log_uri, staged_uri, updates, parquet_options or {})
        schema = updates.schema
    else:
        staged = stage_updates(updates, log_uri, epoch, "updates", parquet_options, small=small)
        schema = arrow_schema(updates)
    return commit_staged(staged, log_uri, app_id, epoch, schema, metadata, description, overwrite)


def commit_staged(
    staged: StagedFiles,
    log_uri: str,
    app_id: str,
    epoch: int,
    schema: pa.Schema,
    metadata: Mapping[str, str],
    description: str,
    overwrite: bool = False,
) -> CommitResult:
    """Commit the files staged for ``epoch`` (once: txn ``(app_id, epoch)``); the result
    carries their rows and bytes, and the rows themselves when the driver wrote them."""
    result = commit_files(
        log_uri,
        app_id=app_id,
        epoch=epoch,
        schema=schema,
        adds=staged.adds,
        metadata=metadata,
        description=description,
        overwrite=overwrite,
    )
    result.rows, result.bytes = staged.rows, staged.bytes
    result.staged = staged.table
    return result


@dataclass
class TableChange:
    """What :func:`apply_to_table` did, beyond the commit."""

    commit: CommitResult
    inserted: int
    deleted: int
    files_rewritten: int
    rows_rewritten: int


def _prune_condition(delta: DataFrame, stats: DataFrame, columns: Sequence[str]):
    cond = F.lit(True)
    for c in columns:
        lo, hi, v = stats[f"min_{c}"], stats[f"max_{c}"], delta[f"`{c}`"]
        cond = cond & (v.isNull() | ((lo.isNull() | (v >= lo)) & (hi.isNull() | (v <= hi))))
    return cond


_BOUNDED_TYPES = (
    T.ByteType,
    T.ShortType,
    T.IntegerType,
    T.LongType,
    T.StringType,
    T.DateType,
    T.DecimalType,
)
"""Column types whose min/max statistics compare on the driver the way Spark compares them."""


def _summary(net: DataFrame, columns: Sequence[str]) -> tuple[int, int, dict[str, tuple]]:
    """One pass over the change: rows inserted, rows deleted, and per prunable column the
    ``(lowest, highest)`` value among deleted rows (absent when one of them is NULL)."""
    deleting = F.col(DIFF) < 0
    aggs = [
        F.sum(F.when(F.col(DIFF) > 0, F.col(DIFF)).otherwise(0)).alias("inserted"),
        F.sum(F.when(deleting, -F.col(DIFF)).otherwise(0)).alias("deleted"),
    ]
    for i, c in enumerate(columns):
        v = F.col(f"`{c}`")
        aggs += [
            F.min(F.when(deleting, v)).alias(f"lo{i}"),
            F.max(F.when(deleting, v)).alias(f"hi{i}"),
            F.max(F.when(deleting & v.isNull(), F.lit(1))).alias(f"null{i}"),
        ]
    row = net.agg(*aggs).collect()[0]
    bounds = {
        c: (row[f"lo{i}"], row[f"hi{i}"])
        for i, c in enumerate(columns)
        if row[f"null{i}"] is None and row[f"lo{i}"] is not None
    }
    return int(row["inserted"] or 0), int(row["deleted"] or 0), bounds


DRIVER_CHANGE_ROWS = 100_000
"""Up to this many rows (by its log files' counts), a change is brought to the driver once,
as Arrow, and its sizes, the deleted rows' range and the files they may be in are found
there: one Spark job instead of a cached copy, a summing job and a join job. The rewrite
reads the change again from its files. ``python -m bench.sink 8`` (500 deletions and 500
insertions into a 20-file table, alternated, two runs): medians 0.94s and 1.10s against
1.23s and 1.34s, the same files rewritten either way."""


def _summary_local(
    net: pa.Table, columns: Sequence[str]
) -> tuple[int, int, dict[str, tuple], pa.Table]:
    """:func:`_summary` of a change on the driver, and its deleted rows. Arrow orders strings
    by their UTF-8 bytes, decimals and dates by value, as Spark does."""
    diffs = net.column(DIFF)
    deleting = pc.less(diffs, 0)
    inserted = pc.sum(pc.if_else(deleting, 0, diffs)).as_py() or 0
    deletes = net.filter(deleting)
    deleted = -(pc.sum(deletes.column(DIFF)).as_py() or 0)
    bounds: dict[str, tuple] = {}
    for c in columns:
        values = deletes.column(c)
        if len(values) and not values.null_count:
            lo_hi = pc.min_max(values)
            bounds[c] = (lo_hi["min"].as_py(), lo_hi["max"].as_py())
    return int(inserted), int(deleted), bounds, deletes


def _rows_may_hit(f: FileStats, deletes: pa.Table, columns: Sequence[str]) -> bool:
    """Whether some deleted row lies within the file's min/max in every column (a NULL value,
    or a statistic that does not convert to the column's type, prunes nothing)."""
    hit = None
    for c in columns:
        values = deletes.column(c)
        in_range = None
        for stats, compare in ((f.mins, pc.greater_equal), (f.maxs, pc.less_equal)):
            if c not in stats:
                continue
            try:
                bound = pa.scalar(stats[c], type=values.type)
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError):
                continue
            side = compare(values, bound)
            in_range = side if in_range is None else pc.and_kleene(in_range, side)
        if in_range is not None:
            within = pc.or_kleene(pc.is_null(values), in_range)
            hit = within if hit is None else pc.and_kleene(hit, within)
    return hit is None or bool(pc.any(hit).as_py())


def _may_hold(f: FileStats, bounds: Mapping[str, tuple]) -> bool:
    """Whether a file's min/max statistics overlap the deleted rows' range in every column."""
    for c, (lo, hi) in bounds.items():
        fmin, fmax = f.mins.get(c), f.maxs.get(c)
        try:
            if (fmax is not None and fmax < lo) or (fmin is not None and fmin > hi):
                return False
        except TypeError:  # a statistic of another type than Spark's value: cannot prune
            continue
    return True


PER_ROW_PRUNE_FILES = 8
"""When the deleted rows' range still overlaps this many files, find the files row by row."""


def _candidate_files(
    spark: SparkSession,
    table_uri: str,
    deletes: DataFrame,
    columns: Sequence[str],
    bounds: Mapping[str, tuple],
    local: pa.Table | None = None,
) -> list[DataFile]:
    """Files of the table that may hold some deleted row: first by the deleted rows' range
    against each file's min/max statistics (on the driver); when many files remain, by each
    deleted row against them (``local``, the deleted rows on the driver: there; otherwise a
    broadcast join)."""
    prune = list(columns[:PRUNE_COLUMNS])
    files = [f for f in table_file_stats(table_uri, prune) if _may_hold(f, bounds)]
    with_stats = [c for c in prune if any(c in f.mins for f in files)]
    if len(files) < PER_ROW_PRUNE_FILES or not with_stats:
        return [f.file for f in files]
    if local is not None:
        return [f.file for f in files if _rows_may_hit(f, local, with_stats)]
    rows = []
    for i, f in enumerate(files):
        row: dict = {"_file": i}
        for c in with_stats:
            row[f"min_{c}"] = f.mins.get(c)
            row[f"max_{c}"] = f.maxs.get(c)
        rows.append(row)
    delta_types = {f.name: f.dataType for f in deletes.schema.fields}
    stats_df = spark.createDataFrame(pa.Table.from_pylist(rows))
    for c in with_stats:
        for side in ("min", "max"):
            stats_df = stats_df.withColumn(f"{side}_{c}", F.col(f"{side}_{c}").cast(delta_types[c]))
    hits = (
        deletes.join(F.broadcast(stats_df), _prune_condition(deletes, stats_df, with_stats))
        .select("_file")
        .distinct()
        .collect()
    )
    return [files[r["_file"]].file for r in hits]


BROADCAST_DELETES = 1_000_000
"""Up to this many deleted rows, a rewrite ships them to every task (no shuffle of the
table's rows); beyond, Spark joins by sorting both sides."""


def _named(
    deletes: DataFrame, columns: Sequence[str], extra: Sequence[str] = ()
) -> tuple[DataFrame, Column]:
    """The deleted rows with their columns renamed ``_k<i>`` and ``-_diff`` as ``_del`` (and
    the ``extra`` columns as they are), and the condition matching a row of the table to one
    of them (NULL-safe, every column)."""
    keyed = deletes.select(
        *[F.col(f"`{c}`").alias(f"_k{i}") for i, c in enumerate(columns)],
        (-F.col(DIFF)).alias("_del"),
        *extra,
    )
    cond = F.lit(True)
    for i, c in enumerate(columns):
        cond = cond & F.col(f"`{c}`").eqNullSafe(F.col(f"_k{i}"))
    return keyed, cond


def _copies(df: DataFrame, cols: Sequence[Column], n: Column) -> DataFrame:
    """Each row ``n`` times (``n`` >= 0)."""
    return df.select(*cols, F.explode(F.array_repeat(F.lit(1), n.cast("int"))).alias("_n")).select(
        *cols
    )


@dataclass
class _Held:
    """A rewrite's count of the deleted rows its files hold, taken in the same scan as the
    rows it keeps (an observed metric of the write's query): for deleted row ``i`` of the
    driver's copy, the candidate files' copies of it are ``ids.count(i)``."""

    deletes: pa.Table
    observation: Observation

    def kept(self, columns: Sequence[str]) -> tuple[pa.Table | None, tuple[int, dict] | None]:
        """The copies of deleted rows to write back (``held - deleted`` of each), and the
        first row deleted more times than held, as ``(multiplicity, row)``."""
        found = self.observation.get["ids"]
        held = Counter(int(i) for i in found.split(",")) if found else Counter()
        return _kept_copies(
            self.deletes, [held.get(i, 0) for i in range(len(self.deletes))], columns
        )


def _kept_copies(
    deletes: pa.Table, held: Sequence[int], columns: Sequence[str]
) -> tuple[pa.Table | None, tuple[int, dict] | None]:
    """Given ``held[i]``, the copies the table holds of deleted row ``i`` (``deletes``:
    ``(columns..., _diff)``, negative diffs), the copies to write back (``held - deleted`` of
    each; None when none), and the first row deleted more times than held, as
    ``(multiplicity, row)``."""
    left = np.asarray(held, dtype=np.int64) + deletes.column(DIFF).to_numpy()
    short = np.flatnonzero(left < 0)
    if len(short):
        i = int(short[0])
        return None, (int(left[i]), {c: deletes.column(c)[i].as_py() for c in columns})
    if not left.any():
        return None, None
    repeat = pa.array(np.repeat(np.arange(len(left)), left), pa.int64())
    return deletes.select(list(columns)).take(repeat), None


def _rows_after(
    spark: SparkSession,
    net: DataFrame,
    candidates: Sequence[DataFile],
    schema: pa.Schema,
    columns: Sequence[str],
    sizes: tuple[int, int],
    overwrite: bool,
    deletes: pa.Table | None = None,
    types: Mapping[str, T.DataType] | None = None,
) -> tuple[DataFrame, _Held | None]:
    """The rows to write: the candidate files' rows minus the deleted ones, and the inserted.

    A candidate file's rows that no deletion names pass through in their order (a join
    against the deleted rows, broadcast when few), so each rewritten file stays sorted and no
    row of the table is shuffled. Rows a deletion names are counted and kept ``held -
    deleted`` times; a negative count stops the write with :data:`NEGATIVE` and the row. The
    inserted and kept rows go to one new file, sorted (a first build: files of
    :data:`ROWS_PER_FILE` rows, by range). A deletion of a row no candidate file holds
    leaves the written count too high: the caller compares it with what it expects.

    ``deletes``, the deleted rows on the driver (a change sized there; ``types``, the
    columns' Spark types, cast them back): the candidate files
    are read once, not twice. Every row a deletion names is left out, and the scan counts
    them per deleted row as it goes (the returned :class:`_Held`); the caller writes back the
    ``held - deleted`` copies (none when the table's rows are distinct) and refuses a
    negative count before committing. SF1, one refresh of the demo's views after a 0.1%
    batch: the four rewritten tables read 2.3M rows instead of 4.7M (``bench.scans``).
    """
    inserted, deleted = sizes
    cols = [F.col(f"`{c}`") for c in columns]
    # Overwrite: ``net`` is the whole contents; a deletion in it is a bug, caught by the write.
    inserts = net if overwrite else net.where(F.col(DIFF) > 0)
    if not candidates:
        out = _copies(inserts.select(*cols, _checked(cols)), cols, F.col(DIFF))
        n_files = max(1, math.ceil(inserted / ROWS_PER_FILE))
        if columns and n_files > 1:
            return out.repartitionByRange(n_files, cols[0]).sortWithinPartitions(*cols), None
        return (out.coalesce(1).sortWithinPartitions(*cols) if columns else out.coalesce(1)), None
    existing = read_files(spark, candidates, schema)
    if deletes is not None and types is not None:
        return _rows_after_local(spark, existing, inserts, deletes, types, columns)
    keyed, matches = _named(net.where(F.col(DIFF) < 0), columns)
    if deleted <= BROADCAST_DELETES:
        keyed = F.broadcast(keyed)
    untouched = existing.join(keyed, matches, "left_anti")
    held = (
        existing.join(keyed, matches, "left_semi")
        .groupBy(*cols)
        .agg(F.count(F.lit(1)).alias("_held"))
    )
    kept = held.join(keyed, matches).select(*cols, (F.col("_held") - F.col("_del")).alias(DIFF))
    fresh = kept.unionByName(inserts.select(*cols, DIFF)).select(*cols, _checked(cols))
    fresh = _copies(fresh, cols, F.col(DIFF)).coalesce(1).sortWithinPartitions(*cols)
    return untouched.select(*cols).unionByName(fresh), None


def _rows_after_local(
    spark: SparkSession,
    existing: DataFrame,
    inserts: DataFrame,
    deletes: pa.Table,
    types: Mapping[str, T.DataType],
    columns: Sequence[str],
) -> tuple[DataFrame, _Held]:
    """:func:`_rows_after` with the deleted rows on the driver: one scan of the candidates."""
    cols = [F.col(f"`{c}`") for c in columns]
    local = spark.createDataFrame(deletes.append_column("_id", pa.array(range(len(deletes)))))
    local = local.select(
        *[F.col(f"`{c}`").cast(types[c]).alias(c) for c in columns],
        DIFF,
        F.col("_id").cast("int").alias("_id"),
    )
    keyed, matches = _named(local, columns, extra=("_id",))
    observation = Observation()
    scanned = existing.join(F.broadcast(keyed), matches, "left").observe(
        observation,
        F.array_join(F.collect_list(F.col("_id").cast("string")), ",").alias("ids"),
    )
    untouched = scanned.where(F.col("_id").isNull()).select(*cols)
    fresh = _copies(inserts.select(*cols, _checked(cols)), cols, F.col(DIFF))
    fresh = fresh.coalesce(1).sortWithinPartitions(*cols)
    return untouched.unionByName(fresh), _Held(deletes, observation)


DRIVER_REWRITE_ROWS = 4_000_000
"""Up to this many rows in the files a change sized on the driver may delete from, the driver
rewrites them itself (:func:`_rewrite_by_driver`), one file at a time, instead of a Spark job
reading, joining and writing them (as every small write, only while :data:`DRIVER_WRITE`);
0 leaves every rewrite to Spark. ``python -m bench.sink 4``, the three ways alternated in
one session, 500 deletions and 500 insertions: 20 files of 10,000 rows 0.24-0.31s by the
driver against 0.69-1.27s rewritten by Spark (1.17-1.37s sized by Spark too); ``--files 2
--rows-per-file 400000``: 0.50-0.58s against 0.74-0.99s. Peak memory is one file's rows.
A change that only inserts (a first build) of up to this many rows is written by the driver
too (:func:`_insert_by_driver`), holding them all to sort them (and at most
:data:`DRIVER_INSERT_BYTES`)."""

DRIVER_INSERT_BYTES = 512 * 1024 * 1024
"""Most bytes of Arrow memory a change that only inserts may take on the driver
(:func:`_insert_by_driver`): wide rows are bounded by their size, not only by
:data:`DRIVER_REWRITE_ROWS`; the read stops past it and Spark writes the change."""


@dataclass
class _Rewrite:
    """What :func:`_rewrite_by_driver` staged: the files it replaced (those holding a deleted
    row) and the first row deleted more times than held, as ``(multiplicity, row)``."""

    staged: StagedFiles
    replaced: list[DataFile]
    short: tuple[int, dict] | None = None


def _rewrite_by_driver(
    table_uri: str,
    epoch: int,
    candidates: Sequence[DataFile],
    change: pa.Table,
    schema: pa.Schema,
    columns: Sequence[str],
) -> _Rewrite:
    """:func:`_rows_after` and its write, by the driver with no Spark job, for a change it
    holds (``(columns..., _diff)``, consolidated) and candidate files it can read.

    Each candidate file is read whole (its rows are at most :data:`DRIVER_REWRITE_ROWS`;
    from the driver's cache of decoded files when it holds them: the files written here go
    to it, :func:`_keep_written`), its rows that a deletion names (NULL equal to NULL, every
    column) are counted per deleted row and left out, and the rest are written back as one
    file in their order; a candidate
    holding no deleted row is left as it is (it is not replaced). The inserted rows and the
    ``held - deleted`` copies of rows held more often than deleted go to one new file, sorted
    as Spark sorts (NULLs first). A row deleted more times than the candidates hold it is
    returned as ``short``, with nothing to commit (the files staged so far are left for
    vacuum, as a refused Spark write leaves its own)."""
    change = change.select([*columns, DIFF])
    diffs = change.column(DIFF)
    deletes = change.filter(pc.less(diffs, 0))
    wanted = deletes.select(list(columns)).cast(schema)
    held = np.zeros(deletes.num_rows, dtype=np.int64)
    staged_uri = staging_uri(table_uri, epoch, "rows")
    replaced: list[DataFile] = []
    for f in candidates:  # one file's rows at a time; what a refused change staged, vacuum removes
        rows, decoded = FILES.read(local_path(f.uri), schema)
        if decoded:
            count_driver_read(f.uri, rows.num_rows)
        pairs = null_safe_matches(rows, wanted, columns)
        if not pairs.num_rows:
            continue
        held += np.bincount(pairs.column("_key").to_numpy(), minlength=len(held))
        kept = without_rows(rows, pairs.column("_row").to_numpy())
        if kept.num_rows:
            _keep_written(stage_arrow(staged_uri, kept), schema, kept)
        replaced.append(f)
    kept, short = _kept_copies(deletes, held, columns)
    if short is not None:
        return _Rewrite(StagedFiles([], 0, 0, schema), [], short)
    fresh = _each_copy(change.filter(pc.greater(diffs, 0)), columns, schema)
    if kept is not None:
        fresh = pa.concat_tables([fresh, kept.cast(schema)])
    if fresh.num_rows:
        fresh = fresh.sort_by(spark_order(columns))
        _keep_written(stage_arrow(staged_uri, fresh), schema, fresh)
    crash_point("staged")
    return _Rewrite(collect_staged(table_uri, staged_uri), replaced)


def without_rows(rows: pa.Table, positions: np.ndarray) -> pa.Table:
    """``rows`` without those at ``positions`` (ascending), in their order: the slices of
    ``rows`` between them, which copy nothing, while that leaves at most
    :data:`resources.filecache.MAX_CHUNKS` chunks in a column; else one filtered copy
    (one chunk per column again).

    A rewrite deletes a few rows from each file of millions: a filter reads and writes every
    byte of the file (SF3, the demo's readable tables: 7M rows, 0.19s of a serial refresh's
    3.3s), the slices none, and the Parquet writer encodes them as fast (a 976k-row file,
    700 slices: 0.125s against 0.116s; 4,000: 0.163s, ``/tmp/s18/chunks.py``).
    """
    if not len(positions):
        return rows
    starts = np.concatenate(([0], positions + 1))
    ends = np.concatenate((positions, [rows.num_rows]))
    spans = [(int(a), int(b - a)) for a, b in zip(starts, ends, strict=True) if b > a]
    chunks = max((c.num_chunks for c in rows.columns), default=1)
    if chunks + len(spans) > MAX_CHUNKS:
        keep = np.ones(rows.num_rows, dtype=bool)
        keep[positions] = False
        return rows.filter(pa.array(keep)).combine_chunks()
    if not spans:
        return rows.slice(0, 0)
    return pa.concat_tables([rows.slice(a, n) for a, n in spans])


def _keep_written(path: str | None, schema: pa.Schema, rows: pa.Table) -> None:
    """Hand a file the driver just wrote from ``rows`` to its cache of decoded files
    (:mod:`resources.filecache`), as the next rewrite reads it: a readable table's files
    are rewritten refresh after refresh (copy on write), and each rewrite then decodes
    nothing. SF3 ``open_orders``: 1M-row files, 0.33s each to decode."""
    if path is not None:
        FILES.put(path, schema, rows)


def _each_copy(inserts: pa.Table, columns: Sequence[str], schema: pa.Schema) -> pa.Table:
    """The rows of ``inserts`` (``(columns..., _diff)``, positive diffs), each ``_diff``
    times, with ``schema``'s columns and types."""
    rows = inserts.select(list(columns)).cast(schema)
    diffs = inserts.column(DIFF)
    if not len(diffs) or pc.max(diffs).as_py() == 1:
        return rows
    copies = pa.array(np.repeat(np.arange(len(diffs)), diffs.to_numpy()), pa.int64())
    return rows.take(copies)


def spark_order(columns: Sequence[str]) -> list[tuple[str, str, str]]:
    """Arrow's sort keys for Spark's ascending order by ``columns`` (NULLs first)."""
    return [(c, "ascending", "at_start") for c in columns]


def _insert_by_driver(
    table_uri: str,
    change: pa.Table,
    schema: pa.Schema,
    columns: Sequence[str],
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    label: str,
) -> TableChange:
    """:func:`apply_to_table` of a change that only inserts (``(columns..., _diff)``, every
    diff positive), by the driver with no Spark job: each row ``_diff`` times, sorted as
    Spark sorts (NULLs first), in files of :data:`ROWS_PER_FILE` rows, appended in one
    commit. As Spark's write of a first build, whose files hold ranges of the first column,
    each file here holds a range of the sort order. The files go to the driver's cache as
    the rewrites' do (:func:`_keep_written`): the first refresh after a build decodes none
    of them (SF3, the demo's views: 11.5M rows decoded in that refresh before)."""
    diffs = change.column(DIFF)
    if len(diffs) and pc.min(diffs).as_py() < 1:
        raise InvariantViolation(
            f"view {label!r} epoch {epoch}: a change read as insertions only holds a "
            f"diff of {pc.min(diffs).as_py()}"
        )
    rows = _each_copy(change, columns, schema)
    if columns:
        rows = rows.sort_by(spark_order(columns))
    staged_uri = staging_uri(table_uri, epoch, "rows")
    for start in range(0, rows.num_rows, ROWS_PER_FILE):
        part = rows.slice(start, ROWS_PER_FILE)
        _keep_written(stage_arrow(staged_uri, part), schema, part)
    crash_point("staged")
    staged = collect_staged(table_uri, staged_uri)
    if staged.rows != rows.num_rows:
        raise InvariantViolation(
            f"view {label!r} epoch {epoch}: staged {staged.rows} rows, expected {rows.num_rows}"
        )
    description = f"ivm view {label}: its current rows"
    commit = commit_staged(staged, table_uri, app_id, epoch, schema, metadata, description)
    return TableChange(commit, rows.num_rows, 0, 0, 0)


def _checked(cols: Sequence[Column]) -> Column:
    """``_diff``, or the write's failure naming the row when it is negative."""
    return (
        F.when(
            F.col(DIFF) < 0,
            F.raise_error(
                F.concat(
                    F.lit(f"{NEGATIVE}: "),
                    F.col(DIFF).cast("string"),
                    F.lit(" "),
                    F.to_json(F.struct(*cols)),
                )
            ),
        )
        .otherwise(F.col(DIFF))
        .alias(DIFF)
    )


NEGATIVE = "ivm: negative multiplicity"
"""Marker of the error the table write raises when a row would be deleted more times than
the table holds it."""


def apply_to_table(
    spark: SparkSession,
    net: DataFrame,
    table_uri: str,
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    label: str,
    overwrite: bool = False,
    positive: bool = False,
    rows_hint: int | None = None,
    net_rows: pa.Table | None = None,
    read_net: Callable[[int], pa.Table | None] | None = None,
) -> TableChange:
    """Apply a net change ``(columns..., _diff)`` (consolidated, no zeros) to a readable table.

    Args:
        net: the change, one row per distinct data with its net diff.
        table_uri: the readable table (created if missing).
        label: the view's name, for messages.
        overwrite: ``net`` is the whole new contents; replace every file in one commit.
        positive: every diff in ``net`` is positive (the caller knows it from the files'
            statistics: a first build, an epoch that only added rows). Nothing is deleted, so
            no file is rewritten and no pass counts the change first: the rows written are
            the rows inserted. SF1 first builds, with and without, alternated three rounds
            each: ``building_open_lines`` (374k rows) 1.27-1.36s against 2.42-2.54s,
            ``open_orders`` (732k rows) 1.00-1.21s against 2.24-2.67s.
        rows_hint: at most how many rows ``net`` holds (sizes a first build's files; up to
            :data:`DRIVER_CHANGE_ROWS`, the change is sized and its files found on the
            driver).
        net_rows: ``net``'s rows, when the driver holds them (the diff log's epoch it has
            just written): a small change is sized from them, not collected again.
        read_net: reads ``net``'s rows on the driver (the log's files, by Arrow), or None
            once they take more than the bytes it is given. A ``positive`` change of at
            most :data:`DRIVER_REWRITE_ROWS` rows (by ``rows_hint``) and
            :data:`DRIVER_INSERT_BYTES` is then written by the driver
            (:func:`_insert_by_driver`), as is one whose ``net_rows`` it holds. SF1 first
            builds, the table step alone: ``order_events`` (820k rows) 0.2-0.4s against
            Spark's 0.9s, ``building_open_lines`` (374k) 0.2s against 1.3-1.5s.

    Raises:
        InvariantViolation: a row would be deleted more times than the table holds it.
    """
    columns = [c for c in net.columns if c != DIFF]
    schema = arrow_schema(net, columns)
    types = {f.name: f.dataType for f in net.schema.fields}
    if (
        positive
        and not overwrite
        and DRIVER_WRITE
        and exact_types(net.schema)
        and (
            net_rows is not None
            or (read_net is not None and rows_hint is not None and rows_hint <= DRIVER_REWRITE_ROWS)
        )
    ):
        if net_rows is not None:
            change = net_rows.select(net.columns)
        elif rows_hint == 0:  # no log file holds a row
            change = schema.empty_table().append_column(DIFF, pa.array([], pa.int64()))
        else:
            change = read_net(DRIVER_INSERT_BYTES) if read_net is not None else None
        if change is not None:
            return _insert_by_driver(
                table_uri,
                change,
                schema,
                columns,
                app_id=app_id,
                epoch=epoch,
                metadata=metadata,
                label=label,
            )
    prunable = [c for c in columns[:PRUNE_COLUMNS] if isinstance(types[c], _BOUNDED_TYPES)]
    local = (
        not positive and not overwrite and rows_hint is not None and rows_hint <= DRIVER_CHANGE_ROWS
    )
    cached = not positive and not local
    if cached:
        net = net.persist()
    try:
        deletes = rows = None
        if positive:  # its size is known once written
            inserted, deleted, bounds = rows_hint or 0, 0, {}
        elif local:
            rows = net.toArrow() if net_rows is None else net_rows.select(net.columns)
            inserted, deleted, bounds, deletes = _summary_local(rows, prunable)
        else:
            inserted, deleted, bounds = _summary(net, prunable)
        # Only deletions need to find and rewrite existing files; insertions just append.
        candidates = (
            _candidate_files(spark, table_uri, net.where(F.col(DIFF) < 0), columns, bounds, deletes)
            if deleted and not overwrite
            else []
        )
        if deleted and not candidates and not overwrite:
            return _nothing_to_delete_from(spark, net, table_uri, app_id, epoch, label)
        existing_rows = sum(f.num_records or 0 for f in candidates)
        if (
            DRIVER_WRITE
            and rows is not None
            and candidates
            and exact_types(net.schema)
            and all(f.num_records is not None for f in candidates)
            and existing_rows <= DRIVER_REWRITE_ROWS
        ):
            return _apply_by_driver(
                table_uri,
                rows,
                candidates,
                schema,
                columns,
                (inserted, deleted),
                app_id=app_id,
                epoch=epoch,
                metadata=metadata,
                label=label,
            )
        rows_out, held = _rows_after(
            spark, net, candidates, schema, columns, (inserted, deleted), overwrite, deletes, types
        )
        total_rows = existing_rows + inserted - deleted
        try:
            # At most the candidates' rows and the inserted ones are written: if they are
            # few, the driver writes them as one file, sorted as each file of the table is.
            small = (
                not overwrite
                and rows_hint is not None
                and all(f.num_records is not None for f in candidates)
                and existing_rows + rows_hint <= DRIVER_CHANGE_ROWS
            )
            if small and columns:
                rows_out = rows_out.coalesce(1).sortWithinPartitions(
                    *[F.col(f"`{c}`") for c in columns]
                )
            staged = stage_updates(rows_out, table_uri, epoch, "rows", small=small)
            if held is not None:
                kept, short = held.kept(columns)
                if short is not None:
                    if (transaction_version(table_uri, app_id) or 0) >= epoch:
                        return _already_applied(table_uri, epoch)
                    raise _negative(label, epoch, short[0], str(short[1]))
                if kept is not None:  # copies of rows held more times than deleted
                    more = stage_updates(
                        spark.createDataFrame(kept).select(
                            *[F.col(f"`{c}`").cast(types[c]) for c in columns]
                        ),
                        table_uri,
                        epoch,
                        "kept",
                        small=True,
                    )
                    staged = StagedFiles(
                        staged.adds + more.adds,
                        staged.rows + more.rows,
                        staged.bytes + more.bytes,
                        staged.schema,
                    )
        except (PySparkException, Py4JJavaError) as e:
            if NEGATIVE not in str(e):
                raise
            if (transaction_version(table_uri, app_id) or 0) >= epoch:
                return _already_applied(table_uri, epoch)
            detail = str(e).split(f"{NEGATIVE}: ", 1)[1].splitlines()[0]
            multiplicity, _, example = detail.partition(" ")
            raise _negative(label, epoch, multiplicity, example) from None
        if positive:  # nothing deleted: every row written was inserted
            inserted = total_rows = staged.rows
        if staged.rows != total_rows and all(f.num_records is not None for f in candidates):
            # More rows than expected: some deleted row is in none of the files read.
            if (transaction_version(table_uri, app_id) or 0) >= epoch:
                return _already_applied(table_uri, epoch)
            keyed, matches = _named(net.where(F.col(DIFF) < 0), columns)
            existing = read_files(spark, candidates, schema)
            bad = keyed.join(existing, matches, "left_anti").limit(1).collect()
            if bad:
                example = {c: bad[0][f"_k{i}"] for i, c in enumerate(columns)}
                raise _negative(label, epoch, -bad[0]["_del"], str(example))
            raise InvariantViolation(
                f"view {label!r} epoch {epoch}: wrote {staged.rows} rows, expected {total_rows}"
            )
        commit = commit_files(
            table_uri,
            app_id=app_id,
            epoch=epoch,
            schema=schema,
            adds=staged.adds,
            removes=[remove_action(table_uri, f) for f in candidates],
            metadata=metadata,
            description=f"ivm view {label}: its current rows",
            overwrite=overwrite,
        )
        commit.rows, commit.bytes = staged.rows, staged.bytes
        return TableChange(
            commit=commit,
            inserted=inserted,
            deleted=deleted,
            files_rewritten=len(candidates),
            rows_rewritten=existing_rows,
        )
    finally:
        if cached:
            net.unpersist()


def _apply_by_driver(
    table_uri: str,
    change: pa.Table,
    candidates: Sequence[DataFile],
    schema: pa.Schema,
    columns: Sequence[str],
    sizes: tuple[int, int],
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    label: str,
) -> TableChange:
    """:func:`apply_to_table`'s rewrite and commit when the driver rewrites the candidate
    files (:func:`_rewrite_by_driver`): only the files holding a deleted row are replaced."""
    inserted, deleted = sizes
    rewrite = _rewrite_by_driver(table_uri, epoch, candidates, change, schema, columns)
    if rewrite.short is not None:
        if (transaction_version(table_uri, app_id) or 0) >= epoch:
            return _already_applied(table_uri, epoch)
        raise _negative(label, epoch, rewrite.short[0], str(rewrite.short[1]))
    rewritten = sum(f.num_records or 0 for f in rewrite.replaced)
    if rewrite.staged.rows != rewritten + inserted - deleted:
        raise InvariantViolation(
            f"view {label!r} epoch {epoch}: wrote {rewrite.staged.rows} rows, expected "
            f"{rewritten + inserted - deleted} (the files' row counts disagree with their rows)"
        )
    commit = commit_files(
        table_uri,
        app_id=app_id,
        epoch=epoch,
        schema=schema,
        adds=rewrite.staged.adds,
        removes=[remove_action(table_uri, f) for f in rewrite.replaced],
        metadata=metadata,
        description=f"ivm view {label}: its current rows",
    )
    commit.rows, commit.bytes = rewrite.staged.rows, rewrite.staged.bytes
    FILES.discard(local_path(f.uri) for f in rewrite.replaced)
    return TableChange(commit, inserted, deleted, len(rewrite.replaced), rewritten)


def _already_applied(table_uri: str, epoch: int) -> TableChange:
    """A concurrent refresh committed this epoch to the table while we computed: the files
    we merged with already hold it. Nothing to do (exactly once)."""
    return TableChange(CommitResult(table_uri, epoch, committed=False, version=None), 0, 0, 0, 0)


def _nothing_to_delete_from(
    spark: SparkSession, net: DataFrame, table_uri: str, app_id: str, epoch: int, label: str
) -> TableChange:
    """Rows are to be deleted and no file of the table may hold them."""
    if (transaction_version(table_uri, app_id) or 0) >= epoch:
        return _already_applied(table_uri, epoch)
    bad = net.where(F.col(DIFF) < 0).limit(1).collect()
    example = bad[0].asDict() if bad else {}
    raise _negative(label, epoch, example.pop(DIFF, "?"), str(example))


def _negative(label: str, epoch: int, multiplicity: object, example: str) -> InvariantViolation:
    return InvariantViolation(
        f"view {label!r} epoch {epoch}: deleting a row the table does not hold "
        f"(multiplicity would be {multiplicity}): {example}; its state or "
        f"table was changed behind the engine: run `ivm verify --repair {label}`"
    )
