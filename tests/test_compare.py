"""The oracle's multiset comparison and the diff-log single-epoch check, no Spark.

``multiset_differences`` decides whether a view equals DuckDB's result: a comparison that
misses a difference would let every oracle test pass on wrong answers, and one that rounds
would hide the arithmetic defects it is there to find. Exact columns are compared exactly;
floating-point ones within the stated relative tolerance (exactly decided at its boundary),
DuckDB's doubles against the engine's decimals within half a unit of the decimal's scale.
"""

from __future__ import annotations

import math
from collections import Counter
from decimal import Decimal
from fractions import Fraction

import pyarrow as pa
import pytest

import engine.oracle
from engine.oracle import Comparison, multiset_differences, table_differences
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


def test_floats_compare_within_the_relative_tolerance_and_string_layouts_alike() -> None:
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


def _floats(*columns: list, keys: list | None = None) -> pa.Table:
    cols = {f"x{i}": pa.array(c, pa.float64()) for i, c in enumerate(columns)}
    return pa.table(({"k": pa.array(keys, pa.int64())} if keys is not None else {}) | cols)


def _total(c: Counter) -> int:
    return sum(c.values())


def test_floats_are_equal_within_a_relative_tolerance_at_any_magnitude() -> None:
    """1e-9 of the larger magnitude, whatever it is. Rounding to 9 decimal places, as the
    oracle did, calls 1e20 and 1.0000000005e20 different (by 5e10) and 1e-10 and 1.9e-10
    equal (both 0.0); below the absolute floor (1e-12) values are equal."""
    keys = [1, 2, 3, 4]
    expected = _floats([1e20, 1e-10, 1e300, 3e-30], keys=keys)
    same = _floats([1e20 * (1 + 5e-10), 1e-10 * (1 + 5e-10), 1e300 * (1 - 9e-10), 6e-30], keys=keys)
    assert multiset_differences(expected, same) == (Counter(), Counter())
    off = _floats([1e20 * (1 + 2e-9), 1.9e-10, 1e300 * (1 - 2e-9), 6e-30], keys=keys)
    missing, extra = multiset_differences(expected, off)
    assert missing == Counter({(1, 1e20): 1, (2, 1e-10): 1, (3, 1e300): 1})
    assert extra == Counter(
        {(1, 1e20 * (1 + 2e-9)): 1, (2, 1.9e-10): 1, (3, 1e300 * (1 - 2e-9)): 1}
    )


def test_near_zero_the_absolute_floor_applies_decided_exactly() -> None:
    """0.0 against the double nearest 1e-12 (just below it) is equal; against the next
    double up, not: the boundary is decided in exact arithmetic, not in SQL's doubles."""
    below = 1e-12
    above = math.nextafter(below, 1.0)
    assert Fraction(below) < Fraction(1, 10**12) < Fraction(above)
    assert multiset_differences(_floats([0.0]), _floats([below])) == (Counter(), Counter())
    missing, extra = multiset_differences(_floats([0.0]), _floats([above]))
    assert (missing, extra) == (Counter({(0.0,): 1}), Counter({(above,): 1}))


def test_the_issues_cancelled_sum_is_reported() -> None:
    """``sum(v)`` over 1e20, 1.0, 0.5 after deleting the 1e20 row: 1.5 from scratch, 0.0
    from a running double sum. The difference must be reported, and say how it compared."""
    expected = _floats([1.5], keys=[1])
    actual = _floats([0.0], keys=[1])
    diff = table_differences(expected, actual)
    assert (diff.missing, diff.extra) == (Counter({(1, 1.5): 1}), Counter({(1, 0.0): 1}))
    c = Comparison("v", 2, 1, 1, diff.missing, diff.extra, diff.tolerances())
    text = c.describe()
    assert "DIFFERENT" in text and "1 rows missing" in text
    assert "x0: DOUBLE within 1E-9 relative, 1E-12 absolute near zero" in text


def test_nan_infinities_and_signed_zero() -> None:
    """NaN equals NaN, each infinity only itself, -0.0 equals 0.0, NULL only NULL: as
    multisets, in any order."""
    nan, inf = math.nan, math.inf
    expected = _floats([nan, inf, -inf, -0.0, None, nan])
    actual = _floats([0.0, None, -inf, float("nan"), inf, float("nan")])
    assert multiset_differences(expected, actual) == (Counter(), Counter())
    wrong = _floats([0.0, None, inf, float("nan"), inf, 1.0])
    missing, extra = multiset_differences(expected, wrong)
    assert (-inf,) in missing and (math.nan,) in missing and _total(missing) == 2
    assert {k[0] for k in extra} == {inf, 1.0} and _total(extra) == 2
    assert Counter({str(k[0]): v for k, v in missing.items()}) == Counter({"-inf": 1, "nan": 1})


def test_duplicates_are_matched_as_multisets() -> None:
    """Rows repeat: each copy needs its own partner within the tolerance, and copies that
    differ in the last bits pair up whichever way they come."""
    x = 0.1 + 0.2  # 0.30000000000000004
    expected = _floats([x, x, 0.3, 7.0], keys=[1, 1, 1, 2])
    actual = _floats([0.3, 0.3, x, 7.0], keys=[1, 1, 1, 2])
    assert multiset_differences(expected, actual) == (Counter(), Counter())
    fewer = _floats([0.3, x, 7.0], keys=[1, 1, 2])
    missing, extra = multiset_differences(expected, fewer)
    assert _total(missing) == 1 and not extra and next(iter(missing))[0] == 1
    more = _floats([0.3, x, x, 7.0, 7.0], keys=[1, 1, 1, 2, 2])
    assert multiset_differences(expected, more) == (Counter(), Counter({(2, 7.0): 1}))


def test_two_float_columns_are_matched_not_just_sorted() -> None:
    """Sorted by their first float column, the rows of one group would pair (1.0, 5.0) with
    (1.0, 3.0): the rows that differ are matched again, by augmenting paths."""
    e = 1.0 + 2**-40  # within the tolerance of 1.0, but sorts after it
    expected = _floats([1.0, e], [5.0, 3.0], keys=[1, 1])
    actual = _floats([1.0, e], [3.0, 5.0], keys=[1, 1])
    assert multiset_differences(expected, actual) == (Counter(), Counter())
    wrong = _floats([1.0, e], [3.0, 6.0], keys=[1, 1])
    missing, extra = multiset_differences(expected, wrong)
    assert missing == Counter({(1, 1.0, 5.0): 1}) and extra == Counter({(1, e, 6.0): 1})


def test_duckdbs_double_against_the_engines_decimal_at_its_scale() -> None:
    """DuckDB's AVG over decimals is a DOUBLE, Spark's a DECIMAL(p+4, s+4): equal when the
    double is within half a unit of the decimal's last place (plus its own rounding)."""
    decimal = pa.decimal128(14, 2)
    duck = pa.table({"g": ["a", "b"], "avg": pa.array([1.005, 2.5], pa.float64())})
    # 1.005 is the double 1.00499999999999989...: within half a cent of 1.00 and, by its
    # own rounding, of 1.01: both are decided exactly.
    for rounded in ("1.00", "1.01"):
        spark = pa.table(
            {"g": ["a", "b"], "avg": pa.array([Decimal(rounded), Decimal("2.50")], decimal)}
        )
        diff = table_differences(duck, spark)
        assert (diff.missing, diff.extra) == (Counter(), Counter()), rounded
    (rule,) = diff.tolerances()
    assert rule == (
        "avg: DuckDB's DOUBLE against the engine's DECIMAL(14,2): equal within half a unit "
        "of scale 2 (5E-3) plus 2^-52 of the double's magnitude"
    )
    spark = pa.table(
        {"g": ["a", "b"], "avg": pa.array([Decimal("0.99"), Decimal("2.51")], decimal)}
    )
    missing, extra = multiset_differences(duck, spark)
    assert missing == Counter({("a", 1.005): 1, ("b", 2.5): 1})
    assert extra == Counter({("a", Decimal("0.99")): 1, ("b", Decimal("2.51")): 1})
    # The double is never cast to the decimal first (which would round it to 1.00 or 1.01).
    assert engine.oracle.align_types(duck, spark).schema.field("avg").type == pa.float64()


def test_decimals_are_exact_at_the_engines_scale() -> None:
    """A DuckDB decimal of larger scale is rounded half up to the engine's (as Spark
    rounds), then compared exactly; a decimal of the same scale exactly; a difference in
    the last place is one."""
    duck = pa.table(
        {"d": pa.array([Decimal("1.23455"), Decimal("-1.23455")], pa.decimal128(38, 5))}
    )
    spark = pa.table({"d": pa.array([Decimal("1.2346"), Decimal("-1.2346")], pa.decimal128(20, 4))})
    diff = table_differences(duck, spark)
    assert (diff.missing, diff.extra) == (Counter(), Counter())
    assert diff.tolerances() == (
        "d: DuckDB's DECIMAL(38,5) rounded half up to the engine's scale 4 (DECIMAL(20,4)), "
        "then exact",
    )
    off = pa.table({"d": pa.array([Decimal("1.2345"), Decimal("-1.2346")], pa.decimal128(20, 4))})
    assert _total(multiset_differences(duck, off)[1]) == 1
    wide = pa.table({"d": pa.array([Decimal("1.2346000001")], pa.decimal128(38, 10))})
    narrow = pa.table({"d": pa.array([Decimal("1.2346")], pa.decimal128(38, 10))})
    assert _total(multiset_differences(wide, narrow)[0]) == 1


def test_columns_of_different_kinds_never_compare_equal() -> None:
    duck = pa.table({"x": pa.array(["1", None])})
    spark = pa.table({"x": pa.array([1, None], pa.int64())})
    diff = table_differences(duck, spark)
    assert _total(diff.missing) == 1 and _total(diff.extra) == 1
    assert diff.tolerances()[0].startswith("x: types differ (DuckDB string, engine int64)")


def test_large_differences_are_counted_and_said_to_be_unmatched(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Past ``SETTLE_ROWS`` rows in the groups that differ, the rank pairing's verdicts
    stand: still every difference reported, and the comparison says it did not match again."""
    monkeypatch.setattr(engine.oracle, "SETTLE_ROWS", 10)
    xs = [float(i) for i in range(100)]
    ys = [x * (1 + 1e-12) for x in xs]
    ys[40] = 40.5
    diff = table_differences(_floats(xs), _floats(ys))
    assert (diff.missing_rows, diff.extra_rows) == (1, 1)
    assert diff.missing == Counter({(40.0,): 1}) and diff.extra == Counter({(40.5,): 1})
    assert "not matched again" in diff.notes[0]
    assert multiset_differences(_floats(xs), _floats([x * (1 - 1e-12) for x in xs])) == (
        Counter(),
        Counter(),
    )


def test_a_large_table_is_compared_in_sql(monkeypatch: pytest.MonkeyPatch) -> None:
    """200k rows with floats off in the last bits: nothing but the one real difference
    reaches Python (the matching in Python is not called for the equal groups)."""
    n = 200_000
    keys = list(range(n))
    xs = [i / 7 for i in range(n)]
    ys = [x * (1 + 3e-16) for x in xs]
    ys[123] = -1.0
    calls = []
    real = engine.oracle._match
    monkeypatch.setattr(engine.oracle, "_match", lambda *a: calls.append(len(a[2])) or real(*a))
    missing, extra = multiset_differences(_floats(xs, keys=keys), _floats(ys, keys=keys))
    assert missing == Counter({(123, 123 / 7): 1}) and extra == Counter({(123, -1.0): 1})
    assert calls == [1]


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
