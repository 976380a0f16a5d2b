"""A small change's GROUP BY computed by the driver, exactly as :mod:`ops.reduce` computes it
on Spark: accumulable aggregates (COUNT, SUM, AVG, BOOL_AND/OR, and their DISTINCT forms) and
MIN/MAX towers, their state read and written by the driver; and a buffered TopK's
(:func:`topk_local`, :func:`ops.buffer.refresh_rows`).

Contract in ``(data, time, diff)`` terms, :func:`ops.reduce.render_reduce`'s: given the
input's updates in ``(old, new]`` (Arrow), every branch's state tables get at ``new`` the rows
Spark's path writes (an accumulable branch: one row of summed contributions per touched group,
all-zero ones dropped; a DISTINCT: the ``(group, value)`` counts' change; a tower: each
level's change, :func:`ops.climb.climb_rows`), and the result is the reduce's change at
``new``: ``-1`` for each touched group's row at ``old``, ``+1`` for its row at ``new``,
consolidated. Values are Spark's: sums of integers and decimals exact, AVG of a decimal
divided in 38 significant digits rounded half up then rounded to Spark's result scales (as
``java.math.BigDecimal`` with Spark's ``MathContext``), MIN/MAX buckets hashed with Spark's
``xxhash64`` (:func:`spark_xxhash64`, the ``xxhash`` library's XXH64).

:class:`~ivm.errors.NotOnDriver` (checked before any state is written) for a global
aggregate, a monotonic input (no tower), recomputed (basic) aggregates, variances, floating
point, a MIN/MAX over a type whose hash is not reproduced here, and a value past its type.
"""

from __future__ import annotations

import datetime
import decimal
import math
import struct
from collections import Counter
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import xxhash
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema

from ivm.errors import NotOnDriver
from ivm.plan.ir import Aggregate, Reduce, TopK
from ivm.plan.reduce import FANOUT_BITS, SUMMED, Branch, branches
from ops import DIFF, TIME, buffer, floatsum
from ops.buffer import summed
from ops.climb import climb_rows
from ops.local import arrow_type, decimal_shape
from ops.sink import exact_types

Group = tuple

_EXACT = decimal.Context(prec=200)
"""Sums and products in as many digits as they need (Python's default keeps 28)."""

SPARK_DECIMAL_CONTEXT = decimal.Context(prec=38, rounding=decimal.ROUND_HALF_UP)
"""How Spark divides decimals: ``java.math.MathContext(38, HALF_UP)``, before rounding the
quotient to the result type's scale."""

_INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)

_SPECIAL = {
    "nan": pc.is_nan,
    "pinf": lambda x: pc.equal(x, math.inf),
    "ninf": lambda x: pc.equal(x, -math.inf),
}
"""The NaN and infinity counts beside exact floating-point sums (as ``ops.reduce``'s)."""


def _floating(t: T.DataType) -> bool:
    return isinstance(t, (T.FloatType, T.DoubleType))


_ACCUMULATED = {"count", "bool_and", "bool_or", *SUMMED}

_EPOCH = datetime.date(1970, 1, 1)
_SEED = 42


def _hashed_bytes(t: T.DataType) -> str | None:
    """How Spark's ``xxhash64`` lays out a value of type ``t``: a ``struct`` format, ``"utf-8"``
    for a string, or None for a type this module does not hash (Spark's part)."""
    if isinstance(t, (T.BooleanType, T.ByteType, T.ShortType, T.IntegerType, T.DateType)):
        return "<i"
    if isinstance(t, T.LongType) or (isinstance(t, T.DecimalType) and t.precision <= 18):
        return "<q"
    return "utf-8" if isinstance(t, T.StringType) else None


def spark_xxhash64(value: Any, t: T.DataType) -> int:
    """Spark's ``xxhash64(value)`` of one value of type ``t``, as a signed long: XXH64 with
    seed 42 over the value's little-endian bytes as Spark lays them out (an int or a date as 4
    bytes, a long or a decimal of up to 18 digits' unscaled value as 8, a string's UTF-8
    bytes); NULL hashes to the seed. Other types raise NotOnDriver."""
    layout = _hashed_bytes(t)
    if layout is None:
        raise NotOnDriver(f"MIN/MAX over {t.simpleString()}: Spark hashes its buckets")
    if value is None:
        return _SEED
    if layout == "utf-8":
        data = value.encode("utf-8")
    elif isinstance(t, T.DateType):
        data = struct.pack(layout, (value - _EPOCH).days)
    elif isinstance(t, T.DecimalType):
        data = struct.pack(layout, int(value.scaleb(t.scale, context=_EXACT)))
    else:
        data = struct.pack(layout, int(value))
    h = xxhash.xxh64_intdigest(data, seed=_SEED)
    return h - (1 << 64) if h >> 63 else h


def _fit(v: Decimal, precision: int, scale: int) -> Decimal:
    """``v`` rounded half away from zero to ``scale`` (Spark's ``changePrecision``), which
    must then fit ``precision`` digits (Spark returns NULL or raises: Spark's part)."""
    q = v.quantize(Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP, context=_EXACT)
    if q.adjusted() >= precision - scale and q != 0:
        raise NotOnDriver(f"a value overflows decimal({precision},{scale})")
    return q


def _adjusted(precision: int, scale: int) -> tuple[int, int]:
    """Spark's ``DecimalType.adjustPrecisionScale`` (precision loss allowed, the default)."""
    if precision <= 38:
        return precision, scale
    int_digits = precision - scale
    return 38, max(38 - int_digits, min(scale, 6))


def _divide_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
    """The type Spark gives ``decimal(p1, s1) / decimal(p2, s2)``."""
    scale = max(6, s1 + p2 + 1)
    return _adjusted(p1 - s1 + s2 + scale, scale)


class _Accumulable:
    """An accumulable branch's state columns, contributions and results, in Python: the
    same as :func:`ops.reduce._accumulator`'s Spark columns."""

    def __init__(self, aggregates: Sequence[Aggregate], types: dict[str, T.DataType]) -> None:
        self.aggregates = aggregates
        self.types = types
        self.columns: list[tuple[str, str, str | None]] = [("_rows", "rows", None)]
        self.float_terms: dict[tuple[str, bool], int] = {}  # (argument, squared) -> term
        for a in aggregates:
            if a.func not in _ACCUMULATED:
                raise NotOnDriver(f"{a.func.upper()} is computed by Spark")
            if a.arg is None:
                continue
            t = types[a.arg]
            self._add(f"_nn_{a.arg}", "nn", a.arg)
            if floatsum.is_exact(a.func, t):
                for kind in ("nan", "pinf", "ninf"):
                    self._add(f"_{kind}_{a.arg}", kind, a.arg)
                self._term(a.arg, False)
                if a.func not in ("sum", "avg"):
                    self._term(a.arg, True)
            elif a.func in ("sum", "avg"):
                if not isinstance(t, (*_INTEGRAL, T.DecimalType)):
                    raise NotOnDriver(f"{a.func.upper()} over {t.simpleString()} is Spark's")
                self._add(f"_sum_{a.arg}", "sum", a.arg)
            elif a.func in ("bool_and", "bool_or"):
                self._add(f"_true_{a.arg}", "true", a.arg)

    def _term(self, arg: str, squared: bool) -> int:
        return self.float_terms.setdefault((arg, squared), len(self.float_terms))

    def _add(self, name: str, kind: str, arg: str | None) -> None:
        if all(name != n for n, _, _ in self.columns):
            self.columns.append((name, kind, arg))

    @property
    def names(self) -> list[str]:
        return [n for n, _, _ in self.columns]

    def sums(self, rows: pa.Table, keys: Sequence[str]) -> dict[Group, list]:
        """Per group, the contributions of ``rows`` (updates with ``_diff``) summed by Arrow
        (decimals exact in 256 bits); groups whose sums are all zero are dropped (they change
        no state)."""
        diff = rows.column(DIFF)
        columns: dict[str, Any] = {k: rows.column(k) for k in keys}
        for name, kind, arg in self.columns:
            if kind == "rows":
                columns[name] = diff
                continue
            x = rows.column(arg)
            if kind == "nn":
                columns[name] = pc.if_else(pc.is_valid(x), diff, 0)
            elif kind in _SPECIAL:
                test = _SPECIAL[kind](x.cast(pa.float64()))
                columns[name] = pc.if_else(pc.fill_null(test, False), diff, 0)
            elif kind == "true":
                columns[name] = pc.if_else(pc.fill_null(pc.equal(x, True), False), diff, 0)
            else:
                precision, scale = decimal_shape(self.types[arg or ""])
                product = pc.multiply(
                    x.cast(pa.decimal256(precision, scale)), diff.cast(pa.decimal256(19, 0))
                )
                columns[name] = pc.fill_null(product, 0)
        summed_rows = (
            pa.table(columns)
            .group_by(list(keys), use_threads=False)
            .aggregate([(n, "sum") for n in self.names])
        )
        out: dict[Group, list] = {}
        for r in summed_rows.to_pylist():
            sums = [r[f"{n}_sum"] for n in self.names]
            if any(sums):
                out[tuple(r[k] for k in keys)] = sums
        return out

    @property
    def float_args(self) -> list[str]:
        """The arguments kept as exact floating-point sums, in the order Spark's path numbers
        them (``_t`` of a ``float_sums`` row)."""
        return [arg for arg, squared in self.float_terms if not squared]

    def float_sums(self, rows: pa.Table, keys: Sequence[str]) -> dict[Group, dict]:
        """Per group, the exact floating-point sums of ``rows`` (updates with ``_diff``) as
        ``{(argument, exponent): [v, qh, ql]}`` (:func:`ops.floatsum.terms` times ``_diff``,
        the rows Spark's path sums); all-zero entries dropped."""
        out: dict[Group, dict] = {}
        args = self.float_args
        squared = {arg for arg, sq in self.float_terms if sq}
        for r in rows.select([*keys, *args, DIFF]).to_pylist():
            sums = out.setdefault(tuple(r[k] for k in keys), {})
            for i, arg in enumerate(args):
                x = r[arg]
                if x is None:
                    continue
                x = float(x)  # a DECIMAL's or an integer's VARIANCE: Spark's double of it
                if x == 0 or not math.isfinite(x):
                    continue
                e, m, qh, ql = floatsum.terms(x)
                at = sums.setdefault((i, e), [0, 0, 0])
                at[0] += m * r[DIFF]
                if arg in squared:
                    at[1] += qh * r[DIFF]
                    at[2] += ql * r[DIFF]
        return {g: {k: v for k, v in at.items() if any(v)} for g, at in out.items()}

    def state_type(self, kind: str, arg: str | None) -> pa.DataType:
        if kind != "sum":
            return pa.int64()
        t = self.types[arg or ""]
        return pa.decimal128(38, t.scale if isinstance(t, T.DecimalType) else 0)

    def result_type(self, a: Aggregate) -> pa.DataType:
        if a.func == "count":
            return pa.int64()
        if a.func in ("bool_and", "bool_or"):
            return pa.bool_()
        t = self.types[a.arg or ""]
        if floatsum.is_exact(a.func, t):
            return pa.float64()
        if not isinstance(t, T.DecimalType):
            return pa.int64() if a.func == "sum" else pa.float64()
        p, s = t.precision, t.scale
        if a.func == "sum":
            return pa.decimal128(min(38, p + 10), s)
        return pa.decimal128(min(38, p + 4), min(38, s + 4))

    def results(self, state: list, bins: dict | None = None) -> list:
        """The aggregates' values from a group's summed state and exact floating-point sums
        ``{(term, bin): sum}`` (as ``ops.reduce._results``)."""
        at = {n: v for (n, _, _), v in zip(self.columns, state, strict=True)}
        out = []
        for a in self.aggregates:
            if a.arg is None:
                out.append(at["_rows"])
                continue
            nn = at[f"_nn_{a.arg}"]
            if a.func == "count":
                out.append(nn)
            elif floatsum.is_exact(a.func, self.types[a.arg]):
                out.append(self._float_result(a, at, bins or {}))
            elif nn <= 0:
                out.append(None)
            elif a.func == "bool_and":
                out.append(at[f"_true_{a.arg}"] == nn)
            elif a.func == "bool_or":
                out.append(at[f"_true_{a.arg}"] > 0)
            else:
                out.append(self._summed_result(a, Decimal(at[f"_sum_{a.arg}"]), nn))
        return out

    def _float_result(self, a: Aggregate, at: dict[str, Any], sums: dict) -> float | None:
        arg = a.arg or ""
        i = self.float_args.index(arg)
        exact = floatsum.fixed((e, *v) for (j, e), v in sums.items() if j == i)
        counts = [int(at[f"_{k}_{arg}"]) for k in ("nn", "nan", "pinf", "ninf")]
        return floatsum.exact_result(a.func, *counts, *exact)

    def _summed_result(self, a: Aggregate, total: Decimal, nn: int) -> Any:
        t = self.types[a.arg or ""]
        if not isinstance(t, T.DecimalType):
            if a.func == "sum":
                if not -(2**63) <= total < 2**63:
                    raise NotOnDriver("a SUM overflows bigint")
                return int(total)
            return float(total) / float(nn)
        p, s = t.precision, t.scale
        summed_as = (min(38, p + 10), s)
        total = _fit(total, *summed_as)
        if a.func == "sum":
            return total
        # AVG: CAST(CAST(sum AS DECIMAL(p+10, s)) / CAST(n AS DECIMAL(20, 0))
        #      AS DECIMAL(p+4, s+4)), as ops.reduce._avg_result writes it for Spark.
        quotient = SPARK_DECIMAL_CONTEXT.divide(total, Decimal(nn))
        quotient = _fit(quotient, *_divide_type(*summed_as, 20, 0))
        return _fit(quotient, min(38, p + 4), min(38, s + 4))


def _check(node: Reduce, types: dict[str, T.DataType]) -> None:
    """NotOnDriver, before anything is written, for what this module does not compute."""
    if not node.keys:
        raise NotOnDriver("a global aggregate is computed by Spark")
    for b in branches(node):
        if b.kind == "accumulable":
            _Accumulable(b.aggregates, types)
        elif b.kind == "hierarchical":
            if b.levels == 0:
                raise NotOnDriver("MIN/MAX of an append-only input is computed by Spark")
            t = types[b.value or ""]
            if _hashed_bytes(t) is None:
                raise NotOnDriver(f"MIN/MAX over {t.simpleString()}: Spark hashes its buckets")
        else:
            raise NotOnDriver(f"{b.kind} aggregates are computed by Spark")
        if b.distinct and b.kind != "accumulable":
            raise NotOnDriver("DISTINCT outside COUNT/SUM/AVG is computed by Spark")
        floating = [c for c in (*b.keys, *([b.value] if b.distinct else [])) if _floating(types[c])]
        if floating:
            raise NotOnDriver(f"grouping by floating point ({', '.join(floating)}) is Spark's")


def reduce_local(node: Reduce, delta: pa.Table, store: Any) -> pa.Table:
    """The reduce's change in ``(store.old, store.new]`` from its input's updates ``delta``
    (``(columns..., _time, _diff)``), its state read and written through ``store``
    (:class:`ops.reduce.StateStore`'s ``read_rows``/``write_rows``): the module's contract."""
    if store.read_rows is None or store.write_rows is None or store.old <= 0:
        raise NotOnDriver("the state is not the driver's to read")
    if delta.num_rows > buffer.DRIVER_STATE_ROWS:  # read when called: tests set it to 0
        raise NotOnDriver("more updates than the driver's state rows")
    types = {f.name: f.dataType for f in from_arrow_schema(delta.schema).fields}
    _check(node, types)
    keys = list(node.keys)
    rows = delta.filter(pc.not_equal(delta.column(DIFF), 0))
    key_schema = pa.schema([delta.schema.field(k) for k in keys])
    probe = rows.select(keys).group_by(keys, use_threads=False).aggregate([]).cast(key_schema)
    touched = [tuple(r[k] for k in keys) for r in probe.to_pylist()]
    found: list[tuple[dict[Group, list], dict[Group, list]]] = []
    for branch in branches(node):
        if branch.kind == "accumulable":
            found.append(_accumulable(branch, rows, delta.schema, types, keys, probe, store))
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
            *(pa.field(n, t) for n, t in _result_types(node, types).items()),
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


def _result_types(node: Reduce, types: dict[str, T.DataType]) -> dict[str, pa.DataType]:
    out: dict[str, pa.DataType] = {}
    for b in branches(node):
        if b.kind == "accumulable":
            acc = _Accumulable(b.aggregates, types)
            out.update({a.name: acc.result_type(a) for a in b.aggregates})
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
) -> tuple[dict[Group, list], dict[Group, list]]:
    """Write an accumulable branch's state change; its results per touched group at old and
    at new (groups with rows only)."""
    if branch.distinct:
        rows = _distinct_flips(branch, rows, schema, keys, store)
    acc = _Accumulable(branch.aggregates, types)
    table = branch.tables[-1]
    change = acc.sums(rows, keys)
    bins = _float_state(branch, acc, rows, keys, probe, store)
    before = store.read_rows(table, keys, probe, store.old)
    if before is None:
        raise NotOnDriver(f"{branch.name}: the touched groups' state is Spark's to read")
    old: dict[Group, list] = {}
    for r in before.to_pylist():
        sums = old.setdefault(tuple(r[k] for k in keys), [0] * len(acc.columns))
        for i, name in enumerate(acc.names):
            sums[i] = _EXACT.add(sums[i], r[name] or 0)
    new = {g: list(s) for g, s in old.items()}
    for g, s in change.items():
        sums = new.setdefault(g, [0] * len(acc.columns))
        for i, v in enumerate(s):
            sums[i] = _EXACT.add(sums[i], v)
    written = pa.schema(
        [
            *(schema.field(k) for k in keys),
            *(pa.field(n, acc.state_type(kind, arg)) for n, kind, arg in acc.columns),
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
    rows_at = acc.names.index("_rows")
    return tuple(  # type: ignore[return-value]
        {g: acc.results(s, at.get(g)) for g, s in state.items() if s[rows_at] > 0}
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
    table (``(keys..., _t, _b, _v, _qh, _ql, _time)``, the rows :func:`ops.reduce._float_sums`
    writes); the touched groups' sums ``{(argument, exponent): [v, qh, ql]}`` at old and at
    new."""
    table = branch.float_table
    if not acc.float_terms or table is None:
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


def _distinct_flips(
    branch: Branch, rows: pa.Table, schema: pa.Schema, keys: list[str], store: Any
) -> pa.Table:
    """Write a DISTINCT's ``(group, value)`` counts' change; the distinct set's change
    ``(group, value, _diff)``: ``+1`` for each value whose count rose from zero, ``-1`` for
    each that fell to zero (as :func:`ops.accumulate.distinct_on_driver`)."""
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
    flips = []
    for r in change.to_pylist():
        row = tuple(r[c] for c in cols)
        was = old.get(row, 0)
        flip = int(was + r[DIFF] > 0) - int(was > 0)
        if flip:
            flips.append({**dict(zip(cols, row, strict=True)), DIFF: flip})
    return pa.Table.from_pylist(flips, schema=change.schema)


def _tower(
    branch: Branch,
    rows: pa.Table,
    types: dict[str, T.DataType],
    keys: list[str],
    probe: pa.Table,
    store: Any,
) -> tuple[dict[Group, list], dict[Group, list]]:
    """Climb a MIN/MAX tower with the change (:func:`ops.climb.climb_rows`); the branch's
    results per touched group at old and at new, from its top level."""
    arg = branch.value or ""
    funcs = list(dict.fromkeys(a.func for a in branch.aggregates))
    values = [f"_{f}" for f in funcs]
    modulus = 1 << (FANOUT_BITS * branch.levels)
    t = types[arg]
    # Level 0: the change summed per (group, value), each value in its bucket (hashed once).
    level0 = (
        rows.select([*keys, arg, DIFF])
        .group_by([*keys, arg], use_threads=False)
        .aggregate([(DIFF, "sum")])
        .rename_columns([*keys, arg, DIFF])
    )
    distinct = pc.unique(level0.column(arg))
    hashes = pa.array([spark_xxhash64(v, t) % modulus for v in distinct.to_pylist()], pa.int64())
    buckets = pc.take(hashes, pc.index_in(level0.column(arg), value_set=distinct))
    leaf = level0.append_column("_b", buckets).append_column(
        "_p", pc.shift_right(buckets, FANOUT_BITS)
    )
    if not climb_rows(store, branch, keys, arg, funcs, leaf):
        raise NotOnDriver(f"{branch.name}: the tower is Spark's to climb")
    top_probe = probe.append_column("_b", pa.array([0] * probe.num_rows, pa.int64()))
    top = store.read_rows(branch.tables[-1], [*keys, "_b"], top_probe, store.new)
    if top is None:
        raise NotOnDriver(f"{branch.name}: the tower's top is Spark's to read")
    entries = top.to_pylist()
    out = []
    for at in (store.old, store.new):
        held = summed([e for e in entries if e[TIME] <= at], [*keys, *values])
        per_group: dict[Group, list] = {}
        for row, n in held.items():
            if n > 0:
                found = dict(zip(values, row[len(keys) :], strict=True))
                per_group[row[: len(keys)]] = [found[f"_{a.func}"] for a in branch.aggregates]
        out.append(per_group)
    return out[0], out[1]


def topk_local(node: TopK, delta: pa.Table, store: Any) -> pa.Table:
    """A buffered TopK's change computed by the driver (:func:`ops.buffer.refresh_rows`)
    from its input's updates ``delta`` (``(columns..., _time, _diff)``): ``(columns...,
    [rank], _time, _diff)``. NotOnDriver for a tower or monotonic TopK, floating-point
    columns, a group to refill from the input, or state the driver does not read."""
    (branch,) = branches(node)
    if branch.kind != "buffer" or store.read_rows is None or store.write_rows is None:
        raise NotOnDriver("this TopK is computed by Spark")
    if store.old <= 0 or delta.num_rows > buffer.DRIVER_STATE_ROWS:
        raise NotOnDriver("more updates than the driver's state rows")
    held = delta.select([*node.input.columns, DIFF])
    held = held.filter(pc.not_equal(held.column(DIFF), 0))
    if not exact_types(from_arrow_schema(held.schema)):
        raise NotOnDriver("a TopK over floating point is Spark's")
    updates = buffer.refresh_rows(node, branch, held, store)
    if updates is None:
        raise NotOnDriver("a TopK group to refill from its input")
    return updates


def stateful_local(node: Reduce | TopK, delta: pa.Table, store: Any) -> pa.Table:
    """A GROUP BY's (:func:`reduce_local`) or a TopK's (:func:`topk_local`) change."""
    if isinstance(node, Reduce):
        return reduce_local(node, delta, store)
    return topk_local(node, delta, store)
