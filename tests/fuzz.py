"""The differential fuzzer's machinery (test helper): random cases, their runs, reproducers.

Owns everything :mod:`tests.test_fuzz` needs to find a wrong view and hand back a small project
that shows it:

- *cases* (:class:`Case`): 1-3 random source tables (INT, BIGINT, DECIMAL of tight and wide
  precision incl. (38,18), DOUBLE with -0.0 and huge and tiny magnitudes, DATE, TIMESTAMP,
  STRING with non-ASCII text, NULLs everywhere, duplicate rows), random views drawn from a
  grammar over the constructs README.md lists (:class:`ViewGen`: type-correct expressions,
  joins, subqueries, aggregates, set operations, TopK, views over views), and random batches of
  inserts, updates and deletes, small (the driver's path) and large (Spark's path and the
  engine's automatic recompute); all drawn from one ``random.Random(seed)``
  (:func:`generate_case`);
- *runs* (:func:`run_case`): the sources written with delta-rs (change data feed on), the
  project built and refreshed once per batch, on the driver's path or with Spark forced
  (:func:`forced_path`); after the build and after every epoch each view is compared with
  DuckDB's and Spark's from-scratch evaluation of its SQL (exact, doubles within
  :data:`FLOAT_REL_TOL` relative) and with its own diff log, and its columns with Spark's;
- *reproducers*: a failing case written as a project folder (``ivm.toml``, ``views/*.sql``,
  ``case.json`` with the source rows and every batch, ``replay.py``), reduced while it still
  fails (:func:`reduce_case`: views, batches, operations, rows and columns dropped, within a
  time bound) and printed (:func:`describe_reproducer`).

``python -m tests.fuzz replay DIR`` replays a reproducer folder (``--path spark`` forces Spark).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import math
import random
import re
import shutil
import sys
import tempfile
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa

FLOAT_REL_TOL = 1e-12
"""Relative tolerance for DOUBLE columns (every other type is compared exactly): a sum of the
same doubles in another order differs in its last bits; more than this is a wrong result."""

FLOAT_ABS_TOL = 1e-290
"""Absolute tolerance for DOUBLE columns, for results that should be zero."""

RECOMPUTE_MIN_ROWS = 30
"""The engine's ``RECOMPUTE_MIN_ROWS`` during a fuzz run: the tables are small, so a large
batch (a large share of a table, 40 or more updates) must be able to trigger the automatic
recompute; a small one (at most about 20 updates a table) never does."""

ROWS_BOUND = 100_000
"""At most this many rows feed one aggregate (joins included): bounds of sums."""

# Constructs README.md says are rejected: a view refused for one of these is not a failure.
README_UNSUPPORTED = (
    "NOT IN over a correlated subquery",
    "window function",
    "LIMIT without ORDER BY",
    "not deterministic",
)


# -- types ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SqlType:
    """A Spark SQL type as the generator tracks it."""

    kind: str  # int | bigint | decimal | double | date | timestamp | string | boolean
    p: int = 0
    s: int = 0

    def sql(self) -> str:
        if self.kind == "decimal":
            return f"DECIMAL({self.p},{self.s})"
        return {"int": "INT", "string": "STRING"}.get(self.kind, self.kind.upper())

    def arrow(self) -> pa.DataType:
        return {
            "int": pa.int32(),
            "bigint": pa.int64(),
            "double": pa.float64(),
            "date": pa.date32(),
            "timestamp": pa.timestamp("us", tz="UTC"),
            "string": pa.string(),
            "boolean": pa.bool_(),
        }.get(self.kind) or pa.decimal128(self.p, self.s)

    @property
    def numeric(self) -> bool:
        return self.kind in ("int", "bigint", "decimal", "double")

    @property
    def integral(self) -> bool:
        return self.kind in ("int", "bigint")

    def __str__(self) -> str:
        return self.sql().lower()

    @staticmethod
    def parse(text: str) -> SqlType:
        m = re.fullmatch(r"decimal\((\d+),(\d+)\)", text)
        return SqlType("decimal", int(m[1]), int(m[2])) if m else SqlType(text)


INT, BIGINT, DOUBLE = SqlType("int"), SqlType("bigint"), SqlType("double")
DATE, TIMESTAMP, STRING, BOOLEAN = (
    SqlType("date"),
    SqlType("timestamp"),
    SqlType("string"),
    SqlType("boolean"),
)
INT_MAX, BIGINT_MAX = 2**31 - 1, 2**63 - 1

SOURCE_DECIMALS = [(5, 2), (3, 2), (9, 0), (12, 4), (18, 6), (20, 10), (38, 18), (38, 18)]
CAST_DECIMALS = [(3, 1), (4, 2), (5, 1), (6, 3), (10, 2), (18, 6), (20, 0), (38, 18), (38, 6)]


def as_decimal(t: SqlType, literal_digits: int = 0) -> tuple[int, int]:
    """Spark's decimal view of an exact numeric type (an integer literal's: its digits)."""
    if literal_digits:
        return literal_digits, 0
    return {"int": (10, 0), "bigint": (20, 0)}.get(t.kind) or (t.p, t.s)


def adjust(p: int, s: int) -> tuple[int, int]:
    """Spark's ``DecimalType.adjustPrecisionScale`` (precision loss allowed)."""
    if p <= 38:
        return p, s
    int_digits = p - s
    return 38, max(38 - int_digits, min(s, 6))


def decimal_limit(t: SqlType) -> float:
    """The largest magnitude a decimal of this type holds."""
    return 10.0 ** (t.p - t.s) - 10.0**-t.s


# -- values -----------------------------------------------------------------------------------

INT_VALUES = [-3, -1, 0, 0, 1, 1, 2, 3, 5, 7, 42, 1_000_000, -1_000_000]
BIGINT_VALUES = [-2, 0, 1, 1, 2, 3, 7, 10**12, -(10**12), 2**40]
DOUBLE_VALUES = [
    -0.0, 0.0, 0.25, -1.5, 1.0, 1.0, 2.0, 3.75, 0.1, -0.5,
    1e300, 1e-300, 1e20, 1e20, 1e20, 1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 2,
]  # fmt: skip
"""Exact binary fractions (sums exact in any order), -0.0, and magnitudes that cancel: 1e20
next to 1.0 (a sum that loses the small terms unless kept exactly), 1e9 + k (a variance that
cancels catastrophically as n*sum(x^2) - sum(x)^2), 1e300 and 1e-300."""
STRING_VALUES = ["a", "b", "A", "ab", "", " a", "é", "Ü", "straße", "日本", "日本語", "Ω", "x🙂", "🙂", "o'k"]
BASE_DAY = dt.date(2024, 1, 1)
BOUNDS = {"int": 1_000_000.0, "bigint": 2.0**41, "double": 1e300}
DECIMAL_DATA_BOUND = 1e12
"""Source decimals stay below this magnitude (or their type's limit)."""


def random_value(
    rng: random.Random,
    t: SqlType,
    p_null: float = 0.15,
    doubles: Sequence[float] = DOUBLE_VALUES,
) -> Any:
    """A value of ``t`` (NULL with ``p_null``); DOUBLEs drawn from ``doubles``."""
    if rng.random() < p_null:
        return None
    if t.kind == "int":
        return rng.choice(INT_VALUES)
    if t.kind == "bigint":
        return rng.choice(BIGINT_VALUES)
    if t.kind == "double":
        return rng.choice(doubles)
    if t.kind == "decimal":
        int_digits = t.p - t.s
        roll = rng.random()
        if roll < 0.2:
            unscaled = rng.randint(-3, 3) * 10**t.s  # small whole numbers: join and group keys
        elif roll < 0.5:
            unscaled = rng.randint(-999, 999) * 10 ** max(t.s - 2, 0)
        else:
            digits = min(int_digits, 12) + t.s
            unscaled = rng.randint(-(10**digits) + 1, 10**digits - 1)
            if int_digits <= 0:
                unscaled = rng.randint(-(10**t.s) + 1, 10**t.s - 1)
        if rng.random() < 0.15:  # the type's largest magnitude (9.99 of DECIMAL(3,2)): casts
            unscaled = min(10**t.p - 1, int(DECIMAL_DATA_BOUND * 10**t.s))  # to fewer digits carry
            unscaled *= rng.choice([1, -1])
        elif unscaled == 0 and rng.random() < 0.5:
            unscaled = 10**t.s - 1  # the largest value below one whole (0.99...)
        return Decimal(unscaled).scaleb(-t.s)
    if t.kind == "date":
        return rng.choice(
            [BASE_DAY + dt.timedelta(days=rng.randint(-3, 40)) for _ in range(4)]
            + [dt.date(1970, 1, 1), dt.date(2000, 2, 29), dt.date(2099, 12, 31)]
        )
    if t.kind == "timestamp":
        base = dt.datetime(2024, 1, 1, tzinfo=dt.UTC)
        return rng.choice(
            [
                base + dt.timedelta(hours=rng.randint(0, 72)),
                base + dt.timedelta(hours=rng.randint(0, 72), microseconds=rng.randint(1, 999999)),
                dt.datetime(1970, 1, 1, tzinfo=dt.UTC),
                dt.datetime(2024, 3, 10, 23, 59, 59, 999999, tzinfo=dt.UTC),
            ]
        )
    if t.kind == "string":
        return rng.choice(STRING_VALUES)
    raise ValueError(f"no values for {t}")


def encode(value: Any, t: SqlType) -> Any:
    """A value as JSON holds it (decimals as strings, dates and timestamps ISO)."""
    if value is None:
        return None
    if t.kind == "decimal":
        return str(value)
    if t.kind == "double":
        return value if math.isfinite(value) else repr(value)
    if t.kind in ("date", "timestamp"):
        return value.isoformat()
    return value


def decode(value: Any, t: SqlType) -> Any:
    if value is None:
        return None
    if t.kind == "decimal":
        return Decimal(value)
    if t.kind == "double":
        return float(value)
    if t.kind == "date":
        return dt.date.fromisoformat(value)
    if t.kind == "timestamp":
        return dt.datetime.fromisoformat(value)
    return value


# -- the case: tables, views, batches ---------------------------------------------------------


@dataclass
class Table:
    """A source table: columns (``id`` first) and its initial rows (lists in column order)."""

    name: str
    columns: list[tuple[str, SqlType]]
    rows: list[list[Any]]

    def schema(self) -> pa.Schema:
        return pa.schema([(n, t.arrow()) for n, t in self.columns])

    def arrow(self, rows: Sequence[Sequence[Any]]) -> pa.Table:
        return pa.Table.from_pylist(
            [dict(zip([n for n, _ in self.columns], r, strict=True)) for r in rows],
            schema=self.schema(),
        )

    def type_of(self, column: str) -> SqlType:
        return dict(self.columns)[column]


@dataclass
class Op:
    """One change to one table: ``insert`` (``rows``), ``delete`` (``ids``: every row with that
    id, duplicates included) or ``update`` (``columns`` set to the values of ``rows`` = ``[id,
    value...]``, for every row with that id)."""

    table: str
    kind: str
    rows: list[list[Any]] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    columns: list[str] = field(default_factory=list)

    def size(self) -> int:
        return len(self.rows) + len(self.ids)


@dataclass
class View:
    """A view: its SQL file's text, the collections it reads, whether DuckDB evaluates it as
    Spark does (``duck``; else only Spark's from-scratch result is the reference), and the
    grammar features it uses."""

    name: str
    sql: str
    reads: list[str]
    columns: list[tuple[str, SqlType]]
    duck: bool = True
    features: list[str] = field(default_factory=list)


@dataclass
class Case:
    """Everything one fuzz run needs: sources, views, batches (one epoch each)."""

    seed: int
    tables: dict[str, Table]
    views: dict[str, View]
    batches: list[list[Op]]
    recompute_above: float = 0.2
    batch_kinds: list[str] = field(default_factory=list)  # small | large, per batch

    def to_json(self) -> dict[str, Any]:
        def enc_rows(t: Table, rows: list[list[Any]], columns: list[str] | None = None) -> list[list[Any]]:
            cols = columns or [n for n, _ in t.columns]
            types = [t.type_of(c) for c in cols]
            return [[encode(v, ty) for v, ty in zip(r, types, strict=True)] for r in rows]

        return {
            "seed": self.seed,
            "recompute_above": self.recompute_above,
            "tables": {
                n: {
                    "columns": [[c, str(ty)] for c, ty in t.columns],
                    "rows": enc_rows(t, t.rows),
                }
                for n, t in self.tables.items()
            },
            "views": {
                n: {
                    "sql": v.sql,
                    "reads": v.reads,
                    "columns": [[c, str(ty)] for c, ty in v.columns],
                    "duck": v.duck,
                    "features": v.features,
                }
                for n, v in self.views.items()
            },
            "batches": [
                [
                    {
                        "table": op.table,
                        "kind": op.kind,
                        **({"ids": op.ids} if op.ids else {}),
                        **({"columns": op.columns} if op.columns else {}),
                        **(
                            {
                                "rows": enc_rows(
                                    self.tables[op.table],
                                    op.rows,
                                    ["id", *op.columns] if op.kind == "update" else None,
                                )
                            }
                            if op.rows
                            else {}
                        ),
                    }
                    for op in batch
                ]
                for batch in self.batches
            ],
            "batch_kinds": self.batch_kinds,
        }

    @staticmethod
    def from_json(data: dict[str, Any]) -> Case:
        tables = {}
        for name, t in data["tables"].items():
            cols = [(c, SqlType.parse(ty)) for c, ty in t["columns"]]
            rows = [[decode(v, ty) for v, (_, ty) in zip(r, cols, strict=True)] for r in t["rows"]]
            tables[name] = Table(name, cols, rows)
        views = {
            n: View(
                n,
                v["sql"],
                v["reads"],
                [(c, SqlType.parse(ty)) for c, ty in v["columns"]],
                v["duck"],
                v["features"],
            )
            for n, v in data["views"].items()
        }
        batches = []
        for batch in data["batches"]:
            ops = []
            for o in batch:
                t = tables[o["table"]]
                cols = ["id", *o.get("columns", [])] if o["kind"] == "update" else None
                types = [t.type_of(c) for c in cols] if cols else [ty for _, ty in t.columns]
                rows = [
                    [decode(v, ty) for v, ty in zip(r, types, strict=True)]
                    for r in o.get("rows", [])
                ]
                ops.append(Op(o["table"], o["kind"], rows, o.get("ids", []), o.get("columns", [])))
            batches.append(ops)
        return Case(
            data["seed"],
            tables,
            views,
            batches,
            data["recompute_above"],
            data.get("batch_kinds", []),
        )


# -- expressions ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """A generated SQL expression: its text, type, a bound of its magnitude (numbers), and
    whether DuckDB evaluates it exactly as Spark does (``duck``)."""

    sql: str
    type: SqlType
    bound: float = 0.0
    duck: bool = True
    features: frozenset[str] = frozenset()
    literal_digits: int = 0  # an integer literal's digits (Spark types it DECIMAL(n,0) there)


@dataclass(frozen=True)
class Col:
    """A column in scope: qualified reference, type, magnitude bound."""

    ref: str
    type: SqlType
    bound: float


def _lit_decimal(value: Decimal) -> Expr:
    """A decimal literal and the type Spark gives it (a literal without a point is an INT or
    BIGINT to Spark: those are cast)."""
    text = format(value, "f")
    digits = len(text.replace("-", "").replace(".", "").lstrip("0")) or 1
    scale = len(text.split(".")[1]) if "." in text else 0
    p = max(digits, scale, 1)
    t = SqlType("decimal", p, scale)
    if not scale:
        return Expr(f"CAST({text} AS {t.sql()})", t, float(abs(value)))
    return Expr(text, t, float(abs(value)))


def literal(rng: random.Random, t: SqlType) -> Expr:
    """A literal of type ``t`` (a typed NULL now and then)."""
    if rng.random() < 0.05:
        return Expr(f"CAST(NULL AS {t.sql()})", t)
    if t.kind == "int":
        v = rng.choice([-2, 0, 1, 2, 3, 5, 7])
        return Expr(str(v), t, abs(v), literal_digits=len(str(abs(v))))
    if t.kind == "bigint":
        v = rng.choice([0, 1, 3, 10**12])
        return Expr(f"CAST({v} AS BIGINT)", t, abs(v))
    if t.kind == "double":
        v = rng.choice(["0.0E0", "1.5E0", "-2.0E0", "1.0E20", "1.0E-300", "0.25E0"])
        return Expr(v, t, abs(float(v)))
    if t.kind == "decimal":
        value = random_value(random.Random(rng.random()), t, 0.0)
        e = _lit_decimal(value)
        if e.type != t:
            return Expr(f"CAST({e.sql} AS {t.sql()})", t, e.bound)
        return e
    if t.kind == "date":
        d = BASE_DAY + dt.timedelta(days=rng.randint(0, 40))
        return Expr(f"DATE '{d.isoformat()}'", t)
    if t.kind == "timestamp":
        h = rng.randint(0, 72)
        ts = dt.datetime(2024, 1, 1) + dt.timedelta(hours=h)
        return Expr(f"TIMESTAMP '{ts.isoformat(sep=' ')}'", t)
    if t.kind == "string":
        v = rng.choice([s for s in STRING_VALUES if "'" not in s])
        return Expr(f"'{v}'", t)
    if t.kind == "boolean":
        return Expr(rng.choice(["true", "false"]), t)
    raise ValueError(t)


class ExprGen:
    """Type-correct random expressions over a scope of columns.

    Args:
        rng: the case's generator.
        allowed: a predicate on feature names (the grammar's exclusions).
    """

    def __init__(self, rng: random.Random, allowed: Callable[[str], bool]) -> None:
        self.rng = rng
        self.allowed = allowed

    def pick(self, options: Sequence[tuple[float, Callable[[], Expr | None]]]) -> Expr | None:
        total = sum(w for w, _ in options)
        for _ in range(6):
            r = self.rng.random() * total
            for w, make in options:
                r -= w
                if r <= 0:
                    got = make()
                    if got is not None:
                        return got
                    break
        return None

    def column(self, scope: Sequence[Col], test: Callable[[SqlType], bool]) -> Expr | None:
        cols = [c for c in scope if test(c.type)]
        if not cols:
            return None
        c = self.rng.choice(cols)
        return Expr(c.ref, c.type, c.bound)

    # -- by kind

    def of_kind(self, scope: Sequence[Col], kind: str, depth: int) -> Expr:
        """An expression of ``kind`` (``numeric``: any number; ``any``: any non-boolean)."""
        if kind == "any":
            present = [c.type.kind for c in scope if c.type.kind != "boolean"]
            if present and self.rng.random() < 0.85:  # mostly over the columns at hand
                kind = self.rng.choice(present)
            else:
                kind = self.rng.choice(["numeric", "numeric", "string", "date", "timestamp"])
        maker = {
            "numeric": self.numeric,
            "int": lambda s, d: self.numeric(s, d, ("int",)),
            "bigint": lambda s, d: self.numeric(s, d, ("bigint",)),
            "decimal": lambda s, d: self.numeric(s, d, ("decimal",)),
            "double": lambda s, d: self.numeric(s, d, ("double",)),
            "string": self.string,
            "date": self.date,
            "timestamp": self.timestamp,
            "boolean": self.boolean,
        }[kind]
        return maker(scope, depth)

    def numeric(
        self,
        scope: Sequence[Col],
        depth: int,
        kinds: tuple[str, ...] = ("int", "bigint", "decimal", "double"),
    ) -> Expr:
        rng = self.rng

        def col() -> Expr | None:
            return self.column(scope, lambda t: t.kind in kinds)

        def lit() -> Expr:
            kind = rng.choice(kinds)
            if kind == "decimal":
                p, s = rng.choice(SOURCE_DECIMALS)
                return literal(rng, SqlType("decimal", p, s))
            return literal(rng, SqlType(kind))

        if depth <= 0:
            return col() or lit()

        def sub(ks: tuple[str, ...] = ("int", "bigint", "decimal", "double")) -> Expr:
            return self.numeric(scope, depth - 1, ks)

        def arith() -> Expr | None:
            op = rng.choice(["+", "-", "*", "+", "-"])
            a = sub(kinds if rng.random() < 0.7 else ("int", "bigint", "decimal", "double"))
            b = sub(kinds)
            if op == "*" and rng.random() < 0.7:  # keep products bounded: a small factor
                b = literal(rng, rng.choice([INT, SqlType("decimal", 3, 2)]))
            return self.binary(op, a, b, kinds)

        def divide() -> Expr | None:
            a = sub(kinds)
            if a.type.kind == "decimal" or a.type.integral:
                b = self.numeric(scope, depth - 1, ("int", "bigint"))
            else:
                b = sub(("int", "double"))
            return self.binary("/", a, b, kinds)

        def modulo() -> Expr | None:
            if not set(kinds) & {"int", "bigint"}:
                return None
            a, b = sub(("int",)), sub(("int",))
            t = INT
            return Expr(f"({a.sql} % nullif({b.sql}, 0))", t, a.bound, a.duck and b.duck)

        def neg() -> Expr:
            a = sub(kinds)
            if a.type.kind not in kinds:
                return a
            return Expr(f"(- {a.sql})", a.type, a.bound, a.duck, a.features)

        def absolute() -> Expr:
            a = sub(kinds)
            if a.type.kind not in kinds:
                return a
            return Expr(f"abs({a.sql})", a.type, a.bound, a.duck, a.features)

        def cast() -> Expr | None:
            target = self.numeric_type(kinds)
            inner = None
            if rng.random() < 0.5:  # a column's values cast (DECIMAL(3,2) 9.99 -> (5,1) 10.0)
                inner = self.column(scope, lambda t: t.numeric)
            inner = inner or sub()
            if inner.type.kind == "decimal" and inner.type.s and "decimal" in kinds:
                if rng.random() < 0.6:  # to fewer fractional digits: rounds, may carry
                    s = rng.randint(0, inner.type.s - 1)
                    p = rng.randint(max(s + 1, 1), 38)
                    target = SqlType("decimal", p, s)
            return self.cast(inner, target)

        def case() -> Expr:
            t = self.numeric_type(kinds)
            return self.case_of(scope, t, depth)

        def coalesce() -> Expr:
            t = self.numeric_type(kinds)
            a, b = self.of_type(scope, t, depth - 1), self.of_type(scope, t, depth - 1)
            return Expr(f"coalesce({a.sql}, {b.sql})", t, max(a.bound, b.bound), a.duck and b.duck)

        def from_other() -> Expr | None:
            if "int" not in kinds:
                return None
            roll = rng.random()
            kinds_here = {c.type.kind for c in scope}
            if roll < 0.4 or "date" not in kinds_here:
                if "string" not in kinds_here:
                    return None
                s = self.string(scope, depth - 1)
                return Expr(f"length({s.sql})", INT, 1000, s.duck, s.features)
            d = self.date(scope, depth - 1)
            if roll < 0.7 and self.allowed("date_functions"):
                f = rng.choice(["year", "month", "dayofmonth"])
                return Expr(f"{f}({d.sql})", INT, 10000, d.duck, d.features | {"date_functions"})
            if self.allowed("date_functions"):
                d2 = self.date(scope, depth - 1)
                return Expr(
                    f"datediff({d.sql}, {d2.sql})",
                    INT,
                    1e6,
                    d.duck and d2.duck,
                    d.features | d2.features | {"date_functions"},
                )
            return None

        got = self.pick(
            [
                (4, col),
                (1.5, lit),
                (3, arith),
                (0.8, divide),
                (0.5, modulo),
                (0.5, neg),
                (0.5, absolute),
                (2.5, cast),
                (1, case),
                (1, coalesce),
                (1, from_other),
            ]
        )
        return got or col() or lit()

    def numeric_type(self, kinds: Sequence[str]) -> SqlType:
        kind = self.rng.choice(list(kinds))
        if kind == "decimal":
            p, s = self.rng.choice(CAST_DECIMALS + SOURCE_DECIMALS)
            return SqlType("decimal", p, s)
        return SqlType(kind)

    def binary(self, op: str, a: Expr, b: Expr, kinds: Sequence[str]) -> Expr | None:
        """``a op b`` with Spark's result type, or None when it could overflow (Spark's ANSI
        mode raises) or its type is not one of ``kinds``."""
        ta, tb = a.type, b.type
        duck = a.duck and b.duck
        feats = a.features | b.features
        if op == "/":
            if tb.kind == "decimal" or (ta.kind == "decimal" and tb.kind == "double"):
                return None
            divisor = f"nullif({b.sql}, 0)"
            if ta.kind == "decimal":
                p1, s1 = as_decimal(ta)
                p2, s2 = as_decimal(tb)
                s = max(6, s1 + p2 + 1)
                p, s = adjust(p1 - s1 + s2 + s, s)
                t = SqlType("decimal", p, s)
                if a.bound >= decimal_limit(t):
                    return None
                feats |= {"decimal_division"}
                return self._fit(Expr(f"({a.sql} / {divisor})", t, a.bound, False, feats), kinds)
            bound = a.bound / 1e-300 if tb.kind == "double" else a.bound
            return self._fit(Expr(f"({a.sql} / {divisor})", DOUBLE, bound, duck, feats), kinds)
        bound = a.bound * b.bound if op == "*" else a.bound + b.bound
        text = f"({a.sql} {op} {b.sql})"
        if "double" in (ta.kind, tb.kind):
            return self._fit(Expr(text, DOUBLE, bound, duck, feats | {"double_arith"}), kinds)
        if ta.integral and tb.integral:
            t = BIGINT if "bigint" in (ta.kind, tb.kind) else INT
            if bound > (INT_MAX if t == INT else BIGINT_MAX) / 2:
                return None
            return self._fit(Expr(text, t, bound, duck, feats), kinds)
        (p1, s1), (p2, s2) = as_decimal(ta, a.literal_digits), as_decimal(tb, b.literal_digits)
        if op == "*":
            exact = s1 + s2
            p, s = adjust(p1 + p2 + 1, exact)
        else:
            exact = max(s1, s2)
            p, s = adjust(max(p1 - s1, p2 - s2) + exact + 1, exact)
        t = SqlType("decimal", p, s)
        if bound >= decimal_limit(t) / 2:
            return None
        if s < exact:  # Spark rounds the result to fewer digits than it has; DuckDB does not
            duck = False
            feats |= {"decimal_rounding"}
        return self._fit(Expr(text, t, bound, duck, feats | {"decimal_arith"}), kinds)

    @staticmethod
    def _fit(e: Expr, kinds: Sequence[str]) -> Expr | None:
        return e if e.type.kind in kinds else None

    def cast(self, inner: Expr, target: SqlType) -> Expr | None:
        """``CAST(inner AS target)`` when it cannot fail (Spark's ANSI casts raise on
        overflow), else None."""
        src = inner.type
        duck = inner.duck
        feats = inner.features | {"cast"}
        if target.kind == "decimal":
            if not (src.numeric and inner.bound <= decimal_limit(target) - 1):
                return None
            if src.kind == "double":
                duck = False  # Spark converts the double's shortest decimal string
            elif as_decimal(src)[1] > target.s:
                feats |= {"decimal_cast_rounds"}
            if not self.allowed("decimal_cast_rounds") and "decimal_cast_rounds" in feats:
                return None
            return Expr(f"CAST({inner.sql} AS {target.sql()})", target, inner.bound, duck, feats)
        if target.integral:
            limit = INT_MAX if target.kind == "int" else BIGINT_MAX
            if not (src.numeric and inner.bound < limit / 2):
                return None
            if src.kind in ("decimal", "double"):
                duck = False  # Spark truncates, DuckDB rounds
            return Expr(f"CAST({inner.sql} AS {target.sql()})", target, inner.bound, duck, feats)
        if target.kind == "double":
            if not src.numeric:
                return None
            return Expr(f"CAST({inner.sql} AS DOUBLE)", target, inner.bound, duck, feats)
        if target.kind == "string":
            if src.kind in ("double", "timestamp", "boolean"):
                return None  # formats differ between engines: not a fair comparison
            if src.kind == "date" and "date_functions" in inner.features:
                duck = False  # DuckDB's date_add gives a TIMESTAMP, printed with its time
            return Expr(f"CAST({inner.sql} AS STRING)", target, 0, duck, feats)
        if target.kind == "date" and src.kind in ("timestamp", "date"):
            return Expr(f"CAST({inner.sql} AS DATE)", target, 0, duck, feats)
        if target.kind == "timestamp" and src.kind in ("timestamp", "date"):
            return Expr(f"CAST({inner.sql} AS TIMESTAMP)", target, 0, duck, feats)
        return None

    def of_type(self, scope: Sequence[Col], t: SqlType, depth: int) -> Expr:
        """An expression of exactly type ``t`` (CASE, COALESCE and set-operation branches)."""
        rng = self.rng
        exact = self.column(scope, lambda ct: ct == t)
        if exact is not None and rng.random() < 0.6:
            return exact
        if rng.random() < 0.35 or depth <= 0:
            return literal(rng, t)
        kind = t.kind
        if kind in ("int", "bigint", "decimal", "double"):
            kind = rng.choice([kind, "numeric"])
        inner = self.of_kind(scope, kind, depth - 1)
        if inner.type == t:
            return inner
        return self.cast(inner, t) or literal(rng, t)

    def case_of(self, scope: Sequence[Col], t: SqlType, depth: int) -> Expr:
        whens = []
        duck = True
        feats: frozenset[str] = frozenset({"case"})
        bound = 0.0
        for _ in range(self.rng.randint(1, 2)):
            cond = self.boolean(scope, depth - 1)
            val = self.of_type(scope, t, depth - 1)
            whens.append(f"WHEN {cond.sql} THEN {val.sql}")
            duck &= cond.duck and val.duck
            feats |= cond.features | val.features
            bound = max(bound, val.bound)
        other = self.of_type(scope, t, depth - 1)
        duck &= other.duck
        tail = f" ELSE {other.sql}" if self.rng.random() < 0.8 else ""
        return Expr(
            f"CASE {' '.join(whens)}{tail} END",
            t,
            max(bound, other.bound),
            duck,
            feats | other.features,
        )

    def string(self, scope: Sequence[Col], depth: int) -> Expr:
        rng = self.rng

        def col() -> Expr | None:
            return self.column(scope, lambda t: t.kind == "string")

        if depth <= 0:
            return col() or literal(rng, STRING)

        def sub() -> Expr:
            return self.string(scope, depth - 1)

        def concat() -> Expr:
            a, b = sub(), sub()
            return Expr(f"concat({a.sql}, {b.sql})", STRING, 0, a.duck and b.duck, a.features | b.features)

        def substr() -> Expr:
            a = sub()
            return Expr(
                f"substr({a.sql}, {rng.randint(1, 3)}, {rng.randint(0, 3)})",
                STRING,
                0,
                a.duck,
                a.features | {"string_functions"},
            )

        def case_map() -> Expr:
            a = sub()
            f = rng.choice(["upper", "lower"])
            # Unicode case tables differ (Java: upper('ß') = 'SS'; DuckDB: 'ẞ')
            return Expr(f"{f}({a.sql})", STRING, 0, False, a.features | {"string_functions"})

        def cast() -> Expr | None:
            inner = self.of_kind(scope, rng.choice(["int", "bigint", "date", "decimal"]), depth - 1)
            return self.cast(inner, STRING)

        def coalesce() -> Expr:
            a, b = sub(), sub()
            return Expr(f"coalesce({a.sql}, {b.sql})", STRING, 0, a.duck and b.duck, a.features | b.features)

        return (
            self.pick(
                [
                    (4, col),
                    (1, lambda: literal(rng, STRING)),
                    (1, concat),
                    (1, substr),
                    (0.7, case_map),
                    (0.7, cast),
                    (0.7, coalesce),
                    (0.5, lambda: self.case_of(scope, STRING, depth)),
                ]
            )
            or col()
            or literal(rng, STRING)
        )

    def date(self, scope: Sequence[Col], depth: int) -> Expr:
        rng = self.rng

        def col() -> Expr | None:
            return self.column(scope, lambda t: t.kind == "date")

        if depth <= 0:
            return col() or literal(rng, DATE)

        def shift() -> Expr | None:
            if not self.allowed("date_functions"):
                return None
            a = self.date(scope, depth - 1)
            f = rng.choice(["date_add", "date_sub"])
            return Expr(
                f"{f}({a.sql}, {rng.randint(0, 40)})", DATE, 0, a.duck, a.features | {"date_functions"}
            )

        def from_ts() -> Expr | None:
            return self.cast(self.timestamp(scope, depth - 1), DATE)

        def coalesce() -> Expr:
            a, b = self.date(scope, depth - 1), self.date(scope, depth - 1)
            return Expr(f"coalesce({a.sql}, {b.sql})", DATE, 0, a.duck and b.duck, a.features | b.features)

        return (
            self.pick(
                [
                    (4, col),
                    (1, lambda: literal(rng, DATE)),
                    (1.5, shift),
                    (0.7, from_ts),
                    (0.5, coalesce),
                    (0.4, lambda: self.case_of(scope, DATE, depth)),
                ]
            )
            or col()
            or literal(rng, DATE)
        )

    def timestamp(self, scope: Sequence[Col], depth: int) -> Expr:
        rng = self.rng
        got = self.column(scope, lambda t: t.kind == "timestamp")
        if got is not None and (depth <= 0 or rng.random() < 0.7):
            return got
        if depth > 0 and rng.random() < 0.5:
            a, b = self.timestamp(scope, depth - 1), self.timestamp(scope, depth - 1)
            return Expr(f"coalesce({a.sql}, {b.sql})", TIMESTAMP, 0, a.duck and b.duck, a.features | b.features)
        return literal(rng, TIMESTAMP)

    def comparable(self, scope: Sequence[Col], depth: int) -> tuple[Expr, Expr]:
        """Two expressions Spark compares without an implicit cast that could fail."""
        a = self.of_kind(scope, "any", depth)
        if a.type.numeric:
            b = self.numeric(scope, depth)
        elif a.type.kind == "string":
            b = self.string(scope, depth)
        elif a.type.kind == "date":
            b = self.date(scope, depth)
        else:
            b = self.timestamp(scope, depth)
        return a, b

    def boolean(self, scope: Sequence[Col], depth: int) -> Expr:
        rng = self.rng

        def compare() -> Expr:
            a, b = self.comparable(scope, max(depth - 1, 0))
            if rng.random() < 0.6:  # against a literal: selective filters
                b = literal(rng, a.type) if not a.type.numeric else self.numeric(scope, 0)
            op = rng.choice(["=", "<>", "<", "<=", ">", ">=", "<=>"])
            return Expr(f"({a.sql} {op} {b.sql})", BOOLEAN, 0, a.duck and b.duck, a.features | b.features)

        def null_test() -> Expr:
            a = self.of_kind(scope, "any", max(depth - 1, 0))
            neg = rng.choice(["", "NOT "])
            return Expr(f"({a.sql} IS {neg}NULL)", BOOLEAN, 0, a.duck, a.features)

        def logic() -> Expr:
            a, b = self.boolean(scope, depth - 1), self.boolean(scope, depth - 1)
            op = rng.choice(["AND", "OR"])
            return Expr(f"({a.sql} {op} {b.sql})", BOOLEAN, 0, a.duck and b.duck, a.features | b.features)

        def negate() -> Expr:
            a = self.boolean(scope, depth - 1)
            return Expr(f"(NOT {a.sql})", BOOLEAN, 0, a.duck, a.features)

        def between() -> Expr:
            a = self.of_kind(scope, "any", max(depth - 1, 0))
            lo, hi = literal(rng, a.type), literal(rng, a.type)
            return Expr(f"({a.sql} BETWEEN {lo.sql} AND {hi.sql})", BOOLEAN, 0, a.duck, a.features)

        def in_list() -> Expr:
            a = self.of_kind(scope, "any", max(depth - 1, 0))
            items = ", ".join(literal(rng, a.type).sql for _ in range(rng.randint(1, 3)))
            neg = rng.choice(["", "NOT "])
            return Expr(f"({a.sql} {neg}IN ({items}))", BOOLEAN, 0, a.duck, a.features)

        def like() -> Expr:
            a = self.string(scope, max(depth - 1, 0))
            pattern = rng.choice(["a%", "%b", "_", "%日%", "x%"])
            return Expr(f"({a.sql} LIKE '{pattern}')", BOOLEAN, 0, a.duck, a.features | {"like"})

        options = [(4, compare), (1.5, null_test), (1, between), (1, in_list), (0.7, like)]
        if depth > 0:
            options += [(1.5, logic), (0.7, negate)]
        return self.pick(options) or compare()


# -- queries ----------------------------------------------------------------------------------


@dataclass
class Query:
    """A generated query: text, output columns, DuckDB-faithful, collections read, features."""

    sql: str
    columns: list[tuple[str, SqlType, float]]
    duck: bool
    reads: set[str]
    features: set[str]


@dataclass
class FromWhere:
    """A FROM clause (with WHERE) and the columns it puts in scope."""

    sql: str
    scope: list[Col]
    reads: set[str]
    duck: bool
    features: set[str]
    ctes: list[str] = field(default_factory=list)


HAS_COLUMN = re.compile(r"\b[a-z]\.[a-z]")
"""Whether an expression's text names a column (every column is qualified: ``a.c1_int``)."""

def _class_with_two_columns_of_one_input(pairs: Sequence[tuple[str, str]]) -> bool:
    """Whether the key equalities ``pairs`` (``alias.column``) put two columns of one input in
    one class (``a.x = b.y AND a.x = b.z``: then ``b.y = b.z`` holds too)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs:
        parent[find(a)] = find(b)
    classes: dict[str, list[str]] = {}
    for ref in list(parent):
        classes.setdefault(find(ref), []).append(ref.split(".")[0])
    return any(len(set(aliases)) < len(aliases) for aliases in classes.values())


def _keyed_agg_of(key: str) -> re.Pattern[str]:
    """An aggregate whose state is keyed by its argument, over ``key``: ``min(key)``,
    ``max(DISTINCT key)``, ``count(DISTINCT key)``, ``sum(DISTINCT key)`` ..."""
    k = re.escape(key)
    return re.compile(rf"((min|max)\((DISTINCT )?{k}\)|[a-z_]+\(DISTINCT {k}[,)])")


KNOWN_BUG_FEATURES: dict[str, str] = {
    # Spark's bug, not the engine's (whose build aborted with UNRESOLVED_COLUMN `s` until the
    # FILTER's CASE replaced the ORDER BY's argument too): Spark 4.0.1's own evaluation of
    # LISTAGG(DISTINCT s, ',') WITHIN GROUP (ORDER BY s) FILTER (WHERE id > 1), the
    # from-scratch oracle every check consults, fails in its optimizer
    # (RewriteDistinctAggregates: ClassCastException, AttributeReference is no SortOrder).
    # tests/test_fuzz_regressions.py checks the engine's result against DuckDB.
    "distinct_string_agg_filter": "LISTAGG(DISTINCT s) ... FILTER: Spark's own evaluation fails",
    # Bug: a source DOUBLE holding -0.0, filtered by x = 0.0 / x IN (0.0, ...) / x >= 0.0: rows
    # read by Spark from the delta-rs Parquet files (snapshots, appended files) are dropped:
    # parquet-mr's dictionary filter, given Spark's pushed-down predicate, compares with Java's
    # Double.equals / compareTo (-0.0 != 0.0) and skips the row group (with
    # parquet.filter.dictionary.enabled=false the row is read); rows from a change feed with
    # deletes (read by delta-rs) are kept. So the view depends on the path, Spark's from-scratch
    # (and `ivm verify`) drop them, DuckDB keeps them (t1 rows (1, -0.0), (2, 5.0): `SELECT id
    # FROM t1 WHERE x = 0.0E0` gives {} where DuckDB gives {1}). Data-level: the default run
    # draws no -0.0 in the sources.
    "negative_zero": "-0.0 in a source: Spark's Parquet filter pushdown drops it from x = 0.0",
}
"""Features left out of the default run's grammar because of an engine bug not fixed yet, or
a bug of the Spark oracle (feature -> the bug); the long run (and ``--fuzz-long`` with a seed)
keeps them."""


class _PlainFirst:
    """An :class:`ExprGen` whose top-level expressions are plain columns of the asked kind with
    probability ``p`` (when the scope has one): aggregate arguments, where bugs hide."""

    def __init__(self, exprs: ExprGen, scope: list[Col], p: float) -> None:
        self.exprs, self.scope, self.p = exprs, scope, p

    def _plain(self, test: Callable[[SqlType], bool]) -> Expr | None:
        if self.exprs.rng.random() >= self.p:
            return None
        return self.exprs.column(self.scope, test)

    def of_kind(self, scope: Sequence[Col], kind: str, depth: int) -> Expr:
        test = (lambda t: t.kind != "boolean") if kind == "any" else (lambda t: t.kind == kind)
        return self._plain(test) or self.exprs.of_kind(scope, kind, depth)

    def numeric(self, scope: Sequence[Col], depth: int, kinds: tuple[str, ...]) -> Expr:
        return self._plain(lambda t: t.kind in kinds) or self.exprs.numeric(scope, depth, kinds)

    def string(self, scope: Sequence[Col], depth: int) -> Expr:
        return self._plain(lambda t: t.kind == "string") or self.exprs.string(scope, depth)

    def boolean(self, scope: Sequence[Col], depth: int) -> Expr:
        return self.exprs.boolean(scope, depth)


class ViewGen:
    """Random views over the case's sources and the views made before (views over views).

    Args:
        rng: the case's generator.
        collections: name -> columns ``(name, type, bound)`` of every source and earlier view.
        excluded: grammar features not to generate.
    """

    def __init__(
        self,
        rng: random.Random,
        collections: dict[str, list[tuple[str, SqlType, float]]],
        excluded: frozenset[str] = frozenset(),
    ) -> None:
        self.rng = rng
        self.collections = collections
        self.excluded = excluded
        self.exprs = ExprGen(rng, self.allowed)
        self.last_columns: list[tuple[str, SqlType, float]] = []  # of the last view made
        self.last_exprs: list[str] = []  # of the last outputs() call
        self.prefix = "o"  # output column names: the view's name and a number
        self.simple = False  # this view's expressions mostly plain columns, its FROM a table

    def allowed(self, feature: str) -> bool:
        return feature not in self.excluded

    # -- FROM

    def scope_of(self, name: str, alias: str) -> list[Col]:
        return [Col(f"{alias}.{c}", t, b) for c, t, b in self.collections[name]]

    def table(self, prefer_views: bool = True) -> str:
        names = list(self.collections)
        views = [n for n in names if n.startswith("v")]
        if views and prefer_views and self.rng.random() < 0.35:
            return self.rng.choice(views)
        return self.rng.choice(names)

    def join_keys(
        self, left: list[Col], right: list[Col], most: int = 2
    ) -> list[tuple[Col, Col]] | None:
        """Column pairs to join on (the keys of an equi-join): of one type, or (now and then)
        INT with BIGINT and DECIMALs of other precisions and scales, which Spark casts to the
        wider type (tagged ``join_key_cast`` by the callers)."""
        cast = self.allowed("join_key_cast") and self.rng.random() < 0.3

        def compatible(a: SqlType, b: SqlType) -> bool:
            if a.kind == "boolean" or (a.kind == "double" and not self.allowed("double_keys")):
                return False
            if a == b:
                return True
            if not cast:
                return False
            return {a.kind, b.kind} == {"int", "bigint"} or a.kind == b.kind == "decimal"

        pairs = [(a, b) for a in left for b in right if compatible(a.type, b.type)]
        if not pairs:
            return None
        self.rng.shuffle(pairs)
        # prefer low-cardinality keys (ints, strings, dates): more matches
        pairs.sort(key=lambda p: p[0].type.kind not in ("int", "string", "date"))
        chosen: list[tuple[Col, Col]] = []
        for a, b in pairs:
            if len(chosen) >= self.rng.randint(1, most):
                break
            if all(a.ref != x.ref and b.ref != y.ref for x, y in chosen):
                chosen.append((a, b))
        return chosen

    def from_where(self, *, joins: bool = True, semi: bool = True) -> FromWhere:
        """A FROM (+ WHERE): a table, a subquery, a CTE, an inner or outer join, or a table
        filtered by an EXISTS / IN subquery."""
        rng = self.rng
        simple = self.simple
        shapes = [("table", 10 if simple else 4), ("subquery", 1), ("cte", 1)]
        if joins:
            shapes += [("join", 3), ("outer_join", 2)]
        if semi:
            shapes += [("semi_join", 2)]
        shapes = [(s, w) for s, w in shapes if self.allowed(s)]
        shape = rng.choices([s for s, _ in shapes], [w for _, w in shapes])[0]
        got = getattr(self, f"_fw_{shape}")()
        if got is None:
            got = self._fw_table()
        return got

    def _where(self, scope: list[Col], p: float = 0.6) -> tuple[str, bool, set[str]]:
        if self.rng.random() >= (p / 2 if self.simple else p):
            return "", True, set()
        cond = self.exprs.boolean(scope, 2)
        return f"\nWHERE {cond.sql}", cond.duck, set(cond.features)

    def _fw_table(self) -> FromWhere:
        name = self.table()
        scope = self.scope_of(name, "a")
        where, duck, feats = self._where(scope)
        return FromWhere(f"FROM {name} AS a{where}", scope, {name}, duck, feats)

    def _inner_select(self, name: str) -> tuple[str, list[tuple[str, SqlType, float]], bool, set[str]]:
        """``SELECT exprs FROM name [WHERE]`` (a subquery's or CTE's body)."""
        scope = self.scope_of(name, "b")
        cols = []
        items = []
        duck = True
        feats: set[str] = set()
        for i in range(self.rng.randint(1, 4)):
            e = self.exprs.of_kind(scope, "any", self.rng.randint(0, 2))
            items.append(f"{e.sql} AS x{i}")
            cols.append((f"x{i}", e.type, e.bound))
            duck &= e.duck
            feats |= e.features
        where, wduck, wfeats = self._where(scope)
        return (
            f"SELECT {', '.join(items)} FROM {name} AS b{where}",
            cols,
            duck and wduck,
            feats | wfeats,
        )

    def _fw_subquery(self) -> FromWhere:
        name = self.table()
        body, cols, duck, feats = self._inner_select(name)
        scope = [Col(f"s.{c}", t, b) for c, t, b in cols]
        where, wduck, wfeats = self._where(scope, 0.4)
        return FromWhere(
            f"FROM ({body}) AS s{where}",
            scope,
            {name},
            duck and wduck,
            feats | wfeats | {"subquery"},
        )

    def _fw_cte(self) -> FromWhere:
        name = self.table()
        body, cols, duck, feats = self._inner_select(name)
        scope = [Col(f"c.{c}", t, b) for c, t, b in cols]
        where, wduck, wfeats = self._where(scope, 0.4)
        return FromWhere(
            f"FROM w AS c{where}",
            scope,
            {name},
            duck and wduck,
            feats | wfeats | {"cte"},
            [f"w AS ({body})"],
        )

    def _fw_join(self) -> FromWhere | None:
        rng = self.rng
        n = 3 if rng.random() < 0.3 else 2
        names = [self.table() for _ in range(n)]
        aliases = ["a", "b", "c"][:n]
        scopes = [self.scope_of(t, a) for t, a in zip(names, aliases, strict=True)]
        comma = rng.random() < 0.3
        constant = False
        parts = [f"{names[0]} AS a"]
        conds: list[str] = []
        pairs: list[tuple[str, str]] = []
        casts = False
        for i in range(1, n):
            left = [c for s in scopes[:i] for c in s]
            keys = self.join_keys(left, scopes[i])
            if keys is None:
                return None
            pairs += [(x.ref, y.ref) for x, y in keys]
            casts |= any(x.type != y.type for x, y in keys)
            eqs = [f"{x.ref} = {y.ref}" for x, y in keys]
            if rng.random() < 0.2:  # a residual (non-equi) condition between inputs
                a, b = self.exprs.comparable(left + scopes[i], 0)
                eqs.append(f"{a.sql} <= {b.sql}")
            if rng.random() < 0.04 and self.allowed("constant_join"):
                eqs.append("1 = 0")  # keyed, but never matching: empty
                constant = True
            if comma:
                parts.append(f"{names[i]} AS {aliases[i]}")
                conds += eqs
            else:
                parts.append(f"JOIN {names[i]} AS {aliases[i]} ON {' AND '.join(eqs)}")
        scope = [c for s in scopes for c in s]
        where, duck, feats = self._where(scope, 0.5)
        if comma:
            conds_sql = " AND ".join(conds)
            where = f"\nWHERE {conds_sql}" + (f" AND {where[7:]}" if where else "")
            text = "FROM " + ", ".join(parts) + where
        else:
            text = "FROM " + "\n  ".join(parts) + where
        features = feats | {"join", f"join{n}"} | ({"self_join"} if len(set(names)) < n else set())
        if constant:
            features.add("constant_join")
        if _class_with_two_columns_of_one_input(pairs):
            features.add("join_key_class_same_input")
        if casts:
            features.add("join_key_cast")
        return FromWhere(text, scope, set(names), duck, features)

    def _fw_outer_join(self) -> FromWhere | None:
        rng = self.rng
        left, right = self.table(), self.table()
        sa, sb = self.scope_of(left, "a"), self.scope_of(right, "b")
        keys = self.join_keys(sa, sb)
        if keys is None:
            return None
        side = rng.choice(["LEFT", "RIGHT", "FULL"])
        conds = [f"{x.ref} = {y.ref}" for x, y in keys]
        optional = {"LEFT": sb, "RIGHT": sa}.get(side)
        feats: set[str] = {"join_key_cast"} if any(x.type != y.type for x, y in keys) else set()
        if optional is not None and rng.random() < 0.4:
            c = self.exprs.boolean(optional, 1)
            conds.append(c.sql)
        if rng.random() < 0.12 and self.allowed("constant_join"):
            # a join that never matches: the preserved side padded with NULLs
            constant = rng.choice(["false", "1 = 0", "CAST(NULL AS BOOLEAN)"])
            conds = [constant] if rng.random() < 0.5 else [*conds, constant]
            feats.add("constant_join")
        scope = sa + sb
        where, duck, wfeats = self._where(scope, 0.4)
        return FromWhere(
            f"FROM {left} AS a {side} JOIN {right} AS b ON {' AND '.join(conds)}{where}",
            scope,
            {left, right},
            duck,
            feats | wfeats | {"outer_join", f"{side.lower()}_join"},
        )

    def _fw_semi_join(self) -> FromWhere | None:
        rng = self.rng
        outer, inner = self.table(), self.table()
        so, si = self.scope_of(outer, "a"), self.scope_of(inner, "i")
        keys = self.join_keys(so, si)
        if keys is None:
            return None
        kind = rng.choice(["EXISTS", "NOT EXISTS", "IN", "NOT IN"])
        casts = any(x.type != y.type for x, y in keys)
        filt = ""
        if rng.random() < 0.4:
            f = self.exprs.boolean(si, 1)
            # a condition on the subquery's own columns (README): a constant one is refused
            filt = f.sql if HAS_COLUMN.search(f.sql) else ""
        if kind in ("EXISTS", "NOT EXISTS"):
            conds = [f"{y.ref} = {x.ref}" for x, y in keys] + ([filt] if filt else [])
            pred = f"{kind} (SELECT 1 FROM {inner} AS i WHERE {' AND '.join(conds)})"
        elif kind == "IN":
            (x, y), rest = keys[0], keys[1:]
            conds = [f"{yy.ref} = {xx.ref}" for xx, yy in rest] + ([filt] if filt else [])
            where = f" WHERE {' AND '.join(conds)}" if conds else ""
            pred = f"{x.ref} IN (SELECT {y.ref} FROM {inner} AS i{where})"
        else:  # uncorrelated NOT IN, SQL's NULL rules
            x, y = keys[0]
            where = f" WHERE {filt}" if filt else ""
            pred = f"{x.ref} NOT IN (SELECT {y.ref} FROM {inner} AS i{where})"
        extra = ""
        duck = True
        feats: set[str] = set()
        if rng.random() < 0.4:
            c = self.exprs.boolean(so, 1)
            extra, duck, feats = f" AND {c.sql}", c.duck, set(c.features)
        name = kind.lower().replace(" ", "_")
        return FromWhere(
            f"FROM {outer} AS a\nWHERE {pred}{extra}",
            so,
            {outer, inner},
            duck,
            feats | {"semi_join", name} | ({"join_key_cast"} if casts else set()),
        )

    # -- SELECT shapes

    def outputs(self, scope: list[Col], n: int) -> tuple[list[str], list[tuple[str, SqlType, float]], bool, set[str]]:
        items, cols, exprs = [], [], []
        duck = True
        feats: set[str] = set()
        for i in range(n):
            if self.rng.random() < 0.4:
                c = self.rng.choice(scope)
                e = Expr(c.ref, c.type, c.bound)
            else:
                depth = self.rng.randint(0, 1 if self.simple else 2)
                e = self.exprs.of_kind(scope, "any", depth)
            items.append(f"{e.sql} AS {self.prefix}{i}")
            cols.append((f"{self.prefix}{i}", e.type, e.bound))
            exprs.append(e.sql)
            duck &= e.duck
            feats |= e.features
        self.last_exprs = exprs
        return items, cols, duck, feats

    def q_project(self, fw: FromWhere | None = None) -> Query:
        fw = fw or self.from_where()
        items, cols, duck, feats = self.outputs(fw.scope, self.rng.randint(1, 5))
        return self._query(f"SELECT {', '.join(items)}\n{fw.sql}", fw, cols, duck, feats)

    def _query(
        self, body: str, fw: FromWhere, cols: list, duck: bool, feats: set[str]
    ) -> Query:
        with_ = f"WITH {', '.join(fw.ctes)}\n" if fw.ctes else ""
        return Query(with_ + body, cols, duck and fw.duck, set(fw.reads), feats | fw.features)

    def aggregate(self, scope: list[Col]) -> Expr:
        """One aggregate call over ``scope`` with its result type and bound (its argument a
        plain column more often than not)."""
        rng = self.rng
        ex = _PlainFirst(self.exprs, scope, 0.75 if self.simple else 0.4)
        funcs = [
            ("count_star", 2), ("count", 1), ("sum", 3), ("avg", 2), ("min", 2), ("max", 2),
            ("var", 1.2), ("bool", 1), ("string_agg", 0.8), ("median", 0.4), ("percentile", 0.4),
        ]  # fmt: skip
        funcs = [(f, w) for f, w in funcs if self.allowed(f"agg_{f}")]
        func = rng.choices([f for f, _ in funcs], [w for _, w in funcs])[0]
        distinct = rng.random() < 0.2 and self.allowed("agg_distinct")
        filt = ""
        feats: set[str] = {f"agg_{func}"}
        duck = True
        if rng.random() < 0.2 and self.allowed("agg_filter"):
            cond = ex.boolean(scope, 1)
            filt = f" FILTER (WHERE {cond.sql})"
            duck &= cond.duck
            feats |= {"agg_filter"} | cond.features
        d = "DISTINCT " if distinct else ""
        if distinct:
            feats.add("agg_distinct")
        if func == "count_star":
            return Expr(f"count(*){filt}", BIGINT, ROWS_BOUND, duck, frozenset(feats))
        if func == "count":
            a = ex.of_kind(scope, "any", 1)
            return Expr(f"count({d}{a.sql}){filt}", BIGINT, ROWS_BOUND, duck and a.duck, frozenset(feats | a.features))
        if func in ("sum", "avg", "var", "median", "percentile"):
            kinds = ("int", "bigint", "decimal", "double")
            if func in ("median", "percentile"):
                distinct, d = False, ""
            # mostly the inexact and the wide: DOUBLE (cancellation), DECIMAL (digits)
            present = {c.type.kind for c in scope}
            pick = rng.choices(["double", "decimal", "any"], [0.45, 0.3, 0.25])[0]
            if pick in present:
                kinds = (pick,)
            a = ex.numeric(scope, 1, kinds)
            t = a.type
            duck &= a.duck
            feats |= a.features
            if t.kind == "double":
                feats.add(f"{func}_double")
                if not self.allowed(f"{func}_double"):
                    a = ex.numeric(scope, 1, ("int", "bigint", "decimal"))
                    t = a.type
                    feats.discard(f"{func}_double")
            if func == "sum":
                if t.integral:
                    rt, bound = BIGINT, a.bound * ROWS_BOUND
                elif t.kind == "decimal":
                    rt, bound = SqlType("decimal", min(38, t.p + 10), t.s), a.bound * ROWS_BOUND
                    if bound >= decimal_limit(rt):
                        return Expr(f"count(*){filt}", BIGINT, ROWS_BOUND, duck, frozenset(feats))
                else:
                    rt, bound = DOUBLE, math.inf
                return Expr(f"sum({d}{a.sql}){filt}", rt, bound, duck, frozenset(feats))
            if func == "avg":
                if t.kind == "decimal":
                    rt = SqlType("decimal", min(38, t.p + 4), min(38, t.s + 4))
                    if a.bound >= decimal_limit(rt):
                        return Expr(f"count(*){filt}", BIGINT, ROWS_BOUND, duck, frozenset(feats))
                    duck = False  # DuckDB's AVG of a decimal is a double
                    if rt.p > 28:
                        feats.add("avg_wide_decimal")
                else:
                    rt = DOUBLE
                return Expr(f"avg({d}{a.sql}){filt}", rt, a.bound, duck, frozenset(feats))
            if func == "var":
                f = rng.choice(["stddev", "stddev_samp", "stddev_pop", "variance", "var_samp", "var_pop"])
                # DuckDB's variance of doubles is off by up to 1e-7 relative (1e9 + 1, 1e9 + 2,
                # 1e9 + 3 and 1e9 + 2: 0.66666668653 for 2/3): Spark is the reference
                duck &= t.kind != "double"
                arg = a.sql
                if t.kind == "double":
                    # Spark's variance of values whose squares overflow (|x| > 1e154) is NaN or
                    # inf depending on its partitions (1e300, 1.0, 2.0: NaN in one, inf in two):
                    # no from-scratch answer to compare with
                    arg = f"CASE WHEN abs({a.sql}) < 1.0E150 THEN {a.sql} END"
                return Expr(f"{f}({d}{arg}){filt}", DOUBLE, math.inf, duck, frozenset(feats))
            if func == "median":
                return Expr(f"median({a.sql}){filt}", DOUBLE, a.bound, duck, frozenset(feats))
            # Spark's PERCENTILE_CONT/_DISC ... WITHIN GROUP keep the argument's type
            # (interpolated values of an integer column truncated); DuckDB's CONT interpolates.
            frac = rng.choice(["0.5", "0.25", "0.9"])
            f = rng.choice(["percentile_cont", "percentile_disc"])
            if filt:
                feats.add("filter_on_aggregate_alias")
            if f == "percentile_cont" and t.kind != "double":
                duck = False
            return Expr(
                f"{f}({frac}) WITHIN GROUP (ORDER BY {a.sql}){filt}",
                t, a.bound, duck, frozenset(feats),
            )  # fmt: skip
        if func in ("min", "max"):
            a = ex.of_kind(scope, "any", 1)
            return Expr(f"{func}({d}{a.sql}){filt}", a.type, a.bound, duck and a.duck, frozenset(feats | a.features))
        if func == "bool":
            c = ex.boolean(scope, 1)
            f = rng.choice(["bool_and", "bool_or", "every", "some"])
            duck &= f in ("bool_and", "bool_or") and not d  # DuckDB: no EVERY, SOME; sqlglot
            # garbles DISTINCT
            if filt and f in ("every", "some"):
                feats.add("filter_on_aggregate_alias")
            return Expr(f"{f}({d}{c.sql}){filt}", BOOLEAN, 0, duck and c.duck, frozenset(feats | c.features))
        a = ex.string(scope, 1)
        if not HAS_COLUMN.search(a.sql):  # DuckDB refuses ORDER BY a constant
            return Expr(f"count(*){filt}", BIGINT, ROWS_BOUND, duck, frozenset(feats))
        if distinct and filt:
            feats.add("distinct_string_agg_filter")
        sep = rng.choice(["|", ", ", ""])
        f = rng.choice(["string_agg", "listagg"])
        return Expr(
            f"{f}({d}{a.sql}, '{sep}') WITHIN GROUP (ORDER BY {a.sql}){filt}",
            STRING, 0, duck and a.duck, frozenset(feats | a.features),
        )  # fmt: skip

    def q_group(self, fw: FromWhere | None = None, *, global_: bool | None = None) -> Query:
        rng = self.rng
        fw = fw or self.from_where()
        if global_ is None:
            global_ = rng.random() < 0.2
        items: list[str] = []
        cols: list[tuple[str, SqlType, float]] = []
        group_by: list[str] = []
        keys: list[str] = []
        duck = True
        feats: set[str] = {"group_by"} if not global_ else {"global_aggregate"}
        if not global_:
            for _ in range(rng.randint(1, 2)):
                if rng.random() < 0.6:
                    c = rng.choice(fw.scope)
                    e = Expr(c.ref, c.type, c.bound)
                else:
                    e = self.exprs.of_kind(fw.scope, "any", 1)
                if e.type.kind == "double" and not self.allowed("double_keys"):
                    continue
                if not HAS_COLUMN.search(e.sql):
                    continue  # a constant key: GROUP BY 2 would be an ordinal
                items.append(f"{e.sql} AS {self.prefix}{len(items)}")
                cols.append((f"{self.prefix}{len(cols)}", e.type, e.bound))
                keys.append(e.sql)
                style = rng.random()
                group_by.append(
                    str(len(items)) if style < 0.2 else cols[-1][0] if style < 0.35 else e.sql
                )
                duck &= e.duck
                feats |= e.features
        def aggregate() -> Expr:
            """An aggregate; MIN/MAX or agg(DISTINCT) of a group key is tagged
            ``agg_of_group_key``."""
            for _ in range(5):
                a = self.aggregate(fw.scope)
                if not any(_keyed_agg_of(k).match(a.sql) for k in keys):
                    return a
                if self.allowed("agg_of_group_key"):
                    return replace(a, features=a.features | {"agg_of_group_key"})
            return Expr("count(*)", BIGINT, ROWS_BOUND)

        for _ in range(rng.randint(1, 2)):
            a = aggregate()
            items.append(f"{a.sql} AS {self.prefix}{len(items)}")
            cols.append((f"{self.prefix}{len(cols)}", a.type, a.bound))
            duck &= a.duck
            feats |= a.features
        text = f"SELECT {', '.join(items)}\n{fw.sql}"
        if group_by:
            text += f"\nGROUP BY {', '.join(group_by)}"
            if rng.random() < 0.4 and self.allowed("having"):
                a = aggregate()
                if a.type.numeric:
                    cond = f"{a.sql} > {literal(rng, INT).sql}"
                elif a.type.kind == "boolean":
                    cond = a.sql
                else:
                    cond = f"{a.sql} IS NOT NULL"
                text += f"\nHAVING {cond}"
                duck &= a.duck
                feats |= {"having"} | a.features
        return self._query(text, fw, cols, duck, feats)

    def q_distinct(self) -> Query:
        fw = self.from_where()
        items, cols, duck, feats = self.outputs(fw.scope, self.rng.randint(1, 3))
        return self._query(
            f"SELECT DISTINCT {', '.join(items)}\n{fw.sql}", fw, cols, duck, feats | {"distinct"}
        )

    def q_setop(self) -> Query:
        rng = self.rng
        op = rng.choice(["UNION ALL", "UNION", "INTERSECT", "INTERSECT ALL", "EXCEPT", "EXCEPT ALL"])
        if not self.allowed("set_operations"):
            op = "UNION ALL"
        first = self.q_project(self.from_where(semi=False))
        fw = self.from_where(semi=False)
        items = []
        duck = first.duck
        feats = set(first.features)
        for name, t, _ in first.columns:
            e = self.exprs.of_type(fw.scope, t, 2)
            items.append(f"{e.sql} AS {name}")
            duck &= e.duck
            feats |= e.features
        second = self._query(f"SELECT {', '.join(items)}\n{fw.sql}", fw, [], duck, feats)
        cols = [(n, t, b * 2) for n, t, b in first.columns]

        def wrapped(q: Query) -> str:  # a WITH inside a set operation's branch: as a subquery
            return f"SELECT * FROM ({q.sql}) AS u" if q.sql.startswith("WITH") else q.sql

        return Query(
            f"{wrapped(first)}\n{op}\n{wrapped(second)}",
            cols,
            duck and second.duck,
            first.reads | second.reads,
            feats | second.features | {op.lower().replace(" ", "_")},
        )

    def order_by(self, cols: list[tuple[str, SqlType, float]]) -> str:
        """An ORDER BY over every output column (a total order: the rows kept are
        deterministic), in random order and directions, NULLs placed explicitly."""
        names = [c for c, _, _ in cols]
        self.rng.shuffle(names)
        parts = []
        for n in names:
            d = self.rng.choice(["", " DESC"])
            nulls = self.rng.choice([" NULLS FIRST", " NULLS LAST"])
            parts.append(f"{n}{d}{nulls}")
        return ", ".join(parts)

    def q_topk(self) -> Query:
        rng = self.rng
        base = self.q_group() if rng.random() < 0.3 else self.q_project()
        k = rng.randint(1, 4)
        offset = f" OFFSET {rng.randint(1, 3)}" if rng.random() < 0.25 else ""
        text = f"{base.sql}\nORDER BY {self.order_by(base.columns)}\nLIMIT {k}{offset}"
        base.features |= {"topk"}
        return replace(base, sql=text)

    def q_row_number(self) -> Query:
        rng = self.rng
        fw = self.from_where(joins=False, semi=False)
        items, cols, duck, feats = self.outputs(fw.scope, rng.randint(2, 4))
        exprs = list(self.last_exprs)
        n_part = rng.randint(0, len(cols) - 1)
        # a window may not name the SELECT's aliases: partition and order by the expressions
        part = [i for i in range(n_part) if cols[i][1].kind != "double" or self.allowed("double_keys")]
        order = [i for i in range(len(cols)) if i not in part]
        rng.shuffle(order)
        keys = ", ".join(
            f"{exprs[i]}{rng.choice(['', ' DESC'])}{rng.choice([' NULLS FIRST', ' NULLS LAST'])}"
            for i in order
        )
        parts = ", ".join(exprs[i] for i in part)
        over = (f"PARTITION BY {parts} " if part else "") + f"ORDER BY {keys}"
        k = rng.randint(1, 3)
        feats |= {"row_number"}
        if len({exprs[i] for i in part}) < len(part):
            feats.add("duplicate_partition_key")
        if rng.random() < 0.3:
            text = f"SELECT {', '.join(items)}\n{fw.sql}\nQUALIFY ROW_NUMBER() OVER ({over}) <= {k}"
            return self._query(text, fw, cols, duck, feats | {"qualify"})
        inner = f"SELECT {', '.join(items)}, ROW_NUMBER() OVER ({over}) AS rn\n{fw.sql}"
        q = self._query(inner, fw, cols, duck, feats)
        text = f"SELECT * FROM (\n{q.sql}\n) AS r WHERE rn <= {k}"
        return replace(q, sql=text, columns=[*cols, ("rn", INT, 1e5)])

    def view(self, name: str) -> View:
        """One random view (all shapes the grammar allows, weighted)."""
        shapes = [
            ("project", 3), ("group", 3), ("distinct", 1), ("setop", 1.5), ("topk", 1.2),
            ("row_number", 1),
        ]  # fmt: skip
        shapes = [(s, w) for s, w in shapes if self.allowed(s)]
        shape = self.rng.choices([s for s, _ in shapes], [w for _, w in shapes])[0]
        self.prefix = f"{name}_"
        self.simple = self.rng.random() < 0.5
        q = getattr(self, f"q_{shape}")()
        hints = []
        if self.rng.random() < 0.3:
            hints.append(f"-- ivm: expected_group_size = {self.rng.choice([4, 20, 300])}")
        if "topk" in q.features or "row_number" in q.features:
            if self.rng.random() < 0.5:
                hints.append(f"-- ivm: topk_spare = {self.rng.choice([0, 1, 2])}")
        text = "\n".join([*hints, f"CREATE VIEW {name} AS", q.sql]) + "\n"
        self.last_columns = list(q.columns)
        return View(
            name,
            text,
            sorted(q.reads),
            [(c, t) for c, t, _ in q.columns],
            q.duck,
            sorted(q.features | {shape}),
        )


# -- generation of a whole case ---------------------------------------------------------------

COLUMN_KINDS = ["int", "bigint", "decimal", "decimal", "double", "double", "date", "timestamp", "string"]


def random_table(
    rng: random.Random,
    name: str,
    first_id: int,
    doubles: Sequence[float] = DOUBLE_VALUES,
    exact: bool = False,
) -> tuple[Table, int]:
    """A table of 20-45 random rows and a few exact duplicates; ``exact``: no DOUBLE column
    (the driver computes small changes of exact types only: such cases exercise its path)."""
    pool = [k for k in COLUMN_KINDS if not (exact and k == "double")]
    kinds = ["int", "string"] + [rng.choice(pool) for _ in range(rng.randint(1, 4))]
    for kind in ("decimal",) if exact else ("double", "decimal"):  # in most tables
        if kind not in kinds and rng.random() < 0.6:
            kinds.append(kind)
    rng.shuffle(kinds)
    columns: list[tuple[str, SqlType]] = [("id", BIGINT)]
    for j, kind in enumerate(kinds, start=1):
        t = SqlType("decimal", *rng.choice(SOURCE_DECIMALS)) if kind == "decimal" else SqlType(kind)
        short = {"decimal": "dec", "double": "dbl", "timestamp": "ts", "string": "str"}.get(kind, kind)
        columns.append((f"c{j}_{short}", t))
    table = Table(name, columns, [])
    n = rng.randint(20, 45)
    for i in range(n):
        table.rows.append(new_row(rng, table, first_id + i, doubles))
    for r in rng.sample(table.rows, rng.randint(2, 5)):  # exact duplicates
        table.rows.append(list(r))
    return table, first_id + n


def new_row(
    rng: random.Random, table: Table, ident: int, doubles: Sequence[float] = DOUBLE_VALUES
) -> list[Any]:
    return [ident] + [random_value(rng, t, doubles=doubles) for _, t in table.columns[1:]]


def column_bound(t: SqlType) -> float:
    if t.kind == "decimal":
        return min(decimal_limit(t), DECIMAL_DATA_BOUND)
    return BOUNDS.get(t.kind, 0.0)


def generate_case(
    seed: int,
    *,
    views: int = 5,
    batches: int = 3,
    excluded: frozenset[str] = frozenset(),
    exact: bool | None = None,
) -> Case:
    """A random case from ``seed``: sources, ``views`` views, ``batches`` batches (small and
    large ones), the features in ``excluded`` left out of the grammar; ``exact``: no DOUBLE
    column (None: a third of the cases, drawn)."""
    rng = random.Random(seed)
    tables: dict[str, Table] = {}
    next_id = 0
    doubles = DOUBLE_VALUES
    if "negative_zero" in excluded:
        doubles = [d for d in DOUBLE_VALUES if not (d == 0 and math.copysign(1, d) < 0)]
    drawn = rng.random() < 0.35  # no DOUBLE anywhere: the driver's path
    exact = drawn if exact is None else exact
    for i in range(rng.randint(1, 3)):
        t, next_id = random_table(rng, f"t{i}", next_id, doubles, exact)
        tables[t.name] = t
    collections = {
        t.name: [(c, ty, column_bound(ty)) for c, ty in t.columns] for t in tables.values()
    }
    gen = ViewGen(rng, collections, excluded)
    made: dict[str, View] = {}
    for i in range(views):
        name = f"v{i}"
        for _ in range(50):  # a view with an excluded feature (tagged deep inside) is redrawn
            view = gen.view(name)
            if not set(view.features) & excluded:
                break
        else:
            raise ValueError(f"no view without {sorted(excluded)} in 50 draws (seed {seed})")
        if any(r in made for r in view.reads):
            view.features = sorted({*view.features, "view_over_view"})
        if any(not made[r].duck for r in view.reads if r in made):
            view.duck = False  # DuckDB cannot evaluate what it reads as Spark does
        made[name] = view
        collections[name] = gen.last_columns  # later views may read this one
    case = Case(seed, tables, made, [], rng.choice([0.2, 0.2, 0.5, 1.0]))
    state = {n: [list(r) for r in t.rows] for n, t in tables.items()}
    for b in range(batches):
        large = b == batches - 1 or rng.random() < 0.25
        batch = random_batch(rng, tables, state, next_id, large, doubles)
        next_id += 1000
        case.batches.append(batch)
        case.batch_kinds.append("large" if large else "small")
    return case


def random_batch(
    rng: random.Random,
    tables: dict[str, Table],
    state: dict[str, list[list[Any]]],
    next_id: int,
    large: bool,
    doubles: Sequence[float] = DOUBLE_VALUES,
) -> list[Op]:
    """Deletes, updates (to and from NULL, onto values other rows hold) and inserts (new rows
    and exact copies of existing ones) on some of the tables; ``state`` follows along."""
    ops: list[Op] = []
    names = list(tables)
    touched = names if large else rng.sample(names, rng.randint(1, len(names)))
    for name in touched:
        t = tables[name]
        rows = state[name]
        ids = sorted({r[0] for r in rows})
        share = rng.uniform(0.3, 0.6) if large else 0.0
        n_del = int(len(ids) * share) if large else rng.randint(0, 3)
        n_upd = int(len(ids) * share / 2) if large else rng.randint(0, 3)
        n_ins = int(len(rows) * share) if large else rng.randint(0, 4)
        dele = rng.sample(ids, min(n_del, len(ids)))
        if dele:
            ops.append(Op(name, "delete", ids=sorted(dele)))
            rows[:] = [r for r in rows if r[0] not in set(dele)]
        left = sorted({r[0] for r in rows})
        upd = rng.sample(left, min(n_upd, len(left)))
        if upd:
            cols = rng.sample([c for c, _ in t.columns[1:]], rng.randint(1, 2))
            idx = [[c for c, _ in t.columns].index(c) for c in cols]
            changes = []
            for i in sorted(upd):
                values = []
                for c, j in zip(cols, idx, strict=True):
                    donor = rng.choice(rows)  # often a value another row holds
                    v = donor[j]
                    if rng.random() < 0.5:
                        v = random_value(rng, t.type_of(c), 0.25, doubles)
                    values.append(v)
                changes.append([i, *values])
                for r in rows:
                    if r[0] == i:
                        for j, v in zip(idx, values, strict=True):
                            r[j] = v
            ops.append(Op(name, "update", rows=changes, columns=cols))
        new = [new_row(rng, t, next_id + k, doubles) for k in range(n_ins)]
        next_id += n_ins
        if rows and rng.random() < 0.6:
            new += [list(r) for r in rng.sample(rows, min(len(rows), rng.randint(1, 2)))]
        if new:
            ops.append(Op(name, "insert", rows=new))
            rows.extend(list(r) for r in new)
    return ops


# -- running a case ---------------------------------------------------------------------------

CDF = {"delta.enableChangeDataFeed": "true"}


def write_sources(case: Case, data_dir: Path) -> dict[str, str]:
    """Each table's initial rows as a Delta table with the change data feed on."""
    from deltalake import write_deltalake

    paths = {}
    for name, t in case.tables.items():
        path = str(data_dir / name)
        write_deltalake(path, t.arrow(t.rows), configuration=CDF)
        paths[name] = path
    return paths


def apply_batch(case: Case, batch: list[Op], paths: dict[str, str]) -> None:
    """One batch's operations, each its own Delta commit (delete, MERGE update, append)."""
    from deltalake import DeltaTable, write_deltalake

    for op in batch:
        t = case.tables[op.table]
        path = paths[op.table]
        if op.kind == "delete":
            DeltaTable(path).delete(f"id IN ({', '.join(map(str, op.ids))})")
        elif op.kind == "insert":
            write_deltalake(path, t.arrow(op.rows), mode="append")
        else:
            schema = pa.schema([(c, t.type_of(c).arrow()) for c in ["id", *op.columns]])
            source = pa.Table.from_pylist(
                [dict(zip(schema.names, r, strict=True)) for r in op.rows], schema=schema
            )
            (
                DeltaTable(path)
                .merge(source, predicate="t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update(updates={c: f"s.{c}" for c in op.columns})
                .execute()
            )


def write_project(case: Case, root: Path, paths: dict[str, str] | None = None) -> Path:
    """``ivm.toml`` and ``views/*.sql`` for ``case`` under ``root`` (sources in ``data/``)."""
    (root / "views").mkdir(parents=True, exist_ok=True)
    lines = ['lake = "lake"', 'views = "views"', "[sources]"]
    for name in case.tables:
        lines.append(f'{name} = "{(paths or {}).get(name, f"data/{name}")}"')
    lines += ["[refresh]", f"recompute_above = {case.recompute_above}"]
    (root / "ivm.toml").write_text("\n".join(lines) + "\n")
    for name, v in case.views.items():
        (root / "views" / f"{name}.sql").write_text(v.sql)
    return root


@contextlib.contextmanager
def forced_path(path: str) -> Iterator[None]:
    """The execution policy of one path (:mod:`ivm.policy`): ``driver`` (the policy in force:
    small changes computed and written by the driver) or ``spark``
    (:meth:`~ivm.policy.Policy.spark_only`: every change computed and written by Spark: no
    small change, no driver views, writes, state, sorts, builds or lookups). Both lower
    ``recompute_min_rows`` to :data:`RECOMPUTE_MIN_ROWS` so that a large batch of these small
    tables is recomputed, as a large one of a big table is."""
    import ivm.policy
    from ivm.policy import Policy

    if path == "spark":
        chosen = Policy.spark_only(recompute_min_rows=RECOMPUTE_MIN_ROWS)
    elif path == "driver":
        chosen = ivm.policy.current().replace(recompute_min_rows=RECOMPUTE_MIN_ROWS)
    else:
        raise ValueError(f"path must be 'driver' or 'spark', not {path!r}")
    with ivm.policy.using(chosen):
        yield


@dataclass
class Failure:
    """What went wrong: the view, the epoch (0: planning), the kind and a description;
    ``step``: how many of the case's batches had been applied (0: the build; -1: planning)."""

    view: str
    epoch: int
    kind: str  # refused | failed | crash | spark | duckdb | log | schema | path
    message: str
    step: int = -1

    def same(self, other: Failure | None) -> bool:
        return other is not None and other.view == self.view and other.kind == self.kind


@dataclass
class RunResult:
    failures: list[Failure] = field(default_factory=list)
    computed_by: Counter = field(default_factory=Counter)  # computed_by / status -> views
    seconds: float = 0.0
    checks: int = 0
    timings: Counter = field(default_factory=Counter)  # seconds: refresh, spark, duckdb...


def _norm_value(v: Any) -> Any:
    if isinstance(v, dt.datetime) and v.tzinfo is not None:
        return v.astimezone(dt.UTC).replace(tzinfo=None)
    return v


def _floats_close(a: Any, b: Any) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if math.isnan(a) or math.isnan(b):
        return math.isnan(a) and math.isnan(b)
    if a == b:
        return True
    return math.isclose(a, b, rel_tol=FLOAT_REL_TOL, abs_tol=FLOAT_ABS_TOL)


def multiset_diff(
    expected: list[tuple], actual: list[tuple], float_cols: Sequence[int]
) -> tuple[list[tuple], list[tuple]]:
    """``(missing, extra)``: rows of ``expected`` not matched in ``actual`` and the converse.
    Columns in ``float_cols`` match within :data:`FLOAT_REL_TOL` (exact matches paired first);
    the rest exactly."""
    fset = set(float_cols)

    def norm(row: tuple) -> tuple:
        return tuple(
            (0.0 if v == 0 else v) if i in fset and v is not None else _norm_value(v)
            for i, v in enumerate(row)
        )

    want = Counter(norm(r) for r in expected)
    got = Counter(norm(r) for r in actual)
    common = want & got
    want_rest, got_rest = list((want - common).elements()), list((got - common).elements())
    if not fset or not want_rest or not got_rest:
        return want_rest, got_rest

    def exact_part(row: tuple) -> tuple:
        return tuple(v for i, v in enumerate(row) if i not in fset)

    pools: dict[tuple, list[tuple]] = {}
    for row in got_rest:
        pools.setdefault(exact_part(row), []).append(row)
    missing = []
    for row in want_rest:
        pool = pools.get(exact_part(row), [])
        hit = next(
            (
                k
                for k, other in enumerate(pool)
                if all(_floats_close(row[i], other[i]) for i in fset)
            ),
            None,
        )
        if hit is None:
            missing.append(row)
        else:
            pool.pop(hit)
    return missing, [r for pool in pools.values() for r in pool]


def _rows(table: pa.Table) -> list[tuple]:
    return [tuple(r.values()) for r in table.to_pylist()]


def _describe_diff(label: str, missing: list[tuple], extra: list[tuple], limit: int = 4) -> str:
    return (
        f"{label}: {len(missing)} rows missing from the view, {len(extra)} extra; "
        f"missing e.g. {missing[:limit]}, extra e.g. {extra[:limit]}"
    )


def _float_columns(schema: pa.Schema) -> list[int]:
    return [i for i, f in enumerate(schema) if pa.types.is_floating(f.type)]


def _kind_of(t: pa.DataType) -> str:
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    if pa.types.is_timestamp(t):
        return "timestamp"
    return str(t)


def differences(expected: pa.Table, actual: pa.Table) -> tuple[list, list, str]:
    """``(missing, extra, rules)``: the oracle's rows the view lacks and the view's rows the
    oracle lacks, under :func:`engine.oracle.table_differences`'s rules when it has them (exact;
    DOUBLEs within its relative tolerance; DuckDB's decimals rounded to the engine's scale),
    else :func:`multiset_diff`'s."""
    from engine import oracle

    compare = getattr(oracle, "table_differences", None)
    if compare is None:
        expected = oracle.align_types(expected, actual)
        missing, extra = multiset_diff(_rows(expected), _rows(actual), _float_columns(actual.schema))
        return missing, extra, f"doubles within {FLOAT_REL_TOL} relative"
    d = compare(expected, actual)
    rules = "; ".join([*d.tolerances(), *d.notes])
    return list(d.missing.elements()), list(d.extra.elements()), rules


def check_view(engine: Any, view: View) -> list[Failure]:
    """(b) Spark's from-scratch result (:func:`engine.oracle.spark_compare_views` when there is
    one) and its columns (names and types: Spark's analysis of the SQL), (c) the view's diff
    log summed against its table (:func:`engine.oracle.log_differences` when there is one)."""
    from engine import oracle

    failures = []
    name = view.name
    epoch = engine.view_status(name).table_epoch
    actual = engine.read_view(name)
    try:
        df = engine.from_scratch(name, epoch)
        want = [(f.name.lower(), _kind_of(f.type)) for f in _arrow_schema(df)]
        spark_compare = getattr(oracle, "spark_compare_views", None)
        if spark_compare is not None:
            (c,) = spark_compare(engine, [name])
            missing, extra = list(c.missing.elements()), list(c.extra.elements())
            rules = "; ".join([*c.tolerances, *c.notes])
        else:
            missing, extra, rules = differences(df.toArrow(), actual)
    except Exception as e:  # noqa: BLE001 - any error of Spark's evaluation is reported
        return [Failure(name, epoch, "spark", f"Spark's from-scratch evaluation failed: {e}")]
    got = [(f.name, _kind_of(f.type)) for f in actual.schema]
    if want != got:
        failures.append(Failure(name, epoch, "schema", f"columns {got} differ from Spark's {want}"))
    if missing or extra:
        failures.append(
            Failure(
                name,
                epoch,
                "spark",
                _describe_diff("vs Spark from scratch", missing, extra)
                + (f" (compared: {rules})" if rules else ""),
            )
        )
    log_differences = getattr(oracle, "log_differences", None)
    if log_differences is not None:
        only_table, only_log, negative = log_differences(engine, name, epoch)
        if only_table or only_log or negative:
            failures.append(
                Failure(
                    name,
                    epoch,
                    "log",
                    f"diff log summed != table: {only_table} rows only in the table, "
                    f"{only_log} only in the log, {negative} negative multiplicities",
                )
            )
        return failures
    log = oracle.log_multiset(engine, name, epoch)
    table = oracle.table_multiset(actual)
    if log != table:
        failures.append(
            Failure(
                name,
                epoch,
                "log",
                f"diff log summed != table: log-only {list((log - table).items())[:3]}, "
                f"table-only {list((table - log).items())[:3]}, negative "
                f"{[k for k, v in log.items() if v < 0][:3]}",
            )
        )
    return failures


def _arrow_schema(df: Any) -> pa.Schema:
    """A Spark DataFrame's schema as Arrow types (its analysis only: nothing runs)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(df.schema)


def duckdb_evaluate(engine: Any, epoch: int, names: Sequence[str]) -> dict[str, pa.Table | str]:
    """Each of ``names`` (with the views it reads) evaluated by DuckDB from scratch at
    ``epoch``, as :func:`engine.oracle.duckdb_evaluate` does (the view's SQL transpiled by sqlglot,
    sources read with delta-rs at the epoch's versions); a view DuckDB cannot evaluate gives
    its error's text instead of a table."""
    import duckdb

    from engine.oracle import _dataset
    from ivm.sql.parse import parse_view
    from resources.lake import open_table

    record = {e.epoch: e for e in engine.epochs()}[epoch]
    con = duckdb.connect()
    out: dict[str, pa.Table | str] = {}
    try:
        for name, source in engine.sources.items():
            dt_ = open_table(source.uri, record.ranges[name][1])
            con.register(f"__src_{name}", _dataset(dt_))
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "__src_{name}"')
        wanted = set(names)
        for name in engine.plan.order:
            view = engine.plan.views[name]
            try:
                query = parse_view(view.sql, view.file).query.sql(dialect="duckdb")
                con.execute(f'CREATE VIEW "{name}" AS {query}')
                if name in wanted:
                    out[name] = con.sql(f'SELECT * FROM "{name}"').to_arrow_table()
            except duckdb.Error as e:
                out[name] = f"{type(e).__name__}: {e}"
        return out
    finally:
        con.close()


def check_duckdb(engine: Any, case: Case, names: Sequence[str]) -> list[Failure]:
    """(a) DuckDB from scratch, for the views it evaluates as Spark does (``View.duck``)."""
    failures = []
    by_epoch: dict[int, dict[str, pa.Table | str]] = {}
    for name in names:
        if not case.views[name].duck:
            continue
        epoch = engine.view_status(name).table_epoch
        if epoch not in by_epoch:
            duck = [n for n in names if case.views[n].duck]
            by_epoch[epoch] = duckdb_evaluate(engine, epoch, duck)
        got = by_epoch[epoch][name]
        if isinstance(got, str):
            failures.append(Failure(name, epoch, "duckdb", f"DuckDB's evaluation failed: {got}"))
            continue
        missing, extra, rules = differences(got, engine.read_view(name))
        if missing or extra:
            failures.append(
                Failure(
                    name,
                    epoch,
                    "duckdb",
                    _describe_diff("vs DuckDB from scratch", missing, extra)
                    + (f" (compared: {rules})" if rules else ""),
                )
            )
    return failures


def _crash(engine: Any, names: Sequence[str], epoch: int, error: Exception) -> Failure:
    """An error that is no :class:`~ivm.errors.IvmError` escaped the refresh (a bug): which
    view raised it is found by refreshing the views one at a time, in dependency order."""
    culprit = "*"
    for name in [n for n in engine.plan.order if n in names]:
        try:
            engine.refresh([name])
        except Exception as again:  # noqa: BLE001 - the same bug, now attributed
            culprit, error = name, again
            break
    repo = str(Path(__file__).resolve().parent.parent)
    frames = [
        f"{f.filename.removeprefix(repo + '/')}:{f.lineno} {f.name}"
        for f in traceback.extract_tb(error.__traceback__)
        if f.filename.startswith(repo) and "/.venv/" not in f.filename
    ]
    head = f"refresh raised {type(error).__name__}: {str(error).splitlines()[0][:600]}"
    return Failure(culprit, epoch, "crash", f"{head}\n  at {' <- '.join(reversed(frames[-10:]))}")


def _refusal(error: Exception) -> bool:
    """Whether a planner error is one README.md documents as unsupported."""
    from ivm.errors import UnsupportedSqlError

    unsupported = isinstance(error, UnsupportedSqlError) or "is not supported" in str(error)
    return unsupported and any(marker in str(error) for marker in README_UNSUPPORTED)


def run_case(
    case: Case,
    spark: Any,
    path: str,
    work: Path,
    *,
    only: Sequence[str] | None = None,
    stop_at_first: bool = True,
    duckdb: bool = True,
) -> RunResult:
    """Build ``case`` under ``work``, apply its batches one epoch each, and check every view
    (or those in ``only``) after the build and every epoch, on ``path``.

    Returns the failures (from the first failing epoch when ``stop_at_first``), what computed
    the views (``computed_by`` and statuses, counted), the time taken and checks made.
    """
    from engine.facade import Engine

    started = time.perf_counter()
    result = RunResult()
    if work.exists():
        shutil.rmtree(work)
    work.mkdir(parents=True)
    paths = write_sources(case, work / "data")
    root = write_project(case, work / "project", paths)
    (work / "case.json").write_text(pretty_json(case.to_json()) + "\n")  # for a look later
    names = [n for n in case.views if only is None or n in only]
    with forced_path(path):
        engine = Engine(root, spark=spark, progress=lambda _m: None)
        for name, error in engine.plan.broken.items():
            if type(error).__name__ == "UpstreamBroken":
                continue  # the view it waits for is reported
            if not _refusal(error):
                kind = "refused" if "Unsupported" in type(error).__name__ else "failed"
                result.failures.append(Failure(name, 0, kind, f"{type(error).__name__}: {error}"))
        if result.failures:
            result.seconds = time.perf_counter() - started
            return result
        for step in range(len(case.batches) + 1):
            t0 = time.perf_counter()
            if step:
                apply_batch(case, case.batches[step - 1], paths)
            t1 = time.perf_counter()
            result.timings["sources"] += t1 - t0
            try:
                report = engine.refresh(only)
                result.timings["refresh"] += time.perf_counter() - t1
            except Exception as e:  # noqa: BLE001 - an engine crash is the finding
                result.failures.append(replace(_crash(engine, names, step + 1, e), step=step))
                break
            failures: list[Failure] = []
            for v in report.views:
                result.timings[f"view {v.view}"] += v.seconds
                result.computed_by[f"{v.computed_by}" if step else "build"] += 1
                result.computed_by[f"status {v.status}"] += 1
                if v.status in ("failed", "skipped"):
                    failures.append(Failure(v.view, v.epoch or step + 1, "failed", str(v.error)))
                elif path == "spark" and v.computed_by in ("driver", "mixed"):
                    failures.append(
                        Failure(v.view, v.epoch, "path", f"computed by {v.computed_by} with Spark forced")
                    )
            failed_views = {f.view for f in failures}
            t2 = time.perf_counter()
            for name in names:
                if name in failed_views:
                    continue
                failures += check_view(engine, case.views[name])
                result.checks += 1
            t3 = time.perf_counter()
            result.timings["check spark"] += t3 - t2
            if duckdb:
                failures += check_duckdb(engine, case, [n for n in names if n not in failed_views])
            result.timings["check duckdb"] += time.perf_counter() - t3
            result.failures += [replace(f, step=step) for f in failures]
            if failures and stop_at_first:
                break
    result.seconds = time.perf_counter() - started
    return result


# -- reduction --------------------------------------------------------------------------------


def upstream(case: Case, view: str) -> set[str]:
    """``view`` and every view it reads, transitively."""
    out, todo = set(), [view]
    while todo:
        v = todo.pop()
        if v in out or v not in case.views:
            continue
        out.add(v)
        todo += case.views[v].reads
    return out


def restrict(case: Case, views: set[str]) -> Case:
    """``case`` with only ``views`` and the tables they read (their batches' ops too)."""
    tables = {r for v in views for r in case.views[v].reads if r in case.tables}
    return Case(
        case.seed,
        {n: t for n, t in case.tables.items() if n in tables},
        {n: v for n, v in case.views.items() if n in views},
        [[op for op in b if op.table in tables] for b in case.batches],
        case.recompute_above,
        list(case.batch_kinds),
    )


def _drop_column(case: Case, table: str, column: str) -> Case:
    t = case.tables[table]
    j = [c for c, _ in t.columns].index(column)
    new_t = Table(t.name, [c for i, c in enumerate(t.columns) if i != j], [r[:j] + r[j + 1 :] for r in t.rows])
    batches = []
    for b in case.batches:
        ops = []
        for op in b:
            if op.table != table:
                ops.append(op)
            elif op.kind == "insert":
                ops.append(replace(op, rows=[r[:j] + r[j + 1 :] for r in op.rows]))
            elif op.kind == "update" and column in op.columns:
                k = op.columns.index(column) + 1
                cols = [c for c in op.columns if c != column]
                if cols:
                    ops.append(replace(op, columns=cols, rows=[r[:k] + r[k + 1 :] for r in op.rows]))
            else:
                ops.append(op)
        batches.append(ops)
    return replace(case, tables={**case.tables, table: new_t}, batches=batches)


def reduce_case(
    case: Case,
    failure: Failure,
    attempt: Callable[[Case], Failure | None],
    budget_seconds: float,
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[Case, Failure]:
    """A smaller case that still fails as ``failure`` did (same view, same kind), within
    ``budget_seconds``: the views the failing one does not read, the tables they do not read,
    and the batches after the failing step dropped first; then, each kept only while
    ``attempt`` still fails: earlier batches, operations, initial rows (halves, quarters...
    then one by one), rows of operations; last, the columns no kept view names."""
    deadline = time.monotonic() + budget_seconds
    best, best_failure = case, failure

    def cut(c: Case, f: Failure) -> Case:
        """No batch after the failing step, no empty batch."""
        batches = c.batches[: f.step] if f.step >= 0 else c.batches
        kinds = c.batch_kinds[: len(batches)]
        kept = [(b, k) for b, k in zip(batches, kinds + [""] * len(batches), strict=False) if b]
        return replace(c, batches=[b for b, _ in kept], batch_kinds=[k for _, k in kept])

    def keep(candidate: Case, what: str) -> bool:
        nonlocal best, best_failure
        if time.monotonic() > deadline:
            return False
        got = attempt(candidate)
        if got is not None and failure.same(got):
            log(f"reduced: {what}")
            best, best_failure = cut(candidate, got), got
            return True
        return False

    trimmed = cut(case, failure)
    if failure.view in case.views:
        trimmed = cut(restrict(trimmed, upstream(trimmed, failure.view)), failure)
    if not keep(trimmed, "views and tables not read, later batches dropped"):
        best = cut(case, failure)
    # earlier batches, last first
    i = len(best.batches) - 1
    while i >= 0 and time.monotonic() < deadline:
        if i < len(best.batches):
            keep(replace(best, batches=best.batches[:i] + best.batches[i + 1 :]), f"batch {i}")
        i -= 1
    # whole operations
    for bi in range(len(best.batches)):
        oi = len(best.batches[bi]) - 1 if bi < len(best.batches) else -1
        while oi >= 0 and time.monotonic() < deadline:
            if bi < len(best.batches) and oi < len(best.batches[bi]):
                b = best.batches[bi]
                cand_b = [*best.batches[:bi], b[:oi] + b[oi + 1 :], *best.batches[bi + 1 :]]
                keep(replace(best, batches=cand_b), f"op {oi} of batch {bi}")
            oi -= 1
    # initial rows, by chunks (ddmin-like), per table
    for tname in list(best.tables):
        chunk = max(len(best.tables[tname].rows) // 2, 1)
        while time.monotonic() < deadline:
            start = 0
            while start < len(best.tables[tname].rows) and time.monotonic() < deadline:
                t = best.tables[tname]
                rows = t.rows[:start] + t.rows[start + chunk :]
                cand = replace(best, tables={**best.tables, tname: replace(t, rows=rows)})
                if not keep(cand, f"{tname} rows {start}..{start + chunk}"):
                    start += chunk
            if chunk == 1:
                break
            chunk //= 2
    # rows inside operations
    for bi in range(len(best.batches)):
        for oi in range(len(best.batches[bi]) if bi < len(best.batches) else 0):
            ri = 0
            while time.monotonic() < deadline and bi < len(best.batches):
                if oi >= len(best.batches[bi]):
                    break
                op = best.batches[bi][oi]
                items = op.ids if op.kind == "delete" else op.rows
                if ri >= len(items) or len(items) <= 1:
                    break
                rest = items[:ri] + items[ri + 1 :]
                new_op = replace(op, ids=rest) if op.kind == "delete" else replace(op, rows=rest)
                b = list(best.batches[bi])
                b[oi] = new_op
                cand = replace(best, batches=[*best.batches[:bi], b, *best.batches[bi + 1 :]])
                if not keep(cand, f"row {ri} of op {oi}, batch {bi}"):
                    ri += 1
    # columns no kept view names (the views do not see them); confirmed by one more run
    text = " ".join(v.sql for v in best.views.values())
    narrow = best
    for tname, t in list(narrow.tables.items()):
        for column, _ in list(t.columns):
            if column != "id" and not re.search(rf"\b{column}\b", text):
                narrow = _drop_column(narrow, tname, column)
    if narrow is not best:
        got = attempt(narrow)
        if got is not None and failure.same(got):
            best, best_failure = narrow, got
    return best, best_failure


# -- reproducers ------------------------------------------------------------------------------

REPLAY = '''"""Replays this reproducer: python replay.py [--path driver|spark] (from the repository)."""
import sys
from pathlib import Path

sys.path.insert(0, {repo!r})
from tests.fuzz import main

main(["replay", str(Path(__file__).parent), *sys.argv[1:]])
'''


def pretty_json(value: Any, indent: int = 0) -> str:
    """JSON with objects indented and lists of plain values (rows) on one line each."""
    pad = " " * (indent + 1)
    if isinstance(value, dict) and value:
        items = [f"{pad}{json.dumps(k)}: {pretty_json(v, indent + 1)}" for k, v in value.items()]
        return "{\n" + ",\n".join(items) + "\n" + " " * indent + "}"
    if isinstance(value, list) and any(isinstance(v, dict | list) for v in value):
        flat = all(
            not isinstance(v, dict) and not any(isinstance(x, dict | list) for x in v)
            for v in value
            if isinstance(v, list | dict)
        )
        if not flat or len(value) > 1:
            items = [f"{pad}{pretty_json(v, indent + 1)}" for v in value]
            return "[\n" + ",\n".join(items) + "\n" + " " * indent + "]"
    return json.dumps(value, ensure_ascii=False)


def write_reproducer(case: Case, failure: Failure, path: str, folder: Path) -> Path:
    """The case as a project folder: ``ivm.toml``, ``views/*.sql``, ``case.json`` (source rows
    and batches), ``replay.py``, ``FAILURE.txt``."""
    if folder.exists():
        shutil.rmtree(folder)
    write_project(case, folder)
    data = case.to_json()
    data["path"] = path
    data["failure"] = {"view": failure.view, "epoch": failure.epoch, "kind": failure.kind}
    (folder / "case.json").write_text(pretty_json(data) + "\n")
    repo = str(Path(__file__).resolve().parent.parent)
    (folder / "replay.py").write_text(REPLAY.format(repo=repo))
    (folder / "FAILURE.txt").write_text(
        f"view {failure.view}, epoch {failure.epoch} ({failure.kind}), {path} path:\n"
        f"{failure.message}\n"
    )
    return folder


def describe_reproducer(folder: Path, limit: int = 6000) -> str:
    """The reproducer's files, for an assertion message."""
    parts = [f"reproducer: {folder}  (replay: .venv/bin/python {folder / 'replay.py'})"]
    for f in [folder / "FAILURE.txt", folder / "ivm.toml", *sorted((folder / "views").glob("*.sql"))]:
        parts.append(f"--- {f.relative_to(folder)}\n{f.read_text().rstrip()}")
    data = (folder / "case.json").read_text()
    if len(data) > limit:
        data = data[:limit] + f"\n... ({len(data)} chars; see the file)"
    parts.append(f"--- case.json\n{data}")
    return "\n".join(parts)


def reproduce(
    case: Case,
    failure: Failure,
    spark: Any,
    path: str,
    out_dir: Path,
    budget_seconds: float,
    log: Callable[[str], None] = lambda _m: None,
) -> tuple[Path, Case, Failure]:
    """Reduce a failing case (each attempt a fresh run on ``path``) and write it out."""
    counter = [0]

    def attempt(candidate: Case) -> Failure | None:
        counter[0] += 1
        work = Path(tempfile.mkdtemp(prefix="ivm-fuzz-reduce-"))
        try:
            only = sorted(upstream(candidate, failure.view)) if failure.view in candidate.views else None
            got = run_case(candidate, spark, path, work / "run", only=only)
        except Exception as e:  # noqa: BLE001 - a candidate that breaks the harness is no repro
            log(f"attempt {counter[0]}: {type(e).__name__}: {e}")
            return None
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return next((f for f in got.failures if f.view == failure.view), None)

    small, small_failure = reduce_case(case, failure, attempt, budget_seconds, log)
    folder = out_dir / f"ivm-fuzz-seed{case.seed}-{path}-{failure.view}"
    write_reproducer(small, small_failure, path, folder)
    log(f"{counter[0]} attempts")
    return folder, small, small_failure


# -- command line -----------------------------------------------------------------------------


def main(argv: Sequence[str] | None = None) -> None:
    """``replay DIR [--path P]``: rerun a reproducer; ``show SEED [--views N] [--all]``: print
    a generated case's views (the default run's grammar; ``--all``: the long run's)."""
    parser = argparse.ArgumentParser(prog="python -m tests.fuzz")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay")
    rp.add_argument("folder")
    rp.add_argument("--path", choices=["driver", "spark"], default=None)
    sp = sub.add_parser("show")
    sp.add_argument("seed", type=int)
    sp.add_argument("--views", type=int, default=4)
    sp.add_argument("--all", action="store_true", help="the long run's grammar (no exclusions)")
    args = parser.parse_args(argv)
    if args.command == "show":
        excluded = frozenset() if args.all else frozenset(KNOWN_BUG_FEATURES)
        case = generate_case(args.seed, views=args.views, excluded=excluded)
        for v in case.views.values():
            print(v.sql, f"-- duck={v.duck} features={v.features}\n")
        return
    folder = Path(args.folder)
    data = json.loads((folder / "case.json").read_text())
    case = Case.from_json(data)
    path = args.path or data.get("path", "driver")
    from resources.spark import get_spark
    from tests.conftest import TEST_SPARK_CONF

    spark = get_spark(TEST_SPARK_CONF)
    work = Path(tempfile.mkdtemp(prefix="ivm-fuzz-replay-"))
    result = run_case(case, spark, path, work, stop_at_first=False)
    for f in result.failures:
        print(f"FAIL {f.view} epoch {f.epoch} [{f.kind}]: {f.message}")
    print(f"{len(result.failures)} failures, {result.checks} checks, {dict(result.computed_by)}")
    print(f"project: {work / 'project'}")
    sys.exit(1 if result.failures else 0)


if __name__ == "__main__":
    main()
