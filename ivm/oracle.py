"""The independent oracle: every view evaluated from scratch by DuckDB, compared as multisets.

Owns the from-scratch side of verification. DuckDB (not Spark, not our planner) evaluates the
view's own SQL, transpiled by sqlglot from Spark's dialect, over the sources' contents at the
versions of an epoch, read with delta-rs. Used by the demo and the tests.

Contract in ``(data, time, diff)`` terms: ``expected(e)`` is the view's collection at epoch
``e`` computed with no updates at all; the engine is correct when its readable table, and
the sum of its diff log up to ``e``, equal it exactly (same multiset, exact decimals).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import duckdb
import pyarrow as pa

from ivm.errors import IvmError
from resources.lake import open_table

MEMORY_LIMIT = "4GB"
"""DuckDB's memory cap here (its default is 80% of the machine): past it, it spills to disk.
The sources are scanned as datasets, never loaded whole into the Python process."""


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute(f"SET memory_limit = '{MEMORY_LIMIT}'")
    return con


def _normalize(value: Any) -> Any:
    if isinstance(value, float):
        return value if math.isnan(value) or math.isinf(value) else round(value, 9)
    return value


def multiset(rows: Iterable[Sequence[Any]]) -> Counter:
    """Rows as a multiset of tuples (floats rounded to 9 places; decimals stay exact)."""
    return Counter(tuple(_normalize(v) for v in row) for row in rows)


def table_multiset(table: pa.Table) -> Counter:
    return multiset(tuple(r.values()) for r in table.to_pylist())


@dataclass
class Comparison:
    """The outcome of comparing one view with its from-scratch evaluation."""

    view: str
    epoch: int
    expected_rows: int
    actual_rows: int
    missing: Counter  # in the oracle, not in the view
    extra: Counter  # in the view, not in the oracle

    @property
    def equal(self) -> bool:
        return not self.missing and not self.extra

    def describe(self, limit: int = 3) -> str:
        if self.equal:
            return f"{self.view}: equal ({self.actual_rows} rows at epoch {self.epoch})"
        return (
            f"{self.view}: DIFFERENT at epoch {self.epoch}: {sum(self.missing.values())} rows "
            f"missing (e.g. {list(self.missing)[:limit]}), {sum(self.extra.values())} extra "
            f"(e.g. {list(self.extra)[:limit]})"
        )


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
        engine: an :class:`ivm.engine.Engine`.
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
            con.register(f"__src_{name}", _dataset(dt))
            valid = engine.contract_predicate(name, "duckdb")  # a contract's valid rows
            where = f" WHERE {valid}" if valid else ""
            con.execute(f'CREATE VIEW "{name}" AS SELECT * FROM "__src_{name}"{where}')
        out: dict[str, pa.Table] = {}
        for name, view in engine.plan.views.items():
            from ivm.sql.parse import parse_view

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
    column as it was, so the comparison shows the difference) whenever a value would change.
    """
    columns = []
    for i, field in enumerate(actual.schema):
        col = expected.column(i)
        if col.type != field.type:
            try:
                col = col.cast(field.type, safe=True)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
                pass
        columns.append(col)
    return pa.table(columns, names=actual.column_names)


def compare_views(engine: Any, views: Iterable[str] | None = None) -> list[Comparison]:
    """Compare each view's readable table and diff log with DuckDB at the view's epoch."""
    names = list(views) if views is not None else list(engine.plan.order)
    by_epoch: dict[int, dict[str, pa.Table]] = {}
    results = []
    for name in names:
        epoch = engine.view_status(name).table_epoch
        if epoch not in by_epoch:
            by_epoch[epoch] = duckdb_evaluate(engine, epoch)
        actual = engine.read_view(name)
        expected = align_types(by_epoch[epoch][name], actual)
        missing, extra = multiset_differences(expected, actual)
        results.append(Comparison(name, epoch, expected.num_rows, actual.num_rows, missing, extra))
    return results


def _kind(t: pa.DataType) -> str:
    """A column type as DuckDB compares it (every string layout is one VARCHAR)."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return "string"
    return str(t)


def multiset_differences(expected: pa.Table, actual: pa.Table) -> tuple[Counter, Counter]:
    """``(expected - actual, actual - expected)`` as multisets (floats rounded to 9 places,
    decimals exact), computed by DuckDB's ``EXCEPT ALL`` so that only the differences reach
    Python; with columns of different types, row by row in Python."""
    if [_kind(t) for t in expected.schema.types] != [_kind(t) for t in actual.schema.types]:
        want, got = table_multiset(expected), table_multiset(actual)
        return want - got, got - want
    cols = ", ".join(
        f'round("{f.name}", 9)' if pa.types.is_floating(f.type) else f'"{f.name}"'
        for f in actual.schema
    )
    con = _connect()
    try:
        con.register("__expected", expected)
        con.register("__actual", actual)

        def minus(a: str, b: str) -> Counter:
            rows = con.sql(f"SELECT {cols} FROM {a} EXCEPT ALL SELECT {cols} FROM {b}")
            return multiset(rows.fetchall())

        return minus("__expected", "__actual"), minus("__actual", "__expected")
    finally:
        con.close()


def log_multiset(engine: Any, view: str, upto: int) -> Counter:
    """The sum of a view's diff log up to ``upto`` as a multiset (negative counts kept)."""
    dt = open_table(engine.layout.view_log(view))
    if dt is None:
        return Counter()
    table = dt.to_pyarrow_table()
    columns = [c for c in table.column_names if c not in ("_time", "_diff")]
    acc: Counter = Counter()
    for r in table.to_pylist():
        if r["_time"] <= upto:
            acc[tuple(_normalize(r[c]) for c in columns)] += r["_diff"]
    return Counter({k: v for k, v in acc.items() if v != 0})
