"""Compaction: advance each update table's ``since``, consolidate, optimize, vacuum; and the
storage report (stored bytes per row against the raw Parquet bytes of the same columns).

Owns the choice of ``since`` per table, from who still reads it and at which time:

- an arrangement is read by its users' lookups at their old time, the epoch their diff log
  holds: ``since`` = the oldest of those (or the arrangement's epoch when no user is built);
- a view's diff log is read from its readable table's epoch, from each downstream view's
  epoch, and from the epochs of the arrangements built over the view: the oldest of those;
- a reduction's state table is read at its view's epoch.

Contract in ``(data, time, diff)`` terms: for a table holding updates ``U`` and a chosen
``since``, the table is replaced (one commit, same app transaction) by
``{(d, since, sum of r over (d, t, r) in U with t <= since) : non-zero} + {(d, t, r) in U :
t > since}``; so for every ``t >= since`` the contents at ``t`` are unchanged, and every
reader reads at ``t >= since``. Readable tables (views, the epochs table, quarantines) are
rewritten into fewer files by delta-rs's OPTIMIZE (same rows). A table that another writer
committed to meanwhile is left as it was and reported as skipped. Then :meth:`Engine.vacuum`
deletes what no version within the retention references.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import CommitProperties, Transaction

from ivm.plan.reduce import state_tables
from ops import DIFF, TIME
from ops.arrange import parquet_options, sorted_by
from ops.consolidate import accumulate_until, consolidate_until
from ops.ingest import read_files
from ops.sink import stage_updates
from resources.delta_ops import compact_vectors
from resources.filecache import FILES
from resources.lake import (
    commit_history,
    live_rows,
    local_path,
    open_for_write,
    open_table,
    replace_files,
    table_files,
    table_lock,
)

SINCE = "ivm.since"
COMPACTED = "ivm.compacted"


@dataclass
class TableCompaction:
    """What compaction did to one table (rows, bytes and files referenced by its snapshot)."""

    table: str
    kind: str  # arrangement | log | state | table
    since_before: int | None
    since_after: int | None
    rows_before: int
    rows_after: int
    bytes_before: int
    bytes_after: int
    files_before: int
    files_after: int
    seconds: float = 0.0
    skipped: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class CompactReport:
    tables: list[TableCompaction]
    files_vacuumed: int
    seconds: float

    def totals(self) -> dict[str, int]:
        keys = ("rows_before", "rows_after", "bytes_before", "bytes_after")
        keys += ("files_before", "files_after")
        return {k: sum(getattr(t, k) for t in self.tables) for k in keys}


@dataclass
class _Target:
    uri: str
    kind: str
    since: int | None  # None: OPTIMIZE only
    key: tuple[str, ...] = ()


def _size(uri: str) -> tuple[int, int, int]:
    """(rows, bytes, files) of a table's current snapshot, from the log (no Spark)."""
    dt = open_table(uri)
    if dt is None:
        return 0, 0, 0
    actions = pa.table(dt.get_add_actions(flatten=True))
    return live_rows(dt), int(sum(actions.column("size_bytes").to_pylist())), actions.num_rows


def _carried_metadata(uri: str) -> dict[str, str]:
    """The ``ivm.*`` commit metadata a compaction commit must carry on (definition, since,
    log start...), from the newest commit that has some."""
    dt = open_table(uri)
    for info in commit_history(dt, 50) if dt is not None else []:
        found = {k: str(v) for k, v in info.items() if k.startswith("ivm.") and k != "ivm.epoch"}
        if found:
            return found
    return {}


def targets(engine: Any) -> list[_Target]:
    """Every table the engine writes, with the ``since`` its readers allow (module doc)."""
    plan, layout = engine.plan, engine.layout
    log_epoch = {v: engine.table_epoch(layout.view_log(v)) for v in plan.order}
    out: list[_Target] = []
    arrangement_epochs: dict[str, list[int]] = {}
    for key, aplan in plan.arrangements.items():
        uri = engine.arrangement_uri(key)
        done = engine.table_epoch(uri)
        if done == 0:
            continue
        arrangement_epochs.setdefault(key.collection, []).append(done)
        readers = [log_epoch[u] for u in aplan.users if log_epoch.get(u, 0) > 0]
        out.append(_Target(uri, "arrangement", min([*readers, done]), key.key))
    for name in plan.order:
        if log_epoch[name] == 0:
            continue
        table = layout.view_table(name)
        readers = [engine.table_epoch(table)]
        readers += [log_epoch[d] for d in plan.order if name in plan.views[d].view_inputs]
        readers += arrangement_epochs.get(name, [])
        built = [r for r in readers if r > 0] or [0]
        out.append(_Target(layout.view_log(name), "log", min([*built, log_epoch[name]])))
        out.append(_Target(table, "table", None))
        for st in state_tables(plan.views[name].root):
            uri = engine.state_uri(name, st.name)
            if open_table(uri) is not None:
                out.append(_Target(uri, "state", log_epoch[name], tuple(st.key)))
    out.append(_Target(layout.epochs, "table", None))
    for source in engine.sources:
        uri = engine.quarantine_uri(source)
        if open_table(uri) is not None:
            out.append(_Target(uri, "table", None))
    return [t for t in out if open_table(t.uri) is not None]


def compact(engine: Any, *, retention_hours: float = 168.0) -> CompactReport:
    """Compact every table of the project (module doc), then vacuum.

    Args:
        engine: an :class:`engine.facade.Engine`.
        retention_hours: vacuum keeps the files versions younger than this reference (readers
            of older versions need them); the bytes the compaction frees leave the disk then.
    """
    started = time.perf_counter()
    results = []
    for target in targets(engine):
        t0 = time.perf_counter()
        rows, size, files = _size(target.uri)
        before = _carried_metadata(target.uri).get(SINCE)
        result = TableCompaction(
            engine.app_id(target.uri),
            target.kind,
            None if before is None else int(before),
            None if before is None else int(before),
            rows,
            rows,
            size,
            size,
            files,
            files,
        )
        with engine.job_group(f"compact {result.table}", f"ivm: compact {result.table}"):
            if target.since is None:
                _optimize(engine, target.uri, result)
            else:
                _advance(engine, target, result)
        result.seconds = time.perf_counter() - t0
        engine.progress(
            f"compact {result.table}: {result.skipped or 'done'}: rows {result.rows_before} -> "
            f"{result.rows_after}, bytes {result.bytes_before} -> {result.bytes_after}, files "
            f"{result.files_before} -> {result.files_after} ({result.seconds:.2f}s)"
        )
        results.append(result)
    vacuumed = engine.vacuum(retention_hours)
    return CompactReport(results, sum(vacuumed.values()), time.perf_counter() - started)


def _advance(engine: Any, target: _Target, result: TableCompaction) -> None:
    """Consolidate a table's updates up to ``target.since`` and rewrite it in one commit."""
    before = result.since_before or 0
    since = max(before, target.since or 0)
    if since == before and result.files_before <= 1:
        result.skipped = "nothing to do"
        return
    dt = open_table(target.uri)
    version = dt.version()
    schema = engine.table_schema(target.uri)
    columns = [n for n in schema.names if n not in (TIME, DIFF)]
    updates = read_files(engine.spark, table_files(target.uri, version), schema)
    if DIFF in schema.names:  # a multiset's updates
        compacted = consolidate_until(updates, columns, since)
    else:  # per-key sums (accumulable state, set-operation and NOT IN counts)
        compacted = accumulate_until(updates, target.key, since)
    key = target.key or (TIME,)
    epoch = engine.table_epoch(target.uri)
    staged = stage_updates(
        sorted_by(compacted, key, result.rows_before),
        target.uri,
        epoch,
        "compact",
        parquet_options() if target.key else None,
    )
    metadata = {**_carried_metadata(target.uri), SINCE: str(since), COMPACTED: "true"}
    commit = replace_files(
        target.uri,
        app_id=engine.app_id(target.uri),
        expected_version=version,
        schema=pa.schema(schema),
        adds=staged.adds,
        metadata=metadata,
    )
    if commit is None:
        result.skipped = "skipped: another writer committed meanwhile"
        return
    result.since_after = since
    result.rows_after, result.bytes_after, result.files_after = _size(target.uri)


def _optimize(engine: Any, uri: str, result: TableCompaction) -> None:
    """Rewrite a readable table's small files into fewer, same rows: delta-rs's OPTIMIZE, or,
    once the table has deletion vectors, Delta's OPTIMIZE and REORG ... APPLY (PURGE), which
    also rewrites the files the vectors delete rows from without those rows."""
    if result.files_before <= 1 and not any(f.deleted for f in table_files(uri)):
        result.skipped = "nothing to do"
        return
    metadata = {**_carried_metadata(uri), COMPACTED: "true"}
    if compact_vectors(engine.spark, uri, metadata=metadata):
        result.rows_after, result.bytes_after, result.files_after = _size(uri)
        FILES.keep_only(local_path(uri), [local_path(f.uri) for f in table_files(uri)])
        return
    app_id = engine.app_id(uri)
    with table_lock(uri):
        dt = open_for_write(uri)
        epoch = dt.transaction_version(app_id) or 0
        dt.optimize.compact(
            commit_properties=CommitProperties(
                custom_metadata=metadata,
                app_transactions=[Transaction(app_id, epoch)],
            )
        )
    result.rows_after, result.bytes_after, result.files_after = _size(uri)
    FILES.keep_only(local_path(uri), [local_path(f.uri) for f in table_files(uri)])


def _parquet_bytes(paths: list[str], columns: set[str]) -> int:
    """Compressed bytes of ``columns`` in Parquet files, from their footers."""
    total = 0
    for path in paths:
        md = pq.ParquetFile(path).metadata
        for g in range(md.num_row_groups):
            group = md.row_group(g)
            for c in range(group.num_columns):
                chunk = group.column(c)
                if chunk.path_in_schema.lower() in columns:
                    total += chunk.total_compressed_size
    return total


def storage_report(engine: Any) -> list[dict[str, Any]]:
    """Stored bytes per row against the raw Parquet bytes of the same columns (seed 003's
    "overhead per record"), no Spark:

    - an arrangement: its bytes per row of the collection, against the collection's own
      Parquet bytes of those columns per row (a source's current files, a view's table);
    - a view: its table, diff log and state tables per row, against its table's bytes.
    """
    out = []
    for key, aplan in engine.plan.arrangements.items():
        uri = engine.arrangement_uri(key)
        _, stored, _ = _size(uri)
        if key.collection in engine.sources:
            source = engine.sources[key.collection]
            files = source.files(source.version())
            paths = [local_path(f.uri) for f in files]
            rows = sum(f.num_records or 0 for f in files)
        else:
            table = engine.layout.view_table(key.collection)
            paths = [local_path(f.uri) for f in table_files(table)]
            rows, _, _ = _size(table)
        raw = _parquet_bytes(paths, set(aplan.columns))
        out.append(_ratio(f"arrangement {key}", rows, stored, raw))
    for name in engine.plan.order:
        table_rows, table_bytes, _ = _size(engine.layout.view_table(name))
        _, log_bytes, _ = _size(engine.layout.view_log(name))
        state = sum(
            _size(engine.state_uri(name, st.name))[1]
            for st in state_tables(engine.plan.views[name].root)
        )
        out.append(_ratio(f"view {name}", table_rows, table_bytes + log_bytes + state, table_bytes))
    return out


def _ratio(what: str, rows: int, stored: int, raw: int) -> dict[str, Any]:
    return {
        "what": what,
        "rows": rows,
        "stored_bytes": stored,
        "raw_bytes": raw,
        "stored_per_row": round(stored / rows, 1) if rows else None,
        "raw_per_row": round(raw / rows, 1) if rows else None,
        "ratio": round(stored / raw, 2) if raw else None,
    }
