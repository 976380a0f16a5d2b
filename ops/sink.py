"""The table sink: apply a view's net change to its readable table.

Owns how a net change ``(columns..., _diff)`` (consolidated, no zeros) reaches the readable
Delta table: how it is counted first (:func:`sizing`), the files it may delete from (min/max
statistics, then row by row), the one strategy that writes it (:func:`choose`: a
:class:`Choice` naming a :class:`Strategy` and the reason, decided from what is known before
anything is written: the change's size bound, whether it only inserts, whether it replaces
the table, the candidate files' rows, and the policy in force, :func:`ivm.policy.current`),
each strategy's write (one function per :class:`Strategy`), and the one commit. Writing
updates to a diff log is :mod:`ops.log_sink`'s; its names are re-exported here.

Contract in ``(data, time, diff)`` terms: after the epochs ``e1 < ... < en`` are applied the
table holds the multiset ``data -> sum of their diffs``: a row of multiplicity ``n`` appears
``n`` times (each file sorted, no order across files). A change inserts rows by appending
files and deletes rows by rewriting only the files that may hold them, removes and adds in
one transaction carrying ``txn(app_id, epoch)``: an epoch is applied exactly once (a rerun,
or a concurrent refresh that committed it first, changes nothing). Every strategy yields the
same multiset; they differ in who reads and writes (Spark's executors, or the driver in
Arrow) and in how many passes they make. A multiplicity that would go negative is a bug (the
table was changed behind the engine): :class:`~ivm.errors.InvariantViolation`, nothing
committed.
"""

from __future__ import annotations

import enum
import json
import math
import os
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import SparkRuntimeException
from pyspark.sql import Column, DataFrame, Observation, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

import ivm.policy
from ivm.errors import InvariantViolation
from ivm.policy import Policy
from ivm.sql.scope import RESERVED_PREFIX
from ops import DIFF
from ops.ingest import read_files
from ops.log_sink import (
    EXACT_TYPES,
    FLAT_TYPES,
    append_updates,
    arrow_schema,
    collect_flat,
    commit_staged,
    exact_types,
    same_columns,
    stage_updates,
)
from ops.rows import null_safe_matches
from resources.delta_ops import OP, merge_change, quoted
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
    deleted_positions,
    local_path,
    open_table,
    remove_action,
    stage_arrow,
    staging_uri,
    table_file_stats,
    table_lock,
    transaction_version,
)
from resources.vectors import commit_vectors, driver_writable, enable_vectors

SCRATCH = RESERVED_PREFIX
"""The prefix of this module's own column names, which no view column has."""
HELD = f"{SCRATCH}held"
DELETED = f"{SCRATCH}del"

__all__ = [
    "EXACT_TYPES",
    "FLAT_TYPES",
    "Choice",
    "Known",
    "Sizing",
    "Strategy",
    "TableChange",
    "append_updates",
    "apply_to_table",
    "arrow_schema",
    "choose",
    "collect_flat",
    "commit_staged",
    "exact_types",
    "same_columns",
    "sizing",
    "spark_order",
    "stage_updates",
    "without_rows",
]


@dataclass
class TableChange:
    """What :func:`apply_to_table` did, beyond the commit."""

    commit: CommitResult
    inserted: int
    deleted: int
    files_rewritten: int
    rows_rewritten: int
    choice: Choice | None = None
    """The strategy that wrote the change and why; None when nothing was written (the epoch
    was already applied, or the table only moved its epoch)."""


class Strategy(enum.Enum):
    """How a net change is written to the readable table (chosen by :func:`choose`)."""

    INSERT_BY_DRIVER = "insert by the driver"
    """Only insertions, whose rows the driver holds or reads from the log's files: each row
    ``_diff`` times, sorted as Spark sorts, in files of ``table_file_rows`` rows written by
    pyarrow and kept in the driver's file cache; no Spark job, no file rewritten."""
    APPEND_BY_SPARK = "append by Spark"
    """Nothing deleted from the table's files (only insertions, or the whole contents
    replacing every file): Spark writes the inserted rows, sorted, in files of
    ``table_file_rows`` rows (one file, by the driver, when it is a small write)."""
    REWRITE_BY_DRIVER = "rewrite by the driver"
    """Deletions, counted on the driver, from candidate files of at most
    ``driver_rewrite_rows`` rows: the driver rewrites each file holding a deleted row without
    it, one file at a time; no Spark job."""
    REWRITE_BY_SPARK = "rewrite by Spark"
    """Deletions: Spark reads the candidate files once and writes the rows no deletion names,
    in their order, and the inserted rows (counted on the driver: the same scan counts the
    deleted rows' copies; counted by Spark: a join against the deleted rows counts them)."""
    VECTORS_BY_DRIVER = "deletion vectors by the driver"
    """Deletions, counted on the driver, from candidate files of at most
    ``driver_rewrite_rows`` rows it reads (its cache holds them, and a file marked here keeps
    its rows): the positions of exactly the copies deleted are marked in deletion vectors,
    the inserted rows appended, in one commit the driver writes
    (:func:`resources.vectors.commit_vectors`); no file is rewritten, no Spark job. Local
    tables whose features that writer honours."""
    DELETE_BY_VECTORS = "deletion vectors by delta-spark"
    """Deletions marked in deletion vectors, with the inserted rows, by one delta-spark MERGE
    (:func:`resources.delta_ops.merge_change`; the table gets the feature the first time): no
    file is rewritten. A row the table holds more times than the change deletes loses every
    copy and gets the rest back as inserted rows (counted first: by the driver from the
    candidate files, or by one Spark job), so the rows written are the inserted rows plus
    those copies. The MERGE scans the table to find the rows, so its time grows with the
    table (BENCHMARKS.md): the policy keeps rewrites below ``rewrite_copy_rows``."""
    REFUSE = "refuse"
    """Deletions that no file of the table may hold: nothing is written."""


@dataclass(frozen=True)
class Choice:
    """A strategy and why it was chosen (for messages and tests)."""

    strategy: Strategy
    reason: str


class Sizing(enum.Enum):
    """How a change is counted before its strategy is chosen (:func:`sizing`)."""

    NONE = "none"
    """Only insertions: the log files' row counts size it; nothing is read."""
    DRIVER = "driver"
    """Collected once as Arrow: its counts, the deleted rows' range and the files they may
    be in are found on the driver (one Spark job, none when the driver holds the rows)."""
    SPARK = "spark"
    """Cached by Spark, counted by one job, the files found by a join when many remain."""


def sizing(*, overwrite: bool, positive: bool, rows_hint: int | None, policy: Policy) -> Sizing:
    """How a change is counted: not at all when it only inserts (``positive``); on the driver
    when it may delete from the table's files and its size bound is at most
    ``driver_change_rows``; otherwise by Spark.

    >>> sizing(overwrite=False, positive=False, rows_hint=10, policy=Policy())
    <Sizing.DRIVER: 'driver'>
    >>> sizing(overwrite=False, positive=False, rows_hint=10, policy=Policy.spark_only())
    <Sizing.SPARK: 'spark'>
    """
    if positive:
        return Sizing.NONE
    if not overwrite and rows_hint is not None and rows_hint <= policy.driver_change_rows:
        return Sizing.DRIVER
    return Sizing.SPARK


@dataclass(frozen=True)
class Known:
    """What is known of a change and of the table before anything is written."""

    overwrite: bool = False
    """The change is the table's whole new contents: every file is replaced."""
    positive: bool = False
    """Every diff is positive (the log files' statistics say so): nothing is deleted."""
    exact: bool = True
    """Every column has a type the driver writes and compares as Spark does."""
    rows_hint: int | None = None
    """At most how many rows the change holds (its log files' row counts), when known."""
    held: bool = False
    """The driver holds the change's rows (the diff log's epoch it has just written)."""
    readable: bool = False
    """The driver can read the change's rows from its log's files."""
    sized_on_driver: bool = False
    """The change was counted on the driver (:data:`Sizing.DRIVER`), which holds its rows."""
    deleted: int = 0
    """Rows the change deletes."""
    candidates: int = 0
    """Files of the table that may hold a deleted row."""
    candidate_rows: int | None = 0
    """Rows in those files; None when a file's count is unknown."""
    vectored: int = 0
    """Candidate files with a deletion vector (only Delta's reader reads them)."""
    comparable: bool = True
    """Every column compares by ``<=>`` in a MERGE condition (no map)."""
    vector_writer: str | None = None
    """Why the driver cannot commit deletion vectors to the table; None when it can."""


def choose(known: Known, policy: Policy) -> Choice:
    """The strategy that writes a change, and why, from what is known before writing.

    >>> choose(Known(positive=True, readable=True, rows_hint=10), Policy()).strategy
    <Strategy.INSERT_BY_DRIVER: 'insert by the driver'>
    >>> choose(Known(deleted=1, candidates=0), Policy()).strategy
    <Strategy.REFUSE: 'refuse'>
    """
    if known.positive and not known.overwrite:
        why_not = _no_driver_insert(known, policy)
        if why_not is None:
            has = "holds" if known.held else "reads"
            return Choice(Strategy.INSERT_BY_DRIVER, f"only insertions; the driver {has} them")
        return Choice(Strategy.APPEND_BY_SPARK, f"only insertions; {why_not}")
    if known.overwrite:
        return Choice(Strategy.APPEND_BY_SPARK, "the change replaces every file of the table")
    if not known.deleted:
        return Choice(Strategy.APPEND_BY_SPARK, "the change deletes no row")
    if not known.candidates:
        return Choice(Strategy.REFUSE, "no file of the table may hold a deleted row")
    why_not_marked = _no_driver_vectors(known, policy)
    if why_not_marked is None:
        return Choice(
            Strategy.VECTORS_BY_DRIVER,
            f"the driver marks the {known.deleted} deleted rows in the {known.candidates} "
            f"candidate files of {known.candidate_rows} rows",
        )
    if _no_vectors(known, policy) is None:
        return Choice(
            Strategy.DELETE_BY_VECTORS, f"{_why_vectors(known, policy)}; {why_not_marked}"
        )
    why_not = _no_driver_rewrite(known, policy)
    if why_not is None:
        return Choice(
            Strategy.REWRITE_BY_DRIVER,
            f"{known.candidates} candidate files of {known.candidate_rows} rows, at most "
            f"driver_rewrite_rows ({policy.driver_rewrite_rows})",
        )
    return Choice(Strategy.REWRITE_BY_SPARK, why_not)


def _no_vectors(known: Known, policy: Policy) -> str | None:
    """Why deletions rewrite the candidate files rather than mark deletion vectors; None when
    they mark vectors."""
    if known.vectored:
        return None  # such a file is read by Delta alone: no rewrite of ours may read it
    if not policy.deletion_vectors:
        return "the policy keeps deletion vectors off"
    if not known.comparable:
        return "a column (a map) cannot be compared in a MERGE condition"
    if known.candidate_rows is None:
        return "a candidate file's row count is unknown"
    copied = known.candidate_rows - known.deleted
    if copied < policy.rewrite_copy_rows:
        return (
            f"a rewrite copies {copied} rows, under rewrite_copy_rows ({policy.rewrite_copy_rows})"
        )
    return None


def _why_vectors(known: Known, policy: Policy) -> str:
    if known.vectored:
        return f"{known.vectored} candidate files carry deletion vectors"
    copied = (known.candidate_rows or 0) - known.deleted
    limit = policy.rewrite_copy_rows
    return f"a rewrite would copy {copied} rows, rewrite_copy_rows ({limit}) or more"


def _no_driver_vectors(known: Known, policy: Policy) -> str | None:
    """Why the driver does not mark the deletions in deletion vectors itself; None when it
    does: whenever the policy allows vectors, the driver counted the change and can read the
    candidate files (at most ``driver_rewrite_rows`` rows) and commit to the table. Measured
    faster than its rewrite at every size (BENCHMARKS.md, "Readable tables"), and it writes
    only the inserted rows."""
    if not policy.deletion_vectors:
        return "the policy keeps deletion vectors off"
    return _no_driver_rewrite(known, policy) or known.vector_writer


def _no_driver_insert(known: Known, policy: Policy) -> str | None:
    """Why the driver does not write a change of insertions only; None when it does."""
    if not policy.driver:
        return "the policy leaves every write to Spark"
    if not known.exact:
        return "a column's type is left to Spark (floating point, nested)"
    if known.held:
        return None
    if not known.readable or known.rows_hint is None:
        return "the driver can neither hold nor read its rows"
    if known.rows_hint > policy.driver_rewrite_rows:
        return f"{known.rows_hint} rows, over driver_rewrite_rows ({policy.driver_rewrite_rows})"
    return None


def _no_driver_rewrite(known: Known, policy: Policy) -> str | None:
    """Why the driver does not rewrite the candidate files itself; None when it does."""
    if not policy.driver:
        return "the policy leaves every write to Spark"
    if not known.sized_on_driver:
        return "counted by Spark: the driver does not hold the change"
    if not known.exact:
        return "a column's type is left to Spark (floating point, nested)"
    if known.candidate_rows is None:
        return "a candidate file's row count is unknown"
    if known.candidate_rows > policy.driver_rewrite_rows:
        return (
            f"the candidate files hold {known.candidate_rows} rows, over "
            f"driver_rewrite_rows ({policy.driver_rewrite_rows})"
        )
    return None


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
    """Apply a net change ``(columns..., _diff)`` (consolidated, no zeros) to a readable table:
    count it (:func:`sizing`), find the files it may delete from, :func:`choose` a
    :class:`Strategy` under the policy in force and write and commit by it.

    Args:
        net: the change, one row per distinct data with its net diff.
        table_uri: the readable table (created if missing).
        label: the view's name, for messages.
        overwrite: ``net`` is the whole new contents; replace every file in one commit.
        positive: every diff in ``net`` is positive (the caller knows it from the files'
            statistics: a first build, an epoch that only added rows). Nothing is deleted, so
            no file is rewritten and no pass counts the change first: the rows written are
            the rows inserted.
        rows_hint: at most how many rows ``net`` holds (sizes a first build's files; up to
            ``driver_change_rows``, the change is counted and its files found on the driver).
        net_rows: ``net``'s rows, when the driver holds them (the diff log's epoch it has
            just written): a small change is counted from them, not collected again, and a
            ``positive`` one is written by the driver.
        read_net: reads ``net``'s rows on the driver (the log's files, by Arrow), or None
            once they take more than the bytes it is given: a ``positive`` change of at most
            ``driver_rewrite_rows`` rows (by ``rows_hint``) and ``driver_insert_bytes`` is
            written by the driver (:data:`Strategy.INSERT_BY_DRIVER`).

    Raises:
        InvariantViolation: a row would be deleted more times than the table holds it.
    """
    policy = ivm.policy.current()
    how = sizing(overwrite=overwrite, positive=positive, rows_hint=rows_hint, policy=policy)
    if how is Sizing.SPARK:  # read by the counting job, the candidates' join and the write
        net = net.persist()
    try:
        change = _Change.of(net, overwrite, positive, rows_hint, net_rows, read_net)
        table = _Table(spark, table_uri, app_id, epoch, metadata, label)
        sized = _size(how, table, change, policy)
        choice = choose(_known(table, change, sized, how), policy)
        return _STRATEGIES[choice.strategy](table, change, sized, choice, policy)
    finally:
        if how is Sizing.SPARK:
            net.unpersist()


@dataclass(frozen=True)
class _Change:
    """A net change ``(columns..., _diff)`` and what the caller knows of it."""

    net: DataFrame
    columns: tuple[str, ...]
    schema: pa.Schema
    """The table's Arrow schema: the change's columns as their Parquet files hold them."""
    types: Mapping[str, T.DataType]
    overwrite: bool
    positive: bool
    rows_hint: int | None
    net_rows: pa.Table | None
    read_net: Callable[[int], pa.Table | None] | None

    @classmethod
    def of(
        cls,
        net: DataFrame,
        overwrite: bool,
        positive: bool,
        rows_hint: int | None,
        net_rows: pa.Table | None,
        read_net: Callable[[int], pa.Table | None] | None,
    ) -> _Change:
        columns = tuple(c for c in net.columns if c != DIFF)
        types = {f.name: f.dataType for f in net.schema.fields}
        schema = arrow_schema(net, columns)
        return cls(net, columns, schema, types, overwrite, positive, rows_hint, net_rows, read_net)

    @property
    def prunable(self) -> list[str]:
        """The leading columns whose min/max statistics find the files a deletion may hit."""
        leading = self.columns[: ivm.policy.current().prune_columns]
        return [c for c in leading if isinstance(self.types[c], _BOUNDED_TYPES)]


@dataclass(frozen=True)
class _Table:
    """The readable table a change is applied to, and its commit's identity."""

    spark: SparkSession
    uri: str
    app_id: str
    epoch: int
    metadata: Mapping[str, str]
    label: str

    def applied(self) -> bool:
        """Whether the table already holds this epoch (a concurrent refresh committed it)."""
        return (transaction_version(self.uri, self.app_id) or 0) >= self.epoch

    def commit(
        self,
        staged: StagedFiles,
        schema: pa.Schema,
        removes: Sequence[DataFile] = (),
        *,
        overwrite: bool = False,
    ) -> CommitResult:
        """Commit ``staged``'s files and remove ``removes`` in one transaction, once."""
        commit = commit_files(
            self.uri,
            app_id=self.app_id,
            epoch=self.epoch,
            schema=schema,
            adds=staged.adds,
            removes=[remove_action(self.uri, f) for f in removes],
            metadata=self.metadata,
            description=f"ivm view {self.label}: its current rows",
            overwrite=overwrite,
        )
        commit.rows, commit.bytes = staged.rows, staged.bytes
        return commit


@dataclass(frozen=True)
class _Sized:
    """A change's counts and the files it may delete from, found before anything is written."""

    inserted: int
    deleted: int
    candidates: list[DataFile]
    rows: pa.Table | None = None
    """The change, when counted on the driver."""
    deletes: pa.Table | None = None
    """Its deleted rows, when counted on the driver."""
    bounds: Mapping[str, tuple] = field(default_factory=dict)
    """Per prunable column, the deleted rows' lowest and highest value (none NULL)."""

    @property
    def existing_rows(self) -> int:
        """Rows in the candidate files (those of unknown count left out)."""
        return sum(f.num_records or 0 for f in self.candidates)

    @property
    def counted(self) -> bool:
        """Whether every candidate file's row count is known."""
        return all(f.num_records is not None for f in self.candidates)


def _size(how: Sizing, table: _Table, change: _Change, policy: Policy) -> _Sized:
    """Count ``change`` as ``how`` says and find the files its deletions may hit."""
    if how is Sizing.NONE:  # its size is known once written
        return _Sized(change.rows_hint or 0, 0, [])
    rows = deletes = None
    if how is Sizing.DRIVER:
        net = change.net
        rows = net.toArrow() if change.net_rows is None else change.net_rows.select(net.columns)
        inserted, deleted, bounds, deletes = _summary_local(rows, change.prunable)
    else:
        inserted, deleted, bounds = _summary(change.net, change.prunable)
    # Only deletions need to find and rewrite existing files; insertions just append.
    candidates = (
        _candidate_files(table, change, bounds, deletes, policy)
        if deleted and not change.overwrite
        else []
    )
    return _Sized(inserted, deleted, candidates, rows, deletes, bounds)


def _known(table: _Table, change: _Change, sized: _Sized, how: Sizing) -> Known:
    """What :func:`choose` needs of a counted change."""
    return Known(
        overwrite=change.overwrite,
        positive=change.positive,
        exact=exact_types(change.net.schema),
        rows_hint=change.rows_hint,
        held=change.net_rows is not None,
        readable=change.read_net is not None,
        sized_on_driver=how is Sizing.DRIVER,
        deleted=sized.deleted,
        candidates=len(sized.candidates),
        candidate_rows=sized.existing_rows if sized.counted else None,
        vectored=sum(1 for f in sized.candidates if f.deleted),
        comparable=not any(_has_map(f.dataType) for f in change.net.schema.fields),
        vector_writer=driver_writable(table.uri, open_table(table.uri))
        if sized.candidates
        else None,
    )


def _has_map(t: T.DataType) -> bool:
    if isinstance(t, T.MapType):
        return True
    if isinstance(t, T.ArrayType):
        return _has_map(t.elementType)
    if isinstance(t, T.StructType):
        return any(_has_map(f.dataType) for f in t.fields)
    return False


def _prune_condition(delta: DataFrame, stats: DataFrame, columns: Sequence[str]) -> Column:
    """Whether a deleted row (``delta``) lies within a file's min/max (``stats``) in every
    column; a NULL value or statistic prunes nothing."""
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


def _candidate_files(
    table: _Table,
    change: _Change,
    bounds: Mapping[str, tuple],
    local: pa.Table | None,
    policy: Policy,
) -> list[DataFile]:
    """Files of the table that may hold some deleted row: first by the deleted rows' range
    against each file's min/max statistics (on the driver); when ``per_row_prune_files`` or
    more remain, by each deleted row against them (``local``, the deleted rows on the driver:
    there; otherwise a broadcast join by Spark)."""
    prune = list(change.columns[: ivm.policy.current().prune_columns])
    files = [f for f in table_file_stats(table.uri, prune) if _may_hold(f, bounds)]
    with_stats = [c for c in prune if any(c in f.mins for f in files)]
    if len(files) < policy.per_row_prune_files or not with_stats:
        return [f.file for f in files]
    if local is not None:
        return [f.file for f in files if _rows_may_hit(f, local, with_stats)]
    deletes = change.net.where(F.col(DIFF) < 0)
    return _files_hit_by_spark(table.spark, files, deletes, with_stats)


def _files_hit_by_spark(
    spark: SparkSession, files: Sequence[FileStats], deletes: DataFrame, with_stats: Sequence[str]
) -> list[DataFile]:
    """The ``files`` within whose min/max some deleted row lies, by a broadcast join of the
    deleted rows with the files' statistics."""
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


def _append_by_spark(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.APPEND_BY_SPARK`: the inserted rows (when overwriting, the whole
    contents: a deletion in them is a bug the write refuses), each ``_diff`` times, sorted,
    in files of ``table_file_rows`` rows by range of the first column; a small write (at
    most ``driver_change_rows`` rows) as one file, by the driver."""
    cols = [F.col(f"`{c}`") for c in change.columns]
    inserts = change.net if change.overwrite else change.net.where(F.col(DIFF) > 0)
    rows = _copies(inserts.select(*cols, _checked(cols)), cols, F.col(DIFF))
    n_files = max(1, math.ceil(sized.inserted / policy.table_file_rows))
    if cols and n_files > 1:
        rows = rows.repartitionByRange(n_files, cols[0]).sortWithinPartitions(*cols)
    else:
        rows = rows.coalesce(1).sortWithinPartitions(*cols) if cols else rows.coalesce(1)
    small = (
        not change.overwrite
        and change.rows_hint is not None
        and change.rows_hint <= policy.driver_change_rows
    )
    staged = _stage_by_spark(table, change, rows, small=small)
    if isinstance(staged, _Short):
        return _refused(table, staged)
    inserted, expected = sized.inserted, sized.inserted - sized.deleted
    if change.positive:  # nothing deleted: every row written was inserted
        inserted = expected = staged.rows
    if staged.rows != expected:
        return _miscounted(table, change, [], staged.rows, expected)
    commit = table.commit(staged, change.schema, overwrite=change.overwrite)
    return TableChange(commit, inserted, sized.deleted, 0, 0, choice)


def _rewrite_by_spark(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.REWRITE_BY_SPARK`: the candidate files' rows that no deletion names,
    in their order, then the inserted rows and the ``held - deleted`` copies of the deleted
    ones (:func:`_rows_after`), written by Spark (as one file by the driver when at most
    ``driver_change_rows`` rows); the candidate files are removed in the same commit."""
    rows, held = _rows_after(table.spark, change, sized)
    small = (
        change.rows_hint is not None
        and sized.counted
        and sized.existing_rows + change.rows_hint <= policy.driver_change_rows
    )
    staged = _stage_by_spark(table, change, rows, small=small)
    if isinstance(staged, _Short):
        return _refused(table, staged)
    if held is not None:
        kept, short = held.kept(change.columns)
        if short is not None:
            return _refused(table, short)
        if kept is not None:  # copies of rows held more times than deleted
            staged = _with_kept(table, change, staged, kept)
    expected = sized.existing_rows + sized.inserted - sized.deleted
    if staged.rows != expected and sized.counted:
        return _miscounted(table, change, sized.candidates, staged.rows, expected)
    commit = table.commit(staged, change.schema, sized.candidates)
    return TableChange(
        commit, sized.inserted, sized.deleted, len(sized.candidates), sized.existing_rows, choice
    )


def _delete_by_vectors(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.DELETE_BY_VECTORS`: under the table's lock, the copies the table holds
    of each deleted row counted (:func:`_held_copies`), then one MERGE deletes them and
    inserts the inserted rows and the copies held beyond those deleted; Delta's metrics of
    the MERGE must say the same."""
    spark, uri = table.spark, table.uri
    target = _target_filter(change, sized.bounds)
    with table_lock(uri):
        if table.applied():
            return _already_applied(table)
        kept, short = _held_copies(table, change, sized, target, policy)
        if short is not None:
            return _refused(table, short)
        enable_vectors(uri)
        crash_point("vectors_enabled")
        commit, metrics = merge_change(
            spark,
            uri,
            _merge_source(table, change, sized, kept),
            change.columns,
            app_id=table.app_id,
            epoch=table.epoch,
            metadata=table.metadata,
            target_filter=target,
            local=sized.rows is not None,
        )
    if metrics is None:
        return _already_applied(table)
    copies = 0 if kept is None else kept.num_rows
    if (metrics.deleted, metrics.inserted) != (sized.deleted + copies, sized.inserted + copies):
        raise InvariantViolation(
            f"view {table.label!r} epoch {table.epoch}: the MERGE deleted {metrics.deleted} and "
            f"inserted {metrics.inserted} rows, expected {sized.deleted + copies} and "
            f"{sized.inserted + copies}: run `ivm verify --repair {table.label}`"
        )
    rewritten = copies + metrics.copied
    return TableChange(commit, sized.inserted, sized.deleted, 0, rewritten, choice)


def _vectors_by_driver(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.VECTORS_BY_DRIVER`: under the table's lock, the positions of the
    copies each deleted row loses found in the candidate files (:func:`_marked`), the
    inserted rows written as one new file, and both committed by the driver in one commit
    (:func:`resources.vectors.commit_vectors`). The files marked keep their bytes, so the
    driver's cache of them stays valid."""
    if sized.rows is None:
        raise InvariantViolation(f"view {table.label!r}: driver deletions of rows it does not hold")
    rows = sized.rows.select([*change.columns, DIFF])
    with table_lock(table.uri):
        if table.applied():
            return _already_applied(table)
        marked, short = _marked(table, sized.candidates, rows, change.schema, change.columns)
        if short is not None:
            return _refused(table, short)
        enable_vectors(table.uri)
        crash_point("vectors_enabled")
        staged_uri = staging_uri(table.uri, table.epoch, "rows")
        fresh = _each_copy(
            rows.filter(pc.greater(rows.column(DIFF), 0)), change.columns, change.schema
        )
        if fresh.num_rows:
            fresh = fresh.sort_by(spark_order(change.columns))
            _keep_written(stage_arrow(staged_uri, fresh), change.schema, fresh)
        staged = collect_staged(table.uri, staged_uri)
        crash_point("vectors_staged")
        commit = commit_vectors(
            table.uri,
            app_id=table.app_id,
            epoch=table.epoch,
            deletions=marked,
            adds=staged.adds,
            metadata=table.metadata,
        )
    commit.rows, commit.bytes = staged.rows, staged.bytes
    if not commit.committed:
        return _already_applied(table)
    return TableChange(commit, sized.inserted, sized.deleted, 0, 0, choice)


def _marked(
    table: _Table,
    candidates: Sequence[DataFile],
    change: pa.Table,
    schema: pa.Schema,
    columns: Sequence[str],
) -> tuple[dict[str, np.ndarray], _Short | None]:
    """The positions to mark deleted, by candidate file (relative to the table): of each
    deleted row (``change``'s negative diffs), exactly as many live copies as it loses, the
    first ones in the files' order; the rows a deletion vector already deletes are not
    copies. With the first row deleted more times than the candidates hold it (nothing to
    mark then)."""
    deletes = change.filter(pc.less(change.column(DIFF), 0))
    wanted = deletes.select(list(columns)).cast(schema)
    gone = deleted_positions(table.uri, candidates)
    keys, files, positions = [], [], []
    for i, f in enumerate(candidates):
        rows, decoded = FILES.read(local_path(f.uri), schema)
        if decoded:
            count_driver_read(f.uri, rows.num_rows)
        pairs = null_safe_matches(rows, wanted, columns)
        found = pairs.column("_row").to_numpy()
        live = ~np.isin(found, gone.get(local_path(f.uri), ()))
        keys.append(pairs.column("_key").to_numpy()[live])
        positions.append(found[live])
        files.append(np.full(int(live.sum()), i))
    key, file, position = (
        np.concatenate(a) if a else np.empty(0, np.int64) for a in (keys, files, positions)
    )
    need = -deletes.column(DIFF).to_numpy()
    _, short = _kept_copies(deletes, np.bincount(key, minlength=len(need)), columns)
    if short is not None:
        return {}, short
    order = np.argsort(key, kind="stable")  # each key's copies in the files' order
    ranked = key[order]
    rank = np.arange(len(ranked)) - np.searchsorted(ranked, ranked, side="left")
    chosen = order[rank < need[ranked]]
    root = local_path(table.uri).rstrip("/")
    marked: dict[str, np.ndarray] = {}
    for i in np.unique(file[chosen]):
        path = os.path.relpath(local_path(candidates[i].uri), root)
        marked[path] = np.sort(position[chosen][file[chosen] == i])
    return marked, None


def _held_copies(
    table: _Table, change: _Change, sized: _Sized, target: str | None, policy: Policy
) -> tuple[pa.Table | None, _Short | None]:
    """The copies of deleted rows the table holds beyond those deleted (to insert again),
    and the first row it holds fewer times than deleted: counted by the driver from the
    candidate files when it holds the deleted rows and the files' rows are at most
    ``driver_rewrite_rows`` (:func:`_held_by_driver`), else by Spark
    (:func:`_held_by_spark`)."""
    small = sized.counted and sized.existing_rows <= policy.driver_rewrite_rows
    if sized.deletes is not None and policy.driver and small and exact_types(change.net.schema):
        deletes = sized.deletes.select([*change.columns, DIFF])
        return _kept_copies(deletes, _held_by_driver(table, change, sized), change.columns)
    return _held_by_spark(table, change, sized, target, policy)


def _held_by_driver(table: _Table, change: _Change, sized: _Sized) -> np.ndarray:
    """Per deleted row of ``sized.deletes``, the copies the candidate files hold: each file
    read by the driver (its cache of decoded files), the rows its deletion vector deletes
    left out; no Spark job."""
    assert sized.deletes is not None
    wanted = sized.deletes.select(list(change.columns)).cast(change.schema)
    held = np.zeros(wanted.num_rows, dtype=np.int64)
    gone = deleted_positions(table.uri, sized.candidates)
    for f in sized.candidates:
        path = local_path(f.uri)
        rows, decoded = FILES.read(path, change.schema)
        if decoded:
            count_driver_read(f.uri, rows.num_rows)
        pairs = null_safe_matches(rows, wanted, change.columns)
        keys = pairs.column("_key").to_numpy()
        if path in gone and len(keys):
            keys = keys[~np.isin(pairs.column("_row").to_numpy(), gone[path])]
        held += np.bincount(keys, minlength=len(held))
    return held


def _held_by_spark(
    table: _Table, change: _Change, sized: _Sized, target: str | None, policy: Policy
) -> tuple[pa.Table | None, _Short | None]:
    """:func:`_held_copies` by one Spark job: the table's rows (Delta's reader; ``target``
    skips files) joined with the deleted rows, only the rows whose count differs from the
    deletion brought back."""
    spark, columns = table.spark, change.columns
    keyed, matches = _named(_deleted_rows(table, change, sized), columns)
    rows = spark.read.format("delta").load(table.uri).alias("t")
    if target is not None:
        rows = rows.where(F.expr(target))
    if sized.deleted <= policy.driver_change_rows:
        keyed = F.broadcast(keyed)
    keys = [f"{SCRATCH}k{i}" for i in range(len(columns))]
    held = (
        rows.join(keyed, matches)
        .groupBy(*keys)
        .agg(F.count(F.lit(1)).alias(HELD))
        .select(*[F.col(k).alias(f"{SCRATCH}h{k}") for k in keys], HELD)
    )
    same = F.lit(True)
    for k in keys:
        same = same & F.col(k).eqNullSafe(F.col(f"{SCRATCH}h{k}"))
    found = (
        keyed.join(held, same, "left")
        .select(*keys, DELETED, F.coalesce(F.col(HELD), F.lit(0)).alias(HELD))
        .where(F.col(HELD) != F.col(DELETED))
        .toArrow()
    )
    deletes = found.select(keys).rename_columns(list(columns))
    deletes = deletes.append_column(DIFF, pc.negate(found.column(DELETED)))
    return _kept_copies(deletes, found.column(HELD).to_pylist(), columns)


def _deleted_rows(table: _Table, change: _Change, sized: _Sized) -> DataFrame:
    """The change's deleted rows ``(columns..., _diff)``: from the driver's copy when it
    counted them (no second read of the change), else from the change."""
    if sized.deletes is None:
        return change.net.where(F.col(DIFF) < 0)
    return _local_rows(table, change, sized.deletes, [*change.columns, DIFF])


def _local_rows(
    table: _Table, change: _Change, rows: pa.Table, columns: Sequence[str]
) -> DataFrame:
    """Rows the driver holds as a Spark DataFrame of the change's types."""
    types = {**change.types, DIFF: T.LongType()}
    df = table.spark.createDataFrame(rows.select(list(columns)))
    return df.select(*[F.col(f"`{c}`").cast(types[c]).alias(c) for c in columns])


def _merge_source(
    table: _Table, change: _Change, sized: _Sized, kept: pa.Table | None
) -> DataFrame:
    """The MERGE's source: each deleted row once as ``D``; each inserted row ``_diff`` times,
    and ``kept``'s rows, as ``I``."""
    cols = [F.col(f"`{c}`") for c in change.columns]
    net = (
        change.net
        if sized.rows is None
        else _local_rows(table, change, sized.rows, [*change.columns, DIFF])
    )
    deletes = net.where(F.col(DIFF) < 0).select(*cols, F.lit("D").alias(OP))
    inserts = _copies(net.where(F.col(DIFF) > 0), cols, F.col(DIFF)).select(
        *cols, F.lit("I").alias(OP)
    )
    source = deletes.unionByName(inserts)
    if kept is not None:
        again = _local_rows(table, change, kept, change.columns)
        source = source.unionByName(again.select(*cols, F.lit("I").alias(OP)))
    return source


def _target_filter(change: _Change, bounds: Mapping[str, tuple]) -> str | None:
    """A SQL condition on the table's rows (as ``t``) that every deleted row meets: each
    prunable column within the deleted rows' range (Delta skips the files outside it)."""
    parts = []
    for c, (lo, hi) in bounds.items():
        low, high = _sql_literal(lo, change.types[c]), _sql_literal(hi, change.types[c])
        if low is not None and high is not None:
            parts.append(f"t.{quoted(c)} BETWEEN {low} AND {high}")
    return " AND ".join(parts) or None


def _sql_literal(value: object, dtype: T.DataType) -> str | None:
    r"""``value`` as a Spark SQL literal of ``dtype`` (integers, decimals, dates, strings);
    None for another type.

    >>> print(_sql_literal("it's", T.StringType()))
    'it\'s'
    >>> _sql_literal(__import__("decimal").Decimal("1E+2"), T.DecimalType(10, 2))
    "CAST('100' AS decimal(10,2))"
    """
    if isinstance(dtype, T.StringType) and isinstance(value, str):
        return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"
    if isinstance(dtype, (T.ByteType, T.ShortType, T.IntegerType, T.LongType)):
        return str(int(value))  # type: ignore[call-overload]
    if isinstance(dtype, T.DecimalType):
        return f"CAST('{format(value, 'f')}' AS {dtype.simpleString()})"
    if isinstance(dtype, T.DateType) and isinstance(value, date):
        return f"DATE'{value.isoformat()}'"
    return None


def _stage_by_spark(
    table: _Table, change: _Change, rows: DataFrame, *, small: bool
) -> StagedFiles | _Short:
    """Stage the rows a Spark strategy writes (``small``: few enough for the driver to write
    as one file, sorted as each file of the table is), or the row :func:`_checked` refused
    when the write failed on one. Any other failure propagates."""
    if small and change.columns:
        rows = rows.coalesce(1).sortWithinPartitions(*[F.col(f"`{c}`") for c in change.columns])
    try:
        return stage_updates(rows, table.uri, table.epoch, "rows", small=small)
    except SparkRuntimeException as error:
        short = _refused_row(error)
        if short is None:
            raise
        return short


def _with_kept(table: _Table, change: _Change, staged: StagedFiles, kept: pa.Table) -> StagedFiles:
    """``staged`` and, staged with it, ``kept``: the copies of deleted rows the table held
    more times than deleted, which the one-scan rewrite left out (:class:`_Held`)."""
    more = stage_updates(
        table.spark.createDataFrame(kept).select(
            *[F.col(f"`{c}`").cast(change.types[c]) for c in change.columns]
        ),
        table.uri,
        table.epoch,
        "kept",
        small=True,
    )
    return StagedFiles(
        staged.adds + more.adds, staged.rows + more.rows, staged.bytes + more.bytes, staged.schema
    )


def _named(
    deletes: DataFrame, columns: Sequence[str], extra: Sequence[str] = ()
) -> tuple[DataFrame, Column]:
    """The deleted rows with their columns renamed ``_ivm_k<i>`` and ``-_diff`` as
    ``_ivm_del`` (and
    the ``extra`` columns as they are), and the condition matching a row of the table to one
    of them (NULL-safe, every column)."""
    keyed = deletes.select(
        *[F.col(f"`{c}`").alias(f"{SCRATCH}k{i}") for i, c in enumerate(columns)],
        (-F.col(DIFF)).alias(DELETED),
        *extra,
    )
    cond = F.lit(True)
    for i, c in enumerate(columns):
        cond = cond & F.col(f"`{c}`").eqNullSafe(F.col(f"{SCRATCH}k{i}"))
    return keyed, cond


def _copies(df: DataFrame, cols: Sequence[Column], n: Column) -> DataFrame:
    """Each row ``n`` times (``n`` >= 0)."""
    repeated = F.explode(F.array_repeat(F.lit(1), n.cast("int"))).alias(f"{SCRATCH}copy")
    return df.select(*cols, repeated).select(*cols)


@dataclass
class _Held:
    """A rewrite's count of the deleted rows its files hold, taken in the same scan as the
    rows it keeps (an observed metric of the write's query): for deleted row ``i`` of the
    driver's copy, the candidate files' copies of it are ``ids.count(i)``."""

    deletes: pa.Table
    observation: Observation

    def kept(self, columns: Sequence[str]) -> tuple[pa.Table | None, _Short | None]:
        """The copies of deleted rows to write back (``held - deleted`` of each), and the
        first row deleted more times than held."""
        found = self.observation.get["ids"]
        held = Counter(int(i) for i in found.split(",")) if found else Counter()
        return _kept_copies(
            self.deletes, [held.get(i, 0) for i in range(len(self.deletes))], columns
        )


def _kept_copies(
    deletes: pa.Table, held: Sequence[int], columns: Sequence[str]
) -> tuple[pa.Table | None, _Short | None]:
    """Given ``held[i]``, the copies the table holds of deleted row ``i`` (``deletes``:
    ``(columns..., _diff)``, negative diffs), the copies to write back (``held - deleted`` of
    each; None when none), and the first row deleted more times than held."""
    left = np.asarray(held, dtype=np.int64) + deletes.column(DIFF).to_numpy()
    short = np.flatnonzero(left < 0)
    if len(short):
        i = int(short[0])
        row = {c: deletes.column(c)[i].as_py() for c in columns}
        return None, _Short(int(left[i]), str(row))
    if not left.any():
        return None, None
    repeat = pa.array(np.repeat(np.arange(len(left)), left), pa.int64())
    return deletes.select(list(columns)).take(repeat), None


def _rows_after(
    spark: SparkSession, change: _Change, sized: _Sized
) -> tuple[DataFrame, _Held | None]:
    """The rows a Spark rewrite writes: the candidate files' rows minus the deleted ones, and
    the inserted.

    A candidate file's rows that no deletion names pass through in their order (a join
    against the deleted rows, broadcast when few), so each rewritten file stays sorted and no
    row of the table is shuffled. Rows a deletion names are counted and kept ``held -
    deleted`` times; a negative count stops the write with :data:`NEGATIVE` and the row. The
    inserted and kept rows go to one new file, sorted. A deletion of a row no candidate file
    holds leaves the written count too high: the caller compares it with what it expects.

    A change counted on the driver (``sized.deletes``): the candidate files are read once,
    not twice (:func:`_rows_after_local`). Every row a deletion names is left out, and the
    scan counts them per deleted row as it goes (the returned :class:`_Held`); the caller
    writes back the ``held - deleted`` copies (none when the table's rows are distinct) and
    refuses a negative count before committing.
    """
    columns = change.columns
    cols = [F.col(f"`{c}`") for c in columns]
    inserts = change.net.where(F.col(DIFF) > 0)
    existing = read_files(spark, sized.candidates, change.schema)
    if sized.deletes is not None:
        return _rows_after_local(spark, existing, inserts, sized.deletes, change.types, columns)
    keyed, matches = _named(change.net.where(F.col(DIFF) < 0), columns)
    if sized.deleted <= ivm.policy.current().broadcast_deletes:
        keyed = F.broadcast(keyed)
    untouched = existing.join(keyed, matches, "left_anti")
    held = (
        existing.join(keyed, matches, "left_semi").groupBy(*cols).agg(F.count(F.lit(1)).alias(HELD))
    )
    kept = held.join(keyed, matches).select(*cols, (F.col(HELD) - F.col(DELETED)).alias(DIFF))
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


def _rewrite_by_driver(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.REWRITE_BY_DRIVER`: the candidate files rewritten by the driver
    (:func:`_rewrite_files`); only the files holding a deleted row are replaced."""
    if sized.rows is None:
        raise InvariantViolation(f"view {table.label!r}: a driver rewrite of rows it does not hold")
    rewrite = _rewrite_files(table, sized.candidates, sized.rows, change.schema, change.columns)
    if rewrite.short is not None:
        return _refused(table, rewrite.short)
    rewritten = sum(f.num_records or 0 for f in rewrite.replaced)
    expected = rewritten + sized.inserted - sized.deleted
    if rewrite.staged.rows != expected:
        raise InvariantViolation(
            f"view {table.label!r} epoch {table.epoch}: wrote {rewrite.staged.rows} rows, "
            f"expected {expected} (the files' row counts disagree with their rows)"
        )
    commit = table.commit(rewrite.staged, change.schema, rewrite.replaced)
    FILES.discard(local_path(f.uri) for f in rewrite.replaced)
    return TableChange(
        commit, sized.inserted, sized.deleted, len(rewrite.replaced), rewritten, choice
    )


@dataclass
class _Rewrite:
    """What :func:`_rewrite_files` staged: the files it replaced (those holding a deleted
    row) and the first row deleted more times than held."""

    staged: StagedFiles
    replaced: list[DataFile]
    short: _Short | None = None


def _rewrite_files(
    table: _Table,
    candidates: Sequence[DataFile],
    change: pa.Table,
    schema: pa.Schema,
    columns: Sequence[str],
) -> _Rewrite:
    """:func:`_rows_after` and its write, by the driver with no Spark job, for a change it
    holds (``(columns..., _diff)``, consolidated) and candidate files it can read.

    Each candidate file is read whole (their rows are at most ``driver_rewrite_rows``; from
    the driver's cache of decoded files when it holds them: the files written here go to it,
    :func:`_keep_written`), its rows that a deletion names (NULL equal to NULL, every column)
    are counted per deleted row and left out, and the rest are written back as one file in
    their order; peak memory is one file's rows. A candidate holding no deleted row is left
    as it is (it is not replaced). The inserted rows and the
    ``held - deleted`` copies of rows held more often than deleted go to one new file, sorted
    as Spark sorts (NULLs first). A row deleted more times than the candidates hold it is
    returned as ``short``, with nothing to commit (the files staged so far are left for
    vacuum, as a refused Spark write leaves its own)."""
    change = change.select([*columns, DIFF])
    diffs = change.column(DIFF)
    deletes = change.filter(pc.less(diffs, 0))
    wanted = deletes.select(list(columns)).cast(schema)
    held = np.zeros(deletes.num_rows, dtype=np.int64)
    staged_uri = staging_uri(table.uri, table.epoch, "rows")
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
    return _Rewrite(collect_staged(table.uri, staged_uri), replaced)


def without_rows(rows: pa.Table, positions: np.ndarray) -> pa.Table:
    """``rows`` without those at ``positions`` (ascending), in their order: the slices of
    ``rows`` between them, which copy nothing, while that leaves at most
    :data:`resources.filecache.MAX_CHUNKS` chunks in a column; else one filtered copy
    (one chunk per column again).

    A rewrite deletes a few rows from each file of millions: a filter reads and writes every
    byte of the file, the slices none, and the Parquet writer encodes them as fast.
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
    nothing."""
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
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.INSERT_BY_DRIVER`: the change's rows, held by the driver, none (no
    log file holds a row), or read from the log's files, written by the driver
    (:func:`_write_insertions`). A read that passes ``driver_insert_bytes`` stops, and Spark
    appends the change (:data:`Strategy.APPEND_BY_SPARK`): wide rows are bounded by their
    size, which is known only while reading them."""
    if change.net_rows is not None:
        rows = change.net_rows.select(change.net.columns)
    elif change.rows_hint == 0:  # no log file holds a row
        rows = change.schema.empty_table().append_column(DIFF, pa.array([], pa.int64()))
    else:
        read = change.read_net
        rows = read(policy.driver_insert_bytes) if read is not None else None
    if rows is None:
        bytes_ = policy.driver_insert_bytes
        handed = Choice(
            Strategy.APPEND_BY_SPARK, f"only insertions, over driver_insert_bytes ({bytes_})"
        )
        return _append_by_spark(table, change, sized, handed, policy)
    return _write_insertions(table, change, rows, choice, policy)


def _write_insertions(
    table: _Table, change: _Change, rows: pa.Table, choice: Choice, policy: Policy
) -> TableChange:
    """Write ``rows``, a change that only inserts (``(columns..., _diff)``, every diff
    positive), by the driver with no Spark job: each row ``_diff`` times, sorted as Spark
    sorts (NULLs first), in files of ``table_file_rows`` rows, appended in one commit. As
    Spark's write of a first build, whose files hold ranges of the first column, each file
    here holds a range of the sort order. The files go to the driver's cache as the
    rewrites' do (:func:`_keep_written`): the first refresh after a build decodes none."""
    where = f"view {table.label!r} epoch {table.epoch}"
    diffs = rows.column(DIFF)
    if len(diffs) and pc.min(diffs).as_py() < 1:
        raise InvariantViolation(
            f"{where}: a change read as insertions only holds a diff of {pc.min(diffs).as_py()}"
        )
    columns, schema = change.columns, change.schema
    copies = _each_copy(rows, columns, schema)
    if columns:
        copies = copies.sort_by(spark_order(columns))
    staged_uri = staging_uri(table.uri, table.epoch, "rows")
    per_file = policy.table_file_rows
    for start in range(0, copies.num_rows, per_file):
        part = copies.slice(start, per_file)
        _keep_written(stage_arrow(staged_uri, part), schema, part)
    crash_point("staged")
    staged = collect_staged(table.uri, staged_uri)
    if staged.rows != copies.num_rows:
        raise InvariantViolation(f"{where}: staged {staged.rows} rows, expected {copies.num_rows}")
    description = f"ivm view {table.label}: its current rows"
    commit = commit_staged(
        staged, table.uri, table.app_id, table.epoch, schema, table.metadata, description
    )
    return TableChange(commit, copies.num_rows, 0, 0, 0, choice)


def _checked(cols: Sequence[Column]) -> Column:
    """``_diff``, or the write's failure naming the row when it is negative: Spark's
    ``raise_error`` with :data:`NEGATIVE` and, as JSON, the multiplicity and the row (as
    Spark's ``to_json`` gives it), decoded by :func:`_refused_row`."""
    payload = F.to_json(
        F.struct(F.col(DIFF).alias("multiplicity"), F.to_json(F.struct(*cols)).alias("row"))
    )
    return (
        F.when(F.col(DIFF) < 0, F.raise_error(F.concat(F.lit(f"{NEGATIVE}: "), payload)))
        .otherwise(F.col(DIFF))
        .alias(DIFF)
    )


NEGATIVE = "ivm: negative multiplicity"
"""Marker of the error the table write raises when a row would be deleted more times than
the table holds it."""

RAISED = "USER_RAISED_EXCEPTION"
"""Spark's error condition for a query failed by ``raise_error``."""


def _refused_row(error: SparkRuntimeException) -> _Short | None:
    """The row :func:`_checked` refused, when ``error`` is that refusal; None for any other.

    Spark fails such a query with :class:`~pyspark.errors.SparkRuntimeException` (classic
    and Spark Connect alike), condition :data:`RAISED`, the message given to
    ``raise_error`` as its ``errorMessage`` parameter. Class and condition are shared with
    any other ``raise_error``, so the one message parameter is read: it is ours when it
    starts with :data:`NEGATIVE`, and then its JSON payload is the multiplicity and the row.
    """
    if error.getCondition() != RAISED:
        return None
    message = (error.getMessageParameters() or {}).get("errorMessage", "")
    marker = f"{NEGATIVE}: "
    if not message.startswith(marker):
        return None
    payload = json.loads(message[len(marker) :])
    return _Short(payload["multiplicity"], payload["row"])


@dataclass(frozen=True)
class _Short:
    """A row deleted more times than the table holds it: the multiplicity it would have,
    and the row (as text, for the message)."""

    multiplicity: object
    example: str


def _refuse(
    table: _Table, change: _Change, sized: _Sized, choice: Choice, policy: Policy
) -> TableChange:
    """:data:`Strategy.REFUSE`: rows are to be deleted and no file of the table may hold
    them; one of them names the refusal."""
    if table.applied():
        return _already_applied(table)
    bad = change.net.where(F.col(DIFF) < 0).limit(1).collect()
    example = bad[0].asDict() if bad else {}
    raise _negative(table, example.pop(DIFF, "?"), str(example))


def _refused(table: _Table, short: _Short) -> TableChange:
    """A write found a row deleted more times than held: nothing is committed, and the error
    names it, unless a concurrent refresh committed this epoch meanwhile."""
    if table.applied():
        return _already_applied(table)
    raise _negative(table, short.multiplicity, short.example)


def _miscounted(
    table: _Table, change: _Change, candidates: Sequence[DataFile], written: int, expected: int
) -> TableChange:
    """A Spark write wrote more rows than expected: some deleted row is in none of the files
    read. The error names it (or, when none is found, the counts)."""
    if table.applied():
        return _already_applied(table)
    keyed, matches = _named(change.net.where(F.col(DIFF) < 0), change.columns)
    existing = read_files(table.spark, candidates, change.schema)
    bad = keyed.join(existing, matches, "left_anti").limit(1).collect()
    if bad:
        example = {c: bad[0][f"{SCRATCH}k{i}"] for i, c in enumerate(change.columns)}
        raise _negative(table, -bad[0][DELETED], str(example))
    raise InvariantViolation(
        f"view {table.label!r} epoch {table.epoch}: wrote {written} rows, expected {expected}"
    )


def _already_applied(table: _Table) -> TableChange:
    """A concurrent refresh committed this epoch to the table while we computed: the files
    we merged with already hold it. Nothing to do (exactly once)."""
    commit = CommitResult(table.uri, table.epoch, committed=False, version=None)
    return TableChange(commit, 0, 0, 0, 0)


def _negative(table: _Table, multiplicity: object, example: str) -> InvariantViolation:
    label = table.label
    return InvariantViolation(
        f"view {label!r} epoch {table.epoch}: deleting a row the table does not hold "
        f"(multiplicity would be {multiplicity}): {example}; its state or "
        f"table was changed behind the engine: run `ivm verify --repair {label}`"
    )


_STRATEGIES: dict[Strategy, Callable[[_Table, _Change, _Sized, Choice, Policy], TableChange]] = {
    Strategy.INSERT_BY_DRIVER: _insert_by_driver,
    Strategy.APPEND_BY_SPARK: _append_by_spark,
    Strategy.REWRITE_BY_DRIVER: _rewrite_by_driver,
    Strategy.REWRITE_BY_SPARK: _rewrite_by_spark,
    Strategy.VECTORS_BY_DRIVER: _vectors_by_driver,
    Strategy.DELETE_BY_VECTORS: _delete_by_vectors,
    Strategy.REFUSE: _refuse,
}
"""The function writing each strategy's change."""
