"""``ops.rows``: NULL-safe matching of rows the driver holds, against a nested-loop reference
(no Spark)."""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from ops import rows

SCHEMA = pa.schema([("a", pa.int64()), ("b", pa.string())])


@pytest.mark.parametrize("prefilter", [0, 10_000_000], ids=["first column tested", "joined whole"])
def test_null_safe_matches_pairs_equal_rows_nulls_included(monkeypatch, prefilter: int) -> None:
    """Every pair of a row and a key equal on every column, NULL equal to NULL, ordered by
    row, whether the rows are first narrowed by their first column or joined whole."""
    monkeypatch.setattr(rows, "PREFILTER_ROWS", prefilter)
    rng = random.Random(3)

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
