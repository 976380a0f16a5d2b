"""The readable table's sink on the real stack: a net change applied to a Delta table with
several files rewrites only the files that may hold a deleted row, keeps them sorted, counts
duplicates and NULLs exactly, and refuses deletions of rows the table does not hold. Each
runs the three ways a change reaches the table: sized and its files found by Spark jobs;
sized on the driver (a change whose size bound is at most the policy's
``driver_change_rows``) and rewritten by Spark; sized and rewritten by the driver (candidate
files of at most ``driver_rewrite_rows`` rows). Which strategy wrote each change is asserted
too (``TableChange.choice``), and :func:`ops.sink.choose` is checked on its own."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from zoneinfo import ZoneInfo

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, QueryBuilder

import ivm.policy
import ops.sink
from ivm.errors import InvariantViolation
from ivm.policy import Policy
from ops import DIFF
from ops.sink import Known, Sizing, Strategy, apply_to_table, choose, sizing
from resources.lake import snapshot_rows, table_files
from tests.lakegen import parquet_writers

pytestmark = pytest.mark.spark

S = pa.schema([("k", pa.int64()), ("name", pa.string())])


def net_change(spark, *rows: tuple[int | None, str | None, int]):
    table = pa.Table.from_pylist(
        [{"k": k, "name": n, DIFF: d} for k, n, d in rows],
        schema=S.append(pa.field(DIFF, pa.int64())),
    )
    return spark.createDataFrame(table)


def apply_arrow(spark, uri: str, epoch: int, table: pa.Table, **options):
    """Apply a change held as Arrow (``(columns..., _diff)``) to the table at ``uri``."""
    return apply_to_table(
        spark,
        spark.createDataFrame(table),
        uri,
        app_id="test",
        epoch=epoch,
        metadata={},
        label="v",
        **options,
    )


def apply(spark, uri: str, epoch: int, *rows, overwrite: bool = False, local: bool = False):
    """``local``: the caller bounds the change's size, so it is examined on the driver."""
    return apply_to_table(
        spark,
        net_change(spark, *rows),
        uri,
        app_id="test",
        epoch=epoch,
        metadata={},
        label="v",
        overwrite=overwrite,
        rows_hint=len(rows) if local else None,
    )


@dataclass(frozen=True)
class Way:
    """One way a change reaches the table: ``local``, the caller bounds its size (so it is
    sized on the driver); ``rewrite``, the strategy that rewrites its candidate files."""

    local: bool
    rewrite: Strategy

    @property
    def vectors(self) -> bool:
        return self.rewrite in (Strategy.DELETE_BY_VECTORS, Strategy.VECTORS_BY_DRIVER)

    @property
    def merge(self) -> bool:
        """A delta-spark MERGE, which deletes every copy of a row and puts the rest back."""
        return self.rewrite is Strategy.DELETE_BY_VECTORS


@pytest.fixture(
    params=["spark", "sized", "driver", "vectors", "driver vectors"],
    ids=[
        "by Spark",
        "sized on the driver",
        "rewritten by the driver",
        "deletion vectors",
        "deletion vectors by the driver",
    ],
)
def way(request: pytest.FixtureRequest) -> Iterator[Way]:
    """The five ways a change reaches the table: sized and its files found by Spark jobs;
    sized on the driver and the files rewritten by Spark; both on the driver; deletions
    marked in deletion vectors by delta-spark (sized on the driver), or by the driver."""
    if request.param == "sized":
        with ivm.policy.using(driver_rewrite_rows=0):
            yield Way(True, Strategy.REWRITE_BY_SPARK)
    elif request.param == "vectors":
        with ivm.policy.using(rewrite_copy_rows=0, driver_rewrite_rows=0):
            yield Way(True, Strategy.DELETE_BY_VECTORS)
    elif request.param == "driver vectors":
        with ivm.policy.using(rewrite_copy_rows=0):
            yield Way(True, Strategy.VECTORS_BY_DRIVER)
    elif request.param == "driver":
        with ivm.policy.using(deletion_vectors=False):
            yield Way(True, Strategy.REWRITE_BY_DRIVER)
    else:
        yield Way(False, Strategy.REWRITE_BY_SPARK)


def contents(uri: str) -> Counter:
    """The table's rows as Delta reads them (deletion vectors applied)."""
    return Counter(tuple(r.values()) for r in snapshot_rows(DeltaTable(uri)).to_pylist())


def spark_contents(spark, uri: str) -> Counter:
    """The table's rows as delta-spark reads them."""
    return Counter(tuple(r) for r in spark.read.format("delta").load(uri).collect())


SMALL_REWRITE = Known(deleted=1, candidates=2, candidate_rows=100, sized_on_driver=True)
"""A deletion counted on the driver, from two candidate files of 100 rows."""


@pytest.mark.parametrize(
    ("known", "policy", "strategy"),
    [
        (Known(positive=True, readable=True, rows_hint=10), Policy(), "INSERT_BY_DRIVER"),
        (Known(positive=True, held=True), Policy(driver_rewrite_rows=0), "INSERT_BY_DRIVER"),
        (Known(positive=True, readable=True, rows_hint=10), Policy.spark_only(), "APPEND_BY_SPARK"),
        (
            Known(positive=True, readable=True, rows_hint=10),
            Policy(driver_rewrite_rows=9),
            "APPEND_BY_SPARK",
        ),
        (Known(positive=True, held=True, exact=False), Policy(), "APPEND_BY_SPARK"),
        (Known(positive=True, rows_hint=10), Policy(), "APPEND_BY_SPARK"),
        (Known(positive=True, readable=True), Policy(), "APPEND_BY_SPARK"),
        (Known(positive=True, overwrite=True, held=True), Policy(), "APPEND_BY_SPARK"),
        (Known(overwrite=True, deleted=3), Policy(), "APPEND_BY_SPARK"),
        (Known(deleted=0, sized_on_driver=True), Policy(), "APPEND_BY_SPARK"),
        (Known(deleted=1, candidates=0, sized_on_driver=True), Policy(), "REFUSE"),
        (SMALL_REWRITE, Policy(), "VECTORS_BY_DRIVER"),
        (SMALL_REWRITE, Policy(driver_rewrite_rows=100), "VECTORS_BY_DRIVER"),
        (SMALL_REWRITE, Policy(deletion_vectors=False), "REWRITE_BY_DRIVER"),
        (SMALL_REWRITE, Policy(driver_rewrite_rows=99), "REWRITE_BY_SPARK"),
        (SMALL_REWRITE, Policy(driver=False), "REWRITE_BY_SPARK"),
        (SMALL_REWRITE, Policy.spark_only(), "REWRITE_BY_SPARK"),
        (Known(deleted=1, candidates=2, candidate_rows=100), Policy(), "REWRITE_BY_SPARK"),
        (
            Known(deleted=1, candidates=2, candidate_rows=None, sized_on_driver=True),
            Policy(rewrite_copy_rows=0),
            "REWRITE_BY_SPARK",
        ),
        (SMALL_REWRITE, Policy(rewrite_copy_rows=100), "VECTORS_BY_DRIVER"),
        (SMALL_REWRITE, Policy(rewrite_copy_rows=99, driver_rewrite_rows=99), "DELETE_BY_VECTORS"),
        (
            replace(SMALL_REWRITE, vector_writer="the table has feature rowTracking"),
            Policy(rewrite_copy_rows=0),
            "DELETE_BY_VECTORS",
        ),
        (
            replace(SMALL_REWRITE, sized_on_driver=False),
            Policy(rewrite_copy_rows=0),
            "DELETE_BY_VECTORS",
        ),
        (SMALL_REWRITE, Policy.spark_only(rewrite_copy_rows=0), "DELETE_BY_VECTORS"),
        (replace(SMALL_REWRITE, vectored=1), Policy(), "VECTORS_BY_DRIVER"),
        (replace(SMALL_REWRITE, vectored=1), Policy(deletion_vectors=False), "DELETE_BY_VECTORS"),
        (replace(SMALL_REWRITE, vectored=1, exact=False), Policy(), "DELETE_BY_VECTORS"),
        (
            replace(SMALL_REWRITE, comparable=False, exact=False),
            Policy(rewrite_copy_rows=0),
            "REWRITE_BY_SPARK",
        ),
        (
            Known(deleted=1, candidates=2, candidate_rows=100, sized_on_driver=True, exact=False),
            Policy(),
            "REWRITE_BY_SPARK",
        ),
    ],
)
def test_the_strategy_is_chosen_from_what_is_known_before_writing(
    known: Known, policy: Policy, strategy: str
) -> None:
    """Each strategy, and each threshold of the policy that turns a driver's strategy into
    Spark's (bounds inclusive), decided with nothing read or written."""
    choice = choose(known, policy)
    assert choice.strategy is Strategy[strategy] and choice.reason, choice


def test_a_change_is_counted_on_the_driver_up_to_driver_change_rows() -> None:
    policy = Policy(driver_change_rows=5)

    def how(rows_hint: int | None, *, overwrite: bool = False, positive: bool = False) -> Sizing:
        return sizing(overwrite=overwrite, positive=positive, rows_hint=rows_hint, policy=policy)

    assert how(None, positive=True) is how(1, overwrite=True, positive=True) is Sizing.NONE
    assert how(5) is how(0) is Sizing.DRIVER
    assert how(6) is how(None) is how(1, overwrite=True) is Sizing.SPARK
    assert sizing(overwrite=False, positive=False, rows_hint=1, policy=Policy.spark_only()) is (
        Sizing.SPARK
    )


def test_deletes_rewrite_only_the_files_that_may_hold_them(spark, tmp_path: Path, way: Way) -> None:
    uri = str(tmp_path / "t")
    # Epoch 1: a first file with duplicates and a NULL key; epochs 2-3: files of other ranges.
    apply(spark, uri, 1, (1, "a", 3), (2, "b", 1), (None, "n", 2), overwrite=True)
    apply(spark, uri, 2, (10, "x", 1), (11, "y", 2))
    apply(spark, uri, 3, (20, "z1", 1), (21, "z2", 1))
    assert len(DeltaTable(uri).file_uris()) == 3
    # Delete one copy of (1, a), one NULL-key row, one (11, y); insert (5, e).
    change = apply(
        spark, uri, 4, (1, "a", -1), (None, "n", -1), (11, "y", -1), (5, "e", 1), local=way.local
    )
    assert change.choice is not None and change.choice.strategy is way.rewrite
    assert (change.inserted, change.deleted) == (1, 3)
    if way.merge:  # every copy of (1, a), (None, n), (11, y) deleted; 2 + 1 + 1 put back
        assert (change.files_rewritten, change.rows_rewritten) == (0, 4)
    elif way.vectors:  # the driver marks exactly the copies deleted
        assert (change.files_rewritten, change.rows_rewritten) == (0, 0)
    else:
        # A NULL key is deleted, so only names prune: the file of epoch 3 (names z1-z2) is
        # outside the deleted rows' range (a-y) and stays untouched.
        assert change.files_rewritten == 2 and change.rows_rewritten == 6 + 3
    assert (
        contents(uri)
        == spark_contents(spark, uri)
        == Counter(
            {(1, "a"): 2, (2, "b"): 1, (None, "n"): 1, (10, "x"): 1, (11, "y"): 1, (5, "e"): 1}
            | {(20, "z1"): 1, (21, "z2"): 1}
        )
    )
    for path in [] if way.vectors else DeltaTable(uri).file_uris():  # every file stays sorted
        keys = pq.read_table(path).column("k").to_pylist()
        present = [k for k in keys if k is not None]
        assert present == sorted(present), path
    # A rerun of the epoch commits nothing.
    again = apply(spark, uri, 4, (1, "a", -1), local=way.local)
    assert not again.commit.committed and contents(uri)[(1, "a")] == 2


def test_many_files_are_pruned_row_by_row(spark, tmp_path: Path, way: Way) -> None:
    uri = str(tmp_path / "t")
    # Nine files of keys 10i..10i+1 (the first also holds a NULL key named "zz").
    apply(spark, uri, 1, (0, "a", 1), (1, "a", 1), (None, "zz", 1), overwrite=True)
    for i in range(1, 9):
        apply(spark, uri, 1 + i, (10 * i, "a", 1), (10 * i + 1, "a", 1))
    assert len(DeltaTable(uri).file_uris()) == 9 >= ivm.policy.current().per_row_prune_files
    before = contents(uri)
    # The deleted rows span every file's range of keys and names; row by row, only the
    # first file (0, and the NULL key by its name) and the last (81) may hold them.
    change = apply(spark, uri, 10, (0, "a", -1), (None, "zz", -1), (81, "a", -1), local=way.local)
    assert (change.files_rewritten, change.rows_rewritten) == ((0, 0) if way.vectors else (2, 5))
    assert contents(uri) == before - Counter({(0, "a"): 1, (None, "zz"): 1, (81, "a"): 1})
    # Under per_row_prune_files files, the deleted rows' range alone finds the candidates:
    # 1-80 overlaps every file. Spark rewrites them all; the driver replaces only the two
    # that hold a deleted row.
    files, before = len(DeltaTable(uri).file_uris()), contents(uri)
    with ivm.policy.using(per_row_prune_files=files + 1):
        change = apply(spark, uri, 11, (1, "a", -1), (80, "a", -1), local=way.local)
    by_spark = way.rewrite is Strategy.REWRITE_BY_SPARK
    assert change.files_rewritten == (files if by_spark else 0 if way.vectors else 2)
    assert contents(uri) == before - Counter({(1, "a"): 1, (80, "a"): 1})


@pytest.mark.parametrize(
    ("row", "multiplicity"),
    [((1, "a", -3), "-1"), ((2, "a", -1), "-1"), ((1, "z", -1), "-1"), ((7, "a", -2), "-2")],
    ids=[
        "more copies than held",
        "a row not held, in a file's range",
        "a row not held, in no file's range of names",
        "a row not held, in no file's range of keys",
    ],
)
def test_deleting_rows_the_table_does_not_hold_commits_nothing(
    spark, tmp_path: Path, row, multiplicity: str, way: Way
) -> None:
    uri = str(tmp_path / "t")
    apply(spark, uri, 1, (1, "a", 2), (2, "b", 1), overwrite=True)
    version = DeltaTable(uri).version()
    with pytest.raises(InvariantViolation, match=f"multiplicity would be {multiplicity}\\)"):
        apply(spark, uri, 2, row, (3, "c", 1), local=way.local)
    assert DeltaTable(uri).version() == version
    assert contents(uri) == Counter({(1, "a"): 2, (2, "b"): 1})


def test_a_rewrite_sized_on_the_driver_reads_its_files_once(spark, tmp_path: Path) -> None:
    """The scan that keeps the untouched rows also counts the deleted rows' copies: the
    candidate files' rows are scanned once, not a second time to count them."""
    from bench.scans import ScanRows

    uri = str(tmp_path / "views" / "t")  # a readable table under the lake root
    apply(spark, uri, 1, *[(k, "a", 1) for k in range(40)], (3, "b", 2), overwrite=True)
    scans = ScanRows(spark, str(tmp_path))
    scans.mark()
    with ivm.policy.using(driver_rewrite_rows=0):  # Spark rewrites
        change = apply(spark, uri, 2, (3, "b", -1), (7, "a", -1), (99, "z", 1), local=True)
    assert change.choice is not None and change.choice.strategy is Strategy.REWRITE_BY_SPARK
    assert (change.files_rewritten, change.rows_rewritten) == (1, 42)
    assert scans.rows() == {"views": 42}
    assert contents(uri) == Counter(
        {(k, "a"): 1 for k in range(40) if k != 7} | {(3, "b"): 1, (99, "z"): 1}
    )


def test_a_rewrite_by_the_driver_runs_no_job_and_keeps_the_files_no_deletion_hits(
    spark, tmp_path: Path, use_policy
) -> None:
    """The driver rewrites a small change's candidate files with no Spark job of its own; a candidate
    that the statistics could not rule out but that holds no deleted row stays as it is; a
    row held twice and deleted once is written back once; floating point goes to Spark."""
    use_policy(deletion_vectors=False)
    from bench.scans import ScanRows
    from resources.spark import JobGroup

    def jobs_of(*args, **kwargs):
        group = JobGroup("t", "apply")
        group.open(spark)
        try:
            change = apply(spark, *args, **kwargs)
        finally:
            jobs = group.close(spark)
        return change, jobs

    uri = str(tmp_path / "views" / "t")  # a readable table under the lake root
    for epoch, base in enumerate((0, 20, 40), start=1):
        rows = [(base + k, "a", 1) for k in range(10)]
        apply(spark, uri, epoch, *rows, *([(base + 5, "b", 2)] if base == 40 else []))
    middle = [u for u in DeltaTable(uri).file_uris() if pq.read_table(u)["k"][0].as_py() == 20]
    before = contents(uri)
    # The deleted rows' range (5-45) covers all three files; the middle one holds none.
    scans = ScanRows(spark, str(tmp_path))
    scans.mark()
    change, jobs = jobs_of(uri, 4, (5, "a", -1), (45, "b", -1), (30, "new", 1), local=True)
    assert jobs == 1  # collecting the change (the engine hands over the rows it logged)
    assert change.choice is not None and change.choice.strategy is Strategy.REWRITE_BY_DRIVER
    assert scans.rows() == {"views": 10 + 10 + 12}  # the driver read the three candidates
    assert (change.inserted, change.deleted) == (1, 2)
    assert (change.files_rewritten, change.rows_rewritten) == (2, 10 + 12)
    assert set(middle) <= set(DeltaTable(uri).file_uris())
    assert contents(uri) == before - Counter({(5, "a"): 1, (45, "b"): 1}) + Counter(
        {(30, "new"): 1}
    )
    for path in DeltaTable(uri).file_uris():
        keys = pq.read_table(path).column("k").to_pylist()
        assert keys == sorted(keys), path
    floats = str(tmp_path / "f")
    spark_rows = spark.createDataFrame([(1.5, 1), (2.5, 1)], "x double, _diff long")
    for epoch, net in ((1, spark_rows), (2, spark_rows.selectExpr("x", "-_diff AS _diff"))):
        group = JobGroup("f", "apply")
        group.open(spark)
        try:
            change = apply_to_table(
                spark,
                net.limit(1),
                floats,
                app_id="t",
                epoch=epoch,
                metadata={},
                label="f",
                overwrite=epoch == 1,
                rows_hint=1,
            )
        finally:
            jobs = group.close(spark)
    assert jobs > 0 and DeltaTable(floats).to_pyarrow_table().num_rows == 0
    assert change.choice is not None and change.choice.strategy is Strategy.REWRITE_BY_SPARK


def _typed_updates(spark, n: int):
    """``n`` updates with a column of each type views produce, NULLs included."""
    return spark.range(n).selectExpr(
        "cast(id % 7 as tinyint) AS tiny",
        "id AS k",
        "cast(id * 1.25 as decimal(12,2)) AS price",
        "cast(id as decimal(38,10)) / 3 AS wide",
        "date_add(DATE '1995-01-01', cast(id as int)) AS day",
        "timestamp_micros(1700000000000000 + id * 1001) AS at",
        "CASE WHEN id % 5 = 0 THEN NULL ELSE concat('é', cast(id as string)) END AS name",
        "id % 2 = 0 AS even",
        "id / 8.0D AS ratio",
        "cast(3 as bigint) AS _time",
        "cast(1 - 2 * (id % 2) as bigint) AS _diff",
    )


def _log(spark, tmp_path: Path, name: str, updates, *, small: bool):
    from ops.sink import append_updates
    from resources.spark import JobGroup

    uri = str(tmp_path / name)
    group = JobGroup(name, "write a log")
    group.open(spark)
    try:
        append_updates(updates, uri, app_id="t", epoch=3, metadata={}, small=small)
    finally:
        jobs = group.close(spark)
    return DeltaTable(uri), jobs


def test_a_small_write_by_the_driver_is_what_spark_writes(spark, tmp_path: Path) -> None:
    """Written by the driver (pyarrow) or by Spark, an epoch's updates make the same Delta
    table: schema, rows, per-file statistics; Spark reads both back as the same rows."""
    updates = _typed_updates(spark, 500).coalesce(1)  # one file each way
    by_spark, _ = _log(spark, tmp_path, "spark", updates, small=False)
    by_driver, jobs = _log(spark, tmp_path, "driver", updates, small=True)
    assert jobs == 1  # collecting the rows
    assert parquet_writers(by_driver) == {"parquet-cpp-arrow"} and parquet_writers(by_spark) == {
        "parquet-mr"
    }
    assert by_driver.schema().to_arrow() == by_spark.schema().to_arrow()

    def rows(dt: DeltaTable) -> Counter:
        return Counter(tuple(r.values()) for r in dt.to_pyarrow_table().to_pylist())

    assert rows(by_driver) == rows(by_spark) and sum(rows(by_driver).values()) == 500

    def stats(dt: DeltaTable) -> dict:
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pylist()
        return {k: v for k, v in actions[0].items() if k.startswith(("min.", "max.", "null_"))}

    assert len(by_driver.file_uris()) == 1
    assert stats(by_driver) == stats(by_spark)
    read = [
        spark.read.parquet(*dt.file_uris()).select(*updates.columns) for dt in (by_spark, by_driver)
    ]
    assert read[0].schema == read[1].schema  # Spark reads files' columns as nullable
    assert read[1].schema.simpleString() == updates.schema.simpleString()
    assert read[0].exceptAll(read[1]).count() == read[1].exceptAll(read[0]).count() == 0


def test_the_driver_chooses_each_columns_encoding_and_every_reader_decodes_it(
    spark, tmp_path: Path
) -> None:
    """Few distinct values: a dictionary; many: plain, values stored as integers (integers,
    dates, timestamps, decimals of up to 18 digits) as deltas. Spark, DuckDB and delta-rs
    read the file back as written."""
    import duckdb

    from resources.lake import collect_staged, commit_files, stage_arrow, staging_uri

    n = 30_000
    rows = pa.table(
        {
            "key": pa.array(range(n), pa.int64()),  # sorted, distinct
            "shuffled": pa.array([(i * 7919) % n - n // 2 for i in range(n)], pa.int32()),
            "small": pa.array([i % 5 for i in range(n)], pa.int64()),
            "status": pa.array([None if i % 11 == 0 else "OF"[i % 2] for i in range(n)]),
            "comment": pa.array([f"c{i * 31}" for i in range(n)]),
            "price": pa.array(
                [Decimal(i * 7919 % n) / 100 for i in range(n)], pa.decimal128(12, 2)
            ),
            "small_price": pa.array(
                [None if i % 13 == 0 else Decimal(-i) / 10 for i in range(n)], pa.decimal128(7, 1)
            ),
            "wide": pa.array([Decimal(i) / 10_000 for i in range(n)], pa.decimal128(30, 4)),
            "day": pa.array([date(1992, 1, 1) + timedelta(days=i * 37 % 2500) for i in range(n)]),
            "at": pa.array(
                [datetime(2020, 1, 1, tzinfo=UTC) + timedelta(seconds=i * 977) for i in range(n)],
                pa.timestamp("us", tz="UTC"),
            ),
        }
    )
    table = str(tmp_path / "table")
    staged = staging_uri(table, 1, "rows")
    path = stage_arrow(staged, rows)
    assert path is not None
    commit_files(
        table, app_id="t", epoch=1, schema=rows.schema, adds=collect_staged(table, staged).adds
    )
    meta = pq.ParquetFile(path).metadata.row_group(0)
    encodings = {
        meta.column(i).path_in_schema: meta.column(i).encodings for i in range(meta.num_columns)
    }
    for delta in ("key", "shuffled", "price", "small_price", "day", "at"):
        assert "DELTA_BINARY_PACKED" in encodings[delta], (delta, encodings[delta])
    for dictionary in ("small", "status"):
        assert "RLE_DICTIONARY" in encodings[dictionary], encodings
    for plain in ("comment", "wide"):
        assert "RLE_DICTIONARY" not in encodings[plain] and "PLAIN" in encodings[plain]

    zone = ZoneInfo(spark.conf.get("spark.sql.session.timeZone"))

    def same(values) -> tuple:  # instants compared in UTC (Spark's are in its session zone)
        return tuple(
            (v if v.tzinfo else v.replace(tzinfo=zone)).astimezone(UTC)
            if isinstance(v, datetime)
            else v
            for v in values
        )

    expected = Counter(same(r.values()) for r in rows.to_pylist())
    by_spark = spark.read.parquet(path).collect()
    assert Counter(same(r) for r in by_spark) == expected
    by_duckdb = duckdb.connect().sql(f"SELECT * FROM read_parquet('{path}')").fetchall()
    assert Counter(same(r) for r in by_duckdb) == expected
    by_delta_rs = QueryBuilder().register("t", DeltaTable(table)).execute("SELECT * FROM t")
    assert (
        Counter(same(r.values()) for r in pa.table(by_delta_rs.read_all()).to_pylist()) == expected
    )


def test_a_small_write_that_is_not_small_is_written_by_spark(spark, tmp_path: Path) -> None:
    """More rows than the driver takes: Spark writes them all (computing them again)."""
    updates = _typed_updates(spark, 11).repartition(2)
    with ivm.policy.using(driver_change_rows=10):
        table, jobs = _log(spark, tmp_path, "big", updates, small=True)
    assert jobs > 1
    assert table.to_pyarrow_table().num_rows == 11
    assert parquet_writers(table) == {"parquet-mr"} and len(table.file_uris()) == 2  # per partition


def test_nested_columns_are_written_by_spark(spark, tmp_path: Path) -> None:
    """Only flat column types are written by the driver; an array column's updates are
    written by Spark, whatever their size."""
    updates = spark.range(3).selectExpr(
        "id AS k", "array(id, id + 1) AS pair", "cast(1 as bigint) AS _time", "id AS _diff"
    )
    table, _ = _log(spark, tmp_path, "nested", updates.coalesce(1), small=True)
    assert parquet_writers(table) == {"parquet-mr"}
    assert sorted(r["pair"] for r in table.to_pyarrow_table().to_pylist()) == [
        [0, 1],
        [1, 2],
        [2, 3],
    ]


def test_a_change_the_driver_holds_is_not_collected_again(
    spark, tmp_path: Path, use_policy
) -> None:
    """A diff log's epoch written by the driver comes back with its rows (``staged``), and the
    readable table's step sizes the change from them: one Spark job fewer, the same table."""
    use_policy(deletion_vectors=False)
    from ops.sink import append_updates
    from resources.spark import JobGroup

    updates = net_change(spark, (3, "b", -1), (7, "a", -1), (99, "z", 2), (None, None, 1))
    log = str(tmp_path / "log")
    logged = append_updates(
        updates.selectExpr("k", "name", "cast(2 as bigint) AS _time", DIFF),
        log,
        app_id="t",
        epoch=2,
        metadata={},
        small=True,
    ).staged
    assert logged is not None
    assert logged.to_pylist() == DeltaTable(log).to_pyarrow_table().to_pylist()
    jobs, tables = {}, {}
    for way, rows in (("collected", None), ("held", logged.drop_columns(["_time"]))):
        uri = tables[way] = str(tmp_path / way)
        apply(spark, uri, 1, *[(k, "a", 1) for k in range(40)], (3, "b", 2), overwrite=True)
        group = JobGroup(way, "apply")
        group.open(spark)
        try:
            change = apply_to_table(
                spark,
                spark.read.parquet(*DeltaTable(log).file_uris()).drop("_time"),
                uri,
                app_id="test",
                epoch=2,
                metadata={},
                label="v",
                rows_hint=logged.num_rows,
                net_rows=rows,
            )
        finally:
            jobs[way] = group.close(spark)
        assert (change.inserted, change.deleted, change.rows_rewritten) == (3, 2, 42)
    assert jobs["held"] == jobs["collected"] - 1, jobs
    expected = Counter({(k, "a"): 1 for k in range(40) if k != 7})
    expected.update({(3, "b"): 1, (99, "z"): 2, (None, None): 1})
    assert contents(tables["held"]) == contents(tables["collected"]) == expected


def test_an_insert_only_change_is_written_by_the_driver_as_spark_writes_it(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that only inserts (a first build), read from its log's files by the driver, is
    written with no Spark job: each row ``_diff`` times, every file sorted as Spark sorts
    (NULLs first) and holding its own range, the rows Spark's write of the same change
    holds; over the policy's ``driver_rewrite_rows`` rows or ``driver_insert_bytes``, Spark
    writes it. The driver's files go to its cache as a read would decode them: the first
    rewrite decodes none."""
    from ops.ingest import insertions_only, view_changes, view_changes_by_driver
    from ops.sink import append_updates
    from resources.filecache import FileCache, _decode
    from resources.lake import local_path
    from resources.spark import JobGroup

    cache = FileCache(1 << 30)
    monkeypatch.setattr(ops.sink, "FILES", cache)
    updates = (
        _typed_updates(spark, 300)
        .drop("ratio")  # floating point is Spark's
        .selectExpr("*", "1 + cast(k % 3 = 0 as bigint) AS _d")
        .drop(DIFF)
        .withColumnRenamed("_d", DIFF)
    )
    log = str(tmp_path / "log")
    append_updates(updates.repartition(3), log, app_id="t", epoch=3, metadata={})
    columns = [c for c in updates.columns if c not in ("_time", DIFF)]
    tables, jobs = {}, {}
    ways = (
        ("driver", 1000, 10**6, Strategy.INSERT_BY_DRIVER, "the driver reads them"),
        ("spark", 10, 10**6, Strategy.APPEND_BY_SPARK, "over driver_rewrite_rows"),
        ("wide", 1000, 1000, Strategy.APPEND_BY_SPARK, "over driver_insert_bytes"),
    )
    for way, limit, most, strategy, reason in ways:
        policy = ivm.policy.current().replace(
            table_file_rows=120,
            driver_rewrite_rows=limit,
            driver_insert_bytes=most,  # "wide": too many bytes
            driver_change_rows=10,  # no collect by Spark either
        )
        net, files = view_changes(spark, log, pa.schema(DeltaTable(log).schema().to_arrow()), 0, 3)
        assert insertions_only(files)
        uri = tables[way] = str(tmp_path / way)
        with ivm.policy.using(policy):
            group = JobGroup(way, "apply")
            group.open(spark)
            try:
                change = apply_to_table(
                    spark,
                    net.select(*columns, DIFF),
                    uri,
                    app_id="t",
                    epoch=3,
                    metadata={},
                    label="v",
                    positive=True,
                    rows_hint=sum(f.file.num_records for f in files),
                    read_net=lambda most, files=files: view_changes_by_driver(
                        files, columns, 0, 3, most
                    ),
                )
            finally:
                jobs[way] = group.close(spark)
        assert (change.inserted, change.deleted) == (400, 0)
        assert change.choice is not None and change.choice.strategy is strategy
        assert reason in change.choice.reason, change.choice
    assert jobs["driver"] == 0 and jobs["spark"] > 0 and jobs["wide"] > 0
    written = {local_path(u) for u in DeltaTable(tables["driver"]).file_uris()}
    held = {key[0]: rows for key, rows in cache._entries.items()}
    assert len(written) == 4 and set(held) == written  # Spark's files are not handed over
    for path, rows in held.items():
        assert rows.equals(_decode(path, rows.schema))
    assert parquet_writers(DeltaTable(tables["wide"])) == {"parquet-mr"}
    assert contents(tables["wide"]) == contents(tables["spark"])
    driver, by_spark = DeltaTable(tables["driver"]), DeltaTable(tables["spark"])
    assert parquet_writers(driver) == {"parquet-cpp-arrow"}
    assert parquet_writers(by_spark) == {"parquet-mr"}
    assert driver.schema().to_arrow() == by_spark.schema().to_arrow()
    assert contents(tables["driver"]) == contents(tables["spark"])
    assert sum(contents(tables["driver"]).values()) == 400
    keys = [
        pq.read_table(p, columns=["tiny", "k"]).to_pylist()
        for p in sorted(driver.file_uris(), key=lambda p: pq.read_table(p)["tiny"][0].as_py())
    ]
    assert [len(f) for f in keys] == [120, 120, 120, 40]
    flat = [(r["tiny"], r["k"]) for f in keys for r in f]
    assert flat == sorted(flat)  # each file sorted, and the files in ranges of the order
    read = [spark.read.parquet(*dt.file_uris()).select(*columns) for dt in (driver, by_spark)]
    assert read[0].schema == read[1].schema
    assert read[0].exceptAll(read[1]).count() == read[1].exceptAll(read[0]).count() == 0


def test_a_rewrite_by_the_driver_keeps_the_files_it_writes_decoded(
    spark, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, use_policy
) -> None:
    """The files the driver writes in a rewrite go to its cache of decoded files exactly as a
    read would decode them (decimals, dates, timestamps, NULLs), so the next rewrite of the
    table decodes nothing; the files a commit replaced leave the cache."""
    use_policy(deletion_vectors=False)
    from datetime import UTC, date, datetime
    from decimal import Decimal

    from resources.filecache import FileCache, _decode
    from resources.lake import driver_reads, local_path

    cache = FileCache(1 << 30)
    monkeypatch.setattr(ops.sink, "FILES", cache)
    typed = pa.schema(
        [
            ("k", pa.int64()),
            ("price", pa.decimal128(12, 2)),
            ("day", pa.date32()),
            ("at", pa.timestamp("us", tz="UTC")),
            ("name", pa.string()),
        ]
    )

    def row(k: int, d: int) -> dict:
        return {
            "k": k,
            "price": None if k % 5 == 0 else Decimal(k) / 4,
            "day": date(1995, 1, 1 + k % 28),
            "at": datetime(2024, 1, 1, tzinfo=UTC).replace(microsecond=k),
            "name": None if k % 3 == 0 else f"é{k}",
            DIFF: d,
        }

    def put(epoch: int, rows: list[dict]):
        change = pa.Table.from_pylist(rows, schema=typed.append(pa.field(DIFF, pa.int64())))
        return apply_arrow(spark, uri, epoch, change, rows_hint=len(rows))

    uri = str(tmp_path / "views" / "t")
    put(1, [row(k, 1) for k in range(30)])
    state = Counter({tuple(row(k, 1).values())[:-1]: 1 for k in range(30)})
    for epoch, (gone, new) in enumerate([(4, 40), (9, 41), (40, 42)], start=2):
        before = driver_reads()
        change = put(epoch, [row(gone, -1), row(new, 1)])
        decoded = sum(n - before.get(f, 0) for f, n in driver_reads().items())
        assert change.files_rewritten >= 1
        assert decoded == (change.rows_rewritten if epoch == 2 else 0)  # then held
        state += Counter({tuple(row(new, 1).values())[:-1]: 1})
        state -= Counter({tuple(row(gone, 1).values())[:-1]: 1})
        assert contents(uri) == state
        live = {local_path(u) for u in DeltaTable(uri).file_uris()}
        held = {k[0] for k in cache._entries}
        assert held <= live  # the replaced files left the cache
        for path in held:
            assert cache.read(path, typed)[0].equals(_decode(path, typed)), path


def test_rows_are_left_out_by_slices_or_one_copy_past_the_chunk_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``without_rows`` equals a filter for any positions (first, last, runs, all), as
    slices of the rows while the chunks stay within ``MAX_CHUNKS``, else one copy."""
    import random

    from ops.sink import without_rows

    rows = pa.table({"k": pa.array(range(500), pa.int64()), "s": [f"v{i}" for i in range(500)]})
    rng = random.Random(7)
    cases = [[], [0], [499], [0, 1, 2, 499], list(range(500)), list(range(100, 200))]
    cases += [sorted(rng.sample(range(500), rng.randint(1, 60))) for _ in range(30)]
    for positions in cases:
        mask = pa.array([i not in set(positions) for i in range(500)])
        kept = without_rows(rows, np.array(positions, dtype=np.int64))
        assert kept.equals(rows.filter(mask)), positions
        assert kept.column("k").num_chunks <= max(1, len(positions) + 1)
    kept = without_rows(rows, np.array([5, 50], dtype=np.int64))
    assert [c.chunk(1).offset for c in kept.columns] == [6, 6]  # slices of the rows: no copy
    assert all(
        k.chunk(0).buffers()[-1].address == r.chunk(0).buffers()[-1].address
        for k, r in zip(kept.columns, rows.columns, strict=True)
    )
    monkeypatch.setattr(ops.sink, "MAX_CHUNKS", 4)
    kept = without_rows(rows, np.array([5, 50, 150, 250, 350], dtype=np.int64))
    assert [c.num_chunks for c in kept.columns] == [1, 1]
    assert kept.num_rows == 495 and 50 not in kept.column("k").to_pylist()


def test_deletion_vectors_for_a_change_counted_by_spark(spark, tmp_path: Path) -> None:
    """A change with no size bound is counted by Spark and kept cached while it is written:
    the MERGE lets Delta materialize such a source (a cached plan under a MERGE that does not
    is refused); the copies held are counted by one Spark job."""
    uri = str(tmp_path / "t")
    apply(spark, uri, 1, *[(k, "a", 1) for k in range(30)], (7, "b", 3), overwrite=True)
    with ivm.policy.using(rewrite_copy_rows=0):
        change = apply(spark, uri, 2, (7, "b", -1), (3, "a", -1), (99, "z", 2))
    assert change.choice is not None and change.choice.strategy is Strategy.DELETE_BY_VECTORS
    assert (change.inserted, change.deleted, change.rows_rewritten) == (2, 2, 2)
    expected = Counter({(k, "a"): 1 for k in range(30) if k != 3}) + Counter(
        {(7, "b"): 2, (99, "z"): 2}
    )
    assert contents(uri) == spark_contents(spark, uri) == expected
    assert any(f.deleted for f in table_files(uri))


def test_columns_named_like_scratch_columns_are_written_by_spark(spark, tmp_path: Path) -> None:
    """A view's column named ``_n`` (a NOT IN rewrite's count is) survives Spark's rewrite,
    whose copies of a row held twice once took that name: AMBIGUOUS_REFERENCE."""
    uri = str(tmp_path / "t")
    schema = pa.schema([("k", pa.int64()), ("_n", pa.int64()), (DIFF, pa.int64())])

    def apply_rows(epoch: int, *rows: tuple[int, int, int], overwrite: bool = False):
        table = pa.Table.from_pylist(
            [{"k": k, "_n": n, DIFF: d} for k, n, d in rows], schema=schema
        )
        return apply_arrow(spark, uri, epoch, table, overwrite=overwrite)

    with ivm.policy.using(Policy.spark_only()):
        apply_rows(1, (1, 10, 2), (2, 20, 1), overwrite=True)
        change = apply_rows(2, (1, 10, -1), (3, 30, 2))
    assert change.choice is not None and change.choice.strategy is Strategy.REWRITE_BY_SPARK
    assert contents(uri) == Counter({(1, 10): 1, (2, 20): 1, (3, 30): 2})
