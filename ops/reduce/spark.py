"""Spark's renderer of the reduce family: GROUP BY branches, DISTINCT and set operations,
towers, TopK.

Renders the branches :mod:`ivm.plan.reduce` decided as Spark DataFrames; the driver renders
the same plan for a small change (:mod:`ops.reduce.driver`), and within this path takes on the
state of a small change (:mod:`ops.reduce.accumulate`, :mod:`ops.reduce.climb`,
:mod:`ops.reduce.buffer`). What the two renderers of an accumulable branch must agree on (its state
columns, exact sums, decimal types and rounding, AVG's division, NULL rules) is
:mod:`ops.reduce.accumulable`'s; this module writes it as column expressions. Every branch keeps its
state in Delta tables (``state/<view>/<table>``) written once per epoch through a
:class:`StateStore`, and answers "what are the groups' results at time ``t``" for the groups a
change touched:

- *accumulable*: the state is, per group, sums of per-row contributions (row count, non-null
  counts, sums, sums of squares, counts of TRUE) appended as one row per touched group and
  epoch; the result at ``t`` is the sum of the rows up to ``t``. Exact: integer and DECIMAL
  sums are kept as DECIMAL(38, s), floating-point ones as exact sums per exponent
  (:mod:`ops.reduce.floatsum`); AVG of a decimal is Spark's ``Average`` quotient. A small change is
  summed on the driver (:mod:`ops.reduce.accumulate`).
- *hierarchical* (MIN/MAX) and *topk*: a tower (see :mod:`ivm.plan.reduce`). A change to
  level ``l - 1`` re-examines, for each touched bucket, only that bucket's children (about 16
  entries), and passes on only the buckets whose result changed; a level whose change is
  empty stops the climb. A small change climbs a MIN/MAX tower on the driver
  (:mod:`ops.reduce.climb`).
- *buffer* (TopK over a stateless input): per group, its first ``k + spare`` rows and its row
  count; the touched groups' buffers are merged with the change ranked at or above their last
  row, and a group left short is refilled from its input evaluated from scratch. A small
  change is merged on the driver (:mod:`ops.reduce.buffer`).
- *basic*: the touched groups are recomputed by Spark from the branch's input arrangement.
- *distinct*: a ``(group, value)`` count table; only values whose count crosses zero go on
  (counted on the driver for a small change, :mod:`ops.reduce.accumulate`).
- *threshold*: per-row counts of both inputs of INTERSECT/EXCEPT, and the multiplicity rule.

Contract in ``(data, time, diff)`` terms: given the input's updates ``Δ`` in ``(old, new]``
and state tables holding the input up to ``old``, :func:`render_reduce` (and the set-op and
TopK renderers) return ``R(new) - R(old)`` as updates at time ``new`` (``-1`` for each old
result row of a touched group, ``+1`` for each new one, consolidated, so unchanged groups
produce nothing) and leave the state tables holding the input up to ``new``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from functools import reduce as fold
from typing import Protocol

import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import Column, DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql import types as T
from sqlglot import exp as sqlexp

from ivm.errors import InvariantViolation, UnsupportedSqlError
from ivm.plan.ir import Aggregate, Node, Reduce, SetOp, TopK, window_function
from ivm.plan.ir import Window as WindowNode
from ivm.plan.reduce import (
    FANOUT_BITS,
    GLOBAL_KEY,
    SUMMED,
    Branch,
    StateTable,
    branches,
    presum_grain,
    topk_spare,
)
from ivm.policy import current
from ops import DIFF, TIME, decimals
from ops.consolidate import consolidate
from ops.expressions import spark_sql
from ops.reduce import accumulable, floatsum
from ops.reduce.accumulate import accumulate_on_driver, distinct_on_driver
from ops.reduce.buffer import refresh_on_driver
from ops.reduce.climb import built_levels, climb_on_driver
from ops.sink import arrow_schema, exact_types
from resources.spark import is_connect

FLOAT_BINS = "_fb"
"""A group's exact floating-point sums, collected from its ``float_sums`` rows: an array of
``(_t argument, _b exponent, _v, _qh, _ql)`` structs (:mod:`ops.reduce.floatsum`)."""


def _c(name: str) -> Column:
    return F.col(f"`{name}`")


class StateWriter(Protocol):
    """Appends an epoch's updates to a state table (see :class:`StateStore`'s ``write``)."""

    def __call__(
        self, table: StateTable, updates: DataFrame, rows_hint: int | None = None
    ) -> int | None: ...


@dataclass
class StateStore:
    """Where a view's state tables live, and reading/writing them at the refresh's times.

    Implemented by the engine (it knows the lake and the epochs); operators only call it.

    Attributes:
        old: the epoch the state holds before this refresh (0: none, the view is being built).
        new: the epoch this refresh writes.
        write: ``(table, updates, rows_hint=None)`` appends an epoch's updates to a state
            table once (idempotent per epoch; a build replaces the table); returns the rows
            written, or None when an earlier attempt already wrote this epoch. ``rows_hint``
            (about how many rows ``updates`` holds) lets a large build's write be spread over
            several range-partitioned tasks; without it the write is one task.
        read: ``(table, key columns, keys, as_of)`` the table's raw rows (``_time <= as_of``)
            whose key columns equal (NULL-safe) a row of ``keys``.
        progress: reports what a refresh does (the engine names the view).
        snapshot: a stateless plan node's whole collection at ``new``, evaluated from scratch
            as updates ``(columns..., _time, _diff)`` (a buffered TopK's refill).
        small: the inputs' change is small enough for the driver to hold (the engine's
            ``Placement.small``: at most ``policy.driver_change_rows`` input updates).
        read_rows: ``(table, key columns, keys, as_of)`` :attr:`read` done by the driver
            (``keys`` and the rows as Arrow, nothing summed), or None when the files it would
            open hold too many rows for the driver (:func:`ops.arrange.lookup_rows`).
        write_rows: ``(table, updates)`` :attr:`write` of updates the driver holds, as Arrow
            ``(columns..., _time, _diff)`` with the table's types.
        row_schema: ``(table)`` the columns and types :attr:`read_rows` gives its rows.
    """

    spark: SparkSession
    old: int
    new: int
    write: StateWriter
    read: Callable[[StateTable, Sequence[str], DataFrame, int], DataFrame]
    progress: Callable[[str], None] = field(default=lambda msg: None)
    snapshot: Callable[[Node], DataFrame] | None = None
    small: bool = False
    read_rows: Callable[[StateTable, Sequence[str], pa.Table, int], pa.Table | None] | None = None
    write_rows: Callable[[StateTable, pa.Table], int | None] | None = None
    row_schema: Callable[[StateTable], pa.Schema] | None = None

    def read_consolidated(
        self, table: StateTable, key: Sequence[str], keys: DataFrame, as_of: int, like: DataFrame
    ) -> DataFrame:
        """The table's multiset at ``as_of`` for ``keys`` (repeats allowed: the lookup makes
        them distinct on the driver): ``(columns..., _diff)``.

        At ``as_of`` 0 (before the view existed) it is empty, shaped like ``like``'s columns
        (the table may not exist yet).
        """
        if as_of <= 0:
            return like.select(*[_c(c) for c in like.columns if c != TIME]).limit(0)
        rows = self.read(table, key, keys, as_of)
        columns = [c for c in rows.columns if c not in (TIME, DIFF)]
        return consolidate(rows, columns, by_time=False)


def materialize(df: DataFrame) -> DataFrame:
    """Compute ``df`` once and keep it (it is read several times); lineage is cut."""
    return df.localCheckpoint(eager=True)


_SCAN_NODES = frozenset({"LogicalRelation", "Project", "Filter", "Union"})


def scan_only(df: DataFrame) -> bool:
    """Whether ``df`` only reads files, filtered and mapped: reading them again costs less
    than keeping a copy (BENCHMARKS.md, "Policy thresholds: reductions"). Rows from the
    driver (a change feed) are kept: a local relation ships its rows with every task of every
    job that reads it."""
    if is_connect(df.sparkSession):
        return plan_nodes(df._explain_string(extended=True)) <= _SCAN_NODES
    plan = df._jdf.queryExecution().optimizedPlan()
    stack = [plan]
    while stack:
        node = stack.pop()
        if node.getClass().getSimpleName() not in _SCAN_NODES:
            return False
        children = node.children()
        stack.extend(children.apply(i) for i in range(children.size()))
    return True


_PRINTED_NAMES = {"Relation": "LogicalRelation"}


def plan_nodes(explained: str) -> set[str]:
    """The node names of the optimized logical plan in Spark's extended EXPLAIN text (how a
    Spark Connect client sees a plan): each line's first word once the tree's drawing is
    stripped, as the JVM's class names. A line that is not a node (a wrapped expression)
    yields a name no caller expects, so a caller testing for a set of names stays safe."""
    lines = explained.split("== Optimized Logical Plan ==", 1)[-1].split("\n== ", 1)[0]
    names = set()
    for line in lines.strip().splitlines():
        word = re.split(r"[\s\[(]", line.lstrip(" :+-"), maxsplit=1)[0]
        names.add(_PRINTED_NAMES.get(word, word))
    return names


def _empty(df: DataFrame) -> bool:
    return df.limit(1).count() == 0


def _with_global_key(df: DataFrame) -> DataFrame:
    return df.withColumn(GLOBAL_KEY, F.lit(0).cast("int"))


@dataclass(frozen=True)
class _Groups:
    """The groups a change touched: key columns (``_g`` for a global reduce), their values."""

    keys: list[str]
    touched: DataFrame
    global_row: bool
    _held: dict[int, pa.Table | None] = field(default_factory=dict)

    def held(self, most: int) -> pa.Table | None:
        """The touched keys collected by the driver once, or None when more than ``most``."""
        if most not in self._held:
            rows = self.touched.limit(most + 1).toArrow()
            self._held[most] = rows if rows.num_rows <= most else None
        return self._held[most]


# -- accumulable -------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Accumulator:
    """An accumulable branch's state (:func:`ops.reduce.accumulable.layout`) rendered as Spark
    columns.

    ``contributions``: per state column, its value over an input update row; ``results``: per
    aggregate, its value over the summed state. ``float_specs``: the aggregates computed from
    exact floating-point sums (:func:`ops.reduce.floatsum.arrow_results`), whose results read
    :data:`FLOAT_RESULTS`; ``averages``: the AVGs of decimals Spark's decimal division cannot
    round as ``Average`` does, ``(sum column, count column, argument type)``, computed by
    :func:`ops.reduce.accumulable.decimal_averages` into :data:`DECIMAL_AVERAGES`."""

    layout: accumulable.Layout
    contributions: list[Column]
    results: list[Callable[[], Column]]
    float_specs: list[tuple] = field(default_factory=list)  # see ops.reduce.floatsum.arrow_results
    averages: list[tuple[str, str, T.DecimalType]] = field(default_factory=list)

    @property
    def state_columns(self) -> list[str]:
        return self.layout.names

    @property
    def names(self) -> list[str]:
        return [a.name for a in self.layout.aggregates]

    @property
    def float_terms(self) -> tuple[tuple[str, bool], ...]:
        return self.layout.float_terms


FLOAT_RESULTS = "_fr"
"""The exact floating-point aggregates' values of a group, in the accumulator's order."""

DECIMAL_AVERAGES = "_da"
"""The AVGs of decimals divided in Python, as text, in the accumulator's order."""


def _with_float_results(state: DataFrame, acc: _Accumulator) -> DataFrame:
    """``state`` with :data:`FLOAT_RESULTS` computed from its counts and :data:`FLOAT_BINS` by
    :func:`ops.reduce.floatsum.arrow_results` (Arrow batches in Spark's Python workers; the module
    is pickled by value, so they need only the standard library and pyarrow)."""
    cloudpickle.register_pickle_by_value(floatsum)
    out = T.StructField(FLOAT_RESULTS, T.ArrayType(T.DoubleType()))
    schema = T.StructType([*state.schema.fields, out])
    return state.mapInArrow(partial(floatsum.arrow_results, specs=acc.float_specs), schema)


def _with_decimal_averages(state: DataFrame, acc: _Accumulator) -> DataFrame:
    """``state`` with :data:`DECIMAL_AVERAGES` computed by
    :func:`ops.reduce.accumulable.decimal_averages` (Spark's Python workers, the module pickled by
    value) from each sum cast to the type ``Average`` sums in (Spark's cast: past it, an error
    under ANSI mode, else NULL)."""
    cloudpickle.register_pickle_by_value(accumulable)
    cloudpickle.register_pickle_by_value(decimals)
    inputs = [
        _c(total).cast(accumulable.summed_decimal(t)).alias(f"{DECIMAL_AVERAGES}{i}")
        for i, (total, _, t) in enumerate(acc.averages)
    ]
    specs = [
        (f"{DECIMAL_AVERAGES}{i}", nn, accumulable.average_decimal(t).scale)
        for i, (_, nn, t) in enumerate(acc.averages)
    ]
    state = state.select("*", *inputs)
    out = T.StructField(DECIMAL_AVERAGES, T.ArrayType(T.StringType()))
    schema = T.StructType([*state.schema.fields, out])
    averages = partial(accumulable.decimal_averages, specs=specs, column=DECIMAL_AVERAGES)
    return state.mapInArrow(averages, schema)


def _contribution(column: accumulable.StateColumn, types: Mapping[str, T.DataType]) -> Column:
    """A state column's contribution from an input update row (``_diff`` times its term)."""
    diff = _c(DIFF)
    if column.arg is None:
        return diff.cast("bigint").alias(column.name)
    x = _c(column.arg)
    dt = types[column.arg]
    if column.kind == "nn":
        term = F.when(x.isNotNull(), diff).otherwise(0).cast("bigint")
    elif column.kind in accumulable.FLOAT_COUNTS:
        xd = x.cast("double")
        test = {
            "nan": F.isnan(xd),
            "pinf": xd == F.lit(float("inf")),
            "ninf": xd == F.lit(float("-inf")),
        }[column.kind]
        term = F.when(x.isNotNull() & test, diff).otherwise(0).cast("bigint")
    elif column.kind == "sum":
        st = accumulable.sum_type(dt, "SUM")
        term = F.coalesce(_times_diff(x, dt, st), F.lit(0).cast(st))
    else:  # "true"
        term = F.when(x, diff).otherwise(0).cast("bigint")
    return term.alias(column.name)


def _accumulator(aggregates: Sequence[Aggregate], schema: T.StructType) -> _Accumulator:
    types = {f.name: f.dataType for f in schema.fields}
    state = accumulable.layout(aggregates, types)
    specs: list[tuple] = []
    averages: list[tuple[str, str, T.DecimalType]] = []
    results: list[Callable[[], Column]] = []
    for a in aggregates:
        if a.arg is None:
            results.append(lambda: _c("_rows"))
            continue
        dt = types[a.arg]
        nn, func = f"_nn_{a.arg}", a.func
        if func == "count":
            results.append(lambda nn=nn: _c(nn))
        elif func in SUMMED and state.exact_float(a):
            argument = state.float_args.index(a.arg)
            specs.append((func, *state.float_counts(a.arg), argument))
            i = len(specs) - 1
            results.append(lambda i=i: F.col(FLOAT_RESULTS).getItem(i))
        elif func in SUMMED:
            total = f"_sum_{a.arg}"
            accumulable.sum_type(dt, func.upper())  # an error naming the aggregate, for a bad type
            if func == "sum":
                results.append(lambda nn=nn, total=total, dt=dt: _sum_result(nn, total, dt))
            elif func != "avg":  # pragma: no cover - every numeric VARIANCE/STDDEV is exact
                raise InvariantViolation(f"{func} over {dt.simpleString()} is not summed exactly")
            elif isinstance(dt, T.DecimalType) and accumulable.sql_average_numerator(dt) is None:
                averages.append((total, nn, dt))
                i = len(averages) - 1
                results.append(lambda nn=nn, i=i, dt=dt: _divided_average(nn, i, dt))
            else:
                results.append(lambda nn=nn, total=total, dt=dt: _avg_result(nn, total, dt))
        elif func in ("bool_and", "bool_or"):
            if not isinstance(dt, T.BooleanType):
                raise UnsupportedSqlError(
                    f"{func.upper()} over a column of type {dt.simpleString()}", construct=func
                )
            true = f"_true_{a.arg}"
            if func == "bool_and":
                results.append(lambda nn=nn, t=true: F.when(_c(nn) > 0, _c(t) == _c(nn)))
            else:
                results.append(lambda nn=nn, t=true: F.when(_c(nn) > 0, _c(t) > 0))
        else:  # pragma: no cover - the planner routes only accumulable functions here
            raise InvariantViolation(f"{func} is not accumulable")
    contributions = [_contribution(c, types) for c in state.columns]
    return _Accumulator(state, contributions, results, specs, averages)


FLOAT_SUMS = ("_v", "_qh", "_ql")
"""The sums a ``float_sums`` row keeps (:mod:`ops.reduce.floatsum`)."""


def _float_sums(acc: _Accumulator, delta: DataFrame, keys: Sequence[str]) -> DataFrame:
    """The change's exact floating-point sums per ``(group, argument, exponent)``, the rows an
    epoch appends to a ``float_sums`` table (``_t`` the argument, ``_b`` the exponent, ``_v``,
    ``_qh``, ``_ql`` the sums of :func:`ops.reduce.floatsum.terms` times ``_diff``); all-zero rows
    dropped. The input is summed per exponent: a few rows per group, whatever its size."""
    args = acc.layout.float_args
    squared = acc.layout.squared
    dec = T.DecimalType(38, 0)
    ks = [_c(k) for k in keys]
    x = [_c(a).cast("double") for a in args]
    finite = [
        xi.isNotNull() & ~F.isnan(xi) & (F.abs(xi) != F.lit(float("inf"))) & (xi != F.lit(0.0))
        for xi in x
    ]
    exps = delta.select(
        *ks,
        _c(DIFF),
        *[xi.alias(f"_x{i}") for i, xi in enumerate(x)],
        *[
            F.when(ok, floatsum.spark_exponent(xi, F)).alias(f"_e{i}")
            for i, (xi, ok) in enumerate(zip(x, finite, strict=True))
        ],
    )
    diff = _c(DIFF)
    zero = F.lit(0).cast(dec)

    def times_diff(v: Column) -> Column:
        v = v.cast(dec)
        return F.when(diff == 1, v).when(diff == -1, -v).otherwise(v * diff.cast(dec)).cast(dec)

    entries = []
    for i, arg in enumerate(args):
        e, m, qh, ql = floatsum.spark_mantissa(_c(f"_x{i}"), _c(f"_e{i}"), F)
        sums = [times_diff(m), *[times_diff(q) if arg in squared else zero for q in (qh, ql)]]
        entries.append(
            F.struct(
                F.lit(i).alias("_t"),
                e.alias("_b"),
                *[v.alias(n) for v, n in zip(sums, FLOAT_SUMS, strict=True)],
            )
        )
    rows = exps.select(*ks, F.explode(F.array(*entries)).alias("_s")).where(
        F.col("_s._b").isNotNull()
    )
    summed = rows.groupBy(*ks, F.col("_s._t").alias("_t"), F.col("_s._b").alias("_b")).agg(
        *[F.sum(F.col(f"_s.{n}")).cast(dec).alias(n) for n in FLOAT_SUMS]
    )
    return summed.where(fold(lambda a, b: a | b, [_c(n) != 0 for n in FLOAT_SUMS]))


def _float_bins(
    store: StateStore, table: StateTable, keys: Sequence[str], touched: DataFrame
) -> DataFrame:
    """The touched groups' exact floating-point sums at old and at new: ``(keys...,
    _fb__old, _fb)``, each a list of ``(_t, _b, _v, _qh, _ql)`` (see :data:`FLOAT_BINS`)."""
    rows = store.read(table, keys, touched, store.new)
    ks = [_c(k) for k in keys]
    at_old = [F.sum(F.when(_c(TIME) <= store.old, _c(n)).otherwise(0)) for n in FLOAT_SUMS]
    per_exponent = rows.groupBy(*ks, _c("_t"), _c("_b")).agg(
        *[F.sum(_c(n)).alias(n) for n in FLOAT_SUMS],
        *[s.alias(f"{n}__old") for s, n in zip(at_old, FLOAT_SUMS, strict=True)],
    )
    old = [_c(f"{n}__old").alias(n) for n in FLOAT_SUMS]
    return per_exponent.groupBy(*ks).agg(
        F.collect_list(F.struct(_c("_t"), _c("_b"), *old)).alias(f"{FLOAT_BINS}__old"),
        F.collect_list(F.struct(_c("_t"), _c("_b"), *map(_c, FLOAT_SUMS))).alias(FLOAT_BINS),
    )


def _times_diff(x: Column, dt: T.DataType, st: T.DataType) -> Column:
    """``x * _diff`` as a sum's contribution of type ``st``; ``dt`` is ``x``'s type.

    Exact for decimals: Spark types ``decimal(38, s) * bigint`` as ``decimal(38, 6)`` when
    ``s`` > 6, rounding every value to 6 decimals (a SUM over ``decimal(20, 10)`` was off in
    its 7th decimal). So a diff of 1 or -1 is not multiplied at all, and any other diff
    multiplies ``x`` in its own precision ``p`` with the diff as a decimal of ``37 - p``
    digits at most, which keeps the product within 38 digits: any diff when ``p`` <= 18.
    A larger diff (a row repeated more than ``10^(37-p)`` times at once) gets Spark's
    product. Not multiplying is also faster: Spark multiplies decimals as
    ``java.math.BigDecimal`` objects."""
    diff = _c(DIFF)
    weighed = x.cast(st)
    product = weighed * diff
    if isinstance(dt, T.DecimalType):
        product = product.cast(st)
        digits = min(19, 37 - dt.precision)  # bigint's range fits in 19 digits
        if digits >= 1:
            exact = (x * diff.cast(T.DecimalType(digits, 0))).cast(st)
            bound = 10**digits - 1
            product = (
                exact
                if digits == 19
                else F.when(diff.between(-bound, bound), exact).otherwise(product)
            )
    return F.when(diff == 1, weighed).when(diff == -1, -weighed).otherwise(product)


def _sum_result(nn: str, total: str, dt: T.DataType) -> Column:
    """Spark's SUM from the state: NULL with no non-NULL value, else the exact sum cast to
    SUM's type (:func:`ops.reduce.accumulable.summed_decimal`, a BIGINT, a double)."""
    if isinstance(dt, T.DecimalType):
        out: T.DataType = accumulable.summed_decimal(dt)
    elif isinstance(dt, (T.FloatType, T.DoubleType)):
        out = T.DoubleType()
    else:
        out = T.LongType()
    return F.when(_c(nn) > 0, _c(total).cast(out))


def _avg_result(nn: str, total: str, dt: T.DataType) -> Column:
    """Spark's AVG from the state: NULL with no non-NULL value; of integers a double quotient;
    of a DECIMAL(p, s), as ``Average`` divides (:func:`ops.reduce.accumulable.decimal_average`): the
    sum cast to DECIMAL(p + 10, s) (Spark's overflow check), widened exactly to
    :func:`ops.reduce.accumulable.sql_average_numerator`'s type, divided by the count as
    DECIMAL(20, 0) in a division whose type has the result's scale (Spark rounds its 39-place
    quotient once, to it), then cast to DECIMAL(p + 4, s + 4). Only for types that have such a
    division; the others are :func:`_divided_average`'s."""
    if not isinstance(dt, T.DecimalType):
        return F.when(_c(nn) > 0, _c(total).cast("double") / _c(nn).cast("double"))
    numerator = accumulable.sql_average_numerator(dt)
    if numerator is None:  # pragma: no cover - _accumulator routes these to the workers
        raise InvariantViolation(f"AVG over {dt.simpleString()} has no exact decimal division")
    count = _c(nn).cast(T.DecimalType(accumulable.COUNT_DIGITS, 0))
    quotient = _c(total).cast(accumulable.summed_decimal(dt)).cast(numerator) / count
    return F.when(_c(nn) > 0, quotient.cast(accumulable.average_decimal(dt)))


def _divided_average(nn: str, i: int, dt: T.DecimalType) -> Column:
    """AVG of a decimal divided by :func:`ops.reduce.accumulable.decimal_averages` (the ``i``-th of
    :data:`DECIMAL_AVERAGES`), cast to its type (past it: Spark's cast raises, or NULL)."""
    quotient = F.col(DECIMAL_AVERAGES).getItem(i)
    return F.when(_c(nn) > 0, quotient.cast(accumulable.average_decimal(dt)))


def _group_sums(
    acc: _Accumulator, delta: DataFrame, keys: Sequence[str], presummed: bool = False
) -> DataFrame:
    """The per-group sums of ``delta``'s contributions (all-zero rows dropped), the state
    rows an epoch appends; ``presummed``: ``delta`` holds the contributions already summed
    at a finer grain."""
    if presummed:
        parts = [F.sum(_c(n)).cast(delta.schema[n].dataType).alias(n) for n in acc.state_columns]
    else:
        parts = [
            F.sum(c).alias(n) for c, n in zip(acc.contributions, acc.state_columns, strict=True)
        ]
    sums = delta.groupBy(*[_c(k) for k in keys]).agg(*parts)
    return sums.where(fold(lambda a, b: a | b, [_c(n) != 0 for n in acc.state_columns]))


def _results(acc: _Accumulator, keys: Sequence[str], state: DataFrame) -> DataFrame:
    """The branch's results per group from its summed state ``(keys..., state columns...)``,
    and :data:`FLOAT_BINS` when it keeps exact floating-point sums."""
    if acc.float_specs:
        state = _with_float_results(state, acc)
    if acc.averages:
        state = _with_decimal_averages(state, acc)
    return state.select(
        *[_c(k) for k in keys],
        *[r().alias(n) for r, n in zip(acc.results, acc.names, strict=True)],
    )


def _accumulated_values(
    store: StateStore,
    table: StateTable,
    acc: _Accumulator,
    groups: _Groups,
    floats: StateTable | None = None,
) -> tuple[DataFrame, DataFrame]:
    """The branch's results for the touched groups at old and at new (existing groups only;
    a global reduce always has its one row, once the view exists). ``floats``: the branch's
    ``float_sums`` table, read when it keeps exact floating-point sums."""
    keys, touched, global_row = groups.keys, groups.touched, groups.global_row
    rows = store.read(table, keys, touched, store.new)
    sums = rows.groupBy(*[_c(k) for k in keys]).agg(
        *[F.sum(_c(n)).alias(n) for n in acc.state_columns],
        *[
            F.sum(F.when(_c(TIME) <= store.old, _c(n))).alias(f"{n}__old")
            for n in acc.state_columns
        ],
    )
    if global_row:  # the one row exists even when no state row does
        sums = touched.join(sums, on=list(keys), how="left")
    exact = acc.float_terms and floats is not None
    if exact:
        sums = join_null_safe(sums, _float_bins(store, floats, keys, touched), keys, "left")
    out = []
    for suffix in ("__old", ""):
        cols = [
            F.coalesce(_c(f"{n}{suffix}"), F.lit(0))
            .cast(sums.schema[f"{n}{suffix}"].dataType)
            .alias(n)
            for n in acc.state_columns
        ]
        if exact:
            cols.append(_c(f"{FLOAT_BINS}{suffix}").alias(FLOAT_BINS))
        state = sums.select(*[_c(k) for k in keys], *cols)
        if not global_row:
            state = state.where(_c("_rows") > 0)
        elif suffix == "__old" and store.old == 0:
            state = state.where(F.lit(False))
        out.append(_results(acc, keys, state))
    return out[0], out[1]


# -- towers (MIN/MAX and TopK) -----------------------------------------------------------------


def _bucket(columns: Sequence[str], levels: int) -> Column:
    """``hash(columns) mod 16^levels``: the row's bucket at level 0."""
    h = F.xxhash64(*[_c(c) for c in columns])
    return F.pmod(h, F.lit(1 << (FANOUT_BITS * levels)).cast("bigint"))


def _parent(b: Column) -> Column:
    return F.shiftright(b, FANOUT_BITS)


def _with_buckets(level0: DataFrame, leaf_values: Sequence[str], levels: int) -> DataFrame:
    """Level 0's rows with their bucket ``_b`` and its parent ``_p`` at level 1."""
    with_bucket = level0.withColumn("_b", _bucket(list(leaf_values), levels))
    return with_bucket.withColumn("_p", _parent(_c("_b")))


@dataclass(frozen=True)
class _Tower:
    """What a tower keeps per bucket and how a bucket's children reduce to it."""

    keys: tuple[str, ...]
    values: tuple[str, ...]  # value columns at levels >= 1
    leaf_values: tuple[str, ...]  # value columns at level 0
    combine: Callable[[DataFrame, list[str], bool], DataFrame]
    """``(children, group columns, leaf)`` -> bucket rows ``(group..., values..., _diff)``."""


def _built_level(tower: _Tower, below: DataFrame, level: int, time: int) -> DataFrame:
    """A build's level ``level`` of a tower: one row per bucket of ``below`` (the level under
    it, whole), ``(keys..., _p, _b, values..., _diff, _time)``."""
    keys = list(tower.keys)
    fresh = tower.combine(below.drop(TIME, "_b"), [*keys, "_p"], level == 1)
    fresh = fresh.withColumnRenamed("_p", "_b")
    fresh = fresh.withColumn("_p", _parent(_c("_b")))
    cols = [*keys, "_p", "_b", *tower.values]
    return fresh.select(*[_c(c) for c in cols], DIFF).withColumn(TIME, F.lit(time).cast("bigint"))


def _built_by_driver(
    store: StateStore,
    branch: Branch,
    tower: _Tower,
    level0: DataFrame,
    rows: int | None,
    levels: Callable[[pa.Table], list[pa.Table]],
) -> DataFrame | None:
    """A build's levels above level 0 (``level0``, just written: ``rows`` rows) computed
    by the driver with ``levels`` and written by it, or None (nothing written) when level 0
    has more rows than the policy's ``driver_state_rows``, an earlier attempt wrote it, or a
    column's type is not exact: Spark climbs. One Spark job (collecting level 0) instead of
    some three a level; each level's table has the schema Spark's write would give it (the
    same frames, planned and not run). Returns the top level."""
    if (
        rows is None
        or rows > current().driver_state_rows
        or store.write_rows is None
        or not exact_types(level0.schema)
    ):
        return None
    computed = levels(level0.drop(TIME).toArrow())
    frame, table = level0, None
    for level, rows_of_level in enumerate(computed, start=1):
        frame = _built_level(tower, frame, level, store.new)
        schema = arrow_schema(frame)
        table = rows_of_level.select(schema.names).cast(schema)
        store.write_rows(branch.tables[level], table)
    store.progress(
        f"{branch.name}: tower built by the driver above level 0 ({rows} rows, "
        f"{len(computed)} level(s))"
    )
    return store.spark.createDataFrame(table, schema=frame.schema) if table is not None else level0


def _climb(
    store: StateStore,
    branch: Branch,
    tower: _Tower,
    level0: DataFrame,
    unique: bool,
    driver_levels: Callable[[pa.Table], list[pa.Table]] | None = None,
) -> DataFrame:
    """Write a change to level 0 and carry it up the tower; returns the top level's change.
    ``driver_levels``: how the driver computes a build's levels from level 0 (MIN/MAX:
    :func:`ops.reduce.climb.built_levels`), used when level 0 is small (:func:`_built_by_driver`).

    ``unique``: ``level0`` is already one row per ``(keys, leaf values)`` with a non-zero
    ``_diff`` (the input presummed at that grain), so it is written as it stands. In a
    build, a level's new rows are its whole contents, one per bucket: they too are written
    as computed, with no summing pass against the (empty) old level (BENCHMARKS.md, "Policy
    thresholds: reductions")."""
    keys = list(tower.keys)
    tables = branch.tables
    leaf = _with_buckets(level0, tower.leaf_values, branch.levels).withColumn(
        TIME, F.lit(store.new).cast("bigint")
    )
    # A projection of a kept frame costs less to recompute for each reader than a copy.
    delta = (
        leaf if unique else materialize(consolidate(leaf, [*keys, "_p", "_b", *tower.leaf_values]))
    )
    written = store.write(tables[0], delta)
    if store.old == 0 and driver_levels is not None:
        top = _built_by_driver(store, branch, tower, delta, written, driver_levels)
        if top is not None:
            return top
    for level in range(1, branch.levels + 1):
        # A build writes every level (they must exist); the rows written say if the change
        # is empty, unless an earlier attempt wrote them.
        if store.old > 0 and (written == 0 if written is not None else _empty(delta)):
            store.progress(f"{branch.name}: no change reaches level {level}")
            break
        if store.old == 0:
            # A build: the level below holds exactly ``delta`` (all at ``new``), so its
            # buckets' children need no lookup of the table just written; nothing to retract.
            delta = materialize(_built_level(tower, delta, level, store.new))
            written = store.write(tables[level], delta)
            continue
        parents = delta.select(*[_c(k) for k in keys], _c("_p"))
        children = store.read_consolidated(
            tables[level - 1], [*keys, "_p"], parents, store.new, delta
        )
        fresh = tower.combine(children.drop("_b"), [*keys, "_p"], level == 1)
        fresh = fresh.withColumnRenamed("_p", "_b")
        fresh = fresh.withColumn("_p", _parent(_c("_b")))
        cols = [*keys, "_p", "_b", *tower.values]
        old = store.read_consolidated(
            tables[level],
            [*keys, "_b"],
            parents.withColumnRenamed("_p", "_b"),
            store.old,
            fresh,
        ).withColumn(DIFF, -_c(DIFF))
        change = fresh.select(*[_c(c) for c in cols], DIFF).unionByName(
            old.select(*[_c(c) for c in cols], DIFF)
        )
        delta = materialize(
            consolidate(change.withColumn(TIME, F.lit(store.new).cast("bigint")), cols)
        )
        written = store.write(tables[level], delta)
    return delta


def _minmax_combine(
    funcs: Sequence[str], arg: str
) -> Callable[[DataFrame, list[str], bool], DataFrame]:
    def combine(children: DataFrame, group: list[str], leaf: bool) -> DataFrame:
        aggs = []
        for f in funcs:
            src = _c(arg) if leaf else _c(f"_{f}")
            aggs.append((F.min(src) if f == "min" else F.max(src)).alias(f"_{f}"))
        return (
            children.groupBy(*[_c(g) for g in group])
            .agg(*aggs)
            .withColumn(DIFF, F.lit(1).cast("bigint"))
        )

    return combine


def _order_columns(order: Sequence[tuple[str, bool, bool]], rest: Sequence[str]) -> list[Column]:
    """ORDER BY columns, then the remaining columns ascending (a total, deterministic order)."""
    out = []
    for c, desc, nulls_first in order:
        col = _c(c)
        if desc:
            out.append(col.desc_nulls_first() if nulls_first else col.desc_nulls_last())
        else:
            out.append(col.asc_nulls_first() if nulls_first else col.asc_nulls_last())
    named = {c for c, _, _ in order}
    out.extend(_c(c).asc_nulls_first() for c in rest if c not in named)
    return out


def _first_k(rows: DataFrame, group: list[str], order: list[Column], k: int) -> DataFrame:
    """Per group, the first ``k`` rows in ``order`` counting multiplicities (``_diff``, all
    positive), the last one's multiplicity cut to fit.

    They are among the first ``k`` distinct rows, which Spark keeps per task before the shuffle
    (a partial window group limit; without groups, a take-ordered), so after the shuffle it
    sorts at most ``k`` rows per group and task, whatever the input's size.
    """
    w = Window.partitionBy(*[_c(g) for g in group]).orderBy(*order)
    rows = rows.withColumn("_rn", F.row_number().over(w)).where(_c("_rn") <= k).drop("_rn")
    before = F.sum(_c(DIFF)).over(w.rowsBetween(Window.unboundedPreceding, -1))
    ranked = rows.withColumn("_before", F.coalesce(before, F.lit(0)))
    kept = ranked.where(_c("_before") < k)
    return kept.withColumn(DIFF, F.least(_c(DIFF), F.lit(k) - _c("_before")).cast("bigint")).drop(
        "_before"
    )


def _buffered(
    node: TopK, branch: Branch, delta: DataFrame, store: StateStore, order: list[Column]
) -> tuple[DataFrame, DataFrame]:
    """A buffered TopK (see :mod:`ivm.plan.reduce`): the touched groups' buffers at ``old``
    and at ``new``, ``(group keys..., columns..., _diff)``; writes the count and buffer tables.

    Invariant: a group's buffer is its first ``n`` rows for some ``n`` (all of them when the
    buffer holds the group's count). A change row ranked at or above the buffer's last row goes
    into it (a deletion takes its row out); one ranked below changes only the count. Either
    way the buffer is again a prefix of the group. A group left with fewer than ``k`` rows out
    of more is refilled from ``store.snapshot`` (:func:`_refilled`).
    """
    count_table, first_table = branch.tables
    keys = list(branch.state_keys)
    cols = list(dict.fromkeys([*keys, *node.input.columns]))
    kept = node.limit + node.offset + topk_spare(node)
    framed = delta if node.partition else _with_global_key(delta)
    change = framed.select(*[_c(c) for c in cols], DIFF)
    if store.old > 0:
        change = materialize(consolidate(change, cols, by_time=False))
    elif not scan_only(change):  # a build reads its input twice (counts and buffers)
        change = materialize(change)
    counts = consolidate(change, keys, by_time=False)
    if store.old == 0:
        first_old = change.limit(0)
        first_new = _first_k(change.where(_c(DIFF) > 0), keys, order, kept)
    else:
        first_old, first_new = _merged_buffers(node, branch, change, counts, store, order)
    first_new = materialize(first_new)
    stamp = F.lit(store.new).cast("bigint")
    store.write(count_table, counts.withColumn(TIME, stamp))
    buffer_change = consolidate(
        first_new.unionByName(first_old.withColumn(DIFF, -_c(DIFF))).withColumn(TIME, stamp),
        cols,
    )
    store.write(first_table, buffer_change)
    return first_old, first_new


_IN_GROUP = "_ivm_in_group"
""":func:`_sized`'s column (the engine's prefix: no view column has it)."""


def _sized(total: DataFrame, rows: DataFrame, keys: list[str]) -> DataFrame:
    """``total`` (a count per group) with :data:`_IN_GROUP`: the rows of ``rows`` in the
    group."""
    n = rows.groupBy(*[_c(c) for c in keys]).agg(F.sum(_c(DIFF)).alias(_IN_GROUP))
    joined = join_null_safe(total, n, keys, "left")
    return joined.withColumn(_IN_GROUP, F.coalesce(_c(_IN_GROUP), F.lit(0)))


def _merged_buffers(
    node: TopK,
    branch: Branch,
    change: DataFrame,
    counts: DataFrame,
    store: StateStore,
    order: list[Column],
) -> tuple[DataFrame, DataFrame]:
    """A refresh's touched groups' buffers at ``old`` (read) and at ``new`` (``change``,
    consolidated, merged into them under :func:`_buffered`'s invariant; short groups
    refilled); ``counts``: the change's count per group. Writes nothing."""
    count_table, first_table = branch.tables
    keys = list(branch.state_keys)
    cols = list(dict.fromkeys([*keys, *node.input.columns]))
    k = node.limit + node.offset
    touched = change.select(*[_c(c) for c in keys])
    first_old = materialize(store.read_consolidated(first_table, keys, touched, store.old, change))
    count_old = store.read_consolidated(count_table, keys, touched, store.old, counts)
    # Groups with rows ranked below their buffer (the others take every change row).
    below = _sized(count_old, first_old, keys).where(_c(DIFF) > _c(_IN_GROUP))
    below = below.select(*[_c(c) for c in keys], F.lit(True).alias("_partial"))
    # Buffer rows at or after each change row (a change row sorts before an equal one).
    w = (
        Window.partitionBy(*[_c(c) for c in keys])
        .orderBy(*order, _c("_buf"))
        .rowsBetween(Window.currentRow, Window.unboundedFollowing)
    )
    marked = (
        change.withColumn("_buf", F.lit(0))
        .unionByName(first_old.withColumn("_buf", F.lit(1)))
        .withColumn("_after", F.sum(_c("_buf")).over(w))
        .where(_c("_buf") == 0)
    )
    taken = join_null_safe(marked, below, keys, "left")
    taken = taken.where((_c("_after") > 0) | _c("_partial").isNull())
    merged = consolidate(
        first_old.unionByName(taken.select(*[_c(c) for c in cols], DIFF)), cols, by_time=False
    )
    merged = materialize(merged.where(_c(DIFF) > 0))
    count_new = consolidate(count_old.unionByName(counts), keys, by_time=False)
    short = _sized(count_new, merged, keys).where((_c(_IN_GROUP) < k) & (_c(DIFF) > _c(_IN_GROUP)))
    first_new = _first_k(merged, keys, order, k + topk_spare(node))
    short = short.select(*[_c(c) for c in keys])
    return first_old, _refilled(node, branch, short, first_new, store, order)


def _refilled(
    node: TopK,
    branch: Branch,
    short: DataFrame,
    first_new: DataFrame,
    store: StateStore,
    order: list[Column],
) -> DataFrame:
    """``first_new`` with the buffers of the ``short`` groups (their keys: fewer than ``k``
    rows buffered out of more) replaced by their first rows in the input evaluated from
    scratch (``store.snapshot``); as it is when no group is short."""
    keys = list(branch.state_keys)
    cols = list(dict.fromkeys([*keys, *node.input.columns]))
    refills = len(found := short.collect())
    if not refills:
        return first_new
    short = store.spark.createDataFrame(found, short.schema)
    if store.snapshot is None:
        raise InvariantViolation(f"TopK {node.label} needs its input to refill a group")
    k = node.limit + node.offset
    store.progress(
        f"TopK {node.label}: {refills} group(s) under {k} rows: refilled from the input "
        f"(if this repeats, raise the hint topk_spare above {topk_spare(node)})"
    )
    whole = store.snapshot(node.input)
    whole = whole if node.partition else _with_global_key(whole)
    whole = join_null_safe(whole.select(*[_c(c) for c in cols], DIFF), short, keys, "left_semi")
    whole = consolidate(whole, cols, by_time=False).where(_c(DIFF) > 0)
    kept = k + topk_spare(node)
    return join_null_safe(first_new, short, keys, "left_anti").unionByName(
        _first_k(whole, keys, order, kept)
    )


def _numbered_change(
    node: TopK,
    states: Sequence[tuple[DataFrame, int]],
    key: list[str],
    order: list[Column],
    stamp: Column,
) -> DataFrame:
    """The view's change from the first rows of the touched groups at old (sign -1) and at
    new (+1): rows ranked ``offset + 1 .. offset + limit``, numbered when the view asks."""
    k = node.limit + node.offset
    parts = []
    for state, sign in states:
        copies = state.where(_c(DIFF) > 0).withColumn(
            "_copy", F.explode(F.sequence(F.lit(1), _c(DIFF).cast("int")))
        )
        w = Window.partitionBy(*[_c(c) for c in key]).orderBy(*order, _c("_copy"))
        numbered = copies.withColumn("_rn", F.row_number().over(w)).where(
            (_c("_rn") > node.offset) & (_c("_rn") <= k)
        )
        cols = [_c(c) for c in node.input.columns]
        if node.rank is not None:
            cols.append(_c("_rn").cast("int").alias(node.rank))
        parts.append(
            numbered.select(*cols, stamp.alias(TIME), F.lit(sign).cast("bigint").alias(DIFF))
        )
    return consolidate(parts[0].unionByName(parts[1]), node.columns)


# -- the renderers -----------------------------------------------------------------------------


def render_reduce(node: Reduce, delta: DataFrame, store: StateStore) -> DataFrame:
    """The reduce's updates in ``(old, new]`` from its input's updates ``delta``."""
    keys = list(node.keys)
    global_row = not keys
    if global_row:
        delta = _with_global_key(delta)
        keys = [GLOBAL_KEY]
    delta = delta.where(_c(DIFF) != 0)
    schema = delta.schema
    grain = None if _exact_floats(node, schema) else presum_grain(node)
    presum = _presum(node, delta, grain) if grain is not None else None
    if presum is not None:
        delta = materialize(presum)
    elif not scan_only(delta):
        delta = materialize(delta)
    touched = delta.select(*[_c(k) for k in keys]).distinct()
    if global_row:
        touched = store.spark.range(1).select(F.lit(0).cast("int").alias(GLOBAL_KEY))
    touched = materialize(touched)
    results: list[tuple[DataFrame, DataFrame]] = []
    groups = _Groups(keys, touched, global_row)
    for branch in branches(node):
        results.append(_branch_values(node, branch, delta, groups, store, schema, grain))
    old, new = results[0]
    for o, n in results[1:]:  # collation: the branches' columns side by side, per group
        old = join_null_safe(old, o, keys, "inner")
        new = join_null_safe(new, n, keys, "inner")
    out_cols = (
        [_c(c) for c in node.columns] if not global_row else [_c(a.name) for a in node.aggregates]
    )
    stamp = F.lit(store.new).cast("bigint").alias(TIME)
    change = new.select(*out_cols, stamp, F.lit(1).cast("bigint").alias(DIFF)).unionByName(
        old.select(*out_cols, stamp, F.lit(-1).cast("bigint").alias(DIFF))
    )
    return consolidate(change, node.columns)


def _exact_floats(node: Reduce, schema: T.StructType) -> bool:
    """Whether a plain (not DISTINCT) aggregate of ``node`` keeps exact floating-point sums:
    their parts are summed per group from the input's rows, so the input is not presummed."""
    return any(
        a.kind == "accumulable"
        and not a.distinct
        and a.arg is not None
        and floatsum.is_exact(a.func, schema[a.arg].dataType)
        for a in node.aggregates
    )


def join_null_safe(left: DataFrame, right: DataFrame, keys: Sequence[str], how: str) -> DataFrame:
    """Join on ``keys`` with NULL equal to NULL (grouping semantics); ``left``'s keys kept.

    The right side's keys are renamed first, so the two sides may derive from one frame.
    """
    renamed = right.select(*[_c(c).alias(f"_r_{c}") if c in keys else _c(c) for c in right.columns])
    cond = fold(lambda a, b: a & b, [_c(k).eqNullSafe(_c(f"_r_{k}")) for k in keys])
    return left.join(renamed, on=cond, how=how).drop(*[f"_r_{k}" for k in keys])


def _presum(node: Reduce, delta: DataFrame, grain: Sequence[str]) -> DataFrame:
    """The input summed at ``grain`` (:func:`ivm.plan.reduce.presum_grain`).

    Per grain it holds ``_diff`` summed and the plain accumulable branch's state sums. Rows
    whose ``_diff`` and sums are all zero are dropped (they change nothing); a row with a
    zero ``_diff`` but non-zero sums is kept (an update of a summed column). A build then
    keeps one row per grain value instead of the input (a join, say) under them.
    """
    plain = [b for b in branches(node) if b.kind == "accumulable" and not b.distinct]
    accs = [_accumulator(b.aggregates, delta.schema) for b in plain]
    sums = [
        F.sum(c).alias(n)
        for acc in accs
        for c, n in zip(acc.contributions, acc.state_columns, strict=True)
    ]
    out = delta.groupBy(*[_c(c) for c in grain]).agg(
        F.sum(_c(DIFF)).cast("bigint").alias(DIFF), *sums
    )
    names = [DIFF, *[n for acc in accs for n in acc.state_columns]]
    return out.where(fold(lambda a, b: a | b, [_c(n) != 0 for n in names]))


def _branch_values(
    node: Reduce,
    branch: Branch,
    delta: DataFrame,
    groups: _Groups,
    store: StateStore,
    schema: T.StructType,
    grain: Sequence[str] | None,
) -> tuple[DataFrame, DataFrame]:
    """One branch: write its state change, return its results at old and new for the
    touched groups. ``schema`` is the input's; ``grain``: ``delta`` is :func:`_presum`'s,
    one row per value of these columns (a plain accumulable branch sums its sums; the others
    read rows whose ``_diff`` is not zero), or None: ``delta`` is the input itself."""
    keys = groups.keys
    presummed = grain is not None
    if presummed and not (branch.kind == "accumulable" and not branch.distinct):
        delta = delta.where(_c(DIFF) != 0)
    if branch.distinct:
        unique = presummed and set(grain or ()) == {*keys, branch.value or ""}
        delta = _distinct_change(branch, delta, keys, store, unique)
    if branch.kind == "accumulable":
        acc = _accumulator(branch.aggregates, schema)
        table = branch.tables[-1]
        sums = _group_sums(acc, delta, keys, presummed and not branch.distinct)
        floats = branch.float_table
        if acc.float_terms:
            if floats is None:  # pragma: no cover - the planner gives SUMMED branches one
                raise InvariantViolation(f"{branch.name}: no table for its floating-point sums")
            stamp = F.lit(store.new).cast("bigint")
            store.write(floats, _float_sums(acc, delta, keys).withColumn(TIME, stamp))
            store.write(table, sums.withColumn(TIME, stamp))
            return _accumulated_values(store, table, acc, groups, floats)
        if not groups.global_row:
            held = accumulate_on_driver(store, table, sums, keys, acc.state_columns, groups.held)
            if held is not None:
                return _results(acc, keys, held[0]), _results(acc, keys, held[1])
        store.write(table, sums.withColumn(TIME, F.lit(store.new).cast("bigint")))
        return _accumulated_values(store, table, acc, groups)
    if branch.kind == "basic":
        return _basic_values(branch, delta, groups, store)
    return _minmax_values(node, branch, delta, groups, store, grain)


def _distinct_change(
    branch: Branch, delta: DataFrame, keys: list[str], store: StateStore, unique: bool
) -> DataFrame:
    """Write the ``(group, value)`` counts; return the change of the distinct set
    (``+1`` when a value's count rises from zero, ``-1`` when it falls to zero). A basic
    branch reads the counts themselves, so for it only the counts are written.

    ``unique``: ``delta`` is already one row per ``(group, value)`` with a non-zero
    ``_diff`` (the input presummed at exactly that grain, and kept): it is the counts'
    change as it stands, with no second summing pass and no second copy (BENCHMARKS.md,
    "Policy thresholds: reductions")."""
    value = branch.value or ""
    table = branch.tables[0]
    cols = [*keys, value]
    stamped = delta.select(*[_c(c) for c in cols], DIFF).withColumn(
        TIME, F.lit(store.new).cast("bigint")
    )
    change = stamped if unique else consolidate(stamped, cols)
    if branch.kind == "basic":
        store.write(table, change)
        return change
    flips = distinct_on_driver(store, table, change, cols)
    if flips is not None:
        return flips
    if not unique:
        change = materialize(change)
    if store.old == 0:
        # A build: no count was above zero before, so every value with a positive count is
        # new and nothing crosses down: no lookup, no join, no second copy. The counts are
        # one row per (group, value), so with their size the write is spread over the
        # cores (BENCHMARKS.md, "Policy thresholds: reductions").
        store.write(table, change, rows_hint=change.count())
        return change.where(_c(DIFF) > 0).select(
            *[_c(c) for c in cols], F.lit(1).cast("bigint").alias(DIFF)
        )
    old = store.read_consolidated(
        table, cols, change.select(*[_c(c) for c in cols]), store.old, change
    ).withColumnRenamed(DIFF, "_c_old")
    store.write(table, change)
    joined = join_null_safe(change, old, cols, "left").select(
        *[_c(c) for c in cols],
        F.coalesce(_c("_c_old"), F.lit(0)).alias("_c_old"),
        (F.coalesce(_c("_c_old"), F.lit(0)) + _c(DIFF)).alias("_c_new"),
    )
    flip = F.when(_c("_c_new") > 0, 1).otherwise(0) - F.when(_c("_c_old") > 0, 1).otherwise(0)
    return materialize(
        joined.select(*[_c(c) for c in cols], flip.cast("bigint").alias(DIFF)).where(_c(DIFF) != 0)
    )


def _check_append_only(label: str, delta: DataFrame) -> None:
    if not _empty(delta.where(_c(DIFF) < 0)):
        raise InvariantViolation(
            f"{label}: an input declared append-only (delta.appendOnly) delivered deletions; "
            "rebuild the view with `ivm refresh --rebuild`"
        )


def _minmax_values(
    node: Reduce,
    branch: Branch,
    delta: DataFrame,
    groups: _Groups,
    store: StateStore,
    grain: Sequence[str] | None,
) -> tuple[DataFrame, DataFrame]:
    """MIN/MAX of one column: a tower (or, for a monotonic input, the old result combined
    with the insertions); the results are the top level's rows. ``grain``: as for
    :func:`_branch_values`."""
    keys, touched, global_row = groups.keys, groups.touched, groups.global_row
    funcs = list(dict.fromkeys(a.func for a in branch.aggregates))
    arg = branch.value or ""
    values = [f"_{f}" for f in funcs]
    top = branch.tables[-1]
    if branch.levels == 0:
        _check_append_only(node.label, delta)
        groups = delta.select(*[_c(k) for k in keys])
        inserted = delta.select(*[_c(k) for k in keys], *[_c(arg).alias(v) for v in values], DIFF)
        old_top = store.read_consolidated(top, keys, groups, store.old, inserted)
        combined = inserted.drop(DIFF).unionByName(
            old_top.select(*[_c(k) for k in keys], *[_c(v) for v in values])
        )
        fresh = _minmax_combine(funcs, "")(combined, keys, False)
        cols = [*keys, *values]
        change = fresh.select(*[_c(c) for c in cols], DIFF).unionByName(
            old_top.select(*[_c(c) for c in cols], (-_c(DIFF)).alias(DIFF))
        )
        store.write(
            top, consolidate(change.withColumn(TIME, F.lit(store.new).cast("bigint")), cols)
        )
        read_key, probe, group_cols = keys, touched, keys
    else:
        tkeys = [k for k in keys if k != GLOBAL_KEY]
        tower = _Tower(tuple(tkeys), tuple(values), (arg,), _minmax_combine(funcs, arg))
        unique = grain is not None and set(grain) - {GLOBAL_KEY} == {*tkeys, arg}
        level0 = delta.select(*[_c(k) for k in tkeys], _c(arg), DIFF)
        leaf = _with_buckets(level0, [arg], branch.levels)
        if not climb_on_driver(store, branch, tkeys, arg, funcs, leaf):
            levels = partial(
                built_levels,
                keys=tkeys,
                arg=arg,
                funcs=funcs,
                levels=branch.levels,
                time=store.new,
            )
            _climb(store, branch, tower, level0, unique, levels)
        read_key, group_cols = [*tkeys, "_b"], tkeys
        probe = (
            touched.select(*[_c(k) for k in tkeys]) if tkeys else store.spark.range(1).select()
        ).withColumn("_b", F.lit(0).cast("bigint"))
    rows = store.read(top, read_key, probe, store.new)
    out = []
    for at in (store.old, store.new):
        state = consolidate(
            rows.where(_c(TIME) <= at), [*group_cols, *values], by_time=False
        ).where(_c(DIFF) > 0)
        if global_row:
            if GLOBAL_KEY not in group_cols:
                state = state.withColumn(GLOBAL_KEY, F.lit(0).cast("int"))
            state = touched.join(state, on=keys, how="left")
            if at == 0:
                state = state.where(F.lit(False))
        out.append(
            state.select(
                *[_c(k) for k in keys],
                *[_c(f"_{a.func}").alias(a.name) for a in branch.aggregates],
            )
        )
    return out[0], out[1]


def _basic_values(
    branch: Branch, delta: DataFrame, groups: _Groups, store: StateStore
) -> tuple[DataFrame, DataFrame]:
    """Recompute the touched groups from the branch's input arrangement (or distinct set)."""
    keys, touched, global_row = groups.keys, groups.touched, groups.global_row
    args = list(dict.fromkeys(c for a in branch.aggregates for c in sorted(a.reads)))
    table = branch.tables[0]
    cols = [*keys, *[a for a in args if a not in keys]]
    if not branch.distinct:
        store.write(
            table,
            consolidate(
                delta.select(*[_c(c) for c in cols], DIFF).withColumn(
                    TIME, F.lit(store.new).cast("bigint")
                ),
                cols,
            ),
        )
    rows = store.read(table, keys, touched, store.new)
    data_cols = [c for c in rows.columns if c not in (TIME, DIFF)]
    out = []
    for at in (store.old, store.new):
        state = consolidate(rows.where(_c(TIME) <= at), data_cols, by_time=False)
        result = basic_aggregated(branch, keys, state)
        if global_row:
            result = touched.join(result, on=keys, how="left")
            if at == 0:
                result = result.where(F.lit(False))
        out.append(result)
    return out[0], out[1]


def basic_aggregated(branch: Branch, keys: Sequence[str], state: DataFrame) -> DataFrame:
    """A basic branch's aggregates per group ``(keys..., aggregates...)`` over ``state``, its
    table's rows at a time summed per row ``(columns..., _diff)``: one row per copy, so the
    aggregates see the multiset (a DISTINCT's counts: each value once). Both renderers
    evaluate them here."""
    held = state.where(_c(DIFF) > 0)
    if branch.distinct:
        held = held.withColumn(DIFF, F.lit(1).cast("bigint"))
    copies = held.withColumn("_copy", F.explode(F.sequence(F.lit(1), _c(DIFF).cast("int"))))
    aggs = [F.expr(_basic_sql(a)).alias(a.name) for a in branch.aggregates]
    return copies.groupBy(*[_c(k) for k in keys]).agg(*aggs)


def _basic_sql(a: Aggregate) -> str:
    def order(default: str) -> str:
        items = a.order or ((default, False, True),)
        return ", ".join(
            f"`{c}` {'DESC' if d else 'ASC'} NULLS {'FIRST' if nf else 'LAST'}"
            for c, d, nf in items
        )

    if a.func == "string_agg":
        sep = str(a.params[0]).replace("'", "''")
        return f"listagg(`{a.arg}`, '{sep}') WITHIN GROUP (ORDER BY {order(a.arg or '')})"
    if a.func in ("percentile_cont", "percentile_disc"):
        return f"{a.func}({a.params[0]}) WITHIN GROUP (ORDER BY {order(a.arg or '')})"
    raise InvariantViolation(f"{a.func} is not a basic aggregate")


def render_setop(node: SetOp, left: DataFrame, right: DataFrame, store: StateStore) -> DataFrame:
    """``left INTERSECT|EXCEPT [ALL] right`` from the inputs' updates (per-row counts)."""
    cols = list(node.columns)
    branch = branches(node)[0]
    table = branch.tables[0]
    renamed = right.select(
        *[_c(r).alias(c) for r, c in zip(right.columns[: len(cols)], cols, strict=True)], DIFF
    )
    tagged = left.select(
        *[_c(c) for c in cols],
        _c(DIFF).cast("bigint").alias("_ca"),
        F.lit(0).cast("bigint").alias("_cb"),
    ).unionByName(
        renamed.select(
            *[_c(c) for c in cols],
            F.lit(0).cast("bigint").alias("_ca"),
            _c(DIFF).cast("bigint").alias("_cb"),
        )
    )
    sums = materialize(
        tagged.groupBy(*[_c(c) for c in cols])
        .agg(F.sum("_ca").alias("_ca"), F.sum("_cb").alias("_cb"))
        .where((_c("_ca") != 0) | (_c("_cb") != 0))
        .withColumn(TIME, F.lit(store.new).cast("bigint"))
    )
    store.write(table, sums)
    rows = store.read(table, cols, sums.select(*[_c(c) for c in cols]), store.new)
    state = rows.groupBy(*[_c(c) for c in cols]).agg(
        F.sum("_ca").alias("a1"),
        F.sum("_cb").alias("b1"),
        F.sum(F.when(_c(TIME) <= store.old, _c("_ca")).otherwise(0)).alias("a0"),
        F.sum(F.when(_c(TIME) <= store.old, _c("_cb")).otherwise(0)).alias("b0"),
    )

    def multiplicity(a: Column, b: Column) -> Column:
        if node.op == "intersect":
            return F.least(a, b) if node.all else F.when((a > 0) & (b > 0), 1).otherwise(0)
        return (
            F.greatest(a - b, F.lit(0)) if node.all else F.when((a > 0) & (b <= 0), 1).otherwise(0)
        )

    diff = multiplicity(_c("a1"), _c("b1")) - multiplicity(_c("a0"), _c("b0"))
    return state.select(
        *[_c(c) for c in cols],
        F.lit(store.new).cast("bigint").alias(TIME),
        diff.cast("bigint").alias(DIFF),
    ).where(_c(DIFF) != 0)


def render_topk(node: TopK, delta: DataFrame, store: StateStore) -> DataFrame:
    """The first ``limit`` rows per partition (after ``offset``) from the input's updates."""
    branch = branches(node)[0]
    keys = list(node.partition)
    data = list(node.input.columns)
    rest = [c for c in data if c not in keys]
    k = node.limit + node.offset
    order = _order_columns(node.order, data)
    delta = delta.select(*[_c(c) for c in data], DIFF).where(_c(DIFF) != 0)
    top = branch.tables[-1]
    stamp = F.lit(store.new).cast("bigint")
    if branch.kind == "buffer":  # it keeps a copy of its consolidated change itself
        done, delta = refresh_on_driver(node, branch, delta, store)
        if done is not None:
            return done
        old_first, new_first = _buffered(node, branch, delta, store, order)
        states = [(old_first, -1), (new_first, 1)]
        return _numbered_change(node, states, list(branch.state_keys), order, stamp)
    delta = materialize(delta)
    if branch.levels == 0:  # monotonic: the old first k and the insertions
        _check_append_only(node.label, delta)
        tkeys = keys or [GLOBAL_KEY]
        frame = delta if keys else _with_global_key(delta)
        cols = list(dict.fromkeys([*tkeys, *data]))
        old_top = store.read_consolidated(
            top,
            tkeys,
            frame.select(*[_c(c) for c in tkeys]),
            store.old,
            frame.select(*[_c(c) for c in cols], DIFF),
        )
        both = consolidate(
            frame.select(*[_c(c) for c in cols], DIFF).unionByName(
                old_top.select(*[_c(c) for c in cols], DIFF)
            ),
            cols,
            by_time=False,
        )
        fresh = _first_k(both, tkeys, order, k)
        change = materialize(
            consolidate(
                fresh.select(*[_c(c) for c in cols], DIFF)
                .unionByName(old_top.select(*[_c(c) for c in cols], (-_c(DIFF)).alias(DIFF)))
                .withColumn(TIME, stamp),
                cols,
            )
        )
        store.write(top, change)
        read_key = tkeys
    else:

        def combine(children: DataFrame, group: list[str], leaf: bool) -> DataFrame:
            return _first_k(children, group, order, k)

        tower = _Tower(tuple(keys), tuple(rest), tuple(rest), combine)
        change = _climb(store, branch, tower, delta, unique=False)
        read_key = [*keys, "_b"]
    if node.rank is None and node.offset == 0:
        return change.select(*[_c(c) for c in data], stamp.alias(TIME), DIFF)
    # Ranks: number the touched partitions' first k rows at old and at new.
    groups = change.select(*[_c(c) for c in read_key])
    rows = store.read(top, read_key, groups, store.new)
    state_cols = [c for c in rows.columns if c not in (TIME, DIFF)]
    states = [
        (consolidate(rows.where(_c(TIME) <= at), state_cols, by_time=False), sign)
        for at, sign in ((store.old, -1), (store.new, 1))
    ]
    return _numbered_change(node, states, read_key, order, stamp)


_FLOAT_SUMMED = (sqlexp.Sum, sqlexp.Avg, sqlexp.Stddev, sqlexp.StddevSamp, sqlexp.StddevPop)
_FLOAT_SUMMED += (sqlexp.Variance, sqlexp.VariancePop)


def render_window(node: WindowNode, delta: DataFrame, store: StateStore) -> DataFrame:
    """Window functions from the input's updates: the touched partitions' rows with their
    calls' values at ``old`` (``-1``) and at ``new`` (``+1``), consolidated, so rows whose
    values did not change cancel out. The partitions are read from the state table (the
    input's rows by partition key), which takes the change first."""
    (branch,) = branches(node)
    (table,) = branch.tables
    keys = list(node.keys) or [GLOBAL_KEY]
    data = list(node.input.columns)
    cols = list(dict.fromkeys([*keys, *data]))
    stamp = F.lit(store.new).cast("bigint")
    frame = delta if node.keys else _with_global_key(delta)
    change = consolidate(frame.select(*[_c(c) for c in cols], DIFF).withColumn(TIME, stamp), cols)
    change = materialize(change)
    store.write(table, change)
    rows = store.read(table, keys, change.select(*[_c(k) for k in keys]).distinct(), store.new)
    states = [
        (consolidate(rows.where(_c(TIME) <= at), cols, by_time=False), sign)
        for at, sign in ((store.old, -1), (store.new, 1))
    ]
    both = window_values(node, states).withColumn(TIME, stamp)
    return consolidate(both, list(node.columns)).select(*[_c(c) for c in node.columns], TIME, DIFF)


def window_values(node: WindowNode, states: Sequence[tuple[DataFrame, int]]) -> DataFrame:
    """The Window's rows ``(columns..., _diff)`` over each of ``states``, its input's rows of
    the touched partitions ``(columns..., _diff)`` at a time, with that time's sign as their
    diff: Spark's window functions over the multiset (one row per copy), the calls as
    :meth:`~ivm.plan.ir.WindowCall.sql` writes them. Both renderers evaluate them here, so a
    partition's values at old are the ones its rows were given then."""
    data = list(node.input.columns)
    calls = [F.expr(spark_sql(w.sql(tuple(data)))).alias(w.name) for w in node.calls]
    results = []
    for state, sign in states:
        held = state.where(_c(DIFF) > 0)
        check_float_order(node, held)
        copies = held.withColumn("_copy", F.explode(F.sequence(F.lit(1), _c(DIFF).cast("int"))))
        results.append(
            copies.select(*[_c(c) for c in data], *calls, F.lit(sign).cast("bigint").alias(DIFF))
        )
    return fold(DataFrame.unionByName, results)


def check_float_order(node: WindowNode, rows: DataFrame) -> None:
    """Refuse a floating-point sum over a RANGE frame with ORDER BY: rows tied in ORDER BY
    are added in an order Spark does not fix, so its value could differ between the old
    result recomputed and the one the view holds."""
    for w in node.calls:
        f = window_function(w.over)
        if w.ordered or not isinstance(f, _FLOAT_SUMMED):
            continue
        dt = rows.select(F.expr(spark_sql(f.this))).schema[0].dataType
        if isinstance(dt, (T.FloatType, T.DoubleType)):
            raise UnsupportedSqlError(
                f"{f.sql_name()} of a floating-point value over a RANGE frame "
                f"({w.over.sql(dialect='spark')}): rows tied in ORDER BY would be added in an "
                "order Spark does not fix; write ROWS BETWEEN ... or cast it to DECIMAL",
                construct="floating-point window sum over a RANGE frame",
            )


def render_stateful(
    node: Reduce | SetOp | TopK | WindowNode, children: list[DataFrame], store: StateStore
):
    """Dispatch a stateful node to its renderer (``children``: its inputs' updates)."""
    if isinstance(node, WindowNode):
        return render_window(node, children[0], store)
    if isinstance(node, Reduce):
        return render_reduce(node, children[0], store)
    if isinstance(node, SetOp):
        return render_setop(node, children[0], children[1], store)
    return render_topk(node, children[0], store)
