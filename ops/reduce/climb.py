"""The driver's climb of a tower inside Spark's path, and its renderer: a small change carried
up the tower (see :mod:`ivm.plan.reduce`) in Python, the same step
:func:`ops.reduce.spark._climb` renders on Spark; and a build's levels above a small level 0.

Owns the tower's arithmetic in Python: a bucket's entries come from its children by a
:data:`Combine` (a MIN/MAX tower's, :func:`minmax_combine`: the MIN/MAX of its children, NULLs
skipped, as Spark's ``min``/``max``; a TopK's, in :mod:`ops.reduce.driver`: their first rows),
a level's change is its touched buckets' new entries minus their old ones. :func:`climb_on_driver` runs it within Spark's path (one Spark job
collects level 0's change, its buckets hashed by Spark; every level is computed from
:func:`ops.arrange.lookup_rows` reads before any is written), :func:`climb_rows` for a level-0
change the driver already holds (:mod:`ops.reduce.driver`), and :func:`built_levels` a build's
levels from level 0's whole contents (grouped by Arrow, no lookup; :func:`ops.reduce.spark._climb`
writes level 0 and decides).

It hands back to Spark (False, nothing written, the reason recorded by :mod:`ops.declines`
where the change was small) for a column of floating-point type (Spark's NaN rules), a type
the driver does not write, more level-0 rows than the policy's ``driver_state_rows``, or
buckets too large to read.

Contract in ``(data, time, diff)`` terms: as :func:`ops.reduce.spark._climb`: given level 0's change
``Δ`` at ``new`` (``(keys..., value, _diff)``) and levels holding the tower up to ``old``, each
level ``l`` gets at ``new`` the change of its touched buckets' entries ``(keys..., _p, _b,
values..., _diff)``: each bucket's new entries (its children's MIN/MAX, or first rows with
their multiplicities) minus its old ones, consolidated; a level whose change is empty ends the
climb.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame

from ivm.plan.reduce import FANOUT_BITS, Branch
from ivm.policy import current
from ops import DIFF, TIME
from ops.declines import declined
from ops.reduce.buffer import Row, summed
from ops.sink import exact_types


def _extreme(func: str, values: list[Any]) -> Any:
    present = [v for v in values if v is not None]
    if not present:
        return None
    return min(present) if func == "min" else max(present)


def climb_on_driver(
    store: Any,
    branch: Branch,
    keys: Sequence[str],
    arg: str,
    funcs: Sequence[str],
    leaf: DataFrame,
) -> bool:
    """Carry level 0's change ``leaf`` (``(keys..., arg, _diff, _b, _p)``, buckets set)
    up a MIN/MAX tower on the driver and write every level; False (nothing written) when
    Spark must (:func:`ops.reduce.spark._climb`)."""
    most = current().driver_state_rows
    if not store.small or most <= 0 or store.read_rows is None:
        return False
    if store.write_rows is None or not exact_types(leaf.schema):
        declined(f"{branch.name}: its tower climbed by Spark (its state or types are Spark's)")
        return False
    held = leaf.limit(most + 1).toArrow()
    if held.num_rows > most:
        declined(f"{branch.name}: its tower climbed by Spark (more than {most} level-0 rows)")
        return False
    if not summed(held.to_pylist(), [*keys, "_p", "_b", arg]):
        return False  # nothing to climb: Spark records the empty epoch
    values = [f"_{f}" for f in funcs]
    climbed = climb_rows(store, branch, keys, [arg], values, minmax_combine(funcs), held)
    return climbed is not None


Combine = Callable[[list[Row], Sequence[int], int], Counter]
"""``(children, multiplicities, level) -> entries``: a bucket's entries at ``level`` from its
children's rows (``(keys..., _p, _b, values...)``, each present) and their multiplicities, as
``Counter({values: multiplicity})``."""


def minmax_combine(funcs: Sequence[str]) -> Combine:
    """A MIN/MAX tower's entry: per function, the extreme of the children's values (level 1:
    the one value column of level 0), NULLs skipped; one entry."""

    def combine(children: list[Row], counts: Sequence[int], level: int) -> Counter:
        first = len(children[0]) - (1 if level == 1 else len(funcs))
        found = tuple(
            _extreme(f, [r[first if level == 1 else first + i] for r in children])
            for i, f in enumerate(funcs)
        )
        return Counter({found: 1})

    return combine


def climb_rows(
    store: Any,
    branch: Branch,
    keys: Sequence[str],
    leaf_values: Sequence[str],
    values: Sequence[str],
    combine: Combine,
    held: pa.Table,
) -> list[Counter] | None:
    """:func:`climb_on_driver` of a level-0 change the driver holds (``(keys...,
    leaf_values..., _diff, _b, _p)``, buckets set as Spark sets them), each bucket's entry at
    a level above given by ``combine(children, multiplicities, level)`` (``Counter({values:
    multiplicity})``); an empty change writes level 0's epoch only, as Spark's climb does.
    Returns each level's change reached, from level 0 (``(keys..., _p, _b, values...) ->
    diff``); None (nothing written) when a level's lookups are Spark's to read."""
    keys = list(keys)
    leaf_cols = [*keys, "_p", "_b", *leaf_values]
    level_cols = [*keys, "_p", "_b", *values]
    delta = summed(held.to_pylist(), leaf_cols)
    if not delta:
        empty = held.select(leaf_cols).schema.append(pa.field(TIME, pa.int64()))
        store.write_rows(branch.tables[0], empty.append(pa.field(DIFF, pa.int64())).empty_table())
        return [delta]
    width = len(keys)
    changes: list[Counter] = [delta]
    schemas: list[pa.Schema] = []
    for level in range(1, branch.levels + 1):
        if not delta:
            break
        parents = list({row[: width + 1] for row in delta})  # (keys..., _p)
        probe = pa.table({c: [p[i] for p in parents] for i, c in enumerate([*keys, "_p"])})
        below = store.read_rows(branch.tables[level - 1], [*keys, "_p"], probe, store.old)
        if below is None:
            return None
        children = summed(below.to_pylist(), leaf_cols if level == 1 else level_cols)
        children.update(delta)  # the level below at ``new``: at ``old`` plus its change
        entries: dict[tuple, list[tuple]] = {}
        for row, n in children.items():
            if n > 0:
                entries.setdefault(row[: width + 1], []).append(row)
        fresh: Counter = Counter()
        for parent, rows in entries.items():
            b = parent[width]
            for found, n in combine(rows, [children[r] for r in rows], level).items():
                fresh[(*parent[:width], b >> FANOUT_BITS, b, *found)] += n
        probe = probe.rename_columns([*keys, "_b"])
        now = store.read_rows(branch.tables[level], [*keys, "_b"], probe, store.old)
        if now is None:
            return None
        change = Counter(fresh)
        change.subtract(summed(now.to_pylist(), level_cols))
        delta = Counter({row: n for row, n in change.items() if n})
        changes.append(delta)
        schemas += [below.schema] if level == 1 else []
        schemas.append(now.schema)
    new = store.new
    for level, (rows, schema) in enumerate(zip(changes, schemas, strict=True)):
        cols = leaf_cols if level == 0 else level_cols
        updates = [
            {**dict(zip(cols, row, strict=True)), TIME: new, DIFF: n} for row, n in rows.items()
        ]
        store.write_rows(branch.tables[level], pa.Table.from_pylist(updates, schema=schema))
    store.progress(
        f"{branch.name}: tower climbed by the driver ({len(changes) - 1} level(s) reached, "
        f"{len(changes[0])} change rows)"
    )
    return changes


def built_levels(
    level0: pa.Table,
    keys: Sequence[str],
    arg: str,
    funcs: Sequence[str],
    levels: int,
    time: int,
) -> list[pa.Table]:
    """A build's tower levels ``1..levels`` computed by the driver (Arrow's grouping) from
    level 0's whole contents ``(keys..., _p, _b, arg, _diff)``: per level, one row per
    bucket ``(keys..., _p, _b, values..., _diff, _time)`` holding its children's MIN/MAX
    (NULLs skipped, as Spark's ``min``/``max``), ``_diff`` 1, ``_time`` ``time``. The same
    rows :func:`ops.reduce.spark._climb` computes on Spark for a build."""
    keys = list(keys)
    values = [f"_{f}" for f in funcs]
    below = level0.filter(pc.greater(level0.column(DIFF), 0))
    out = []
    for level in range(1, levels + 1):
        sources = [arg] * len(funcs) if level == 1 else values
        grouped = below.group_by([*keys, "_p"], use_threads=False).aggregate(
            [(src, f) for src, f in zip(sources, funcs, strict=True)]
        )
        parent = grouped.column("_p")
        n = grouped.num_rows
        columns = {k: grouped.column(k) for k in keys}
        columns["_p"] = pc.shift_right(parent, FANOUT_BITS)
        columns["_b"] = parent
        for value, src, f in zip(values, sources, funcs, strict=True):
            columns[value] = grouped.column(f"{src}_{f}")
        columns[DIFF] = pa.array([1] * n, pa.int64())
        columns[TIME] = pa.array([time] * n, pa.int64())
        below = pa.table(columns)
        out.append(below)
    return out
