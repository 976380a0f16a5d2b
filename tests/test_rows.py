"""``ops.rows``: NULL-safe matching of rows the driver holds, against a nested-loop reference
(no Spark)."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import pyarrow as pa
import pytest

from ops import rows

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string())])


def test_null_safe_matches_pairs_equal_rows_nulls_included() -> None:
    """Every pair of a row and a key equal on every column, NULL equal to NULL, ordered by
    row."""
    _pairs_equal_rows_nulls_included(random.Random(3))


def _pairs_equal_rows_nulls_included(rng: random.Random) -> None:
    """150 random tables of rows and keys: :func:`rows.null_safe_matches` against a nested
    loop."""

    def table(n: int) -> pa.Table:
        a = [rng.choice([None, 1, 2, 3, 4, 5, 6]) for _ in range(n)]
        b = [rng.choice([None, "x", "y"]) for _ in range(n)]
        return pa.table({"a": a, "b": b}, schema=SCHEMA)

    for _ in range(150):
        held, keys = table(rng.choice([0, 5, 60, 400])), table(rng.randint(1, 6))
        got = rows.null_safe_matches(held, keys, ["a", "b"])
        found = list(zip(*(got.column(c).to_pylist() for c in ("_row", "_key")), strict=True))
        assert [r for r, _ in found] == sorted(r for r, _ in found)
        expected = [
            (i, j)
            for i, r in enumerate(held.to_pylist())
            for j, k in enumerate(keys.to_pylist())
            if r == k
        ]
        assert sorted(found) == expected


_VALUES = {
    "int64": (pa.int64(), lambda r: r.randint(-50, 50)),
    "int32": (pa.int32(), lambda r: r.randint(-5, 5)),
    "string": (pa.string(), lambda r: r.choice(["", "a", "ab", "b", "é", "z", "ü", "\U0001f600"])),
    "decimal": (pa.decimal128(12, 2), lambda r: Decimal(r.randint(-999, 999)) / 100),
    "date": (pa.date32(), lambda r: date(1995, 1, 1) + timedelta(days=r.randint(0, 40))),
    "timestamp": (
        pa.timestamp("us", tz="UTC"),
        lambda r: datetime(2020, 1, 1, tzinfo=UTC) + timedelta(microseconds=r.randint(0, 99)),
    ),
    "boolean": (pa.bool_(), lambda r: r.random() < 0.5),
}


def _sorted_table(rng: random.Random, kinds: list[str], n: int) -> pa.Table:
    """``n`` rows of random values of ``kinds`` (NULLs among them), sorted as the engine
    writes files: ascending, NULLs first, column after column."""
    columns = {
        f"c{i}": pa.array(
            [None if rng.random() < 0.1 else _VALUES[k][1](rng) for _ in range(n)], _VALUES[k][0]
        )
        for i, k in enumerate(kinds)
    }
    table = pa.table(columns)
    return table.sort_by([(c, "ascending", "at_start") for c in columns])


def _wanted(rng: random.Random, kinds: list[str], table: pa.Table) -> pa.Table:
    """Some of ``table``'s keys and some drawn at random (absent, most of them): a few, or
    many (each search step then narrows many ranges at once)."""
    n = rng.choice([rng.randint(0, 8), 200])
    drawn = {
        f"c{i}": pa.array(
            [None if rng.random() < 0.2 else _VALUES[k][1](rng) for _ in range(n)], _VALUES[k][0]
        )
        for i, k in enumerate(kinds)
    }
    present = (
        table.take(pa.array([rng.randrange(table.num_rows) for _ in range(3 + n // 4)], pa.int64()))
        if table.num_rows
        else None
    )
    drawn_table = pa.table(drawn, schema=table.schema)
    return pa.concat_tables([drawn_table, present]) if present is not None else drawn_table


@pytest.mark.parametrize(
    "kinds",
    [[k] for k in sorted(_VALUES)]
    + [["string", "int64", "date"], ["boolean", "decimal", "timestamp"]],
    ids=lambda kinds: "+".join(kinds),
)
def test_a_sorted_key_finds_the_rows_holding_keys_as_a_scan_would(kinds: list[str]) -> None:
    """Binary search over key columns sorted as the engine writes them finds exactly the
    rows equal to a wanted key (NULL equal to NULL) that a test of every row finds, of every
    ordered type, one column or several."""
    _finds_as_a_scan_would(random.Random(11), kinds)


def _finds_as_a_scan_would(rng: random.Random, kinds: list[str]) -> None:
    """80 sorted tables of ``kinds`` and keys: :meth:`rows.SortedKey.positions` against
    :func:`rows.null_safe_matches`."""
    for _ in range(80):
        table = _sorted_table(rng, kinds, rng.choice([0, 1, 7, 300]))
        chunked = pa.concat_tables([table.slice(0, 3), table.slice(3)])
        index = rows.SortedKey.of(chunked, table.column_names)
        assert index is not None
        wanted = _wanted(rng, kinds, table)
        expected = set(
            rows.null_safe_matches(table, wanted, table.column_names).column("_row").to_pylist()
        )
        got = index.positions(wanted).tolist()
        assert got == sorted(set(got))  # ascending, each once
        assert set(got) == expected


def test_keys_out_of_order_or_of_floats_have_no_index() -> None:
    """The order is checked, not assumed, on every column; floating point (NaN, -0.0) is
    never searched."""

    def of(**columns: list) -> rows.SortedKey | None:
        return rows.SortedKey.of(pa.table(columns), list(columns))

    assert of(a=[1, 3, 2]) is None
    assert of(a=[1, None, 2]) is None  # a NULL after a value
    assert of(a=["b", "a"]) is None
    assert of(a=[0.5, 1.5]) is None
    assert of(a=[1, 1, 2], b=["x", "a", "a"]) is None  # the second column, within equal firsts
    assert of(a=[1, 1, 2], b=["x", None, "a"]) is None
    assert of(a=[None, None, 1, 1, 2], b=[None, "a", None, "b", "a"]) is not None


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (pa.int64(), pa.int32()),
        (pa.int64(), pa.int8()),
        (pa.uint64(), pa.int32()),
        (pa.int32(), pa.uint16()),
    ],
)
def test_keys_past_a_narrower_integer_are_dropped_and_the_rest_cast(source, target) -> None:
    """A lookup's keys of a wider integer type than the arrangement's: those that cannot be
    stored there are dropped (they match nothing), the others cast exactly, NULLs kept."""
    import numpy as np

    lo, hi = (
        int(x)
        for x in (np.iinfo(target.to_pandas_dtype()).min, np.iinfo(target.to_pandas_dtype()).max)
    )
    mine = np.iinfo(source.to_pandas_dtype())
    values = [
        v for v in (lo - 1, lo, 0, 7, hi, hi + 1, None) if v is None or mine.min <= v <= mine.max
    ]
    table = pa.table({"k": pa.array(values, source), "n": list(range(len(values)))})
    kept = rows.in_range(table, pa.schema([("k", target)]))
    assert kept.schema.field("k").type == target
    assert kept.column("k").to_pylist() == [v for v in values if v is None or lo <= v <= hi]
    assert kept.column("n").to_pylist() == [
        i for i, v in enumerate(values) if v is None or lo <= v <= hi
    ]


@pytest.mark.parametrize(
    ("source", "target"),
    [
        (pa.decimal128(15, 2), pa.decimal128(4, 1)),
        (pa.decimal128(38, 10), pa.decimal128(12, 2)),
        (pa.decimal128(20, 0), pa.decimal128(9, 0)),
    ],
)
def test_keys_past_a_narrower_decimal_are_dropped_and_the_rest_cast(source, target) -> None:
    """A lookup's keys of a wider decimal type than the arrangement's: those it cannot hold
    exactly (digits past its scale, or more integral digits) match nothing and are dropped,
    the others cast exactly, NULLs kept."""
    from decimal import Decimal

    ulp = Decimal(1).scaleb(-source.scale)
    top = Decimal(10) ** (target.precision - target.scale)
    step = Decimal(1).scaleb(-target.scale)
    candidates = [Decimal(0), Decimal("1.5"), Decimal("-7"), top - step, -(top - step), top]
    candidates += [-top, Decimal("1.5") + ulp, Decimal("3") - ulp, None]
    limit = Decimal(10) ** (source.precision - source.scale)
    values = [v for v in candidates if v is None or (abs(v) < limit and v == v.quantize(ulp))]

    def fits(v: Decimal | None) -> bool:
        return v is None or (abs(v) < top and v == v.quantize(step))

    table = pa.table({"k": pa.array(values, source), "n": list(range(len(values)))})
    kept = rows.in_range(table, pa.schema([("k", target)]))
    assert kept.schema.field("k").type == target
    assert kept.column("k").to_pylist() == [v for v in values if fits(v)]
    assert kept.column("n").to_pylist() == [i for i, v in enumerate(values) if fits(v)]
    assert any(not fits(v) for v in values) and sum(map(fits, values)) >= 4
