"""The log sink: write an epoch's updates as new files of a Delta update log, committed once.

Owns the staging of Parquet files (by Spark's executors, or by the driver for an epoch's
small change), their one commit per epoch, and the column types the driver writes as Spark
writes them. Used for views' diff logs, arrangements, state tables and compaction; the table
sink (:mod:`ops.sink`) stages its rows here too.

Follows the persist sink of seed 004: the batch description ``(lower, upper]`` of epochs is
fixed before anything is written; Spark's executors write the files in parallel (nothing is
collected to the driver but file names and footers), except an epoch's small change, which
the driver collects (at most :attr:`~ivm.policy.Policy.driver_change_rows` rows, while
:attr:`~ivm.policy.Policy.driver` is on) and writes as one file, the same Parquet Spark
writes; one committer commits them in a single Delta transaction carrying
``txn(app_id, epoch)``, checked first, so a rerun is a no-op.

Contract in ``(data, time, diff)`` terms: after :func:`append_updates` the log holds its
previous updates plus ``updates`` (consolidated per ``(data, time)``, except a computation
from scratch: positive diffs, equal rows not always summed), exactly once per epoch; with
``overwrite``, those updates alone. Who writes the files (Spark or the driver) changes no
row, type or statistic of the log.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import to_arrow_schema

import ivm.policy
from resources.faults import crash_point
from resources.lake import (
    CommitResult,
    StagedFiles,
    collect_staged,
    commit_files,
    stage_arrow,
    staging_uri,
)


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
    caller expects at most :attr:`~ivm.policy.Policy.driver_change_rows` rows (an epoch's
    change), so they are collected as Arrow, at most one row more than that, and written by
    the driver (while :attr:`~ivm.policy.Policy.driver` is on). Should more rows come, Spark
    writes them, computing them again.
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


def _collect_small(updates: DataFrame) -> pa.Table | None:
    """At most ``driver_change_rows`` rows of ``updates``, collected in their order as one
    partition; None if there are more, the policy leaves writes to Spark, or a column's type
    is not :data:`FLAT_TYPES`."""
    policy = ivm.policy.current()
    if not policy.driver or not all(isinstance(f.dataType, FLAT_TYPES) for f in updates.schema):
        return None
    most = policy.driver_change_rows
    rows = updates.coalesce(1).limit(most + 1).toArrow()
    return None if rows.num_rows > most else rows


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
    if isinstance(updates, pa.Table):  # computed by the driver (ops.stateless.driver)
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
