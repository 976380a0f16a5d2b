"""The readable table's sink on the real stack: a net change applied to a Delta table with
several files rewrites only the files that may hold a deleted row, keeps them sorted, counts
duplicates and NULLs exactly, and refuses deletions of rows the table does not hold. Each
runs both ways a change is sized and its files found: by Spark jobs, and on the driver (a
change whose size bound is at most ``DRIVER_CHANGE_ROWS``)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ivm.errors import InvariantViolation
from ops import DIFF
from ops.sink import PER_ROW_PRUNE_FILES, apply_to_table

pytestmark = pytest.mark.spark

S = pa.schema([("k", pa.int64()), ("name", pa.string())])


def net_change(spark, *rows: tuple[int | None, str | None, int]):
    table = pa.Table.from_pylist(
        [{"k": k, "name": n, DIFF: d} for k, n, d in rows],
        schema=S.append(pa.field(DIFF, pa.int64())),
    )
    return spark.createDataFrame(table)


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


WAYS = pytest.mark.parametrize("local", [False, True], ids=["by Spark", "on the driver"])


def contents(uri: str) -> Counter:
    return Counter(tuple(r.values()) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())


@WAYS
def test_deletes_rewrite_only_the_files_that_may_hold_them(
    spark, tmp_path: Path, local: bool
) -> None:
    uri = str(tmp_path / "t")
    # Epoch 1: a first file with duplicates and a NULL key; epochs 2-3: files of other ranges.
    apply(spark, uri, 1, (1, "a", 3), (2, "b", 1), (None, "n", 2), overwrite=True)
    apply(spark, uri, 2, (10, "x", 1), (11, "y", 2))
    apply(spark, uri, 3, (20, "z1", 1), (21, "z2", 1))
    assert len(DeltaTable(uri).file_uris()) == 3
    # Delete one copy of (1, a), one NULL-key row, one (11, y); insert (5, e).
    change = apply(
        spark, uri, 4, (1, "a", -1), (None, "n", -1), (11, "y", -1), (5, "e", 1), local=local
    )
    assert (change.inserted, change.deleted) == (1, 3)
    # A NULL key is deleted, so only names prune: the file of epoch 3 (names z1-z2) is
    # outside the deleted rows' range (a-y) and stays untouched.
    assert change.files_rewritten == 2 and change.rows_rewritten == 6 + 3
    assert contents(uri) == Counter(
        {(1, "a"): 2, (2, "b"): 1, (None, "n"): 1, (10, "x"): 1, (11, "y"): 1, (5, "e"): 1}
        | {(20, "z1"): 1, (21, "z2"): 1}
    )
    for path in DeltaTable(uri).file_uris():  # every file stays sorted
        keys = pq.read_table(path).column("k").to_pylist()
        present = [k for k in keys if k is not None]
        assert present == sorted(present), path
    # A rerun of the epoch commits nothing.
    again = apply(spark, uri, 4, (1, "a", -1), local=local)
    assert not again.commit.committed and contents(uri)[(1, "a")] == 2


@WAYS
def test_many_files_are_pruned_row_by_row(spark, tmp_path: Path, local: bool) -> None:
    uri = str(tmp_path / "t")
    # Nine files of keys 10i..10i+1 (the first also holds a NULL key named "zz").
    apply(spark, uri, 1, (0, "a", 1), (1, "a", 1), (None, "zz", 1), overwrite=True)
    for i in range(1, 9):
        apply(spark, uri, 1 + i, (10 * i, "a", 1), (10 * i + 1, "a", 1))
    assert len(DeltaTable(uri).file_uris()) == 9 >= PER_ROW_PRUNE_FILES
    before = contents(uri)
    # The deleted rows span every file's range of keys and names; row by row, only the
    # first file (0, and the NULL key by its name) and the last (81) may hold them.
    change = apply(spark, uri, 10, (0, "a", -1), (None, "zz", -1), (81, "a", -1), local=local)
    assert (change.files_rewritten, change.rows_rewritten) == (2, 3 + 2)
    assert contents(uri) == before - Counter({(0, "a"): 1, (None, "zz"): 1, (81, "a"): 1})


@WAYS
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
    spark, tmp_path: Path, row, multiplicity: str, local: bool
) -> None:
    uri = str(tmp_path / "t")
    apply(spark, uri, 1, (1, "a", 2), (2, "b", 1), overwrite=True)
    version = DeltaTable(uri).version()
    with pytest.raises(InvariantViolation, match=f"multiplicity would be {multiplicity}\\)"):
        apply(spark, uri, 2, row, (3, "c", 1), local=local)
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
    change = apply(spark, uri, 2, (3, "b", -1), (7, "a", -1), (99, "z", 1), local=True)
    assert (change.files_rewritten, change.rows_rewritten) == (1, 42)
    assert scans.rows() == {"views": 42}
    assert contents(uri) == Counter(
        {(k, "a"): 1 for k in range(40) if k != 7} | {(3, "b"): 1, (99, "z"): 1}
    )
