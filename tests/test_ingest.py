"""Deciding on the driver, without Spark, what a change feed's updates are to a view: projected
on the columns it reads and summed (:func:`ops.ingest.consolidated_on`), what is left, and is
it nothing (:func:`ops.ingest.cancels_on`)?"""

from __future__ import annotations

from decimal import Decimal

import pyarrow as pa

from ops.ingest import cancels_on, consolidated_on


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


def test_the_feed_summed_on_the_columns_read_keeps_only_what_they_see() -> None:
    updates = feed(
        [
            (1, "a", Decimal("1.00"), -1),  # an update of `amount` alone
            (1, "a", Decimal("2.00"), 1),
            (2, "b", Decimal("5.00"), -1),  # an update of `name`
            (2, "c", Decimal("5.00"), 1),
            (3, None, None, 1),  # inserted twice: a duplicate row counts twice
            (3, None, None, 1),
            (4, "d", Decimal("4.00"), 1),  # inserted and deleted again
            (4, "d", Decimal("4.00"), -1),
        ]
    )
    net = consolidated_on(updates, ["name", "k"])
    assert net is not None and net.column_names == ["k", "name", "_diff"]  # the feed's order
    assert sorted(net.to_pylist(), key=lambda r: (r["k"], r["name"] or "")) == [
        {"k": 2, "name": "b", "_diff": -1},
        {"k": 2, "name": "c", "_diff": 1},
        {"k": 3, "name": None, "_diff": 2},
    ]
    assert net.schema.field("k").type == pa.int64()
    every = consolidated_on(updates, ["k", "name", "amount"])
    assert every is not None and every.num_rows == 5  # only the undone insert is gone
    assert consolidated_on(updates, ["k", "missing"]) is None


def test_the_driver_reads_a_logs_updates_in_range_with_or_without_their_time(tmp_path) -> None:
    """``view_changes_by_driver`` keeps the updates with ``lo < _time <= hi`` and gives
    ``_time`` only when asked (it once gave it whenever a file had rows)."""
    import pyarrow.parquet as pq

    from ops.ingest import view_changes_by_driver
    from resources.lake import DataFile, FileStats

    files = []
    for i, times in enumerate(([1, 2, 3], [4, 5])):
        path = tmp_path / f"part-{i}.parquet"
        rows = pa.table(
            {"k": list(range(len(times))), "_time": times, "_diff": [1] * len(times)},
            schema=pa.schema([("k", pa.int64()), ("_time", pa.int64()), ("_diff", pa.int64())]),
        )
        pq.write_table(rows, path)
        files.append(FileStats(DataFile(str(path), {}, rows.num_rows)))
    plain = view_changes_by_driver(files, ["k"], 1, 4)
    assert plain is not None and plain.column_names == ["k", "_diff"]
    assert plain.num_rows == 3
    timed = view_changes_by_driver(files, ["k"], 1, 4, times=True)
    assert timed is not None and timed.column_names == ["k", "_time", "_diff"]
    assert sorted(timed.column("_time").to_pylist()) == [2, 3, 4]
