"""A small change's stateless plan computed by the driver, in Arrow, exactly as Spark would.

Owns the evaluation of IR expressions (sqlglot, as :mod:`ops.stateless` hands them to Spark)
over Arrow tables of updates, with Spark SQL's semantics, and the rendering of
``Get``/``Filter``/``Project``/``UnionAll`` on such tables.

Contract in ``(data, time, diff)`` terms, the same as :func:`ops.stateless.render`'s: each
update ``(d, t, r)`` becomes ``(f(d), t, r)`` or is dropped, and given the same input updates
the output equals Spark's row for row, types included. Every expression's type is Spark's own:
the expressions are analysed by Spark over an empty frame of the input's schema (no job; once
per process, schema and expression). Values are then computed exactly: decimals in 256 bits,
rounded half away from zero to Spark's result scale as Spark does; integers with overflow
checks; strings as UTF-8 bytes.

What the driver cannot evaluate exactly raises :class:`~ivm.errors.NotOnDriver` before any
row is written, and the caller renders the plan on Spark: an expression it does not know,
floating-point arithmetic or comparison, a product past 38 digits, an overflow (Spark raises
or returns NULL, depending on ANSI mode), case mapping or slicing of non-ASCII text, joins and
stateful nodes.
"""

from __future__ import annotations

import datetime
import json
import os
import threading
import uuid
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from contextlib import contextmanager
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import types as T
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_type
from sqlglot import exp

from ivm.errors import NotOnDriver
from ivm.plan.ir import (
    Filter,
    Get,
    Join,
    JoinInput,
    Node,
    Project,
    Reduce,
    SemiJoin,
    TopK,
    UnionAll,
)
from ivm.plan.join import LookupStage, plan_paths, shared_lookups
from ops import DIFF, TIME
from ops.stateless import spark_sql

Value = pa.Array | pa.ChunkedArray | pa.Scalar

DRIVER_VIEWS = True
"""Whether the engine has the driver compute small changes (here and in
:mod:`ops.local_reduce`, with the driver's writes, :data:`ops.sink.DRIVER_WRITE`); off,
Spark computes every view."""

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
_COMPARISONS: dict[type, str] = {
    exp.EQ: "equal",
    exp.NEQ: "not_equal",
    exp.LT: "less",
    exp.LTE: "less_equal",
    exp.GT: "greater",
    exp.GTE: "greater_equal",
}
_ARITHMETIC: dict[type, str] = {exp.Add: "add", exp.Sub: "subtract", exp.Mul: "multiply"}
# Nodes evaluated as values (whose Spark type is asked for); If is CASE's branch, not a value.
_VALUES = (
    exp.Column,
    exp.Literal,
    exp.Boolean,
    exp.Null,
    exp.Cast,
    exp.Neg,
    exp.And,
    exp.Or,
    exp.Not,
    exp.Is,
    exp.In,
    exp.Between,
    exp.Case,
    exp.Upper,
    exp.Lower,
    exp.Substring,
    exp.Length,
    exp.Concat,
    exp.Coalesce,
    exp.NullSafeEQ,
    *_COMPARISONS,
    *_ARITHMETIC,
)
_STRUCTURE = (exp.Paren, exp.If, exp.Identifier, exp.DataType, exp.DataTypeParam)

_TYPES: dict[tuple[tuple[tuple[str, str], ...], str], T.DataType] = {}
_TYPES_LOCK = threading.Lock()
_TYPES_LOADED: set[str] = set()  # the lakes whose record this process has read
_TYPES_SAVED: dict[str, int] = {}  # per lake, how many entries its record held when written

TYPES_RECORD = "_ivm/expression_types.json"
"""Where under the lake root the driver keeps Spark's expression types between processes
(:func:`load_types`, :func:`save_types`): each Dagster run is a process of its own, and
analysing a refresh's expressions costs it 0.5-0.8s of Spark planning (SF1, the benchmark's
views: 2.78s serial for the first refresh of a process, 1.73s for the next)."""

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


def _check_supported(e: exp.Expression) -> None:
    for node in e.walk():
        if not isinstance(node, _VALUES + _STRUCTURE):
            raise NotOnDriver(f"{type(node).__name__} is computed by Spark")


def spark_types(spark, schema: T.StructType, expressions: Sequence[exp.Expression]) -> None:
    """Spark's result type of each value node of ``expressions`` over rows of ``schema``, from
    analysing them over an empty frame (no job), kept for the process: fills :data:`_TYPES`."""
    fields = tuple((f.name, f.dataType.simpleString()) for f in schema.fields)
    wanted: list[str] = []
    for e in expressions:
        _check_supported(e)
        for node in e.walk():
            if isinstance(node, _VALUES):
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


def _decimal(v: Value, t: T.DataType) -> Value:
    """A number of Spark type ``t`` as an exact 256-bit decimal of its own precision."""
    precision, scale = decimal_shape(t)
    return v.cast(pa.decimal256(max(precision, 1), scale))


def _fit_decimal(v: Value, t: T.DecimalType) -> Value:
    """An exact decimal rounded half away from zero to ``t``'s scale (as Spark's
    ``changePrecision``), then held in ``t``; a value past ``t``'s precision: Spark's part."""
    scale = v.type.scale
    if scale > t.scale:
        v = pc.round(v, ndigits=t.scale, round_mode="half_towards_infinity")
    try:
        return v.cast(pa.decimal128(t.precision, t.scale))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise NotOnDriver(f"a value overflows {t.simpleString()}") from err


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
        try:
            return v.cast(arrow_type(target))  # a safe cast: an overflow raises
        except pa.ArrowInvalid as err:
            raise NotOnDriver(f"a value overflows {target.simpleString()}") from err
    raise NotOnDriver(f"{source.simpleString()} -> {target.simpleString()} is Spark's")


def _all_ascii(v: Value) -> bool:
    return bool(pc.all(pc.string_is_ascii(v)).as_py() is not False)


class Evaluator:
    """Evaluates IR expressions over the rows of ``table`` as Spark does (see the module)."""

    def __init__(self, spark, table: pa.Table, expressions: Sequence[exp.Expression]) -> None:
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
        return pc.fill_null(_broadcast(self(e), self.table.num_rows), False)

    def __call__(self, e: exp.Expression) -> Value:
        while isinstance(e, exp.Paren):
            e = e.this
        t = self.type_of(e)
        if isinstance(e, exp.Column):
            return self.table.column(e.name)
        if isinstance(e, (exp.Literal, exp.Boolean, exp.Null)):
            return self._literal(e, t)
        if isinstance(e, exp.Cast):
            return self._cast(e, t)
        if type(e) in _ARITHMETIC:
            return self._arithmetic(_ARITHMETIC[type(e)], e.this, e.expression, t)
        if isinstance(e, exp.Neg):
            return self._negate(e.this, t)
        if type(e) in _COMPARISONS:
            return self._compare(_COMPARISONS[type(e)], e.this, e.expression)
        if isinstance(e, exp.NullSafeEQ):
            both_null = pc.and_(pc.is_null(self(e.this)), pc.is_null(self(e.expression)))
            equal = pc.fill_null(self._compare("equal", e.this, e.expression), False)
            return pc.or_(both_null, equal)
        if isinstance(e, exp.And):
            return pc.and_kleene(self(e.this), self(e.expression))
        if isinstance(e, exp.Or):
            return pc.or_kleene(self(e.this), self(e.expression))
        if isinstance(e, exp.Not):
            return pc.invert(self(e.this))
        if isinstance(e, exp.Is):
            if not isinstance(e.expression, exp.Null):
                raise NotOnDriver("IS TRUE/FALSE is computed by Spark")
            return pc.is_null(self(e.this))
        if isinstance(e, exp.In):
            return self._in(e)
        if isinstance(e, exp.Between):
            low = self._compare("greater_equal", e.this, e.args["low"])
            return pc.and_kleene(low, self._compare("less_equal", e.this, e.args["high"]))
        if isinstance(e, exp.Case):
            return self._case(e, t)
        if isinstance(e, (exp.Upper, exp.Lower)):
            return self._case_map(e, t)
        if isinstance(e, exp.Substring):
            return self._substring(e, t)
        if isinstance(e, exp.Length):
            if not isinstance(self.type_of(e.this), T.StringType):
                raise NotOnDriver("length of binary is computed by Spark")
            return pc.utf8_length(self(e.this))
        if isinstance(e, exp.Concat):
            parts = e.expressions
            if not all(isinstance(self.type_of(p), T.StringType) for p in parts):
                raise NotOnDriver("concat of non-strings is computed by Spark")
            return pc.binary_join_element_wise(*[self(p) for p in parts], "")
        if isinstance(e, exp.Coalesce):
            parts = [e.this, *e.expressions]
            return pc.coalesce(*[_convert(self(p), self.type_of(p), t) for p in parts])
        raise NotOnDriver(f"{type(e).__name__} is computed by Spark")

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
        if isinstance(t, T.DecimalType):
            try:
                exact = getattr(pc, op)(_decimal(a, lt), _decimal(b, rt))
                if op == "multiply":
                    # Spark multiplies in at most 38 digits: beyond that it would truncate first.
                    exact.cast(pa.decimal256(38, exact.type.scale))
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise NotOnDriver(f"{op} past 38 digits is computed by Spark") from err
            return _fit_decimal(exact, t)
        if type(t) in _INTEGRAL_DIGITS:
            try:
                return getattr(pc, f"{op}_checked")(_convert(a, lt, t), _convert(b, rt, t))
            except pa.ArrowInvalid as err:  # overflow: Spark raises, or wraps without ANSI
                raise NotOnDriver(f"{op} overflows {t.simpleString()}") from err
        raise NotOnDriver(f"{t.simpleString()} arithmetic is computed by Spark")

    def _negate(self, operand: exp.Expression, t: T.DataType) -> Value:
        v, source = self(operand), self.type_of(operand)
        if isinstance(t, T.DecimalType):
            return _fit_decimal(pc.negate(_decimal(v, source)), t)
        if type(t) in _INTEGRAL_DIGITS:
            try:
                return pc.negate_checked(_convert(v, source, t))
            except pa.ArrowInvalid as err:
                raise NotOnDriver(f"negation overflows {t.simpleString()}") from err
        raise NotOnDriver(f"{t.simpleString()} negation is computed by Spark")

    def _comparable(
        self, left: exp.Expression, right: exp.Expression
    ) -> tuple[Value, Value] | None:
        """Both sides in types Arrow compares as Spark does; None if one is a NULL literal."""
        lt, rt = self.type_of(left), self.type_of(right)
        a, b = self(left), self(right)
        if isinstance(lt, T.NullType) or isinstance(rt, T.NullType):
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
        if e.args.get("query") or e.args.get("unnest") or e.args.get("field"):
            raise NotOnDriver("IN (subquery) is computed by Spark")
        result: Value | None = None
        for item in e.expressions:
            hit = self._compare("equal", e.this, item)
            result = hit if result is None else pc.or_kleene(result, hit)
        if result is None:
            raise NotOnDriver("an empty IN list is Spark's")
        return result

    def _case(self, e: exp.Case, t: T.DataType) -> Value:
        if e.this is not None:
            raise NotOnDriver("CASE x WHEN ... is computed by Spark")
        n = self.table.num_rows
        conditions, values = [], []
        for branch in e.args["ifs"]:
            conditions.append(pc.fill_null(_broadcast(self(branch.this), n), False))
            value = branch.args["true"]
            values.append(_broadcast(_convert(self(value), self.type_of(value), t), n))
        default = e.args.get("default")
        if default is not None:
            values.append(_broadcast(_convert(self(default), self.type_of(default), t), n))
        else:
            values.append(pa.nulls(n, arrow_type(t)))
        names = [f"c{i}" for i in range(len(conditions))]
        return pc.case_when(pa.StructArray.from_arrays(conditions, names=names), *values)

    def _case_map(self, e: exp.Upper | exp.Lower, t: T.DataType) -> Value:
        if not isinstance(t, T.StringType):
            raise NotOnDriver("case mapping of a non-string is Spark's")
        v = self(e.this)
        if not _all_ascii(v):  # Java's and Arrow's Unicode case tables may differ
            raise NotOnDriver("case mapping of non-ASCII text is computed by Spark")
        return pc.ascii_upper(v) if isinstance(e, exp.Upper) else pc.ascii_lower(v)

    def _substring(self, e: exp.Substring, t: T.DataType) -> Value:
        start, length = e.args.get("start"), e.args.get("length")
        if not isinstance(t, T.StringType) or not (
            isinstance(start, exp.Literal) and not start.is_string
        ):
            raise NotOnDriver("substr with a computed start is Spark's")
        pos = int(start.this)
        count = None
        if length is not None:
            if not (isinstance(length, exp.Literal) and not length.is_string):
                raise NotOnDriver("substr with a computed length is Spark's")
            count = int(length.this)
        if pos < 1 or (count is not None and count < 0):
            raise NotOnDriver("substr from the end is computed by Spark")
        v = self(e.this)
        if not _all_ascii(v):  # code units are characters only in ASCII
            raise NotOnDriver("substr of non-ASCII text is computed by Spark")
        stop = None if count is None else pos - 1 + count
        return pc.utf8_slice_codeunits(v, start=pos - 1, stop=stop)


JoinRenderer = Callable[[Join, Mapping[str, pa.Table]], pa.Table]
StatefulRenderer = Callable[[Reduce | TopK, pa.Table], pa.Table]


def render_local(
    spark,
    node: Node,
    inputs: Mapping[str, pa.Table],
    join: JoinRenderer | None = None,
    stateful: StatefulRenderer | None = None,
) -> pa.Table:
    """The updates of ``node`` given every collection's updates as Arrow
    ``(columns..., _time, _diff)``: :func:`ops.stateless.render`'s result, computed by the
    driver (``join``: how to render a join, :func:`join_delta_local`; ``stateful``: a GROUP
    BY or a TopK given its input's updates, :mod:`ops.local_reduce`). Raises
    :class:`~ivm.errors.NotOnDriver` for what Spark must compute."""
    if isinstance(node, Join) and join is not None:
        return join(node, inputs)
    if isinstance(node, (Reduce, TopK)) and stateful is not None:
        return stateful(node, render_local(spark, node.input, inputs, join, stateful))
    if isinstance(node, Get):
        return inputs[node.collection].select([*node.columns, TIME, DIFF])
    if isinstance(node, Filter):
        table = render_local(spark, node.input, inputs, join, stateful)
        return _filtered(spark, table, node.predicate)
    if isinstance(node, Project):
        table = render_local(spark, node.input, inputs, join, stateful)
        return _projected(spark, table, node.outputs)
    if isinstance(node, UnionAll):
        names = [*node.columns, TIME, DIFF]
        parts = [
            render_local(spark, b, inputs, join, stateful)
            .select([*b.columns, TIME, DIFF])
            .rename_columns(names)
            for b in node.branches
        ]
        if any(p.schema != parts[0].schema for p in parts[1:]):
            parts = _widened(parts)
        return pa.concat_tables(parts)
    raise NotOnDriver(f"{type(node).__name__} is computed by Spark")


def _filtered(spark, table: pa.Table, predicate: exp.Expression | None) -> pa.Table:
    if predicate is None:
        return table
    return table.filter(Evaluator(spark, table, [predicate]).mask(predicate))


def _projected(spark, table: pa.Table, outputs: Sequence[tuple[str, exp.Expression]]) -> pa.Table:
    """``(outputs..., _time, _diff)``: each update's data mapped, its time and diff kept."""
    ev = Evaluator(spark, table, [e for _, e in outputs])
    return pa.Table.from_arrays(
        [*(ev.column(e) for _, e in outputs), table.column(TIME), table.column(DIFF)],
        names=[*(name for name, _ in outputs), TIME, DIFF],
    )


def prepare_local(spark, inp: JoinInput, table: pa.Table) -> pa.Table:
    """:func:`ops.join.prepare` by the driver: a join input's own filter and map."""
    return _projected(spark, _filtered(spark, table, inp.predicate), inp.outputs)


LookupArrow = Callable[[LookupStage, pa.Table, int, Collection[str]], pa.Table]
"""``(stage, keys, as_of, columns) -> (key and columns..., _diff)``: the stage's arrangement
at ``as_of`` for ``keys`` (named as its key), summed; raises NotOnDriver when the driver
cannot read it."""

_RIGHT_DIFF = "_diff_right"


def _at(table: pa.Table, time: int) -> pa.Table:
    """``table`` with every update at ``time`` (``_time`` before ``_diff``)."""
    if TIME in table.column_names:
        table = table.drop_columns([TIME])
    times = pa.repeat(pa.scalar(time, pa.int64()), table.num_rows)
    return table.add_column(table.column_names.index(DIFF), TIME, times)


def _join_stage_local(spark, stream: pa.Table, right: pa.Table, stage: LookupStage) -> pa.Table:
    """One stage of a delta path: the stream joined with the rows looked up, diffs
    multiplied, then the residual predicates that stage can check."""
    right = right.drop_columns([TIME])
    right = right.rename_columns([_RIGHT_DIFF if c == DIFF else c for c in right.column_names])
    for s, r in zip(stage.stream_keys, stage.input_keys, strict=True):
        if stream.schema.field(s).type != right.schema.field(r).type:
            raise NotOnDriver(f"join keys {s} and {r} differ in type: Spark casts them")
    try:
        out = stream.join(
            right,
            keys=list(stage.stream_keys),
            right_keys=list(stage.input_keys),
            join_type="inner",
            coalesce_keys=False,
            use_threads=False,
        )
        diff = pc.multiply_checked(out.column(DIFF), out.column(_RIGHT_DIFF))
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
        raise NotOnDriver(f"a join stage Arrow cannot compute: {err}") from err
    out = out.drop_columns([DIFF, _RIGHT_DIFF]).append_column(DIFF, diff)
    for r in stage.residual:
        out = _filtered(spark, out, r)
    return out


def join_delta_local(
    spark,
    join: Join,
    deltas: Mapping[str, pa.Table],
    lookup: LookupArrow,
    *,
    old: int,
    new: int,
    unchanged: Collection[str] = (),
) -> pa.Table:
    """:func:`ops.join.render_join_delta` of an inner join, computed by the driver: the same
    delta paths advanced together, stages reading one arrangement at one time sharing one
    lookup, diffs multiplied, every update at ``new``. Outer and semi-joins are Spark's."""
    if isinstance(join, SemiJoin) or join.preserve:
        raise NotOnDriver("outer and semi-joins are computed by Spark")
    paths = [p for p in plan_paths(join) if join.inputs[p.source].get.collection not in unchanged]
    if not paths:
        raise NotOnDriver("no input of the join changed")
    streams = []
    for path in paths:
        inp = join.inputs[path.source]
        streams.append(_at(prepare_local(spark, inp, deltas[inp.get.collection]), new))
    for depth in range(len(join.inputs) - 1):
        for (arrangement, at), users in shared_lookups(paths, depth, old, new).items():
            keys = pa.concat_tables(
                [
                    streams[i]
                    .select(list(paths[i].stages[depth].stream_keys))
                    .rename_columns(list(arrangement.key))
                    for i in users
                ],
                promote_options="permissive",
            )
            read = {c for i in users for c in join.inputs[paths[i].stages[depth].input].get.columns}
            state = _at(lookup(paths[users[0]].stages[depth], keys, at, read), new)
            for i in users:
                stage = paths[i].stages[depth]
                right = prepare_local(spark, join.inputs[stage.input], state)
                streams[i] = _join_stage_local(spark, streams[i], right, stage)
    return pa.concat_tables([s.select([*join.columns, TIME, DIFF]) for s in streams])


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


def on_driver(node: Node) -> bool:
    """Whether the driver may compute ``node``'s updates: it is made of Get, Filter, Project,
    UnionAll, inner joins, GROUP BY and TopK only (whose expressions or aggregates may still
    be Spark's: NotOnDriver)."""
    if isinstance(node, Join):
        return not node.preserve
    return isinstance(node, (Get, Filter, Project, UnionAll, Reduce, TopK)) and all(
        on_driver(c) for c in node.inputs
    )
