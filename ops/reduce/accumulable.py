"""The accumulable aggregates' arithmetic, written once for every renderer of an accumulable
branch: Spark's (:mod:`ops.reduce.spark`), the driver's epoch inside Spark's path
(:mod:`ops.reduce.accumulate`) and the driver's renderer of a small change
(:mod:`ops.reduce.driver`).

Owns:

- the state a branch keeps per group (:func:`layout`): ``_rows``; per argument ``x`` its
  non-NULL count ``_nn_x``; then, by aggregate, NaN and infinity counts (``_nan_x``,
  ``_pinf_x``, ``_ninf_x``) beside exact floating-point terms (:mod:`ops.reduce.floatsum`), a sum
  ``_sum_x``, or a TRUE count ``_true_x``. Names and order are the state tables' columns,
  whichever renderer writes them;
- the types: a sum's state (:func:`sum_type`: DECIMAL(38, s), integers as DECIMAL(38, 0)) and
  each aggregate's result (:func:`result_type`, Spark's: SUM of DECIMAL(p, s) is
  DECIMAL(p + 10, s), AVG's DECIMAL(p + 4, s + 4), at most 38 digits each);
- exact sums of state rows per group (:func:`summed`, :func:`plus`; NULL keys form one group,
  as in GROUP BY; a NULL state value adds 0), the groups that exist (:func:`existing`), the
  decimal context they are summed in (:data:`EXACT`: a step that would round raises), and a
  DISTINCT's ``(group, value)`` counts crossing zero (:func:`crossings`);
- a group's results from its state (:func:`values`), as Spark computes them: NULL with no
  non-NULL value; SUM of a decimal rounded half up to its type, of integers a BIGINT; AVG of a
  decimal as Spark's ``Average`` divides (:func:`decimal_average`: the quotient truncated to
  39 places, then rounded half up to the result's scale), of integers a double quotient;
  BOOL_AND/BOOL_OR from the TRUE count. A value past its type is Spark's (it raises under ANSI
  mode, or returns NULL): the driver declines it (:class:`~ivm.errors.NotOnDriver`).

Spark's renderer writes the same rules as column expressions; for AVG of a decimal it divides
in SQL where a decimal division of Spark's rounds to exactly the result's scale
(:func:`sql_average_numerator`), and otherwise runs :func:`decimal_averages` in Spark's Python
workers (this module and :mod:`ops.decimals` are pickled by value: what they run needs only
the standard library and pyarrow). Decimal rounding is :mod:`ops.decimals`'.

Contract in ``(data, time, diff)`` terms: an update ``(row, t, d)`` adds ``d`` times the row's
contribution to each state column of its group (1 to ``_rows``; 1 to ``_nn_x`` when ``x`` is
not NULL; ``x`` to ``_sum_x``; 1 to ``_true_x`` when ``x`` is TRUE; 1 to a NaN or infinity
count); the state at ``t`` is the exact sum of the contributions up to ``t``, in any order and
grouping (linear in ``d``, so a retraction subtracts what its insertion added); a group exists
at ``t`` while its ``_rows`` is positive, and its results are a function of its state at
``t`` alone.
"""

from __future__ import annotations

import decimal
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from typing import Any

import pyarrow as pa
from pyspark.sql import types as T

from ivm.errors import NotOnDriver, UnsupportedSqlError
from ivm.plan.ir import Aggregate
from ivm.plan.reduce import SUMMED
from ops.decimals import quotient, to_scale
from ops.reduce import floatsum

Group = tuple[Any, ...]
"""A group's key values, in the branch's key order (NULL is a value like any other)."""

EXACT = decimal.Context(
    prec=200,
    rounding=decimal.ROUND_HALF_UP,
    traps=[decimal.Inexact, decimal.Overflow, decimal.InvalidOperation, decimal.DivisionByZero],
)
"""Decimal sums and scalings in as many digits as they need (Python's default context keeps
28): a state sum of DECIMAL(38, s) values never reaches 200 digits, and a step that would
round or overflow raises instead."""

COUNT_DIGITS = 20
"""A count as a decimal (``DecimalType.LongDecimal``, DECIMAL(20, 0)), as ``Average`` divides."""

ACCUMULATED = frozenset({"count", "bool_and", "bool_or", *SUMMED})
"""The aggregates an accumulable branch computes from its state."""

INTEGRAL = (T.ByteType, T.ShortType, T.IntegerType, T.LongType)

FLOAT_COUNTS = ("nan", "pinf", "ninf")
"""The counts kept beside an argument's exact floating-point sums (how Spark combines NaN and
infinities: :func:`ops.reduce.floatsum.exact_result`)."""


@dataclass(frozen=True, slots=True)
class StateColumn:
    """One state column: its name, what it counts or sums (``rows``, ``nn``, ``nan``,
    ``pinf``, ``ninf``, ``sum``, ``true``) and of which argument (None for ``rows``)."""

    name: str
    kind: str
    arg: str | None


@dataclass(frozen=True)
class Layout:
    """An accumulable branch's state: its columns in order, and the exact floating-point terms
    it keeps in its ``float_sums`` table, ``(argument, squared)`` in the order they were
    first needed."""

    aggregates: tuple[Aggregate, ...]
    types: Mapping[str, T.DataType]
    columns: tuple[StateColumn, ...]
    float_terms: tuple[tuple[str, bool], ...]

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def float_args(self) -> list[str]:
        """The arguments kept as exact floating-point sums; a ``float_sums`` row's ``_t`` is
        the position of its argument here."""
        return [arg for arg, squared in self.float_terms if not squared]

    @property
    def squared(self) -> frozenset[str]:
        """The arguments whose squares are summed too (VARIANCE, STDDEV)."""
        return frozenset(arg for arg, squared in self.float_terms if squared)

    def exact_float(self, a: Aggregate) -> bool:
        """Whether ``a`` is computed from exact floating-point sums (:mod:`ops.reduce.floatsum`)."""
        return a.arg is not None and floatsum.is_exact(a.func, self.types[a.arg])

    def float_counts(self, arg: str) -> tuple[str, str, str, str]:
        """The non-NULL, NaN, +infinity and -infinity count columns of ``arg``."""
        nan, pinf, ninf = (f"_{kind}_{arg}" for kind in FLOAT_COUNTS)
        return f"_nn_{arg}", nan, pinf, ninf


def layout(aggregates: Sequence[Aggregate], types: Mapping[str, T.DataType]) -> Layout:
    """The state columns of an accumulable branch computing ``aggregates`` over arguments of
    Spark types ``types`` (see the module doc). It describes; each renderer refuses what it
    does not compute (a SUM over text, a function that is not accumulable)."""
    columns = [StateColumn("_rows", "rows", None)]
    terms: dict[tuple[str, bool], None] = {}

    def add(kind: str, arg: str) -> None:
        name = f"_{kind}_{arg}"
        if all(c.name != name for c in columns):
            columns.append(StateColumn(name, kind, arg))

    for a in aggregates:
        if a.arg is None:
            continue
        add("nn", a.arg)
        if floatsum.is_exact(a.func, types[a.arg]):
            for kind in FLOAT_COUNTS:
                add(kind, a.arg)
            terms.setdefault((a.arg, False))
            if a.func not in ("sum", "avg"):
                terms.setdefault((a.arg, True))
        elif a.func in SUMMED:
            add("sum", a.arg)
        elif a.func in ("bool_and", "bool_or"):
            add("true", a.arg)
    return Layout(tuple(aggregates), dict(types), tuple(columns), tuple(terms))


# -- types ----------------------------------------------------------------------------------


def sum_type(t: T.DataType, what: str) -> T.DataType:
    """The type a sum of values of type ``t`` is kept in: DECIMAL(38, s) for a decimal (and
    DECIMAL(38, 0) for integers), exact; a double for floating point. ``what`` names the
    aggregate in the error for any other type."""
    if isinstance(t, T.DecimalType):
        return T.DecimalType(38, t.scale)
    if isinstance(t, INTEGRAL):
        return T.DecimalType(38, 0)
    if isinstance(t, (T.FloatType, T.DoubleType)):
        return T.DoubleType()
    raise UnsupportedSqlError(f"{what} over a column of type {t.simpleString()}", construct=what)


def summed_decimal(t: T.DecimalType) -> T.DecimalType:
    """Spark's SUM of a DECIMAL(p, s): DECIMAL(p + 10, s), at most 38 digits (also the sum
    ``Average`` divides)."""
    return T.DecimalType(min(38, t.precision + 10), t.scale)


def average_decimal(t: T.DecimalType) -> T.DecimalType:
    """Spark's AVG of a DECIMAL(p, s): DECIMAL(p + 4, s + 4), at most 38 digits."""
    return T.DecimalType(min(38, t.precision + 4), min(38, t.scale + 4))


def result_type(a: Aggregate, types: Mapping[str, T.DataType]) -> T.DataType:
    """The Spark type of an accumulable aggregate's result."""
    if a.func == "count":
        return T.LongType()
    if a.func in ("bool_and", "bool_or"):
        return T.BooleanType()
    t = types[a.arg or ""]
    if floatsum.is_exact(a.func, t):
        return T.DoubleType()
    if isinstance(t, T.DecimalType):
        return summed_decimal(t) if a.func == "sum" else average_decimal(t)
    return T.LongType() if a.func == "sum" else T.DoubleType()


def divide_type(p1: int, s1: int, p2: int, s2: int) -> tuple[int, int]:
    """The type Spark gives ``DECIMAL(p1, s1) / DECIMAL(p2, s2)`` (precision loss allowed,
    the default): ``DecimalPrecision``'s rule, then ``DecimalType.adjustPrecisionScale``."""
    scale = max(6, s1 + p2 + 1)
    precision = p1 - s1 + s2 + scale
    if precision <= 38:
        return precision, scale
    int_digits = precision - scale
    return 38, max(38 - int_digits, min(scale, 6))


def sql_average_numerator(t: T.DecimalType) -> T.DecimalType | None:
    """The type to cast an AVG's sum to so that Spark's ``sum / CAST(count AS DECIMAL(20,
    0))`` is exactly ``Average``'s quotient: a division whose result type has the result's
    scale (Spark rounds its 39-place quotient once, to that scale, as ``Average`` does) and
    room for every sum of its type. None where no such division exists (a scale under 6, or
    sums of more integer digits than the result's scale leaves): Spark's path then divides
    with :func:`decimal_averages`."""
    summed, result = summed_decimal(t), average_decimal(t)
    int_digits = 38 - result.scale
    if int_digits < summed.precision - summed.scale:
        return None
    numerator = T.DecimalType(int_digits + t.scale, t.scale)
    _, scale = divide_type(numerator.precision, numerator.scale, COUNT_DIGITS, 0)
    return numerator if scale == result.scale else None


# -- exact sums of state rows -------------------------------------------------------------


def _added(into: dict[Group, list[Any]], pairs: Iterable[tuple[Group, Sequence[Any]]]) -> None:
    with decimal.localcontext(EXACT):
        for group, values in pairs:
            sums = into.setdefault(group, [0] * len(values))
            for i, v in enumerate(values):
                sums[i] += v or 0


def summed(
    rows: Iterable[Mapping[str, Any]],
    keys: Sequence[str],
    names: Sequence[str],
    start: Mapping[Group, Sequence[Any]] | None = None,
) -> dict[Group, list[Any]]:
    """Per group of ``keys`` (NULL keys equal, as grouping), ``start``'s sums (not changed)
    plus the exact sums of ``rows``' columns ``names``, a NULL adding 0.

    >>> summed([{"k": None, "n": 1}, {"k": None, "n": 2}], ["k"], ["n"])
    {(None,): [3]}
    """
    out = {g: list(v) for g, v in (start or {}).items()}
    _added(out, ((tuple(r[k] for k in keys), [r[n] for n in names]) for r in rows))
    return out


def plus(
    state: Mapping[Group, Sequence[Any]], change: Mapping[Group, Sequence[Any]]
) -> dict[Group, list[Any]]:
    """``state`` with ``change`` added, group by group, exactly (neither is changed)."""
    out = {g: list(v) for g, v in state.items()}
    _added(out, change.items())
    return out


def existing(state: Mapping[Group, Sequence[Any]], names: Sequence[str]) -> dict[Group, Any]:
    """The groups of ``state`` that exist: those with rows (``_rows`` among ``names``)."""
    at = list(names).index("_rows")
    return {g: v for g, v in state.items() if v[at] > 0}


def crossings(
    counts: Mapping[Group, int], change: Iterable[tuple[Group, int]]
) -> list[tuple[Group, int]]:
    """A DISTINCT's change: for each ``(row, n)`` of ``change`` (one per row) whose count
    crosses zero when ``n`` is added to its count in ``counts`` (absent: 0), ``(row, +1)``
    when it rises from zero, ``(row, -1)`` when it falls to zero.

    >>> crossings({("a",): 2, ("b",): 1}, [(("a",), -2), (("b",), 1), (("c",), 3)])
    [(('a',), -1), (('c',), 1)]
    """
    out = []
    for row, n in change:
        before = counts.get(row, 0)
        flip = int(before + n > 0) - int(before > 0)
        if flip:
            out.append((row, flip))
    return out


# -- results ------------------------------------------------------------------------------


def decimal_average(total: Decimal, n: int, scale: int) -> Decimal:
    """Spark's ``Average`` of a decimal group whose ``n`` (> 0) values sum to ``total``:
    ``total / n`` as a decimal division divides (:func:`ops.decimals.quotient`: truncated to
    39 places, then rounded half away from zero to ``scale``, as
    ``DecimalDivideWithOverflowCheck``); the precision is not checked here.

    >>> decimal_average(Decimal("1222222221222.222222221222222221"), 3, 22)
    Decimal('407407407074.0740740737407407403333')
    >>> decimal_average(Decimal("-0.05"), 2, 2)
    Decimal('-0.03')
    >>> decimal_average(Decimal("5E-38"), 11, 38)
    Decimal('0E-38')
    """
    places = max(-total.as_tuple().exponent, 0)
    units = int(total.scaleb(places, context=EXACT))
    return Decimal(quotient(units, places, n, 0, scale)).scaleb(-scale, context=EXACT)


def fit(v: Decimal, t: T.DecimalType) -> Decimal:
    """``v`` rounded half away from zero to ``t``'s scale (Spark's ``changePrecision``,
    :func:`ops.decimals.to_scale`); :class:`~ivm.errors.NotOnDriver` when it then has more
    digits than ``t`` holds (Spark raises under ANSI mode, or returns NULL: Spark's part)."""
    places = max(-v.as_tuple().exponent, 0)
    units = to_scale(int(v.scaleb(places, context=EXACT)), places, t.scale)
    q = Decimal(units).scaleb(-t.scale, context=EXACT)
    if q != 0 and q.adjusted() >= t.precision - t.scale:
        raise NotOnDriver(f"a value overflows {t.simpleString()}")
    return q


def values(layout: Layout, state: Sequence[Any], float_sums: Mapping | None = None) -> list[Any]:
    """The aggregates' results from a group's summed ``state`` (in ``layout``'s column
    order) and its exact floating-point sums ``{(argument, exponent): [v, qh, ql]}``: the
    values Spark's expressions give (:func:`ops.reduce.spark._results`)."""
    at = dict(zip(layout.names, state, strict=True))
    out = []
    for a in layout.aggregates:
        if a.arg is None:
            out.append(at["_rows"])
            continue
        nn = at[f"_nn_{a.arg}"]
        if a.func == "count":
            out.append(nn)
        elif layout.exact_float(a):
            out.append(_float_value(layout, a, at, float_sums or {}))
        elif nn <= 0:
            out.append(None)
        elif a.func == "bool_and":
            out.append(at[f"_true_{a.arg}"] == nn)
        elif a.func == "bool_or":
            out.append(at[f"_true_{a.arg}"] > 0)
        else:
            out.append(_summed_value(a, layout.types[a.arg], Decimal(at[f"_sum_{a.arg}"]), nn))
    return out


def _float_value(layout: Layout, a: Aggregate, at: Mapping[str, Any], sums: Mapping) -> Any:
    arg = a.arg or ""
    i = layout.float_args.index(arg)
    exact = floatsum.fixed((e, *v) for (j, e), v in sums.items() if j == i)
    counts = [int(at[c]) for c in layout.float_counts(arg)]
    return floatsum.exact_result(a.func, *counts, *exact)


def _summed_value(a: Aggregate, t: T.DataType, total: Decimal, nn: int) -> Any:
    """SUM or AVG of a group with ``nn`` (> 0) non-NULL values summing to ``total``."""
    if not isinstance(t, T.DecimalType):
        if a.func == "sum":
            if not -(2**63) <= total < 2**63:
                raise NotOnDriver("a SUM overflows bigint")
            return int(total)
        return float(total) / float(nn)
    total = fit(total, summed_decimal(t))
    if a.func == "sum":
        return total
    result = average_decimal(t)
    return fit(decimal_average(total, int(nn), result.scale), result)


def decimal_averages(
    batches: Iterable[pa.RecordBatch], specs: Sequence[tuple[str, str, int]], column: str
) -> Iterator[pa.RecordBatch]:
    """Spark's ``mapInArrow`` over a branch's per-group state: each batch gets ``column``,
    per row a list holding, for each spec ``(sum column, count column, scale)``,
    :func:`decimal_average` as text (NULL where the sum is NULL or the count not positive),
    which Spark casts to the result's type (raising, or NULL, past it, as ``Average``).
    Runs in Spark's Python workers: the standard library and pyarrow only."""
    for batch in batches:
        inputs = {c: batch.column(c).to_pylist() for spec in specs for c in spec[:2]}
        out = []
        for row in range(batch.num_rows):
            texts = []
            for total_col, count_col, scale in specs:
                total, n = inputs[total_col][row], inputs[count_col][row]
                ok = total is not None and n is not None and n > 0
                texts.append(format(decimal_average(total, n, scale), "f") if ok else None)
            out.append(texts)
        yield pa.RecordBatch.from_arrays(
            [*batch.columns, pa.array(out, pa.list_(pa.string()))],
            names=[*batch.schema.names, column],
        )
