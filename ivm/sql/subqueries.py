"""Subqueries rewritten into joins: rewrites of one SELECT's syntax tree that the lowerer
then plans with the operators it has (joins, semi/anti joins, reductions, internal views).

Owns the rewrites and their conditions:

- :func:`decorrelate`: a WHERE comparison with a scalar subquery that aggregates, correlated
  by equalities, ``... WHERE x < (SELECT 0.2 * avg(q) FROM t WHERE t.k = o.k AND t.f = 1)``,
  becomes a join with the subquery grouped by its keys, ``... JOIN (SELECT t.k AS _k0, 0.2 *
  avg(q) AS _v FROM t WHERE t.f = 1 GROUP BY t.k) AS _ivm_sq1 WHERE x < _ivm_sq1._v AND
  _ivm_sq1._k0 = o.k``: the same multiset, since an outer row without a group would compare
  with NULL (the aggregate of no rows), which WHERE drops as the join does. A subquery whose
  value over no rows is not NULL (``COUNT``, ``coalesce(sum(x), 0)``) is a LEFT JOIN whose
  unmatched rows compare with that value (:func:`_over_no_rows`).
  An uncorrelated one joins on a constant the outer rows carry (:func:`_wrap_for_constant`).
  ``EXISTS``/``IN`` become joins with the subquery's distinct keys (:func:`_distinct`), or,
  correlated by one other comparison too, with its value span per key (:class:`Bound`).
- :func:`decorrelate_select_list`: a scalar subquery in the SELECT list, a LEFT JOIN.
- :func:`lift_having`: HAVING compared with a subquery, the groups filtered by WHERE.
- :func:`wrap_join`: a join under NOT EXISTS/NOT IN, one FROM item; :func:`anti_bounded`:
  NOT EXISTS correlated by a comparison, a LEFT JOIN with the value span per key.

The lowerer plans each derived table that aggregates or joins as an internal view, so a
change to ``t`` updates one group's row and re-examines only the outer rows with that key.
Anything else is refused by name (:class:`SubqueryRefused`, which the lowerer locates).

Contract in ``(data, time, diff)`` terms: pure rewrites of SQL; each rewritten SELECT has the
same result as the original at every time, so its updates are the original's updates.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlglot import exp

from ivm.errors import IvmError
from ivm.sql.nest import FROM_ARG, JoinColumns, Relations, own_columns
from ivm.sql.scope import HIDDEN_PREFIX, ONE, is_aggregate, split_conjuncts

_WITH = "with_" if "with_" in exp.Select.arg_types else "with"
"""sqlglot's name of SELECT's WITH argument (newer versions add a ``_``)."""

COMPARISONS = (exp.EQ, exp.NEQ, exp.GT, exp.GTE, exp.LT, exp.LTE)
NULL_PROPAGATING = (
    exp.Add,
    exp.Sub,
    exp.Mul,
    exp.Div,
    exp.Mod,
    exp.Neg,
    exp.Paren,
    exp.Cast,
    exp.Literal,
)
ROWS = "_ivm_rows"
"""The alias of a grouped subquery's rows under NOT IN (:func:`_as_rows`)."""

EMPTY_NOT_NULL = (exp.Count, exp.CountIf, exp.ArrayAgg, exp.ApproxDistinct)
"""Aggregates whose value over no rows is not NULL (``COUNT`` is 0)."""


class SubqueryRefused(IvmError):
    """A subquery no rewrite takes (``construct``, at ``at``); the lowerer turns it into a
    located ``SqlError``."""

    def __init__(self, construct: str, at: exp.Expression) -> None:
        super().__init__(construct)
        self.construct, self.at = construct, at


InnerColumns = Callable[[exp.Select], tuple[set[str], set[str]]]
"""A subquery's FROM items -> (their qualifiers, their column names), lowercase."""


def scalar_operand(conjunct: exp.Expression) -> exp.Subquery | None:
    """The scalar subquery one side of a top-level comparison holds (``x > (SELECT ...)``,
    ``x > (SELECT ...) / 10``), if exactly one side holds exactly one."""
    found = _scalar_side(conjunct)
    return found[0] if found is not None else None


def _scalar_side(conjunct: exp.Expression) -> tuple[exp.Subquery, bool] | None:
    """:func:`scalar_operand`, and whether it is in the comparison's left side."""
    if not isinstance(conjunct, COMPARISONS):
        return None
    left, right = (scalar_subqueries(x) for x in (conjunct.this, conjunct.expression))
    if len(left) + len(right) != 1:
        return None
    return (left[0], True) if left else (right[0], False)


def scalar_subqueries(e: exp.Expression) -> list[exp.Subquery]:
    """The scalar subqueries in ``e``'s own scope (not inside other subqueries)."""
    out, pending = [], [e]
    while pending:
        n = pending.pop()
        if isinstance(n, exp.Subquery) and isinstance(n.this, exp.Select):
            out.append(n)
        elif not isinstance(n, (exp.Subquery, exp.Select)):
            pending.extend(n.iter_expressions())
    return out


def _with_value(conjunct: exp.Expression, value: exp.Expression) -> exp.Expression:
    """A copy of a comparison with its scalar subquery replaced by ``value``."""
    _, left = _scalar_side(conjunct)
    out = conjunct.copy()
    (sub,) = scalar_subqueries(out.this if left else out.expression)
    sub.replace(value)
    return out


def subquery_predicate(
    e: exp.Expression,
) -> tuple[str, exp.Expression, exp.Expression | None] | None:
    """``(kind, subquery, probe)`` for ``[NOT] EXISTS (q)`` / ``x [NOT] IN (q)``, else None."""
    negated = isinstance(e, exp.Not)
    inner = e.this if negated else e
    while isinstance(inner, exp.Paren):
        inner = inner.this
    if isinstance(inner, exp.Exists):
        return ("NOT EXISTS" if negated else "EXISTS", inner.this, None)
    if isinstance(inner, exp.In) and inner.args.get("query") is not None:
        return ("NOT IN" if negated else "IN", inner.args["query"], inner.this)
    return None


def _select_of(q: exp.Expression) -> exp.Select | None:
    """The SELECT of a subquery (``(SELECT ...)`` or ``SELECT ...``); None for a union."""
    q = q.this if isinstance(q, exp.Subquery) else q
    return q if isinstance(q, exp.Select) else None


def semi_operand(conjunct: exp.Expression) -> tuple[exp.Select, exp.Expression | None] | None:
    """``(subquery, probe)`` of a top-level ``EXISTS (q)`` (probe None) or ``x IN (q)``."""
    found = subquery_predicate(conjunct)
    if found is None or found[0] not in ("EXISTS", "IN"):
        return None
    q = _select_of(found[1])
    return (q, found[2]) if q is not None else None


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
        SubqueryRefused: a subquery the rewrite cannot take.
    """
    out = select.copy()
    joins = list(out.args.get("joins") or [])
    kept: list[exp.Expression] = []
    number = first_number
    for c in conjuncts:
        sub = scalar_operand(c)
        semi = semi_operand(c) if semi_joins and sub is None else None
        if sub is None and semi is None and nested_semis(c):
            c, added = _semis_tested(c, out, joins, inner_columns, number)
            number += added
        if sub is None and semi is None:
            kept.append(c.copy())
            continue
        alias = f"{HIDDEN_PREFIX}{number}"
        number += 1
        if sub is not None:
            derived, keys, empty = _grouped(sub, inner_columns(sub.this))
            if not keys:  # uncorrelated: every outer row carries the key 1
                keys = [exp.column(ONE, table=_wrap_for_constant(out))]
            kept.append(_with_value(c, _unmatched_reads(alias, empty)))
            if empty is not None:  # a row without a group compares with ``empty``: kept
                table = exp.Subquery(
                    this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias))
                )
                on = exp.and_(*_key_equalities(alias, keys))
                joins.append(exp.Join(this=table, side="LEFT", on=on))
                continue
        else:
            q, probe = semi
            derived, keys, bound = _distinct(q, probe, inner_columns(q), c)
            if not keys and probe is None:  # no equality: every outer row carries 1
                keys = [exp.column(ONE, table=_wrap_for_constant(out))]
            if probe is not None and bound is None:
                kept.append(exp.EQ(this=exp.column("_v", table=alias), expression=probe.copy()))
            if bound is not None:
                kept.append(bound.holds(alias))
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        joins.append(exp.Join(this=table))
        kept += _key_equalities(alias, keys)
    out.set("joins", joins)
    out.set("where", exp.Where(this=exp.and_(*kept)))
    return out, number - first_number


def nested_semis(e: exp.Expression) -> list[exp.Expression]:
    """The ``EXISTS``/``IN``/``NOT EXISTS``/``NOT IN`` subqueries under ``e``'s OR (and AND
    inside it): ``EXISTS`` is never NULL, and an ``IN``'s NULL is as good as false there,
    since in WHERE AND and OR alone never turn a NULL into true."""
    if isinstance(e, exp.Paren):
        return nested_semis(e.this)
    if not isinstance(e, exp.Or):
        return []

    def leaves(n: exp.Expression) -> list[exp.Expression]:
        if isinstance(n, (exp.Or, exp.And)):
            return [*leaves(n.this), *leaves(n.expression)]
        if isinstance(n, exp.Paren):
            return leaves(n.this)
        return [n] if semi_operand(n) is not None or _not_exists(n) or _not_in(n) else []

    return leaves(e)


def _not_in(e: exp.Expression) -> bool:
    found = subquery_predicate(e)
    return found is not None and found[0] == "NOT IN" and _select_of(found[1]) is not None


def _not_exists(e: exp.Expression) -> bool:
    found = subquery_predicate(e)
    return found is not None and found[0] == "NOT EXISTS" and _select_of(found[1]) is not None


def shadowed(select: exp.Select, qualifiers: set[str], alias: str) -> exp.Select:
    """A subquery whose one FROM item has the outer query's name, with that item aliased
    ``alias`` and the columns qualified by the name qualified by ``alias``: SQL resolves a
    name in the innermost scope, so inside the subquery it is the subquery's own table."""
    out = select.copy()
    out.args[FROM_ARG].this.set("alias", exp.TableAlias(this=exp.to_identifier(alias)))
    for col in own_columns(out):
        if col.table and col.table.lower() in qualifiers:
            col.set("table", exp.to_identifier(alias))
    return out


def correlated_not_in(conjunct: exp.Expression, inner_columns: InnerColumns) -> bool:
    """Whether ``conjunct`` is ``x NOT IN (q)`` with ``q`` correlated (by equalities)."""
    found = subquery_predicate(conjunct)
    q = _select_of(found[1]) if found is not None and found[0] == "NOT IN" else None
    if q is None or any(q.args.get(k) for k in ("group", "having", "limit", "distinct")):
        return False
    return bool(_correlation(q, inner_columns(q), "a NOT IN subquery")[2])


def _not_in_tested(
    c: exp.Expression,
    outer: exp.Select,
    joins: list[exp.Join],
    inner_columns: InnerColumns,
    number: int,
) -> tuple[exp.Expression, int]:
    """``x NOT IN (SELECT y FROM t WHERE t.k = o.k ...)`` as two LEFT JOINs added to
    ``joins``: per key (uncorrelated: one row on a constant of ``outer``), the subquery's row
    count and NULL ``y`` count (``_ivm_sq<number>``), and its distinct non-NULL ``y``
    (``_ivm_sq<number + 1>``, joined on ``_v = x`` too); and the test that replaces it. NOT
    IN is true over no rows, and else only when ``x`` is not NULL, no ``y`` is NULL and none
    equals ``x`` (SQL's rules, per outer row): ``coalesce(stats._n, 0) = 0 OR (x IS NOT NULL
    AND stats._nulls = 0 AND match._k0 IS NULL)``. Also how many joins were added (2)."""
    _, query, probe = subquery_predicate(c)
    q = _select_of(query)
    if len(q.expressions) != 1:
        raise _refuse("a NOT IN subquery selecting several columns", c)
    if any(q.args.get(k) for k in ("group", "having", "limit", "distinct", "qualify")):
        q = _as_rows(q, inner_columns, c)
    local, inner_keys, outer_keys, _ = _correlation(q, inner_columns(q), "a NOT IN subquery")
    if not inner_keys:  # uncorrelated: one row of counts, joined on a constant
        outer_keys = [exp.column(ONE, table=_wrap_for_constant(outer))]
    value = q.expressions[0]
    value = value.this if isinstance(value, exp.Alias) else value
    keys = [k.copy() for k in inner_keys] or [exp.Literal.number(1)]
    named = [k.copy().as_(f"_k{i}") for i, k in enumerate(keys)]
    count = exp.Count(this=exp.Star())
    nulls = exp.Sub(this=count.copy(), expression=exp.Count(this=value.copy()))
    stats = exp.select(*named, count.as_("_n"), nulls.as_("_nulls"))
    _read_as(stats, q, local)
    if inner_keys:
        stats.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]))
    present = exp.Not(this=exp.Is(this=value.copy(), expression=exp.null()))
    matches = exp.select(*(k.copy() for k in named), value.copy().as_("_v")).distinct()
    _read_as(matches, q, [*local, present])
    a, b = f"{HIDDEN_PREFIX}{number}", f"{HIDDEN_PREFIX}{number + 1}"
    probe_eq = exp.column("_v", table=b).eq(probe.copy())
    for alias, derived, on in (
        (a, stats, _key_equalities(a, outer_keys)),
        (b, matches, [*_key_equalities(b, outer_keys), probe_eq]),
    ):
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        joins.append(exp.Join(this=table, side="LEFT", on=exp.and_(*on)))
    empty = exp.func("coalesce", exp.column("_n", table=a), exp.Literal.number(0)).eq(0)
    known = exp.Not(this=exp.Is(this=probe.copy(), expression=exp.null()))
    no_nulls = exp.column("_nulls", table=a).eq(0)
    no_match = exp.Is(this=exp.column("_k0", table=b), expression=exp.null())
    return exp.Paren(this=exp.or_(empty, exp.and_(known, no_nulls, no_match))), 2


def _as_rows(q: exp.Select, inner_columns: InnerColumns, at: exp.Expression) -> exp.Select:
    """An uncorrelated subquery that groups (or is DISTINCT, or limited) as the rows of a
    derived table of its result, ``SELECT _v FROM (q) AS _ivm_rows``: the same rows, read
    by a SELECT the NOT IN rewrite takes (the lowerer plans the derived table as an
    internal view).

    Raises:
        SubqueryRefused: ``q`` reads the outer row (its groups would depend on it).
    """
    qualifiers, columns = inner_columns(q)
    if any(not is_inner(col, qualifiers, columns) for col in own_columns(q)):
        raise _refuse(
            "a correlated NOT IN subquery with GROUP BY, HAVING, LIMIT or DISTINCT under OR "
            "or beside another NOT IN",
            at,
        )
    value = q.expressions[0]
    inner = q.copy()
    inner.set("expressions", [(value.this if isinstance(value, exp.Alias) else value).as_("_v")])
    alias = exp.TableAlias(this=exp.to_identifier(ROWS))
    return exp.select(exp.column("_v", table=ROWS)).from_(exp.Subquery(this=inner, alias=alias))


def uncorrelated_exists(conjunct: exp.Expression, inner_columns: InnerColumns) -> bool:
    """Whether ``conjunct`` is ``[NOT] EXISTS (q)`` with ``q`` uncorrelated (true or false
    for every row alike: joined on a constant, :func:`_distinct`)."""
    found = subquery_predicate(conjunct)
    q = _select_of(found[1]) if found is not None and "EXISTS" in found[0] else None
    if q is None:
        return False
    try:
        _, keys, _, bound = _correlation(q, inner_columns(q), "", bounded=True)
    except SubqueryRefused:  # correlated otherwise: its own rewrite refuses it by name
        return False
    return not keys and bound is None


def tests_joined(
    select: exp.Select,
    conjuncts: Sequence[exp.Expression],
    targets: Sequence[exp.Expression],
    inner_columns: InnerColumns,
    first_number: int,
) -> tuple[exp.Select, int]:
    """``select`` (whose WHERE is ``conjuncts``) with each ``NOT EXISTS`` or ``NOT IN`` of
    ``targets`` made LEFT JOINs and the test replacing it (:func:`_semis_tested`): any number
    of them, over a join or one table. Also how many joins were added."""
    out = select.copy()
    joins = list(out.args.get("joins") or [])
    kept: list[exp.Expression] = []
    number = first_number
    for c in conjuncts:
        if any(c is t for t in targets):
            tested, added = _semis_tested(c, out, joins, inner_columns, number, whole=True)
            number += added
            kept.append(tested)
        else:
            kept.append(c.copy())
    out.set("joins", joins)
    out.set("where", exp.Where(this=exp.and_(*kept)))
    return out, number - first_number


def _semis_tested(
    c: exp.Expression,
    outer: exp.Select,
    joins: list[exp.Join],
    inner_columns: InnerColumns,
    first_number: int,
    *,
    whole: bool = False,
) -> tuple[exp.Expression, int]:
    """``c`` with each ``EXISTS``/``IN`` under its OR (:func:`nested_semis`; ``whole``: ``c``
    itself) a LEFT JOIN with the subquery's distinct keys (added to ``joins``), tested by
    ``_k0 IS NOT NULL`` (``_v`` for an uncorrelated IN; ``IS NULL`` for NOT EXISTS): a row
    matches at most one such key, so none is doubled. Also how many joins were added."""
    out = c.copy()
    leaves = [out] if whole else nested_semis(out)
    number = first_number
    for leaf in leaves:
        if _not_in(leaf):  # its own pair of joins (SQL's NULL rules)
            tested, added = _not_in_tested(leaf, outer, joins, inner_columns, number)
            number += added
            if leaf is out:
                return tested, added
            leaf.replace(tested)
            continue
        alias = f"{HIDDEN_PREFIX}{number}"
        number += 1
        negated = _not_exists(leaf)
        q, probe = semi_operand(leaf.this if negated else leaf)
        derived, keys, bound = _distinct(q, probe, inner_columns(q), leaf)
        if not keys and probe is None:  # uncorrelated: joined on the constant of ``outer``
            keys = [exp.column(ONE, table=_wrap_for_constant(outer))]
        if bound is not None:
            raise _refuse(
                "an EXISTS correlated by a comparison other than = inside OR, or beside "
                "another NOT EXISTS over a join",
                leaf,
            )
        on = _key_equalities(alias, keys)
        if probe is not None:
            on.append(exp.EQ(this=exp.column("_v", table=alias), expression=probe.copy()))
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        joins.append(exp.Join(this=table, side="LEFT", on=exp.and_(*on)))
        unmatched = exp.Is(
            this=exp.column("_k0" if keys else "_v", table=alias), expression=exp.null()
        )
        tested = unmatched if negated else exp.Not(this=unmatched)
        if leaf is out:
            return tested, 1
        leaf.replace(tested)
    return out, number - first_number


def _distinct(
    q: exp.Select,
    probe: exp.Expression | None,
    inner: tuple[set[str], set[str]],
    at: exp.Expression,
) -> tuple[exp.Select, list[exp.Expression], Bound | None]:
    """``EXISTS (q)`` / ``probe IN (q)`` as the distinct rows of ``q``'s correlation keys
    (``_k<i>``) and, for IN, its value (``_v``): joining them on equal keys keeps each outer
    row once when some row of ``q`` matches it, as the semi-join does (and a NULL probe or
    key matches nothing, as IN and ``=`` do not in WHERE). Also the outer side of each key,
    and for an EXISTS correlated by one other comparison, that :class:`Bound` (the rows are
    then the value spans of :func:`_spans`)."""
    what = "an IN subquery" if probe is not None else "an EXISTS subquery"
    grouped = any(q.args.get(k) for k in ("group", "having", "limit", "distinct", "qualify"))
    if probe is not None and len(q.expressions) != 1:
        raise _refuse(f"{what} selecting several columns", at)
    local, inner_keys, outer_keys, bound = _correlation(q, inner, what, bounded=True)
    if bound is not None and probe is not None:  # x IN (q) is EXISTS (q WHERE value = x)
        value = q.expressions[0]
        inner_keys.append((value.this if isinstance(value, exp.Alias) else value).copy())
        outer_keys.append(probe.copy())
    if bound is not None:
        if grouped:
            raise _refuse(f"{what} with GROUP BY, HAVING, LIMIT or DISTINCT and correlated", at)
        return _spans(q, local, inner_keys, bound), outer_keys, bound
    if grouped and inner_keys:
        raise _refuse(f"{what} with GROUP BY, HAVING, LIMIT or DISTINCT and correlated", at)
    if probe is None and not inner_keys:  # one row when q has any: joined on a constant
        one = q.copy()
        one.set("expressions", [exp.Literal.number(1).as_("_k0")])
        if not grouped:
            return one.distinct(), [], None
        whole = exp.Subquery(this=one, alias=exp.TableAlias(this=exp.to_identifier("_s")))
        return exp.select(exp.column("_k0")).distinct().from_(whole), [], None
    outputs = [k.copy().as_(f"_k{i}") for i, k in enumerate(inner_keys)]
    if grouped:  # uncorrelated: the distinct values of the whole subquery's result
        value = q.expressions[0]
        ranked = q.copy()
        ranked.set(
            "expressions",
            [(value.this if isinstance(value, exp.Alias) else value).copy().as_("_v")],
        )
        inner_q = exp.Subquery(this=ranked, alias=exp.TableAlias(this=exp.to_identifier("_s")))
        return exp.select(exp.column("_v")).distinct().from_(inner_q), outer_keys, None
    if probe is not None:
        value = q.expressions[0]
        outputs.append((value.this if isinstance(value, exp.Alias) else value).copy().as_("_v"))
    derived = exp.select(*outputs).distinct()
    _read_as(derived, q, local)
    return derived, outer_keys, None


def _spans(
    q: exp.Select, local: Sequence[exp.Expression], keys: Sequence[exp.Expression], bound: Bound
) -> exp.Select:
    """``q``'s rows grouped by its correlation keys (``_k<i>``) with the least and greatest
    non-NULL value of the bound's inner side (``_mn``, ``_mx``): what :meth:`Bound.holds`
    reads. One row per key, so joining it keeps each outer row once. Correlated by the
    comparison alone: the one span of the whole subquery, with ``_k0 = 1`` (an aggregate
    without GROUP BY has one row even over no rows, its span NULL), for the outer rows to
    join on the constant they carry (:func:`_wrap_for_constant`)."""
    value = bound.inner
    derived = exp.select(
        *(k.copy().as_(f"_k{i}") for i, k in enumerate(keys or [exp.Literal.number(1)])),
        exp.Min(this=value.copy()).as_("_mn"),
        exp.Max(this=value.copy()).as_("_mx"),
    )
    present = exp.Not(this=exp.Is(this=value.copy(), expression=exp.null()))
    _read_as(derived, q, [*local, present])
    if keys:
        derived.set("group", exp.Group(expressions=[k.copy() for k in keys]))
    return derived


def outer_reads(inner_columns: InnerColumns) -> Callable[[exp.Subquery], list[exp.Column]]:
    """For a scalar subquery, the columns it reads of the query around it (its correlation:
    those none of its own FROM items has), by ``inner_columns``."""

    def reads(sub: exp.Subquery) -> list[exp.Column]:
        q = _select_of(sub)
        if q is None:
            return []
        qualifiers, columns = inner_columns(q)
        return [c for c in own_columns(q) if not is_inner(c, qualifiers, columns)]

    return reads


def refuse_outer_values(select: exp.Select, inner_columns: InnerColumns) -> None:
    """Refuse a scalar subquery (of ``select``'s SELECT list or WHERE) whose SELECT list
    aggregates and reads the outer row, by the column it reads: Spark allows outer references
    there only in a subquery's WHERE and HAVING, and would refuse the view as written.

    Raises:
        SubqueryRefused: such a subquery.
    """
    where = select.args.get("where")
    scopes = [*select.expressions, *([where.this] if isinstance(where, exp.Where) else [])]
    for sub in [s for e in scopes for s in scalar_subqueries(e)]:
        qualifiers, columns = inner_columns(sub.this)
        for item in sub.this.expressions:
            outer = [c for c in own_columns(item) if not is_inner(c, qualifiers, columns)]
            if outer and any(is_aggregate(n) for n in item.walk()):
                raise _refuse(
                    f"a subquery's SELECT list reading the outer row's "
                    f"{outer[0].sql(dialect='spark')} (Spark allows it only in WHERE and HAVING)",
                    outer[0],
                )


def select_subqueries(select: exp.Select) -> list[exp.Subquery]:
    """The scalar subqueries in ``select``'s SELECT list (not inside nested subqueries)."""
    return [sub for item in select.expressions for sub in scalar_subqueries(item)]


def decorrelate_select_list(
    select: exp.Select, inner_columns: InnerColumns, first_number: int
) -> tuple[exp.Select, int]:
    """``select`` with each scalar subquery of its SELECT list made a LEFT JOIN with the
    subquery grouped by its correlation (an outer row without a group reads the subquery's
    value over no rows: NULL, or 0 for a COUNT), ``_ivm_sq<first_number>``, ... after its
    FROM items; also how many. The SELECT must not group. (The lowerer nests a LEFT JOIN
    after other joins: :mod:`ivm.sql.nest`.)

    Raises:
        SubqueryRefused: a subquery the rewrite cannot take.
    """
    subs = select_subqueries(select)
    if select.args.get("group") or any(
        is_aggregate(n)
        for item in select.expressions
        for n in item.walk(prune=lambda n: isinstance(n, exp.Subquery))
    ):
        raise _refuse("a scalar subquery in the SELECT list of a grouped query", subs[0])
    out = select.copy()
    copies = select_subqueries(out)
    joins = []
    for number, (sub, copy) in enumerate(zip(subs, copies, strict=True), first_number):
        alias = f"{HIDDEN_PREFIX}{number}"
        derived, keys, empty = _grouped(sub, inner_columns(sub.this))
        if not keys:  # uncorrelated: one row, which every outer row carries the key of
            keys = [exp.column(ONE, table=_wrap_for_constant(out))]
        copy.replace(_unmatched_reads(alias, empty))
        table = exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(alias)))
        on = exp.and_(*_key_equalities(alias, keys))
        joins.append(exp.Join(this=table, side="LEFT", on=on))
    out.set("joins", [*(out.args.get("joins") or []), *joins])
    return out, len(subs)


def _grouped(
    sub: exp.Subquery, inner: tuple[set[str], set[str]]
) -> tuple[exp.Select, list[exp.Expression], exp.Expression | None]:
    """The subquery grouped by its correlation keys (selecting ``_k<i>`` and ``_v``), the
    outer expression each key equals, and, correlated, its value over no rows when that is
    not NULL (``COUNT``: 0; ``coalesce(sum(x), 0)``: 0): an outer row without a group reads
    it (:func:`_unmatched_reads`). Uncorrelated: its one row with ``_k0 = 1`` (an aggregate
    without GROUP BY has one even over no rows), and no outer expression."""
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
    local, inner_keys, outer_keys, _ = _correlation(q, inner, "a scalar subquery")
    empty = None
    if inner_keys and not _null_over_no_rows(value):
        empty = _over_no_rows(value, sub)
    # Uncorrelated: keyed by the constant every outer row carries in ONE (wrap_for_constant).
    keys = [k.copy() for k in inner_keys] or [exp.Literal.number(1)]
    derived = exp.select(*(k.as_(f"_k{i}") for i, k in enumerate(keys)), value.copy().as_("_v"))
    _read_as(derived, q, local)
    if inner_keys:
        derived.set("group", exp.Group(expressions=[k.copy() for k in inner_keys]))
    return derived, outer_keys, empty


def _over_no_rows(value: exp.Expression, sub: exp.Subquery) -> exp.Expression:
    """An aggregating expression's value over no rows: each COUNT 0 (a BIGINT), any other aggregate
    NULL, the rest as written (``coalesce(sum(x), 0)``: ``coalesce(NULL, 0)``).

    Raises:
        SubqueryRefused: an aggregate whose value over no rows is neither (an array...).
    """

    def empty(n: exp.Expression) -> exp.Expression:
        if isinstance(n, (exp.Count, exp.CountIf)):  # typed as COUNT is
            return exp.cast(exp.Literal.number(0), exp.DataType.build("BIGINT"))
        if isinstance(n, (exp.ArrayAgg, exp.ApproxDistinct)):
            name = n.sql(dialect="spark").split("(")[0].upper()  # as Spark names it
            raise _refuse(f"a correlated scalar subquery over {name}", sub)
        return exp.null() if is_aggregate(n) else n

    return value.copy().transform(empty)


def _unmatched_reads(alias: str, empty: exp.Expression | None) -> exp.Expression:
    """The value a LEFT JOIN with decorrelated subquery ``alias`` gives: its ``_v``, or
    ``empty`` (its value over no rows) where no group matched (``_k0`` NULL)."""
    value = exp.column("_v", table=alias)
    if empty is None:
        return value
    unmatched = exp.Is(this=exp.column("_k0", table=alias), expression=exp.null())
    return exp.Case(ifs=[exp.If(this=unmatched, true=empty.copy())], default=value)


def _key_equalities(alias: str, outer_keys: Sequence[exp.Expression]) -> list[exp.Expression]:
    """``alias._k<i> = outer`` for each correlation key: how a decorrelated subquery joins."""
    return [
        exp.EQ(this=exp.column(f"_k{i}", table=alias), expression=o.copy())
        for i, o in enumerate(outer_keys)
    ]


def _read_as(derived: exp.Select, q: exp.Select, local: Sequence[exp.Expression]) -> None:
    """Give ``derived`` the FROM, joins and WITH of subquery ``q``, and ``local`` (its own
    conjuncts, its correlation taken out) as WHERE."""
    derived.set(FROM_ARG, q.args[FROM_ARG].copy())
    if q.args.get("joins"):
        derived.set("joins", [j.copy() for j in q.args["joins"]])
    if q.args.get(_WITH):
        derived.set(_WITH, q.args[_WITH].copy())
    if local:
        derived.set("where", exp.Where(this=exp.and_(*(c.copy() for c in local))))


@dataclass(frozen=True, slots=True)
class Bound:
    """A subquery's one correlation by a comparison other than equality, ``inner op outer``
    (``op`` written with the inner side on the left: ``<>``, ``<``, ``<=``, ``>``, ``>=``)."""

    inner: exp.Expression
    op: type[exp.Expression]
    outer: exp.Expression
    written: exp.Expression  # the conjunct as written (errors point at it)

    def without_equality(self, what: str) -> SubqueryRefused:
        return _refuse(
            f"{what} correlated by a comparison ({self.written.sql(dialect='spark')}) and no "
            "equality",
            self.written,
        )

    _FLIPPED = {exp.LT: exp.GT, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.GTE: exp.LTE}

    def holds(self, alias: str, *, negated: bool = False) -> exp.Expression:
        """Whether some row of a group (whose non-NULL ``inner`` values span ``_mn`` ..
        ``_mx`` in ``alias``) satisfies ``inner op outer``: ``<>`` some value differs (the
        least or the greatest), ``<``/``<=`` the least, ``>``/``>=`` the greatest; with
        ``negated``, that none does (the group present and ``outer`` not NULL)."""
        mn, mx, s = exp.column("_mn", table=alias), exp.column("_mx", table=alias), self.outer
        if self.op is exp.NEQ:
            if negated:
                return exp.and_(
                    exp.EQ(this=mn, expression=s.copy()), exp.EQ(this=mx, expression=s.copy())
                )
            return exp.or_(
                exp.NEQ(this=mn, expression=s.copy()), exp.NEQ(this=mx, expression=s.copy())
            )
        side = mn if self.op in (exp.LT, exp.LTE) else mx
        negation = {exp.LT: exp.GTE, exp.LTE: exp.GT, exp.GT: exp.LTE, exp.GTE: exp.LT}
        op = negation[self.op] if negated else self.op
        return op(this=side, expression=s.copy())


def _correlation(
    q: exp.Select, inner: tuple[set[str], set[str]], what: str, *, bounded: bool = False
) -> tuple[list[exp.Expression], list[exp.Expression], list[exp.Expression], Bound | None]:
    """A subquery's WHERE split into its own conjuncts and its correlation: the inner and
    outer sides of each ``inner = outer`` equality, and (when ``bounded``) at most one other
    comparison of an inner and an outer expression (:class:`Bound`).

    Raises:
        SubqueryRefused: a conjunct reads the outer query otherwise.
    """
    qualifiers, columns = inner
    where = q.args.get("where")
    local: list[exp.Expression] = []
    inner_keys: list[exp.Expression] = []
    outer_keys: list[exp.Expression] = []
    bound: Bound | None = None
    for c in split_conjuncts(where.this) if where is not None else []:
        outer = [col for col in own_columns(c) if not is_inner(col, qualifiers, columns)]
        if not outer:
            local.append(c)
            continue
        sides = (c.this, c.expression) if isinstance(c, COMPARISONS) else ()
        mine = [x for x in sides if _reads_only(x, qualifiers, columns, inner=True)]
        theirs = [x for x in sides if _reads_only(x, qualifiers, columns, inner=False)]
        paired = bool(mine and theirs and mine[0] is not theirs[0])
        if paired and isinstance(c, exp.EQ):
            inner_keys.append(mine[0])
            outer_keys.append(theirs[0])
        elif paired and bounded and bound is None:
            op = type(c) if mine[0] is c.this else Bound._FLIPPED.get(type(c), type(c))
            bound = Bound(mine[0], op, theirs[0], c)
        else:
            what_else = "inner = outer and one other comparison" if bounded else "inner = outer"
            raise _refuse(
                f"{what} correlated by a condition other than {what_else} "
                f"({c.sql(dialect='spark')})",
                c,
            )
    return local, inner_keys, outer_keys, bound


def correlated_by_equalities(
    q: exp.Select, inner: tuple[set[str], set[str]], *, bounded: bool
) -> bool:
    """Whether subquery ``q``'s WHERE reads the outer row by ``inner = outer`` equalities
    alone (with ``bounded``, and at most one other comparison, :class:`Bound`), or not at
    all: the correlations these rewrites take (:mod:`ivm.sql.domain` takes the others)."""
    try:
        _correlation(q, inner, "", bounded=bounded)
    except SubqueryRefused:
        return False
    return True


def correlation_keys(
    q: exp.Select, inner: tuple[set[str], set[str]], what: str = "a subquery"
) -> tuple[list[exp.Expression], list[exp.Expression], list[exp.Expression]]:
    """Subquery ``q``'s own conditions, and the inner and outer sides of its ``inner =
    outer`` equalities (which must be all its correlation, :func:`correlated_by_equalities`;
    else refused, naming the subquery ``what``)."""
    own, inner_keys, outer_keys, _ = _correlation(q, inner, what)
    return own, inner_keys, outer_keys


def _refuse(construct: str, at: exp.Expression) -> SubqueryRefused:
    return SubqueryRefused(construct, at)


def is_inner(col: exp.Column, qualifiers: set[str], columns: set[str]) -> bool:
    """Whether a column of a subquery names one of its own FROM items' columns (SQL resolves
    the innermost scope first)."""
    if col.table:
        return col.table.lower() in qualifiers
    return col.name.lower() in columns


def _reads_only(e: exp.Expression, qualifiers: set[str], columns: set[str], *, inner: bool) -> bool:
    cols = own_columns(e)
    return bool(cols) and all(is_inner(c, qualifiers, columns) == inner for c in cols)


def _null_over_no_rows(e: exp.Expression) -> bool:
    """Whether ``e`` (a subquery's value) is NULL when it aggregates no rows: every path from
    it to an aggregate goes through NULL-propagating arithmetic, and no aggregate is COUNT."""
    if is_aggregate(e):
        return not isinstance(e, EMPTY_NOT_NULL)
    if isinstance(e, exp.Literal):
        return True
    if not isinstance(e, NULL_PROPAGATING):
        return False
    operands = [a for a in e.args.values() if isinstance(a, exp.Expression)]
    non_literal = [a for a in operands if not isinstance(a, (exp.Literal, exp.DataType))]
    return bool(non_literal) and all(_null_over_no_rows(a) for a in non_literal)


def _wrap_for_constant(select: exp.Select) -> str:
    """Make ``select``'s first FROM item ``(SELECT q.*, 1 AS __ivm_one FROM item) AS q``
    (once), so its rows join an uncorrelated subquery's one row on ``__ivm_one = _k0``; the
    lowerer makes it an internal view, whose column ``__ivm_one`` is then a key like any other
    (a change of the subquery's value looks up every outer row: one key). Returns ``q``."""
    from_ = select.args[FROM_ARG]
    item = from_.this
    name = (item.alias or (item.name if isinstance(item, exp.Table) else "_subquery")).lower()
    inner = item.this if isinstance(item, exp.Subquery) else None
    if isinstance(inner, exp.Select) and any(e.alias_or_name == ONE for e in inner.expressions):
        return name  # wrapped already (a second uncorrelated subquery)
    alias = item.args.get("alias")
    if isinstance(alias, exp.TableAlias) and any(c.name == ONE for c in alias.columns):
        return name  # the one row of a SELECT without FROM carries it (ivm.sql.constants)
    source = item.copy()
    star = exp.Column(this=exp.Star(), table=exp.to_identifier(name))
    wrapped = exp.select(star, exp.Literal.number(1).as_(ONE))
    wrapped.set(FROM_ARG, exp.From(this=source))
    alias = exp.TableAlias(this=exp.to_identifier(name))
    from_.set("this", exp.Subquery(this=wrapped, alias=alias))
    return name


JOINED = "_ivm_j"
"""The alias of a join a NOT EXISTS/NOT IN is moved out of (:func:`wrap_join`)."""


def wrap_join(
    select: exp.Select,
    relations: Relations,
    visible: Sequence[tuple[int, str]],
    kept: Sequence[exp.Expression],
    anti: exp.Expression,
    inner_columns: InnerColumns,
) -> exp.Select:
    """``SELECT ... FROM a, b WHERE kept AND anti`` as ``SELECT ... FROM (SELECT a.x AS a__x,
    ... FROM a, b WHERE kept) AS _ivm_j WHERE anti``: the join becomes one FROM item (an
    internal view), which the NOT EXISTS/NOT IN then filters as it filters a table.

    Args:
        relations: each FROM item's alias, qualifiers and columns, in FROM order.
        visible: the ``(relation, column)`` pairs ``*`` shows, in order.
        kept: WHERE's other conjuncts; anti: the NOT EXISTS/NOT IN conjunct.
    """
    join = JoinColumns(relations, visible, JOINED)
    out = select.copy()
    out.set("expressions", join.items(select))
    for key in ("group", "having", "order", "qualify"):
        if select.args.get(key):
            out.set(key, join.rewritten(select.args[key]))
    qualifiers, columns = inner_columns(_subquery_of(anti))
    moved = anti.copy()
    for nested in [n for n in moved.walk() if isinstance(n, exp.Select)][:1]:
        for col in own_columns(nested):  # the subquery's references to the join
            new = None if is_inner(col, qualifiers, columns) else join.resolve(col)
            if new is not None:
                col.replace(new)
    if isinstance(moved, exp.Not) and isinstance(moved.this, exp.In):  # NOT IN's probe
        moved.this.this.replace(join.rewritten(moved.this.this))
    out.set("where", exp.Where(this=moved))
    out.set("joins", None)
    out.set(
        FROM_ARG,
        exp.From(
            this=join.derived(select.args[FROM_ARG].this, select.args.get("joins") or [], kept)
        ),
    )
    return out


SUBQUERY_JOIN = "_ivm_sj"
"""The alias of the join inside an ``EXISTS``/``IN`` subquery (:func:`wrap_subquery_join`)."""


def wrap_subquery_join(
    q: exp.Select,
    relations: Relations,
    visible: Sequence[tuple[int, str]],
    inner_columns: InnerColumns,
) -> exp.Select:
    """Subquery ``SELECT ... FROM a JOIN b ... WHERE own AND correlated`` as ``SELECT ...
    FROM (SELECT a.x AS a__x, ... FROM a JOIN b ... WHERE own) AS _ivm_sj WHERE
    correlated``: its join becomes one FROM item (an internal view), which a semi- or
    anti-join reads as it reads a table. ``relations`` and ``visible`` describe its FROM
    items as :func:`wrap_join`'s do."""
    join = JoinColumns(relations, visible, SUBQUERY_JOIN)
    qualifiers, columns = inner_columns(q)
    where = q.args.get("where")
    conjuncts = split_conjuncts(where.this) if where is not None else []
    own = [c for c in conjuncts if all(is_inner(x, qualifiers, columns) for x in own_columns(c))]
    correlated = [join.rewritten(c) for c in conjuncts if not any(c is o for o in own)]
    out = q.copy()
    out.set("expressions", join.items(q))
    for key in ("group", "having", "order", "qualify"):
        if q.args.get(key):
            out.set(key, join.rewritten(q.args[key]))
    out.set("where", exp.Where(this=exp.and_(*correlated)) if correlated else None)
    out.set("joins", None)
    first = q.args[FROM_ARG].this
    out.set(FROM_ARG, exp.From(this=join.derived(first, q.args["joins"], own)))
    return out


def _subquery_of(predicate: exp.Expression) -> exp.Select:
    """The query of ``[NOT] EXISTS (q)`` or ``x [NOT] IN (q)`` (a SELECT: the callers'
    :func:`subquery_predicate` checks have seen it)."""
    found = subquery_predicate(predicate)
    q = _select_of(found[1]) if found is not None else None
    assert q is not None, predicate.sql()
    return q


GROUPED = "_ivm_g"
"""The alias of a grouped query whose HAVING compares with a subquery (:func:`lift_having`)."""


def lift_having(select: exp.Select) -> exp.Select | None:
    """``SELECT k, sum(x) AS s FROM t GROUP BY k HAVING sum(x) > (SELECT ...)`` as
    ``SELECT k, s FROM (SELECT k, sum(x) AS s, sum(x) AS __h0 FROM t GROUP BY k) AS _ivm_g
    WHERE __h0 > (SELECT ...)``: the comparison then filters the groups as WHERE filters rows
    (:func:`decorrelate`). None when HAVING compares with no scalar subquery.

    Raises:
        SubqueryRefused: an output without a name, or a LIMIT (it would apply before
            the comparison).
    """
    having = select.args.get("having")
    if having is None:
        return None
    conjuncts = split_conjuncts(having.this)
    lifted = [c for c in conjuncts if scalar_operand(c) is not None]
    if not lifted:
        return None
    if select.args.get("limit"):
        raise _refuse("a subquery in HAVING of a query with LIMIT", scalar_operand(lifted[0]))
    names = []
    for item in select.expressions:
        if not isinstance(item, (exp.Alias, exp.Column)) or isinstance(item.this, exp.Star):
            raise _refuse("a subquery in HAVING with an unnamed SELECT item", item)
        names.append(item.alias_or_name)
    grouped = select.copy()
    extra, compared = [], []
    for n, c in enumerate(lifted):
        _, left = _scalar_side(c)
        extra.append((c.expression if left else c.this).copy().as_(f"__h{n}"))
        moved = c.copy()
        (moved.expression if left else moved.this).replace(exp.column(f"__h{n}", table=GROUPED))
        compared.append(moved)
    grouped.set("expressions", [*grouped.expressions, *extra])
    rest = [c.copy() for c in conjuncts if scalar_operand(c) is None]
    grouped.set("having", exp.Having(this=exp.and_(*rest)) if rest else None)
    grouped.set("order", None)  # a view has no order; without LIMIT it changes nothing
    out = exp.select(*(exp.column(n, table=GROUPED) for n in names))
    derived = exp.Subquery(this=grouped, alias=exp.TableAlias(this=exp.to_identifier(GROUPED)))
    out.set(FROM_ARG, exp.From(this=derived))
    out.set("where", exp.Where(this=exp.and_(*compared)))
    return out


def bounded_exists(conjunct: exp.Expression, inner_columns: InnerColumns) -> bool:
    """Whether ``conjunct`` is ``[NOT] EXISTS (q)`` or ``x IN (q)`` with ``q`` correlated by
    a comparison other than equality (:class:`Bound`), besides any equalities."""
    found = subquery_predicate(conjunct)
    kinds = ("EXISTS", "NOT EXISTS", "IN")
    q = _select_of(found[1]) if found is not None and found[0] in kinds else None
    if q is None:
        return False
    try:
        bound = _correlation(q, inner_columns(q), "", bounded=True)[3]
    except SubqueryRefused:
        return False
    return bound is not None


def anti_bounded(
    select: exp.Select,
    conjuncts: Sequence[exp.Expression],
    inner_columns: InnerColumns,
    first_number: int,
) -> tuple[exp.Select, int]:
    """``select`` (one FROM item; its WHERE is ``conjuncts``) with each ``NOT EXISTS`` whose
    subquery is correlated by equalities and one other comparison made a LEFT JOIN with the
    subquery's value span per key (:func:`_spans`): an outer row is kept when no group
    matches it, when its side of the comparison is NULL, or when no value of its group
    satisfies the comparison (:meth:`Bound.holds` negated). Also how many were rewritten.

    Raises:
        SubqueryRefused: a subquery the rewrite cannot take.
    """
    out = select.copy()
    joins = list(out.args.get("joins") or [])
    kept: list[exp.Expression] = []
    number = first_number
    for c in conjuncts:
        if not (isinstance(c, exp.Not) and bounded_exists(c, inner_columns)):
            kept.append(c.copy())
            continue
        q = _subquery_of(c)
        local, keys, outer_keys, bound = _correlation(q, inner_columns(q), "", bounded=True)
        assert bound is not None  # bounded_exists
        if any(q.args.get(k) for k in ("group", "having", "limit", "distinct")):
            raise _refuse("a NOT EXISTS subquery with GROUP BY, HAVING, LIMIT or DISTINCT", c)
        alias = f"{HIDDEN_PREFIX}{number}"
        number += 1
        if not keys:  # the whole subquery's one span, joined on the constant
            outer_keys = [exp.column(ONE, table=_wrap_for_constant(out))]
        on = exp.and_(*_key_equalities(alias, outer_keys))
        table = exp.Subquery(
            this=_spans(q, local, keys, bound), alias=exp.TableAlias(this=exp.to_identifier(alias))
        )
        joins.append(exp.Join(this=table, side="LEFT", on=on))
        unmatched = exp.Is(this=exp.column("_k0", table=alias), expression=exp.null())
        unknown = exp.Is(this=bound.outer.copy(), expression=exp.null())
        # the whole subquery's span is NULL when it has no value (it is a row all the same)
        empty = exp.Is(this=exp.column("_mn", table=alias), expression=exp.null())
        none = bound.holds(alias, negated=True)
        kept.append(
            exp.Paren(this=exp.or_(unmatched, unknown, *([empty] if not keys else []), none))
        )
    out.set("joins", joins)
    out.set("where", exp.Where(this=exp.and_(*kept)))
    return out, number - first_number
