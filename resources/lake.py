"""The Delta lake facade: table layout, reading source snapshots and change feeds, committing.

Owns the calls to delta-rs (the ``deltalake`` package), but for the deletion vectors the
driver commits (:mod:`resources.vectors`). The engine's Spark jobs never touch the Delta log:
they read the Parquet files that :class:`SourceTable` lists and write Parquet files that
:func:`commit_files` then commits. Tables stay standard Delta, readable by delta-spark,
DuckDB, Polars and Trino.

Layout under the lake root (documented in the README):

- ``_ivm/epochs``: the epoch record, one row per (epoch, source) with its version range.
- ``_ivm/expression_types.json``: Spark's types of the driver's expressions
  (``ops.stateless.driver``).
- ``views/<view>``: the readable table, exactly the view's current rows (a multiset).
- ``logs/<view>``: the view's diff log, its updates ``(columns..., _time, _diff)``.

Contract in ``(data, time, diff)`` terms:

- :meth:`SourceTable.changes` gives a source's Change Data Feed for versions ``(lower, upper]``
  with ``insert``/``update_postimage`` as ``+1`` and ``delete``/``update_preimage`` as ``-1``.
- :func:`commit_files` is *idempotent per epoch*: every commit carries the app transaction
  ``(app_id, epoch)`` and is skipped when the table already records ``epoch`` (delta-rs records
  app transactions but does not reject repeats, so the check is ours, made under a lock).
  Files written but never committed are invisible to readers and removed by vacuum.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import threading
import time
import uuid
import zlib
from collections import OrderedDict
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal
from typing import Any
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder, Schema, write_deltalake
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import (
    AddAction,
    CommitProperties,
    RemoveAction,
    Transaction,
    create_table_with_add_actions,
)

from ivm.errors import (
    ChangeFeedError,
    CommitConflictError,
    InvariantViolation,
    LakeError,
    SourceNotFoundError,
)
from resources.spark import PARQUET_CODEC, ZSTD_LEVEL

STATS_STRING_PREFIX = 32
"""String min/max stats keep at most this many characters (as Delta writers do)."""

# -- layout ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class LakeLayout:
    """Where the system keeps its tables under the lake root."""

    root: str

    @property
    def epochs(self) -> str:
        return f"{self.root}/_ivm/epochs"

    def view_table(self, view: str) -> str:
        return f"{self.root}/views/{view}"

    def view_log(self, view: str) -> str:
        return f"{self.root}/logs/{view}"

    @staticmethod
    def app_id(table_uri: str, root: str) -> str:
        """The app id a table's commits carry: its path relative to the lake root."""
        return os.path.relpath(table_uri, root) if "://" not in root else table_uri[len(root) :]


_COMMIT_FILE = re.compile(r"^(\d{20})\.json$")

SNAPSHOTS_KEPT = 256
"""How many opened table snapshots a process keeps (least recently used out first)."""


class _Snapshots:
    """Opened Delta tables by ``(uri, version)``: a version is immutable, so one handle serves
    every reader of it. A refresh opens the same few tables hundreds of times (their epoch,
    schema, files, commit metadata) while they do not change; replaying their logs each time
    cost more than the Spark work of a small change.

    The newest version of a local table comes from its log's file names (a directory
    listing), and a cached version is checked against its commit file's bytes; tables that
    are not local are opened afresh each time. Handles given out are
    read-only by convention: writers (commits, vacuum, OPTIMIZE) open their own
    (:func:`open_for_write`).
    """

    def __init__(self, kept: int) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        self._tables: OrderedDict[tuple, DeltaTable] = OrderedDict()
        self._memo: dict[int, dict[str, Any]] = {}  # id(cached handle) -> what was read

    @staticmethod
    def newest(uri: str) -> int | None:
        """The newest committed version of a local table (None: no table there)."""
        try:
            names = os.listdir(os.path.join(local_path(uri), "_delta_log"))
        except (FileNotFoundError, NotADirectoryError):
            return None
        versions = [int(m.group(1)) for n in names if (m := _COMMIT_FILE.match(n))]
        return max(versions) if versions else None

    @staticmethod
    def commit_file(uri: str, version: int) -> tuple[int, int] | None:
        """The identity of a version's commit file (size, CRC-32 of its bytes), or None if it
        is gone (a log cleaned up behind a checkpoint). A table dropped and created again at
        the same path reuses version numbers, not commit contents (they hold timestamps and
        file names)."""
        path = os.path.join(local_path(uri), "_delta_log", f"{version:020d}.json")
        try:
            with open(path, "rb") as fh:
                data = fh.read()
        except FileNotFoundError:
            return None
        return len(data), zlib.crc32(data)

    def open(self, uri: str, version: int) -> DeltaTable:
        ident = self.commit_file(uri, version)
        if ident is None:
            return DeltaTable(uri, version=version)
        key = (uri.rstrip("/"), version, *ident)
        with self._lock:
            dt = self._tables.get(key)
            if dt is not None:
                self._tables.move_to_end(key)
                return dt
        dt = DeltaTable(uri, version=version)  # outside the lock: opens run in parallel
        with self._lock:
            self._tables[key] = dt
            self._memo[id(dt)] = {}
            while len(self._tables) > self._kept:
                _, old = self._tables.popitem(last=False)
                self._memo.pop(id(old), None)
        return dt

    def memo(self, dt: DeltaTable, what: str, compute: Callable[[], Any]) -> Any:
        """``compute()`` (something read from the snapshot ``dt``), once per cached snapshot."""
        with self._lock:
            read = self._memo.get(id(dt))
            if read is not None and what in read:
                return read[what]
        value = compute()
        if read is not None:
            with self._lock:
                read[what] = value
        return value


_SNAPSHOTS = _Snapshots(SNAPSHOTS_KEPT)


def _is_local(uri: str) -> bool:
    return "://" not in uri or uri.startswith("file://")


def open_table(uri: str, version: int | None = None) -> DeltaTable | None:
    """The Delta table at ``uri`` (optionally at ``version``), or None if there is none.

    The handle may be shared with other readers of the same version: do not write through it
    (use :func:`open_for_write`)."""
    try:
        if not _is_local(uri):
            return DeltaTable(uri, version=version) if DeltaTable.is_deltatable(uri) else None
        newest = _SNAPSHOTS.newest(uri)
        if newest is None:
            return None
        return _SNAPSHOTS.open(uri, newest if version is None else version)
    except TableNotFoundError:
        return None


def open_for_write(uri: str) -> DeltaTable | None:
    """A handle of its own on the table's newest version (None: no table), for operations
    that commit through it."""
    try:
        return DeltaTable(uri) if DeltaTable.is_deltatable(uri) else None
    except TableNotFoundError:
        return None


def transaction_version(uri: str, app_id: str) -> int | None:
    """The last epoch committed to the table by ``app_id``, or None (no table, no commit)."""
    dt = open_table(uri)
    return None if dt is None else dt.transaction_version(app_id)


# -- arrow normalization (delta-rs -> Spark) --------------------------------------------------

_UNSIGNED = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64()}


def spark_compatible_type(t: pa.DataType) -> pa.DataType:
    """The Arrow type Spark's Arrow conversion accepts for ``t`` (views -> plain, unsigned -> signed)."""
    if t in (pa.string_view(), pa.large_string()):
        return pa.string()
    if t in (pa.binary_view(), pa.large_binary()):
        return pa.binary()
    if t in _UNSIGNED:
        return _UNSIGNED[t]
    if t == pa.uint64():
        return pa.int64()
    if pa.types.is_timestamp(t) and t.unit != "us":
        return pa.timestamp("us", tz=t.tz)
    return t


def spark_compatible_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with the types Spark accepts (:func:`spark_compatible_type`), nullability
    kept."""
    return pa.schema([pa.field(f.name, spark_compatible_type(f.type), f.nullable) for f in schema])


def spark_compatible(table: pa.Table) -> pa.Table:
    """Cast a delta-rs Arrow table to types Spark accepts."""
    target = spark_compatible_schema(table.schema)
    return table if target == table.schema else table.cast(target)


# -- sources -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DataFile:
    """A Parquet file of a Delta table: absolute URI, partition values, row count (of the
    Parquet file) and the rows its deletion vector deletes (0 without one): only Delta's own
    reader may read a file with ``deleted`` rows."""

    uri: str
    partition_values: Mapping[str, str | None]
    num_records: int | None
    deleted: int = 0

    @property
    def live_records(self) -> int | None:
        """The rows a Delta reader reads from the file (its deletion vector applied)."""
        return None if self.num_records is None else self.num_records - self.deleted


class SourceTable:
    """A configured source: a Delta table the user owns, read but never written.

    Raises on construction:
        SourceNotFoundError: no Delta table at the path.
    """

    def __init__(self, name: str, uri: str) -> None:
        self.name = name
        self.uri = uri
        self._identity: str | None = None
        self._memo: dict[tuple[int, str], Any] = {}
        try:
            exists = DeltaTable.is_deltatable(uri)
        except (DeltaError, OSError) as e:
            raise SourceNotFoundError(f"source {name!r}: cannot open {uri}: {e}") from e
        if not exists:
            raise SourceNotFoundError(
                f"source {name!r}: no Delta table at {uri} (check [sources] in ivm.toml)"
            )

    def table(self, version: int | None = None) -> DeltaTable:
        """The table at ``version`` (default: its newest), a shared read-only handle."""
        which = "its latest version" if version is None else f"version {version}"
        try:
            dt = open_table(self.uri, version)
        except (DeltaError, OSError, ValueError) as e:
            raise ChangeFeedError(
                f"source {self.name!r} ({self.uri}): cannot load {which} from its Delta log: "
                f"{_first_line(e)}"
            ) from e
        if dt is None:
            raise ChangeFeedError(
                f"source {self.name!r} ({self.uri}): cannot load {which}: no Delta table there"
            )
        return dt

    def check(self) -> pa.Schema:
        """Open the latest snapshot once: a corrupt or unreadable log fails here, by name.

        Returns:
            The table's current schema (as :meth:`arrow_schema`).

        Raises:
            SourceError: the table's log cannot be read.
        """
        return self.arrow_schema()

    def version(self) -> int:
        return self.table().version()

    def identity(self) -> str:
        """The Delta table's id (``metaData.id``, set when the table is created): two tables
        created one after the other at the same path have the same version numbers but not
        the same id. Read once per ``SourceTable``."""
        if self._identity is None:
            self._identity = self.table().metadata().id
        return self._identity

    def arrow_schema(self, version: int | None = None) -> pa.Schema:
        schema = pa.schema(self.table(version).schema().to_arrow())
        return pa.schema([pa.field(f.name, spark_compatible_type(f.type)) for f in schema])

    def column_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.arrow_schema())

    def append_only(self) -> bool:
        """Whether the table declares ``delta.appendOnly`` (no row is ever deleted)."""
        conf = self.table().metadata().configuration
        return str(conf.get("delta.appendOnly", "false")).lower() == "true"

    def column_mapping(self, version: int | None = None) -> str | None:
        """The table's column mapping mode (``name``, ``id``), or None: its files then name
        their columns by physical names only the log maps to the table's."""
        mode = self.table(version).metadata().configuration.get("delta.columnMapping.mode")
        return None if mode in (None, "none") else str(mode)

    def deletion_vectors(self, version: int) -> dict[str, int]:
        """The rows each data file of the snapshot at ``version`` has deleted by a deletion
        vector (files without one left out; empty when the table has no such feature)."""
        key = (version, "deletion_vectors")
        if key not in self._memo:
            self._memo[key] = vector_deletions(self.table(version))
        return self._memo[key]

    def needs_delta_reader(self, version: int) -> str | None:
        """Why the snapshot at ``version`` must be read by Delta's own reader (delta-spark,
        or delta-rs's DataFusion scan), never from its Parquet files directly: column mapping
        (the files' column names are not the table's) or deletion vectors (the files still
        hold deleted rows). None: its files read as they are give the snapshot."""
        mode = self.column_mapping(version)
        if mode is not None:
            return f"column mapping mode {mode!r}"
        deleted = self.deletion_vectors(version)
        if deleted:
            return f"{len(deleted)} files carry deletion vectors"
        return None

    def cdf_enabled(self, version: int | None = None) -> bool:
        conf = self.table(version).metadata().configuration
        return str(conf.get("delta.enableChangeDataFeed", "false")).lower() == "true"

    def files(self, version: int) -> list[DataFile]:
        """The data files of the snapshot at ``version`` (read directly only when
        :meth:`needs_delta_reader` says None; their row counts include deleted rows)."""
        return _data_files(self.table(version))

    def partition_columns(self, version: int | None = None) -> list[str]:
        return list(self.table(version).metadata().partition_columns)

    def changes(self, lower: int, upper: int) -> pa.Table:
        """The Change Data Feed for versions ``(lower, upper]`` with a ``_diff`` column.

        Returns:
            The table's columns plus ``_diff`` (+1/-1) and ``_commit_version``.

        Raises:
            ChangeFeedError: CDF is off for part of the range, or the range is no longer readable.
        """
        if not self.cdf_enabled(upper):
            raise ChangeFeedError(
                f"source {self.name!r} ({self.uri}): versions {lower + 1}..{upper} are not "
                "append-only and the Change Data Feed is off; enable it with "
                "ALTER TABLE ... SET TBLPROPERTIES (delta.enableChangeDataFeed = true)"
            )
        if self.column_mapping(upper) is not None:  # delta-rs refuses it: delta-spark's part
            raise InvariantViolation(f"source {self.name!r}: a column-mapped feed read by delta-rs")
        dt = self.table(upper)
        try:
            reader = dt.load_cdf(starting_version=lower + 1, ending_version=upper)
            raw = pa.RecordBatchReader.from_stream(reader).read_all()
        except (DeltaError, OSError, pa.ArrowException) as e:
            raise ChangeFeedError(
                f"source {self.name!r} ({self.uri}): the change data of versions "
                f"{lower + 1}..{upper} is no longer readable ({_first_line(e)}); rebuild the "
                "views that read it from its current state with `ivm refresh --rebuild`"
            ) from e
        return feed_updates(raw)

    def appended_files(self, lower: int, upper: int) -> list[DataFile]:
        """Files added in ``(lower, upper]`` when that range holds appends alone (no CDF needed).

        Raises:
            ChangeFeedError: some commit in the range removed data and CDF is off.
        """
        before = {f.uri for f in self.files(lower)}
        after = self.files(upper)
        after_uris = {f.uri for f in after}
        # A DELETE by deletion vector keeps the file and gives it a vector: an old file's
        # deleted rows changed, or a new file arrived with some deleted, is not an append.
        old_dvs, new_dvs = self.deletion_vectors(lower), self.deletion_vectors(upper)
        rewritten = any(old_dvs.get(uri) != n for uri, n in new_dvs.items())
        if self.column_mapping(upper) is not None or rewritten or not before <= after_uris:
            if self.cdf_enabled(upper):
                raise ChangeFeedError("not append-only")  # caller falls back to the CDF
            raise ChangeFeedError(
                f"source {self.name!r} ({self.uri}): versions {lower + 1}..{upper} delete or "
                "rewrite data and the table has no Change Data Feed; enable it with ALTER TABLE "
                "... SET TBLPROPERTIES (delta.enableChangeDataFeed = true), then rebuild with "
                "`ivm refresh --rebuild`"
            )
        return [f for f in after if f.uri not in before]


def feed_updates(raw: pa.Table) -> pa.Table:
    """A Delta Change Data Feed (``_change_type``, ``_commit_version``...) as updates: the
    table's columns, ``_diff`` (+1 for inserts and post-images, -1 for deletes and
    pre-images) and ``_commit_version``, in types Spark accepts."""
    raw = spark_compatible(raw)
    kinds = raw.column("_change_type")
    plus = pc.or_(pc.equal(kinds, "insert"), pc.equal(kinds, "update_postimage"))
    diff = pc.if_else(plus, pa.scalar(1, pa.int64()), pa.scalar(-1, pa.int64()))
    keep = [c for c in raw.column_names if not c.startswith("_")]
    out = raw.select(keep).append_column("_diff", diff)
    return out.append_column("_commit_version", raw.column("_commit_version").cast(pa.int64()))


def _first_line(e: BaseException) -> str:
    return str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__


def has_vectors(dt: DeltaTable) -> bool:
    """Whether the table's protocol allows deletion vectors (some file may carry one)."""
    return "deletionVectors" in (dt.protocol().reader_features or [])


def _vectors(dt: DeltaTable) -> pa.Table | None:
    """delta-rs's deletion vectors of ``dt``'s snapshot (``filepath``, ``selection_vector``:
    per row of the file, whether it is kept; rows past its end are kept), or None when the
    table has no such feature."""
    if not has_vectors(dt):
        return None
    return _SNAPSHOTS.memo(
        dt, "vectors", lambda: pa.RecordBatchReader.from_stream(dt.deletion_vectors()).read_all()
    )


def vector_deletions(dt: DeltaTable) -> dict[str, int]:
    """The rows each data file of ``dt``'s snapshot has deleted by a deletion vector, by the
    file's local path (files without one left out; empty when the table has no such
    feature)."""
    dvs = _vectors(dt)
    found: dict[str, int] = {}
    if dvs is None:
        return found
    kept = dvs.column("selection_vector").combine_chunks()
    # the deleted (False) entries counted per file in Arrow, not as Python bools
    deleted = pc.list_value_length(kept).to_numpy(zero_copy_only=False) - np.bincount(
        pc.list_parent_indices(kept).to_numpy(),
        weights=pc.list_flatten(kept).to_numpy(zero_copy_only=False),
        minlength=len(kept),
    )
    for path, n in zip(dvs.column("filepath").to_pylist(), deleted, strict=True):
        if n:
            found[local_path(path)] = int(n)
    return found


def deleted_positions(table_uri: str, files: Sequence[DataFile]) -> dict[str, np.ndarray]:
    """For each of ``files`` with a deletion vector, the positions (ascending) of the rows it
    deletes, by the file's local path."""
    wanted = [f.uri for f in files if f.deleted]
    dt = open_table(table_uri) if wanted else None
    return {} if dt is None else deleted_positions_of(dt, wanted)


def deleted_positions_of(dt: DeltaTable, uris: Sequence[str]) -> dict[str, np.ndarray]:
    """For each data file of ``dt``'s snapshot among ``uris`` that has a deletion vector, the
    positions (ascending) of the rows it deletes, by the file's local path."""
    wanted = {local_path(u) for u in uris}
    dvs = _vectors(dt) if wanted else None
    if dvs is None:
        return {}
    out = {}
    for path, kept in zip(
        dvs.column("filepath").to_pylist(), dvs.column("selection_vector"), strict=True
    ):
        if local_path(path) in wanted:
            out[local_path(path)] = np.flatnonzero(~kept.values.to_numpy(zero_copy_only=False))
    return out


def live_rows(dt: DeltaTable) -> int:
    """The rows a Delta reader reads from ``dt``'s snapshot, from its log: the files' row
    counts less the rows their deletion vectors delete (a file without a count counts 0)."""
    actions = pa.table(dt.get_add_actions(flatten=True))
    counted = int(pc.sum(actions.column("num_records")).as_py() or 0)
    return counted - sum(vector_deletions(dt).values())


def snapshot_rows(dt: DeltaTable, columns: Sequence[str] | None = None) -> pa.Table:
    """A table's rows at ``dt``'s version as a Delta reader reads them: by delta-rs's pyarrow
    reader, or, when the table has deletion vectors or column mapping (which that reader
    refuses), by its DataFusion scan, which applies them."""
    features = set(dt.protocol().reader_features or [])
    if not features & {"deletionVectors", "columnMapping"}:
        return dt.to_pyarrow_table(columns=None if columns is None else list(columns))
    names = "*" if columns is None else ", ".join(f'"{c}"' for c in columns)
    reader = QueryBuilder().register("snapshot", dt).execute(f"SELECT {names} FROM snapshot")
    return spark_compatible(pa.table(reader.read_all()))


def _data_files(dt: DeltaTable) -> list[DataFile]:
    actions = pa.table(dt.get_add_actions(flatten=True))
    parts = [c for c in actions.column_names if c.startswith("partition.")]
    root = local_path(dt.table_uri.rstrip("/"))
    deleted = vector_deletions(dt)
    out = []
    for row in actions.to_pylist():
        pv = {c[len("partition.") :]: row[c] for c in parts}
        uri = _join_uri(root, row["path"])
        out.append(
            DataFile(
                uri,
                {k: (None if v is None else str(v)) for k, v in pv.items()},
                row.get("num_records"),
                deleted.get(local_path(uri), 0),
            )
        )
    return out


def _join_uri(root: str, path: str) -> str:
    if "://" in path or path.startswith("/"):
        return path
    return f"{root}/{unquote(path)}"


_driver_reads: dict[str, int] = {}
_driver_reads_lock = threading.Lock()


def count_driver_read(uri: str, rows: int) -> None:
    """Record that the driver decoded ``rows`` rows of the lake's Parquet file ``uri`` (its
    own reads, which Spark's scan metrics do not see): a benchmark's measure."""
    with _driver_reads_lock:
        _driver_reads[uri] = _driver_reads.get(uri, 0) + rows


def driver_reads() -> dict[str, int]:
    """Rows the driver decoded per file since the process started (:func:`count_driver_read`)."""
    with _driver_reads_lock:
        return dict(_driver_reads)


def local_path(uri: str) -> str:
    """A local filesystem path for a ``file://`` URI or plain path."""
    return uri[len("file://") :] if uri.startswith("file://") else uri


# -- epochs ------------------------------------------------------------------------------------

EPOCH_SCHEMA = pa.schema(
    [
        pa.field("epoch", pa.int64(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("lower", pa.int64()),  # NULL: the epoch starts from the empty collection
        pa.field("upper", pa.int64(), nullable=False),
        pa.field("minted_at", pa.timestamp("us", tz="UTC"), nullable=False),
    ]
)


@dataclass(frozen=True, slots=True)
class EpochRecord:
    """One epoch: for every source the Delta version range ``(lower, upper]`` it covers.

    ``lower`` is None when the source enters at this epoch (its snapshot at ``upper``).
    """

    epoch: int
    ranges: Mapping[str, tuple[int | None, int]]
    minted_at: datetime


def read_epochs(layout: LakeLayout) -> list[EpochRecord]:
    """All committed epochs, oldest first (empty if none was ever minted)."""
    dt = open_table(layout.epochs)
    if dt is None:
        return []
    rows = _SNAPSHOTS.memo(dt, "rows", lambda: dt.to_pyarrow_table().to_pylist())
    by_epoch: dict[int, dict[str, Any]] = {}
    for r in rows:
        e = by_epoch.setdefault(r["epoch"], {"ranges": {}, "minted_at": r["minted_at"]})
        e["ranges"][r["source"]] = (r["lower"], r["upper"])
    return [
        EpochRecord(epoch, v["ranges"], v["minted_at"]) for epoch, v in sorted(by_epoch.items())
    ]


def append_epoch(layout: LakeLayout, record: EpochRecord) -> bool:
    """Commit an epoch record once (app transaction ``_ivm/epochs`` = epoch).

    Returns:
        True if this call committed it, False if the epoch was already recorded.
    """
    app_id = "_ivm/epochs"
    rows = [
        {
            "epoch": record.epoch,
            "source": s,
            "lower": lo,
            "upper": up,
            "minted_at": record.minted_at,
        }
        for s, (lo, up) in sorted(record.ranges.items())
    ]
    data = pa.Table.from_pylist(rows, schema=EPOCH_SCHEMA)
    with table_lock(layout.epochs):
        if (transaction_version(layout.epochs, app_id) or 0) >= record.epoch:
            return False
        write_deltalake(
            layout.epochs,
            data,
            mode="append",
            configuration=TABLE_CONFIGURATION,  # taken when the first epoch creates it
            commit_properties=CommitProperties(
                app_transactions=[Transaction(app_id, record.epoch)],
                custom_metadata={"ivm.epoch": str(record.epoch)},
            ),
        )
    return True


# -- writing: staging, stats, commits ------------------------------------------------------------


def staging_uri(table_uri: str, epoch: int, label: str) -> str:
    """A fresh folder under the table for Spark to write one commit's files into.

    Not hidden (no leading ``_`` or ``.``), so vacuum removes it if the commit never happens.
    """
    return f"{table_uri}/{label}-e{epoch:08d}-{uuid.uuid4().hex[:12]}"


def _fs(uri: str) -> tuple[pafs.FileSystem, str]:
    if "://" not in uri:
        return pafs.LocalFileSystem(), os.path.abspath(uri)
    return pafs.FileSystem.from_uri(uri)


def _stat_value(v: Any, lower: bool) -> Any:
    """A Parquet statistic as a Delta stats JSON value, or None to omit it."""
    if v is None or isinstance(v, bool):
        return None
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return None if math.isnan(v) else v
    if isinstance(v, Decimal):  # JSON floats: widen outward so pruning stays safe
        f = float(v)
        return math.nextafter(f, -math.inf) if lower else math.nextafter(f, math.inf)
    if isinstance(v, datetime):
        return None  # millisecond-rounding rules differ between readers; not worth the risk
    if isinstance(v, date):
        return v.isoformat()
    if isinstance(v, str):
        if len(v) <= STATS_STRING_PREFIX:
            return v
        return v[:STATS_STRING_PREFIX] if lower else None
    return None


def file_stats(fs: pafs.FileSystem, path: str) -> tuple[int, str, pa.Schema]:
    """``(num_rows, Delta stats JSON, arrow schema)`` from a Parquet file's footer alone."""
    with fs.open_input_file(path) as f:
        md = pq.ParquetFile(f).metadata
        schema = md.schema.to_arrow_schema()
    mins: dict[str, Any] = {}
    maxs: dict[str, Any] = {}
    nulls: dict[str, int] = {}
    for i in range(md.num_columns):
        col = md.schema.column(i)
        if "." in col.path:  # nested leaf: no stats
            continue
        lo = hi = None
        ok = md.num_row_groups > 0
        n_null = 0
        for g in range(md.num_row_groups):
            st = md.row_group(g).column(i).statistics
            if st is None:
                ok = False
                break
            n_null += st.null_count or 0
            if st.has_min_max:
                lo = st.min if lo is None else min(lo, st.min)
                hi = st.max if hi is None else max(hi, st.max)
        if not ok:
            continue
        nulls[col.path] = n_null
        lo_v, hi_v = _stat_value(lo, True), _stat_value(hi, False)
        if lo_v is not None and hi_v is not None:
            mins[col.path] = lo_v
            maxs[col.path] = hi_v
    stats = {"numRecords": md.num_rows, "minValues": mins, "maxValues": maxs, "nullCount": nulls}
    return md.num_rows, json.dumps(stats, separators=(",", ":")), schema


KEY_ORDER_SLACK = 1.25
"""How far row group ranges may overlap and still count as laid out by a key: their widths
summed over the width of the whole range (1.0: no overlap; N row groups each spanning every
key: N). TPC-H's generated files come to 1.03 (``lineitem``) and 1.12 (``orders``): their
row groups overlap a little at the edges."""


def key_ordered(files: Sequence[DataFile], column: str) -> list[DataFile] | None:
    """``files`` in the order of ``column`` when the data is already laid out by it, from the
    Parquet footers alone: within each file the row groups start at non-decreasing values,
    and the row groups' ranges overlap little (:data:`KEY_ORDER_SLACK`; not at all for a
    column whose values have no width, such as strings). The rows within a row group may be
    in any order. None otherwise, or when a footer lacks the column or its min/max
    statistics, or the column holds NULLs.

    Data loaded in key order (TPC-H's generator, append-only tables keyed by increasing ids)
    passes; sorting each run of row groups where it is then yields files whose key ranges
    barely overlap, as a range partitioning would, without its sampling pass and shuffle.
    """
    ranges: list[tuple[Any, Any]] = []
    firsts: list[tuple[Any, DataFile]] = []
    for f in files:
        fs, path = _fs(f.uri)
        with fs.open_input_file(path) as handle:
            md = pq.ParquetFile(handle).metadata
        found = [i for i in range(md.num_columns) if md.schema.column(i).path.lower() == column]
        if len(found) != 1:
            return None
        groups = []
        for g in range(md.num_row_groups):
            if md.row_group(g).num_rows == 0:
                continue
            st = md.row_group(g).column(found[0]).statistics
            if st is None or not st.has_min_max or st.null_count:
                return None
            groups.append((st.min, st.max))
        if any(a[0] > b[0] for a, b in zip(groups, groups[1:], strict=False)):
            return None
        if groups:
            ranges += groups
            firsts.append((groups[0][0], f))
    if not ranges:
        return list(files)
    lo, hi = min(r[0] for r in ranges), max(r[1] for r in ranges)
    try:
        total = _width(lo, hi)
        spread = sum(_width(a, b) for a, b in ranges)
    except TypeError:  # no width: the ranges must not overlap
        ranges.sort()
        if any(a[1] > b[0] for a, b in zip(ranges, ranges[1:], strict=False)):
            return None
    else:
        if spread > KEY_ORDER_SLACK * total:
            return None
    return [f for _, f in sorted(firsts, key=lambda x: x[0])]


def _width(lo: Any, hi: Any) -> float:
    """``hi - lo`` as a number (days for dates); TypeError for values without a width."""
    if isinstance(lo, bool) or isinstance(hi, bool):
        raise TypeError("booleans have no width")
    if isinstance(lo, date) and isinstance(hi, date):
        return float((hi - lo).total_seconds()) if isinstance(lo, datetime) else (hi - lo).days
    if isinstance(lo, (int, float, Decimal)) and isinstance(hi, (int, float, Decimal)):
        return float(hi) - float(lo)
    raise TypeError(f"{type(lo).__name__} values have no width")


@dataclass
class StagedFiles:
    """Parquet files Spark wrote into a staging folder, ready to commit."""

    adds: list[AddAction]
    rows: int
    bytes: int
    schema: pa.Schema | None
    table: pa.Table | None = None  # the rows themselves, when the driver wrote them


def stage_arrow(
    staged_uri: str,
    table: pa.Table,
    *,
    rows_per_page: int | None = None,
    page_bytes: int | None = None,
) -> str | None:
    """Write ``table`` as one Parquet file into the staging folder ``staged_uri``, the way
    the engine's Spark writer would (its codec and level, a page index, decimals as integers,
    no Arrow schema in the footer, timestamps as Spark hands them over: microseconds, UTC):
    readers cannot tell the two apart. Returns the file's local path (None on a remote
    filesystem)."""
    fs, base = _fs(staged_uri)
    fs.create_dir(base, recursive=True)
    path = f"{base}/part-00000-{uuid.uuid4()}-c000.{PARQUET_CODEC}.parquet"
    options: dict[str, Any] = {}
    if rows_per_page is not None:
        options["max_rows_per_page"] = rows_per_page
    if page_bytes is not None:
        options["data_page_size"] = page_bytes
    dictionary, delta = column_encodings(table)
    pq.write_table(
        table,
        path,
        filesystem=fs,
        compression=PARQUET_CODEC,
        compression_level=ZSTD_LEVEL,
        write_page_index=True,
        store_schema=False,
        store_decimal_as_integer=True,
        use_dictionary=dictionary,
        column_encoding=dict.fromkeys(delta, "DELTA_BINARY_PACKED") or None,
        **options,
    )
    return path if isinstance(fs, pafs.LocalFileSystem) else None


DICTIONARY_SAMPLE_ROWS = 10_000
"""How many leading rows of a column :func:`column_encodings` counts the distinct values of."""


def column_encodings(table: pa.Table) -> tuple[list[str], list[str]]:
    """The columns of a file the driver writes to encode with a dictionary, and the columns
    stored as integers to encode as deltas (``DELTA_BINARY_PACKED``, read by Spark's
    vectorized reader, arrow-rs, DuckDB and Trino). A column whose first
    :data:`DICTIONARY_SAMPLE_ROWS` rows hold few distinct values (at most one in eight) gets
    a dictionary, as Spark's writer would keep one; the others are written plain (those
    stored as integers as deltas: :func:`_stored_as_integers`) rather than trying a
    dictionary and falling back: smaller files, written faster (BENCHMARKS.md, "Moved from
    docstrings: resources")."""
    dictionary: list[str] = []
    delta: list[str] = []
    sample = table.slice(0, DICTIONARY_SAMPLE_ROWS)
    for field_ in table.schema:
        t = field_.type
        if pa.types.is_nested(t) or pa.types.is_null(t):
            continue  # written plain
        values = sample.column(field_.name)
        if len(values) and pc.count_distinct(values).as_py() * 8 <= len(values):
            dictionary.append(field_.name)
        elif _stored_as_integers(t):
            delta.append(field_.name)
    return dictionary, delta


def _stored_as_integers(t: pa.DataType) -> bool:
    """Whether :func:`stage_arrow` stores ``t``'s values as Parquet INT32 or INT64, the
    physical types ``DELTA_BINARY_PACKED`` encodes: integers, dates, timestamps, and
    decimals of at most 18 digits (``store_decimal_as_integer``; wider ones are fixed-length
    byte arrays)."""
    if pa.types.is_decimal(t):
        return t.precision <= 18
    return pa.types.is_integer(t) or pa.types.is_date(t) or pa.types.is_timestamp(t)


def collect_staged(table_uri: str, staged_uri: str) -> StagedFiles:
    """List the Parquet files under ``staged_uri`` and build their AddActions with stats.

    Empty files are deleted rather than committed; Hadoop's ``.crc`` side files are removed.
    """
    fs, base = _fs(staged_uri)
    _, table_base = _fs(table_uri)
    infos = fs.get_file_info(pafs.FileSelector(base, allow_not_found=True))
    adds: list[AddAction] = []
    rows = size = 0
    schema: pa.Schema | None = None
    now = int(time.time() * 1000)
    for info in sorted(infos, key=lambda i: i.path):
        name = info.base_name
        if name.endswith(".crc") or name.startswith("_"):
            fs.delete_file(info.path)
            continue
        if not name.endswith(".parquet"):
            continue
        n, stats, file_schema = file_stats(fs, info.path)
        if n == 0:
            fs.delete_file(info.path)
            continue
        schema = schema or file_schema
        rel = os.path.relpath(info.path, table_base)
        adds.append(AddAction(rel, info.size, {}, now, True, stats))
        rows += n
        size += info.size
    return StagedFiles(adds, rows, size, schema)


@dataclass
class CommitResult:
    """What one idempotent commit did (reported as Dagster metadata by the callers)."""

    table: str
    epoch: int
    committed: bool
    version: int | None
    files_added: int = 0
    files_removed: int = 0
    rows: int = 0
    bytes: int = 0
    retries: int = 0
    seconds: float = 0.0
    staged: pa.Table | None = None  # the rows committed, when the driver wrote them


@contextmanager
def table_lock(table_uri: str) -> Iterator[None]:
    """An exclusive inter-process lock for check-then-commit on one local table.

    Object stores get no lock here; there the app-transaction check plus delta-rs's
    conflict detection is what stands between two writers.
    """
    if "://" in table_uri and not table_uri.startswith("file://"):
        yield
        return
    path = local_path(table_uri).rstrip("/")
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    lock_file = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}.lock")
    with open(lock_file, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


TABLE_CONFIGURATION: Mapping[str, str] = {"delta.checkpointInterval": "10"}
"""Table properties of every table the engine creates. A checkpoint every 10 commits (Delta's
writers default to 100): opening a table replays the JSON commits after its last checkpoint,
every view's log and table, arrangement and state table takes one commit per epoch, and a
refresh opens each table a few times, so without it the refresh's cost grew with the epochs
behind it."""


def _version_after_commit(dt: DeltaTable | None) -> int:
    """The version a commit through ``dt`` made (0: it created the table): ``dt`` reads only
    the commits after its own version (a full open replays the log)."""
    if dt is None:
        return 0
    dt.update_incremental()
    return dt.version()


def commit_files(
    table_uri: str,
    *,
    app_id: str,
    epoch: int,
    schema: pa.Schema,
    adds: Sequence[AddAction] = (),
    removes: Sequence[RemoveAction] = (),
    metadata: Mapping[str, str] | None = None,
    description: str | None = None,
    overwrite: bool = False,
    max_retries: int = 5,
) -> CommitResult:
    """Commit files to a table in one transaction carrying ``txn(app_id, epoch)``, once.

    Idempotent: if the table already records ``epoch`` (or later) for ``app_id`` nothing is
    committed and ``committed`` is False; the staged files stay uncommitted for vacuum. The
    table is created by the first commit. ``overwrite`` replaces every file (and the schema)
    in the same single commit, so readers see the old contents or the new, never a mix. On a
    conflict with a concurrent writer the check is repeated and the commit retried up to
    ``max_retries`` times.

    Raises:
        CommitConflictError: still conflicting after all retries.
        LakeError: the table exists but cannot be read.
    """
    started = time.perf_counter()
    props_meta = {"ivm.epoch": str(epoch), **(metadata or {})}
    result = CommitResult(table_uri, epoch, committed=False, version=None)
    with table_lock(table_uri):
        for attempt in range(max_retries + 1):
            result.retries = attempt
            props = CommitProperties(
                custom_metadata=props_meta, app_transactions=[Transaction(app_id, epoch)]
            )
            try:
                dt = open_for_write(table_uri)
                if dt is None:
                    if removes:
                        raise LakeError(f"{table_uri}: cannot remove files from a missing table")
                    create_table_with_add_actions(
                        table_uri,
                        Schema.from_arrow(schema),
                        list(adds),
                        mode="error",
                        description=description,
                        configuration=TABLE_CONFIGURATION,
                        commit_properties=props,
                    )
                else:
                    done = dt.transaction_version(app_id)
                    if done is not None and done >= epoch:
                        result.version = dt.version()
                        break
                    dt.create_write_transaction(
                        [*adds, *removes],
                        mode="overwrite" if overwrite else "append",
                        schema=schema,
                        commit_properties=props,
                    )
            except CommitFailedError:
                time.sleep(0.05 * (attempt + 1))
                continue
            except DeltaError as e:
                if dt is None and "already exists" in str(e).lower():
                    continue  # another writer created it: re-check the transaction
                raise LakeError(f"{table_uri}: commit of epoch {epoch} failed: {e}") from e
            result.committed = True
            result.version = _version_after_commit(dt)
            result.files_added = len(adds)
            result.files_removed = len(removes)
            break
        else:
            raise CommitConflictError(
                f"{table_uri}: epoch {epoch} still conflicts after {max_retries} retries"
            )
    result.seconds = time.perf_counter() - started
    return result


def replace_files(
    table_uri: str,
    *,
    app_id: str,
    expected_version: int,
    schema: pa.Schema,
    adds: Sequence[AddAction],
    metadata: Mapping[str, str],
) -> CommitResult | None:
    """Replace every file of a table by ``adds`` in one commit (compaction), provided nothing
    was committed since ``expected_version``, the version the new files were computed from.

    The commit restates the table's app transaction (same epoch), so its epoch is unchanged.

    Returns:
        The commit, or None when another writer committed in between (the caller's files
        stay uncommitted, for vacuum; the table is as it was).
    """
    started = time.perf_counter()
    with table_lock(table_uri):
        dt = open_for_write(table_uri)
        if dt is None or dt.version() != expected_version:
            return None
        epoch = dt.transaction_version(app_id) or 0
        props = CommitProperties(
            custom_metadata=dict(metadata), app_transactions=[Transaction(app_id, epoch)]
        )
        try:
            dt.create_write_transaction(
                list(adds), mode="overwrite", schema=schema, commit_properties=props
            )
        except CommitFailedError:
            return None
        except DeltaError as e:
            raise LakeError(f"{table_uri}: compaction commit failed: {e}") from e
        result = CommitResult(table_uri, epoch, committed=True, version=_version_after_commit(dt))
    result.files_added = len(adds)
    result.seconds = time.perf_counter() - started
    return result


def remove_action(table_uri: str, f: DataFile) -> RemoveAction:
    """A RemoveAction for one of a table's files."""
    rel = os.path.relpath(local_path(f.uri), local_path(table_uri))
    return RemoveAction(rel, True, int(time.time() * 1000), None, dict(f.partition_values) or None)


def table_files(table_uri: str, version: int | None = None) -> list[DataFile]:
    """The data files of one of the system's own tables ([] if it does not exist)."""
    dt = open_table(table_uri, version)
    return [] if dt is None else _data_files(dt)


@dataclass
class FileStats:
    """Per-file min/max of some columns, for pruning on the driver."""

    file: DataFile
    mins: dict[str, Any] = field(default_factory=dict)
    maxs: dict[str, Any] = field(default_factory=dict)


def table_file_stats(table_uri: str, columns: Sequence[str]) -> list[FileStats]:
    """Files of a table with their min/max for ``columns`` (missing stats -> absent key)."""
    dt = open_table(table_uri)
    if dt is None:
        return []
    actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
    root = local_path(dt.table_uri.rstrip("/"))
    deleted = vector_deletions(dt)
    out = []
    for row in actions:
        uri = _join_uri(root, row["path"])
        f = DataFile(uri, {}, row.get("num_records"), deleted.get(local_path(uri), 0))
        fs = FileStats(f)
        for c in columns:
            if row.get(f"min.{c}") is not None:
                fs.mins[c] = row[f"min.{c}"]
            if row.get(f"max.{c}") is not None:
                fs.maxs[c] = row[f"max.{c}"]
        out.append(fs)
    return out


def last_commit_metadata(table_uri: str, key: str, depth: int = 50) -> dict[str, Any] | None:
    """The newest commit info (within ``depth`` commits) that carries ``key``, or None."""
    dt = open_table(table_uri)
    if dt is None:
        return None
    for info in _SNAPSHOTS.memo(dt, f"history {depth}", lambda: commit_history(dt, depth)):
        if key in info:
            return info
    return None


def commit_history(dt: DeltaTable, depth: int) -> list[dict[str, Any]]:
    """The newest ``depth`` commit infos, newest first, each with the engine's metadata as
    keys whoever committed it: delta-rs's custom metadata is there already; delta-spark's
    (:mod:`resources.delta_ops`) is the JSON object in ``userMetadata``."""
    out = []
    for info in dt.history(depth):
        user = info.get("userMetadata")
        if isinstance(user, str) and user.startswith("{"):
            try:
                info = {**json.loads(user), **info}
            except json.JSONDecodeError:
                pass  # another writer's free text: not ours
        out.append(info)
    return out


def now_utc() -> datetime:
    return datetime.now(UTC)
