"""Rendering of plan nodes on update DataFrames: the stateless ones here, joins in ops.join.spark.

Owns Spark's rendering of Get/Filter/Project/UnionAll and the dispatch of the rest: a join to
the renderer the caller gives (delta paths, :func:`ops.join.spark.render_join_delta`), by default
from scratch (:func:`ops.join.spark.render_join_snapshot`); a Reduce, SetOp or TopK to the caller's
stateful renderer (:mod:`ops.reduce.spark`). The expressions' Spark SQL text comes from
:mod:`ops.expressions`, which :mod:`ops.join.spark` shares: this module imports the join renderer,
never the reverse.

Contract in ``(data, time, diff)`` terms: each node is linear (see :mod:`ivm.plan.ir`), so it
is applied to the updates directly: an update ``(d, t, r)`` becomes ``(f(d), t, r)`` or is
dropped, ``t`` and ``r`` carried through untouched. The same function renders the
from-scratch evaluation (inputs = snapshots with ``_diff = +1``) and the incremental one
(inputs = the epoch's updates): one code path, two uses.

Spark's failures evaluating an expression on some row (an overflow, a division by zero, text
that is not a number: ANSI mode's errors) are recognised by :func:`evaluation_error`, so the
engine reports them as :class:`~ivm.errors.EvaluationError` naming the view.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from functools import reduce

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F

from ivm.errors import EvaluationError, InvariantViolation
from ivm.plan.ir import (
    STATEFUL,
    Constant,
    Filter,
    Get,
    Join,
    Node,
    Project,
    SemiJoin,
    UnionAll,
    walk,
)
from ops import DIFF, TIME
from ops.expressions import spark_sql
from ops.join.spark import render_join_snapshot

_EVALUATION_CONDITIONS = {
    "ARITHMETIC_OVERFLOW": "overflow",
    "BINARY_ARITHMETIC_OVERFLOW": "overflow",
    "NUMERIC_VALUE_OUT_OF_RANGE": "overflow",
    "CAST_OVERFLOW": "overflow",
    "DIVIDE_BY_ZERO": "division by zero",
    "CAST_INVALID_INPUT": "invalid input",
}
"""Spark's error conditions (before the first ``.``) raised by evaluating an expression on
a row in ANSI mode, by the kind of :class:`~ivm.errors.EvaluationError` they are."""

_CONDITION = re.compile(r"\[([A-Z][A-Z_]+)(?:\.[A-Z_.]+)?\] *([^\n]*)")


def evaluation_error(error: BaseException) -> EvaluationError | None:
    """``error`` (raised by a Spark action) as an :class:`~ivm.errors.EvaluationError` when
    Spark failed evaluating an expression on a row (:data:`_EVALUATION_CONDITIONS`, read from
    the error's message: a failed task's error carries it inside its own), with Spark's
    account of the value and the expression it failed in; None otherwise."""
    text = str(error)
    for condition, said in _CONDITION.findall(text):
        kind = _EVALUATION_CONDITIONS.get(condition)
        if kind is not None:
            detail = re.split(r"\. (?:If necessary|Use `?try_|Correct the value)", said)[0]
            return EvaluationError(
                kind, operation=_fragment(text), detail=detail.strip() or None, condition=condition
            )
    return None


def _fragment(text: str) -> str | None:
    """The expression a Spark error's SQL context points at (the text its ``^`` mark)."""
    lines = text.split("\n")
    for i, line in enumerate(lines[:-2]):
        if line.startswith("== SQL") and "^" in lines[i + 2]:
            marks = lines[i + 2]
            start = marks.index("^")
            return lines[i + 1][start : len(marks.rstrip())] or None
    return None


def constant_updates(spark: SparkSession, node: Constant, done: int, target: int) -> DataFrame:
    """A constant's updates in ``(done, target]``: its rows, each ``+1`` at ``target``, from
    scratch (``done`` = 0); none after (with the same columns and types). Spark types them
    as it types ``VALUES`` with these rows."""
    rows = ", ".join(f"({', '.join(spark_sql(e) for e in row)})" for row in node.rows)
    names = ", ".join(f"`{c}`" for c in node.columns)
    df = spark.sql(f"SELECT * FROM VALUES {rows} AS _values({names})")
    df = df.select(
        *[F.col(f"`{c}`") for c in node.columns],
        F.lit(target).cast("bigint").alias(TIME),
        F.lit(1).cast("bigint").alias(DIFF),
    )
    return df if done == 0 else df.where(F.lit(False))


def constants(spark: SparkSession, node: Node, done: int, target: int) -> dict[str, DataFrame]:
    """The updates of every constant under ``node``, by key: the inputs :func:`render` needs
    besides the collections'."""
    return {
        n.key: constant_updates(spark, n, done, target)
        for n in walk(node)
        if isinstance(n, Constant)
    }


JoinRenderer = Callable[[Join | SemiJoin, Mapping[str, DataFrame]], DataFrame]
StatefulRenderer = Callable[[Node, list[DataFrame]], DataFrame]


def render(
    node: Node,
    inputs: Mapping[str, DataFrame],
    join: JoinRenderer | None = None,
    stateful: StatefulRenderer | None = None,
) -> DataFrame:
    """The updates of ``node`` given the updates of every collection it reads.

    Args:
        node: a plan.
        inputs: collection name -> DataFrame ``(columns..., _time, _diff)``, and each
            constant's updates by its key (:func:`constants`).
        join: how to render a Join: by delta paths (incremental); default, from scratch
            (``inputs`` are then snapshots).
        stateful: how to render a Reduce, SetOp or TopK given its inputs' updates (they keep
            state: see :mod:`ops.reduce.spark`).

    Returns:
        DataFrame ``(node.columns..., _time, _diff)``.
    """
    if isinstance(node, (Join, SemiJoin)):
        return join(node, inputs) if join is not None else render_join_snapshot(node, inputs)
    if isinstance(node, STATEFUL):
        if stateful is None:
            raise InvariantViolation(f"{type(node).__name__} needs its state to be rendered")
        return stateful(node, [render(c, inputs, join, stateful) for c in node.inputs])
    if isinstance(node, Get):
        df = inputs[node.collection]
        return df.select(*[F.col(f"`{c}`") for c in node.columns], TIME, DIFF)
    if isinstance(node, Constant):  # its updates come with the inputs (constants())
        return inputs[node.key]
    if isinstance(node, Filter):
        return render(node.input, inputs, join, stateful).where(F.expr(spark_sql(node.predicate)))
    if isinstance(node, Project):
        df = render(node.input, inputs, join, stateful)
        cols = [F.expr(spark_sql(e)).alias(name) for name, e in node.outputs]
        return df.select(*cols, TIME, DIFF)
    assert isinstance(node, UnionAll)
    names = node.columns
    parts = []
    for branch in node.branches:
        df = render(branch, inputs, join, stateful)
        parts.append(
            df.select(
                *[F.col(f"`{c}`").alias(n) for c, n in zip(branch.columns, names, strict=False)],
                TIME,
                DIFF,
            )
        )
    return reduce(DataFrame.union, parts)
