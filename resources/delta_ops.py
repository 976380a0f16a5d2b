"""Delta's own operations on the engine's tables, run by delta-spark: MERGE, OPTIMIZE,
REORG ... APPLY (PURGE) and VACUUM.

Owns every SQL statement the engine sends to delta-spark to change a table or the session's
catalog (``[catalog] database``: :func:`register_table`; reads go through
``spark.read.format("delta")`` where they are needed, :mod:`ops.ingest`). delta-rs commits
everything else (:mod:`resources.lake`), but the deletion vectors the driver marks
(:mod:`resources.vectors`); both take the same per-table lock
(:func:`resources.lake.table_lock`) and the same app transaction, so the two writers never
interleave a check and a commit.

Contract in ``(data, time, diff)`` terms: :func:`merge_change` applies one epoch's net change to
a readable table in one commit carrying ``txn(app_id, epoch)``, once: rows of the source marked
``D`` delete every copy the table holds of them (by deletion vectors when the table has the
feature: no file rewritten), rows marked ``I`` are inserted. An epoch the table already records
is skipped. The compaction operations keep every table's rows and its app transaction.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

from ivm.errors import InvariantViolation
from resources.lake import (
    CommitResult,
    has_vectors,
    local_path,
    open_table,
    table_lock,
    transaction_version,
)

if TYPE_CHECKING:  # no Spark import for the commands that run without it (`ivm vacuum`)
    from pyspark.sql import DataFrame, SparkSession

OP = "_ivm_op"
"""The source column of :func:`merge_change`: ``D`` deletes the row's copies, ``I`` inserts."""

_TXN = ("spark.databricks.delta.write.txnAppId", "spark.databricks.delta.write.txnVersion")
_USER_METADATA = "spark.databricks.delta.commitInfo.userMetadata"
_MATERIALIZE = "spark.databricks.delta.merge.materializeSource"


def quoted(name: str) -> str:
    """A column name as Spark SQL quotes it."""
    return "`" + name.replace("`", "``") + "`"


def path_table(uri: str) -> str:
    """The SQL name of a table by its path: ``delta.`/path```."""
    return f"delta.{quoted(local_path(uri))}"


@dataclass(frozen=True)
class MergeMetrics:
    """What Delta reports of a MERGE (its commit's ``operationMetrics``)."""

    deleted: int
    inserted: int
    copied: int


_STATEMENTS = threading.Lock()
"""Held by every statement of this module: the settings they carry (the app transaction) are
the session's, shared by the refresh's threads, so one statement at a time sets them."""


@contextmanager
def _session_settings(spark: SparkSession, settings: Mapping[str, str]) -> Iterator[None]:
    """``settings`` on the session for the statements inside, unset after, whatever happens
    (Delta reads the app transaction from them: left set, the next write would carry it);
    one such block at a time in the process (:data:`_STATEMENTS`)."""
    with _STATEMENTS:
        for key, value in settings.items():
            spark.conf.set(key, value)
        try:
            yield
        finally:
            for key in settings:
                spark.conf.unset(key)


def merge_change(
    spark: SparkSession,
    uri: str,
    source: DataFrame,
    columns: Sequence[str],
    *,
    app_id: str,
    epoch: int,
    metadata: Mapping[str, str],
    target_filter: str | None = None,
    local: bool = False,
) -> tuple[CommitResult, MergeMetrics | None]:
    """Apply ``source`` (``columns`` and :data:`OP`) to the table in one MERGE carrying
    ``txn(app_id, epoch)``: a ``D`` row deletes every copy of itself (NULL equal to NULL,
    every column), an ``I`` row is inserted. ``target_filter``: a condition on the table's
    columns (as ``t.<column>``) that every deleted row meets, so Delta skips the files outside
    it. ``local``: the source is rows the driver holds (nothing for Delta to pin down before
    it reads it twice); otherwise Delta decides whether to materialize it. Skipped
    (``committed`` False, no metrics) when the table already records ``epoch``. Called under
    the table's lock (:func:`resources.lake.table_lock`)."""
    started = time.perf_counter()
    result = CommitResult(uri, epoch, committed=False, version=None)
    if (transaction_version(uri, app_id) or 0) >= epoch:
        return result, None
    view = f"_ivm_merge_{uuid.uuid4().hex}"
    matches = " AND ".join(f"t.{quoted(c)} <=> s.{quoted(c)}" for c in columns)
    on = " AND ".join(filter(None, [f"s.{OP} = 'D'", matches, target_filter]))
    names = ", ".join(quoted(c) for c in columns)
    values = ", ".join(f"s.{quoted(c)}" for c in columns)
    statement = (
        f"MERGE INTO {path_table(uri)} AS t USING {view} AS s ON {on} "
        f"WHEN MATCHED THEN DELETE "
        f"WHEN NOT MATCHED AND s.{OP} = 'I' THEN INSERT ({names}) VALUES ({values})"
    )
    settings = {
        _TXN[0]: app_id,
        _TXN[1]: str(epoch),
        _USER_METADATA: json.dumps({"ivm.epoch": str(epoch), **metadata}),
        # Delta refuses a source plan that something caches while the MERGE runs (a
        # persisted change) unless it materializes the source itself
        _MATERIALIZE: "none" if local else "auto",
    }
    source.createOrReplaceTempView(view)
    try:
        with _session_settings(spark, settings):
            spark.sql(statement).collect()
    finally:
        spark.catalog.dropTempView(view)
    dt = open_table(uri)
    if dt is None or (dt.transaction_version(app_id) or 0) < epoch:
        raise InvariantViolation(f"{uri}: the MERGE of epoch {epoch} left no app transaction")
    last = dt.history(1)[0]
    found = last.get("operationMetrics") or {}
    metrics = MergeMetrics(
        int(found.get("numTargetRowsDeleted", 0)),
        int(found.get("numTargetRowsInserted", 0)),
        int(found.get("numTargetRowsCopied", 0)),
    )
    result.committed = last.get("operation") == "MERGE"
    result.version = dt.version()
    result.files_added = int(found.get("numTargetFilesAdded", 0))
    result.files_removed = int(found.get("numTargetFilesRemoved", 0))
    result.rows = metrics.inserted
    result.bytes = int(found.get("numTargetBytesAdded", 0))
    result.seconds = time.perf_counter() - started
    return result, metrics


_REGISTERED: dict[str, set[str]] = {}
"""Per database, the tables this process knows are in the session's catalog."""


def catalog_name(database: str, name: str) -> str:
    """``database.name`` as Spark SQL quotes it (``database`` may be ``catalog.schema``)."""
    return ".".join(quoted(part) for part in [*database.split("."), name])


def register_table(spark: SparkSession, database: str, name: str, uri: str) -> bool:
    """Register the Delta table at ``uri`` as ``database.name`` in the session's catalog
    (the database created if missing) unless the catalog has a table of that name; True
    when it was registered. The catalog is asked once per process and database."""
    schema = ".".join(quoted(part) for part in database.split("."))
    with _STATEMENTS:
        known = _REGISTERED.get(database)
        if known is None:
            spark.sql(f"CREATE SCHEMA IF NOT EXISTS {schema}").collect()
            tables = spark.sql(f"SHOW TABLES IN {schema}").collect()
            known = _REGISTERED.setdefault(database, {r["tableName"].lower() for r in tables})
        if name.lower() in known:
            return False
        where = local_path(uri).replace("\\", "\\\\").replace("'", "\\'")
        table = catalog_name(database, name)
        spark.sql(f"CREATE TABLE IF NOT EXISTS {table} USING DELTA LOCATION '{where}'").collect()
        known.add(name.lower())
    return True


def compact_vectors(spark: SparkSession, uri: str, *, metadata: Mapping[str, str]) -> bool:
    """Fold a table's small files together (OPTIMIZE) and rewrite the files whose deletion
    vectors delete rows without them (REORG ... APPLY (PURGE)), under its lock; same rows, same
    app transaction (Delta keeps it across commits). False when the table has no deletion
    vectors (delta-rs's OPTIMIZE is the engine's way there)."""
    with table_lock(uri):
        dt = open_table(uri)
        if dt is None or not has_vectors(dt):
            return False
        user = {_USER_METADATA: json.dumps(dict(metadata))}
        with _session_settings(spark, user):
            spark.sql(f"OPTIMIZE {path_table(uri)}").collect()
            spark.sql(f"REORG TABLE {path_table(uri)} APPLY (PURGE)").collect()
    return True


def vacuum(spark: SparkSession, uri: str, retention_hours: float) -> int:
    """Delta's VACUUM of a table with deletion vectors (delta-rs's full vacuum deletes the
    vectors' files as if no version referenced them): files no version within
    ``retention_hours`` references, and files never committed. Returns the files deleted
    (counted on a local table; 0 elsewhere)."""
    before = _files(uri)
    settings = {
        "spark.databricks.delta.retentionDurationCheck.enabled": "false",
        # Delta lists the table's folders in a job of this many tasks (Spark's default,
        # 10,000 tasks, made even a small table's VACUUM slow: BENCHMARKS.md)
        "spark.sql.sources.parallelPartitionDiscovery.parallelism": spark.conf.get(
            "spark.sql.shuffle.partitions", "200"
        ),
    }
    with table_lock(uri), _session_settings(spark, settings):
        spark.sql(f"VACUUM {path_table(uri)} RETAIN {max(0.0, retention_hours)} HOURS").collect()
    return len(before - _files(uri))


def _files(uri: str) -> set[str]:
    root = local_path(uri)
    if "://" in root or not os.path.isdir(root):
        return set()
    return {
        os.path.join(d, f) for d, _, names in os.walk(root) if "_delta_log" not in d for f in names
    }
