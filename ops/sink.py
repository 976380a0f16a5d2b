"""The sink: write an epoch's updates to a diff log, and apply them to a readable table.

Follows the persist sink of seed 004: the batch description ``(lower, upper]`` of epochs is
fixed before anything is written; Spark executors write the files in parallel (nothing is
collected to the driver but file names and footers); one committer commits them in a single
Delta transaction carrying ``txn(app_id, epoch)``, checked first, so a rerun is a no-op.

Contracts in ``(data, time, diff)`` terms:

- :func:`append_updates`: the log afterwards holds its previous updates plus ``updates``
  (consolidated per ``(data, time)``), exactly once per epoch.
- :func:`apply_to_table`: the readable table holds the multiset ``data -> sum of diffs``:
  a row of multiplicity ``n`` appears ``n`` times. A change inserts rows by appending files and
  deletes rows by rewriting only the files that may hold them (min/max statistics prune the
  rest), in the same transaction. A multiplicity that would go negative is a bug: it raises
  :class:`~ivm.errors.InvariantViolation` and nothing is committed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import pyarrow as pa
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema

from ivm.errors import InvariantViolation
from ops import DIFF
from ops.ingest import read_files
from resources.faults import crash_point
from resources.lake import (
    CommitResult,
    StagedFiles,
    collect_staged,
    commit_files,
    remove_action,
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
) -> StagedFiles:
    """Have Spark's executors write ``updates`` as Parquet files into a fresh staging folder
    under the table (nothing passes through the driver), then list them with their stats.
    Nothing is committed: files of a commit that never happens are left for vacuum."""
    staged_uri = staging_uri(table_uri, epoch, label)
    writer = updates.write.mode("errorifexists")
    for option, value in (parquet_options or {}).items():
        writer = writer.option(option, value)
    writer.parquet(staged_uri)
    crash_point("staged")
    return collect_staged(table_uri, staged_uri)


def append_updates(
    updates: DataFrame,
    log_uri: str,
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    overwrite: bool = False,
    description: str = "ivm diff log: the view's updates (columns..., _time, _diff)",
    parquet_options: Mapping[str, object] | None = None,
) -> CommitResult:
    """Write consolidated updates as new files of an update log and commit them once.

    Used for views' diff logs and for arrangements (which pass their sort order and Parquet
    page settings). ``overwrite`` replaces the log's whole history (and schema) by these
    updates, in one commit: used when a definition changed its columns.

    The caller has checked that the log does not hold ``epoch`` yet (so it did not compute
    the updates in vain); :func:`~resources.lake.commit_files` checks again under the lock.
    """
    staged = stage_updates(updates, log_uri, epoch, "updates", parquet_options)
    result = commit_files(
        log_uri,
        app_id=app_id,
        epoch=epoch,
        schema=arrow_schema(updates),
        adds=staged.adds,
        metadata=metadata,
        description=description,
        overwrite=overwrite,
    )
    result.rows, result.bytes = staged.rows, staged.bytes
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


def _candidate_files(
    spark: SparkSession, table_uri: str, deletes: DataFrame, columns: Sequence[str]
) -> list:
    """Files of the table that may hold some deleted row, by min/max statistics."""
    prune = list(columns[:PRUNE_COLUMNS])
    files = table_file_stats(table_uri, prune)
    if not files:
        return []
    with_stats = [c for c in prune if any(c in f.mins for f in files)]
    if not with_stats:
        return [f.file for f in files]
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
) -> TableChange:
    """Apply a net change ``(columns..., _diff)`` (consolidated, no zeros) to a readable table.

    Args:
        net: the change, one row per distinct data with its net diff.
        table_uri: the readable table (created if missing).
        label: the view's name, for messages.
        overwrite: ``net`` is the whole new contents; replace every file in one commit.

    Raises:
        InvariantViolation: a row would be deleted more times than the table holds it.
    """
    columns = [c for c in net.columns if c != DIFF]
    schema = arrow_schema(net, columns)
    cols = [F.col(f"`{c}`") for c in columns]
    net = net.persist()
    merged: DataFrame | None = None
    try:
        sizes = net.agg(
            F.sum(F.when(F.col(DIFF) > 0, F.col(DIFF)).otherwise(0)).alias("inserted"),
            F.sum(F.when(F.col(DIFF) < 0, -F.col(DIFF)).otherwise(0)).alias("deleted"),
        ).collect()[0]
        inserted, deleted = int(sizes["inserted"] or 0), int(sizes["deleted"] or 0)
        # Only deletions need to find and rewrite existing files; insertions just append.
        candidates = (
            _candidate_files(spark, table_uri, net.where(F.col(DIFF) < 0), columns)
            if deleted and not overwrite
            else []
        )
        if candidates:
            existing = read_files(spark, candidates, schema)
            counts = existing.groupBy(*cols).agg(F.count(F.lit(1)).alias(DIFF))
            merged = counts.unionByName(net).groupBy(*cols).agg(F.sum(DIFF).alias(DIFF))
            merged = merged.persist()
            agg = merged.agg(
                F.min(DIFF).alias("lowest"),
                F.sum(F.when(F.col(DIFF) > 0, F.col(DIFF)).otherwise(0)).alias("rows"),
            ).collect()[0]
            lowest, total_rows = agg["lowest"], int(agg["rows"] or 0)
            source = merged
        else:
            lowest, total_rows, source = (-1 if deleted else None), inserted, net
        if (
            lowest is not None
            and lowest < 0
            and (transaction_version(table_uri, app_id) or 0) >= epoch
        ):
            # A concurrent refresh committed this epoch to the table while we computed: the
            # files we merged with already hold it. Nothing to do (exactly once).
            return TableChange(
                CommitResult(table_uri, epoch, committed=False, version=None), 0, 0, 0, 0
            )
        if lowest is not None and lowest < 0:
            bad = source.where(F.col(DIFF) < 0).limit(1).collect()
            example = bad[0].asDict() if bad else {}
            raise InvariantViolation(
                f"view {label!r} epoch {epoch}: deleting a row the table does not hold "
                f"(multiplicity would be {example.pop(DIFF, '?')}): {example}; its state or "
                f"table was changed behind the engine: run `ivm verify --repair {label}`"
            )
        rows_out = (
            source.where(F.col(DIFF) > 0)
            .select(*cols, F.explode(F.array_repeat(F.lit(1), F.col(DIFF).cast("int"))).alias("_n"))
            .select(*cols)
        )
        n_files = max(1, math.ceil(total_rows / ROWS_PER_FILE))
        if columns and (candidates or n_files > 1):
            rows_out = rows_out.repartitionByRange(n_files, cols[0]).sortWithinPartitions(*cols)
        elif columns:
            rows_out = rows_out.coalesce(1).sortWithinPartitions(*cols)
        staged = stage_updates(rows_out, table_uri, epoch, "rows")
        existing_rows = sum(f.num_records or 0 for f in candidates)
        if staged.rows != total_rows:
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
        net.unpersist()
        if merged is not None:
            merged.unpersist()
