"""Deciding on the driver, without Spark, whether a change feed's updates matter to a view:
projected on the columns it reads, do they sum to nothing (:func:`ops.ingest.cancels_on`)?"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from ops.ingest import cancels_on


def feed(rows: list[tuple]) -> pa.Table:
    schema = pa.schema(
        [
            ("k", pa.int64()),
            ("name", pa.string()),
            ("amount", pa.decimal128(12, 2)),
            ("_diff", pa.int64()),
        ]
    )
    return pa.Table.from_pylist(
        [dict(zip(schema.names, r, strict=True)) for r in rows], schema=schema
    )


def test_an_update_of_other_columns_cancels_and_one_of_a_read_column_does_not() -> None:
    update = feed([(1, "a", Decimal("1.00"), -1), (1, "a", Decimal("2.00"), 1)])
    assert cancels_on(update, ["k", "name"])
    assert not cancels_on(update, ["k", "amount"])
    assert not cancels_on(update, ["amount"])


def test_nulls_are_equal_and_undone_rows_cancel_but_duplicates_count() -> None:
    undone = feed(
        [
            (None, None, Decimal("1.00"), 1),
            (None, None, Decimal("1.00"), -1),
            (2, "b", None, -1),
            (2, "b", None, 1),
        ]
    )
    assert cancels_on(undone, ["k", "name", "amount"])
    # One row deleted twice and inserted twice under different amounts, against a row
    # deleted once and inserted three times: only the first sums to nothing on (k, name).
    assert cancels_on(
        feed([(3, "c", Decimal(a), d) for a, d in (("1", -1), ("1", -1), ("2", 1), ("3", 1))]),
        ["k", "name"],
    )
    assert not cancels_on(
        feed([(3, "c", Decimal("1"), -1), (3, "c", Decimal("2"), 1), (3, "c", None, 1)]),
        ["k", "name"],
    )
    swapped = feed([(4, "d", None, 1), (4, "e", None, -1)])  # net 0, yet two rows changed
    assert not cancels_on(swapped, ["k", "name"])
    assert cancels_on(feed([]), ["k"])


def test_columns_arrow_cannot_group_by_are_not_known_to_cancel() -> None:
    nested = pa.table(
        {"k": pa.array([1, 1]), "tags": pa.array([["x"], ["x"]]), "_diff": pa.array([1, -1])}
    )
    assert not cancels_on(nested, ["k", "tags"])
    assert cancels_on(nested, ["k"])
