"""A view's columns as Spark's own analysis of its SQL gives them, and the check that the
plan's output has exactly those.

Owns one invariant: the updates a view's plan computes (its diff log's data columns, hence its
table's) have the names, order and types that ``spark.sql(<the view's query>)`` has over the
same inputs. The planner lowers SQL without types; Spark gives the plan's nodes their types
when it renders them. Nothing forces the two to agree (a join's padded side, a decimal
aggregate, a union's widening), so the engine asks Spark once per build.

Contract in ``(data, time, diff)`` terms: the check reads no update and writes nothing; it
runs before a build's first commit, and a mismatch (:class:`~ivm.errors.InvariantViolation`)
leaves every table as it was. Cost: one analysis of the query over the inputs' DataFrames
(temporary views, dropped afterwards), no Spark job.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from typing import Any

from pyspark.errors import AnalysisException, ParseException
from pyspark.sql import types as T
from sqlglot.dialects.dialect import Dialect
from sqlglot.tokens import TokenType

from ivm.errors import InvariantViolation, SqlError
from ivm.sql.parse import DIALECT, parse_view
from ops import DIFF, TIME


def query_text(sql: str, file: str) -> str:
    """The query of a view file as written: the text after ``CREATE VIEW name AS`` (Spark
    is given the user's own SQL; sqlglot's regeneration of it is not always Spark's meaning,
    e.g. ``percentile_disc(p) WITHIN GROUP (ORDER BY x)`` comes back as
    ``PERCENTILE_APPROX(x, p)``).

    Raises:
        SqlError: the file has no ``CREATE VIEW ... AS``.
    """
    depth, seen_view = 0, False
    for token in Dialect.get_or_raise(DIALECT).tokenize(sql):
        if token.token_type == TokenType.L_PAREN:
            depth += 1
        elif token.token_type == TokenType.R_PAREN:
            depth -= 1
        elif token.token_type == TokenType.VIEW:
            seen_view = True
        elif seen_view and depth == 0 and token.token_type == TokenType.ALIAS:
            return sql[token.end + 1 :].strip().rstrip(";").strip()
    raise SqlError("expected CREATE VIEW name AS SELECT ...", file=file)


def spark_query(spark: Any, sql: str, file: str, wrap: Callable[[str], str] = str) -> Any:
    """A view's query as a Spark DataFrame (analysed, not run): the query as written
    (:func:`query_text`) or, when Spark's parser does not know its syntax (``QUALIFY``, which
    the planner accepts), as sqlglot rewrites it for Spark. ``wrap`` puts the text in a query
    of the caller's.

    Raises:
        AnalysisException: Spark's analysis rejects it.
    """
    try:
        df = spark.sql(wrap(query_text(sql, file)))
        df.schema  # noqa: B018 - analysed now (a Spark Connect DataFrame is lazy)
    except ParseException:
        df = spark.sql(wrap(parse_view(sql, file).query.sql(dialect=DIALECT)))
    return df


def analysed_schema(spark: Any, sql: str, file: str, frames: Mapping[str, Any]) -> Any:
    """The schema (``StructType``) Spark's analysis gives a view's query, no job run.

    Args:
        spark: the session.
        sql: the view file's text.
        file: the file, for messages.
        frames: every table the query names (source or view, lowercase) -> a DataFrame with
            its columns (extra ``_time``/``_diff`` columns are left out).

    Each table is a temporary view of a name of its own (so views built side by side in the
    session do not see each other's), given the table's name by a CTE around the query as
    written (a CTE of the query's own shadows it, as in the view); see :func:`spark_query`.

    Raises:
        SqlError: Spark's analysis rejects the query (the message is Spark's first line).
    """
    tag = f"_ivm_columns_{uuid.uuid4().hex[:12]}"
    names = {coll: f"{tag}_{coll}" for coll in sorted(frames)}
    ctes = ", ".join(f"`{coll}` AS (SELECT * FROM `{view}`)" for coll, view in names.items())

    def wrapped(query: str) -> str:
        return f"WITH {ctes}\nSELECT * FROM (\n{query}\n)"

    registered: list[str] = []
    try:
        for coll, df in frames.items():
            data = [f"`{c}`" for c in df.columns if c not in (TIME, DIFF)]
            df.select(*data).createOrReplaceTempView(names[coll])
            registered.append(names[coll])
        return spark_query(spark, sql, file, wrapped).schema
    except AnalysisException as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SqlError(f"Spark's analysis rejects the view's SQL: {first}", file=file) from e
    finally:
        for name in registered:
            spark.catalog.dropTempView(name)


def _bare(t: Any) -> Any:
    """A Spark type with the nullability inside it (array elements, map values, struct
    fields) set to true: what a Delta table keeps of it."""
    if isinstance(t, T.ArrayType):
        return T.ArrayType(_bare(t.elementType), True)
    if isinstance(t, T.MapType):
        return T.MapType(_bare(t.keyType), _bare(t.valueType), True)
    if isinstance(t, T.StructType):
        return T.StructType([T.StructField(f.name, _bare(f.dataType), True) for f in t.fields])
    return t


def check_columns(view: str, file: str, spark_schema: Any, plan_schema: Any) -> None:
    """Raise unless the plan's output columns are Spark's (both ``StructType``).

    What "equal" means here:

    - the same number of columns, in the same order;
    - the same names, compared without case: the engine names every column in lowercase
      (Spark keeps an alias as written; Delta and Spark resolve names without case);
    - the same data types, exactly: decimal precision and scale, integer widths, the
      element and field types of nested types;
    - nullability: a column Spark's analysis says may be NULL is nullable in the plan too.
      The plan may call nullable a column Spark knows is never NULL (the preserved side of
      a join whose condition is never true, computed as a UNION ALL with NULL-padded
      branches): that weaker claim is never wrong, and the view's readable table declares
      every column nullable anyway (its diff log keeps the plan's nullability).
      Nullability inside nested types (array elements, map values, struct fields) is not
      compared.

    Raises:
        InvariantViolation: names the view, the column (position and name) and both types.
    """
    ours = list(plan_schema.fields)
    theirs = list(spark_schema.fields)
    where = f"view {view!r} ({file})"
    if len(ours) != len(theirs):
        raise InvariantViolation(
            f"{where}: the plan gives {len(ours)} columns ({', '.join(f.name for f in ours)}), "
            f"Spark's analysis of its SQL {len(theirs)} ({', '.join(f.name for f in theirs)})"
        )

    for i, (a, b) in enumerate(zip(ours, theirs, strict=True), start=1):
        if a.name.lower() != b.name.lower():
            raise InvariantViolation(
                f"{where}: column {i} is {a.name!r} in the plan but {b.name!r} in Spark's "
                "analysis of its SQL"
            )
        if _bare(a.dataType) != _bare(b.dataType):
            raise InvariantViolation(
                f"{where}: column {a.name!r} is {a.dataType.simpleString()} in the plan but "
                f"{b.dataType.simpleString()} in Spark's analysis of its SQL"
            )
        if b.nullable and not a.nullable:
            raise InvariantViolation(
                f"{where}: column {a.name!r} is {a.dataType.simpleString()} NOT NULL in the "
                f"plan but nullable {b.dataType.simpleString()} in Spark's analysis of its SQL"
            )
