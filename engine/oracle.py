"""The independent oracles: every view evaluated from scratch, compared as multisets under
stated rules.

Owns the from-scratch side of verification and the comparison itself. DuckDB (not Spark, not
our planner) evaluates the view's own SQL, transpiled by sqlglot from Spark's dialect, over
the sources' contents at the versions of an epoch, read with delta-rs (:func:`compare_views`).
Spark's from-scratch evaluation (``Engine.from_scratch``) is the second oracle
(:func:`spark_compare_views`); ``Engine.verify`` compares with it at scale, inside Spark, under
the same rules (:func:`tolerant_differences`). Used by the demo, the tests, ``ivm verify``
and the bench.

Contract in ``(data, time, diff)`` terms: ``expected(e)`` is the view's collection at epoch
``e`` computed with no updates at all; the engine is correct when its readable table, and the
sum of its diff log up to ``e``, equal it as multisets under these rules, column by column
(:class:`ColumnRule`, each stated in :meth:`Comparison.describe`):

- every column that is not floating point is compared exactly: integers, strings, dates,
  booleans by value, decimals by value at the engine's type (Spark's). Where DuckDB's decimal
  has a larger scale than the engine's, DuckDB's value is rounded half up to the engine's
  scale first, as Spark rounds; where the two types are of different kinds (say a string and
  a number), the values are compared as typed text and never equal (NULLs excepted);
- a floating-point column (the engine's DOUBLE; DuckDB's value cast to DOUBLE) is equal within
  :data:`FLOAT_RELATIVE` of the larger magnitude, and at least :data:`FLOAT_ABSOLUTE` near zero
  (:data:`FLOAT32_RELATIVE` for the engine's FLOAT); NaN equals NaN, infinities only
  themselves, -0.0 equals 0.0, NULL only NULL;
- where DuckDB gives a DOUBLE and the engine a DECIMAL(p, s) (DuckDB's AVG or ``/`` over
  decimals, where Spark keeps a decimal), the two are equal when ``|double - decimal|`` is at
  most half a unit of the last place ``10^-s / 2`` plus the double's own rounding,
  ``2^-52 * |double|``.

Rows are matched as multisets: grouped by their exact columns, the rows of a group are paired
in the order of their floating-point columns. Every rule is decided exactly (rationals): SQL
decides in double arithmetic, with a margin, the pairs that are surely equal; the groups with
any other pair (up to :data:`SETTLE_ROWS` rows) are matched again in Python, exactly, as a
largest matching of equal rows. A table whose columns are all exact is compared by
``EXCEPT ALL``.
"""

from __future__ import annotations

import math
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from typing import Any, Literal, Protocol

import duckdb
import pyarrow as pa

from ivm.errors import IvmError
from ivm.sql.parse import parse_view
from resources.lake import open_table, snapshot_rows

MEMORY_LIMIT = "4GB"
"""DuckDB's memory cap here (its default is 80% of the machine): past it, it spills to disk.
The sources are scanned as datasets, never loaded whole into the Python process."""

FLOAT_RELATIVE = Decimal("1e-9")
"""Two DOUBLEs are equal when they differ by at most this share of the larger magnitude..."""

FLOAT32_RELATIVE = Decimal("1e-6")
"""... or this share for the engine's FLOAT (32-bit: 24 bits of mantissa) columns..."""

FLOAT_ABSOLUTE = Decimal("1e-12")
"""... or by at most this much, for values near zero (a sum that cancels to about zero)."""

DOUBLE_ROUNDING = Fraction(1, 2**52)
"""A double's own rounding, relative to its magnitude: allowed on top of half a unit of the
last place when DuckDB's DOUBLE stands for the engine's DECIMAL."""

SQL_MARGIN = Decimal("1e-12")
"""The share of a tolerance by which SQL's double arithmetic may misjudge it: a pair SQL finds
within the tolerance less this margin is surely equal; every other pair is decided exactly."""

SETTLE_ROWS = 200_000
"""Most rows (both sides) of the groups that hold a difference fetched to be matched exactly
in Python; past it, the rank pairing's verdicts stand (pairs SQL could not decide still
decided exactly, up to this many) and the comparison says so."""

MATCH_ROWS = 500
"""Largest group (rows a side) matched by augmenting paths when it has two or more
floating-point columns; a larger one is paired in sorted order."""

RuleKind = Literal["exact", "rounded", "text", "float", "decimal"]


@dataclass(frozen=True)
class ColumnRule:
    """How one column is compared.

    Attributes:
        column: the engine's column name.
        kind: ``exact`` (by value), ``rounded`` (DuckDB's decimal rounded to ``scale``, then
            exact), ``text`` (types of different kinds: typed text), ``float`` (relative
            tolerance ``relative``, absolute floor :data:`FLOAT_ABSOLUTE`), ``decimal``
            (DuckDB's double against the engine's decimal of scale ``scale``).
        expected_type: the oracle's type; ``actual_type``: the engine's.
    """

    column: str
    kind: RuleKind
    expected_type: pa.DataType
    actual_type: pa.DataType
    scale: int = 0
    relative: Decimal = FLOAT_RELATIVE

    @property
    def tolerant(self) -> bool:
        return self.kind in ("float", "decimal")

    def describe(self, oracle: str = "DuckDB") -> str | None:
        """The rule in words; None for an exact comparison of one type."""
        e, a = _type_name(self.expected_type), _type_name(self.actual_type)
        if self.kind == "exact":
            return None
        if self.kind == "rounded":
            return (
                f"{self.column}: {oracle}'s {e} rounded half up to the engine's scale "
                f"{self.scale} ({a}), then exact"
            )
        if self.kind == "text":
            return (
                f"{self.column}: types differ ({oracle} {e}, engine {a}): compared as typed "
                "text, never equal but for NULLs"
            )
        if self.kind == "decimal":
            return (
                f"{self.column}: {oracle}'s {e} against the engine's {a}: equal within half a "
                f"unit of scale {self.scale} (5E-{self.scale + 1}) plus 2^-52 of the double's "
                "magnitude"
            )
        cast = "" if _is_float(self.expected_type) else f" ({oracle}'s {e} cast to DOUBLE)"
        return (
            f"{self.column}: {a} within {self.relative} relative, {FLOAT_ABSOLUTE} absolute "
            f"near zero{cast}; NaN = NaN, infinities exact, -0.0 = 0.0"
        )


def _type_name(t: pa.DataType) -> str:
    if pa.types.is_decimal(t):
        return f"DECIMAL({t.precision},{t.scale})"
    if pa.types.is_float64(t):
        return "DOUBLE"
    if pa.types.is_float32(t):
        return "FLOAT"
    return str(t)


def _is_float(t: pa.DataType) -> bool:
    return pa.types.is_floating(t)


def _family(t: pa.DataType) -> str:
    """Types whose values DuckDB and Python compare by value with each other."""
    if pa.types.is_integer(t) or pa.types.is_decimal(t):
        return "number"
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return "binary"
    return str(t)


def _kind(t: pa.DataType) -> str:
    """Types :func:`align_types` may cast into each other when no value changes."""
    if pa.types.is_date(t) or pa.types.is_timestamp(t):
        return "time"
    return _family(t)


def column_rules(expected: pa.Schema, actual: pa.Schema) -> list[ColumnRule]:
    """The rule of each column (by position; names are the engine's), for the oracle's
    ``expected`` types (after :func:`align_types`) against the engine's ``actual`` ones."""
    rules = []
    for e_field, a_field in zip(expected, actual, strict=True):
        e, a = e_field.type, a_field.type
        name = a_field.name
        if pa.types.is_float32(a):
            rules.append(ColumnRule(name, "float", e, a, relative=FLOAT32_RELATIVE))
        elif _is_float(a):
            kind: RuleKind = "float" if _is_float(e) or _family(e) == "number" else "text"
            rules.append(ColumnRule(name, kind, e, a))
        elif _is_float(e) and pa.types.is_decimal(a):
            rules.append(ColumnRule(name, "decimal", e, a, scale=a.scale))
        elif _is_float(e) and pa.types.is_integer(a):
            rules.append(ColumnRule(name, "exact", e, a))  # equal only to a whole double
        elif pa.types.is_decimal(e) and pa.types.is_decimal(a) and e.scale > a.scale:
            rules.append(ColumnRule(name, "rounded", e, a, scale=a.scale))
        elif e == a or _family(e) == _family(a):
            rules.append(ColumnRule(name, "exact", e, a))
        else:
            rules.append(ColumnRule(name, "text", e, a))
    return rules


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    return con


def _canonical(value: Any) -> Any:
    """A value as a multiset key: every NaN is one NaN (``math.nan``: equal to itself as a
    dict key), -0.0 is 0.0; everything else as it is (no rounding)."""
    if isinstance(value, float):
        if math.isnan(value):
            return math.nan
        if value == 0.0:
            return 0.0
    return value


def multiset(rows: Iterable[Sequence[Any]]) -> Counter:
    """Rows as a multiset of tuples, values exact (NaNs one key, -0.0 as 0.0)."""
    return Counter(tuple(_canonical(v) for v in row) for row in rows)


def table_multiset(table: pa.Table) -> Counter:
    return multiset(tuple(r.values()) for r in table.to_pylist())


@dataclass
class Comparison:
    """The outcome of comparing one view with a from-scratch evaluation of it.

    ``tolerances`` states each column not compared exactly, and how; ``notes`` anything else
    the comparison did (a large difference not matched exactly, a table behind its log).
    ``log_missing``/``log_extra``/``negative``: the view's diff log summed up to ``epoch``
    against its table, when that was checked (``compare_views(log=True)``).
    """

    view: str
    epoch: int
    expected_rows: int
    actual_rows: int
    missing: Counter  # in the oracle, not in the view
    extra: Counter  # in the view, not in the oracle
    tolerances: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    oracle: str = "DuckDB"
    log_missing: int = 0
    log_extra: int = 0
    negative: int = 0
    behind: bool = False

    @property
    def equal(self) -> bool:
        return not (
            self.missing
            or self.extra
            or self.log_missing
            or self.log_extra
            or self.negative
            or self.behind
        )

    def describe(self, limit: int = 3) -> str:
        rules = f"; compared: {'; '.join(self.tolerances)}" if self.tolerances else ""
        notes = f"; {'; '.join(self.notes)}" if self.notes else ""
        if self.equal:
            return (
                f"{self.view}: equal to {self.oracle}'s result ({self.actual_rows} rows at "
                f"epoch {self.epoch}){rules}{notes}"
            )
        parts = [
            f"{sum(self.missing.values())} rows missing (e.g. {list(self.missing)[:limit]})",
            f"{sum(self.extra.values())} extra (e.g. {list(self.extra)[:limit]})",
        ]
        if self.log_missing or self.log_extra:
            parts.append(
                f"its log summed differs from its table: {self.log_missing} rows only in the "
                f"table, {self.log_extra} only in the log"
            )
        if self.negative:
            parts.append(f"{self.negative} negative multiplicities in its log")
        if self.behind:
            parts.append("its table is behind its log: refresh")
        return (
            f"{self.view}: DIFFERENT from {self.oracle}'s result at epoch {self.epoch}: "
            f"{', '.join(parts)}{rules}{notes}"
        )

    def as_dict(self, limit: int = 3) -> dict[str, Any]:
        return {
            "view": self.view,
            "epoch": self.epoch,
            "oracle": self.oracle,
            "ok": self.equal,
            "expected_rows": self.expected_rows,
            "actual_rows": self.actual_rows,
            "missing": sum(self.missing.values()),
            "extra": sum(self.extra.values()),
            "log_missing": self.log_missing,
            "log_extra": self.log_extra,
            "negative": self.negative,
            "behind": self.behind,
            "examples": [f"missing {r}" for r in list(self.missing)[:limit]]
            + [f"extra {r}" for r in list(self.extra)[:limit]],
            "tolerances": list(self.tolerances),
            "notes": list(self.notes),
        }


def _dataset(dt: Any) -> Any:
    """A Delta snapshot as a pyarrow dataset DuckDB scans file by file, reading only the
    columns it needs. Strings are read as ``string_view``: DuckDB pushes its filters down
    with ``string_view`` constants, which pyarrow cannot compare with ``string`` columns."""
    base = dt.to_pyarrow_dataset()
    schema = pa.schema(
        [
            f.with_type(pa.string_view())
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type)
            else f
            for f in base.schema
        ]
    )
    return dt.to_pyarrow_dataset(schema=schema)


def duckdb_evaluate(engine: Any, epoch: int | None = None) -> dict[str, pa.Table]:
    """Evaluate every view of ``engine``'s project with DuckDB at ``epoch`` (default: latest).

    Args:
        engine: an :class:`engine.facade.Engine`.
        epoch: whose source versions to read.
    """
    epochs = {e.epoch: e for e in engine.epochs()}
    if not epochs:
        raise IvmError("no epoch minted yet: nothing to compare")
    record = epochs[epoch if epoch is not None else max(epochs)]
    con = _connect()
    try:
        for name, source in engine.sources.items():
            version = record.ranges[name][1]
            dt = open_table(source.uri, version)
            if dt is None:
                raise IvmError(f"source {name!r}: no table at {source.uri}")
            features = set(dt.protocol().reader_features or [])
            scanned = "deletionVectors" in features or source.column_mapping(version)
            con.register(f"__src_{name}", snapshot_rows(dt) if scanned else _dataset(dt))
            valid = engine.contract_predicate(name, "duckdb")  # a contract's valid rows
            where = f" WHERE {valid}" if valid else ""
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "__src_{name}"{where}')
        out: dict[str, pa.Table] = {}
        for name, view in engine.plan.views.items():
            query = parse_view(view.sql, view.file).query
            con.execute(f'CREATE VIEW "{name}" AS {query.sql(dialect="duckdb")}')
            out[name] = con.sql(f'SELECT * FROM "{name}"').to_arrow_table()
        return out
    finally:
        con.close()


def align_types(expected: pa.Table, actual: pa.Table) -> pa.Table:
    """Cast the oracle's columns to the engine's types where that loses nothing.

    sqlglot's Spark -> DuckDB translation sometimes widens a type (``date_add`` gives a
    TIMESTAMP in DuckDB, a DATE in Spark); a *safe* cast undoes that and fails (leaving the
    column as it was, for :func:`column_rules` to compare it as it is) whenever a value would
    change. Only types of one kind are cast (numbers, strings, dates and timestamps, ...): a
    string is not a number. Floating-point columns on either side are never cast here: a
    double is not a decimal (see ``decimal`` in :class:`ColumnRule`).
    """
    columns = []
    for i, target in enumerate(actual.schema):
        col = expected.column(i)
        if (
            col.type != target.type
            and not (_is_float(col.type) or _is_float(target.type))
            and _kind(col.type) == _kind(target.type)
        ):
            try:
                col = col.cast(target.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        columns.append(col)
    return pa.table(columns, names=actual.column_names)


@dataclass
class TableDifferences:
    """``expected - actual`` and ``actual - expected`` under ``rules`` (see the module).

    ``missing_rows``/``extra_rows`` count them (more than the Counters hold when only counted
    in SQL: a Spark comparison), ``notes`` say what was not matched exactly."""

    missing: Counter
    extra: Counter
    rules: list[ColumnRule]
    missing_rows: int = 0
    extra_rows: int = 0
    notes: list[str] = field(default_factory=list)

    def tolerances(self, oracle: str = "DuckDB") -> tuple[str, ...]:
        return tuple(d for r in self.rules if (d := r.describe(oracle)) is not None)


def multiset_differences(expected: pa.Table, actual: pa.Table) -> tuple[Counter, Counter]:
    """``(expected - actual, actual - expected)`` as multisets, under the module's rules."""
    diff = table_differences(expected, actual)
    return diff.missing, diff.extra


def table_differences(expected: pa.Table, actual: pa.Table) -> TableDifferences:
    """Compare the oracle's rows with the engine's (columns by position, the engine's names).

    Tables whose columns are all compared exactly go through DuckDB's ``EXCEPT ALL`` (only
    the differences reach Python); others through :func:`tolerant_differences` on DuckDB."""
    if expected.num_columns != actual.num_columns:
        want, got = table_multiset(expected), table_multiset(actual)
        note = (
            f"columns differ: the oracle's ({', '.join(expected.column_names)}), the "
            f"engine's ({', '.join(actual.column_names)})"
        )
        return TableDifferences(want, got, [], want.total(), got.total(), [note])
    expected = align_types(expected, actual)
    rules = column_rules(expected.schema, actual.schema)
    con = _connect()
    try:
        backend = _DuckDB(con)
        e_name, a_name = backend.register(expected), backend.register(actual)
        if not any(r.tolerant for r in rules):
            e_cols = _projection(backend, rules, expected.column_names, "expected")
            a_cols = _projection(backend, rules, actual.column_names, "actual")

            def minus(a: str, a_cols: str, b: str, b_cols: str) -> Counter:
                query = f"SELECT {a_cols} FROM {a} EXCEPT ALL SELECT {b_cols} FROM {b}"
                return multiset(con.sql(query).fetchall())

            missing = minus(e_name, e_cols, a_name, a_cols)
            extra = minus(a_name, a_cols, e_name, e_cols)
            return TableDifferences(missing, extra, rules, missing.total(), extra.total())
        return tolerant_differences(
            backend, e_name, expected.column_names, a_name, actual.column_names, rules
        )
    finally:
        con.close()


# -- the tolerant comparison, in SQL (DuckDB or Spark) and Python ------------------------------


class SqlBackend(Protocol):
    """Where :func:`tolerant_differences` runs its SQL: DuckDB's or Spark's dialect."""

    string_type: str

    def quote(self, name: str) -> str: ...

    def view(self, sql: str) -> str:
        """A temporary view of ``sql``'s rows; its name."""
        ...

    def materialize(self, sql: str) -> str:
        """``sql``'s rows computed once and kept for the next queries; its name."""
        ...

    def rows(self, sql: str) -> list[tuple[Any, ...]]: ...


class _DuckDB:
    string_type = "VARCHAR"

    def __init__(self, con: duckdb.DuckDBPyConnection) -> None:
        self.con = con
        self._n = 0

    def _name(self) -> str:
        self._n += 1
        return f"__cmp_{self._n}"

    def quote(self, name: str) -> str:
        return '"' + name.replace('"', '""') + '"'

    def register(self, table: pa.Table) -> str:
        name = self._name()
        self.con.register(name, table)
        return name

    def view(self, sql: str) -> str:
        name = self._name()
        self.con.execute(f"CREATE TEMPORARY VIEW {name} AS {sql}")
        return name

    def materialize(self, sql: str) -> str:
        name = self._name()
        self.con.execute(f"CREATE TEMPORARY TABLE {name} AS {sql}")
        return name

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return self.con.sql(sql).fetchall()


class SparkBackend:
    """:class:`SqlBackend` on a Spark session: temporary views, persisted DataFrames; call
    :meth:`close` to drop them."""

    string_type = "STRING"

    def __init__(self, spark: Any) -> None:
        self.spark = spark
        self._tag = uuid.uuid4().hex[:12]
        self._n = 0
        self._views: list[str] = []
        self._persisted: list[Any] = []

    def _name(self) -> str:
        self._n += 1
        name = f"__ivm_cmp_{self._tag}_{self._n}"
        self._views.append(name)
        return name

    def quote(self, name: str) -> str:
        return "`" + name.replace("`", "``") + "`"

    def register(self, df: Any) -> str:
        name = self._name()
        df.createOrReplaceTempView(name)
        return name

    def view(self, sql: str) -> str:
        return self.register(self.spark.sql(sql))

    def materialize(self, sql: str) -> str:
        df = self.spark.sql(sql).persist()
        self._persisted.append(df)
        return self.register(df)

    def rows(self, sql: str) -> list[tuple[Any, ...]]:
        return [tuple(r) for r in self.spark.sql(sql).collect()]

    def close(self) -> None:
        for df in self._persisted:
            df.unpersist()
        for name in self._views:
            self.spark.catalog.dropTempView(name)


def _projection(backend: SqlBackend, rules: list[ColumnRule], names: list[str], side: str) -> str:
    """The columns of one side as the comparison reads them, aliased ``c0, c1, ...``."""
    out = []
    for i, (rule, name) in enumerate(zip(rules, names, strict=True)):
        col = backend.quote(name)
        if rule.kind == "rounded" and side == "expected":
            col = f"round({col}, {rule.scale})"
        elif rule.kind == "text":
            col = f"typeof({col}) || ':' || CAST({col} AS {backend.string_type})"
        elif rule.kind == "float" or (rule.kind == "decimal" and side == "expected"):
            col = f"CAST({col} AS DOUBLE)"
        out.append(f"{col} AS c{i}")
    return ", ".join(out)


_INF = "CAST('Infinity' AS DOUBLE)"
_EPS = repr(float(DOUBLE_ROUNDING))  # 2^-52, exactly as a double literal
_LOW = repr(float(1 - SQL_MARGIN))
_HIGH = repr(float(1 + SQL_MARGIN))


def _sql_verdicts(rule: ColumnRule, e: str, a: str) -> tuple[str, str]:
    """SQL ``(surely equal, possibly equal)`` for one column of a pair, each TRUE or FALSE:
    double arithmetic with a margin for its own rounding (:data:`SQL_MARGIN`)."""
    both_null = f"({e} IS NULL AND {a} IS NULL)"
    if rule.kind == "float":
        finite = f"abs({e}) < {_INF} AND abs({a}) < {_INF}"
        tol = f"greatest({rule.relative} * greatest(abs({e}), abs({a})), {FLOAT_ABSOLUTE})"
        sure = f"coalesce({both_null} OR {e} = {a} OR ({finite} AND abs({e} - {a}) <= {tol} * {_LOW}), false)"
        near = f"coalesce({sure} OR ({finite} AND abs({e} - {a}) <= {tol} * {_HIGH}), false)"
        return sure, near
    # decimal: e is the oracle's double, a the engine's decimal. The true difference is
    # within c +- err of the computed one: the decimal's rounding to a double and the
    # subtraction's each cost at most 2^-53 of their magnitudes.
    ad = f"CAST({a} AS DOUBLE)"
    c = f"abs({e} - {ad})"
    err = f"{_EPS} * ({c} + abs({ad}))"
    tol = f"(5E-{rule.scale + 1} + {_EPS} * abs({e}))"
    finite = f"abs({e}) < {_INF}"
    sure = f"coalesce({both_null} OR ({finite} AND {c} + {err} <= {tol} * {_LOW}), false)"
    near = f"coalesce({sure} OR ({finite} AND {c} - {err} <= {tol} * {_HIGH}), false)"
    return sure, near


def _within(rule: ColumnRule, e: Any, a: Any) -> bool:
    """Whether ``e`` (the oracle's) and ``a`` (the engine's) are equal under ``rule``: exact
    rational arithmetic."""
    if e is None or a is None:
        return e is None and a is None
    if not rule.tolerant:
        return e == a
    if rule.kind == "decimal":
        if math.isnan(e) or math.isinf(e):
            return False
        diff = abs(Fraction(e) - Fraction(a))
        return diff <= Fraction(1, 2 * 10**rule.scale) + abs(Fraction(e)) * DOUBLE_ROUNDING
    if math.isnan(e) or math.isnan(a):
        return math.isnan(e) and math.isnan(a)
    if math.isinf(e) or math.isinf(a) or e == a:
        return e == a
    fe, fa = Fraction(e), Fraction(a)
    scale = max(abs(fe), abs(fa))
    return abs(fe - fa) <= max(Fraction(rule.relative) * scale, Fraction(FLOAT_ABSOLUTE))


def _order(value: Any) -> tuple[int, Any]:
    """A total order of a tolerant column's values, as SQL sorts them (NULLs last, NaN after
    every number)."""
    if value is None:
        return (2, 0)
    if isinstance(value, float) and math.isnan(value):
        return (1, 0)
    return (0, value)


def _match(
    rules: list[ColumnRule], tolerant: list[int], want: list[tuple], got: list[tuple]
) -> tuple[list[tuple], list[tuple]]:
    """The rows of one group (equal exact columns) left unmatched on each side by a largest
    matching of rows equal under ``rules``: a sorted sweep for one floating-point column
    (each value's equals are an interval whose ends grow with it, so the sweep is a largest
    matching), augmenting paths for more, up to :data:`MATCH_ROWS` a side; beyond that,
    rows paired in sorted order."""

    def key(row: tuple) -> tuple:
        return tuple(_order(row[i]) for i in tolerant)

    def equal(e: tuple, a: tuple) -> bool:
        return all(_within(rules[i], e[i], a[i]) for i in tolerant)

    want, got = sorted(want, key=key), sorted(got, key=key)
    if len(tolerant) == 1:
        (t,) = tolerant
        missing, extra, i, j = [], [], 0, 0
        while i < len(want) and j < len(got):
            if _within(rules[t], want[i][t], got[j][t]):
                i, j = i + 1, j + 1
            elif key(want[i]) < key(got[j]):  # nothing from got[j] on can equal want[i]
                missing.append(want[i])
                i += 1
            else:
                extra.append(got[j])
                j += 1
        return missing + want[i:], extra + got[j:]
    if max(len(want), len(got)) > MATCH_ROWS:
        pairs = list(zip(want, got, strict=False))
        missing = [e for e, a in pairs if not equal(e, a)] + want[len(pairs) :]
        extra = [a for e, a in pairs if not equal(e, a)] + got[len(pairs) :]
        return missing, extra
    edges = [[j for j, a in enumerate(got) if equal(e, a)] for e in want]
    owner: list[int | None] = [None] * len(got)

    def augment(i: int, seen: set[int]) -> bool:
        for j in edges[i]:
            if j not in seen:
                seen.add(j)
                k = owner[j]
                if k is None or augment(k, seen):
                    owner[j] = i
                    return True
        return False

    matched = {i for i in range(len(want)) if augment(i, set())}
    return (
        [e for i, e in enumerate(want) if i not in matched],
        [a for j, a in enumerate(got) if owner[j] is None],
    )


def tolerant_differences(
    backend: SqlBackend,
    expected: str,
    expected_names: list[str],
    actual: str,
    actual_names: list[str],
    rules: list[ColumnRule],
    *,
    collect: bool = True,
) -> TableDifferences:
    """The differences between two tables (registered in ``backend`` as ``expected`` and
    ``actual``) with at least one floating-point column, under ``rules``.

    Rows are grouped by the exact columns and paired by rank in the order of the tolerant
    ones (``row_number``, a full outer join): that is a largest matching for one tolerant
    column. SQL keeps the pairs it cannot call surely equal and the unpaired rows; the
    groups holding them (up to :data:`SETTLE_ROWS` rows) are fetched and matched exactly in
    Python (:func:`_match`). With ``collect`` False (Spark, a table of any size) the rows
    are counted in SQL and the Counters hold only what was fetched."""
    keys = [i for i, r in enumerate(rules) if not r.tolerant]
    tolerant = [i for i, r in enumerate(rules) if r.tolerant]
    e = backend.view(
        f"SELECT {_projection(backend, rules, expected_names, 'expected')} FROM {expected}"
    )
    a = backend.view(f"SELECT {_projection(backend, rules, actual_names, 'actual')} FROM {actual}")
    problems = _rank_pairing_problems(backend, rules, keys, tolerant, e, a)
    counts = backend.rows(
        f"SELECT count(e_rn), count(a_rn), count(CASE WHEN e_rn IS NOT NULL AND a_rn IS NOT "
        f"NULL AND near THEN 1 END) FROM {problems}"
    )[0]
    if counts[0] == 0 and counts[1] == 0:
        return TableDifferences(Counter(), Counter(), rules)
    in_groups, gid = _groups_that_differ(backend, problems, keys)
    sizes = backend.rows(
        f"SELECT (SELECT count(*) {in_groups(e)}), (SELECT count(*) {in_groups(a)})"
    )[0]
    if sizes[0] + sizes[1] <= SETTLE_ROWS:
        return _settle_groups(backend, rules, tolerant, e, a, in_groups, gid)
    note = (
        f"{sizes[0] + sizes[1]} rows in groups that differ, more than {SETTLE_ROWS}: paired "
        "by rank in sorted order, not matched again"
    )
    return _rank_verdicts(backend, rules, tolerant, problems, counts, note, collect=collect)


def _same_keys(keys: list[int], x: str, y: str, xp: str = "c", yp: str = "c") -> str:
    """SQL: rows ``x`` and ``y`` hold the same exact columns ``keys`` (NULL-safe)."""
    return " AND ".join(f"{x}.{xp}{k} IS NOT DISTINCT FROM {y}.{yp}{k}" for k in keys)


def _rank_pairing_problems(
    backend: SqlBackend,
    rules: list[ColumnRule],
    keys: list[int],
    tolerant: list[int],
    e: str,
    a: str,
) -> str:
    """The rank pairing's unpaired rows and pairs not surely equal, materialized; its name.

    Columns: ``e0..`` and ``a0..`` (the pair's rows), ``e_rn`` and ``a_rn`` (NULL on the side
    a row is missing from) and ``near`` (whether the pair may be equal)."""
    n = len(rules)
    partition = f"PARTITION BY {', '.join(f'c{k}' for k in keys)} " if keys else ""
    order = ", ".join(f"c{t} ASC NULLS LAST" for t in tolerant)

    def ranked(name: str) -> str:
        return f"SELECT *, row_number() OVER ({partition}ORDER BY {order}) AS rn FROM {name}"

    verdicts = [_sql_verdicts(rules[t], f"e{t}", f"a{t}") for t in tolerant]
    sure = " AND ".join(s for s, _ in verdicts)
    near = " AND ".join(p for _, p in verdicts)
    join_on = " AND ".join(filter(None, [_same_keys(keys, "er", "ar"), "er.rn = ar.rn"]))
    pairs = ", ".join(
        [f"er.c{i} AS e{i}" for i in range(n)] + [f"ar.c{i} AS a{i}" for i in range(n)]
    )
    return backend.materialize(
        f"SELECT *, {near} AS near FROM (SELECT {pairs}, er.rn AS e_rn, ar.rn AS a_rn "
        f"FROM ({ranked(e)}) er FULL OUTER JOIN ({ranked(a)}) ar ON {join_on}) p "
        f"WHERE e_rn IS NULL OR a_rn IS NULL OR NOT ({sure})"
    )


def _groups_that_differ(
    backend: SqlBackend, problems: str, keys: list[int]
) -> tuple[Callable[[str], str], str]:
    """A ``FROM`` clause of a side's rows in the groups holding a problem, and their group id."""
    if not keys:

        def whole(side: str) -> str:
            return f"FROM {side} s"

        return whole, "1"
    group_keys = ", ".join(f"CASE WHEN e_rn IS NULL THEN a{k} ELSE e{k} END AS k{k}" for k in keys)
    groups = backend.materialize(
        "SELECT *, dense_rank() OVER (ORDER BY "
        + ", ".join(f"k{k} ASC NULLS LAST" for k in keys)
        + f") AS gid FROM (SELECT DISTINCT {group_keys} FROM {problems}) g"
    )

    def in_groups(side: str) -> str:
        return f"FROM {side} s JOIN {groups} g ON {_same_keys(keys, 's', 'g', 'c', 'k')}"

    return in_groups, "g.gid"


def _settle_groups(
    backend: SqlBackend,
    rules: list[ColumnRule],
    tolerant: list[int],
    e: str,
    a: str,
    in_groups: Callable[[str], str],
    gid: str,
) -> TableDifferences:
    """Every row of the groups that differ fetched and matched exactly in Python, by group."""
    cols = ", ".join(f"s.c{i}" for i in range(len(rules)))
    by_group: dict[Any, tuple[list[tuple], list[tuple]]] = defaultdict(lambda: ([], []))
    for row in backend.rows(f"SELECT {gid}, {cols} {in_groups(e)}"):
        by_group[row[0]][0].append(row[1:])
    for row in backend.rows(f"SELECT {gid}, {cols} {in_groups(a)}"):
        by_group[row[0]][1].append(row[1:])
    missing: Counter = Counter()
    extra: Counter = Counter()
    for want, got in by_group.values():
        lost, gained = _match(rules, tolerant, want, got)
        missing.update(multiset(lost))
        extra.update(multiset(gained))
    return TableDifferences(missing, extra, rules, missing.total(), extra.total())


def _rank_verdicts(
    backend: SqlBackend,
    rules: list[ColumnRule],
    tolerant: list[int],
    problems: str,
    counts: tuple[Any, ...],
    note: str,
    *,
    collect: bool,
) -> TableDifferences:
    """Too many rows to match exactly: the rank pairing's verdicts, the undecided pairs decided
    exactly (up to :data:`SETTLE_ROWS` of them; beyond, counted as different)."""
    n = len(rules)
    e_cols = ", ".join(f"e{i}" for i in range(n))
    a_cols = ", ".join(f"a{i}" for i in range(n))
    missing: Counter = Counter()
    extra: Counter = Counter()
    undecided = backend.rows(
        f"SELECT {e_cols}, {a_cols} FROM {problems} WHERE e_rn IS NOT NULL AND a_rn IS NOT "
        f"NULL AND near LIMIT {SETTLE_ROWS}"
    )
    settled = 0
    for row in undecided:
        want, got = row[:n], row[n:]
        if all(_within(rules[t], want[t], got[t]) for t in tolerant):
            settled += 1
        else:
            missing[tuple(_canonical(v) for v in want)] += 1
            extra[tuple(_canonical(v) for v in got)] += 1
    if collect:
        for row in backend.rows(
            f"SELECT {e_cols}, {a_cols}, e_rn, a_rn FROM {problems} WHERE e_rn IS NULL OR "
            "a_rn IS NULL OR NOT near"
        ):
            if row[2 * n] is not None:
                missing[tuple(_canonical(v) for v in row[:n])] += 1
            if row[2 * n + 1] is not None:
                extra[tuple(_canonical(v) for v in row[n : 2 * n])] += 1
    return TableDifferences(missing, extra, rules, counts[0] - settled, counts[1] - settled, [note])


# -- comparing views ---------------------------------------------------------------------------


def compare_views(
    engine: Any, views: Iterable[str] | None = None, *, log: bool = False
) -> list[Comparison]:
    """Compare each view's readable table with DuckDB at the view's epoch; with ``log``, also
    its diff log summed up to that epoch with its table (:func:`log_differences`). By default
    the project's views: an internal view's SQL (a decorrelated subquery) may round a decimal
    twice where DuckDB's doubles do not (``0.2 * avg(d)``); Spark's oracle
    (:func:`spark_compare_views`) compares internal views too, exactly."""
    names = list(views) if views is not None else list(engine.plan.project_views)
    by_epoch: dict[int, dict[str, pa.Table]] = {}
    results = []
    for name in names:
        status = engine.view_status(name)
        epoch = status.table_epoch
        if epoch == 0:
            raise IvmError(f"view {name!r} has not been materialized yet: nothing to compare")
        if epoch not in by_epoch:
            by_epoch[epoch] = duckdb_evaluate(engine, epoch)
        actual = engine.read_view(name)
        expected = by_epoch[epoch][name]
        diff = table_differences(expected, actual)
        c = _comparison(name, epoch, expected.num_rows, actual.num_rows, diff, "DuckDB")
        if log:
            c.log_missing, c.log_extra, c.negative = log_differences(engine, name, epoch)
            c.behind = status.log_epoch != epoch
        results.append(c)
    return results


def spark_compare_views(engine: Any, views: Iterable[str] | None = None) -> list[Comparison]:
    """Compare each view's readable table with Spark's from-scratch evaluation of its SQL at
    the view's epoch (:meth:`engine.facade.Engine.from_scratch`: sources at that epoch's
    versions, upstream views' contents), under the same rules as :func:`compare_views`: the
    result is collected to the driver (as Arrow) and compared there."""
    names = list(views) if views is not None else list(engine.plan.order)
    results = []
    for name in names:
        epoch = engine.view_status(name).table_epoch
        if epoch == 0:
            raise IvmError(f"view {name!r} has not been materialized yet: nothing to compare")
        with engine.job_group(f"compare {name}", f"ivm: compare view {name} with Spark"):
            expected = engine.from_scratch(name, epoch).toArrow()
        actual = engine.read_view(name)
        diff = table_differences(expected, actual)
        results.append(_comparison(name, epoch, expected.num_rows, actual.num_rows, diff, "Spark"))
    return results


def _comparison(
    name: str, epoch: int, expected_rows: int, actual_rows: int, diff: TableDifferences, oracle: str
) -> Comparison:
    return Comparison(
        name,
        epoch,
        expected_rows,
        actual_rows,
        diff.missing,
        diff.extra,
        tolerances=diff.tolerances(oracle),
        notes=tuple(diff.notes),
        oracle=oracle,
    )


def log_differences(engine: Any, view: str, upto: int) -> tuple[int, int, int]:
    """A view's diff log summed up to ``upto`` against its readable table, exactly, in
    DuckDB: ``(rows only in the table, rows only in the log, rows whose sum is negative)``."""
    log_dt = open_table(engine.layout.view_log(view))
    table = engine.read_view(view)
    if log_dt is None:
        return table.num_rows, 0, 0
    log = log_dt.to_pyarrow_dataset()
    con = _connect()
    try:
        backend = _DuckDB(con)
        log_name, table_name = backend.register(log), backend.register(table)
        cols = ", ".join(backend.quote(c) for c in table.column_names)
        summed = backend.materialize(
            f"SELECT {cols}, CAST(sum(_diff) AS BIGINT) AS __n FROM {log_name} "
            f"WHERE _time <= {int(upto)} "
            "GROUP BY ALL"
        )
        rows = backend.view(
            f"SELECT {cols} FROM (SELECT *, unnest(range(__n)) FROM {summed} WHERE __n > 0)"
        )

        def count(sql: str) -> int:
            return int(backend.rows(f"SELECT count(*) FROM ({sql})")[0][0])

        only_table = count(f"SELECT {cols} FROM {table_name} EXCEPT ALL SELECT {cols} FROM {rows}")
        only_log = count(f"SELECT {cols} FROM {rows} EXCEPT ALL SELECT {cols} FROM {table_name}")
        negative = count(f"SELECT 1 FROM {summed} WHERE __n < 0")
        return only_table, only_log, negative
    finally:
        con.close()


def log_multiset(engine: Any, view: str, upto: int) -> Counter:
    """The sum of a view's diff log up to ``upto`` as a multiset (negative counts kept;
    values exact, as :func:`multiset`)."""
    dt = open_table(engine.layout.view_log(view))
    if dt is None:
        return Counter()
    table = dt.to_pyarrow_table()
    columns = [c for c in table.column_names if c not in ("_time", "_diff")]
    acc: Counter = Counter()
    for r in table.to_pylist():
        if r["_time"] <= upto:
            acc[tuple(_canonical(r[c]) for c in columns)] += r["_diff"]
    return Counter({k: v for k, v in acc.items() if v != 0})
