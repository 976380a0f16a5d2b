"""Joins nested into one FROM item: rewrites of one SELECT's syntax tree that move the first
inputs of a join into a derived table, which the lowerer then plans as an internal view.

Owns :class:`JoinColumns` (a join's columns read from the derived table that holds them, as
``a__x``) and :func:`nest_join`: ``FROM a LEFT JOIN b ON ... LEFT JOIN c ON b.y = c.y``
becomes ``FROM (SELECT a.x AS a__x, b.y AS b__y, ... FROM a LEFT JOIN b ON ...) AS _ivm_o1
LEFT JOIN c ON _ivm_o1.b__y = c.y``. Joins associate to the left, so this is the same
result; the lowerer maintains an outer join of two inputs, and the derived table (a join)
becomes an internal view whose updates feed the outer one. Repeated, any left-deep mix of
inner and outer joins is two-input joins over internal views. An equality of the new
input's column with an expression over the nested inputs (``coalesce(a.k, b.k) = c.k``) is
computed in the derived table, so it is a key. WHERE conjuncts that read only the nested
inputs go into the derived table when no later join pads them with NULLs (inner and LEFT
joins), so the internal view holds only the rows that can reach the result.

Contract in ``(data, time, diff)`` terms: a pure rewrite of SQL; the rewritten SELECT has
the same result as the original at every time, so its updates are the original's updates.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

from sqlglot import exp

from ivm.errors import IvmError
from ivm.sql.scope import HIDDEN_PREFIX, ONE, RESERVED_PREFIX, split_conjuncts

FROM_ARG = "from_" if "from_" in exp.Select.arg_types else "from"
"""sqlglot's name of SELECT's FROM argument (newer versions add a ``_``)."""

NESTED = "_ivm_o"
"""The aliases of derived tables :func:`nest_join` makes (``_ivm_o1``, ``_ivm_o2``...)."""

Relations = Sequence[tuple[str, frozenset[str], tuple[str, ...]]]
"""Each FROM item's alias, qualifiers and columns, in FROM order."""


class NestRefused(IvmError):
    """A query :func:`nest_join` cannot rewrite; ``message`` says why, at node ``at``."""

    def __init__(self, message: str, at: exp.Expression) -> None:
        super().__init__(message)
        self.message, self.at = message, at


def own_columns(e: exp.Expression) -> list[exp.Column]:
    """The columns ``e`` reads in its own scope: not those of subqueries nested in it (their
    own decorrelation resolves them)."""
    return own_nodes(e, exp.Column)


N = TypeVar("N", bound=exp.Expression)


def own_nodes(e: exp.Expression, kind: type[N]) -> list[N]:
    """The ``kind`` nodes in ``e``'s own scope (``e`` and what it holds, not what the
    subqueries nested in it hold)."""
    out, pending = [], [e]
    while pending:
        n = pending.pop()
        if isinstance(n, kind):
            out.append(n)
        elif not isinstance(n, (exp.Subquery, exp.Select)) or n is e:
            pending.extend(n.iter_expressions())
    return out


def _is_star(item: exp.Expression) -> bool:
    return isinstance(item, exp.Star) or (
        isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
    )


class JoinColumns:
    """The columns of a join's inputs ``members`` (all when None) moved into one derived
    table ``alias``, by their names there (``a__x``; a nested table's columns keep theirs),
    and which of them the query reads."""

    def __init__(
        self,
        relations: Relations,
        visible: Sequence[tuple[int, str]],
        alias: str,
        members: Sequence[int] | None = None,
        *,
        strict: bool = False,
    ) -> None:
        """``strict``: an unqualified name that more than one input has is refused (else it
        is left as written, for the lowerer to report)."""
        self.relations, self.visible, self.alias, self.strict = relations, visible, alias, strict
        self.members = set(range(len(relations)) if members is None else members)
        self.used: set[str] = set()

    def name_of(self, i: int, c: str) -> str:
        """The name of input ``i``'s column ``c`` in the derived table."""
        a = self.relations[i][0]
        # the engine reserves names starting "_ivm_": a hidden input's are "ivm_sq1__c"
        return (
            c if a.startswith(NESTED) else f"{a[1:] if a.startswith(RESERVED_PREFIX) else a}__{c}"
        )

    def name(self, i: int, c: str) -> str:
        """:meth:`name_of`, recorded as read."""
        self.used.add(self.name_of(i, c))
        return self.name_of(i, c)

    def owner(self, col: exp.Column) -> int | None:
        """The input ``col`` (``a.x``, or ``x`` if one input has it) reads; None if none."""
        name = col.name.lower()
        if col.table:
            found = [i for i, r in enumerate(self.relations) if col.table.lower() in r[1]]
        else:
            found = [i for i, c in self.visible if c == name]
            if self.strict and len(found) > 1 and self.members & set(found):
                raise NestRefused(f"column {name!r} is ambiguous: qualify it", col)
        if len(found) == 1 and name in self.relations[found[0]][2]:
            return found[0]
        if self.strict and col.table and found and found[0] in self.members:
            raise NestRefused(f"column {col.sql(dialect='spark')!r} does not exist", col)
        return None

    def resolve(self, col: exp.Column) -> exp.Column | None:
        """``alias.a__x`` for a column of a member; None for any other."""
        i = self.owner(col)
        if i is None or i not in self.members:
            return None
        return exp.column(self.name(i, col.name.lower()), table=self.alias)

    def rewritten(self, e: exp.Expression) -> exp.Expression:
        """A copy of ``e`` reading the members' columns from the derived table."""
        if isinstance(e, exp.Column):
            return self.resolve(e) or e.copy()
        out = e.copy()
        for col in own_columns(out):
            new = self.resolve(col)
            if new is not None:
                col.replace(new)
        return out

    def _star(self, item: exp.Expression) -> list[exp.Expression]:
        """``*`` or ``q.*`` as the columns it shows, each under its name."""
        q = item.table.lower() if isinstance(item, exp.Column) and item.table else None
        out: list[exp.Expression] = []
        for i, c in self.visible:
            a, qualifiers, _ = self.relations[i]
            if q is None and (a.startswith(HIDDEN_PREFIX) or c == ONE):
                continue
            if q is not None and q not in qualifiers:
                continue
            if i in self.members:
                out.append(exp.column(self.name(i, c), table=self.alias).as_(c))
            else:
                out.append(exp.column(c, table=a).as_(c))
        return out

    def items(self, select: exp.Select) -> list[exp.Expression]:
        """The SELECT list over the derived table, each output keeping its name (``*``
        expanded)."""
        items: list[exp.Expression] = []
        for item in select.expressions:
            if _is_star(item):
                items += self._star(item)
            elif isinstance(item, exp.Column):
                new = self.rewritten(item)
                items.append(new.as_(item.name) if new.name != item.name else new)
            else:
                items.append(self.rewritten(item))
        return items

    def derived(
        self,
        first: exp.Expression,
        joins: Sequence[exp.Join],
        where: Sequence[exp.Expression] = (),
        extra: Sequence[exp.Expression] = (),
    ) -> exp.Subquery:
        """``(SELECT a.x AS a__x, ..., extra FROM first joins WHERE where) AS alias`` of the
        members' columns read (one if none: it keeps the rows' count)."""
        chosen = [
            (i, c)
            for i in sorted(self.members)
            for c in self.relations[i][2]
            if self.name_of(i, c) in self.used
        ] or [(min(self.members), self.relations[min(self.members)][2][0])]
        columns = [
            exp.column(c, table=self.relations[i][0]).as_(self.name_of(i, c)) for i, c in chosen
        ]
        inner = exp.select(*columns, *extra)
        inner.set(FROM_ARG, exp.From(this=first.copy()))
        inner.set("joins", [j.copy() for j in joins] or None)
        if where:
            inner.set("where", exp.Where(this=exp.and_(*(c.copy() for c in where))))
        return exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(self.alias)))


def _side(j: exp.Join) -> str:
    return str(j.args.get("side") or "").upper()


def nest_join(
    select: exp.Select,
    first: exp.Expression,
    joins: Sequence[exp.Join],
    relations: Relations,
    visible: Sequence[tuple[int, str]],
    cut: int,
    alias: str,
) -> exp.Select:
    """``select`` (FROM ``first`` ``joins``, USING already written as ON) with its inputs
    before input ``cut`` moved into the derived table ``alias`` (see the module's docstring).

    Raises:
        NestRefused: a subquery left in an expression (it may read the moved inputs), or
            a column name that is ambiguous or unknown.
    """
    jc = JoinColumns(relations, visible, alias, range(cut), strict=True)
    for key in ("expressions", "where", "group", "having", "order", "qualify"):
        value = select.args.get(key)
        for part in value if isinstance(value, list) else [value] if value else []:
            nested = next(iter(part.find_all(exp.Select)), None)
            if nested is not None:
                raise NestRefused(
                    "a subquery in a query whose outer join has more than two inputs", nested
                )
    where = select.args.get("where")
    conjuncts = split_conjuncts(where.this) if isinstance(where, exp.Where) else []
    unpadded = all(_side(j) in ("", "LEFT") for j in joins[cut - 1 :])

    def members_only(c: exp.Expression) -> bool:
        owners = {jc.owner(col) for col in own_columns(c)}
        return bool(owners) and owners <= jc.members

    pushed = [c for c in conjuncts if unpadded and members_only(c)]
    kept = [c for c in conjuncts if not any(c is p for p in pushed)]
    extra: list[exp.Expression] = []
    suffix = []
    for k, j in enumerate(joins[cut - 1 :]):
        on = j.args.get("on")
        parts = split_conjuncts(on) if on is not None else []
        rewritten = []
        for c in parts:
            if k == 0 and isinstance(c, exp.EQ):
                c = _computed_key(c, jc, cut, extra)
            rewritten.append(jc.rewritten(c))
        moved = j.copy()
        if rewritten:
            moved.set("on", exp.and_(*rewritten))
        if isinstance(moved.this, exp.Subquery) and not moved.this.alias:
            # its name stays (``_subquery2`` would otherwise be renumbered)
            name = exp.TableAlias(this=exp.to_identifier(relations[cut + k][0]))
            moved.this.set("alias", name)
        suffix.append(moved)
    out = select.copy()
    out.set("expressions", jc.items(select))
    for key in ("group", "having", "order", "qualify"):
        if select.args.get(key):
            out.set(key, jc.rewritten(select.args[key]))
    out.set("where", exp.Where(this=exp.and_(*(jc.rewritten(c) for c in kept))) if kept else None)
    out.set("joins", suffix)
    out.set(FROM_ARG, exp.From(this=jc.derived(first, joins[: cut - 1], pushed, extra)))
    return out


def _computed_key(
    eq: exp.EQ, jc: JoinColumns, cut: int, extra: list[exp.Expression]
) -> exp.Expression:
    """``f(a, b) = c.k`` (``f`` over the moved inputs only, not one column) as
    ``alias._e<n> = c.k``, with ``f(a, b) AS _e<n>`` added to ``extra``: a key column of the
    derived table. Any other conjunct as it is."""
    sides = [eq.this, eq.expression]
    owners = [{jc.owner(col) for col in own_columns(s)} for s in sides]
    for mine, theirs in ((0, 1), (1, 0)):
        if (
            not isinstance(sides[mine], exp.Column)
            and owners[mine]
            and owners[mine] <= jc.members
            and isinstance(sides[theirs], exp.Column)
            and owners[theirs] == {cut}
        ):
            name = f"{jc.alias.lstrip('_')}_e{len(extra)}"
            extra.append(sides[mine].copy().as_(name))
            jc.used.add(name)
            column = exp.column(name, table=jc.alias)
            return exp.EQ(this=column, expression=sides[theirs].copy())
    return eq
