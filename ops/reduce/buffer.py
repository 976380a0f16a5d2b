"""The driver's epoch of a buffered TopK inside Spark's path, and its renderer: a small
change merged into the touched groups' buffers in Python, the same step
:func:`ops.reduce.spark.render_topk` renders on Spark (:func:`ops.reduce.spark._buffered`).

Owns the TopK buffer's arithmetic in Python: the order of rows (:func:`ranking`, as
:func:`ops.reduce.spark._order_columns`), a group's first rows (:func:`first_rows`, as
:func:`ops.reduce.spark._first_k`), the buffer invariant, and the ranks of the view's rows
(:func:`numbered`, as :func:`ops.reduce.spark._numbered_change`). :func:`refresh_on_driver` runs it
within Spark's path (one Spark job, collecting the change; the state read by
:func:`ops.arrange.lookup_rows` and written as the driver writes a held change), and
:func:`refresh_rows` for a change the driver already holds (:mod:`ops.reduce.driver`).

Buffer invariant: a group's buffer is its first ``n`` rows for some ``n`` (all of them when
the buffer holds the group's count). A change row ranked at or above the buffer's last row
goes into it (a deletion takes its row out); one ranked below changes only the count. A group
left with fewer than ``k`` rows out of more must be refilled from its input evaluated from
scratch: Spark's part.

It hands back to Spark (None, nothing written, the reason recorded by :mod:`ops.declines`
where the change was small) for a group to refill, an ordering or grouping on floating point
(Spark's NaN and -0.0 rules), a type the driver does not write, more rows than the policy's
``driver_state_rows``, or state too large to read.

Contract in ``(data, time, diff)`` terms: given the input's updates ``Δ`` in ``(old, new]``,
the count table holding each group's row count up to ``old`` and the buffer table its first
rows, returns the TopK's updates at ``new`` (``-1`` for each old result row of a touched group,
``+1`` for each new one, consolidated) and appends at ``new`` the touched groups' count change
and buffer change, once per epoch.
"""

from __future__ import annotations

import functools
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
from pyspark.sql import DataFrame
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from ivm.plan.ir import TopK
from ivm.plan.reduce import GLOBAL_KEY, Branch, topk_spare
from ivm.policy import current
from ops import DIFF, TIME
from ops.declines import declined
from ops.sink import exact_types

Row = tuple[Any, ...]


@functools.total_ordering
class _Descending:
    """A value that sorts in reverse."""

    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Descending) and self.value == other.value

    def __lt__(self, other: _Descending) -> bool:
        return other.value < self.value

    def __hash__(self) -> int:
        return hash(self.value)


def ranking(
    order: Sequence[tuple[str, bool, bool]], columns: Sequence[str]
) -> Callable[[Row], tuple]:
    """A sort key of rows (tuples in ``columns``' order) in the TopK's order: the ORDER BY
    columns, then the other columns ascending with NULLs first
    (``ops.reduce.spark._order_columns``)."""
    named = {c for c, _, _ in order}
    spec = [(columns.index(c), desc, nulls_first) for c, desc, nulls_first in order]
    spec += [(columns.index(c), False, True) for c in columns if c not in named]

    def key(row: Row) -> tuple:
        out = []
        for i, desc, nulls_first in spec:
            v = row[i]
            if v is None:
                out.append((0 if nulls_first else 2, 0))
            else:
                out.append((1, _Descending(v) if desc else v))
        return tuple(out)

    return key


def summed(rows: list[dict], columns: Sequence[str]) -> Counter:
    """Rows ``(columns..., _diff)`` summed per distinct ``columns`` tuple, zeros dropped."""
    out: Counter = Counter()
    for r in rows:
        out[tuple(r[c] for c in columns)] += r[DIFF]
    return Counter({row: n for row, n in out.items() if n})


def first_rows(rows: Counter, rank: Callable[[Row], tuple], kept: int) -> Counter:
    """A group's first ``kept`` rows in order, counting multiplicities, the last one's cut to
    fit (``ops.reduce.spark._first_k``)."""
    out: Counter = Counter()
    before = 0
    for row in sorted(rows, key=rank):
        if before >= kept:
            break
        out[row] = min(rows[row], kept - before)
        before += rows[row]
    return out


def _by_group(rows: Counter, width: int) -> dict[Row, Counter]:
    groups: dict[Row, Counter] = {}
    for row, n in rows.items():
        groups.setdefault(row[:width], Counter())[row] = n
    return groups


def refresh_on_driver(
    node: TopK, branch: Branch, delta: DataFrame, store: Any
) -> tuple[DataFrame | None, DataFrame]:
    """The buffered TopK's updates at ``store.new``, computed by the driver, its state
    written; or ``(None, delta)`` when Spark must do it, ``delta`` then the same updates
    (held by the driver if it collected them, so Spark does not compute them again).

    ``delta``: the input's updates ``(columns..., _diff)``; ``store``: the view's
    :class:`ops.reduce.spark.StateStore`, with ``read_rows`` and ``write_rows``.
    """
    most = current().driver_state_rows
    if not store.small or most <= 0 or store.read_rows is None:
        return None, delta  # not a small change: nothing for the driver to decline
    if store.write_rows is None or not exact_types(delta.schema):
        declined(f"TopK {branch.name} refreshed by Spark (its state or types are Spark's)")
        return None, delta
    held = delta.limit(most + 1).toArrow()
    if held.num_rows > most:
        declined(f"TopK {branch.name} refreshed by Spark (more than {most} rows)")
        return None, delta
    delta = store.spark.createDataFrame(held, schema=delta.schema)  # computed once, either way
    updates = refresh_rows(node, branch, held, store)
    if updates is None:
        declined(f"TopK {branch.name} refreshed by Spark (a group to refill, or its state)")
        return None, delta
    return store.spark.createDataFrame(updates, schema=output_schema(node, delta.schema)), delta


def refresh_rows(node: TopK, branch: Branch, held: pa.Table, store: Any) -> pa.Table | None:
    """:func:`refresh_on_driver` of a change the driver holds (``(columns..., _diff)``, exact
    types): the TopK's updates as Arrow, its state written; None (nothing written) when a
    group must be refilled from the input or the touched groups' state is Spark's to read."""
    count_table, first_table = branch.tables
    keys = list(branch.state_keys)
    data = list(node.input.columns)
    cols = list(dict.fromkeys([*keys, *data]))
    width = len(keys)
    k = node.limit + node.offset
    kept = k + topk_spare(node)
    rank = ranking(node.order, cols)

    change_rows = held.to_pylist()
    if not node.partition:
        for r in change_rows:
            r[GLOBAL_KEY] = 0
    change = summed(change_rows, cols)
    touched = list({row[:width] for row in change})
    key_table = pa.table({c: [g[i] for g in touched] for i, c in enumerate(keys)})
    buffered = store.read_rows(first_table, keys, key_table, store.old)
    counted = store.read_rows(count_table, keys, key_table, store.old)
    if buffered is None or counted is None:
        return None

    first_old = _by_group(summed(buffered.to_pylist(), cols), width)
    count_old = summed(counted.to_pylist(), keys)
    counts = Counter()
    for row, n in change.items():
        counts[row[:width]] += n
    counts = Counter({g: n for g, n in counts.items() if n})
    # A change row goes into its group's buffer if ranked at or above the buffer's last row,
    # or if the buffer holds the whole group; below a partial buffer it only counts.
    last = {g: max(map(rank, rows)) for g, rows in first_old.items() if rows}
    merged = {g: Counter(rows) for g, rows in first_old.items()}
    for row, n in change.items():
        g = row[:width]
        whole = count_old.get(g, 0) <= sum(first_old.get(g, Counter()).values())
        if whole or (g in last and last[g] >= rank(row)):
            merged.setdefault(g, Counter())[row] += n
    merged = {g: Counter({r: n for r, n in rows.items() if n > 0}) for g, rows in merged.items()}
    for g in {*count_old, *counts}:
        total = count_old.get(g, 0) + counts.get(g, 0)
        have = sum(merged.get(g, Counter()).values())
        if total and have < k and total > have:
            return None  # a group to refill from the input: Spark's part
    first_new = {g: first_rows(rows, rank, kept) for g, rows in merged.items()}

    new = store.new
    count_rows = [
        {**dict(zip(keys, g, strict=True)), TIME: new, DIFF: n} for g, n in counts.items()
    ]
    buffer_change: Counter = Counter()
    for rows, sign in ((first_new, 1), (first_old, -1)):
        for group_rows in rows.values():
            for row, n in group_rows.items():
                buffer_change[row] += sign * n
    buffer_rows = [
        {**dict(zip(cols, row, strict=True)), TIME: new, DIFF: n}
        for row, n in buffer_change.items()
        if n
    ]
    out_schema = output_schema(node, from_arrow_schema(held.schema))
    view_rows = numbered(node, cols, rank, first_old, first_new, new)
    updates = pa.Table.from_pylist(view_rows, schema=to_arrow_schema(out_schema))
    store.write_rows(count_table, pa.Table.from_pylist(count_rows, schema=counted.schema))
    store.write_rows(first_table, pa.Table.from_pylist(buffer_rows, schema=buffered.schema))
    store.progress(
        f"TopK {node.label}: {len(touched)} group(s) touched, refreshed by the driver "
        f"({len(change)} change rows)"
    )
    return updates


def output_schema(node: TopK, schema: T.StructType) -> T.StructType:
    fields = [schema[c] for c in node.input.columns]
    if node.rank is not None:
        fields.append(T.StructField(node.rank, T.IntegerType(), False))
    fields += [T.StructField(TIME, T.LongType(), False), T.StructField(DIFF, T.LongType(), False)]
    return T.StructType(fields)


def numbered(
    node: TopK,
    cols: Sequence[str],
    rank: Callable[[Row], tuple],
    first_old: dict[Row, Counter],
    first_new: dict[Row, Counter],
    new: int,
) -> list[dict]:
    """The view's change from the touched groups' first rows at old (-1) and new (+1): rows
    ranked ``offset + 1 .. offset + limit``, numbered when the view asks
    (``ops.reduce.spark._numbered_change``)."""
    k = node.limit + node.offset
    index = [cols.index(c) for c in node.input.columns]
    out: Counter = Counter()
    for states, sign in ((first_old, -1), (first_new, 1)):
        for rows in states.values():
            number = 0
            for row in sorted(rows, key=rank):
                for _ in range(rows[row]):
                    number += 1
                    if number > k:
                        break
                    if number > node.offset:
                        shown = tuple(row[i] for i in index)
                        out[shown + ((number,) if node.rank is not None else ())] += sign
                if number > k:
                    break
    names = [*node.input.columns, *([node.rank] if node.rank is not None else [])]
    return [
        {**dict(zip(names, row, strict=True)), TIME: new, DIFF: n} for row, n in out.items() if n
    ]
