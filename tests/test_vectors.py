"""Deletion vectors the driver writes (:mod:`resources.vectors`), checked against delta-spark:
its own vectors' bytes for the same positions, and its reading of tables the driver marked
epoch after epoch (with duplicates, a checkpoint, delta-spark's own DELETE in between, a file
whose every row goes), against the multiset the deletions leave; delta-rs's reader too."""

from __future__ import annotations

import glob
import os
import struct
import uuid
import zlib
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

from ivm.errors import InvariantViolation
from resources.lake import TABLE_CONFIGURATION, deleted_positions, snapshot_rows, table_files
from resources.vectors import bitmap, commit_vectors, driver_writable, enable_vectors, z85

pytestmark = pytest.mark.spark


def test_z85_is_the_protocols_example() -> None:
    """PROTOCOL.md's example: a vector at ``ab/deletion_vector_d2c639aa-...bin`` is
    ``ab^-aqEH.-t@S}K{vb[*k^`` (prefix ``ab``)."""
    assert z85(uuid.UUID("d2c639aa-8816-431a-aaf6-d3fe2512ff61").bytes) == "^-aqEH.-t@S}K{vb[*k^"


def test_a_bitmap_is_the_bytes_delta_spark_writes(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    spark.range(0, 200_000).coalesce(1).write.format("delta").option(
        "delta.enableDeletionVectors", "true"
    ).save(uri)
    # array, run and bitmap containers, in more than one 16-bit block
    gone = [3, 4, 7, 11, 70_000, *range(100_000, 104_000), *range(130_000, 160_000, 2)]
    spark.sql(
        f"DELETE FROM delta.`{uri}` WHERE id IN (3, 4, 7, 11, 70000) "
        "OR id BETWEEN 100000 AND 103999 OR (id BETWEEN 130000 AND 159999 AND id % 2 = 0)"
    )
    (path,) = glob.glob(f"{uri}/deletion_vector_*.bin")
    data = Path(path).read_bytes()
    assert data[0] == 1
    (size,) = struct.unpack(">i", data[1:5])
    theirs = data[5 : 5 + size]
    assert struct.unpack(">I", data[5 + size : 9 + size])[0] == zlib.crc32(theirs)
    assert bitmap(np.array(gone)) == theirs


def _rows(i: int, n: int) -> pa.Table:
    """File ``i``: ``n`` rows, keys repeating (duplicates), one NULL key."""
    keys = [None if j == 0 else i * 10 + j % 4 for j in range(n)]
    return pa.table({"k": pa.array(keys, pa.int64()), "s": [f"v{j % 3}" for j in range(n)]})


def test_marked_rows_leave_every_readers_view_exactly(spark, tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    for i in range(4):
        write_deltalake(uri, _rows(i, 12), mode="append", configuration=dict(TABLE_CONFIGURATION))
    expected = Counter()
    for i in range(4):
        expected.update(tuple(r.values()) for r in _rows(i, 12).to_pylist())
    assert enable_vectors(uri) and not enable_vectors(uri)
    rng = np.random.default_rng(7)
    for epoch in range(1, 15):
        if epoch == 6:  # delta-spark's own vector on the same files, then the driver's on top
            spark.sql(f"DELETE FROM delta.`{uri}` WHERE s = 'v2' AND k = 11")
            expected = Counter({r: n for r, n in expected.items() if r != (11, "v2")})
        files = table_files(uri)
        gone = deleted_positions(uri, files)
        deletions = {}
        for f in files:
            live = np.setdiff1d(np.arange(f.num_records), gone.get(f.uri, []))
            if epoch == 3 and f is files[0]:
                take = live  # every row of the file: it leaves the table
            elif rng.random() < 0.7:
                take = rng.choice(live, size=min(len(live), 2), replace=False)
            else:
                continue
            rows = pq.read_table(f.uri).take(pa.array(take))
            expected.subtract(tuple(r.values()) for r in rows.to_pylist())
            deletions[os.path.relpath(f.uri, uri)] = take
        result = commit_vectors(uri, app_id="t", epoch=epoch, deletions=deletions)
        assert result.committed
        expected = +expected
        assert Counter(tuple(r.values()) for r in snapshot_rows(DeltaTable(uri)).to_pylist()) == (
            expected
        ), epoch
        assert Counter(tuple(r) for r in spark.read.format("delta").load(uri).collect()) == (
            expected
        ), epoch
        if epoch == 3:
            assert len(table_files(uri)) == 3
    assert glob.glob(f"{uri}/_delta_log/*.checkpoint.parquet")  # replayed from one since
    version = DeltaTable(uri).version()
    assert not commit_vectors(uri, app_id="t", epoch=14, deletions={}).committed
    assert DeltaTable(uri).version() == version


def test_a_row_deleted_twice_commits_nothing(tmp_path: Path) -> None:
    uri = str(tmp_path / "t")
    write_deltalake(uri, _rows(0, 8), configuration=dict(TABLE_CONFIGURATION))
    enable_vectors(uri)
    (f,) = table_files(uri)
    name = os.path.relpath(f.uri, uri)
    commit_vectors(uri, app_id="t", epoch=1, deletions={name: np.array([2, 5])})
    version = DeltaTable(uri).version()
    for bad in ([5], [8]):  # deleted already; past the file's rows
        with pytest.raises(InvariantViolation, match="deleted already or past its 8 rows"):
            commit_vectors(uri, app_id="t", epoch=2, deletions={name: np.array(bad)})
    assert DeltaTable(uri).version() == version


def test_tables_with_features_it_does_not_honour_are_left_to_delta_spark(spark, tmp_path) -> None:
    uri = str(tmp_path / "t")
    spark.range(3).write.format("delta").option("delta.columnMapping.mode", "name").save(uri)
    assert "columnMapping" in (driver_writable(uri, DeltaTable(uri)) or "")
    assert driver_writable("s3://bucket/t", None) == "the table is not on the local file system"
