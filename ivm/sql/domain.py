"""Subqueries correlated by any condition, rewritten to be correlated by equalities alone.

A subquery whose WHERE reads the outer row other than by ``inner = outer`` equalities (two
comparisons, ``BETWEEN``, an expression of both sides, ``<>`` under NOT IN or a scalar
subquery) is evaluated over the *domain* of the outer values it reads, the unnesting of
Neumann and Kemper that Materialize plans too::

    SELECT ... FROM o WHERE p AND EXISTS (SELECT 1 FROM t WHERE t.f = 1 AND t.a < o.x
                                          AND t.b > o.y)

becomes::

    SELECT ... FROM o WHERE p AND EXISTS (
        SELECT 1 FROM (SELECT t.*, d.__ivm_d0, d.__ivm_d1
                       FROM t, (SELECT DISTINCT o.x AS __ivm_d0, o.y AS __ivm_d1
                                FROM o WHERE p) AS d
                       WHERE t.f = 1 AND t.a < d.__ivm_d0 AND t.b > d.__ivm_d1) AS t
        WHERE t.__ivm_d0 = o.x AND t.__ivm_d1 = o.y)

The derived table pairs each distinct outer value with the subquery's rows for it, so the
subquery is now correlated by equalities, which :mod:`ivm.sql.subqueries` and the lowerer
plan with the operators the engine has (the derived table and the domain are internal views).
Equalities with the outer row become the derived table's join keys; without any, it joins on
a constant (:data:`ONE`), and a change to ``t`` is compared with every domain value: EXPLAIN
shows that join.

The rewrite is exact only where an outer value that is NULL makes the correlation not true
(every outer column is read under a comparison through NULL-propagating arithmetic): the
equalities on the domain then lose no row. Otherwise it is refused by name.

An ``EXISTS``/``IN`` subquery that groups (``GROUP BY``, ``HAVING``, ``DISTINCT``) and is
correlated by equalities, as written or over its domain, is grouped by its correlation too
(:func:`grouped_by_correlation`), so each outer row meets the groups of its own rows.

Contract in ``(data, time, diff)`` terms: a pure rewrite of SQL; the rewritten SELECT has the
same result as the original at every time, so its updates are the original's updates.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from sqlglot import exp

from ivm.sql.nest import FROM_ARG, own_columns, own_nodes
from ivm.sql.scope import ONE, is_aggregate, split_conjuncts
from ivm.sql.subqueries import (
    COMPARISONS,
    EMPTY_NOT_NULL,
    NULL_PROPAGATING,
    InnerColumns,
    SubqueryRefused,
    correlated_by_equalities,
    correlation_keys,
    is_inner,
    scalar_subqueries,
)

DOMAIN = "__ivm_d"
"""The prefix of the domain's columns (``__ivm_d0``...)."""
DOMAIN_ALIAS = "_ivm_domain"
"""The alias of a domain (one per subquery's scope: the same SQL wherever it is lowered, so
views and repeated lowerings share its internal view)."""

_STRICT = (*COMPARISONS, exp.Between, exp.Like, exp.ILike)
"""Conditions that are not true when an operand is NULL."""


def by_domain(
    select: exp.Select,
    inner_columns: InnerColumns,
    one_item: Callable[[exp.Select], exp.Select],
) -> exp.Select:
    """``select`` with each subquery of its WHERE and SELECT list that is correlated other
    than :mod:`ivm.sql.subqueries` takes rewritten over the domain of the outer values it
    reads (module doc), and each ``EXISTS``/``IN`` subquery that groups grouped by its
    correlation too (:func:`grouped_by_correlation`). ``one_item`` makes a subquery that
    joins read its join as one FROM item (a derived table).

    Raises:
        SubqueryRefused: a correlation that may hold for a NULL outer value.
    """
    if not any(_subqueries(select)):
        return select
    out = select.copy()
    for q, kind in list(_subqueries(out)):
        grouped = kind != SCALAR and any(q.args.get(k) for k in _GROUPING)
        bounded = kind in _BOUNDED and not grouped  # a value span per key is not per group
        if not correlated_by_equalities(q, inner_columns(q), bounded=bounded):
            if q.args.get("joins"):
                q = q.replace(one_item(q))
            rewritten = _over_domain(q, out, inner_columns(q), kind)
            if rewritten is None:
                continue
            q = q.replace(rewritten)
        if grouped and not q.args.get("limit"):
            q.replace(grouped_by_correlation(q, inner_columns(q)))
    return out


SCALAR = "a scalar subquery"
_GROUPING = ("group", "having", "distinct")
"""The clauses that group a subquery's rows (its correlation must group them too)."""


def grouped_by_correlation(q: exp.Select, inner: tuple[set[str], set[str]]) -> exp.Select:
    """An ``EXISTS``/``IN`` subquery that groups (``GROUP BY``, ``HAVING``, ``DISTINCT``),
    correlated by equalities, grouped by its correlation too: ``SELECT k FROM t WHERE t.z =
    o.z AND p GROUP BY k HAVING h`` as ``SELECT g._c0 FROM (SELECT k AS _c0, t.z AS _g0 FROM
    t WHERE p GROUP BY k, t.z HAVING h) AS g WHERE g._g0 = o.z``: each outer row meets the
    groups of exactly its rows, and the derived table is an internal view. ``q`` itself when
    it is not correlated."""
    own, inner_keys, outer_keys = correlation_keys(q, inner)
    if not inner_keys or (q.args.get("having") and not _empty_when_no_rows(q)):
        return q
    derived = q.copy()
    derived.set(
        "expressions",
        [
            *(_unaliased(e).copy().as_(f"_c{j}") for j, e in enumerate(q.expressions)),
            *(k.copy().as_(f"_g{i}") for i, k in enumerate(inner_keys)),
        ],
    )
    derived.set("where", exp.Where(this=exp.and_(*(c.copy() for c in own))) if own else None)
    if q.args.get("group") or q.args.get("having"):
        group = list(q.args["group"].expressions) if q.args.get("group") else []
        derived.set("group", exp.Group(expressions=[*group, *(k.copy() for k in inner_keys)]))
    name = GROUPED_SUBQUERY
    out = exp.select(*(exp.column(f"_c{j}", table=name) for j in range(len(q.expressions))))
    out.set(
        FROM_ARG,
        exp.From(
            this=exp.Subquery(this=derived, alias=exp.TableAlias(this=exp.to_identifier(name)))
        ),
    )
    keys = [exp.column(f"_g{i}", table=name).eq(o.copy()) for i, o in enumerate(outer_keys)]
    out.set("where", exp.Where(this=exp.and_(*keys)))
    return out


GROUPED_SUBQUERY = "_ivm_gs"
"""The alias of a grouping subquery grouped by its correlation (:func:`grouped_by_correlation`)."""


def _empty_when_no_rows(q: exp.Select) -> bool:
    """Whether ``q`` gives no row over no rows: it groups (no group then), or its HAVING
    compares aggregates that are NULL over no rows (no COUNT) through NULL-propagating
    arithmetic. (An outer row without rows of its own has no group once grouped by the
    correlation, where ``HAVING count(*) = 0`` over its rows would give one.)"""
    if q.args.get("group"):
        return True

    def null_over_no_rows(n: exp.Expression) -> bool:
        if is_aggregate(n):
            return not isinstance(n, EMPTY_NOT_NULL)
        if isinstance(n, exp.Literal):
            return False
        operands = [a for a in n.iter_expressions() if not isinstance(a, exp.DataType)]
        return isinstance(n, NULL_PROPAGATING) and any(map(null_over_no_rows, operands))

    conditions = split_conjuncts(q.args["having"].this)
    return any(
        isinstance(c, _STRICT) and any(map(null_over_no_rows, c.iter_expressions()))
        for c in conditions
    )


def _unaliased(e: exp.Expression) -> exp.Expression:
    return e.this if isinstance(e, exp.Alias) else e


_BOUNDED = ("EXISTS", "NOT EXISTS", "IN")
"""The kinds a comparison besides equalities already correlates (a value span per key)."""


def _subqueries(select: exp.Select) -> Iterator[tuple[exp.Select, str]]:
    """The subqueries of ``select``'s WHERE and SELECT list (not nested deeper) with their
    kind: ``EXISTS``, ``NOT EXISTS``, ``IN``, ``NOT IN`` or ``a scalar subquery``."""
    where = select.args.get("where")
    roots = [*select.expressions, *([where.this] if where is not None else [])]
    for root in roots:
        for sub in scalar_subqueries(root):
            parent = sub.parent
            if isinstance(parent, exp.In) and parent.args.get("query") is sub:
                negated = isinstance(parent.parent, exp.Not)
                yield sub.this, "NOT IN" if negated else "IN"
            else:
                yield sub.this, SCALAR
        for e in own_nodes(root, exp.Exists):
            if isinstance(e.this, exp.Select):
                yield e.this, "NOT EXISTS" if isinstance(e.parent, exp.Not) else "EXISTS"


def _over_domain(
    q: exp.Select,
    outer: exp.Select,
    inner: tuple[set[str], set[str]],
    kind: str,
) -> exp.Select | None:
    """``q`` over the domain of the outer values its WHERE reads; None when the rewrite does
    not apply (the lowerer then refuses ``q`` by name as before)."""
    alias = DOMAIN_ALIAS
    qualifiers, columns = inner
    shaped = not any(q.args.get(k) for k in ("joins", "limit", "qualify"))
    where = q.args.get("where")
    if (
        not shaped
        or where is None
        or not isinstance(q.args[FROM_ARG].this, exp.Table | exp.Subquery)
    ):
        return None
    grouping = [q.args[k] for k in ("group", "having") if q.args.get(k)]
    if any(_reads_outer(e, qualifiers, columns) for e in [*q.expressions, *grouping]):
        return None
    conjuncts = split_conjuncts(where.this)
    local = [c for c in conjuncts if not _reads_outer(c, qualifiers, columns)]
    correlated = [c for c in conjuncts if _reads_outer(c, qualifiers, columns)]
    values: dict[str, exp.Column] = {}
    for c in correlated:
        for col in own_columns(c):
            if not is_inner(col, qualifiers, columns):
                values.setdefault(col.sql(), col)
    names = {sql: f"{DOMAIN}{i}" for i, sql in enumerate(values)}
    for sql in values:
        if not any(_rejects_null(c, sql) for c in correlated):
            raise SubqueryRefused(
                f"{kind} correlated by a condition that may hold where {sql} is NULL "
                f"({' AND '.join(c.sql(dialect='spark') for c in correlated)})",
                correlated[0],
            )
    item = q.args[FROM_ARG].this
    name = item.alias_or_name
    on = [_read_from(c, names, alias) for c in correlated]
    keyed = any(_paired_equality(c, qualifiers, columns) for c in correlated)
    domain = _domain(outer, {n: values[s] for s, n in names.items()})
    items = [*([] if "EXISTS" in kind else q.expressions), *grouping]  # EXISTS reads no item
    selected = _read_columns(items, name, inner)
    source, filters = item.copy(), [c.copy() for c in local]
    if not keyed:  # no equality to join on: every row meets every domain value
        domain.select(exp.Literal.number(1).as_(ONE), copy=False)
        read = _read_columns([*items, *correlated], name, inner)
        wrapped = exp.select(*read, exp.Literal.number(1).as_(ONE))
        wrapped.set(FROM_ARG, exp.From(this=source))
        if filters:  # the rows that may match, filtered before they are paired
            wrapped.set("where", exp.Where(this=exp.and_(*filters)))
        source = exp.Subquery(this=wrapped, alias=exp.TableAlias(this=exp.to_identifier(name)))
        on.append(exp.column(ONE, table=name).eq(exp.column(ONE, table=alias)))
        filters = []
    paired = exp.select(*selected, *(exp.column(n, table=alias) for n in names.values()))
    paired.set(FROM_ARG, exp.From(this=source))
    domain_item = exp.Subquery(this=domain, alias=exp.TableAlias(this=exp.to_identifier(alias)))
    paired.set("joins", [exp.Join(this=domain_item)])
    paired.set("where", exp.Where(this=exp.and_(*on, *filters)))
    out = q.copy()
    out.set(
        FROM_ARG,
        exp.From(
            this=exp.Subquery(this=paired, alias=exp.TableAlias(this=exp.to_identifier(name)))
        ),
    )
    keys = [exp.column(n, table=name).eq(values[s].copy()) for s, n in names.items()]
    out.set("where", exp.Where(this=exp.and_(*keys)))
    return out


def _domain(outer: exp.Select, values: dict[str, exp.Column]) -> exp.Select:
    """``SELECT DISTINCT <value> AS <name>, ... FROM <outer's FROM> WHERE <outer's conditions
    without subqueries>``: every value an outer row that reaches the subquery reads (a row
    the other conditions drop needs none)."""
    domain = exp.select(*(v.copy().as_(n) for n, v in values.items())).distinct()
    domain.set(FROM_ARG, outer.args[FROM_ARG].copy())
    if outer.args.get("joins"):
        domain.set("joins", [j.copy() for j in outer.args["joins"]])
    where = outer.args.get("where")
    conditions = split_conjuncts(where.this) if where is not None else []
    plain = [c.copy() for c in conditions if not _holds_subquery(c)]
    if plain:
        domain.set("where", exp.Where(this=exp.and_(*plain)))
    return domain


def _read_columns(
    read_by: list[exp.Expression], name: str, inner: tuple[set[str], set[str]]
) -> list[exp.Column]:
    """The columns of a subquery's FROM item (named ``name``) that ``read_by`` read: all of
    them (``name.*``) where one selects ``*``."""
    if any(isinstance(e, exp.Star) or isinstance(e.this, exp.Star) for e in read_by):
        return [exp.Column(this=exp.Star(), table=exp.to_identifier(name))]
    read: dict[str, exp.Column] = {}
    for col in (c for e in read_by for c in own_columns(e) if is_inner(c, *inner)):
        read.setdefault(col.name, col)
    out = [col.copy() for col in read.values()]  # as written: errors point at them
    for col in out:
        col.set("table", exp.to_identifier(name))
    return out


def _reads_outer(e: exp.Expression, qualifiers: set[str], columns: set[str]) -> bool:
    return any(not is_inner(c, qualifiers, columns) for c in own_columns(e))


def _holds_subquery(e: exp.Expression) -> bool:
    return bool(scalar_subqueries(e) or own_nodes(e, exp.Exists))


def _read_from(c: exp.Expression, names: dict[str, str], alias: str) -> exp.Expression:
    """A copy of correlated conjunct ``c`` reading each outer value from the domain."""

    def swap(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and n.sql() in names:
            return exp.column(names[n.sql()], table=alias)
        return n

    return c.copy().transform(swap)


def _paired_equality(c: exp.Expression, qualifiers: set[str], columns: set[str]) -> bool:
    """Whether ``c`` is ``inner = outer``: one side reads only the subquery's columns, the
    other only the outer row's (an equi-join key of the subquery with its domain)."""
    if not isinstance(c, exp.EQ):
        return False
    sides = [own_columns(x) for x in (c.this, c.expression)]
    if not all(sides):
        return False
    kinds = [{is_inner(col, qualifiers, columns) for col in s} for s in sides]
    return sorted(map(tuple, kinds)) == [(False,), (True,)]


def _rejects_null(c: exp.Expression, value: str) -> bool:
    """Whether condition ``c`` is not true when outer value ``value`` is NULL: a comparison
    reading it through NULL-propagating arithmetic, a conjunction with one such, or a
    disjunction of such."""
    while isinstance(c, exp.Paren):
        c = c.this
    if isinstance(c, exp.And):
        return _rejects_null(c.this, value) or _rejects_null(c.expression, value)
    if isinstance(c, exp.Or):
        return _rejects_null(c.this, value) and _rejects_null(c.expression, value)
    if not isinstance(c, _STRICT):
        return False
    for col in own_columns(c):
        if col.sql() != value:
            continue
        node = col.parent
        while node is not c and isinstance(node, NULL_PROPAGATING):
            node = node.parent
        if node is c:
            return True
    return False
