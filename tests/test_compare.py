"""The oracle's multiset comparison and the diff-log single-epoch check, no Spark.

``multiset_differences`` decides whether a view equals DuckDB's result: a comparison that
misses a difference would let every oracle test pass on wrong answers.
"""

from __future__ import annotations

from collections import Counter
from decimal import Decimal

import pyarrow as pa

from ivm.oracle import multiset_differences
from ops import TIME
from ops.ingest import single_time
from resources.lake import DataFile, FileStats


def _table(xs, ys, ds, string_type: pa.DataType | None = None) -> pa.Table:
    return pa.table(
        {
            "x": pa.array(xs, string_type or pa.string()),
            "y": pa.array(ys, pa.float64()),
            "d": pa.array(ds, pa.decimal128(10, 2)),
        }
    )


def test_equal_multisets_have_no_differences() -> None:
    t = _table(["a", "b", "b", None], [1.5, 2.0, 2.0, None], [Decimal("1.10")] * 3 + [None])
    assert multiset_differences(t, t) == (Counter(), Counter())


def test_differences_count_multiplicities_and_decimals_exactly() -> None:
    expected = _table(
        ["a", "b", "b"], [1.0, 2.0, 2.0], [Decimal("1.10"), Decimal("2.00"), Decimal("2.00")]
    )
    actual = _table(["a", "b", "c"], [1.0, 2.0, 3.0], [Decimal("1.11"), Decimal("2.00"), None])
    missing, extra = multiset_differences(expected, actual)
    assert missing == Counter({("a", 1.0, Decimal("1.10")): 1, ("b", 2.0, Decimal("2.00")): 1})
    assert extra == Counter({("a", 1.0, Decimal("1.11")): 1, ("c", 3.0, None): 1})


def test_floats_compare_to_nine_places_and_string_layouts_alike() -> None:
    expected = _table(["a"], [1.0000000001], [Decimal("1")])
    actual = _table(["a"], [1.0], [Decimal("1")], pa.string_view())
    assert multiset_differences(expected, actual) == (Counter(), Counter())
    off = _table(["a"], [1.00001], [Decimal("1")], pa.string_view())
    missing, extra = multiset_differences(expected, off)
    assert sum(missing.values()) == 1 and sum(extra.values()) == 1


def test_columns_of_other_types_are_compared_row_by_row() -> None:
    expected = pa.table({"x": pa.array([1, 2], pa.int64())})
    actual = pa.table({"x": pa.array([1, 3], pa.int32())})
    assert multiset_differences(expected, actual) == (Counter({(2,): 1}), Counter({(3,): 1}))


def _stats(tmin, tmax) -> FileStats:
    fs = FileStats(DataFile("file:///x.parquet", {}, 1))
    if tmin is not None:
        fs.mins[TIME], fs.maxs[TIME] = tmin, tmax
    return fs


def test_single_time_needs_one_epoch_in_every_file() -> None:
    assert single_time([_stats(3, 3), _stats(3, 3)])
    assert not single_time([_stats(3, 3), _stats(4, 4)])  # two epochs: may repeat data
    assert not single_time([_stats(3, 4)])
    assert not single_time([_stats(None, None)])  # no statistics: cannot tell
    assert not single_time([])
