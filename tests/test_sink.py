"""The readable table's sink on the real stack: a net change applied to a Delta table with
several files rewrites only the files that may hold a deleted row, keeps them sorted, counts
duplicates and NULLs exactly, and refuses deletions of rows the table does not hold."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

from ivm.errors import InvariantViolation
from ops import DIFF
from ops.sink import apply_to_table

pytestmark = pytest.mark.spark

S = pa.schema([("k", pa.int64()), ("name", pa.string())])


def net_change(spark, *rows: tuple[int | None, str | None, int]):
    table = pa.Table.from_pylist(
        [{"k": k, "name": n, DIFF: d} for k, n, d in rows],
        schema=S.append(pa.field(DIFF, pa.int64())),
    )
    return spark.createDataFrame(table)


def apply(spark, uri: str, epoch: int, *rows, overwrite: bool = False):
    return apply_to_table(
        spark,
        net_change(spark, *rows),
        uri,
        app_id="test",
        epoch=epoch,
        metadata={},
        label="v",
        overwrite=overwrite,
    )


def contents(uri: str) -> Counter:
    return Counter(tuple(r.values()) for r in DeltaTable(uri).to_pyarrow_table().to_pylist())


def test_deletes_rewrite_only_the_files_that_may_hold_them(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    # Epoch 1: a first file with duplicates and a NULL key; epochs 2-3: files of other ranges.
    apply(spark, uri, 1, (1, "a", 3), (2, "b", 1), (None, "n", 2), overwrite=True)
    apply(spark, uri, 2, (10, "x", 1), (11, "y", 2))
    apply(spark, uri, 3, (20, "z1", 1), (21, "z2", 1))
    assert len(DeltaTable(uri).file_uris()) == 3
    # Delete one copy of (1, a), one NULL-key row, one (11, y); insert (5, e).
    change = apply(spark, uri, 4, (1, "a", -1), (None, "n", -1), (11, "y", -1), (5, "e", 1))
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
    again = apply(spark, uri, 4, (1, "a", -1))
    assert not again.commit.committed and contents(uri)[(1, "a")] == 2


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
    spark, tmp_path: Path, row, multiplicity: str
) -> None:
    uri = str(tmp_path / "t")
    apply(spark, uri, 1, (1, "a", 2), (2, "b", 1), overwrite=True)
    version = DeltaTable(uri).version()
    with pytest.raises(InvariantViolation, match=f"multiplicity would be {multiplicity}\\)"):
        apply(spark, uri, 2, row, (3, "c", 1))
    assert DeltaTable(uri).version() == version
    assert contents(uri) == Counter({(1, "a"): 2, (2, "b"): 1})
