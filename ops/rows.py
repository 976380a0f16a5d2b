"""Rows the driver holds (Arrow tables): matching them NULL-safely against other rows.

Contract: :func:`null_safe_matches` pairs each row of ``rows`` with the rows of ``keys``
whose ``columns`` equal it, NULL equal to NULL (the grouping semantics Spark's ``<=>`` and
``GROUP BY`` share), so an update ``(data, time, diff)`` can be found among stored rows by its
data however many NULLs it holds. It reads no time or diff: callers sum or check those.
"""

from __future__ import annotations

from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc


def null_safe_matches(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """Every pair ``(_row, _key)`` of a row of ``rows`` and a row of ``keys`` whose
    ``columns`` are equal, NULL equal to NULL, as positions (int64), ordered by ``_row``.

    Arrow's joins never match NULLs, so each column is compared as (is null, value with NULLs
    filled by one value both sides share).

    >>> a = pa.table({"k": [1, None, 2, None]})
    >>> null_safe_matches(a, pa.table({"k": [None, 2]}), ["k"]).to_pydict()
    {'_row': [1, 2, 3], '_key': [0, 1, 0]}
    """
    positions = None
    if rows.num_rows > PREFILTER_ROWS and keys.num_rows:
        # the rows whose first column is among the keys' only
        first = keys.column(columns[0])
        hit = pc.is_in(rows.column(columns[0]), value_set=pc.unique(first), skip_nulls=True)
        if first.null_count:
            hit = pc.or_(hit, pc.is_null(rows.column(columns[0])))
        positions = pc.indices_nonzero(hit)
        rows = rows.select(list(columns)).take(positions)
    pairs = _pairs(rows, keys, columns)
    if positions is None:
        return pairs
    return pa.table({"_row": positions.take(pairs.column("_row")), "_key": pairs.column("_key")})


PREFILTER_ROWS = 10_000
"""Past this many ``rows``, :func:`null_safe_matches` first keeps the rows whose first column
holds one of the keys' values (a hash lookup per row), and joins those only. A 1M-row view
file against 1,500 deleted rows: 0.22s joined whole, 0.01s for the first column's test."""


def _pairs(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """:func:`null_safe_matches` by a join of every row."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return pa.table({"_row": pa.array([], pa.int64()), "_key": pa.array([], pa.int64())})
    left, right, on = {}, {}, []
    for i, c in enumerate(columns):
        a, b = rows.column(c), keys.column(c)
        left[f"_n{i}"], right[f"_n{i}"] = pc.is_null(a), pc.is_null(b)
        on.append(f"_n{i}")
        present = pc.drop_null(pa.concat_arrays([*a.chunks, *b.chunks]))
        if len(present):
            fill = present[0]
            left[f"_k{i}"], right[f"_k{i}"] = pc.fill_null(a, fill), pc.fill_null(b, fill)
            on.append(f"_k{i}")
    probe = pa.table(left).append_column("_row", pa.array(range(rows.num_rows), pa.int64()))
    build = pa.table(right).append_column("_key", pa.array(range(keys.num_rows), pa.int64()))
    pairs = probe.join(build, keys=on, join_type="inner", use_threads=False)
    return pairs.select(["_row", "_key"]).sort_by("_row")


def semi_join_null_safe(rows: pa.Table, keys: pa.Table, columns: Sequence[str]) -> pa.Table:
    """The rows of ``rows`` whose ``columns`` equal a row of ``keys``, NULL equal to NULL,
    each once (however many keys it matches), in their order."""
    if rows.num_rows == 0 or keys.num_rows == 0:
        return rows.slice(0, 0)
    return rows.take(pc.unique(null_safe_matches(rows, keys, columns).column("_row")))
