"""A small change's stateless plan computed by the driver, in Arrow, exactly as Spark would.

Owns the evaluation of IR expressions (sqlglot, as :func:`ops.expressions.spark_sql` hands them
to Spark) over Arrow tables of updates, with Spark SQL's semantics, and the rendering of
``Get``/``Filter``/``Project``/``UnionAll`` on such tables. Whether the engine uses it at all
is :attr:`ivm.policy.Policy.driver`.

Contract in ``(data, time, diff)`` terms, the same as :func:`ops.stateless.spark.render`'s: each
update ``(d, t, r)`` becomes ``(f(d), t, r)`` or is dropped, and given the same input updates
the output equals Spark's row for row, types included. Every expression's type is Spark's own:
the expressions are analysed by Spark over an empty frame of the input's schema (no job; once
per process, schema and expression). Values are then computed exactly: decimals in 256 bits
(or as Python integers past that), rounded half away from zero to Spark's result scale as
Spark rounds them, a carry into a new digit included (9.99 as DECIMAL(5,1) is 10.0), products
and quotients rounded once from their exact values, as Spark's 39 truncated digits round them
(:mod:`ops.decimals`); integers checked against
their type; strings as UTF-8 bytes. Conditional parts (CASE branches, COALESCE's and IF's
later arguments, the right side of AND/OR) are evaluated on the rows that reach them only, as
Spark evaluates them. An expression of no column holding what the driver does not evaluate
itself (``DATE '1994-01-01' + INTERVAL '1' YEAR``, ``make_date(...)``) is Spark's value, asked
once per process and setting (:func:`ivm.plan.driver.folded`). ``LIKE`` a constant pattern is
Arrow's ``match_like`` (the same escapes; ``_`` one character); ``EXTRACT`` of a date's year,
month or day Arrow's.

A value that fails on a row as Spark's ANSI mode fails it (an overflow, a division by zero)
raises :class:`~ivm.errors.EvaluationError` naming the expression and the output column
(Spark 4 runs in ANSI mode; without it Spark returns NULL or wraps, and the driver declines).
What the driver cannot evaluate exactly raises :class:`~ivm.errors.NotOnDriver` before any
row is written, and the caller renders the plan on Spark: an expression it does not know,
floating-point arithmetic, comparison or division, text read as a number, TRY_CAST of a
value that fails, case mapping or slicing of non-ASCII text, and the stateful nodes
:mod:`ops.reduce.driver` leaves to Spark. Joins (outer and semi too) are rendered by
:mod:`ops.join.driver`, which the caller hands to :func:`render_local`.
"""

from __future__ import annotations

import copy
import datetime
import decimal
import functools
import json
import os
import threading
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import PySparkException
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_type
from sqlglot import exp

from ivm.errors import EvaluationError, NotOnDriver
from ivm.plan.driver import (
    ARITHMETIC,
    COMPARISONS,
    DATE_FUNCTIONS,
    DATE_PARTS,
    VALUES,
    expression_support,
    folded,
)
from ivm.plan.ir import (
    Filter,
    Get,
    Join,
    Node,
    Project,
    Reduce,
    SemiJoin,
    SetOp,
    TopK,
    UnionAll,
    Window,
    collections,
)
from ops import DIFF, TIME, decimals
from ops.expressions import spark_sql

Value = pa.Array | pa.ChunkedArray | pa.Scalar


_INTEGRAL_DIGITS: dict[type, int] = {
    T.ByteType: 3,
    T.ShortType: 5,
    T.IntegerType: 10,
    T.LongType: 20,
}
_NUMERIC = (T.ByteType, T.ShortType, T.IntegerType, T.LongType, T.DecimalType)
_ORDERED = (
    T.StringType,
    T.DateType,
    T.TimestampType,
    T.TimestampNTZType,
    T.BooleanType,
    T.BinaryType,
)
_COMPARISONS: dict[type, str] = dict(
    zip(
        COMPARISONS,
        ("equal", "not_equal", "less", "less_equal", "greater", "greater_equal"),
        strict=True,
    )
)
_ARITHMETIC: dict[type, str] = dict(zip(ARITHMETIC, ("add", "subtract", "multiply"), strict=True))
_TYPES: dict[tuple[tuple[tuple[str, str], ...], str], T.DataType] = {}
_TYPES_LOCK = threading.Lock()
_TYPES_LOADED: set[str] = set()  # the lakes whose record this process has read
_TYPES_SAVED: dict[str, int] = {}  # per lake, how many entries its record held when written

TYPES_RECORD = "_ivm/expression_types.json"
"""Where under the lake root the driver keeps Spark's expression types between processes
(:func:`load_types`, :func:`save_types`): each Dagster run is a process of its own, and
would otherwise pay Spark's analysis of every expression again (BENCHMARKS.md, "Policy
thresholds: arrangements and lookups")."""

_TYPING_SETTINGS = (
    "spark.sql.ansi.enabled",
    "spark.sql.decimalOperations.allowPrecisionLoss",
    "spark.sql.legacy.allowNegativeScaleOfDecimal",
)


def _typing(spark) -> dict[str, str | None]:
    """What Spark's result types depend on besides the expressions: its version and the
    settings that change decimal and overflow typing."""
    return {"version": spark.version, **{k: spark.conf.get(k, None) for k in _TYPING_SETTINGS}}


def load_types(spark, root: str) -> None:
    """Read the lake's record of expression types into the process's (once per lake and
    process), if the same Spark version and typing settings made it; a record that cannot
    be read is ignored (the types are analysed again)."""
    if root in _TYPES_LOADED or "://" in root:
        return
    _TYPES_LOADED.add(root)
    try:
        with open(os.path.join(root, TYPES_RECORD), encoding="utf-8") as f:
            record = json.load(f)
        if record.get("typing") != _typing(spark):
            return
        entries = {
            (tuple((n, t) for n, t in fields), sql): T._parse_datatype_json_string(typ)
            for fields, sql, typ in record["types"]
        }
    except (OSError, ValueError, KeyError, TypeError):
        return
    with _TYPES_LOCK:
        for key, typ in entries.items():
            _TYPES.setdefault(key, typ)
        _TYPES_SAVED[root] = len(_TYPES)


@contextmanager
def types_recorded(spark, root: str) -> Iterator[None]:
    """Around the driver's evaluation: the lake's record of expression types read before
    (:func:`load_types`), what was learnt written back after (:func:`save_types`)."""
    load_types(spark, root)
    try:
        yield
    finally:
        save_types(spark, root)


def save_types(spark, root: str) -> None:
    """Write the process's expression types to the lake's record when it learnt new ones
    (the whole record replaced at once: a reader sees the old one or the new)."""
    if "://" in root:
        return
    with _TYPES_LOCK:
        if _TYPES_SAVED.get(root) == len(_TYPES):
            return
        entries = [[list(map(list, k[0])), k[1], t.json()] for k, t in _TYPES.items()]
    path = os.path.join(root, TYPES_RECORD)
    temporary = f"{path}.{uuid.uuid4().hex}.tmp"
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump({"typing": _typing(spark), "types": entries}, f)
        os.replace(temporary, path)
    except OSError:
        return  # the record is an optimisation: the next process analyses the types again
    _TYPES_SAVED[root] = len(entries)


def arrow_type(t: T.DataType) -> pa.DataType:
    """The Arrow type of Spark's type ``t`` as the engine's tables hold it."""
    if isinstance(t, T.NullType):
        return pa.null()
    if isinstance(t, T.TimestampType):
        return pa.timestamp("us", tz="UTC")
    return to_arrow_type(t)


def _broadcast(v: Value, n: int) -> pa.Array:
    """``v`` as an array of ``n`` values (a scalar repeated)."""
    if isinstance(v, pa.Scalar):
        return pa.repeat(v, n)
    return v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v


def _is_value(node: exp.Expression) -> bool:
    """Whether ``node`` is evaluated as a value (its Spark type asked for): a CASE's ``WHEN``
    branch is structure, a standalone ``IF(c, a, b)`` a value."""
    if isinstance(node, exp.If):
        return node.arg_key != "ifs"
    return isinstance(node, VALUES)


def _value_nodes(e: exp.Expression) -> Iterator[exp.Expression]:
    """The nodes of ``e`` the driver evaluates as values: a :func:`folded` one whole, not its
    parts (Spark computes it)."""
    if folded(e):
        yield e
        return
    if _is_value(e):
        yield e
    for child in e.iter_expressions():
        yield from _value_nodes(child)


_CONSTANTS: dict[tuple[str, str], pa.Scalar] = {}
"""Per Spark setting (:func:`_typing`, the session's time zone) and SQL, the value of a
:func:`folded` expression as Spark computed it."""

_CONSTANT_TYPES = (
    T.BooleanType,
    T.StringType,
    T.DateType,
    T.DecimalType,
    T.FloatType,
    T.DoubleType,
    *_INTEGRAL_DIGITS,
)
"""The types of a folded value the driver takes from Spark's result (a timestamp's would go
through Python's local time)."""


def _constant(spark, e: exp.Expression, t: T.DataType) -> pa.Scalar:
    """The value of ``e`` (a :func:`folded` expression, of Spark's type ``t``) as Spark
    computes it: asked once per process and setting. One that fails raises NotOnDriver: Spark's
    plan decides whether a row reaches it."""
    sql = spark_sql(e)
    setting = json.dumps(
        {**_typing(spark), "zone": spark.conf.get("spark.sql.session.timeZone", None)},
        sort_keys=True,
    )
    with _TYPES_LOCK:
        known = _CONSTANTS.get((setting, sql))
    if known is not None:
        return known
    if not isinstance(t, (*_CONSTANT_TYPES, T.NullType)):
        raise NotOnDriver(f"{sql} (a {t.simpleString()}) is computed by Spark")
    try:
        (row,) = spark.sql(f"SELECT {sql}").collect()
    except PySparkException as err:
        raise NotOnDriver(f"{sql} fails in Spark, whose plan decides if it runs") from err
    value = pa.scalar(row[0], arrow_type(t))
    with _TYPES_LOCK:
        _CONSTANTS[(setting, sql)] = value
    return value


def _check_supported(e: exp.Expression) -> None:
    why = expression_support(e)
    if why is not None:
        raise NotOnDriver(why)


def spark_types(spark, schema: T.StructType, expressions: Sequence[exp.Expression]) -> None:
    """Spark's result type of each value node of ``expressions`` over rows of ``schema``, from
    analysing them over an empty frame (no job), kept for the process: fills :data:`_TYPES`."""
    fields = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
    wanted: list[str] = []
    for e in expressions:
        _check_supported(e)
        for node in _value_nodes(e):
            sql = spark_sql(node)
            if (fields, sql) not in _TYPES and sql not in wanted:
                wanted.append(sql)
    if not wanted:
        return
    analysed = spark.createDataFrame([], schema).selectExpr(*wanted).schema
    with _TYPES_LOCK:
        for sql, field in zip(wanted, analysed.fields, strict=True):
            _TYPES[(fields, sql)] = field.dataType


def decimal_shape(t: T.DataType) -> tuple[int, int]:
    """``(precision, scale)`` of a number of Spark type ``t`` as a decimal (an integer: the
    decimal of its digits, as Spark widens it)."""
    if isinstance(t, T.DecimalType):
        return t.precision, t.scale
    digits = _INTEGRAL_DIGITS.get(type(t))
    if digits is None:
        raise NotOnDriver(f"{t.simpleString()} arithmetic is computed by Spark")
    return digits, 0


_ARROW_DIGITS = 76
"""The most digits an Arrow decimal holds (``decimal256``)."""

_EXACT = decimal.Context(prec=200, rounding=decimal.ROUND_HALF_UP)
"""Python decimals in as many digits as the driver's values need (Spark's are at most 38
digits on either side of the point)."""


def _decimal(v: Value, t: T.DataType) -> Value:
    """A number of Spark type ``t`` as an exact 256-bit decimal of its own precision."""
    precision, scale = decimal_shape(t)
    return v.cast(pa.decimal256(max(precision, 1), scale))


def _integral_bounds(t: T.DataType) -> tuple[int, int]:
    bits = {T.ByteType: 8, T.ShortType: 16, T.IntegerType: 32, T.LongType: 64}[type(t)]
    return -(1 << (bits - 1)), (1 << (bits - 1)) - 1


def _first_outside(v: Value, fits: Callable[[Any], bool]) -> Any:
    """The first non-NULL value of ``v`` for which ``fits`` is false (for an error message)."""
    values = [v.as_py()] if isinstance(v, pa.Scalar) else v.to_pylist()
    return next((x for x in values if x is not None and not fits(x)), None)


def _check_range(v: Value, low: Any, high: Any, target: str) -> None:
    """EvaluationError (overflow) when a value of ``v`` lies outside ``[low, high]``."""
    if isinstance(v, pa.Scalar):
        least = most = v.as_py()
    else:
        extremes = pc.min_max(v)
        least, most = extremes["min"].as_py(), extremes["max"].as_py()
    if least is None or (least >= low and most <= high):
        return
    bad = _first_outside(v, lambda x: low <= x <= high)
    raise EvaluationError("overflow", detail=f"{bad} does not fit {target}")


def _rounded(v: Value, scale: int) -> Value:
    """An exact decimal rounded half away from zero to ``scale`` places, in a type one digit
    wider than its own, so that a carry into a new digit (9.99 to 10.0) fits."""
    if v.type.scale <= scale:
        return v
    if v.type.precision >= _ARROW_DIGITS:
        raise NotOnDriver("a decimal of 76 digits rounded: Spark's")
    wide = v.cast(pa.decimal256(v.type.precision + 1, v.type.scale))
    return pc.round(wide, ndigits=scale, round_mode="half_towards_infinity")


def _fit_decimal(v: Value, t: T.DecimalType) -> Value:
    """An exact decimal rounded half away from zero to ``t``'s scale, then held in ``t`` (as
    Spark's ``changePrecision``); a value past ``t``'s precision raises EvaluationError
    (overflow), as Spark's ANSI mode does."""
    v = _rounded(v, t.scale)
    bound = Decimal(10) ** (t.precision - t.scale)
    largest = pc.max(pc.abs(v)) if not isinstance(v, pa.Scalar) else v
    if largest.is_valid and abs(largest.as_py()) >= bound:
        bad = _first_outside(v, lambda x: abs(x) < bound)
        raise EvaluationError("overflow", detail=f"{bad} does not fit {t.simpleString()}")
    return v.cast(pa.decimal128(t.precision, t.scale))


def _convert(v: Value, source: T.DataType, target: T.DataType) -> Value:
    """A value of Spark type ``source`` as ``target``, as Spark's implicit widening (and a
    numeric CAST) converts it; conversions it does not know exactly: Spark's part."""
    if source == target:
        return v.cast(arrow_type(target))
    if isinstance(source, T.NullType):
        return (
            pa.scalar(None, arrow_type(target))
            if isinstance(v, pa.Scalar)
            else v.cast(arrow_type(target))
        )
    if isinstance(target, T.DecimalType) and isinstance(source, _NUMERIC):
        return _fit_decimal(_decimal(v, source), target)
    if type(target) in _INTEGRAL_DIGITS and type(source) in _INTEGRAL_DIGITS:
        _check_range(v, *_integral_bounds(target), target.simpleString())
        return v.cast(arrow_type(target))
    raise NotOnDriver(f"{source.simpleString()} -> {target.simpleString()} is Spark's")


def integral_result(op: str, a: Value, b: Value, t: T.DataType) -> Value:
    """``a op b`` of integers as Spark computes it in type ``t``: exact (in a wider type),
    then EvaluationError (overflow) for a result past ``t``, as Spark's ANSI mode raises."""
    # int, smallint, tinyint: exact in 64 bits; bigint: in 20-digit decimals
    wide = pa.int64() if _INTEGRAL_DIGITS[type(t)] <= 10 else pa.decimal256(20, 0)
    exact = getattr(pc, op)(a.cast(wide), b.cast(wide))
    _check_range(exact, *_integral_bounds(t), t.simpleString())
    return exact.cast(arrow_type(t))


def _unscaled(column: pa.Array, t: T.DataType) -> list[int | None]:
    """A numeric column's values as integers of its decimal scale (``decimal_shape``)."""
    scale = decimal_shape(t)[1]
    return [
        None if x is None else (int(x.scaleb(scale, context=_EXACT)) if scale else int(x))
        for x in column.to_pylist()
    ]


def _held(units: list[int | None], t: T.DecimalType) -> pa.Array:
    """Integers of ``t``'s scale as a ``t`` column; EvaluationError (overflow) for one past
    its precision."""
    bound = 10**t.precision
    bad = next((u for u in units if u is not None and abs(u) >= bound), None)
    if bad is not None:
        value = Decimal(bad).scaleb(-t.scale, context=_EXACT)
        raise EvaluationError("overflow", detail=f"{value} does not fit {t.simpleString()}")
    return pa.array(
        [None if u is None else Decimal(u).scaleb(-t.scale, context=_EXACT) for u in units],
        pa.decimal128(t.precision, t.scale),
    )


_BY_ROW = {"add": decimals.total, "subtract": decimals.difference, "multiply": decimals.product}
"""Decimal arithmetic row by row in Python, for what Arrow's decimals cannot hold."""


def _all_ascii(v: Value) -> bool:
    return bool(pc.all(pc.string_is_ascii(v)).as_py() is not False)


def _spark_setting(spark, key: str, default: str) -> str:
    return str(spark.conf.get(key, default)).strip().lower()


class Evaluator:
    """Evaluates IR expressions over the rows of ``table`` as Spark does (see the module).

    A value that fails on a row (an overflow, a division by zero) raises
    :class:`~ivm.errors.EvaluationError` naming the expression, as Spark's ANSI mode raises;
    with ANSI mode off Spark returns NULL or wraps around instead: NotOnDriver. Conditional
    parts (a CASE's branches, COALESCE's and IF's later arguments, the right side of AND and
    OR) are evaluated for the rows that reach them only, as Spark evaluates them, so a
    division guarded by a CASE never fails."""

    def __init__(self, spark, table: pa.Table, expressions: Sequence[exp.Expression]) -> None:
        self.spark = spark
        self.table = table
        try:
            self.schema = from_arrow_schema(table.schema)
        except TypeError as err:
            raise NotOnDriver(f"a column type Spark would convert: {err}") from err
        self._fields = tuple((f.name, f.dataType.simpleString()) for f in self.schema.fields)
        spark_types(spark, self.schema, expressions)

    def type_of(self, e: exp.Expression) -> T.DataType:
        """Spark's type of a value node (analysed when the evaluator was made)."""
        while isinstance(e, exp.Paren):
            e = e.this
        return _TYPES[(self._fields, spark_sql(e))]

    def column(self, e: exp.Expression) -> pa.Array:
        """``e``'s value for every row, as an array of Spark's type for it."""
        return _broadcast(self(e).cast(arrow_type(self.type_of(e))), self.table.num_rows)

    def mask(self, e: exp.Expression) -> pa.Array:
        """Which rows a predicate keeps (NULL counts as false, as in WHERE)."""
        return pc.fill_null(_broadcast(_as_bool(self(e)), self.table.num_rows), False)

    def __call__(self, e: exp.Expression) -> Value:
        while isinstance(e, exp.Paren):
            e = e.this
        if folded(e):
            return _constant(self.spark, e, self.type_of(e))
        try:
            return self._value(e, self.type_of(e))
        except EvaluationError as failure:
            if failure.operation is not None:  # an inner expression's, named there
                raise
            return self._failed(failure, e)

    def _failed(self, failure: EvaluationError, e: exp.Expression) -> Value:
        """Where ``e`` fails: over no row nothing fails (a NULL of its type); with ANSI mode
        (Spark 4's default) Spark raises, so does the driver; without, Spark's part."""
        if self.table.num_rows == 0:
            return pa.scalar(None, arrow_type(self.type_of(e)))
        if _spark_setting(self.spark, "spark.sql.ansi.enabled", "true") != "true":
            raise NotOnDriver(f"{failure.kind} in {spark_sql(e)} without ANSI mode: Spark's")
        if isinstance(e, exp.TryCast) and e.args.get("safe"):
            raise NotOnDriver(f"TRY_CAST of a value that fails: Spark's ({failure.detail})")
        raise failure.located(operation=spark_sql(e))

    def _on(self, rows: pa.Array) -> Evaluator:
        """The same evaluator over the rows where ``rows`` is true (types known: no Spark)."""
        other = copy.copy(self)
        other.table = self.table.filter(rows)
        return other

    def _where(self, rows: pa.Array | None, e: exp.Expression) -> Value:
        """``e``'s value on the rows where ``rows`` is true (None: every row), NULL on the
        others, on which it is not evaluated (as Spark skips a branch not taken)."""
        return self._only(rows, lambda ev: ev(e), arrow_type(self.type_of(e)))

    def _only(
        self, rows: pa.Array | None, compute: Callable[[Evaluator], Value], t: pa.DataType
    ) -> Value:
        """``compute(evaluator)`` for the rows where ``rows`` is true (None: every row), by
        an evaluator over those rows only; NULL (of ``t``) on the others."""
        taken = self.table.num_rows if rows is None else pc.sum(rows).as_py() or 0
        if taken == self.table.num_rows:
            return compute(self)
        if taken == 0:
            return pa.scalar(None, t)
        assert rows is not None
        value = _broadcast(compute(self._on(rows)), taken)
        chosen = np.asarray(rows.to_numpy(zero_copy_only=False), dtype=bool)
        positions = np.full(len(rows), -1, dtype=np.int64)
        positions[chosen] = np.arange(taken, dtype=np.int64)
        return value.take(pa.array(positions, mask=~chosen))

    def _value(self, e: exp.Expression, t: T.DataType) -> Value:
        n = self.table.num_rows
        if isinstance(e, exp.Column):
            return self.table.column(e.name)
        if isinstance(e, (exp.Literal, exp.Boolean, exp.Null)):
            return self._literal(e, t)
        if isinstance(e, exp.Cast):
            return self._cast(e, t)
        if type(e) in _ARITHMETIC:
            return self._arithmetic(_ARITHMETIC[type(e)], e.this, e.expression, t)
        if isinstance(e, exp.Div):
            return self._divide(e.this, e.expression, t)
        if isinstance(e, exp.Mod):
            return self._remainder(e.this, e.expression, t)
        if isinstance(e, exp.Neg):
            return self._negate(e.this, t)
        if type(e) in _COMPARISONS:
            return self._compare(_COMPARISONS[type(e)], e.this, e.expression)
        if isinstance(e, exp.NullSafeEQ):
            both_null = pc.and_(pc.is_null(self(e.this)), pc.is_null(self(e.expression)))
            equal = pc.fill_null(self._compare("equal", e.this, e.expression), False)
            return pc.or_(both_null, equal)
        if isinstance(e, (exp.And, exp.Or)):
            return self._logical(e)
        if isinstance(e, exp.Not):
            return pc.invert(_as_bool(self(e.this)))
        if isinstance(e, exp.Is) and isinstance(e.expression, exp.Boolean):  # x <=> TRUE|FALSE
            if not isinstance(self.type_of(e.this), (T.BooleanType, T.NullType)):
                raise NotOnDriver("IS TRUE/FALSE of a non-boolean is Spark's")
            truth = _broadcast(_as_bool(self(e.this)), n)
            return pc.fill_null(pc.equal(truth, bool(e.expression.this)), False)
        if isinstance(e, exp.Is):  # IS NULL (:func:`ivm.plan.driver.expression_support`)
            return pc.is_null(self(e.this))
        if isinstance(e, exp.In):
            return self._in(e)
        if isinstance(e, exp.Between):  # Spark's x >= low AND x <= high
            low = _broadcast(self._compare("greater_equal", e.this, e.args["low"]), n)
            high = self._only(
                pc.fill_null(low, True),
                lambda ev: ev._compare("less_equal", e.this, e.args["high"]),
                pa.bool_(),
            )
            return pc.and_kleene(low, high)
        if isinstance(e, exp.Case):
            return self._case(e, t)
        if isinstance(e, exp.If):
            return self._if(e, t)
        if isinstance(e, exp.Nullif):
            return self._nullif(e, t)
        return self._string(e, t)

    def _string(self, e: exp.Expression, t: T.DataType) -> Value:
        if isinstance(e, (exp.Upper, exp.Lower)):
            return self._case_map(e, t)
        if isinstance(e, exp.Substring):
            return self._substring(e, t)
        if isinstance(e, exp.Length):
            if not isinstance(self.type_of(e.this), (T.StringType, T.NullType)):
                raise NotOnDriver("length of binary is computed by Spark")
            v = self(e.this)
            return pa.scalar(None, pa.int32()) if _is_null(v) else pc.utf8_length(v)
        if isinstance(e, exp.Concat):
            parts = e.expressions
            if not all(isinstance(self.type_of(p), (T.StringType, T.NullType)) for p in parts):
                raise NotOnDriver("concat of non-strings is computed by Spark")
            values = [self(p) for p in parts]
            if any(_is_null(v) for v in values):
                return pa.scalar(None, pa.string())
            return pc.binary_join_element_wise(*values, "")
        if isinstance(e, exp.Coalesce):
            return self._coalesce(e, t)
        if isinstance(e, exp.Like):  # a constant pattern (ivm.plan.driver._like_support)
            if not isinstance(self.type_of(e.this), (T.StringType, T.NullType)):
                raise NotOnDriver("LIKE of a non-string is computed by Spark")
            v = self(e.this)
            if _is_null(v):
                return pa.scalar(None, pa.bool_())
            matched = pc.match_like(v, e.expression.this)
            return pc.invert(matched) if e.args.get("negate") else matched  # NOT LIKE
        if isinstance(e, exp.Extract):  # of a DATE: YEAR, MONTH or DAY (DATE_PARTS)
            return self._date_part(e.expression, DATE_PARTS[e.this.name.upper()], t)
        if type(e) in DATE_FUNCTIONS:  # YEAR(d) and the like: TsOrDsToDate(d) as sqlglot reads it
            inner = e.this.this if isinstance(e.this, exp.TsOrDsToDate) else e.this
            if isinstance(inner, exp.TsOrDsToDate):  # of TO_DATE(s)
                raise NotOnDriver("TO_DATE is computed by Spark")
            return self._date_part(inner, DATE_FUNCTIONS[type(e)], t)
        raise NotOnDriver(f"{type(e).__name__} is computed by Spark")

    def _date_part(self, e: exp.Expression, part: str, t: T.DataType) -> Value:
        """A field of the DATE ``e`` (Arrow's ``part`` function), in Spark's type ``t``."""
        if not isinstance(self.type_of(e), T.DateType):
            raise NotOnDriver("a date's field of a non-date is computed by Spark")
        v = self(e)
        if _is_null(v):
            return pa.scalar(None, arrow_type(t))
        return getattr(pc, part)(v).cast(arrow_type(t))

    # -- leaves ------------------------------------------------------------------------------

    @staticmethod
    def _literal(e: exp.Expression, t: T.DataType) -> pa.Scalar:
        arrow = arrow_type(t)
        if isinstance(e, exp.Null):
            return pa.scalar(None, arrow)
        if isinstance(e, exp.Boolean):
            return pa.scalar(bool(e.this), pa.bool_())
        assert isinstance(e, exp.Literal)
        if e.is_string:
            if not isinstance(t, T.StringType):
                raise NotOnDriver(f"a {t.simpleString()} literal is Spark's")
            return pa.scalar(e.this, pa.string())
        if type(t) in _INTEGRAL_DIGITS:
            return pa.scalar(int(e.this), arrow)
        if isinstance(t, T.DecimalType):
            return pa.scalar(Decimal(e.this), arrow)
        raise NotOnDriver(f"a {t.simpleString()} literal is Spark's")

    def _cast(self, e: exp.Cast, t: T.DataType) -> Value:
        inner = e.this
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(t, T.DateType) and isinstance(inner, exp.Literal) and inner.is_string:
            text = inner.this.strip()
            if len(text) != 10:  # Spark also reads '2024-1-5' and '2024-01-05 10:00'
                raise NotOnDriver(f"DATE {text!r} is read by Spark")
            try:
                return pa.scalar(datetime.date.fromisoformat(text), pa.date32())
            except ValueError as err:
                raise NotOnDriver(f"DATE {text!r} is read by Spark") from err
        return _convert(self(inner), self.type_of(inner), t)

    # -- operators ---------------------------------------------------------------------------

    def _arithmetic(
        self, op: str, left: exp.Expression, right: exp.Expression, t: T.DataType
    ) -> Value:
        lt, rt = self.type_of(left), self.type_of(right)
        a, b = self(left), self(right)
        if _is_null(a) or _is_null(b) or isinstance(lt, T.NullType) or isinstance(rt, T.NullType):
            return pa.scalar(None, arrow_type(t))  # NULL either side: NULL, nothing fails
        if isinstance(t, T.DecimalType):
            return self._decimal_arithmetic(op, a, b, lt, rt, t)
        if type(t) in _INTEGRAL_DIGITS:
            return integral_result(op, _convert(a, lt, t), _convert(b, rt, t), t)
        raise NotOnDriver(f"{t.simpleString()} arithmetic is computed by Spark")

    def _decimal_arithmetic(
        self, op: str, a: Value, b: Value, lt: T.DataType, rt: T.DataType, t: T.DecimalType
    ) -> Value:
        """``a op b`` (add, subtract, multiply) of decimals (or integers as decimals) exactly
        as Spark: the exact sum or product rounded half up to ``t``'s scale (as Spark's
        39-digit product rounds it: :data:`ops.decimals.PRODUCT_DIGITS`), EvaluationError
        (overflow) past its precision."""
        (p1, s1), (p2, s2) = decimal_shape(lt), decimal_shape(rt)
        digits = p1 + p2 + 1 if op == "multiply" else max(p1 - s1, p2 - s2) + max(s1, s2) + 1
        if digits >= _ARROW_DIGITS:  # past Arrow's decimals (and their rounding): in Python
            return self._pairwise(_BY_ROW[op], a, b, lt, rt, t)
        return _fit_decimal(getattr(pc, op)(_decimal(a, lt), _decimal(b, rt)), t)

    def _pairwise(
        self,
        combine: Callable[[int, int, int, int, int], int],
        a: Value,
        b: Value,
        lt: T.DataType,
        rt: T.DataType,
        t: T.DecimalType,
    ) -> pa.Array:
        """``combine`` of each row's two numbers (as integers of their scales) into ``t``,
        in Python: Spark's rounding where Arrow's differs (a quotient), or a sum or product
        Arrow's 76 digits may not hold."""
        n = self.table.num_rows
        xs = _unscaled(_broadcast(a, n), lt)
        ys = _unscaled(_broadcast(b, n), rt)
        sx, sy = decimal_shape(lt)[1], decimal_shape(rt)[1]
        try:
            units = [
                None if x is None or y is None else combine(x, sx, y, sy, t.scale)
                for x, y in zip(xs, ys, strict=True)
            ]
        except decimals.DecimalOverflow as err:
            detail = f"{err} does not fit {t.simpleString()}"
            raise EvaluationError("overflow", detail=detail) from err
        except ZeroDivisionError as err:
            raise EvaluationError("division by zero", detail=str(err)) from err
        return _held(units, t)

    def _divide(self, left: exp.Expression, right: exp.Expression, t: T.DataType) -> Value:
        """``left / right`` as Spark divides: of decimals (or integers with a decimal),
        rounded as ``java.math.BigDecimal`` with Spark's scales; a zero divisor of a non-NULL
        dividend raises EvaluationError (division by zero), as Spark's ANSI mode does.
        Floating-point division (of integers, of doubles) is Spark's."""
        if not isinstance(t, T.DecimalType):
            raise NotOnDriver(f"{t.simpleString()} division is computed by Spark")
        operands = self._divisor_first(left, right)
        if operands is None:
            return pa.scalar(None, arrow_type(t))
        a, b = operands
        return self._pairwise(decimals.quotient, a, b, self.type_of(left), self.type_of(right), t)

    def _divisor_first(
        self, left: exp.Expression, right: exp.Expression
    ) -> tuple[Value, Value] | None:
        """A division's or remainder's operands, the divisor evaluated first (as Spark
        evaluates them, so a failing dividend is not reached past a NULL divisor); None when
        either is a NULL of no type (the result is NULL)."""
        lt, rt = self.type_of(left), self.type_of(right)
        b = self(right)
        if _is_null(b) or isinstance(rt, T.NullType) or isinstance(lt, T.NullType):
            return None
        a = self(left)
        return None if _is_null(a) else (a, b)

    def _remainder(self, left: exp.Expression, right: exp.Expression, t: T.DataType) -> Value:
        """``left % right`` as Spark's ``Remainder``: exact, of the dividend's sign, of
        integers in their type, of decimals at the larger scale (:func:`ops.decimals.remainder`);
        a zero divisor of a non-NULL dividend raises EvaluationError (division by zero), as
        Spark's ANSI mode does. Floating point is Spark's."""
        lt, rt = self.type_of(left), self.type_of(right)
        integral = type(t) in _INTEGRAL_DIGITS
        if not (integral or isinstance(t, T.DecimalType)):
            raise NotOnDriver(f"{t.simpleString()} remainder is computed by Spark")
        operands = self._divisor_first(left, right)
        if operands is None:
            return pa.scalar(None, arrow_type(t))
        a, b = operands
        if isinstance(t, T.DecimalType):
            if t.scale != max(decimal_shape(lt)[1], decimal_shape(rt)[1]):
                raise NotOnDriver(f"a remainder rounded to {t.simpleString()} is Spark's")
            try:
                return self._pairwise(decimals.remainder, a, b, lt, rt, t)
            except ValueError as err:
                raise NotOnDriver(str(err)) from err
        n = self.table.num_rows
        xs = _broadcast(_convert(a, lt, t), n).cast(pa.int64())
        ys = _broadcast(_convert(b, rt, t), n).cast(pa.int64())
        valid = np.asarray(pc.and_(pc.is_valid(xs), pc.is_valid(ys)))
        x = np.asarray(xs.fill_null(0).to_numpy(zero_copy_only=False))
        y = np.asarray(ys.fill_null(1).to_numpy(zero_copy_only=False))
        zero = valid & (y == 0)
        if zero.any():
            raise EvaluationError("division by zero", detail=f"{x[zero][0]} % 0")
        # fmod keeps the dividend's sign, as Java's %; x % -1 is 0 (even of the least x)
        safe = np.where((y == 0) | (y == -1), 1, y)
        r = np.where(y == -1, 0, np.fmod(x, safe))
        return pa.array(r, pa.int64(), mask=~valid).cast(arrow_type(t))

    def _negate(self, operand: exp.Expression, t: T.DataType) -> Value:
        v, source = self(operand), self.type_of(operand)
        if _is_null(v) or isinstance(source, T.NullType):
            return pa.scalar(None, arrow_type(t))
        if isinstance(t, T.DecimalType):
            exact = pc.negate(_decimal(v, source))
            largest = pc.max(pc.abs(exact)) if not isinstance(exact, pa.Scalar) else exact
            bound = Decimal(10) ** (decimals.NEGATION_DIGITS - t.scale)
            if largest.is_valid and abs(largest.as_py()) >= bound:  # rounded to 34 digits
                column = _broadcast(v, self.table.num_rows)
                units = [
                    None if x is None else decimals.negation(x, t.precision)
                    for x in _unscaled(column, t)
                ]
                return _held(units, t)
            return _fit_decimal(exact, t)
        if type(t) in _INTEGRAL_DIGITS:
            zero = pa.scalar(0, arrow_type(t))
            return integral_result("subtract", zero, _convert(v, source, t), t)
        raise NotOnDriver(f"{t.simpleString()} negation is computed by Spark")

    def _comparable(
        self, left: exp.Expression, right: exp.Expression
    ) -> tuple[Value, Value] | None:
        """Both sides in types Arrow compares as Spark does; None if one is a NULL literal."""
        lt, rt = self.type_of(left), self.type_of(right)
        a, b = self(left), self(right)
        if isinstance(lt, T.NullType) or isinstance(rt, T.NullType) or _is_null(a) or _is_null(b):
            return None
        if type(lt) in _INTEGRAL_DIGITS and type(rt) in _INTEGRAL_DIGITS:
            return a.cast(pa.int64()), b.cast(pa.int64())
        if isinstance(lt, _NUMERIC) and isinstance(rt, _NUMERIC):
            return _decimal(a, lt), _decimal(b, rt)
        if type(lt) is type(rt) and isinstance(lt, _ORDERED):
            return a, b
        raise NotOnDriver(f"{lt.simpleString()} against {rt.simpleString()} is Spark's")

    def _compare(self, op: str, left: exp.Expression, right: exp.Expression) -> Value:
        sides = self._comparable(left, right)
        if sides is None:
            return pa.scalar(None, pa.bool_())  # compared with NULL: NULL
        return getattr(pc, op)(*sides)

    def _in(self, e: exp.In) -> Value:
        """``x IN (a, b, ...)``, a non-empty list (:func:`ivm.plan.driver.expression_support`)."""
        hits = [self._compare("equal", e.this, item) for item in e.expressions]
        return functools.reduce(pc.or_kleene, hits)

    def _logical(self, e: exp.And | exp.Or) -> Value:
        """AND and OR as Spark evaluates them: the right side only where the left one does
        not decide (AND: not false; OR: not true), three-valued."""
        n = self.table.num_rows
        left = _broadcast(_as_bool(self(e.this)), n)
        if isinstance(e, exp.And):
            right = self._where(pc.fill_null(left, True), e.expression)
            return pc.and_kleene(left, _as_bool(right))
        right = self._where(pc.invert(pc.fill_null(left, False)), e.expression)
        return pc.or_kleene(left, _as_bool(right))

    def _case(self, e: exp.Case, t: T.DataType) -> Value:
        """CASE WHEN as Spark evaluates it: each condition on the rows no earlier one took,
        each value (and ELSE) on the rows it is chosen for. ``CASE x WHEN v`` is Spark's
        ``CASE WHEN x = v`` (its analyser's rewrite)."""
        n = self.table.num_rows
        conditions, values = [], []
        open_rows: pa.Array | None = None  # None: every row
        key = e.this
        for branch in e.args["ifs"]:
            if key is None:
                condition = _as_bool(self._where(open_rows, branch.this))
            else:
                when = branch.this
                condition = self._only(
                    open_rows, lambda ev, v=when: ev._compare("equal", key, v), pa.bool_()
                )
            taken = pc.fill_null(_broadcast(condition, n), False)
            conditions.append(taken)
            values.append(self._branch(taken, branch.args["true"], t))
            open_rows = pc.invert(taken) if open_rows is None else pc.and_not(open_rows, taken)
        default = e.args.get("default")
        if default is not None:
            values.append(self._branch(open_rows, default, t))
        else:
            values.append(pa.nulls(n, arrow_type(t)))
        names = [f"c{i}" for i in range(len(conditions))]
        return pc.case_when(pa.StructArray.from_arrays(conditions, names=names), *values)

    def _branch(self, rows: pa.Array | None, e: exp.Expression, t: T.DataType) -> pa.Array:
        """A conditional value: ``e`` on ``rows`` as type ``t``, NULL elsewhere."""
        value = _convert(self._where(rows, e), self.type_of(e), t)
        return _broadcast(value, self.table.num_rows)

    def _if(self, e: exp.If, t: T.DataType) -> Value:
        """IF(c, a, b): ``a`` where ``c`` is true, ``b`` elsewhere (NULL included)."""
        n = self.table.num_rows
        chosen = pc.fill_null(_broadcast(_as_bool(self(e.this)), n), False)
        false = e.args.get("false")
        otherwise = (
            pa.nulls(n, arrow_type(t))
            if false is None
            else self._branch(pc.invert(chosen), false, t)
        )
        return pc.if_else(chosen, self._branch(chosen, e.args["true"], t), otherwise)

    def _nullif(self, e: exp.Nullif, t: T.DataType) -> Value:
        """NULLIF(a, b): NULL where ``a = b``, ``a`` elsewhere (Spark's ``IF(a = b, NULL,
        a)``)."""
        n = self.table.num_rows
        equal = pc.fill_null(_broadcast(self._compare("equal", e.this, e.expression), n), False)
        value = _broadcast(_convert(self(e.this), self.type_of(e.this), t), n)
        return pc.if_else(equal, pa.scalar(None, arrow_type(t)), value)

    def _coalesce(self, e: exp.Coalesce, t: T.DataType) -> Value:
        """COALESCE as Spark evaluates it: each argument on the rows still NULL only."""
        result: pa.Array | None = None
        for part in [e.this, *e.expressions]:
            rows = None if result is None else pc.is_null(result)
            value = self._branch(rows, part, t)
            result = value if result is None else pc.coalesce(result, value)
        assert result is not None
        return result

    def _case_map(self, e: exp.Upper | exp.Lower, t: T.DataType) -> Value:
        if not isinstance(t, T.StringType):
            raise NotOnDriver("case mapping of a non-string is Spark's")
        v = self(e.this)
        if _is_null(v):
            return pa.scalar(None, pa.string())
        if not _all_ascii(v):  # Java's and Arrow's Unicode case tables may differ
            raise NotOnDriver("case mapping of non-ASCII text is computed by Spark")
        return pc.ascii_upper(v) if isinstance(e, exp.Upper) else pc.ascii_lower(v)

    def _substring(self, e: exp.Substring, t: T.DataType) -> Value:
        """``substr(s, pos[, count])`` of text with literal ``pos >= 1`` and ``count >= 0``
        (:func:`ivm.plan.driver.expression_support`)."""
        if not isinstance(t, T.StringType):
            raise NotOnDriver(f"substr of {t.simpleString()} is computed by Spark")
        length = e.args.get("length")
        pos = int(e.args["start"].this)
        count = None if length is None else int(length.this)
        v = self(e.this)
        if _is_null(v):
            return pa.scalar(None, pa.string())
        if not _all_ascii(v):  # code units are characters only in ASCII
            raise NotOnDriver("substr of non-ASCII text is computed by Spark")
        stop = None if count is None else pos - 1 + count
        return pc.utf8_slice_codeunits(v, start=pos - 1, stop=stop)


def _is_null(v: Value) -> bool:
    """Whether ``v`` is a NULL of no type (Spark's NULL literal): NULL whatever it meets."""
    return v.type == pa.null()


def _as_bool(v: Value) -> Value:
    """A truth value, a NULL literal as a boolean NULL."""
    return pa.scalar(None, pa.bool_()) if _is_null(v) else v


JoinRenderer = Callable[[Join, Mapping[str, pa.Table]], pa.Table]
StatefulRenderer = Callable[..., pa.Table]


def render_local(
    spark,
    node: Node,
    inputs: Mapping[str, pa.Table],
    join: JoinRenderer | None = None,
    stateful: StatefulRenderer | None = None,
) -> pa.Table:
    """The updates of ``node`` given every collection's updates as Arrow
    ``(columns..., _time, _diff)``: :func:`ops.stateless.spark.render`'s result, computed by the
    driver (``join``: how to render a join, :func:`ops.join.driver.join_delta_local`; ``stateful``:
    a GROUP BY or a TopK given its input's updates, :mod:`ops.reduce.driver`). Raises
    :class:`~ivm.errors.NotOnDriver` for what Spark must compute."""
    if isinstance(node, (Join, SemiJoin)) and join is not None:
        return join(node, inputs)
    if isinstance(node, (Reduce, TopK, Window)) and stateful is not None:
        return stateful(node, render_local(spark, node.input, inputs, join, stateful))
    if isinstance(node, SetOp) and stateful is not None:  # a side of written rows: None
        sides = [
            render_local(spark, side, inputs, join, stateful) if collections(side) else None
            for side in node.inputs
        ]
        return stateful(node, *sides)
    if isinstance(node, Get):
        return inputs[node.collection].select([*node.columns, TIME, DIFF])
    if isinstance(node, Filter):
        table = render_local(spark, node.input, inputs, join, stateful)
        return filtered(spark, table, node.predicate)
    if isinstance(node, Project):
        table = render_local(spark, node.input, inputs, join, stateful)
        return projected(spark, table, node.outputs)
    if isinstance(node, UnionAll):
        names = [*node.columns, TIME, DIFF]
        parts = [
            render_local(spark, b, inputs, join, stateful)
            .select([*b.columns, TIME, DIFF])
            .rename_columns(names)
            for b in node.branches
            if collections(b)  # one of rows written in the view has no update after its build
        ]
        if not parts:
            raise NotOnDriver("a union of rows written in the view is computed by Spark")
        if any(p.schema != parts[0].schema for p in parts[1:]):
            parts = _widened(parts)
        return pa.concat_tables(parts)
    raise NotOnDriver(f"{type(node).__name__} is computed by Spark")


def filtered(spark, table: pa.Table, predicate: exp.Expression | None) -> pa.Table:
    """The updates whose data satisfy ``predicate`` (all of them for None), time and diff kept."""
    if predicate is None:
        return table
    try:
        return table.filter(Evaluator(spark, table, [predicate]).mask(predicate))
    except EvaluationError as failure:
        raise failure.located(column="WHERE") from failure


def projected(spark, table: pa.Table, outputs: Sequence[tuple[str, exp.Expression]]) -> pa.Table:
    """``(outputs..., _time, _diff)``: each update's data mapped, its time and diff kept."""
    ev = Evaluator(spark, table, [e for _, e in outputs])
    return pa.Table.from_arrays(
        [*(_output(ev, name, e) for name, e in outputs), table.column(TIME), table.column(DIFF)],
        names=[*(name for name, _ in outputs), TIME, DIFF],
    )


def _output(ev: Evaluator, name: str, e: exp.Expression) -> pa.Array:
    """An output column's values; an EvaluationError names the column."""
    try:
        return ev.column(e)
    except EvaluationError as failure:
        raise failure.located(column=name) from failure


def _wider(a: T.DataType, b: T.DataType) -> T.DataType:
    """The type UNION ALL gives columns of types ``a`` and ``b``: Spark's widening of numbers
    (a decimal keeps the larger scale and the larger integer part, an integer counting as the
    decimal of its digits); other mixtures are Spark's part."""
    if a == b or isinstance(b, T.NullType):
        return a
    if isinstance(a, T.NullType):
        return b
    if type(a) in _INTEGRAL_DIGITS and type(b) in _INTEGRAL_DIGITS:
        return a if _INTEGRAL_DIGITS[type(a)] >= _INTEGRAL_DIGITS[type(b)] else b
    if isinstance(a, _NUMERIC) and isinstance(b, _NUMERIC):
        (pa_, sa), (pb, sb) = decimal_shape(a), decimal_shape(b)
        scale = max(sa, sb)
        precision = max(pa_ - sa, pb - sb) + scale
        if precision > 38:
            raise NotOnDriver("UNION ALL past 38 digits: Spark's part")
        return T.DecimalType(precision, scale)
    raise NotOnDriver(f"UNION ALL of {a.simpleString()} and {b.simpleString()} is Spark's")


def _widened(parts: list[pa.Table]) -> list[pa.Table]:
    """UNION ALL's branches with each column converted to the branches' wider type."""
    schemas = [from_arrow_schema(p.schema) for p in parts]
    targets = []
    for i in range(len(parts[0].column_names)):
        wide = schemas[0].fields[i].dataType
        for s in schemas[1:]:
            wide = _wider(wide, s.fields[i].dataType)
        targets.append(wide)
    out = []
    for p, s in zip(parts, schemas, strict=True):
        columns = [
            _convert(p.column(i), f.dataType, t)
            for i, (f, t) in enumerate(zip(s.fields, targets, strict=True))
        ]
        out.append(pa.Table.from_arrays(columns, names=p.column_names))
    return out


def normalized_floats(table: pa.Table) -> pa.Table:
    """``table`` with its floating-point columns as Spark groups them: ``-0.0`` is ``0.0``
    (Spark normalizes both before summing equal rows). A NaN raises NotOnDriver (Spark's
    NaN is equal to itself and greater than any number: its grouping is Spark's)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_floating(f.type):
            column = table.column(i)
            if pc.any(pc.is_nan(column)).as_py():
                raise NotOnDriver("NaN is grouped by Spark")
            table = table.set_column(i, f, pc.add(column, pa.scalar(0.0, f.type)))
    return table
