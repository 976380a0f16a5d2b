"""What the driver's renderers compute, known from a plan alone (no types, no rows).

Owns the static half of the driver's capabilities: the plan nodes, expressions and reduce
branches that :mod:`ops.stateless.driver`, :mod:`ops.join.driver` and :mod:`ops.reduce.driver`
render. :func:`driver_support` is what :meth:`ivm.policy.Policy.place` consults before a refresh
runs, and what EXPLAIN shows; the driver's expression evaluator checks the same lists at its
entry (:func:`expression_support`). What remains for the renderers to find as they run depends
on column types or on the rows themselves (a decimal past Arrow's 76 digits, non-ASCII text
under UPPER, a NaN among grouped values, a state read past ``driver_state_rows``): each such
decline is recorded (:mod:`ops.declines`) before anything is written.

Contract: pure functions of the plan. They never change the updates ``(data, time, diff)`` a
view produces, only which renderer computes them.
"""

from __future__ import annotations

from sqlglot import exp

from ivm.plan.ir import (
    Constant,
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
)
from ivm.plan.reduce import branches

COMPARISONS = (exp.EQ, exp.NEQ, exp.LT, exp.LTE, exp.GT, exp.GTE)
ARITHMETIC = (exp.Add, exp.Sub, exp.Mul)
DATE_FUNCTIONS = {exp.Year: "year", exp.Month: "month", exp.Day: "day", exp.DayOfMonth: "day"}
"""``YEAR(d)``, ``MONTH(d)``, ``DAY(d)``, ``DAYOFMONTH(d)`` of a DATE (Arrow's function for
each); sqlglot reads their argument as ``TsOrDsToDate(d)``, which Spark's SQL leaves out."""

VALUES: tuple[type[exp.Expression], ...] = (
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
    exp.Nullif,
    exp.Div,
    exp.Mod,
    exp.NullSafeEQ,
    exp.Like,
    exp.Extract,
    *DATE_FUNCTIONS,
    *COMPARISONS,
    *ARITHMETIC,
)
"""Expressions the driver evaluates as values (it asks Spark for each one's type); and any
expression of no column (:func:`folded`)."""

DATE_PARTS = {"YEAR": "year", "MONTH": "month", "DAY": "day", "DAYOFMONTH": "day"}
"""The fields ``EXTRACT(field FROM date)`` takes on the driver (Arrow's function for each)."""

STRUCTURE: tuple[type[exp.Expression], ...] = (
    exp.Paren,
    exp.If,
    exp.Identifier,
    exp.DataType,
    exp.DataTypeParam,
    exp.Var,  # EXTRACT's field
    exp.TsOrDsToDate,  # the argument of YEAR(d) and the like, as sqlglot reads it
)
"""Parts of expressions that are not values of their own (``If`` is also CASE's branch)."""


def _number(e: exp.Expression | None) -> int | None:
    """The value of an integer literal (``-3`` included), else None."""
    if isinstance(e, exp.Neg):
        inner = _number(e.this)
        return None if inner is None else -inner
    if isinstance(e, exp.Literal) and not e.is_string and e.this.lstrip("-").isdigit():
        return int(e.this)
    return None


def _substring_support(e: exp.Substring) -> str | None:
    start, length = _number(e.args.get("start")), e.args.get("length")
    if start is None:
        return "substr with a computed start is Spark's"
    count = None if length is None else _number(length)
    if length is not None and count is None:
        return "substr with a computed length is Spark's"
    if start < 1 or (count is not None and count < 0):
        return "substr from the end is computed by Spark"
    return None


def _node_support(node: exp.Expression) -> str | None:
    if not isinstance(node, VALUES + STRUCTURE):
        return f"{type(node).__name__} is computed by Spark"
    if isinstance(node, exp.Is) and not isinstance(node.expression, (exp.Null, exp.Boolean)):
        return f"IS {node.expression.sql(dialect='spark')} is computed by Spark"
    if isinstance(node, exp.In):
        if node.args.get("query") or node.args.get("unnest") or node.args.get("field"):
            return "IN (subquery) is computed by Spark"
        if not node.expressions:
            return "an empty IN list is Spark's"
    if isinstance(node, exp.Substring):
        return _substring_support(node)
    if isinstance(node, exp.Like):
        return _like_support(node)
    if isinstance(node, exp.Extract):
        part = node.this.name.upper() if isinstance(node.this, exp.Var) else None
        if part not in DATE_PARTS:
            return f"EXTRACT({node.this.sql(dialect='spark')} FROM ...) is computed by Spark"
    if isinstance(node, exp.Var) and not isinstance(node.parent, exp.Extract):
        return f"{node.name} is computed by Spark"
    if isinstance(node, exp.TsOrDsToDate) and (
        type(node.parent) not in DATE_FUNCTIONS or node.args.get("format") is not None
    ):
        return "TO_DATE is computed by Spark"
    return None


def _like_support(e: exp.Like) -> str | None:
    """A LIKE the driver matches as Spark does: a constant pattern whose backslashes escape
    ``%``, ``_`` or a backslash (Spark refuses any other escape; Arrow would not)."""
    pattern = e.expression
    if not (isinstance(pattern, exp.Literal) and pattern.is_string):
        return "LIKE with a computed pattern is Spark's"
    text, i = pattern.this, 0
    while i < len(text):
        if text[i] == "\\":
            if i + 1 >= len(text) or text[i + 1] not in "%_\\":
                return f"LIKE {pattern.sql(dialect='spark')} (an escape Spark refuses) is Spark's"
            i += 1
        i += 1
    return None


def folded(e: exp.Expression) -> bool:
    """Whether the driver takes ``e``'s value from Spark, once per process: an expression of no
    column holding a node the driver does not evaluate itself, as ``DATE '1994-01-01' +
    INTERVAL '1' YEAR`` (deterministic: the parser refuses ``rand()`` and ``current_date``)."""
    nodes = list(e.walk())
    return not any(isinstance(n, exp.Column) for n in nodes) and any(
        _node_support(n) is not None for n in nodes
    )


def expression_support(e: exp.Expression) -> str | None:
    """Why the driver cannot evaluate ``e`` whatever its types and rows, or None."""
    if folded(e):
        return None
    why = _node_support(e)
    if why is not None:
        return why
    return next(filter(None, map(expression_support, e.iter_expressions())), None)


def _expressions(node: Node) -> list[exp.Expression]:
    if isinstance(node, Filter):
        return [node.predicate]
    if isinstance(node, Project):
        return [e for _, e in node.outputs]
    if isinstance(node, (Join, SemiJoin)):
        out = list(node.residual) if isinstance(node, Join) else []
        for inp in (node.input, node.other) if isinstance(node, SemiJoin) else node.inputs:
            out += [inp.predicate] if inp.predicate is not None else []
            out += [e for _, e in inp.outputs]
        return out
    return []


def _reduce_support(node: Reduce | TopK) -> str | None:
    if isinstance(node, TopK):  # buffered, a tower, or over an append-only input
        return None
    for b in branches(node):
        if b.kind not in ("accumulable", "hierarchical", "basic"):
            return f"{b.kind} aggregates are computed by Spark"
        if b.distinct and b.kind == "hierarchical":
            return "DISTINCT MIN/MAX is computed by Spark"
    return None


def node_support(node: Node) -> str | None:
    """Why the driver's renderer cannot compute ``node`` itself (its inputs aside), or None."""
    if isinstance(node, Constant):  # no update after the build, which Spark computes
        return None
    if isinstance(node, (Window, SetOp)):  # a Window's values: Spark's functions
        return None
    if not isinstance(node, (Get, Filter, Project, UnionAll, Join, SemiJoin, Reduce, TopK)):
        return f"{type(node).__name__} is computed by Spark"
    if isinstance(node, (Reduce, TopK)):
        return _reduce_support(node)
    return next(filter(None, map(expression_support, _expressions(node))), None)


def driver_support(node: Node) -> str | None:
    """Why the driver's renderers cannot compute ``node``'s updates, or None: they render
    Get, Filter, Project, UnionAll, joins (outer, semi, anti and NOT IN too), GROUP BY with
    COUNT/SUM/AVG/variance/BOOL, MIN/MAX and STRING_AGG/PERCENTILE, TopK (buffered, or a
    tower over an aggregate) and windows (basic aggregates' and windows' values by Spark's
    functions over the rows the driver reads), over the expressions of :data:`VALUES`. A
    None may still meet a decline that depends on types or rows (the module's docstring)."""
    why = node_support(node)
    if why is not None or isinstance(node, (Join, SemiJoin)):  # their inputs are Gets: checked
        return why
    return next(filter(None, map(driver_support, node.inputs)), None)
