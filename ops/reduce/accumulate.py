"""The driver's epoch of an accumulable branch, and of a DISTINCT's counts, inside Spark's
path: when the inputs' change is small, the state a branch rendered on Spark
(:func:`ops.reduce.spark.render_reduce`) would read and write through several Spark jobs is read,
summed and written by the driver instead.

Owns that hand-over, not the arithmetic (:mod:`ops.reduce.accumulable`):
:func:`accumulate_on_driver` takes the change's per-group sums Spark computed (one job collects
them), reads the touched groups' state rows (:func:`ops.arrange.lookup_rows`, from the driver's
memory once it holds the table), sums them exactly, writes the change, and hands the groups' state
at old and at new back to Spark as local relations, where the results are the same expressions as on
Spark's path (:func:`ops.reduce.spark._results`). :func:`distinct_on_driver` does the same for a
DISTINCT's ``(group, value)`` counts (:func:`ops.reduce.spark._distinct_change`) and returns the
values whose count crossed zero, with no join, checkpoint or write job on Spark.

Both hand back to Spark (None, nothing written, the reason recorded by :mod:`ops.declines`
where the change was small) for a change that is not small (``Placement.small``, :mod:`ivm.policy`),
types the driver does not write exactly (floating point: Spark's own summation order and NaN
rules), a global aggregate, more rows than the policy's ``driver_state_rows``, or state too
large to read.

Contract in ``(data, time, diff)`` terms: :func:`accumulate_on_driver` is
:func:`ops.reduce.spark._group_sums` written then :func:`ops.reduce.spark._accumulated_values`: the
state table gets at ``new`` one row per touched group whose sums are not all zero (``(keys...,
state columns..., _time)``), and the branch's state at ``old`` and at ``new`` is returned for
the touched groups that have rows. :func:`distinct_on_driver`: the counts table gets the
change at ``new``; returned are ``(group, value, ±1)`` for each value whose count rose from
zero (+1) or fell to zero (-1).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql.pandas.types import from_arrow_schema

from ivm.plan.reduce import StateTable
from ivm.policy import current
from ops import DIFF, TIME
from ops.declines import declined
from ops.reduce import accumulable
from ops.reduce.buffer import Row, summed
from ops.sink import exact_types


def _rows_at_most(store: Any) -> int:
    """How many rows the driver may take on for ``store``'s refresh (0: none: Spark must)."""
    most = current().driver_state_rows
    usable = store.small and store.read_rows is not None and store.write_rows is not None
    return max(most, 0) if usable else 0


def _declined(table: StateTable, why: str) -> None:
    """Record that Spark keeps ``table`` this epoch, and why (:mod:`ops.declines`)."""
    declined(f"state {table.name} kept by Spark ({why})")


def _held(df: DataFrame, most: int, table: StateTable, what: str) -> pa.Table | None:
    """``df`` collected as Arrow (one Spark job) when its types carry over exactly and it has
    at most ``most`` rows; otherwise None, the reason recorded (``what`` changed)."""
    if not exact_types(df.schema):
        return _declined(table, "its types are Spark's")
    held = df.limit(most + 1).toArrow()
    if held.num_rows > most:
        return _declined(table, f"more than {most} {what} changed")
    return held


def _local(spark: Any, rows: Sequence[Row], schema: pa.Schema) -> DataFrame:
    """``rows`` (tuples in ``schema``'s column order) as a Spark local relation."""
    table = pa.Table.from_pylist([dict(zip(schema.names, r, strict=True)) for r in rows], schema)
    return spark.createDataFrame(table, schema=from_arrow_schema(schema))


def accumulate_on_driver(
    store: Any,  # ops.reduce.spark.StateStore
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
    held = _held(sums, most, table, "groups")
    if held is None:
        return None
    groups = touched(most)
    if groups is None:
        return _declined(table, f"more than {most} groups touched")
    names = list(state_columns)
    old: dict[Row, list[Any]] = {}
    if store.old > 0:
        rows = store.read_rows(table, keys, groups, store.old)
        if rows is None:
            return _declined(table, "the touched groups' state is too large to read")
        old = accumulable.summed(rows.select([*keys, *names]).to_pylist(), keys, names)
    change = held.select([*keys, *names])
    new = accumulable.summed(change.to_pylist(), keys, names, start=old)
    store.write_rows(
        table, change.append_column(TIME, pa.array([store.new] * change.num_rows, pa.int64()))
    )
    old_rows, new_rows = (
        _local(store.spark, [(*g, *v) for g, v in existing.items()], change.schema)
        for existing in (accumulable.existing(old, names), accumulable.existing(new, names))
    )
    return old_rows, new_rows


def distinct_on_driver(
    store: Any,  # ops.reduce.spark.StateStore
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
    held = _held(change, most, table, "values")
    if held is None:
        return None
    cols = list(columns)
    rows = store.read_rows(table, cols, held.select(cols), store.old)
    if rows is None:
        return _declined(table, "the values' counts are too large to read")
    old = summed(rows.to_pylist(), cols)
    store.write_rows(table, held)
    counted = summed(held.to_pylist(), cols).items()
    flips = [(*row, flip) for row, flip in accumulable.crossings(old, counted)]
    schema = held.select(cols).schema.append(pa.field(DIFF, pa.int64(), nullable=False))
    return _local(store.spark, flips, schema)
