"""``ORDER BY ... LIMIT`` inside a subquery, rewritten without the LIMIT: a rewrite of one
SELECT's syntax tree run before the subquery rewrites (:mod:`ivm.sql.subqueries`), which take
subqueries without LIMIT.

A subquery of the SELECT's WHERE, HAVING or SELECT list with ``ORDER BY o LIMIT n [OFFSET
m]``, correlated by ``inner = outer`` equalities (or not at all), keeps per correlation key
the rows ``m + 1 .. m + n`` in that order: numbered per key and bounded, a per-key TopK,

    (SELECT e FROM t WHERE t.k = o.k AND f ORDER BY t.d LIMIT 1)
    -> (SELECT max(_ivm_limit1._o0) FROM
          (SELECT _o0, _c0 FROM
             (SELECT e AS _o0, t.k AS _c0,
                     ROW_NUMBER() OVER (PARTITION BY t.k ORDER BY t.d) AS _rn
              FROM t WHERE f) AS _ivm_ranked1
           WHERE _rn <= 1) AS _ivm_limit1
        WHERE _ivm_limit1._c0 = o.k)

which the subquery rewrites then join as they do any subquery (the lowerer plans the bounded
numbering as a TopK per key, an internal view). A scalar subquery must keep at most one row
(``LIMIT 1``): its value is the ``max`` of that row, NULL over none, as the subquery's is.
``EXISTS``, and a subquery that aggregates without GROUP BY (one row), ignore a positive LIMIT
without OFFSET: the LIMIT and ORDER BY are dropped.

Rows tied in the order are numbered in an order of their own, as Spark's LIMIT takes any of
them: a view whose ORDER BY does not order every row it may keep has no single result.

Contract in ``(data, time, diff)`` terms: a pure rewrite of SQL; the rewritten SELECT has the
original's result at every time (up to ties, above), so its updates are the original's.
"""

from __future__ import annotations

from collections.abc import Iterator

from sqlglot import exp

from ivm.sql.nest import FROM_ARG, own_columns
from ivm.sql.scope import is_aggregate
from ivm.sql.subqueries import InnerColumns, SubqueryRefused, correlation_keys, is_inner

LIMITED = "_ivm_limit"
"""The alias (then a number) of the rows a subquery's ``ORDER BY ... LIMIT`` keeps."""

RANK = "_rn"
"""The row number of a subquery's row among those with its correlation key."""

_OTHER_CLAUSES = ("group", "having", "distinct", "qualify")
"""Clauses beside which a LIMIT is left to the subquery rewrites (which refuse it by name)."""


def ranked_limits(
    select: exp.Select, inner_columns: InnerColumns, first_number: int
) -> tuple[exp.Select, int]:
    """``select`` with each subquery with a LIMIT in its WHERE, HAVING and SELECT list
    rewritten without it (module doc; the derived tables ``_ivm_limit<n>`` and
    ``_ivm_ranked<n>`` numbered from ``first_number``), and how many numbers it took;
    ``select`` itself when none has one.

    Raises:
        SubqueryRefused: a LIMIT the rewrite cannot take (without ORDER BY; a scalar subquery
            keeping more than one row; a correlation other than equalities; an ORDER BY or
            SELECT list reading the outer row).
    """
    if not any(_limited(select)):
        return select, 0
    out = select.copy()
    number = first_number
    for q in list(_limited(out)):
        kind = _kind(q)
        if kind == "EXISTS" or _aggregates(q):  # one row (or whether any): LIMIT n >= 1 is moot
            if q.args.get("offset") is None and _count(q.args["limit"]) not in (None, 0):
                q.set("limit", None)
                q.set("order", None)
            continue  # else refused by the subquery rewrites
        q.replace(_ranked(q, kind, inner_columns(q), number))
        number += 1
    return out, number - first_number


def _limited(select: exp.Select) -> Iterator[exp.Select]:
    """The SELECTs of ``select``'s own subqueries (not its FROM items', nor theirs) that have a
    LIMIT and no clause the subquery rewrites refuse beside it."""
    for part in ("expressions", "where", "having"):
        value = select.args.get(part)
        for root in value if isinstance(value, list) else [value] if value else []:
            for node in root.walk(prune=lambda n: isinstance(n, exp.Select)):
                if (
                    isinstance(node, exp.Select)
                    and node.args.get("limit")
                    and not any(node.args.get(k) for k in _OTHER_CLAUSES)
                ):
                    yield node


def _aggregates(q: exp.Select) -> bool:
    """Whether ``q`` (without GROUP BY) aggregates or computes a window: its rows are not its
    FROM's rows, so they are not numbered per key here."""
    return any(
        is_aggregate(n) or isinstance(n, exp.Window) for e in q.expressions for n in e.walk()
    )


def _kind(q: exp.Select) -> str:
    """``EXISTS``, ``IN`` or ``scalar``: how the subquery ``q`` is read."""
    parent = q.parent
    if isinstance(parent, exp.Exists):
        return "EXISTS"
    if isinstance(parent, exp.Subquery) and isinstance(parent.parent, exp.In):
        return "IN"
    return "scalar"


def _count(clause: exp.Expression | None) -> int | None:
    """The row count of a LIMIT or OFFSET written as a number (None otherwise)."""
    value = clause.args.get("expression") if clause is not None else None
    if isinstance(value, exp.Literal) and not value.is_string and value.this.isdigit():
        return int(value.this)
    return None


def _ranked(q: exp.Select, kind: str, inner: tuple[set[str], set[str]], number: int) -> exp.Select:
    """The subquery ``q`` without its LIMIT (module doc)."""
    limit = _count(q.args["limit"])
    offset = _count(q.args["offset"]) if q.args.get("offset") else 0
    what = "an IN subquery" if kind == "IN" else "a scalar subquery"
    at = q.args["limit"]
    if limit is None or offset is None:
        raise SubqueryRefused(f"{what} with a LIMIT or OFFSET that is not a number", at)
    if q.args.get("order") is None:
        raise SubqueryRefused(f"{what} with LIMIT and no ORDER BY (it keeps any rows)", at)
    if kind == "scalar" and limit != 1:
        raise SubqueryRefused("a scalar subquery with a LIMIT other than 1 (several rows)", at)
    if any(isinstance(e, exp.Star) for e in q.expressions):
        raise SubqueryRefused(f"{what} selecting * with LIMIT", at)
    items = [e.this if isinstance(e, exp.Alias) else e for e in q.expressions]
    order = _ordering(q, items)
    qualifiers, columns = inner
    for e in [*items, *(o.this for o in order)]:
        for c in own_columns(e):
            if not is_inner(c, qualifiers, columns):
                raise SubqueryRefused(
                    f"{what} with LIMIT whose SELECT list or ORDER BY reads the outer row's "
                    f"{c.sql(dialect='spark')}",
                    c,
                )
    local, inner_keys, outer_keys = correlation_keys(q, inner, f"{what} with LIMIT")
    rank = exp.Window(
        this=exp.RowNumber(),
        partition_by=[k.copy() for k in inner_keys],
        order=exp.Order(expressions=order),
    )
    values = [f"_o{i}" for i in range(len(items))]
    keys = [f"_c{i}" for i in range(len(inner_keys))]
    numbered = exp.select(
        *(e.copy().as_(v) for e, v in zip(items, values, strict=True)),
        *(k.copy().as_(c) for k, c in zip(inner_keys, keys, strict=True)),
        rank.as_(RANK),
    )
    numbered.set(FROM_ARG, q.args[FROM_ARG].copy())
    numbered.set("joins", [j.copy() for j in q.args.get("joins") or []])
    if local:
        numbered.set("where", exp.Where(this=exp.and_(*(c.copy() for c in local))))
    bound: exp.Expression = exp.LTE(
        this=exp.column(RANK), expression=exp.Literal.number(limit + offset)
    )
    if offset:
        bound = exp.and_(
            bound, exp.GT(this=exp.column(RANK), expression=exp.Literal.number(offset))
        )
    kept = _at(
        exp.select(*values, *keys)
        .from_(exp.Subquery(this=numbered, alias=exp.TableAlias(this=_id(f"_ivm_ranked{number}"))))
        .where(bound),
        q.args["limit"].expression.meta.get("start"),
    )
    alias = f"{LIMITED}{number}"
    start = next((n.meta["start"] for n in q.walk() if isinstance(n.meta.get("start"), int)), None)
    read = [_at(exp.column(v, table=alias), start) for v in values]
    out = exp.select(
        exp.Max(this=read[0]) if kind == "scalar" else read[0],
        *([] if kind == "scalar" else read[1:]),
    ).from_(exp.Subquery(this=kept, alias=exp.TableAlias(this=_id(alias))))
    equalities = [
        exp.EQ(this=_at(exp.column(c, table=alias), start), expression=o.copy())
        for c, o in zip(keys, outer_keys, strict=True)
    ]
    if equalities:
        out.set("where", exp.Where(this=exp.and_(*equalities)))
    return _at(out, start)


def _ordering(q: exp.Select, items: list[exp.Expression]) -> list[exp.Ordered]:
    """``q``'s ORDER BY over its FROM items: an ordinal or a SELECT-list alias replaced by the
    expression it names."""
    named = {e.alias: e.this for e in q.expressions if isinstance(e, exp.Alias) and e.alias}
    out = []
    for o in q.args["order"].expressions:
        o = o.copy()
        key = o.this
        if isinstance(key, exp.Literal) and not key.is_string and key.this.isdigit():
            if not 1 <= int(key.this) <= len(items):
                raise SubqueryRefused(f"ORDER BY {key.this} of {len(items)} columns", key)
            o.set("this", items[int(key.this) - 1].copy())
        elif isinstance(key, exp.Column) and not key.table and key.name in named:
            o.set("this", named[key.name].copy())
        out.append(o)
    return out


def _at(node: exp.Expression, start: int | None) -> exp.Expression:
    """``node``, located where the subquery it stands for starts (errors and labels name it)."""
    if start is not None:
        node.meta["start"] = start
    return node


def _id(name: str) -> exp.Identifier:
    return exp.to_identifier(name)
