"""The driver's renderer of a small change's stateful nodes, in Arrow and Python: a GROUP BY
(:func:`reduce_local`: accumulable branches, their DISTINCT forms, MIN/MAX towers, the
extremes of an append-only input, and basic aggregates by Spark's own functions over the
touched groups' rows the driver reads, :func:`ops.reduce.spark.basic_aggregated`), a
TopK (:func:`topk_local`: buffered, :func:`ops.reduce.buffer.refresh_rows`, or kept by a tower
over an aggregate), INTERSECT/EXCEPT [ALL] (:func:`setop_local`: per-row counts) and a Window
(:func:`window_local`: its values by Spark's own window functions over the partitions the
driver reads, :func:`ops.reduce.spark.window_values`), rendering the same plan
(:mod:`ivm.plan.reduce`) as :mod:`ops.reduce.spark` renders on Spark, state read and written by the
driver.

Owns the Arrow rendering of an accumulable branch (:class:`_Accumulable`: contributions summed
per group by Arrow, exact floating-point terms) and of a tower's level 0 (buckets by Spark's
``xxhash64`` of a value or of a row, :func:`spark_xxhash64` and :func:`spark_row_hash`, the
``xxhash`` library's XXH64). The arithmetic it shares
with Spark's path (the state columns, exact sums of state rows, decimal rounding, AVG's
division, NULL rules, result types, a DISTINCT's counts crossing zero) is
:mod:`ops.reduce.accumulable`'s.

Contract in ``(data, time, diff)`` terms, :func:`ops.reduce.spark.render_reduce`'s: given the
input's updates in ``(old, new]`` (Arrow), every branch's state tables get at ``new`` the rows
Spark's path writes (an accumulable branch: one row of summed contributions per touched group,
all-zero ones dropped; a DISTINCT: the ``(group, value)`` counts' change; a tower: each
level's change, :func:`ops.reduce.climb.climb_rows`), and the result is the reduce's change at
``new``: ``-1`` for each touched group's row at ``old``, ``+1`` for its row at ``new``,
consolidated, with Spark's values and types.

:class:`~ivm.errors.NotOnDriver`, raised before any state is written, hands the node to Spark:
a build, more input updates than the policy's ``driver_state_rows``, MIN/MAX of floating
point over a monotonic input (no tower), grouping by floating point (or a NaN among a basic
aggregate's arguments), a MIN/MAX over a type whose hash is not reproduced here, state the
driver does not read, a value past its type; for a TopK, a monotonic input (no tower) or a
group to refill from its input (a TopK over an append-only input keeps its first rows, no
tower); for a set operation or a Window, floating-point columns. A set operation's and
a Window's change follow their Spark renderers' contracts (per-row counts; the touched
partitions' rows with their values at old ``-1`` and at new ``+1``).
"""

from __future__ import annotations

import datetime
import math
import struct
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema

from ivm.errors import InvariantViolation, NotOnDriver
from ivm.plan.driver import node_support
from ivm.plan.ir import Aggregate, Reduce, SetOp, TopK, Window
from ivm.plan.reduce import FANOUT_BITS, GLOBAL_KEY, SUMMED, Branch, StateTable, branches
from ivm.policy import current
from ops import DIFF, TIME
from ops.arrange import distinct_rows
from ops.ingest import consolidated_on
from ops.reduce import accumulable, buffer, floatsum
from ops.reduce.accumulable import Group
from ops.reduce.buffer import Row, summed
from ops.reduce.climb import climb_rows, minmax_combine
from ops.reduce.spark import basic_aggregated, window_values
from ops.rows import cast_loss
from ops.sink import exact_types
from ops.stateless.driver import arrow_type, decimal_shape, normalized_floats

_SPECIAL = {
    "nan": pc.is_nan,
    "pinf": lambda x: pc.equal(x, math.inf),
    "ninf": lambda x: pc.equal(x, -math.inf),
}
"""The NaN and infinity counts beside exact floating-point sums (as ``ops.reduce.spark``'s)."""


def _floating(t: T.DataType) -> bool:
    return isinstance(t, (T.FloatType, T.DoubleType))


_EPOCH = datetime.date(1970, 1, 1)
_SEED = 42


def _hashed_bytes(t: T.DataType) -> str | None:
    """How Spark's ``xxhash64`` lays out a value of type ``t``: a ``struct`` format, ``"utf-8"``
    for a string, ``"unscaled"`` for a decimal of more than 18 digits, or None for a type this
    module does not hash (Spark's part)."""
    if isinstance(t, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.DateType)):
        return "<i"
    if isinstance(t, T.LongType) or (isinstance(t, T.DecimalType) and t.precision <= 18):
        return "<q"
    if isinstance(t, T.DecimalType):
        return "unscaled"
    return "utf-8" if isinstance(t, T.StringType) else None


def spark_xxhash64(value: Any, t: T.DataType, seed: int = _SEED) -> int:
    """Spark's ``xxhash64(value)`` of one value of type ``t``, as a signed long: XXH64 with
    ``seed`` over the value's little-endian bytes as Spark lays them out (an int or a date as 4
    bytes, a long or a decimal of up to 18 digits' unscaled value as 8, a string's UTF-8
    bytes, a wider decimal's unscaled value as Java's ``BigInteger.toByteArray``: big-endian
    two's complement, shortest); NULL hashes to the seed. Of several columns, each column's
    hash seeds the next's (:func:`spark_row_hash`). Other types raise NotOnDriver."""
    layout = _hashed_bytes(t)
    if layout is None:
        raise NotOnDriver(f"a {t.simpleString()} column: Spark hashes its buckets")
    if value is None:
        return seed
    if layout == "utf-8":
        data = value.encode("utf-8")
    elif isinstance(t, T.DateType):
        data = struct.pack(layout, (value - _EPOCH).days)
    elif layout == "unscaled":
        unscaled = int(value.scaleb(t.scale, context=accumulable.EXACT))
        bits = unscaled.bit_length() if unscaled >= 0 else (~unscaled).bit_length()
        data = unscaled.to_bytes(bits // 8 + 1, "big", signed=True)
    elif isinstance(t, T.DecimalType):
        data = struct.pack(layout, int(value.scaleb(t.scale, context=accumulable.EXACT)))
    else:
        data = struct.pack(layout, int(value))
    h = xxhash.xxh64_intdigest(data, seed=seed & _UNSIGNED)
    return h - (1 << 64) if h >> 63 else h


_UNSIGNED = (1 << 64) - 1


def spark_row_hash(values: Sequence[Any], types: Sequence[T.DataType]) -> int:
    """Spark's ``xxhash64(c1, c2, ...)`` of one row's values: each column hashed with the
    previous one's hash as its seed, the first with 42."""
    h = _SEED
    for value, t in zip(values, types, strict=True):
        h = spark_xxhash64(value, t, h)
    return h


class _Accumulable:
    """An accumulable branch's state (:func:`ops.reduce.accumulable.layout`) rendered in Arrow and
    Python: per-row contributions summed by Arrow, results by :func:`ops.reduce.accumulable.values`;
    the same state rows and values as :func:`ops.reduce.spark._accumulator`'s Spark columns."""

    def __init__(self, aggregates: Sequence[Aggregate], types: dict[str, T.DataType]) -> None:
        for a in aggregates:
            if a.func not in accumulable.ACCUMULATED:
                raise NotOnDriver(f"{a.func.upper()} is computed by Spark")
        self.layout = accumulable.layout(aggregates, types)
        self.types = types
        summable = (*accumulable.INTEGRAL, T.DecimalType)
        for a in aggregates:
            t = types[a.arg] if a.arg is not None else None
            summed_here = a.func in SUMMED and not self.layout.exact_float(a)
            if t is not None and summed_here and not isinstance(t, summable):
                raise NotOnDriver(f"{a.func.upper()} over {t.simpleString()} is Spark's")

    @property
    def names(self) -> list[str]:
        return self.layout.names

    def sums(self, rows: pa.Table, keys: Sequence[str]) -> dict[Group, list]:
        """Per group, the contributions of ``rows`` (updates with ``_diff``) summed by Arrow
        (decimals exact in 256 bits); groups whose sums are all zero are dropped (they change
        no state)."""
        diff = rows.column(DIFF)
        columns: dict[str, Any] = {k: rows.column(k) for k in keys}
        for c in self.layout.columns:
            if c.kind == "rows":
                columns[c.name] = diff
                continue
            x = rows.column(c.arg)
            if c.kind == "nn":
                columns[c.name] = pc.if_else(pc.is_valid(x), diff, 0)
            elif c.kind in _SPECIAL:
                test = _SPECIAL[c.kind](x.cast(pa.float64()))
                columns[c.name] = pc.if_else(pc.fill_null(test, False), diff, 0)
            elif c.kind == "true":
                columns[c.name] = pc.if_else(pc.fill_null(pc.equal(x, True), False), diff, 0)
            else:
                precision, scale = decimal_shape(self.types[c.arg or ""])
                product = pc.multiply(
                    x.cast(pa.decimal256(precision, scale)), diff.cast(pa.decimal256(19, 0))
                )
                columns[c.name] = pc.fill_null(product, 0)
        summed_rows = (
            pa.table(columns)
            .group_by(list(keys), use_threads=False)
            .aggregate([(n, "sum") for n in self.names])
        )
        out: dict[Group, list] = {}
        for r in summed_rows.to_pylist():
            values = [r[f"{n}_sum"] for n in self.names]
            if any(values):
                out[tuple(r[k] for k in keys)] = values
        return out

    def float_sums(self, rows: pa.Table, keys: Sequence[str]) -> dict[Group, dict]:
        """Per group, the exact floating-point sums of ``rows`` (updates with ``_diff``) as
        ``{(argument, exponent): [v, qh, ql]}`` (:func:`ops.reduce.floatsum.terms` times ``_diff``,
        the rows Spark's path sums); all-zero entries dropped."""
        out: dict[Group, dict] = {}
        args = self.layout.float_args
        squared = self.layout.squared
        for r in rows.select([*keys, *args, DIFF]).to_pylist():
            found = out.setdefault(tuple(r[k] for k in keys), {})
            for i, arg in enumerate(args):
                x = r[arg]
                if x is None:
                    continue
                x = float(x)  # a DECIMAL's or an integer's VARIANCE: Spark's double of it
                if x == 0 or not math.isfinite(x):
                    continue
                e, m, qh, ql = floatsum.terms(x)
                at = found.setdefault((i, e), [0, 0, 0])
                at[0] += m * r[DIFF]
                if arg in squared:
                    at[1] += qh * r[DIFF]
                    at[2] += ql * r[DIFF]
        return {g: {k: v for k, v in at.items() if any(v)} for g, at in out.items()}

    def state_type(self, column: accumulable.StateColumn) -> pa.DataType:
        if column.kind != "sum":
            return pa.int64()
        return arrow_type(accumulable.sum_type(self.types[column.arg or ""], "SUM"))

    def result_type(self, a: Aggregate) -> pa.DataType:
        return arrow_type(accumulable.result_type(a, self.types))

    def results(self, state: list, bins: dict | None = None) -> list:
        """The aggregates' values from a group's summed state and exact floating-point sums
        ``{(term, bin): sum}`` (:func:`ops.reduce.accumulable.values`)."""
        return accumulable.values(self.layout, state, bins)


def _check(node: Reduce, types: dict[str, T.DataType]) -> None:
    """NotOnDriver, before anything is written, for what this module does not compute with
    these column types (what it never computes, the placement has already ruled out:
    :func:`ivm.plan.driver.driver_support`)."""
    why = node_support(node)
    if why is not None:
        raise InvariantViolation(f"{node.label} was placed on the driver, but {why}")
    for b in branches(node):
        if b.kind == "accumulable":
            _Accumulable(b.aggregates, types)
        elif b.kind != "basic":
            t = types[b.value or ""]
            if _hashed_bytes(t) is None:
                raise NotOnDriver(f"MIN/MAX over {t.simpleString()}: Spark hashes its buckets")
        floating = [c for c in (*b.keys, *([b.value] if b.distinct else [])) if _floating(types[c])]
        if floating:
            raise NotOnDriver(f"grouping by floating point ({', '.join(floating)}) is Spark's")


def _with_global_key(table: pa.Table) -> pa.Table:
    """``table`` keyed as Spark's path keys a node without keys: a constant ``_g`` of 0."""
    return table.append_column(GLOBAL_KEY, pa.array([0] * table.num_rows, pa.int32()))


def _check_appended(label: str, rows: pa.Table) -> None:
    """An input declared append-only delivered only insertions (as Spark's path checks)."""
    if pc.any(pc.less(rows.column(DIFF), 0)).as_py():
        raise InvariantViolation(
            f"{label}: an input declared append-only (delta.appendOnly) delivered "
            "deletions; rebuild the view with `ivm refresh --rebuild`"
        )


def reduce_local(node: Reduce, delta: pa.Table, store: Any) -> pa.Table:
    """The reduce's change in ``(store.old, store.new]`` from its input's updates ``delta``
    (``(columns..., _time, _diff)``), its state read and written through ``store``
    (:class:`ops.reduce.spark.StateStore`'s ``read_rows``/``write_rows``): the module's contract."""
    if store.read_rows is None or store.write_rows is None or store.old <= 0:
        raise NotOnDriver("the state is not the driver's to read")
    if delta.num_rows > current().driver_state_rows:
        raise NotOnDriver("more updates than the driver's state rows")
    global_row = not node.keys
    if global_row:  # one group, keyed as Spark's path keys it (its row exists with no input row)
        delta = _with_global_key(delta)
    types = {f.name: f.dataType for f in from_arrow_schema(delta.schema).fields}
    _check(node, types)
    keys = list(node.keys) or [GLOBAL_KEY]
    rows = delta.filter(pc.not_equal(delta.column(DIFF), 0))
    key_schema = pa.schema([delta.schema.field(k) for k in keys])
    probe = rows.select(keys).group_by(keys, use_threads=False).aggregate([]).cast(key_schema)
    if global_row:
        probe = pa.table({GLOBAL_KEY: pa.array([0], pa.int32())})
    touched = [tuple(r[k] for k in keys) for r in probe.to_pylist()]
    found: list[tuple[dict[Group, list], dict[Group, list]]] = []
    basic_types: dict[str, pa.DataType] = {}
    for branch in branches(node):
        if branch.kind == "accumulable":
            found.append(
                _accumulable(branch, rows, delta.schema, types, keys, probe, store, global_row)
            )
        elif branch.kind == "basic":
            old, new, kinds = _basic(branch, rows, keys, probe, store, global_row)
            found.append((old, new))
            basic_types.update(kinds)
        else:
            found.append(_tower(branch, rows, types, keys, probe, store))
    change: Counter = Counter()
    for at, sign in ((0, -1), (1, 1)):
        for g in touched:
            parts = [branch_values[at].get(g) for branch_values in found]
            if all(p is not None for p in parts):
                change[(*g, *[v for p in parts for v in p])] += sign
    names = _result_names(node)
    schema = pa.schema(
        [
            *key_schema,
            *(pa.field(n, t) for n, t in _result_types(node, types, basic_types).items()),
            pa.field(TIME, pa.int64()),
            pa.field(DIFF, pa.int64()),
        ]
    )
    out = [
        {**dict(zip([*keys, *names], row, strict=True)), TIME: store.new, DIFF: n}
        for row, n in change.items()
        if n
    ]
    table = pa.Table.from_pylist(out, schema=schema)
    return table.select([*node.columns, TIME, DIFF])


def _result_names(node: Reduce) -> list[str]:
    return [a.name for b in branches(node) for a in b.aggregates]


def _result_types(
    node: Reduce, types: dict[str, T.DataType], basic: dict[str, pa.DataType]
) -> dict[str, pa.DataType]:
    out: dict[str, pa.DataType] = {}
    for b in branches(node):
        if b.kind == "accumulable":
            acc = _Accumulable(b.aggregates, types)
            out.update({a.name: acc.result_type(a) for a in b.aggregates})
        elif b.kind == "basic":  # Spark's types, as its functions gave them
            out.update({a.name: basic[a.name] for a in b.aggregates})
        else:
            out.update({a.name: arrow_type(types[b.value or ""]) for a in b.aggregates})
    return out


def _accumulable(
    branch: Branch,
    rows: pa.Table,
    schema: pa.Schema,
    types: dict[str, T.DataType],
    keys: list[str],
    probe: pa.Table,
    store: Any,
    global_row: bool = False,
) -> tuple[dict[Group, list], dict[Group, list]]:
    """Write an accumulable branch's state change; its results per touched group at old and
    at new (groups with rows only; ``global_row``: the one group, rows or not)."""
    if branch.distinct:
        rows = _distinct_flips(branch, rows, schema, keys, store)
    acc = _Accumulable(branch.aggregates, types)
    table = branch.tables[-1]
    change = acc.sums(rows, keys)
    bins = _float_state(branch, acc, rows, keys, probe, store)
    before = store.read_rows(table, keys, probe, store.old)
    if before is None:
        raise NotOnDriver(f"{branch.name}: the touched groups' state is Spark's to read")
    old = accumulable.summed(before.to_pylist(), keys, acc.names)
    new = accumulable.plus(old, change)
    written = pa.schema(
        [
            *(schema.field(k) for k in keys),
            *(pa.field(c.name, acc.state_type(c)) for c in acc.layout.columns),
            pa.field(TIME, pa.int64()),
        ]
    )
    state_rows = [
        {**dict(zip(keys, g, strict=True)), **dict(zip(acc.names, s, strict=True)), TIME: store.new}
        for g, s in change.items()
    ]
    try:
        update = pa.Table.from_pylist(state_rows, schema=written)
    except (pa.ArrowInvalid, pa.ArrowTypeError) as err:
        raise NotOnDriver(f"{branch.name}: a sum past its state's type") from err
    store.write_rows(table, update)
    if global_row:  # no state row yet: the sums of no row
        old, new = ({(0,): [0] * len(acc.names), **state} for state in (old, new))
    return tuple(  # type: ignore[return-value]
        {
            g: acc.results(s, at.get(g))
            for g, s in (state if global_row else accumulable.existing(state, acc.names)).items()
        }
        for state, at in zip((old, new), bins, strict=True)
    )


def _float_state(
    branch: Branch,
    acc: _Accumulable,
    rows: pa.Table,
    keys: list[str],
    probe: pa.Table,
    store: Any,
) -> tuple[dict[Group, dict], dict[Group, dict]]:
    """Write an accumulable branch's exact floating-point sums' change to its ``float_sums``
    table (``(keys..., _t, _b, _v, _qh, _ql, _time)``, the rows :func:`ops.reduce.spark._float_sums`
    writes); the touched groups' sums ``{(argument, exponent): [v, qh, ql]}`` at old and at
    new."""
    table = branch.float_table
    if not acc.layout.float_terms or table is None:
        return {}, {}
    change = acc.float_sums(rows, keys)
    before = store.read_rows(table, keys, probe, store.old)
    if before is None:
        raise NotOnDriver(f"{branch.name}: the touched groups' float sums are Spark's to read")
    names = ("_v", "_qh", "_ql")
    old: dict[Group, dict] = {}
    for r in before.to_pylist():
        at = old.setdefault(tuple(r[k] for k in keys), {}).setdefault((r["_t"], r["_b"]), [0] * 3)
        for i, n in enumerate(names):
            at[i] += int(r[n])
    new = {g: {k: list(v) for k, v in at.items()} for g, at in old.items()}
    for g, at in change.items():
        mine = new.setdefault(g, {})
        for k, v in at.items():
            mine[k] = [a + b for a, b in zip(mine.get(k, [0] * 3), v, strict=True)]
    written = pa.schema(
        [
            *(rows.schema.field(k) for k in keys),
            pa.field("_t", pa.int32()),
            pa.field("_b", pa.int32()),
            *(pa.field(n, pa.decimal128(38, 0)) for n in names),
            pa.field(TIME, pa.int64()),
        ]
    )
    update = pa.Table.from_pylist(
        [
            {
                **dict(zip(keys, g, strict=True)),
                "_t": t,
                "_b": e,
                **{n: Decimal(x) for n, x in zip(names, v, strict=True)},
                TIME: store.new,
            }
            for g, at in change.items()
            for (t, e), v in sorted(at.items())
        ],
        schema=written,
    )
    store.write_rows(table, update)
    return old, new


def _basic(
    branch: Branch,
    rows: pa.Table,
    keys: list[str],
    probe: pa.Table,
    store: Any,
    global_row: bool,
) -> tuple[dict[Group, list], dict[Group, list], dict[str, pa.DataType]]:
    """A basic branch (STRING_AGG, PERCENTILE_CONT/DISC)'s results per touched group at old
    and at new, and their types: the touched groups' rows of its table (its input's rows, or
    a DISTINCT's ``(group, value)`` counts) read at old, the change added for new, the
    aggregates computed by Spark's own functions over the two as local relations
    (:func:`ops.reduce.spark.basic_aggregated`, one task, no shuffle); the change appended
    to the table once they are known (``global_row``: the one group, NULLs with no row)."""
    table = branch.tables[0]
    if branch.distinct:
        cols = [*keys, branch.value or ""]
    else:
        args = dict.fromkeys(c for a in branch.aggregates for c in sorted(a.reads))
        cols = [*keys, *(c for c in args if c not in keys)]
    change = consolidated_on(normalized_floats(rows.select([*cols, DIFF])), cols)
    if change is None:
        raise NotOnDriver("a column Arrow does not group")
    what = f"{branch.name}: the touched groups' rows"
    stamped, old, new = _local_states(store, table, keys, probe, change, cols, what)

    def aggregated(state: DataFrame, sign: int) -> DataFrame:
        values = basic_aggregated(branch, keys, state)
        return values.withColumn(DIFF, F.lit(sign).cast("bigint"))

    both = aggregated(old, -1).unionByName(aggregated(new, 1))
    out_schema = to_arrow_schema(both.schema)
    found = normalized_floats(both.toArrow().cast(out_schema))
    store.write_rows(table, stamped)
    names = [a.name for a in branch.aggregates]
    at: tuple[dict[Group, list], dict[Group, list]] = ({}, {})
    for r in found.to_pylist():
        at[r[DIFF] > 0][tuple(r[k] for k in keys)] = [r[n] for n in names]
    if global_row:  # the aggregates of no row
        for state in at:
            state.setdefault((0,), [None] * len(names))
    return at[0], at[1], {n: out_schema.field(n).type for n in names}


def _local_states(
    store: Any,
    table: StateTable,
    keys: list[str],
    probe: pa.Table,
    change: pa.Table,
    cols: list[str],
    what: str,
) -> tuple[pa.Table, DataFrame, DataFrame]:
    """The rows of ``table`` whose ``keys`` are a row of ``probe``, read by the driver at old,
    and with ``change`` (``(cols..., _diff)``) added at new, each summed per ``cols`` into a
    local relation of one partition (Spark's aggregates and windows over it need no
    shuffle); and ``change`` as the table's rows at new, to append once they are valued.
    NotOnDriver when the rows (``what``) are too many for the driver."""
    before = store.read_rows(table, keys, probe, store.old)
    if before is None:
        raise NotOnDriver(f"{what} are Spark's to read")
    stamp = pa.array([store.new] * change.num_rows, pa.int64())
    stamped = change.append_column(TIME, stamp).select(before.schema.names).cast(before.schema)

    def local(rows: pa.Table) -> DataFrame:
        net = consolidated_on(rows, cols)
        assert net is not None  # the columns the change was grouped by
        return store.spark.createDataFrame(net, schema=from_arrow_schema(net.schema)).coalesce(1)

    return stamped, local(before), local(pa.concat_tables([before, stamped]))


def _distinct_flips(
    branch: Branch, rows: pa.Table, schema: pa.Schema, keys: list[str], store: Any
) -> pa.Table:
    """Write a DISTINCT's ``(group, value)`` counts' change; the distinct set's change
    ``(group, value, _diff)``: ``+1`` for each value whose count rose from zero, ``-1`` for
    each that fell to zero (as :func:`ops.reduce.accumulate.distinct_on_driver`)."""
    cols = [*keys, branch.value or ""]
    table = branch.tables[0]
    summed_rows = (
        rows.select([*cols, DIFF])
        .group_by(cols, use_threads=False)
        .aggregate([(DIFF, "sum")])
        .rename_columns([*cols, DIFF])
    )
    summed_rows = summed_rows.filter(pc.not_equal(summed_rows.column(DIFF), 0))
    col_schema = pa.schema([schema.field(c) for c in cols])
    change = summed_rows.cast(col_schema.append(pa.field(DIFF, pa.int64())))
    before = store.read_rows(table, cols, change.select(cols), store.old)
    if before is None:
        raise NotOnDriver(f"{branch.name}: the distinct counts are Spark's to read")
    old = summed(before.to_pylist(), cols)
    times = pa.repeat(pa.scalar(store.new, pa.int64()), change.num_rows)
    store.write_rows(table, change.append_column(TIME, times))
    counted = ((tuple(r[c] for c in cols), r[DIFF]) for r in change.to_pylist())
    flips = [
        {**dict(zip(cols, row, strict=True)), DIFF: flip}
        for row, flip in accumulable.crossings(old, counted)
    ]
    return pa.Table.from_pylist(flips, schema=change.schema)


def _leaf(
    rows: pa.Table, keys: list[str], values: list[str], types: dict[str, T.DataType], levels: int
) -> pa.Table:
    """A tower's level-0 change: ``rows`` summed per ``(keys, values)``, zero sums dropped,
    each in the bucket ``_b`` Spark's ``xxhash64`` of its ``values`` gives it (each distinct
    tuple hashed once), with that bucket's parent ``_p``."""
    summed_rows = (
        rows.select([*keys, *values, DIFF])
        .group_by([*keys, *values], use_threads=False)
        .aggregate([(DIFF, "sum")])
        .rename_columns([*keys, *values, DIFF])
    )
    summed_rows = summed_rows.filter(pc.not_equal(summed_rows.column(DIFF), 0))
    modulus = 1 << (FANOUT_BITS * levels)
    value_types = [types[c] for c in values]
    tuples = list(zip(*(summed_rows.column(c).to_pylist() for c in values), strict=True))
    hashed = {row: spark_row_hash(row, value_types) % modulus for row in set(tuples)}
    buckets = pa.array([hashed[row] for row in tuples], pa.int64())
    return summed_rows.append_column("_b", buckets).append_column(
        "_p", pc.shift_right(buckets, FANOUT_BITS)
    )


def _tower(
    branch: Branch,
    rows: pa.Table,
    types: dict[str, T.DataType],
    keys: list[str],
    probe: pa.Table,
    store: Any,
) -> tuple[dict[Group, list], dict[Group, list]]:
    """Climb a MIN/MAX tower with the change (:func:`ops.reduce.climb.climb_rows`); the branch's
    results per touched group at old and at new, from its top level. Without GROUP BY the
    tower has no key (as on Spark's path) and its one group's results over no row are NULL."""
    arg = branch.value or ""
    funcs = list(dict.fromkeys(a.func for a in branch.aggregates))
    values = [f"_{f}" for f in funcs]
    if branch.levels == 0:
        if _floating(types[arg]):
            raise NotOnDriver("MIN/MAX of floating point over an append-only input is Spark's")
        return _appended_extremes(branch, rows, keys, probe, store)
    tkeys = [k for k in keys if k != GLOBAL_KEY]
    leaf = _leaf(rows, tkeys, [arg], types, branch.levels)
    if climb_rows(store, branch, tkeys, [arg], values, minmax_combine(funcs), leaf) is None:
        raise NotOnDriver(f"{branch.name}: the tower is Spark's to climb")
    top_probe = probe.select(tkeys).append_column("_b", pa.array([0] * probe.num_rows, pa.int64()))
    top = store.read_rows(branch.tables[-1], [*tkeys, "_b"], top_probe, store.new)
    if top is None:
        raise NotOnDriver(f"{branch.name}: the tower's top is Spark's to read")
    entries = top.to_pylist()
    out = []
    for at in (store.old, store.new):
        held = summed([e for e in entries if e[TIME] <= at], [*tkeys, *values])
        per_group: dict[Group, list] = {}
        if not tkeys:  # the one group: its row exists over no input row
            per_group[(0,)] = [None] * len(branch.aggregates)
        for row, n in held.items():
            if n > 0:
                found = dict(zip(values, row[len(tkeys) :], strict=True))
                group = row[: len(tkeys)] if tkeys else (0,)
                per_group[group] = [found[f"_{a.func}"] for a in branch.aggregates]
        out.append(per_group)
    return out[0], out[1]


def _appended_extremes(
    branch: Branch, rows: pa.Table, keys: list[str], probe: pa.Table, store: Any
) -> tuple[dict[Group, list], dict[Group, list]]:
    """MIN/MAX of an append-only input (no tower, as on Spark's path): each touched group's
    extremes at old, read from the branch's one table, combined with the inserted values;
    the table gets the change of the groups whose extremes moved. The branch's results per
    touched group at old and at new (without GROUP BY, NULLs over no row)."""
    _check_appended(branch.name, rows)
    arg = branch.value or ""
    funcs = list(dict.fromkeys(a.func for a in branch.aggregates))
    values = [f"_{f}" for f in funcs]
    (top,) = branch.tables
    stored = store.read_rows(top, keys, probe, store.old)
    if stored is None:
        raise NotOnDriver(f"{branch.name}: its extremes are Spark's to read")
    width = len(keys)
    old = {
        row[:width]: row[width:]
        for row, n in summed(stored.to_pylist(), [*keys, *values]).items()
        if n > 0
    }
    inserted: dict[Group, list[Row]] = {}
    groups = zip(*(rows.column(k).to_pylist() for k in keys), strict=True)
    for group, x in zip(groups, rows.column(arg).to_pylist(), strict=True):
        inserted.setdefault(group, []).append(tuple(x for _ in funcs))
    combine = minmax_combine(funcs)
    new = dict(old)
    change = []
    for group, children in inserted.items():
        before = old.get(group)
        found = list(combine([*children, *([before] if before else [])], [1], 2))[0]
        if found == before:
            continue
        new[group] = found
        for extremes, sign in ((found, 1), (before, -1)):
            if extremes is not None:
                row = dict(zip([*keys, *values], [*group, *extremes], strict=True))
                change.append({**row, TIME: store.new, DIFF: sign})
    store.write_rows(top, pa.Table.from_pylist(change, schema=stored.schema))
    out = []
    for held in (old, new):
        per_group: dict[Group, list] = {}
        if keys == [GLOBAL_KEY]:  # the one group: its row exists over no input row
            per_group[(0,)] = [None] * len(branch.aggregates)
        for group, extremes in held.items():
            found = dict(zip(values, extremes, strict=True))
            per_group[group] = [found[f"_{a.func}"] for a in branch.aggregates]
        out.append(per_group)
    return out[0], out[1]


def topk_local(node: TopK, delta: pa.Table, store: Any) -> pa.Table:
    """A TopK's change computed by the driver from its input's updates ``delta``
    (``(columns..., _time, _diff)``): ``(columns..., [rank], _time, _diff)``; buffered
    (:func:`ops.reduce.buffer.refresh_rows`), by its tower (:func:`_topk_tower`), or over an
    append-only input (:func:`_topk_appended`). NotOnDriver for floating-point columns, a
    group to refill from the input, or state the driver does not read."""
    why = node_support(node)
    if why is not None:
        raise InvariantViolation(f"{node.label} was placed on the driver, but {why}")
    (branch,) = branches(node)
    if store.read_rows is None or store.write_rows is None:
        raise NotOnDriver("the state is not the driver's to read")
    if store.old <= 0 or delta.num_rows > current().driver_state_rows:
        raise NotOnDriver("more updates than the driver's state rows")
    held = delta.select([*node.input.columns, DIFF])
    held = held.filter(pc.not_equal(held.column(DIFF), 0))
    if not exact_types(from_arrow_schema(held.schema)):
        raise NotOnDriver("a TopK over floating point is Spark's")
    if branch.kind != "buffer" and branch.levels == 0:
        return _topk_appended(node, branch, held, store)
    if branch.kind != "buffer":
        return _topk_tower(node, branch, held, store)
    updates = buffer.refresh_rows(node, branch, held, store)
    if updates is None:
        raise NotOnDriver("a TopK group to refill from its input")
    return updates


def _topk_appended(node: TopK, branch: Branch, held: pa.Table, store: Any) -> pa.Table:
    """A TopK over an append-only input (no tower, as on Spark's path): each touched group's
    first ``limit + offset`` rows read at old, the insertions added, the first ones kept
    (:func:`ops.reduce.buffer.first_rows`); the table gets their change, and the view the
    change of the rows shown (numbered from the groups' first rows at old and new when it
    has a rank or an offset)."""
    _check_appended(node.label, held)
    keys, data = list(node.partition), list(node.input.columns)
    tkeys = keys or [GLOBAL_KEY]
    cols = list(dict.fromkeys([*tkeys, *data]))
    rank = buffer.ranking(node.order, data)
    if not keys:
        held = _with_global_key(held)
    (top,) = branch.tables
    stored = store.read_rows(top, tkeys, distinct_rows(held.select(tkeys)), store.old)
    if stored is None:
        raise NotOnDriver(f"{branch.name}: its first rows are Spark's to read")

    def by_group(rows: list[dict]) -> dict[Row, Counter]:
        out: dict[Row, Counter] = {}
        for r in rows:
            group = tuple(r[c] for c in tkeys)
            out.setdefault(group, Counter())[tuple(r[c] for c in data)] += r[DIFF]
        return out

    old = {
        g: Counter({r: n for r, n in c.items() if n > 0})
        for g, c in by_group(stored.to_pylist()).items()
    }
    new = dict(old)
    change = []
    for group, inserted in by_group(held.to_pylist()).items():
        before = old.get(group, Counter())
        kept = buffer.first_rows(before + inserted, rank, node.limit + node.offset)
        new[group] = kept
        moved = kept.copy()
        moved.subtract(before)
        for row, n in moved.items():
            if n:
                values = {
                    **dict(zip(tkeys, group, strict=True)),
                    **dict(zip(data, row, strict=True)),
                }
                change.append({**{c: values[c] for c in cols}, TIME: store.new, DIFF: n})
    store.write_rows(top, pa.Table.from_pylist(change, schema=stored.schema))
    out_schema = to_arrow_schema(buffer.output_schema(node, from_arrow_schema(held.schema)))
    if node.rank is None and node.offset == 0:
        rows = [{**{c: r[c] for c in data}, TIME: r[TIME], DIFF: r[DIFF]} for r in change]
    else:
        rows = buffer.numbered(node, data, rank, old, new, store.new)
    return pa.Table.from_pylist(rows, schema=out_schema)


def _topk_tower(node: TopK, branch: Branch, held: pa.Table, store: Any) -> pa.Table:
    """A TopK kept by a tower (over an input with state of its own, an aggregate): the
    change's rows put in the buckets Spark's ``xxhash64`` of their non-key columns gives
    them, carried up the tower (:func:`ops.reduce.climb.climb_rows`, each bucket's first
    ``limit + offset`` rows as :func:`ops.reduce.buffer.first_rows` ranks them), the top
    level's change being the TopK's; numbered from the touched groups' top rows at old and
    new when it has a rank or an offset."""
    keys = list(node.partition)
    data = list(node.input.columns)
    rest = [c for c in data if c not in keys]
    types = {f.name: f.dataType for f in from_arrow_schema(held.schema)}
    rank = buffer.ranking(node.order, data)
    k = node.limit + node.offset
    leaf = _leaf(held, keys, rest, types, branch.levels)
    width = len(keys)
    position = {c: i for i, c in enumerate([*keys, "_p", "_b", *rest])}
    picks = [position[c] for c in data]
    back = [data.index(c) for c in rest]

    def first(children: list[Row], counts: Sequence[int], level: int) -> Counter:
        rows = Counter()
        for row, n in zip(children, counts, strict=True):
            rows[tuple(row[i] for i in picks)] += n
        kept = buffer.first_rows(rows, rank, k)
        return Counter({tuple(r[i] for i in back): n for r, n in kept.items()})

    changes = climb_rows(store, branch, keys, rest, rest, first, leaf)
    if changes is None:
        raise NotOnDriver(f"{branch.name}: the tower is Spark's to climb")
    top = changes[-1] if len(changes) == branch.levels + 1 else Counter()
    out_schema = to_arrow_schema(buffer.output_schema(node, from_arrow_schema(held.schema)))
    if not top:
        return out_schema.empty_table()
    if node.rank is None and node.offset == 0:
        rows = [
            {**{c: row[position[c]] for c in data}, TIME: store.new, DIFF: n}
            for row, n in top.items()
        ]
        return pa.Table.from_pylist(rows, schema=out_schema)
    rows = _numbered_top(node, branch, {row[:width] for row in top}, held.schema, store)
    return pa.Table.from_pylist(rows, schema=out_schema)


def _numbered_top(
    node: TopK, branch: Branch, touched: set[Row], schema: pa.Schema, store: Any
) -> list[dict]:
    """A ranked or offset TopK's change: the ``touched`` groups' top rows read at old and
    new, numbered (:func:`ops.reduce.buffer.numbered`)."""
    keys, data = list(node.partition), list(node.input.columns)
    groups = list(touched)
    probe = pa.table(
        {
            **{
                c: pa.array([g[i] for g in groups], schema.field(c).type)
                for i, c in enumerate(keys)
            },
            "_b": pa.array([0] * len(groups), pa.int64()),
        }
    )
    entries = store.read_rows(branch.tables[-1], [*keys, "_b"], probe, store.new)
    if entries is None:
        raise NotOnDriver(f"{branch.name}: the tower's top is Spark's to read")
    states = []
    for at in (store.old, store.new):
        held_rows = summed([e for e in entries.to_pylist() if e[TIME] <= at], data)
        per_group: dict[Row, Counter] = {}
        for row, n in held_rows.items():
            per_group.setdefault(tuple(row[data.index(c)] for c in keys), Counter())[row] = n
        states.append(per_group)
    rank = buffer.ranking(node.order, data)
    return buffer.numbered(node, data, rank, states[0], states[1], store.new)


def window_local(node: Window, delta: pa.Table, store: Any) -> pa.Table:
    """A Window's change from its input's updates ``delta`` (``(columns..., _time,
    _diff)``), :func:`ops.reduce.spark.render_window`'s: the touched partitions' rows read by
    the driver at old, the change added for new, their calls' values computed by Spark's own
    window functions over the two as local relations (:func:`ops.reduce.spark.window_values`,
    one task, no shuffle), and the change appended to the state table once they are known.
    NotOnDriver, before anything is written: floating-point input columns, more updates or
    partition rows than the driver's state rows, a NaN among the values."""
    (branch,) = branches(node)
    (table,) = branch.tables
    if store.read_rows is None or store.write_rows is None or store.old <= 0:
        raise NotOnDriver("the state is not the driver's to read")
    if delta.num_rows > current().driver_state_rows:
        raise NotOnDriver("more updates than the driver's state rows")
    keys = list(node.keys) or [GLOBAL_KEY]
    data = list(node.input.columns)
    cols = list(dict.fromkeys([*keys, *data]))
    if not exact_types(from_arrow_schema(delta.select(data).schema)):
        raise NotOnDriver("a window over floating point is Spark's")
    if not node.keys:
        delta = _with_global_key(delta)
    change = consolidated_on(delta, cols)
    if change is None:
        raise NotOnDriver("a column Arrow does not group")
    probe = distinct_rows(change.select(keys))
    what = f"{table.name}: the touched partitions"
    stamped, old, new = _local_states(store, table, keys, probe, change, cols, what)
    values = window_values(node, [(old, -1), (new, 1)])
    out_schema = to_arrow_schema(values.schema)
    found = normalized_floats(values.toArrow().cast(out_schema)) if change.num_rows else None
    net = consolidated_on(found, node.columns) if found is not None else None
    store.write_rows(table, stamped)
    if net is None or not net.num_rows:
        return out_schema.empty_table().append_column(TIME, pa.array([], pa.int64()))
    net = net.append_column(TIME, pa.array([store.new] * net.num_rows, pa.int64()))
    return net.select([*node.columns, TIME, DIFF])


def setop_local(node: SetOp, left: pa.Table | None, right: pa.Table | None, store: Any) -> pa.Table:
    """``left INTERSECT|EXCEPT [ALL] right``'s change, :func:`ops.reduce.spark.render_setop`'s:
    each side's updates summed per row into its count's change (``_ca``, ``_cb``), the
    touched rows' counts read at old, and each row's multiplicity at new minus at old; the
    counts' change appended to the state table. ``left``/``right``: a side's updates, None for
    a side of rows written in the view (no update after its build). NotOnDriver, before
    anything is written: floating-point or nested columns, a type the table's does not hold
    exactly, more updates than the driver's state rows, state the driver does not read."""
    (table,) = branches(node)[0].tables
    if store.read_rows is None or store.write_rows is None or store.row_schema is None:
        raise NotOnDriver("the state is not the driver's to read")
    if store.old <= 0:
        raise NotOnDriver("a build is Spark's")
    cols = list(node.columns)
    schema = store.row_schema(table)
    target = pa.schema([*(schema.field(c) for c in cols), pa.field(DIFF, pa.int64())])
    counts = []
    for side, delta, tag in ((node.left, left, "_ca"), (node.right, right, "_cb")):
        if delta is None:
            continue
        if delta.num_rows > current().driver_state_rows:
            raise NotOnDriver("more updates than the driver's state rows")
        named = delta.select([*side.columns, DIFF]).rename_columns([*cols, DIFF])
        if not exact_types(from_arrow_schema(named.select(cols).schema)):
            raise NotOnDriver("a set operation over floating point is Spark's")
        if any(pa.types.is_nested(f.type) for f in named.select(cols).schema):
            raise NotOnDriver("a set operation over nested values is Spark's (Arrow groups none)")
        why = cast_loss(named.schema, target)
        if why is not None:
            raise NotOnDriver(f"a set operation's {why}")
        zero = pa.array([0] * named.num_rows, pa.int64())
        named = named.cast(target).rename_columns([*cols, tag])
        counts.append(named.append_column("_cb" if tag == "_ca" else "_ca", zero))
    if not counts:
        return (
            pa.schema([*target][:-1])
            .append(pa.field(TIME, pa.int64()))
            .append(pa.field(DIFF, pa.int64()))
            .empty_table()
        )
    change = _summed_on(pa.concat_tables([c.select([*cols, "_ca", "_cb"]) for c in counts]), cols)
    change = change.filter(pc.or_(pc.not_equal(change["_ca"], 0), pc.not_equal(change["_cb"], 0)))
    before = store.read_rows(table, cols, change.select(cols), store.old)
    if before is None:
        raise NotOnDriver(f"{table.name}: the touched rows' counts are Spark's to read")
    at_old = before.select([*cols, "_ca", "_cb"]).cast(change.select([*cols, "_ca", "_cb"]).schema)
    zeros = pa.array([0] * change.num_rows, pa.int64())
    both = pa.concat_tables(
        [
            at_old.append_column("_ca0", at_old["_ca"]).append_column("_cb0", at_old["_cb"]),
            change.append_column("_ca0", zeros).append_column("_cb0", zeros),
        ]
    )
    held = _summed_on(both, cols)
    a0, b0 = held["_ca0"].to_numpy(), held["_cb0"].to_numpy()
    a1, b1 = held["_ca"].to_numpy(), held["_cb"].to_numpy()
    diff = _multiplicity(node, a1, b1) - _multiplicity(node, a0, b0)
    stamp = pa.array([store.new] * change.num_rows, pa.int64())
    store.write_rows(table, change.append_column(TIME, stamp).select(schema.names).cast(schema))
    out = held.select(cols).append_column(TIME, pa.array([store.new] * held.num_rows, pa.int64()))
    out = out.append_column(DIFF, pa.array(diff, pa.int64()))
    return out.filter(pc.not_equal(out[DIFF], 0))


def _summed_on(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """``rows``' other columns summed per distinct ``keys`` (NULL equal to NULL), as int64."""
    others = [c for c in rows.column_names if c not in keys]
    sums = rows.group_by(list(keys), use_threads=False).aggregate([(c, "sum") for c in others])
    return sums.select([*keys, *(f"{c}_sum" for c in others)]).rename_columns([*keys, *others])


def _multiplicity(node: SetOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Each row's copies in ``node``'s result given its counts ``a`` and ``b`` in its inputs."""
    if node.op == "intersect":
        return np.minimum(a, b) if node.all else ((a > 0) & (b > 0)).astype(np.int64)
    return np.maximum(a - b, 0) if node.all else ((a > 0) & (b <= 0)).astype(np.int64)


def stateful_local(
    node: Reduce | SetOp | TopK | Window, *deltas: pa.Table | None, store: Any
) -> pa.Table:
    """A GROUP BY's (:func:`reduce_local`), a set operation's (:func:`setop_local`), a TopK's
    (:func:`topk_local`) or a Window's (:func:`window_local`) change from its inputs'
    updates ``deltas`` (None: a set operation's side of rows written in the view)."""
    if isinstance(node, SetOp):
        return setop_local(node, *deltas, store=store)
    (delta,) = deltas
    assert delta is not None
    if isinstance(node, Reduce):
        return reduce_local(node, delta, store)
    if isinstance(node, Window):
        return window_local(node, delta, store)
    return topk_local(node, delta, store)
