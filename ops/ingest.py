"""Ingestion: turn sources and views into DataFrames of updates ``(columns..., _time, _diff)``.

- A source's versions ``(lower, upper]`` become updates at the epoch's time: inserts and
  update post-images ``+1``, deletes and update pre-images ``-1`` (Change Data Feed). A range
  that only appended files is read straight from those Parquet files by Spark (no CDF
  needed, in parallel); any other range needs the CDF, and says so when it is off. A reader
  that needs only some columns gets a change feed kept on the driver summed there on them:
  ``(d|columns, t, sum of r)``, zeros dropped.
- A source entering at an epoch (``lower`` is None) contributes its snapshot at ``upper`` as
  ``+1`` updates at that epoch.
- A view's updates in ``(lo, hi]`` are the rows of its diff log with ``lo < _time <= hi``;
  files whose ``_time`` statistics fall outside are never opened.
- A view's state at epoch ``t`` is its readable table when that table is at ``t``, otherwise
  the consolidation of its log up to ``t``.

All column names are lower-cased here, the case the planner uses. The sizes that choose a
path (files read one by one in key order: ``ordered_max_files``; a change feed kept on the
driver: ``keep_feed_bytes``) are the policy's (:func:`ivm.policy.current`, read at call
time); they change who reads the updates and how, never which.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import reduce

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from pyspark.errors import AnalysisException, UnsupportedOperationException
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from ivm.errors import ChangeFeedError, InvariantViolation, NotOnDriver
from ivm.policy import current
from ops import DIFF, TIME
from ops.declines import declined
from ops.rows import cast_loss
from resources.lake import (
    DataFile,
    FileStats,
    SourceTable,
    count_driver_read,
    feed_updates,
    key_ordered,
    local_path,
    table_file_stats,
    table_files,
)
from resources.spark import session_key


def read_files(
    spark: SparkSession,
    files: Sequence[DataFile],
    schema: pa.Schema,
    partition_columns: Sequence[str] = (),
    options: Mapping[str, str] | None = None,
) -> DataFrame:
    """Read Delta data files with Spark, restoring partition columns from the log's values.

    Args:
        files: the files, with their partition values.
        schema: the table's full Arrow schema (column order of the result).
        partition_columns: columns whose values live in the log, not in the files.
        options: Parquet reader options for these scans only (Spark passes a scan's options
            to the Parquet reader's configuration).
    """
    vectored = [f.uri for f in files if f.deleted]
    if vectored:  # its Parquet rows include the deleted ones
        raise InvariantViolation(f"{vectored[0]} has a deletion vector: only Delta may read it")
    spark_schema = from_arrow_schema(schema)
    data_schema = from_arrow_schema(
        pa.schema([f for f in schema if f.name not in partition_columns])
    )
    if not files:
        return spark.createDataFrame([], spark_schema)
    groups: dict[tuple[tuple[str, str | None], ...], list[str]] = {}
    for f in files:
        key = tuple((c, f.partition_values.get(c)) for c in partition_columns)
        groups.setdefault(key, []).append(f.uri)
    parts = []
    for key, uris in groups.items():
        df = spark.read.schema(data_schema).options(**(options or {})).parquet(*uris)
        for column, value in key:
            dtype = spark_schema[column].dataType
            df = df.withColumn(column, F.lit(value).cast(dtype))
        parts.append(df.select(*[F.col(f"`{c}`") for c in schema.names]))
    return reduce(DataFrame.unionByName, parts)


def file_rows_declined(path: str, schema: pa.Schema) -> str | None:
    """Why the driver does not read a local data file's ``schema`` columns as Spark would
    (:func:`read_file_rows`), from its footer: the file lacks one (Spark would read NULLs),
    holds two of that name (regardless of case), or one's type does not convert to
    ``schema``'s without loss (:func:`ops.rows.lossless`). None when it does."""
    return _file_columns_declined(pq.read_schema(path), schema)[0]


def _file_columns_declined(
    found: pa.Schema, schema: pa.Schema
) -> tuple[str | None, dict[str, str]]:
    """:func:`file_rows_declined` given the file's schema, and its names by lower case."""
    names = {n.lower(): n for n in found.names}
    if len(names) < len(found.names):
        return "a data file holds two columns of one name", names
    missing = [c for c in schema.names if c.lower() not in names]
    if missing:
        return f"a data file lacks column {missing[0]} (Spark reads NULLs)", names
    renamed = pa.schema([found.field(names[c.lower()]).with_name(c) for c in schema.names])
    loss = cast_loss(renamed, schema)
    return (None if loss is None else f"a data file's {loss}"), names


def read_file_rows(path: str, schema: pa.Schema) -> pa.Table:
    """A local data file's ``schema`` columns as Spark's read with that schema gives them:
    found by name regardless of case (Spark's default), cast to ``schema``'s types. Raises
    NotOnDriver when :func:`file_rows_declined` says why not: Spark reads it."""
    found = pq.ParquetFile(path)
    why, names = _file_columns_declined(found.schema_arrow, schema)
    if why is not None:
        raise NotOnDriver(why)
    table = found.read(columns=[names[c.lower()] for c in schema.names])
    return table.rename_columns(schema.names).cast(schema)


def _lower_names(df: DataFrame) -> DataFrame:
    return df.select(*[F.col(f"`{c}`").alias(c.lower()) for c in df.columns])


def delta_snapshot(spark: SparkSession, source: SourceTable, version: int) -> DataFrame:
    """The source at ``version`` as delta-spark reads it (deletion vectors applied, columns by
    their logical names)."""
    return spark.read.format("delta").option("versionAsOf", version).load(source.uri)


def read_table(spark: SparkSession, uri: str, schema: pa.Schema) -> DataFrame:
    """One of the engine's own tables (``schema``: its Arrow schema), current version: its
    Parquet files read directly, or by Delta's own reader (delta-spark) once some file carries
    a deletion vector (a view table's deletions, :mod:`ops.sink`)."""
    files = table_files(uri)
    if any(f.deleted for f in files):
        return spark.read.format("delta").load(uri).select(*[f"`{c}`" for c in schema.names])
    return read_files(spark, files, schema)


def delta_feed(spark: SparkSession, source: SourceTable, lower: int, upper: int) -> pa.Table:
    """The Change Data Feed of ``(lower, upper]`` as delta-spark reads it (any table feature;
    one Spark job), as :func:`resources.lake.feed_updates` (for what delta-rs's feed refuses:
    column mapping)."""
    try:
        raw = (
            spark.read.format("delta")
            .option("readChangeFeed", "true")
            .option("startingVersion", lower + 1)
            .option("endingVersion", upper)
            .load(source.uri)
            .toArrow()
        )
    except (AnalysisException, UnsupportedOperationException) as e:
        # e.g. a column renamed or dropped in the range: Delta refuses that batch read
        raise ChangeFeedError(
            f"source {source.name!r} ({source.uri}): Delta cannot read the change data of "
            f"versions {lower + 1}..{upper}: {str(e).strip().splitlines()[0]}; rebuild the views "
            "that read it from its current state with `ivm refresh --rebuild`"
        ) from e
    return feed_updates(raw)


def source_snapshot(
    spark: SparkSession,
    source: SourceTable,
    version: int,
    epoch: int,
    files: Sequence[DataFile] | None = None,
) -> DataFrame:
    """The source's contents at ``version`` as ``+1`` updates at ``epoch`` (``files``: that
    version's files, when the caller has them): its Parquet files read directly, or, for a
    table whose files are not its rows (:meth:`~resources.lake.SourceTable.needs_delta_reader`:
    column mapping, deletion vectors), Delta's own reader (delta-spark) at that version."""
    schema = source.arrow_schema(version)
    if source.needs_delta_reader(version) is not None:
        df = delta_snapshot(spark, source, version).select(*[f"`{c}`" for c in schema.names])
    else:
        files = source.files(version) if files is None else files
        df = read_files(spark, files, schema, source.partition_columns(version))
    return (
        _lower_names(df)
        .withColumn(TIME, F.lit(epoch).cast("bigint"))
        .withColumn(DIFF, F.lit(1).cast("bigint"))
    )


def source_snapshot_in_order(
    spark: SparkSession, source: SourceTable, version: int, epoch: int, column: str
) -> DataFrame | None:
    """:func:`source_snapshot` with every Spark partition holding a range of ``column`` that
    the others' barely overlap, or None when the files are not laid out by ``column``
    (:func:`resources.lake.key_ordered`), it is a partition column, or there are more than
    the policy's ``ordered_max_files`` files (each is a scan of its own).

    Each file is its own scan (Spark would pack pieces of several files into one partition),
    and a scan splits a file into runs of whole row groups, so sorting each partition yields
    files whose key ranges barely overlap, as a range partitioning would, without its
    sampling pass and shuffle.
    """
    if column in {c.lower() for c in source.partition_columns(version)}:
        return None
    if source.needs_delta_reader(version) is not None:
        return None
    files = source.files(version)
    if not files or len(files) > current().ordered_max_files:
        return None
    ordered = key_ordered(files, column)
    if ordered is None:
        return None
    parts = [source_snapshot(spark, source, version, epoch, [f]) for f in ordered]
    return reduce(DataFrame.unionByName, parts)


@dataclass
class _Changes:
    """A source's updates for one version range: their number, known on the driver (the change
    feed's rows, or the appended files' or the snapshot's row counts from the log), and the
    DataFrame, made on first demand (deciding to recompute needs only the number).

    ``feed`` is the change feed itself (column names lower-cased) when it is small enough to
    keep (the policy's ``keep_feed_bytes``; it stays on the driver for the refresh besides
    its copy in Spark): :meth:`cancels_on` answers from it without Spark, and
    :meth:`frame` gives each reader the feed summed on the columns it reads (``project`` turns
    such a table into updates at the range's epoch)."""

    rows: int
    make: Callable[[], DataFrame] | None
    df: DataFrame | None = None
    feed: pa.Table | None = None
    project: Callable[[pa.Table], DataFrame] | None = None
    # Appended files (a range that only added them): the files, the table's Arrow schema,
    # its partition columns; the driver may read them (:meth:`rows_on`).
    appended: tuple[Sequence[DataFile], pa.Schema, Sequence[str]] | None = None
    _net: dict[tuple[str, ...], pa.Table | None] = field(default_factory=dict)
    _projected: dict[tuple[str, ...], DataFrame] = field(default_factory=dict)

    def frame(self, columns: Sequence[str] | None = None) -> DataFrame:
        """The updates. With ``columns``, when the feed is kept on the driver: those columns'
        updates only (``(columns..., _time, _diff)``), summed there, so an update that rewrote
        other columns only, or a change undone within the range, reaches no reader of these
        columns. Otherwise every column, as the range gave them."""
        net = None if columns is None or self.project is None else self.net_on(columns)
        if net is None:
            if self.df is None:
                assert self.make is not None
                # Once in Spark, the driver keeps no copy (but ``feed``, if small enough).
                self.df, self.make = self.make(), None
            return self.df
        key = tuple(sorted(columns or ()))
        if key not in self._projected:
            assert self.project is not None
            self._projected[key] = self.project(net)
        return self._projected[key]

    def net_on(self, columns: Sequence[str]) -> pa.Table | None:
        """The feed summed on ``columns`` (:func:`consolidated_on`); None when the feed is not
        kept on the driver, lacks one of the columns, or Arrow cannot group by one."""
        if self.feed is None:
            return None
        key = tuple(sorted(columns))
        if key not in self._net:
            self._net[key] = consolidated_on(self.feed, key)
        return self._net[key]

    def rows_on(self, columns: Sequence[str]) -> pa.Table | None:
        """The updates on ``columns`` as Arrow ``(columns..., _diff)`` (in the table's column
        order), held by the driver: the change feed summed on them (:meth:`net_on`), or the
        appended files' rows, each ``+1``, read by the driver (local files, no partition
        column among ``columns``). None when the driver does not hold or read them."""
        if self.feed is not None:
            return self.net_on(columns)
        if self.appended is None:
            return None
        key = ("appended", *sorted(columns))
        if key not in self._net:
            self._net[key] = self._read_appended(columns)
        return self._net[key]

    def _read_appended(self, columns: Sequence[str]) -> pa.Table | None:
        assert self.appended is not None
        files, schema, partitions = self.appended
        wanted = set(columns)
        fields = [pa.field(f.name.lower(), f.type) for f in schema if f.name.lower() in wanted]
        if len(fields) != len(wanted) or wanted & {p.lower() for p in partitions}:
            return None
        if any("://" in f.uri and not f.uri.startswith("file://") for f in files):
            return None
        parts = []
        for f in files:
            try:
                rows = read_file_rows(local_path(f.uri), pa.schema(fields))
            except NotOnDriver as why:
                declined(f"appended files read by Spark ({why})")
                return None
            count_driver_read(f.uri, rows.num_rows)
            parts.append(
                rows.append_column(DIFF, pa.repeat(pa.scalar(1, pa.int64()), rows.num_rows))
            )
        if not parts:
            return pa.schema([*fields, pa.field(DIFF, pa.int64())]).empty_table()
        return pa.concat_tables(parts)

    def cancels_on(self, columns: Sequence[str]) -> bool:
        """Whether these updates sum to nothing once projected on ``columns``: every update
        rewrote other columns only, or undid another (False when not known on the driver)."""
        if self.rows == 0:
            return True
        net = self.net_on(columns)
        return net is not None and net.num_rows == 0


def consolidated_on(updates: pa.Table, columns: Sequence[str]) -> pa.Table | None:
    """``updates`` projected on ``columns`` and summed per distinct row, whatever their other
    columns (``_time`` among them: the sum is the net change over its times), NULLs equal as
    in grouping, the rows summing to 0 dropped: ``(columns..., _diff)``, columns in the feed's
    order. None when the feed lacks one of the columns or Arrow cannot group by one (nested
    types): not known."""
    wanted = set(columns)
    ordered = [c for c in updates.column_names if c in wanted and c != DIFF]
    if len(ordered) != len(wanted):
        return None
    nested = [c for c in ordered if _ungroupable(updates.schema.field(c).type)]
    if nested:
        declined(f"column {nested[0]} summed by Spark (Arrow does not group nested values)")
        return None
    sums = (
        updates.select([*ordered, DIFF])
        .group_by(ordered, use_threads=False)
        .aggregate([(DIFF, "sum")])
    )
    net = sums.select([*ordered, f"{DIFF}_sum"]).rename_columns([*ordered, DIFF])
    return net.filter(pc.not_equal(net.column(DIFF), 0))


def _ungroupable(t: pa.DataType) -> bool:
    """Whether Arrow's grouping refuses keys of type ``t`` (lists, structs, maps, unions)."""
    return pa.types.is_nested(t) or pa.types.is_union(t)


def cancels_on(updates: pa.Table, columns: Sequence[str]) -> bool:
    """Whether ``updates`` (``columns..., _diff``) consolidate to nothing on ``columns``
    (:func:`consolidated_on`). Columns Arrow cannot group by (nested types) answer False: not
    known, not empty."""
    if updates.num_rows == 0:
        return True
    if pc.sum(updates.column(DIFF)).as_py() != 0:
        return False
    net = consolidated_on(updates, columns)
    return net is not None and net.num_rows == 0


def source_changes(
    spark: SparkSession, source: SourceTable, lower: int | None, upper: int, epoch: int
) -> _Changes:
    """The updates of a source for versions ``(lower, upper]``, all at time ``epoch``.

    Raises:
        ChangeFeedError: the range deletes or rewrites data and has no readable CDF.
    """
    if lower is None:
        return _Changes(
            source_rows(source, upper), lambda: source_snapshot(spark, source, upper, epoch)
        )
    schema = source.arrow_schema(upper)

    def updates(df: DataFrame) -> DataFrame:
        return (
            _lower_names(df)
            .withColumn(TIME, F.lit(epoch).cast("bigint"))
            .select(*[c.lower() for c in schema.names], TIME, DIFF)
        )

    if upper <= lower:
        empty = spark.createDataFrame([], from_arrow_schema(schema))
        return _Changes(0, lambda: updates(empty.withColumn(DIFF, F.lit(1).cast("bigint"))))
    try:
        added = source.appended_files(lower, upper)
    except ChangeFeedError:
        if not source.cdf_enabled(upper):
            raise
        added = None
    if added is not None:
        partitions = source.partition_columns(upper)
        return _Changes(
            sum(f.num_records or 0 for f in added),
            lambda: updates(
                read_files(spark, added, schema, partitions).withColumn(
                    DIFF, F.lit(1).cast("bigint")
                )
            ),
            appended=(added, schema, partitions),
        )
    if source.column_mapping(upper) is not None:
        changes = delta_feed(spark, source, lower, upper)
    else:
        changes = source.changes(lower, upper)
    changes = changes.drop_columns(["_commit_version"])
    if changes.nbytes > current().keep_feed_bytes:
        return _Changes(changes.num_rows, lambda: updates(spark.createDataFrame(changes)))

    def projected(net: pa.Table) -> DataFrame:
        df = (
            spark.createDataFrame(net)
            if net.num_rows
            else spark.createDataFrame([], from_arrow_schema(net.schema))
        )
        return df.withColumn(TIME, F.lit(epoch).cast("bigint")).select(
            *[c for c in net.column_names if c != DIFF], TIME, DIFF
        )

    return _Changes(
        changes.num_rows,
        lambda: updates(spark.createDataFrame(changes)),
        feed=changes.rename_columns([c.lower() for c in changes.column_names]),
        project=projected,
    )


def source_rows(source: SourceTable, version: int) -> int:
    """Rows in the source's snapshot at ``version``, from the log's file statistics (less
    the rows deletion vectors delete)."""
    deleted = sum(source.deletion_vectors(version).values())
    return sum(f.num_records or 0 for f in source.files(version)) - deleted


_MEMO: OrderedDict[tuple, _Changes] = OrderedDict()
_MEMO_SIZE = 64
_MEMO_LOCK = threading.Lock()


def source_changes_once(
    spark: SparkSession,
    source: SourceTable,
    lower: int | None,
    upper: int,
    epoch: int,
    columns: Sequence[str] | None = None,
) -> DataFrame:
    """:func:`source_changes`, read once per process for every view that needs it; with
    ``columns``, only those (a change feed kept on the driver summed on them there: see
    :meth:`_Changes.frame`).

    The change feed of ``(lower, upper]`` is fixed by the epoch record, so the DataFrame
    built for the first view (for the CDF: delta-rs's read, handed to Spark) serves the rest.
    The key holds the table's id, not only its path: a table deleted and created again at the
    same path starts its versions over with other rows.
    """
    with _MEMO_LOCK:  # views refreshed at once: the first reads, the others wait for it
        return _changes_memo(spark, source, lower, upper, epoch).frame(columns)


def source_change_rows(
    spark: SparkSession, source: SourceTable, lower: int | None, upper: int, epoch: int
) -> int:
    """How many updates :func:`source_changes_once` gives (an update counts twice: its
    pre- and post-image). Reads the change feed on the driver if no view has yet (kept for
    them); hands nothing to Spark."""
    with _MEMO_LOCK:
        return _changes_memo(spark, source, lower, upper, epoch).rows


def source_change_cancels(
    spark: SparkSession,
    source: SourceTable,
    lower: int | None,
    upper: int,
    epoch: int,
    columns: Sequence[str],
) -> bool:
    """Whether the updates :func:`source_changes_once` gives sum to nothing on ``columns``
    (a view reading only those columns sees no change), decided on the driver: True for an
    empty range or a change feed whose updates rewrote other columns only; False when not
    known there (appended files, a snapshot, a feed too large to keep)."""
    with _MEMO_LOCK:
        return _changes_memo(spark, source, lower, upper, epoch).cancels_on(columns)


def source_change_arrow(
    spark: SparkSession,
    source: SourceTable,
    lower: int,
    upper: int,
    epoch: int,
    columns: Sequence[str],
) -> pa.Table | None:
    """The updates :func:`source_changes_once` gives for a non-empty range on ``columns``, as
    Arrow on the driver (``(columns..., _diff)``, all at ``epoch``): the change feed summed on
    them, or the appended files' rows (:meth:`_Changes.rows_on`); None when the driver does
    not hold them."""
    with _MEMO_LOCK:
        return _changes_memo(spark, source, lower, upper, epoch).rows_on(columns)


def _changes_memo(
    spark: SparkSession, source: SourceTable, lower: int | None, upper: int, epoch: int
) -> _Changes:
    """The memo's entry for the range (read now if missing); the caller holds the lock."""
    key = (session_key(spark), source.uri, source.identity(), lower, upper, epoch)
    found = _MEMO.get(key)
    if found is None:
        found = _MEMO[key] = source_changes(spark, source, lower, upper, epoch)
        while len(_MEMO) > _MEMO_SIZE:
            _MEMO.popitem(last=False)
    return found


def _log_stats_between(log_uri: str, lo: int, hi: int) -> list[FileStats]:
    out = []
    for fs in table_file_stats(log_uri, [TIME, DIFF]):
        tmin, tmax = fs.mins.get(TIME), fs.maxs.get(TIME)
        if tmin is not None and tmax is not None and (tmax <= lo or tmin > hi):
            continue
        out.append(fs)
    return out


def log_files_between(log_uri: str, lo: int, hi: int) -> list[DataFile]:
    """Files of a diff log that may hold updates with ``lo < _time <= hi`` (stats pruning)."""
    return [fs.file for fs in _log_stats_between(log_uri, lo, hi)]


def single_time(files: Sequence[FileStats]) -> bool:
    """Whether diff-log files hold, by their statistics, one and the same time. The log is
    consolidated per ``(data, time)`` after the epoch it starts at, so such an epoch's
    updates are then consolidated per data."""
    times = set()
    for fs in files:
        tmin, tmax = fs.mins.get(TIME), fs.maxs.get(TIME)
        if tmin is None or tmin != tmax:
            return False
        times.add(tmin)
    return len(times) == 1


def insertions_only(files: Sequence[FileStats]) -> bool:
    """Whether diff-log files hold, by their statistics, positive diffs only (a view's first
    build, an epoch that only added rows): then their net change deletes nothing."""
    return all(fs.mins.get(DIFF) is not None and fs.mins[DIFF] >= 1 for fs in files)


def view_changes(
    spark: SparkSession, log_uri: str, schema: pa.Schema, lo: int, hi: int
) -> tuple[DataFrame, list[FileStats]]:
    """A view's updates with ``lo < _time <= hi`` from its diff log, and the files opened
    (with their ``_time`` statistics)."""
    files = _log_stats_between(log_uri, lo, hi)
    df = read_files(spark, [fs.file for fs in files], schema)
    return df.where((F.col(TIME) > lo) & (F.col(TIME) <= hi)), files


def view_changes_by_driver(
    files: Sequence[FileStats],
    columns: Sequence[str],
    lo: int,
    hi: int,
    max_bytes: int | None = None,
    *,
    times: bool = False,
) -> pa.Table | None:
    """:func:`view_changes` read by the driver (Arrow, no Spark job): ``(columns..., _diff)``
    of the updates in ``files`` with ``lo < _time <= hi``, as the log stores them (equal rows
    not summed; ``times``: with ``_time`` before ``_diff``). Every row of the files is decoded
    (``count_driver_read``). None, once the rows read hold more than ``max_bytes`` in memory:
    the reading stops there."""
    parts = []
    held = 0
    for fs in files:
        rows = pq.read_table(local_path(fs.file.uri), columns=[*columns, TIME, DIFF])
        count_driver_read(fs.file.uri, rows.num_rows)
        at = rows.column(TIME)
        inside = pc.and_(pc.greater(at, lo), pc.less_equal(at, hi))
        parts.append(rows.filter(inside).select([*columns, *([TIME] if times else []), DIFF]))
        held += parts[-1].nbytes
        if max_bytes is not None and held > max_bytes:
            return None
    if not parts:
        raise InvariantViolation("view_changes_by_driver: no log file to read")
    return pa.concat_tables(parts, promote_options="permissive")


def view_changes_arrow(
    log_uri: str, schema: pa.Schema, lo: int, hi: int, max_bytes: int | None = None
) -> pa.Table | None:
    """A view's updates with ``lo < _time <= hi`` read from its diff log (of ``schema``) by
    the driver, as the log stores them: ``(columns..., _time, _diff)``; None once they hold
    more than ``max_bytes`` (default: the policy's ``keep_feed_bytes``)."""
    if max_bytes is None:
        max_bytes = current().keep_feed_bytes
    columns = [n for n in schema.names if n not in (TIME, DIFF)]
    files = _log_stats_between(log_uri, lo, hi)
    if not files:
        return schema.empty_table()
    return view_changes_by_driver(files, columns, lo, hi, max_bytes, times=True)


def view_state(
    spark: SparkSession,
    table_uri: str,
    table_schema: pa.Schema,
    log_uri: str,
    log_schema: pa.Schema,
    at: int,
    table_epoch: int,
) -> DataFrame:
    """A view's contents at epoch ``at`` as ``+1``-weighted updates at time ``at``."""
    if table_epoch == at:
        df = read_table(spark, table_uri, table_schema)
        return df.withColumn(TIME, F.lit(at).cast("bigint")).withColumn(
            DIFF, F.lit(1).cast("bigint")
        )
    columns = [c for c in log_schema.names if c not in (TIME, DIFF)]
    df, _ = view_changes(spark, log_uri, log_schema, -1, at)
    summed = df.groupBy(*[F.col(f"`{c}`") for c in columns]).agg(F.sum(DIFF).alias(DIFF))
    return (
        summed.where(F.col(DIFF) != 0)
        .withColumn(TIME, F.lit(at).cast("bigint"))
        .select(*[F.col(f"`{c}`") for c in columns], TIME, F.col(DIFF).cast("bigint").alias(DIFF))
    )
