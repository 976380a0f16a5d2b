"""Decorrelation of scalar subqueries: a rewrite of one SELECT's syntax tree into a join.

Owns :func:`decorrelate_scalars`. A WHERE conjunct comparing with a scalar subquery that
aggregates, correlated with the outer query by equalities,

    ``... WHERE x < (SELECT 0.2 * avg(q) FROM t WHERE t.k = o.k AND t.f = 1)``

becomes a join with that subquery grouped by its correlation keys,

    ``... JOIN (SELECT t.k AS _k0, 0.2 * avg(q) AS _v FROM t WHERE t.f = 1 GROUP BY t.k)
    AS _ivm_sq1 WHERE x < _ivm_sq1._v AND _ivm_sq1._k0 = o.k``

which is the same multiset: an outer row whose key has no group would compare with NULL (the
aggregate of no rows), which WHERE drops, as the inner join drops it. So the rewrite needs an
expression that is NULL over no rows (no COUNT), a comparison at the top of WHERE, and
correlation by equalities only; anything else is refused by name. The lowerer then plans the
grouped subquery as an internal view (a join input that is an aggregate), so a change to ``t``
updates one group's value and re-examines only the outer rows with that key.

Contract in ``(data, time, diff)`` terms: a pure rewrite of SQL; the rewritten SELECT has the
same result as the original at every time, so its updates are the original's updates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from ivm.sql.scope import HIDDEN_PREFIX, is_aggregate

_FROM = "from_" if "from_" in exp.Select.arg_types else "from"
_WITH = "with_" if "with_" in exp.Select.arg_types else "with"
"""sqlglot's names of SELECT's FROM and WITH arguments (newer versions add a ``_``)."""

_COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
_NULL_PROPAGATING = (
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.Neg,
    exp.Paren,
    exp.Cast,
    exp.Literal,
)
_EMPTY_NOT_NULL = (exp.Count,)
"""Aggregates whose value over no rows is not NULL (``COUNT`` is 0)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a scalar subquery cannot be decorrelated, and where."""

    construct: str
    message: str
    at: exp.Expression


class ScalarSubqueryRefused(Exception):  # noqa: N818 - carries a Refusal to the lowerer
    def __init__(self, refusal: Refusal) -> None:
        super().__init__(refusal.message)
        self.refusal = refusal


InnerColumns = Callable[[exp.Select], tuple[set[str], set[str]]]
"""A subquery's FROM items -> (their qualifiers, their column names), lowercase."""


def scalar_operand(conjunct: exp.Expression) -> exp.Subquery | None:
    """The scalar subquery a top-level comparison compares with, if it has one."""
    if not isinstance(conjunct, _COMPARISONS):
        return None
    for side in (conjunct.this, conjunct.expression):
        if isinstance(side, exp.Subquery) and isinstance(side.this, exp.Select):
            return side
    return None


def semi_operand(conjunct: exp.Expression) -> tuple[exp.Select, exp.Expression | None] | None:
    """``(subquery, probe)`` of a top-level ``EXISTS (q)`` (probe None) or ``x IN (q)``."""
    e = conjunct
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Exists) and isinstance(e.this, exp.Select):
        return e.this, None
    query = e.args.get("query") if isinstance(e, exp.In) else None
    if isinstance(query, exp.Subquery) and isinstance(query.this, exp.Select):
        return query.this, e.this
    return None


def decorrelate(
    select: exp.Select,
    conjuncts: Sequence[exp.Expression],
    inner_columns: InnerColumns,
    first_number: int,
    *,
    semi_joins: bool,
) -> tuple[exp.Select, int]:
    """``select`` (whose WHERE is ``conjuncts``) with each comparison against a scalar
    subquery made a join with the subquery grouped by its correlation (module doc); with
    ``semi_joins``, each ``EXISTS``/``IN`` too, with the subquery's distinct keys. The joins
    added are ``_ivm_sq<n>``, from ``first_number`` up; also how many were added.

    Raises:
        ScalarSubqueryRefused: a subquery the rewrite cannot take.
    """
    out = select.copy()
    joins = list(out.args.get("joins") or [])
    kept: list[exp.Expression] = []
    number = first_number
    for c in conjuncts:
        sub = scalar_operand(c)
        semi = semi_operand(c) if semi_joins and sub is None else None
        if sub is None and semi is None:
            kept.append(c.copy())
            continue
        alias = f"{HIDDEN_PREFIX}{number}"
        number += 1
        if sub is not None:
            derived, keys = _grouped(sub, inner_columns(sub.this))
            compared = c.copy()
            target = (
                compared.this if isinstance(compared.this, exp.Subquery) else compared.expression
            )
            target.replace(exp.column("_v", table=alias))
            kept.append(compared)
        else:
            q, probe = semi
            derived, keys = _distinct(q, probe, inner_columns(q), c)
            if probe is not None:
                kept.append(exp.EQ(this=exp.column("_v", table=alias), expression=probe.copy()))
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        joins.append(exp.Join(this=table))
        kept += [
            exp.EQ(this=exp.column(f"_k{i}", table=alias), expression=o.copy())
            for i, o in enumerate(keys)
        ]
    out.set("joins", joins)
    out.set("where", exp.Where(this=exp.and_(*kept)))
    return out, number - first_number


def _distinct(
    q: exp.Select,
    probe: exp.Expression | None,
    inner: tuple[set[str], set[str]],
    at: exp.Expression,
) -> tuple[exp.Select, list[exp.Expression]]:
    """``EXISTS (q)`` / ``probe IN (q)`` as the distinct rows of ``q``'s correlation keys
    (``_k<i>``) and, for IN, its value (``_v``): joining them on equal keys keeps each outer
    row once when some row of ``q`` matches it, as the semi-join does (and a NULL probe or
    key matches nothing, as IN and ``=`` do not in WHERE). Also the outer side of each key."""
    what = "an IN subquery" if probe is not None else "an EXISTS subquery"
    grouped = any(q.args.get(k) for k in ("group", "having", "limit", "distinct", "qualify"))
    if probe is not None and len(q.expressions) != 1:
        raise _refuse(f"{what} selecting several columns", at)
    local, inner_keys, outer_keys = _correlation(q, inner, what)
    if grouped and inner_keys:
        raise _refuse(f"{what} with GROUP BY, HAVING, LIMIT or DISTINCT and correlated", at)
    if probe is None and not inner_keys:
        raise _refuse("an uncorrelated EXISTS subquery (true or false for every row)", at)
    outputs = [k.copy().as_(f"_k{i}") for i, k in enumerate(inner_keys)]
    if grouped:  # uncorrelated: the distinct values of the whole subquery's result
        value = q.expressions[0]
        ranked = q.copy()
        ranked.set(
            "expressions",
            [(value.this if isinstance(value, exp.Alias) else value).copy().as_("_v")],
        )
        inner_q = exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("_s")))
        return exp.select(exp.column("_v")).distinct().from_(inner_q), outer_keys
    if probe is not None:
        value = q.expressions[0]
        outputs.append((value.this if isinstance(value, exp.Alias) else value).copy().as_("_v"))
    derived = exp.select(*outputs).distinct()
    derived.set(_FROM, q.args[_FROM].copy())
    if q.args.get("joins"):
        derived.set("joins", [j.copy() for j in q.args["joins"]])
    if q.args.get(_WITH):
        derived.set(_WITH, q.args[_WITH].copy())
    if local:
        derived.set("where", exp.Where(this=exp.and_(*(c.copy() for c in local))))
    return derived, outer_keys


def _grouped(
    sub: exp.Subquery, inner: tuple[set[str], set[str]]
) -> tuple[exp.Select, list[exp.Expression]]:
    """The subquery grouped by its correlation keys (selecting ``_k<i>`` and ``_v``), and the
    outer expression each key equals."""
    q: exp.Select = sub.this
    for key, construct in (
        ("group", "GROUP BY"),
        ("having", "HAVING"),
        ("limit", "LIMIT"),
        ("distinct", "DISTINCT"),
        ("qualify", "QUALIFY"),
    ):
        if q.args.get(key):
            raise _refuse(f"a scalar subquery with {construct}", sub)
    if len(q.expressions) != 1:
        raise _refuse("a scalar subquery selecting several columns", sub)
    value = q.expressions[0]
    value = value.this if isinstance(value, exp.Alias) else value
    if not any(is_aggregate(n) for n in value.walk()):
        raise _refuse("a scalar subquery that does not aggregate (it may give several rows)", sub)
    if not _null_over_no_rows(value):
        raise _refuse(
            "a scalar subquery whose value over no rows is not NULL (COUNT, COALESCE, CASE: "
            "an outer row without matching rows would compare with it)",
            sub,
        )
    local, inner_keys, outer_keys = _correlation(q, inner, "a scalar subquery")
    if not inner_keys:
        raise _refuse("an uncorrelated scalar subquery (one value every row compares with)", sub)
    derived = exp.select(
        *(k.copy().as_(f"_k{i}") for i, k in enumerate(inner_keys)), value.copy().as_("_v")
    )
    derived.set(_FROM, q.args[_FROM].copy())
    if q.args.get("joins"):
        derived.set("joins", [j.copy() for j in q.args["joins"]])
    if q.args.get(_WITH):
        derived.set(_WITH, q.args[_WITH].copy())
    if local:
        derived.set("where", exp.Where(this=exp.and_(*(c.copy() for c in local))))
    derived.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]))
    return derived, outer_keys


def _correlation(
    q: exp.Select, inner: tuple[set[str], set[str]], what: str
) -> tuple[list[exp.Expression], list[exp.Expression], list[exp.Expression]]:
    """A subquery's WHERE split into its own conjuncts and its correlation: the inner and
    outer sides of each ``inner = outer`` equality.

    Raises:
        ScalarSubqueryRefused: a conjunct reads the outer query other than by such an
            equality.
    """
    qualifiers, columns = inner
    where = q.args.get("where")
    local: list[exp.Expression] = []
    inner_keys: list[exp.Expression] = []
    outer_keys: list[exp.Expression] = []
    for c in _top_conjuncts(where.this) if where is not None else []:
        outer = [col for col in _own_columns(c) if not _is_inner(col, qualifiers, columns)]
        if not outer:
            local.append(c)
            continue
        sides = (c.this, c.expression) if isinstance(c, exp.EQ) else ()
        mine = [x for x in sides if _reads_only(x, qualifiers, columns, inner=True)]
        theirs = [x for x in sides if _reads_only(x, qualifiers, columns, inner=False)]
        if not (mine and theirs and mine[0] is not theirs[0]):
            raise _refuse(
                f"{what} correlated by a condition other than inner = outer "
                f"({c.sql(dialect='spark')})",
                c,
            )
        inner_keys.append(mine[0])
        outer_keys.append(theirs[0])
    return local, inner_keys, outer_keys


def _refuse(construct: str, at: exp.Expression) -> ScalarSubqueryRefused:
    return ScalarSubqueryRefused(Refusal(construct, construct, at))


def _top_conjuncts(e: exp.Expression) -> list[exp.Expression]:
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return _top_conjuncts(e.this) + _top_conjuncts(e.expression)
    return [e]


def _is_inner(col: exp.Column, qualifiers: set[str], columns: set[str]) -> bool:
    """Whether a column of a subquery names one of its own FROM items' columns (SQL resolves
    the innermost scope first)."""
    if col.table:
        return col.table.lower() in qualifiers
    return col.name.lower() in columns


def _own_columns(e: exp.Expression) -> list[exp.Column]:
    """The columns ``e`` reads in its own scope: not those of subqueries nested in it (their
    own decorrelation resolves them)."""
    out, pending = [], [e]
    while pending:
        n = pending.pop()
        if isinstance(n, exp.Column):
            out.append(n)
        elif not isinstance(n, (exp.Subquery, exp.Select)) or n is e:
            pending.extend(n.iter_expressions())
    return out


def _reads_only(e: exp.Expression, qualifiers: set[str], columns: set[str], *, inner: bool) -> bool:
    cols = _own_columns(e)
    return bool(cols) and all(_is_inner(c, qualifiers, columns) == inner for c in cols)


def _null_over_no_rows(e: exp.Expression) -> bool:
    """Whether ``e`` (a subquery's value) is NULL when it aggregates no rows: every path from
    it to an aggregate goes through NULL-propagating arithmetic, and no aggregate is COUNT."""
    if is_aggregate(e):
        return not isinstance(e, _EMPTY_NOT_NULL)
    if isinstance(e, exp.Literal):
        return True
    if not isinstance(e, _NULL_PROPAGATING):
        return False
    operands = [a for a in e.args.values() if isinstance(a, exp.Expression)]
    non_literal = [a for a in operands if not isinstance(a, (exp.Literal, exp.DataType))]
    return bool(non_literal) and all(_null_over_no_rows(a) for a in non_literal)
