"""Reading and tending the lake without Spark: each view's status and rows, its cheap
consistency check, the whole project's status, the tables the engine writes, and vacuum
(deleting files no recent version needs).

Contract in ``(data, time, diff)`` terms: none of these change any table's contents; vacuum
removes only files that no table version within the retention references. A view is
consistent (:meth:`Maintenance.consistency`) when its readable table is at its log's epoch
``e``, holds as many rows as the log's diffs with ``time <= e`` sum to, no row's summed diff is
negative, and both tables have the plan's columns: what a refresh must leave, checked without
evaluating the view's SQL (``verify`` does that, with Spark).
"""

from __future__ import annotations

import time
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from engine.catalog import Catalog
from engine.results import ConsistencyResult, ViewStatus
from ivm import policy
from ivm.errors import IvmError, SourceError
from ivm.plan.reduce import state_tables
from resources.delta_ops import vacuum as delta_vacuum
from resources.lake import (
    FileStats,
    SourceTable,
    has_vectors,
    last_commit_metadata,
    live_rows,
    local_path,
    open_for_write,
    open_table,
    snapshot_rows,
    table_file_stats,
    table_files,
)

TIME, DIFF = "_time", "_diff"
"""A diff log's time and diff columns (``ops.TIME``, ``ops.DIFF``; ``ops`` imports Spark)."""


class Maintenance:
    """Status, reading views, vacuum (see the module)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def view_status(self, name: str) -> ViewStatus:
        cat = self.catalog
        table = cat.layout.view_table(name)
        dt = open_table(table)
        rows = None if dt is None else live_rows(dt)
        log_epoch = cat.table_epoch(cat.layout.view_log(name))
        return ViewStatus(name, log_epoch, cat.table_epoch(table), rows)

    def consistency(self, name: str, *, max_bytes: int | None = None) -> ConsistencyResult:
        """The view's cheap consistency (see the module): row counts from the Delta logs'
        statistics, the diff log's ``_time`` and ``_diff`` read and summed, and its rows summed
        per distinct row to count negative multiplicities while they fit in ``max_bytes``
        (default: the policy's ``keep_feed_bytes``; beyond it they are not counted, and the
        result notes so). No Spark, no SQL evaluated.

        Raises:
            IvmError: the view has not been materialized yet.
        """
        cat = self.catalog
        started = time.perf_counter()
        plan = cat.view(name)
        table_uri, log_uri = cat.layout.view_table(name), cat.layout.view_log(name)
        epoch, table_epoch = cat.table_epoch(log_uri), cat.table_epoch(table_uri)
        if epoch == 0 or table_epoch == 0:
            raise IvmError(f"view {name!r} has not been materialized yet: nothing to check")
        result = ConsistencyResult(name, epoch, table_epoch, columns=tuple(plan.columns))
        result.table_columns = tuple(cat.table_schema(table_uri).names)
        log_schema = cat.table_schema(log_uri)
        result.log_columns = tuple(n for n in log_schema.names if n not in (TIME, DIFF))
        result.table_rows = sum(
            f.live_records
            if f.live_records is not None
            else pq.ParquetFile(local_path(f.uri)).metadata.num_rows - f.deleted
            for f in table_files(table_uri)
        )
        files = [
            fs
            for fs in table_file_stats(log_uri, [TIME])
            if fs.mins.get(TIME) is None or fs.mins[TIME] <= table_epoch
        ]
        result.log_rows = sum(
            int(pc.sum(_log_rows(fs, [], table_epoch).column(DIFF)).as_py() or 0) for fs in files
        )
        limit = policy.current().keep_feed_bytes if max_bytes is None else max_bytes
        result.negative = _negative_rows(files, result.log_columns, log_schema, table_epoch, limit)
        if result.negative is None:
            result.notes.append(
                f"negative multiplicities not counted: the log holds more than {limit} bytes "
                "or a nested column (ivm verify counts them)"
            )
        result.seconds = time.perf_counter() - started
        return result

    def read_view(self, name: str) -> pa.Table:
        """The view's current rows, read with delta-rs (no Spark)."""
        cat = self.catalog
        cat.view(name)
        dt = open_table(cat.layout.view_table(name))
        if dt is None:
            raise IvmError(
                f"view {name!r} has not been materialized yet: run `ivm --project "
                f"{cat.project.root} refresh`"
            )
        return snapshot_rows(dt)

    def lake_tables(self) -> list[str]:
        """Every Delta table the engine writes: views, logs, arrangements, state, epochs,
        quarantines."""
        cat = self.catalog
        out = [cat.layout.epochs]
        for name in cat.plan.order:
            out += [cat.layout.view_log(name), cat.layout.view_table(name)]
            out += [cat.state_uri(name, t.name) for t in state_tables(cat.plan.views[name].root)]
        out += [cat.arrangement_uri(k) for k in cat.plan.arrangements]
        out += [cat.quarantine_uri(s) for s in cat.project.contracts]
        return [u for u in out if open_table(u) is not None]

    def vacuum(self, retention_hours: float = 168.0, spark: Any = None) -> dict[str, int]:
        """Delete files no table version within ``retention_hours`` references: files of
        commits that never happened (a crash between writing and committing) and files
        replaced by rebuilds. Readers of older versions need those versions' files, hence
        the retention (default 7 days). A table with deletion vectors is vacuumed by Delta
        (``spark``, :func:`resources.delta_ops.vacuum`); without a Spark session, only of the
        files its versions removed (delta-rs's full vacuum would delete the vectors' files).
        Returns files deleted per table."""
        out = {}
        for uri in self.lake_tables():
            dt = open_for_write(uri)
            vectors = has_vectors(dt)
            if vectors and spark is not None:
                deleted = delta_vacuum(spark, uri, retention_hours)
            else:
                deleted = len(
                    dt.vacuum(
                        retention_hours=int(retention_hours),
                        enforce_retention_duration=False,
                        dry_run=False,
                        full=not vectors,  # also files no version ever referenced
                    )
                )
            if deleted:
                out[self.catalog.app_id(uri)] = deleted
                self.catalog.progress(f"vacuum {self.catalog.app_id(uri)}: {deleted} files deleted")
        return out

    def status(self) -> dict[str, Any]:
        """Consumed source versions, latest epoch, and each view's epoch (no Spark)."""
        cat = self.catalog
        epochs = cat.epochs()
        last = epochs[-1] if epochs else None
        sources = {}
        for name, uri in cat.project.sources.items():
            consumed = last.ranges.get(name, (None, None))[1] if last else None
            try:
                current: int | None = SourceTable(name, uri).version()
            except SourceError:
                current = None
            sources[name] = {"path": uri, "consumed_version": consumed, "current_version": current}
        views = {}
        for name in cat.plan.order:
            st = self.view_status(name)
            views[name] = {"epoch": st.table_epoch, "log_epoch": st.log_epoch, "rows": st.rows}
            owner = cat.plan.views[name].owner
            if owner is not None:
                views[name]["internal_of"] = owner
        for name, error in sorted(cat.plan.broken.items()):
            views[name] = {"epoch": None, "log_epoch": None, "rows": None, "error": str(error)}
        return {
            "lake": cat.layout.root,
            "epoch": last.epoch if last else 0,
            "minted_at": last.minted_at.isoformat() if last else None,
            "sources": sources,
            "views": views,
        }

    def arrangement_status(self) -> list[dict[str, Any]]:
        """Every arrangement: key, columns, users and its table's size (no Spark).

        The analogue of Materialize's ``mz_arrangement_sizes`` and ``mz_arrangement_sharing``.
        """
        out = []
        for key, aplan in self.catalog.plan.arrangements.items():
            uri = self.catalog.arrangement_uri(key)
            dt = open_table(uri)
            rows = size = files = 0
            if dt is not None:
                actions = pa.table(dt.get_add_actions(flatten=True))
                files = actions.num_rows
                rows = int(sum(r or 0 for r in actions.column("num_records").to_pylist()))
                size = int(sum(actions.column("size_bytes").to_pylist()))
            info = last_commit_metadata(uri, "ivm.since")
            out.append(
                {
                    "arrangement": str(key),
                    "collection": f"{key.kind} {key.collection}",
                    "key": list(key.key),
                    "columns": list(aplan.columns),
                    "users": list(aplan.users),
                    "epoch": self.catalog.table_epoch(uri),
                    "since": int(info["ivm.since"]) if info else None,
                    "rows": rows,
                    "bytes": size,
                    "files": files,
                    "path": uri,
                }
            )
        return out


def _log_rows(fs: FileStats, columns: list[str], until: int) -> pa.Table:
    """A diff-log file's ``(columns..., _diff)`` with ``_time <= until``."""
    rows = pq.read_table(local_path(fs.file.uri), columns=[*columns, TIME, DIFF])
    return rows.filter(pc.less_equal(rows.column(TIME), until)).select([*columns, DIFF])


def _negative_rows(
    files: list[FileStats], columns: tuple[str, ...], schema: pa.Schema, until: int, limit: int
) -> int | None:
    """How many distinct rows of a diff log sum to a negative diff up to ``until``; None when
    the rows hold more than ``limit`` bytes or a column Arrow cannot group by (nested)."""
    if any(pa.types.is_nested(schema.field(c).type) for c in columns):
        return None
    parts, held = [], 0
    for fs in files:
        parts.append(_log_rows(fs, list(columns), until))
        held += parts[-1].nbytes
        if held > limit:
            return None
    if not parts:
        return 0
    rows = pa.concat_tables(parts, promote_options="permissive")
    sums = rows.group_by(list(columns), use_threads=False).aggregate([(DIFF, "sum")])
    return int(pc.sum(pc.less(sums.column(f"{DIFF}_sum"), 0)).as_py() or 0)
