"""The bench's rows-scanned measure (``bench.scans``) on real Spark scans.

It reads Spark's SQL status store, an internal API: these tests fail if a Spark upgrade
changes what it exposes, instead of the benchmark silently reporting zeros. The count must be
what the scans returned after Parquet's page skipping (not the rows in the files opened),
split by the part of the lake the files are in, and only for the queries after the mark.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pyspark.sql import functions as F

from bench.scans import ScanRows, area_of
from ops.arrange import LOOKUP_READ, parquet_options

ROWS = 20_000


def test_files_are_counted_by_the_part_of_the_lake_they_are_in() -> None:
    root = "/x/lake"
    assert area_of("file:/x/lake/arrangements/a__by__k/p.parquet", root) == "arrangements"
    assert area_of("file:///x/lake/state/v/r0.distinct/p.parquet", root) == "state"
    assert area_of("/x/lake/views/v/rows-e1/p.parquet", "file:/x/lake/") == "views"
    assert area_of("file:/x/lake/logs/v/updates-e1/p.parquet", root) == "logs"
    assert area_of("file:/x/data/orders/p.parquet", root) == "sources"
    assert area_of("file:/x/lake2/views/v/p.parquet", root) == "sources"  # not under the root
    assert area_of("file:/x/lake/_ivm/epochs/p.parquet", root) == "sources"


@pytest.mark.spark
def test_rows_scanned_are_counted_after_page_skipping_per_area(spark, tmp_path: Path) -> None:
    lake = tmp_path / "lake"
    arranged, source = lake / "arrangements" / "t__by__k", tmp_path / "data" / "t"
    rows = spark.range(ROWS).select(F.col("id").alias("k"), (F.col("id") * 2).alias("v"))
    writer = rows.coalesce(1).sortWithinPartitions("k").write
    for option, value in parquet_options().items():
        writer = writer.option(option, value)
    writer.parquet(str(arranged))  # 1,000-row pages: a key lookup skips the others
    rows.coalesce(1).write.parquet(str(source))

    scans = ScanRows(spark, str(lake))
    spark.read.parquet(str(source)).count()  # before the mark: not counted
    scans.mark()
    looked_up = spark.read.options(**LOOKUP_READ).parquet(str(arranged)).where(F.col("k") == 5)
    assert looked_up.collect()[0]["v"] == 10
    assert spark.read.parquet(str(source)).select(F.sum("v")).collect()[0][0] == ROWS * (ROWS - 1)
    counted = scans.rows()

    assert counted["sources"] == ROWS
    assert 1 <= counted["arrangements"] <= 1_000  # one page of the 20, not the file's rows
    assert set(counted) == {"sources", "arrangements"}
    scans.mark()
    assert scans.rows() == {}
