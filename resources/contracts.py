"""Source contracts: a pandera schema a user declares for a source, checked on the way in.

Owns loading a declared schema (``[contracts]`` in ``ivm.toml``: ``orders =
"contracts.py:Orders"``, a ``pandera.pyspark`` ``DataFrameModel`` or any pandera
``DataFrameSchema`` in a file of the project) and turning it into two checks:

- **table level**, when the engine opens the source: every declared column exists with the
  declared type (and, for ``strict`` schemas, no other column does). A violation makes the
  source unreadable (:class:`ivm.errors.ContractError`): the views reading it wait, the others
  refresh.
- **row level**: ``nullable=False`` and pandera's built-in value checks (``ge``, ``in_range``,
  ``isin``, ``str_matches``, ``str_length``, ...) become one SQL predicate. Like pandera,
  value checks let NULL pass (only ``nullable=False`` rejects it).

Contract in ``(data, time, diff)`` terms: with a contract, every view reads the source's
updates ``(row, t, d)`` for which the predicate holds, and nothing else; the others are
quarantined (see ``Engine.quarantine``). Because the predicate is a function of the row, a
row's insertion and its later deletion are filtered alike, so each view equals its SQL over
the source's valid rows at every epoch.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
from sqlglot import exp

from ivm.errors import ConfigError, ContractError

SUPPORTED_CHECKS = (
    "equal_to",
    "not_equal_to",
    "greater_than",
    "greater_than_or_equal_to",
    "less_than",
    "less_than_or_equal_to",
    "in_range",
    "isin",
    "notin",
    "str_matches",
    "str_contains",
    "str_startswith",
    "str_endswith",
    "str_length",
)

_PANDAS_TYPES = {
    "int64": "bigint",
    "int32": "int",
    "int16": "smallint",
    "int8": "tinyint",
    "float64": "double",
    "float32": "float",
    "bool": "boolean",
    "str": "string",
    "string": "string",
    "date": "date",
}


@dataclass(frozen=True, slots=True)
class ColumnRule:
    """One declared column: its type (Spark simple string, None: any) and row checks."""

    name: str
    type: str | None
    nullable: bool
    checks: tuple[tuple[str, Mapping[str, Any]], ...]


@dataclass(frozen=True, slots=True)
class Contract:
    """A source's declared schema, in the terms the engine checks it.

    Attributes:
        source: the source's name.
        declared_in: ``file:attribute`` of the pandera schema, for messages.
        columns: the declared columns.
        strict: whether columns other than the declared ones are an error.
    """

    source: str
    declared_in: str
    columns: tuple[ColumnRule, ...]
    strict: bool

    def check_schema(self, schema: pa.Schema) -> None:
        """Compare the source's current schema with the declaration.

        Raises:
            ContractError: a declared column is missing or has another type, or (strict) the
                table has an undeclared column.
        """
        actual = {f.name.lower(): spark_type_name(f.type) for f in schema}
        for col in self.columns:
            have = actual.get(col.name.lower())
            if have is None:
                raise ContractError(
                    f"source {self.source!r}: column {col.name!r} declared in "
                    f"{self.declared_in} is missing (columns: {', '.join(actual)})"
                )
            if col.type is not None and have != col.type:
                raise ContractError(
                    f"source {self.source!r}: column {col.name!r} is {have}, but "
                    f"{self.declared_in} declares {col.type}"
                )
        if self.strict:
            extra = sorted(set(actual) - {c.name.lower() for c in self.columns})
            if extra:
                raise ContractError(
                    f"source {self.source!r}: column {extra[0]!r} is not declared in "
                    f"{self.declared_in} (a strict schema)"
                )

    def predicate(self) -> exp.Expression | None:
        """The row-level checks as one SQL predicate (None: every row is valid)."""
        parts = [p for col in self.columns for _, p in self.violations(col)]
        if not parts:
            return None
        return exp.not_(exp.or_(*parts)) if len(parts) > 1 else exp.not_(parts[0])

    def violations(self, col: ColumnRule) -> list[tuple[str, exp.Expression]]:
        """``(check name, predicate true when the row violates it)`` for each rule of ``col``."""
        c = exp.column(col.name.lower(), quoted=True)
        out: list[tuple[str, exp.Expression]] = []
        if not col.nullable:
            out.append((f"{col.name} not null", exp.Is(this=c.copy(), expression=exp.Null())))
        for name, stats in col.checks:
            ok = _check_sql(c.copy(), name, stats)
            cond = exp.and_(exp.not_(exp.Is(this=c.copy(), expression=exp.Null())), exp.not_(ok))
            out.append((f"{col.name} {name}", cond))
        return out

    def predicate_sql(self, dialect: str) -> str | None:
        """:meth:`predicate` rendered for ``dialect`` (``spark``, ``duckdb``)."""
        pred = self.predicate()
        return None if pred is None else pred.sql(dialect=dialect)

    def reasons_sql(self, dialect: str) -> str:
        """An expression naming, per row, the checks it violates (``', '``-separated)."""
        cases = [
            exp.If(this=cond, true=exp.Literal.string(label), false=exp.Null())
            for col in self.columns
            for label, cond in self.violations(col)
        ]
        if not cases:
            return "CAST(NULL AS STRING)"
        # Anonymous: sqlglot's ConcatWs would add NULL-propagation; concat_ws skips NULLs.
        call = exp.Anonymous(this="concat_ws", expressions=[exp.Literal.string(", "), *cases])
        return call.sql(dialect=dialect)


def _lit(value: Any) -> exp.Expression:
    if isinstance(value, bool):
        return exp.Boolean(this=value)
    if isinstance(value, int | float):
        return exp.Literal.number(value)
    return exp.Literal.string(str(value))


def _check_sql(c: exp.Expression, name: str, s: Mapping[str, Any]) -> exp.Expression:
    """The SQL a pandera built-in check means for one non-NULL value."""
    if name == "equal_to":
        return exp.EQ(this=c, expression=_lit(s["value"]))
    if name == "not_equal_to":
        return exp.NEQ(this=c, expression=_lit(s["value"]))
    if name == "greater_than":
        return exp.GT(this=c, expression=_lit(s["min_value"]))
    if name == "greater_than_or_equal_to":
        return exp.GTE(this=c, expression=_lit(s["min_value"]))
    if name == "less_than":
        return exp.LT(this=c, expression=_lit(s["max_value"]))
    if name == "less_than_or_equal_to":
        return exp.LTE(this=c, expression=_lit(s["max_value"]))
    if name == "in_range":
        lo = (exp.GTE if s.get("include_min", True) else exp.GT)(
            this=c.copy(), expression=_lit(s["min_value"])
        )
        hi = (exp.LTE if s.get("include_max", True) else exp.LT)(
            this=c.copy(), expression=_lit(s["max_value"])
        )
        return exp.and_(lo, hi)
    if name == "isin":
        return exp.In(this=c, expressions=[_lit(v) for v in s["allowed_values"]])
    if name == "notin":
        return exp.not_(exp.In(this=c, expressions=[_lit(v) for v in s["forbidden_values"]]))
    if name == "str_matches":  # like re.match: anchored at the start
        return exp.RegexpLike(this=c, expression=exp.Literal.string(f"^(?:{s['pattern']})"))
    if name == "str_contains":
        return exp.RegexpLike(this=c, expression=exp.Literal.string(str(s["pattern"])))
    if name == "str_startswith":
        return exp.StartsWith(this=c, expression=exp.Literal.string(str(s["string"])))
    if name == "str_endswith":
        suffix = str(s["string"])
        tail = exp.Substring(this=c, start=exp.Literal.number(-len(suffix)))
        return exp.EQ(this=tail, expression=exp.Literal.string(suffix))
    if name == "str_length":
        n = exp.Length(this=c)
        if s.get("exact_value") is not None:
            return exp.EQ(this=n, expression=_lit(s["exact_value"]))
        parts = []
        if s.get("min_value") is not None:
            parts.append(exp.GTE(this=n.copy(), expression=_lit(s["min_value"])))
        if s.get("max_value") is not None:
            parts.append(exp.LTE(this=n.copy(), expression=_lit(s["max_value"])))
        return exp.and_(*parts) if parts else exp.true()
    raise AssertionError(name)  # filtered by load_contract


_ARROW_TO_SPARK = {
    pa.int8(): "tinyint",
    pa.int16(): "smallint",
    pa.int32(): "int",
    pa.int64(): "bigint",
    pa.float32(): "float",
    pa.float64(): "double",
    pa.bool_(): "boolean",
    pa.string(): "string",
    pa.large_string(): "string",
    pa.binary(): "binary",
    pa.date32(): "date",
}


def spark_type_name(t: pa.DataType) -> str:
    """The Spark SQL name of an Arrow type as the engine reads it (``bigint``, ``decimal(12,2)``)."""
    if pa.types.is_decimal(t):
        return f"decimal({t.precision},{t.scale})"
    if pa.types.is_timestamp(t):
        return "timestamp" if t.tz else "timestamp_ntz"
    return _ARROW_TO_SPARK.get(t, str(t))


def _declared_type(dtype: Any) -> str | None:
    inner = getattr(dtype, "type", None)
    if inner is not None and hasattr(inner, "simpleString"):  # pandera.pyspark
        return inner.simpleString()
    name = str(dtype)
    return _PANDAS_TYPES.get(name)


def _load_attribute(root: Path, ref: str, source: str) -> Any:
    file, sep, attr = ref.partition(":")
    if not sep or not attr:
        raise ConfigError(
            f"contract of source {source!r}: {ref!r} must be 'file.py:Name' (a pandera schema)"
        )
    path = (root / file).resolve()
    if not path.is_file():
        raise ConfigError(f"contract of source {source!r}: {path} does not exist")
    digest = hashlib.sha256(str(path).encode() + path.read_bytes()).hexdigest()[:16]
    module_name = f"ivm_contract_{path.stem}_{digest}"  # an edited file is imported anew
    module = sys.modules.get(module_name)
    if module is None:
        spec = importlib.util.spec_from_file_location(module_name, path)
        if spec is None or spec.loader is None:
            raise ConfigError(f"contract of source {source!r}: cannot import {path}")
        module = importlib.util.module_from_spec(spec)
        try:
            spec.loader.exec_module(module)
        except Exception as e:  # noqa: BLE001 - user code: report any failure by name
            raise ConfigError(
                f"contract of source {source!r}: importing {path} failed: {type(e).__name__}: {e}"
            ) from e
        sys.modules[module_name] = module
    if not hasattr(module, attr):
        raise ConfigError(f"contract of source {source!r}: {path} defines no {attr!r}")
    return getattr(module, attr)


def load_contract(root: Path, source: str, ref: str) -> Contract:
    """Load the pandera schema ``ref`` (``file.py:Name``, relative to ``root``) for ``source``.

    Raises:
        ConfigError: the file or name is missing, it is not a pandera schema, or a check
            cannot be evaluated row by row (custom checks, ``unique``).
    """
    obj = _load_attribute(root, ref, source)
    schema = obj.to_schema() if hasattr(obj, "to_schema") else obj
    if not hasattr(schema, "columns") or not isinstance(schema.columns, Mapping):
        raise ConfigError(
            f"contract of source {source!r}: {ref} is not a pandera DataFrameSchema or "
            "DataFrameModel"
        )
    columns = []
    for name, col in schema.columns.items():
        if getattr(col, "unique", False):
            raise ConfigError(
                f"contract of source {source!r}: column {name!r} declares unique=True, which "
                "is a property of the whole table, not of a row; drop it (a view with GROUP BY "
                "... HAVING COUNT(*) > 1 finds duplicates incrementally)"
            )
        checks = []
        for check in col.checks:
            if check.name not in SUPPORTED_CHECKS:
                raise ConfigError(
                    f"contract of source {source!r}: check {check.name!r} on column {name!r} "
                    f"cannot be evaluated row by row (supported: {', '.join(SUPPORTED_CHECKS)})"
                )
            checks.append((check.name, dict(check.statistics)))
        dtype = getattr(col, "dtype", None)
        columns.append(
            ColumnRule(
                str(name),
                None if dtype is None else _declared_type(dtype),
                bool(col.nullable),
                tuple(checks),
            )
        )
    return Contract(source, ref, tuple(columns), bool(getattr(schema, "strict", False)))
