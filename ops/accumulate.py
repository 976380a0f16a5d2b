"""Accumulable state computed by the driver when the change is small: an accumulable
branch's sums per group, and a DISTINCT's counts per ``(group, value)``.

:func:`ops.reduce._accumulate` and :func:`ops.reduce._accumulated_values` keep an accumulable
branch (COUNT, SUM, AVG, BOOL_AND/OR) on Spark: a job sums the change per group and writes
it, then a lookup collects the touched groups, reads their state rows and sums them at the old
and the new epoch, a few more jobs however small the change (SF1 ``revenue_by_segment``: two
such branches, 25 groups). When the inputs' change is small (the engine's ``small_change``),
the groups' sums have at most :data:`~ops.buffer.DRIVER_STATE_ROWS` rows and the touched
groups' state rows are few (:func:`ops.arrange.lookup_rows`), this module does it on the
driver: one Spark job collects the change's per-group sums, the touched groups' state is read
and summed exactly in Python (integers and decimals), the sums are written by the driver, and
the groups' state at old and new comes back to Spark as local relations, where the results
(AVG's division, NULL rules) are the same expressions as on Spark's path.

A DISTINCT inside an aggregate (:func:`ops.reduce._distinct_change`) keeps a count per
``(group, value)``; :func:`distinct_on_driver` collects the change's counts (one job), reads
the old counts of those values (from the driver's memory once it holds the table,
:mod:`resources.filecache`), writes the change and returns the values whose count crossed
zero, with no join, checkpoint or write job on Spark.

Both hand back to Spark (None, nothing written) for floating-point columns (Spark's own
summation order and NaN rules), a global aggregate, or too many rows.

Contract in ``(data, time, diff)`` terms: :func:`accumulate_on_driver` is
:func:`ops.reduce._group_sums` written then :func:`ops.reduce._accumulated_values`: the
state table gets at ``new`` one row per touched group whose sums are not all zero (``(keys...,
state columns..., _time)``), and the branch's state at ``old`` and at ``new`` is returned for
the touched groups that have rows. :func:`distinct_on_driver`: the counts table gets the
change at ``new``; returned are ``(group, value, ±1)`` for each value whose count rose from
zero (+1) or fell to zero (-1).
"""

from __future__ import annotations

import decimal
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from ivm.plan.reduce import StateTable
from ops import DIFF, TIME, buffer
from ops.buffer import Row, summed
from ops.declines import declined
from ops.sink import exact_types

EXACT = decimal.Context(prec=200, traps=[decimal.Inexact, decimal.Overflow])
"""Decimal sums in as many digits as they need: a state sum of DECIMAL(38, s) values never
reaches 200 digits, and an inexact or overflowing step raises rather than rounds."""


def _rows_at_most(store: Any) -> int:
    """How many rows the driver may take on for ``store``'s refresh (0: none: Spark must)."""
    most = buffer.DRIVER_STATE_ROWS  # read when called: tests turn the driver's part off
    usable = store.small and store.read_rows is not None and store.write_rows is not None
    return max(most, 0) if usable else 0


def _declined(table: StateTable, why: str) -> None:
    """Record that Spark keeps ``table`` this epoch, and why (:mod:`ops.declines`)."""
    declined(f"state {table.name} kept by Spark ({why})")


def _local(spark: Any, rows: Sequence[Row], schema: pa.Schema) -> DataFrame:
    """``rows`` (tuples in ``schema``'s column order) as a Spark local relation."""
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)
    return spark.createDataFrame(table, schema=from_arrow_schema(schema))


def accumulate_on_driver(
    store: Any,  # ops.reduce.StateStore
    table: StateTable,
    sums: DataFrame,
    keys: Sequence[str],
    state_columns: Sequence[str],
    touched: Callable[[int], pa.Table | None],
) -> tuple[DataFrame, DataFrame] | None:
    """Write the change's per-group ``sums`` (``(keys..., state columns...)``, all-zero rows
    dropped; ``_rows`` among them) to ``table`` at ``store.new``; return the touched groups' state
    at old and new (``(keys..., state columns...)``, groups with rows only), or None (nothing
    written) when Spark must. ``touched(most)``: the touched groups' keys, or None when there
    are more than ``most``."""
    most = _rows_at_most(store)
    if not most:
        return None  # not a small change: Spark's, nothing declined
    if not exact_types(sums.schema):
        return _declined(table, "its types are Spark's")
    held = sums.limit(most + 1).toArrow()
    if held.num_rows > most:
        return _declined(table, f"more than {most} groups changed")
    groups = touched(most)
    if groups is None:
        return _declined(table, f"more than {most} groups touched")
    names = list(state_columns)
    old: dict[Row, list[Any]] = {}
    if store.old > 0:
        rows = store.read_rows(table, keys, groups, store.old)
        if rows is None:
            return _declined(table, "the touched groups' state is too large to read")
        _add(old, rows.select([*keys, *names]).to_pylist(), keys, names)
    new = {g: list(v) for g, v in old.items()}
    change = held.select([*keys, *names])
    _add(new, change.to_pylist(), keys, names)
    store.write_rows(
        table, change.append_column(TIME, pa.array([store.new] * change.num_rows, pa.int64()))
    )
    rows_at = names.index("_rows")
    old_rows, new_rows = (
        _local(store.spark, [(*g, *v) for g, v in state.items() if v[rows_at] > 0], change.schema)
        for state in (old, new)  # a group exists while it has rows
    )
    return old_rows, new_rows


def _add(
    state: dict[Row, list[Any]], rows: list[dict], keys: Sequence[str], names: Sequence[str]
) -> None:
    """Sum ``rows``' state columns into ``state``, per group (NULL keys equal, as grouping),
    exactly: decimals in as many digits as they need (Python's default context keeps 28)."""
    with decimal.localcontext(EXACT):
        _add_exactly(state, rows, keys, names)


def _add_exactly(
    state: dict[Row, list[Any]], rows: list[dict], keys: Sequence[str], names: Sequence[str]
) -> None:
    for r in rows:
        group = tuple(r[k] for k in keys)
        sums = state.setdefault(group, [0] * len(names))
        for i, n in enumerate(names):
            sums[i] += r[n] or 0


def distinct_on_driver(
    store: Any,  # ops.reduce.StateStore
    table: StateTable,
    change: DataFrame,
    columns: Sequence[str],
) -> DataFrame | None:
    """Apply ``change`` (``(columns..., _diff, _time)``, one row per ``columns`` tuple) to
    the counts in ``table``; return the distinct set's change ``(columns..., _diff)``, or
    None (nothing written) when Spark must."""
    most = _rows_at_most(store)
    if not most or store.old <= 0:
        return None  # a build, or not a small change: Spark's, nothing declined
    if not exact_types(change.schema):
        return _declined(table, "its types are Spark's")
    held = change.limit(most + 1).toArrow()
    if held.num_rows > most:
        return _declined(table, f"more than {most} values changed")
    cols = list(columns)
    rows = store.read_rows(table, cols, held.select(cols), store.old)
    if rows is None:
        return _declined(table, "the values' counts are too large to read")
    old = summed(rows.to_pylist(), cols)
    store.write_rows(table, held)
    flips = []
    for row, n in summed(held.to_pylist(), cols).items():
        before = old.get(row, 0)
        flip = int(before + n > 0) - int(before > 0)
        if flip:
            flips.append((*row, flip))
    schema = held.select(cols).schema.append(pa.field(DIFF, pa.int64(), nullable=False))
    return _local(store.spark, flips, schema)
