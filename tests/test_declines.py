"""The driver's declines, with no Spark: decided from the schemas and types before anything is
written (lossless conversions, files read as Spark reads them, Arrow's grouping), each with its
reason recorded for the view being refreshed; genuine errors are not turned into declines."""

from __future__ import annotations

from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from ivm.errors import NotOnDriver
from ops.arrange import write_held_updates
from ops.declines import declined, recorded
from ops.ingest import consolidated_on, file_rows_declined, read_file_rows
from ops.rows import cast_loss, lossless

LOSSLESS = [
    (pa.int32(), pa.int64(), True),
    (pa.int64(), pa.int32(), False),
    (pa.uint32(), pa.int64(), True),
    (pa.uint64(), pa.int64(), False),
    (pa.int64(), pa.decimal128(19, 0), True),
    (pa.int64(), pa.decimal128(20, 2), False),
    (pa.decimal128(10, 2), pa.decimal128(12, 3), True),
    (pa.decimal128(10, 2), pa.decimal128(10, 3), False),
    (pa.decimal128(10, 2), pa.decimal128(12, 1), False),
    (pa.large_string(), pa.string(), True),
    (pa.string(), pa.binary(), False),
    (pa.timestamp("ms", tz="UTC"), pa.timestamp("us", tz="UTC"), True),
    (pa.timestamp("ns", tz="UTC"), pa.timestamp("us", tz="UTC"), False),
    (pa.timestamp("us"), pa.timestamp("us", tz="UTC"), False),
    (pa.float32(), pa.float64(), True),
    (pa.float64(), pa.float32(), False),
    (pa.null(), pa.int32(), True),
    (pa.list_(pa.int32()), pa.list_(pa.field("element", pa.int64())), True),
    (pa.struct([("a", pa.int64())]), pa.struct([("a", pa.int32())]), False),
]


@pytest.mark.parametrize("source,target,expected", LOSSLESS)
def test_lossless_conversions(source, target, expected):
    assert lossless(source, target) is expected


def test_cast_loss_names_the_column():
    rows = pa.schema([("k", pa.int64()), ("v", pa.string())])
    assert cast_loss(rows, pa.schema([("k", pa.int64())])) is None
    assert cast_loss(rows, pa.schema([("w", pa.int64())])) == "no column w"
    assert "column k: int64" in (cast_loss(rows, pa.schema([("k", pa.int32())])) or "")


def test_declines_are_recorded_per_thread_and_nest():
    declined("outside any record: logged only")
    with recorded() as outer:
        declined("a")
        with recorded() as inner:
            declined("b")
            declined("b")
        declined("a")
    assert inner == ["b"]
    assert outer == ["a", "b"]


def test_files_spark_reads_otherwise_are_declined_before_reading(tmp_path: Path):
    path = str(tmp_path / "part.parquet")
    pq.write_table(pa.table({"K": pa.array([1, 2], pa.int32()), "big": [2**40, 1]}), path)
    wanted = pa.schema([("k", pa.int64())])
    assert file_rows_declined(path, wanted) is None
    assert read_file_rows(path, wanted).to_pydict() == {"k": [1, 2]}
    for schema, why in [
        (pa.schema([("missing", pa.int64())]), "lacks column missing"),
        (pa.schema([("big", pa.int32())]), "big: int64 does not convert to int32"),
    ]:
        assert why in (file_rows_declined(path, schema) or "")
        with pytest.raises(NotOnDriver, match=why):
            read_file_rows(path, schema)


def test_nested_columns_are_summed_by_spark_and_say_so():
    updates = pa.table({"k": [1, 1], "tags": [[1], [1]], "_diff": [1, -1]})
    with recorded() as reasons:
        assert consolidated_on(updates, ["k", "tags"]) is None
        assert consolidated_on(updates, ["k"]).num_rows == 0
    assert reasons == ["column tags summed by Spark (Arrow does not group nested values)"]


def test_held_rows_of_another_type_are_written_by_spark(tmp_path: Path):
    """Rows whose types would lose values in the table's are declined before anything is
    staged (the table's folder is never made); the reason is recorded."""
    uri = str(tmp_path / "arrangement")
    rows = pa.table(
        {
            "k": pa.array([Decimal("12.345")], pa.decimal128(6, 3)),
            "_time": pa.array([1], pa.int64()),
            "_diff": pa.array([1], pa.int64()),
        }
    )
    schema = pa.schema([("k", pa.decimal128(6, 2)), ("_time", pa.int64()), ("_diff", pa.int64())])
    with recorded() as reasons:
        assert (
            write_held_updates(rows, uri, ["k"], schema, app_id=uri, epoch=1, metadata={}) is None
        )
    assert reasons == [
        "rows written by Spark (column k: decimal128(6, 3) does not convert to "
        "decimal128(6, 2) exactly)"
    ]
    assert not Path(uri).exists()
