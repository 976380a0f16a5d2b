"""Rows written in a view's SQL: ``VALUES`` and ``SELECT`` without ``FROM``, as rewrites of
the syntax tree that the lowerer then plans with a ``Constant`` leaf (:class:`ivm.plan.ir.Constant`).

Owns:

- :func:`without_rowless_subqueries`: a subquery over no table is at most one row, so it is
  an expression: ``(SELECT e)`` is ``(e)``, ``x IN (SELECT e)`` is ``x IN (e)``, ``EXISTS
  (SELECT …)`` is ``TRUE``, correlated or not; with ``WHERE c``, the same when ``c`` holds
  (``CASE WHEN c THEN e END``, ``CASE WHEN c THEN x IN (e) ELSE FALSE END``, ``COALESCE(c,
  FALSE)``).
- :func:`with_one_row`: every other ``SELECT`` without ``FROM`` reads a one-row ``VALUES``
  (:data:`ONE_ROW`, whose one column is :data:`~ivm.sql.scope.ONE`, which ``*`` never shows),
  so the lowerer and the subquery rewrites see a ``FROM`` everywhere.
- :func:`values_columns` and :func:`values_rows`: a ``VALUES`` item's column names (Spark's
  ``col1``, ``col2``, … without an alias list) and its rows.

Contract in ``(data, time, diff)`` terms: pure rewrites of SQL with the same result at every
time; a constant's rows are ``+1`` at the view's build and never change after it.
"""

from __future__ import annotations

from sqlglot import exp

from ivm.sql.nest import FROM_ARG
from ivm.sql.scope import ONE, is_aggregate

VALUES_ALIAS = "_values"
"""The name of a ``VALUES`` item written without one."""
ONE_ROW = "_ivm_row"
"""The alias of the one-row ``VALUES`` a ``SELECT`` without ``FROM`` reads."""

_CLAUSES = ("group", "having", "qualify", "limit", "offset", "order", "joins", "distinct")
_NOT_A_VALUE = (exp.From, exp.Join, exp.SetOperation, exp.CTE, exp.Lateral)
"""Parents under which a subquery is a relation, not the value of an expression."""


def _arg(node: exp.Expression, key: str) -> object:
    return node.args.get(key) or node.args.get(key + "_")


def _rowless(q: exp.Expression) -> exp.Select | None:
    """``q`` when it is a plain ``SELECT`` without ``FROM`` and without clauses but WHERE,
    whose items aggregate nothing and call no window; else None."""
    while isinstance(q, exp.Subquery):
        q = q.this
    if not isinstance(q, exp.Select) or q.args.get(FROM_ARG) or _arg(q, "with"):
        return None
    if any(_arg(q, c) for c in _CLAUSES):
        return None
    if any(is_aggregate(n) or isinstance(n, exp.Window) for i in q.expressions for n in i.walk()):
        return None
    return q


def _value(q: exp.Select) -> exp.Expression | None:
    """The one value a rowless SELECT of one item gives (its item without AS name)."""
    if len(q.expressions) != 1 or isinstance(q.expressions[0], exp.Star):
        return None
    item = q.expressions[0]
    return (item.this if isinstance(item, exp.Alias) else item).copy()


def _when(q: exp.Select, then: exp.Expression, otherwise: exp.Expression | None) -> exp.Expression:
    """``then`` where the rowless ``q``'s WHERE holds (``then`` itself without WHERE)."""
    where = q.args.get("where")
    if where is None:
        return then
    case = exp.Case(ifs=[exp.If(this=where.this.copy(), true=then)], default=otherwise)
    return case if otherwise is not None else exp.Paren(this=case)


def _inlined(node: exp.Expression) -> exp.Expression:
    """``node`` as an expression when it is a subquery over no table (see the module), the
    subqueries inside it too."""
    out = _as_expression(node)
    return node if out is node else out.transform(_inlined, copy=False)


def _as_expression(node: exp.Expression) -> exp.Expression:
    if isinstance(node, exp.Subquery) and not isinstance(node.parent, _NOT_A_VALUE):
        q = _rowless(node.this)
        value = _value(q) if q is not None else None
        if q is not None and value is not None:
            return _when(q, exp.Paren(this=value), None)
    if isinstance(node, exp.In) and node.args.get("query") is not None:
        q = _rowless(node.args["query"])
        value = _value(q) if q is not None else None
        if q is not None and value is not None:
            found = exp.In(this=node.this.copy(), expressions=[value])
            return _when(q, found, exp.false())
    if isinstance(node, exp.Exists):
        q = _rowless(node.this)
        if q is not None:
            where = q.args.get("where")
            return (
                exp.true()
                if where is None
                else exp.func("coalesce", where.this.copy(), exp.false())
            )
    return node


def without_rowless_subqueries(query: exp.Expression) -> exp.Expression:
    """``query`` with its subqueries over no table written as expressions (see the module)."""
    root = query.copy()  # the view's query itself stays a query, even a parenthesized one
    return root.transform(lambda n: n if n is root else _inlined(n), copy=False)


def with_one_row(query: exp.Expression) -> exp.Expression:
    """``query`` with each ``SELECT`` without ``FROM`` reading one row of no table, and each
    ``VALUES`` without a name named :data:`VALUES_ALIAS`."""
    out = query.copy()
    for select in list(out.find_all(exp.Select)):
        if not select.args.get(FROM_ARG):
            select.from_(one_row(), copy=False)
    for values in out.find_all(exp.Values):  # as Spark names it (and sqlglot after UNION ALL)
        if not values.alias:
            values.set("alias", exp.TableAlias(this=exp.to_identifier(VALUES_ALIAS)))
    return out


def one_row() -> exp.Values:
    """``VALUES (1) AS _ivm_row(__ivm_one)``: one row, of a column ``*`` does not show."""
    return exp.Values(
        expressions=[exp.Tuple(expressions=[exp.Literal.number(1)])],
        alias=exp.TableAlias(this=exp.to_identifier(ONE_ROW), columns=[exp.to_identifier(ONE)]),
    )


def values_rows(values: exp.Values) -> list[list[exp.Expression]]:
    """A ``VALUES`` item's rows, each a list of its expressions (``VALUES 1, 2`` has rows of
    one value)."""
    return [list(r.expressions) if isinstance(r, exp.Tuple) else [r] for r in values.expressions]


def values_columns(values: exp.Values, width: int) -> list[str]:
    """A ``VALUES`` item's column names: its alias's, else Spark's ``col1``, ``col2``, …"""
    alias = values.args.get("alias")
    named = [c.name.lower() for c in alias.columns] if isinstance(alias, exp.TableAlias) else []
    return named or [f"col{i + 1}" for i in range(width)]
