"""Lowering: a parsed view's sqlglot AST -> a demand-pruned plan IR tree (:mod:`ivm.plan.ir`).

Owns a query's structure: WITH, UNION/INTERSECT/EXCEPT, SELECT; FROM items (sources, views,
CTEs, subqueries, parenthesized joins); joins folded left to right with their constant
conditions decided; one ``[NOT] EXISTS``/``[NOT] IN`` subquery in WHERE as a semi-join. Names
resolve in :mod:`ivm.sql.scope`; the stateful constructs (GROUP BY, DISTINCT, set operations,
TopK) are lowered by :mod:`ivm.sql.lower_reduce`, whose class the lowerer here extends.

Contract in ``(data, time, diff)`` terms: the returned plan, applied to the updates of its
inputs, yields the updates of the view: stateless nodes map updates one by one (they are
linear and deterministic, see :mod:`ivm.plan.ir`), joins by delta paths, stateful nodes from
state of their own. A join whose condition is never true is stateless: the UNION ALL of its
preserved inputs' updates padded with NULLs and of its other inputs read through ``Filter
FALSE`` (no update; their columns' types only).

Refused with ``SqlError`` naming the construct (or table and column) and its ``line:col``:
unknown tables and columns, the clauses of ``_UNSUPPORTED_CLAUSES``, WITH RECURSIVE, BY NAME,
joins other than inner and LEFT/RIGHT/FULL OUTER (USING, NATURAL, SEMI...), cross joins, outer
joins of more than two inputs, other subqueries, and output columns named twice or like the
engine's own (``_time``, ``_diff``).
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from decimal import Decimal, InvalidOperation
from functools import partial
from typing import Literal

from sqlglot import exp

from ivm.errors import SqlError
from ivm.plan.ir import (
    Constant,
    Filter,
    Get,
    Join,
    JoinInput,
    Node,
    Project,
    Reduce,
    SemiJoin,
    SetOp,
    TopK,
    UnionAll,
    Window,
    _substitute,
    bounded_groups,
    collections,
    demand,
    referenced_columns,
    simplify,
    walk,
)
from ivm.sql.constants import (
    ONE_ROW,
    VALUES_ALIAS,
    values_columns,
    values_rows,
    with_one_row,
    without_rowless_subqueries,
)
from ivm.sql.domain import DOMAIN_ALIAS, by_domain
from ivm.sql.limits import LIMITED, ranked_limits
from ivm.sql.lower_reduce import Ranked, ReduceLowering, rank_bound
from ivm.sql.nest import NESTED, NestRefused, nest_join
from ivm.sql.parse import DIALECT, ParsedView, position
from ivm.sql.scope import (
    HIDDEN_PREFIX,
    RESERVED_PREFIX,
    CatalogEntry,
    Relation,
    Scope,
    is_aggregate,
    split_conjuncts,
)
from ivm.sql.subqueries import (
    GROUPED,
    JOINED,
    ONE,
    SUBQUERY_JOIN,
    SubqueryRefused,
    anti_bounded,
    bounded_exists,
    correlated_not_in,
    decorrelate,
    decorrelate_select_list,
    lift_having,
    nested_semis,
    outer_reads,
    refuse_outer_values,
    scalar_operand,
    select_subqueries,
    semi_operand,
    shadowed,
    subquery_predicate,
    tests_joined,
    uncorrelated_exists,
    wrap_join,
    wrap_subquery_join,
)
from ivm.sql.windows import WindowRefused, lift_grouped, placed, window_calls

_SortKey = Callable[[exp.Expression], exp.Expression]
"""Rewrites an ORDER BY expression over the FROM scope into one over a SELECT's input."""

RESERVED_COLUMNS = ("_time", "_diff")
"""Column names the engine uses for the time and diff of every update."""

# Clauses of a SELECT that this release does not maintain, with the name the user knows them by.
_UNSUPPORTED_CLAUSES = {
    "laterals": "LATERAL VIEW",
    "windows": "WINDOW clause",
    "pivots": "PIVOT",
    "sample": "TABLESAMPLE",
    "connect": "CONNECT BY",
    "distribute": "DISTRIBUTE BY",
    "cluster": "CLUSTER BY",
    "sort": "SORT BY",
}


def _arg(node: exp.Expression, key: str) -> object:
    """Argument ``key`` of ``node`` (sqlglot spells some with a trailing ``_``: ``with_``)."""
    return node.args.get(key) or node.args.get(key + "_")


class _Lowerer(ReduceLowering):
    """Lowers one view: queries, SELECT, FROM items, joins and subquery predicates."""

    def __init__(
        self,
        view: ParsedView,
        catalog: Mapping[str, CatalogEntry],
        internal: dict[str, InternalView],
        names_in_use: Collection[str] = (),
    ) -> None:
        super().__init__(view, catalog)
        self._items: list[exp.Expression] = []  # the FROM items of the join being lowered
        self._cte_queries: dict[str, exp.Expression] = {}  # every CTE's query, by name
        self.internal = internal
        self.names_in_use = set(names_in_use)
        self._subqueries = 0  # subqueries made joins so far (numbers their aliases)
        self._nested = 0  # joins nested into derived tables so far (numbers their aliases)

    # -- queries ---------------------------------------------------------------------------

    def query(
        self, q: exp.Expression, ctes: Mapping[str, Node], *, need_names: bool = True
    ) -> Node:
        """Lower a query. ``need_names=False`` for UNION branches after the first, whose
        column names SQL ignores (the first branch names the columns)."""
        if _has_joins(q):
            return self.parenthesized(q, ctes)
        with_ = _arg(q, "with")
        if isinstance(with_, exp.With):
            if with_.args.get("recursive"):
                raise self.unsupported("WITH RECURSIVE", with_)
            scope = dict(ctes)
            for cte in with_.expressions:
                scope[cte.alias_or_name.lower()] = self.query(cte.this, scope)
                self._cte_queries[cte.alias_or_name.lower()] = cte.this
            ctes = scope
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes, need_names=need_names)
        if isinstance(q, (exp.Union, exp.Intersect, exp.Except)):
            if q.args.get("by_name"):
                raise self.unsupported(f"{q.key.upper()} BY NAME", q.expression)
            if isinstance(q, exp.Union):
                node: Node = self.union_all(q, ctes, need_names=need_names)
                if q.args.get("distinct"):
                    node = self.distinct(node)
            else:
                left = self.plain(self.query(q.this, ctes, need_names=need_names))
                right = self.plain(self.query(q.expression, ctes, need_names=False))
                node = self.set_operation(q, left, right)
            return self.order_limit(q, node, None)
        if isinstance(q, exp.Select):
            return self.select(q, ctes, need_names=need_names)
        if isinstance(q, exp.Values):  # a query of its own: its rows
            return self.select(exp.select("*").from_(q.copy()), ctes, need_names=need_names)
        raise self.unsupported(type(q).__name__.upper(), q)

    def union_all(self, q: exp.Union, ctes: Mapping[str, Node], *, need_names: bool = True) -> Node:
        """``a UNION ALL b ...``: one UnionAll, the branches' columns renamed by position."""
        branches: list[Node] = []
        for i, side in enumerate((q.this, q.expression)):
            node = self.plain(self.query(side, ctes, need_names=need_names and i == 0))
            if isinstance(node, UnionAll) and not isinstance(side, exp.Subquery):
                branches.extend(node.branches)
            else:
                branches.append(node)
        names = branches[0].columns
        aligned = [branches[0]]
        for b in branches[1:]:
            if len(b.columns) != len(names):
                raise self.error(
                    f"UNION ALL branches have {len(names)} and {len(b.columns)} columns",
                    q.expression,
                )
            if b.columns != names:
                b = Project(
                    b, tuple((n, exp.column(c)) for n, c in zip(names, b.columns, strict=False))
                )
            aligned.append(b)
        return UnionAll(tuple(aligned))

    def select(self, s: exp.Select, ctes: Mapping[str, Node], *, need_names: bool = True) -> Node:
        """A SELECT: FROM and WHERE, the SELECT list (grouped or not), ``ROW_NUMBER()`` and
        QUALIFY, DISTINCT, then ``ORDER BY ... LIMIT``."""
        for key, construct in _UNSUPPORTED_CLAUSES.items():
            value = _arg(s, key)
            if value:
                at = value[0] if isinstance(value, list) else value
                raise self.unsupported(construct, self._located(at, s))
        s = self._limits_ranked(s, ctes)
        reads = outer_reads(self._inner_columns(ctes))
        for lift in (lift_having, partial(lift_grouped, outer_reads=reads)):  # groups derived
            try:
                lifted = lift(s)
            except (SubqueryRefused, WindowRefused) as e:
                raise self.unsupported(e.construct, e.at) from None
            if lifted is not None:
                return self.select(lifted, ctes, need_names=need_names)
        s = self._by_domain(s, ctes)
        s = self._decorrelated(s, ctes)
        s = self._select_list_decorrelated(s, ctes)
        s = self._anti_wrapped(s, ctes)
        s = self._anti_bounded(s, ctes)
        s = self._outer_nested(s, ctes)
        node, scope = self.from_where(s, ctes)
        windows = [i for i in s.expressions if isinstance(_unalias(i), exp.Window)]
        general = self._general_windows(s, windows)
        if general:  # every window call a column of a Window node (ivm.sql.windows)
            windows = []
        node, outputs, sort_key = self.select_list(
            s, node, scope, windows, need_names=need_names, general=general
        )
        if not need_names:  # positional branch: any unique names do
            outputs = [(f"_c{i}", e) for i, (_, e) in enumerate(outputs)]
        self._check_output_names(s, scope, windows, outputs)
        visible = tuple(n for n, _ in outputs)
        result: Node | Ranked = Project(node, tuple(outputs))
        if not general:
            result = self.ranking(s, result, scope, windows, visible)
        if isinstance(result, Ranked):
            return result
        if _arg(s, "distinct"):
            if isinstance(_arg(s, "distinct"), exp.Distinct) and _arg(s, "distinct").args.get("on"):
                raise self.unsupported("DISTINCT ON", s)
            result = self.distinct(result)
            sort_key = None
        return self.order_limit(s, result, sort_key)

    def from_where(self, s: exp.Select, ctes: Mapping[str, Node]) -> tuple[Node, Scope]:
        """The plan of a SELECT's FROM clause and WHERE, and the scope its SELECT list sees:
        a join takes WHERE into its conditions, one FROM item is filtered by it."""
        from_ = _arg(s, "from")
        assert isinstance(from_, exp.From), "every SELECT reads a FROM (with_one_row)"
        first, joins = _unfolded(from_.this, list(_arg(s, "joins") or []))
        scope, joins = self.from_items(first, joins, ctes)
        where = _arg(s, "where")
        where = where if isinstance(where, exp.Where) else None
        if scope.joined:
            return self.join(scope, joins, where, first), scope
        return self.filtered(scope.relations[0], where, ctes)

    def filtered(
        self, rel: Relation, where: exp.Where | None, ctes: Mapping[str, Node]
    ) -> tuple[Node, Scope]:
        """One FROM item filtered by WHERE, and its scope: a ranking's bound makes it a TopK,
        one ``EXISTS``/``IN`` subquery a semi-join, the other conjuncts a Filter."""
        node = rel.node
        conjuncts = split_conjuncts(where.this) if where is not None else []
        if isinstance(node, Ranked):
            node, conjuncts = self.rank_filter(node, conjuncts)
            rel = Relation(node, rel.qualifiers, rel.label)
        scope = Scope((rel,))
        if not conjuncts:
            return node, scope
        subqueries = [c for c in conjuncts if subquery_predicate(c) is not None]
        plain = [c for c in conjuncts if subquery_predicate(c) is None]
        if len(subqueries) > 1:
            raise self.unsupported("more than one EXISTS/IN subquery in WHERE", subqueries[1])
        if subqueries:
            predicate = self._subquery_join_wrapped(subqueries[0], ctes)
            return self.semi_join(rel, predicate, plain, ctes), scope
        return Filter(node, self.expression(exp.and_(*conjuncts), scope, "WHERE")), scope

    def _subquery_join_wrapped(
        self, predicate: exp.Expression, ctes: Mapping[str, Node]
    ) -> exp.Expression:
        """``[NOT] EXISTS``/``[NOT] IN`` whose subquery joins, with the join made one FROM
        item (:meth:`_one_item`): the semi-join reads it as an internal view. ``predicate``
        itself when its subquery does not join."""
        _, query, _ = subquery_predicate(predicate)
        q = query.this if isinstance(query, exp.Subquery) else query
        if not isinstance(q, exp.Select) or not _arg(q, "joins"):
            return predicate
        out = predicate.copy()
        _, inner, _ = subquery_predicate(out)
        (inner.this if isinstance(inner, exp.Subquery) else inner).replace(self._one_item(q, ctes))
        return out

    def _one_item(self, q: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """Subquery ``q``, which joins, reading its join as one FROM item
        (:func:`ivm.sql.subqueries.wrap_subquery_join`)."""
        from_ = _arg(q, "from")
        assert isinstance(from_, exp.From)  # a SELECT with joins has a FROM
        first, joins = _unfolded(from_.this, list(_arg(q, "joins")))
        labels, subqueries = self._labels, self._subqueries  # a probe, as in _outer_nested
        scope, _ = self.from_items(first, joins, ctes)
        self._labels, self._subqueries = labels, subqueries
        relations = [(r.alias, r.qualifiers, r.node.columns) for r in scope.relations]
        visible = scope.visible or [
            (i, c) for i, r in enumerate(scope.relations) for c in r.node.columns
        ]
        return wrap_subquery_join(q, relations, visible, self._inner_columns(ctes))

    def select_list(
        self,
        s: exp.Select,
        node: Node,
        scope: Scope,
        windows: list[exp.Expression],
        *,
        need_names: bool,
        general: bool = False,
    ) -> tuple[Node, list[tuple[str, exp.Expression]], _SortKey | None]:
        """The SELECT list's ``(name, expression)`` outputs (window items left out, unless
        ``general``: then every window call is a column of a Window over ``node``) and the
        node they read: ``node``, or a grouped query's reduce over it; with how an ORDER BY
        expression becomes one over that node."""
        aggregated = bool(_arg(s, "group") or _arg(s, "having")) or any(
            is_aggregate(n)
            for i in s.expressions
            for n in i.walk(prune=lambda n: isinstance(n, (exp.Window, exp.Subquery)))
        )
        if aggregated:
            calls = window_calls(s)
            if calls:
                raise self.unsupported("a window function in a grouped query", calls[0])
            grouped, sort_key = self.grouped(s, node, scope, need_names=need_names)
            return grouped.input, list(grouped.outputs), sort_key
        outputs: list[tuple[str, exp.Expression]] = []
        item_over: Callable[[exp.Expression], exp.Expression] = lambda item: item  # noqa: E731
        window_columns: frozenset[str] = frozenset()
        if general:
            node, item_over, window_columns = self.window_node(s, node, scope)
        for item in s.expressions:
            if item in windows:
                continue
            outputs.extend(
                self.select_item(
                    item_over(item), scope, need_names=need_names, placed=window_columns
                )
            )
        return node, outputs, lambda e: self.expression(e, scope, "ORDER BY")

    def _general_windows(self, s: exp.Select, windows: list[exp.Expression]) -> bool:
        """Whether the SELECT's window calls are a Window's (:mod:`ivm.sql.windows`): any
        but one ``ROW_NUMBER()`` that is a SELECT item or inside QUALIFY, bounded there if
        QUALIFY is present (a ranking: a TopK once bounded, :meth:`ranking`)."""
        calls = window_calls(s)
        if not calls:
            return False
        (call, *more) = calls
        if more or not isinstance(call.this, exp.RowNumber) or call.args.get("spec"):
            return True
        qualify = _arg(s, "qualify")
        if qualify is None:
            return not windows
        rank = windows[0].alias.lower() if windows and isinstance(windows[0], exp.Alias) else None
        condition = qualify.this
        if not windows:
            rank = "_rank"
            condition = placed(condition, [rank])
        conjuncts = split_conjuncts(condition)
        return rank is None or len(conjuncts) != 1 or rank_bound(conjuncts[0], rank) is None

    def _check_output_names(
        self,
        s: exp.Select,
        scope: Scope,
        windows: list[exp.Expression],
        outputs: list[tuple[str, exp.Expression]],
    ) -> None:
        """Refuse an output column named like the engine's columns, or named twice."""
        seen: dict[str, exp.Expression] = {}
        items = [i for i in self._items_for(s, scope) if i not in windows]
        for (name, _), item in zip(outputs, items, strict=False):
            if name in RESERVED_COLUMNS or name.startswith(RESERVED_PREFIX):
                raise self.error(
                    f"column name {name!r} is reserved for the engine's updates (_time, _diff "
                    f"and names starting {RESERVED_PREFIX}); rename it",
                    item,
                )
            if name in seen:
                raise self.error(
                    f"duplicate output column {name!r}: give one of them another alias", item
                )
            seen[name] = item

    def ranking(
        self,
        s: exp.Select,
        result: Project,
        scope: Scope,
        windows: list[exp.Expression],
        visible: tuple[str, ...],
    ) -> Node | Ranked:
        """``result`` ranked by the SELECT list's ``ROW_NUMBER() OVER (...) AS rank`` or by
        one inside QUALIFY: bounded by QUALIFY, a TopK; else a :class:`Ranked` left for the
        enclosing query to bound. ``result`` as it is when the query ranks nothing."""
        qualify = _arg(s, "qualify")
        inline = qualify.find(exp.Window) if qualify is not None and not windows else None
        if not windows and inline is None:
            if qualify is not None:
                raise self.unsupported("QUALIFY without ROW_NUMBER()", qualify)
            return result
        if len(windows) > 1:
            raise self.unsupported("more than one window function", windows[1])
        window = _unalias(windows[0]) if windows else inline
        rank = "_rank"
        if windows and isinstance(windows[0], exp.Alias):
            rank = windows[0].alias.lower()
        elif windows:
            raise self.error("ROW_NUMBER() needs a name: add AS rn", windows[0])
        proj, partition, order = self.ranked(window, result, scope)
        ranked = Ranked(proj, partition, order, rank, visible, window)
        if qualify is None:
            if _arg(s, "distinct") or _arg(s, "limit"):
                raise self.unsupported("DISTINCT or LIMIT with ROW_NUMBER()", s)
            return ranked
        condition = qualify.this
        if inline is not None:
            # a copy (the parsed view stays as written); the window is found by its structure
            condition = condition.transform(lambda n: exp.column(rank) if n == inline else n)
        bounded, rest = self.rank_filter(ranked, split_conjuncts(condition))
        if rest:
            raise self.unsupported("QUALIFY conditions other than the rank bound", rest[0])
        if not windows:
            bounded = Project(bounded, tuple((c, exp.column(c)) for c in visible))
        return bounded

    def _join_name(self, join: exp.Join) -> str:
        """How the user wrote a join: ``LEFT JOIN``, ``CROSS JOIN``, ``JOIN (FROM a, b)``..."""
        words = [str(join.args.get(k) or "").upper() for k in ("side", "kind")]
        name = " ".join(w for w in words if w) + " JOIN"
        start = next(
            (n.meta["start"] for n in join.this.walk() if isinstance(n.meta.get("start"), int)),
            None,
        )
        if start is not None and self.sql[:start].rstrip().endswith(","):
            return "JOIN (FROM a, b)"
        return name.strip()

    def _items_for(self, s: exp.Select, scope: Scope) -> list[exp.Expression]:
        """The SELECT item behind each output column (a ``*`` once per column it gives)."""
        out: list[exp.Expression] = []
        for item in s.expressions:
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                qualifier = (
                    item.table.lower() if isinstance(item, exp.Column) and item.table else None
                )
                out.extend([item] * len(scope.star(qualifier) or []))
            else:
                out.append(item)
        return out

    def _by_domain(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with each subquery correlated other than by equalities made correlated by
        equalities with the domain of the outer values it reads (:mod:`ivm.sql.domain`); a
        scalar subquery whose SELECT list reads the outer row refused by name."""
        try:
            refuse_outer_values(s, self._inner_columns(ctes))
            return by_domain(s, self._inner_columns(ctes), partial(self._one_item, ctes=ctes))
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None

    def _decorrelated(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with its WHERE's comparisons against scalar subqueries made joins
        (:mod:`ivm.sql.subqueries`); ``s`` itself when it has none."""
        where = s.args.get("where")
        conjuncts = split_conjuncts(where.this) if isinstance(where, exp.Where) else []
        predicates = [c for c in conjuncts if subquery_predicate(c) is not None]
        scalars = any(scalar_operand(c) is not None for c in conjuncts)
        # One EXISTS/IN over one FROM item is a SemiJoin (:meth:`filtered`); in a join (a
        # scalar subquery makes one), or beside other subquery predicates, the positive ones
        # become joins too.
        semi_joins = (
            bool(_arg(s, "joins"))
            or len(predicates) > 1
            or scalars
            or any(uncorrelated_exists(c, self._inner_columns(ctes)) for c in predicates)
            or any(
                not isinstance(c, exp.Not) and bounded_exists(c, self._inner_columns(ctes))
                for c in predicates
            )
        )
        nested = any(nested_semis(c) for c in conjuncts)
        if (
            not scalars
            and not nested
            and not (semi_joins and any(semi_operand(c) is not None for c in conjuncts))
        ):
            return s

        first = self._subqueries + 1
        try:
            out, added = decorrelate(
                s, conjuncts, self._inner_columns(ctes), first, semi_joins=semi_joins
            )
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None
        self._subqueries += added
        return out

    def _inner_columns(
        self, ctes: Mapping[str, Node]
    ) -> Callable[[exp.Select], tuple[set[str], set[str]]]:
        """A subquery's FROM items -> their qualifiers and column names (for
        :mod:`ivm.sql.subqueries`, which tells a subquery's own columns from the outer's)."""

        def inner_columns(q: exp.Select) -> tuple[set[str], set[str]]:
            from_ = _arg(q, "from")
            assert isinstance(from_, exp.From), "every SELECT reads a FROM (with_one_row)"
            items = [from_.this, *(j.this for j in q.args.get("joins") or [])]
            rels = [self.relation(i, ctes) for i in items]
            qualifiers = {x for r in rels for x in r.qualifiers}
            return qualifiers, {c for r in rels for c in r.node.columns}

        return inner_columns

    def _limits_ranked(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with its subqueries' ``ORDER BY ... LIMIT`` made per-key rankings
        (:func:`ivm.sql.limits.ranked_limits`); ``s`` itself without any."""
        try:
            out, added = ranked_limits(s, self._inner_columns(ctes), self._subqueries + 1)
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None
        self._subqueries += added
        return out

    def _select_list_decorrelated(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with its SELECT list's scalar subqueries made LEFT JOINs
        (:func:`ivm.sql.subqueries.decorrelate_select_list`); ``s`` itself without any."""
        if not select_subqueries(s):
            return s
        first = self._subqueries + 1
        try:
            out, added = decorrelate_select_list(s, self._inner_columns(ctes), first)
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None
        self._subqueries += added
        return out

    def _anti_wrapped(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with a join filtered by ``NOT EXISTS``/``NOT IN`` made one FROM item
        (:func:`ivm.sql.subqueries.wrap_join`), so the anti-join filters it as it filters a
        table; a correlated NOT IN, or several, made LEFT JOINs first (one NOT IN may
        remain); ``s`` itself otherwise."""
        where = s.args.get("where")
        if not isinstance(where, exp.Where):
            return s
        conjuncts = split_conjuncts(where.this)
        inner_columns = self._inner_columns(ctes)
        try:
            # a correlated NOT IN: LEFT JOINs (tests_joined); so is every NOT EXISTS and NOT IN
            # of several, or an uncorrelated NOT EXISTS, but one NOT IN (the anti-join's)
            targets = [c for c in conjuncts if correlated_not_in(c, inner_columns)]
            anti = [c for c in conjuncts if _anti(c) and not any(c is t for t in targets)]
            if len(anti) > 1 or any(uncorrelated_exists(c, inner_columns) for c in anti):
                not_in = [c for c in anti if subquery_predicate(c)[0] == "NOT IN"]
                targets += [c for c in anti if len(not_in) > 1 or not any(c is n for n in not_in)]
                anti = not_in if len(not_in) == 1 else []
            if targets:
                first = self._subqueries + 1
                s, added = tests_joined(s, conjuncts, targets, inner_columns, first)
                self._subqueries += added
                conjuncts = split_conjuncts(s.args["where"].this)
                anti = [c for c in conjuncts if _anti(c)]  # what was left, as rewritten
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None
        if not anti or not _arg(s, "joins"):  # one FROM item: a semi-join filters it
            return s
        from_ = _arg(s, "from")
        assert isinstance(from_, exp.From)  # a SELECT with joins has a FROM
        first, joins = _unfolded(from_.this, list(_arg(s, "joins") or []))
        scope, _ = self.from_items(first, joins, ctes)
        relations = [(r.alias, r.qualifiers, r.node.columns) for r in scope.relations]
        visible = scope.visible or [
            (i, c) for i, r in enumerate(scope.relations) for c in r.node.columns
        ]
        kept = [c for c in conjuncts if c is not anti[0]]
        return wrap_join(s, relations, visible, kept, anti[0], inner_columns)

    def _outer_nested(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` with the inputs before an outer join of more than two inputs, or before an
        inner join of an outer join's result, moved into a derived table (an internal view;
        :func:`ivm.sql.nest.nest_join`), until every join is one :meth:`join` maintains."""
        while _arg(s, "joins"):
            from_ = _arg(s, "from")
            assert isinstance(from_, exp.From)  # a SELECT with joins has a FROM
            first, joins = _unfolded(from_.this, list(_arg(s, "joins") or []))
            # a probe: the labels and aliases it draws are drawn again when s is lowered
            labels, subqueries = self._labels, self._subqueries
            scope, joins = self.from_items(first, joins, ctes)
            cut = self._nest_at(scope, joins)
            self._labels, self._subqueries = labels, subqueries
            if cut is None:
                return s
            relations = [(r.alias, r.qualifiers, r.node.columns) for r in scope.relations]
            visible = scope.visible or [
                (i, c) for i, r in enumerate(scope.relations) for c in r.node.columns
            ]
            self._nested += 1
            try:
                s = nest_join(s, first, joins, relations, visible, cut, f"{NESTED}{self._nested}")
            except NestRefused as e:
                raise self.error(e.message, e.at) from None
        return s

    def _nest_at(self, scope: Scope, joins: list[exp.Join]) -> int | None:
        """The first input whose join :meth:`join` cannot fold into the inputs before it: a
        keyed outer join after two inputs or more, or a keyed inner join of an outer join's
        result; None if there is none. (A join whose condition is never true pads or
        empties any number of inputs.)"""
        outer = False
        for i, j in enumerate(joins, 1):
            side = str(j.args.get("side") or "").upper()
            never = any(t in ("false", "null") for _, _, t in self._on_conjuncts(scope, j, i))
            if not never and ((side and i >= 2) or (not side and outer)):
                return i
            outer = outer or bool(side)
        return None

    def _anti_bounded(self, s: exp.Select, ctes: Mapping[str, Node]) -> exp.Select:
        """``s`` (one FROM item) with each NOT EXISTS correlated by a comparison other than
        equality made a LEFT JOIN (:func:`ivm.sql.subqueries.anti_bounded`)."""
        where = s.args.get("where")
        if _arg(s, "joins") or not isinstance(where, exp.Where):
            return s
        conjuncts = split_conjuncts(where.this)
        inner_columns = self._inner_columns(ctes)
        if not any(isinstance(c, exp.Not) and bounded_exists(c, inner_columns) for c in conjuncts):
            return s
        try:
            out, added = anti_bounded(s, conjuncts, inner_columns, self._subqueries + 1)
        except SubqueryRefused as e:
            raise self.unsupported(e.construct, e.at) from None
        self._subqueries += added
        return out

    def check_join_kind(self, j: exp.Join) -> None:
        """Inner joins (``JOIN ... ON``, ``FROM a, b``, ``CROSS JOIN``) and LEFT/RIGHT/FULL
        OUTER JOIN; which combinations are maintained is :meth:`join`'s part."""
        side = str(j.args.get("side") or "").upper()
        kind = str(j.args.get("kind") or "").upper()
        if side and kind not in ("", "OUTER"):
            raise self.unsupported(self._join_name(j), self._located(j.this, j))
        if not side and kind not in ("", "INNER", "CROSS"):
            raise self.unsupported(self._join_name(j), self._located(j.this, j))
        method = str(j.args.get("method") or "").upper()
        if method and method != "NATURAL":
            raise self.unsupported(f"{method} JOIN", self._located(j.this, j))

    def from_items(
        self, first: exp.Expression, joins: list[exp.Join], ctes: Mapping[str, Node]
    ) -> tuple[Scope, list[exp.Join]]:
        """The relations of a FROM clause (its first item, then each join's), each with a
        qualifier of its own: unaliased subqueries are ``_subquery``, ``_subquery2``...; and
        the joins, ``USING``/``NATURAL`` ones as their ``ON`` equalities (:meth:`_using`)."""
        relations = [self.relation(first, ctes)]
        for j in joins:
            self.check_join_kind(j)
            relations.append(self.relation(j.this, ctes))
        auto = 0
        for i, r in enumerate(relations):
            if r.qualifiers == {"_subquery"}:
                auto += 1
                if auto > 1:
                    relations[i] = replace(r, qualifiers=frozenset({f"_subquery{auto}"}))
        names = [q for r in relations for q in r.qualifiers]
        if len(set(names)) != len(names):
            dup = next(q for q in names if names.count(q) > 1)
            raise self.error(
                f"{dup!r} names two FROM items: give each an alias (e.g. {dup} AS {dup}1)", first
            )
        if len(relations) > 1 and any(isinstance(r.node, Ranked) for r in relations):
            raise self.unsupported(
                "a ROW_NUMBER() subquery in a join (define the ranking as a view)", first
            )
        if not any(j.args.get("using") or j.args.get("method") for j in joins):
            return Scope(tuple(relations)), joins
        return self._using(tuple(relations), joins)

    def _using(
        self, relations: tuple[Relation, ...], joins: list[exp.Join]
    ) -> tuple[Scope, list[exp.Join]]:
        """``JOIN ... USING (k)`` and ``NATURAL JOIN`` (USING the columns both sides have)
        as ``ON left.k = right.k``, and the columns the FROM clause then shows, as Spark
        does: the USING columns once (the left side's, a RIGHT JOIN's the right's), then the
        left side's others, then the right side's; an unqualified ``k`` is that column."""
        visible = [(0, c) for c in relations[0].node.columns]
        out = []
        for i, j in enumerate(joins, 1):
            right = relations[i]
            if j.args.get("method"):  # NATURAL: in the left side's order
                names = [c for _, c in visible if c in right.node.columns]
            elif j.args.get("using"):
                names = [u.name.lower() for u in j.args["using"]]
            else:
                visible += [(i, c) for c in right.node.columns]
                out.append(j)
                continue
            side = str(j.args.get("side") or "").upper()
            if side == "FULL":
                raise self.unsupported(
                    "FULL JOIN ... USING (write ON a.k = b.k and coalesce(a.k, b.k))",
                    self._located(j.this, j),
                )
            conditions = []
            for name in names:
                left = [k for k, c in visible if c == name]
                if len(left) != 1 or name not in right.node.columns:
                    where = "the left side" if len(left) != 1 else right.label
                    raise self.error(
                        f"USING column {name!r} is {'ambiguous in' if left else 'not in'} {where}",
                        self._located(j.this, j),
                    )
                conditions.append(
                    exp.EQ(
                        this=exp.column(name, table=relations[left[0]].alias),
                        expression=exp.column(name, table=right.alias),
                    )
                )
            left_of = dict((c, k) for k, c in reversed(visible))
            keys = [(i if side == "RIGHT" else left_of[c], c) for c in names]
            visible = (
                keys
                + [(k, c) for k, c in visible if c not in names]
                + [(i, c) for c in right.node.columns if c not in names]
            )
            rewritten = j.copy()
            rewritten.set("using", None)
            rewritten.set("method", None)
            rewritten.set("on", exp.and_(*conditions) if conditions else exp.true())
            out.append(rewritten)
        return Scope(relations, tuple(visible)), out

    def parenthesized(self, item: exp.Expression, ctes: Mapping[str, Node]) -> Node:
        """A parenthesized join that has an alias, ``(a JOIN b ON ...) AS t``: the join's
        columns under their own names, as ``SELECT *`` over it gives them."""
        first, joins = _unfolded(item, [])
        scope, joins = self.from_items(first, joins, ctes)
        node = self.join(scope, joins, None, first)
        outputs = [(name, exp.column(plan)) for name, plan in scope.star(None) or []]
        names = [n for n, _ in outputs]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            owners = ", ".join(r.alias for r in scope.relations if dup in r.node.columns)
            raise self.error(
                f"the parenthesized join has two columns named {dup!r} (of {owners}): select "
                "them under other names in a subquery",
                item,
            )
        return Project(node, tuple(outputs))

    def join(
        self,
        scope: Scope,
        joins: list[exp.Join],
        where: exp.Where | None,
        first: exp.Expression,
    ) -> Node:
        """The joins of a FROM clause (``first``, its first item), left to right (SQL's
        order), and its WHERE.

        Inner joins of any number of inputs are one :class:`Join` (:meth:`keyed_join`): the
        conjuncts of ON and WHERE become input filters, key equivalences or residuals. An
        outer join of two inputs is one too. A constant condition is decided here: a
        conjunct that is always true is dropped (a join left with no key is a cross join,
        refused by name); one that is never true (``false``, ``1 = 0``, ``CAST(NULL AS
        BOOLEAN)``) makes an inner join empty and an outer join its preserved sides padded
        with NULLs, so the inputs it never matches are read for their column types only
        (``Filter FALSE``: no row, no arrangement) and the result is a ``UnionAll`` of the
        preserved inputs' rows and those empty branches (UNION ALL's typing then gives every
        column its input's type, as the join would). Each branch is a stateless map of its
        input's updates, so the result is maintained update by update.
        """
        self._items = [first, *(j.this for j in joins)]  # where each input is written
        on = [[], *(self._on_conjuncts(scope, j, i) for i, j in enumerate(joins, 1))]
        fold = _Fold()
        sides = [str(j.args.get("side") or "").upper() for j in joins]
        if where is not None and any(sides):  # an outer join: WHERE filters its result
            fold.where = [self.expression(c, scope, "WHERE") for c in split_conjuncts(where.this)]
            if sides in (["LEFT"], ["RIGHT"]):
                fold.preserved = 0 if sides == ["LEFT"] else 1
        for i in range(1, len(scope.relations)):
            self._fold_in(scope, fold, i, joins[i - 1], on[i])
        if fold.built is None:  # inner joins only: WHERE is part of the join
            if where is not None:
                self._pool_where(scope, fold, where)
            return self._pool(scope, fold.members, fold.pool, fold.empty, joins[-1])
        if fold.where:
            # WHERE filters the outer join's result (padded NULLs included); what reads only
            # a LEFT/RIGHT join's preserved input filtered that input (_fold_in)
            return Filter(fold.built, exp.and_(*fold.where))
        return fold.built

    def _on_conjuncts(self, scope: Scope, j: exp.Join, i: int) -> list[_Conjunct]:
        """The conjuncts of ``j``'s ON (joining relation ``i``), resolved, each with its
        constant value if it has one; ``ON NULL`` is refused (Spark rejects its type), and so
        is a conjunct reading a relation joined after ``i`` (Spark cannot resolve it)."""
        cond = j.args.get("on")
        bare = cond
        while isinstance(bare, exp.Paren):
            bare = bare.this
        if isinstance(bare, exp.Null):
            raise self.error(
                f"{self._join_name(j)} ... ON NULL: the condition has type VOID, not "
                "BOOLEAN, and Spark rejects it (write ON false, or CAST(NULL AS BOOLEAN))",
                self._located(cond, j),
                construct="join condition",
            )
        items = []
        for original in split_conjuncts(cond) if cond is not None else []:
            resolved = self.expression(original, scope, "ON")
            owners = {scope.owner(n) for n in referenced_columns(resolved)}
            later = [o for o in owners if isinstance(o, int) and o > i]
            if later:
                rel = scope.relations[min(later)]
                raise self.error(
                    f"condition {original.sql(dialect='spark')!r} reads {rel.alias} "
                    f"({rel.label}), which is joined after it",
                    original,
                )
            items.append((original, resolved, _truth(resolved)))
        return items

    def _fold_in(self, scope: Scope, fold: _Fold, i: int, j: exp.Join, on: list[_Conjunct]) -> None:
        """Join relation ``i`` (by ``j``, on the conjuncts ``on``) to what ``fold`` holds: an
        inner join joins the pool while no outer join is built; an outer join whose
        condition is never true pads; a keyed outer join must be the only join (a SELECT's
        joins are nested so that it is: :meth:`_outer_nested`)."""
        side = str(j.args.get("side") or "").upper()
        never = any(t in ("false", "null") for _, _, t in on)
        live = [(o, c) for o, c, t in on if t != "true"]
        if not side and fold.built is None:
            fold.members.append(i)
            fold.pool.extend(live)
            fold.empty = fold.empty or never
            return
        if not side:  # an inner join of an outer join's result
            if never:
                fold.built = self.no_rows(scope, [*fold.members, i])
                fold.members.append(i)
                return
            if fold.keyed_outer is not None:
                raise self._outer_with_more(fold.keyed_outer)
            raise self.unsupported(
                f"{self._join_name(j)} of an outer join's result in an aliased parenthesized "
                "join (write the joins without the parentheses)",
                self._located(j.this, j),
            )
        if never:
            if fold.built is None:
                fold.built = self._pool(scope, fold.members, fold.pool, fold.empty, j)
            fold.built = self.padded(scope, fold.built, fold.members, i, side)
            fold.members.append(i)
            return
        if fold.built is not None or len(fold.members) > 1 or fold.empty:
            raise self._outer_with_more(fold.keyed_outer or j)
        preserve = {"LEFT": (0,), "RIGHT": (1,), "FULL": (0, 1)}[side]
        # WHERE's conjuncts reading only the preserved input filter it (they commute: its
        # rows are never padded); the rest filter the result
        first = [c for c in fold.where if _owners(scope, c) == {fold.preserved}]
        fold.where = [c for c in fold.where if not any(c is f for f in first)]
        fold.built = self.keyed_join(scope, [0, i], live, preserve, j, first)
        fold.members.append(i)
        fold.keyed_outer = j

    def _pool_where(self, scope: Scope, fold: _Fold, where: exp.Where) -> None:
        """Add WHERE's conjuncts to an inner join's pool (one never true empties it)."""
        for original in split_conjuncts(where.this):
            resolved = self.expression(original, scope, "WHERE")
            truth = _truth(resolved)
            fold.empty = fold.empty or truth in ("false", "null")
            if truth != "true":
                fold.pool.append((original, resolved))

    def _pool(
        self,
        scope: Scope,
        members: list[int],
        conjuncts: list[tuple[exp.Expression, exp.Expression]],
        empty: bool,
        at: exp.Join,
    ) -> Node:
        """The inner join of ``members`` on ``conjuncts``; no row when one is never true."""
        if empty:
            return self.no_rows(scope, members)
        if len(members) == 1:
            return self._own(scope, members[0])
        return self.keyed_join(scope, members, conjuncts, (), at)

    def _outer_with_more(self, j: exp.Join) -> SqlError:
        """The error refusing outer join ``j`` in a join of more than two inputs (only an
        aliased parenthesized join is not nested)."""
        return self.unsupported(
            self._join_name(j)
            + " with more than two inputs in an aliased parenthesized join (write the joins "
            "without the parentheses)",
            self._located(j.this, j),
        )

    def _columns_of(self, scope: Scope, members: list[int]) -> tuple[str, ...]:
        """The plan names of the columns of relations ``members``, in order."""
        return tuple(scope.internal(m, c) for m in members for c in scope.relations[m].node.columns)

    def _own(self, scope: Scope, m: int) -> Project:
        """Relation ``m``'s rows under their names in the join (``alias__column``)."""
        rel = scope.relations[m]
        return Project(
            rel.node, tuple((scope.internal(m, c), exp.column(c)) for c in rel.node.columns)
        )

    def no_rows(self, scope: Scope, members: list[int]) -> Node:
        """The columns of ``members`` joined, with no row: one empty branch per input (its
        column types, NULL elsewhere), so UNION ALL's typing gives each column its input's
        type."""
        names = self._columns_of(scope, members)
        return _union([self._empty(scope, m, names) for m in members])

    def _empty(self, scope: Scope, m: int, names: tuple[str, ...]) -> Node:
        """Relation ``m``'s columns (the others of ``names`` NULL), with no row: its inputs
        read through ``Filter FALSE``, so only their types reach the result."""
        rel = scope.relations[m]
        if not all(isinstance(n, (Get, Filter, Project, UnionAll)) for n in walk(rel.node)):
            raise self.unsupported(
                f"a join input that is itself a join or aggregate ({rel.label}) in a join "
                "whose condition is never true (define it as a view and join the view)",
                self._items[m],
            )
        columns = tuple((scope.internal(m, c), exp.column(c)) for c in rel.node.columns)
        return _widened(Project(_no_rows(rel.node), columns), names)

    def padded(self, scope: Scope, left: Node, members: list[int], i: int, side: str) -> Node:
        """``left`` (the join of ``members``) outer-joined with relation ``i`` on a condition
        that is never true: the preserved sides' rows padded with NULLs."""
        names = self._columns_of(scope, [*members, i])
        if side in ("LEFT", "FULL"):
            branches = [_widened(left, names)]
        else:
            branches = [self._empty(scope, m, names) for m in members]
        if side in ("RIGHT", "FULL"):
            branches.append(_widened(self._own(scope, i), names))
        else:
            branches.append(self._empty(scope, i, names))
        return _union(branches)

    def keyed_join(
        self,
        scope: Scope,
        members: list[int],
        conjuncts: list[tuple[exp.Expression, exp.Expression]],
        preserve: tuple[int, ...],
        at: exp.Join,
        filters: Sequence[exp.Expression] = (),
    ) -> Join:
        """A :class:`Join` of relations ``members`` (inner: any number, the first ones of
        the scope; outer: two) on ``conjuncts`` (``(as written, resolved)``): each becomes an
        input filter, a key equivalence or a residual, and every input must be connected by
        keys (``at``: where a missing key is reported). ``filters``: resolved conditions on
        one input each (an outer join's preserved input), its filters."""
        decomposed = {m: self.decompose(scope.relations[m]) for m in members}
        subs: dict[int, dict[str, exp.Expression]] = {}
        for m, (_, _, outmap) in decomposed.items():
            rel = scope.relations[m]
            subs[m] = {scope.internal(m, c): outmap[c] for c in rel.node.columns}
        pushed: dict[int, list[exp.Expression]] = {
            m: [p] if p is not None else [] for m, (_, p, _) in decomposed.items()
        }
        optional = set(range(len(members))) - set(preserve) if preserve else set()
        equalities, residual = self._place_conjuncts(
            scope, members, conjuncts, preserve, optional, pushed, subs
        )
        for f in filters:
            (m,) = _owners(scope, f)
            pushed[m].append(_substitute(f, subs[m]))
        keyed = self._one_key_per_input(
            _key_classes(equalities), members, pushed, subs, optional if preserve else None, at
        )
        classes = tuple(c for c, _ in keyed)
        null_safe = tuple(n for _, n in keyed) if any(n for _, n in keyed) else ()
        self._check_connected(scope, members, classes, at)
        inputs_ = []
        for m in members:
            get, _, outmap = decomposed[m]
            predicate = exp.and_(*pushed[m]) if pushed[m] else None
            rel = scope.relations[m]
            outputs = tuple((scope.internal(m, c), outmap[c]) for c in rel.node.columns)
            inputs_.append(JoinInput(get, rel.alias, predicate, outputs))
        return Join(tuple(inputs_), classes, tuple(residual), preserve, null_safe)

    def _place_conjuncts(
        self,
        scope: Scope,
        members: list[int],
        conjuncts: list[tuple[exp.Expression, exp.Expression]],
        preserve: tuple[int, ...],
        optional: set[int],
        pushed: dict[int, list[exp.Expression]],
        subs: dict[int, dict[str, exp.Expression]],
    ) -> tuple[list[_KeyEquality], list[exp.Expression]]:
        """Place each conjunct of a join: one reading a single input becomes that input's
        filter (appended to ``pushed``), an equality of two inputs' columns a key equality
        (``=``, or ``<=>``: NULL-safe), any other a residual. An outer join's ON may hold only key equalities and conditions
        on its ``optional`` side; a conjunct reading an input joined later is refused.

        Returns:
            the key equalities, as pairs of ``(input position, column)`` and whether NULL
            matches NULL, and the residuals.
        """
        index = {m: k for k, m in enumerate(members)}
        equalities: list[_KeyEquality] = []
        residual: list[exp.Expression] = []
        for original, c in conjuncts:
            owners = {scope.owner(n) for n in referenced_columns(c)}
            if owners - set(members):
                later = scope.relations[min(owners - set(members))]
                raise self.error(
                    f"condition {original.sql(dialect='spark')!r} reads {later.label}, which is "
                    "joined after it",
                    original,
                )
            key = (
                isinstance(c, (exp.EQ, exp.NullSafeEQ))
                and len(owners) == 2
                and isinstance(c.this, exp.Column)
                and isinstance(c.expression, exp.Column)
            )
            if preserve and not (
                (len(owners) == 1 and {index[o] for o in owners} <= optional) or key
            ):
                raise self.error(
                    f"outer join condition {original.sql(dialect='spark')!r} is not supported: "
                    "ON may hold key equalities and conditions on the optional side; put the "
                    "rest in WHERE",
                    original,
                    construct="outer join ON condition",
                )
            if len(owners) == 1:
                (o,) = owners
                pushed[o].append(_substitute(c, subs[o]))
            elif key:
                a, b = c.this.name, c.expression.name
                same = isinstance(c, exp.NullSafeEQ)
                equalities.append(((index[scope.owner(a)], a), (index[scope.owner(b)], b), same))
            else:
                residual.append(c)
        return equalities, residual

    def _check_connected(
        self,
        scope: Scope,
        members: list[int],
        classes: tuple[tuple[_KeyColumn, ...], ...],
        at: exp.Join,
    ) -> None:
        """Refuse a cross join: every input must be reached from the first through key
        equalities."""
        reached, frontier = {0}, [0]
        while frontier:
            k = frontier.pop()
            for cls in classes:
                inputs = {n for n, _ in cls}
                if k in inputs:
                    for n in inputs - reached:
                        reached.add(n)
                        frontier.append(n)
        missing = [scope.relations[m] for k, m in enumerate(members) if k not in reached]
        if missing:
            raise self.error(
                f"cross join: no equality links {missing[0].label} to the other inputs; add "
                "a condition like a.k = b.k (cross products are not maintained)",
                self._located(at.this, at),
                construct="cross join",
            )

    def _one_key_per_input(
        self,
        classes: Mapping[tuple[_KeyColumn, ...], bool],
        members: list[int],
        pushed: dict[int, list[exp.Expression]],
        subs: dict[int, dict[str, exp.Expression]],
        optional: set[int] | None,
        at: exp.Join,
    ) -> tuple[tuple[tuple[_KeyColumn, ...], bool], ...]:
        """Key classes holding one column per input, each with whether NULL matches NULL in
        it: where equalities put two columns of one input in a class (``a.x = b.y AND a.x =
        b.z``), ``b.y = b.z`` becomes a filter of that input (the join compares one key per
        input, and would drop it). On an outer join's preserved side that equality is part
        of the match, not a filter: refused. ``optional``: an outer join's optional inputs
        (None: an inner join)."""
        out = []
        for cls, null_safe in classes.items():
            by_input: dict[int, list[str]] = {}
            for k, column in cls:
                by_input.setdefault(k, []).append(column)
            for k, columns in by_input.items():
                if len(columns) < 2:
                    continue
                if optional is not None and k not in optional:
                    raise self.error(
                        "outer join condition equating two columns of its preserved side "
                        f"({', '.join(columns)}) through the other side is not supported",
                        self._located(at.this, at),
                        construct="outer join ON condition",
                    )
                m = members[k]
                equal = exp.NullSafeEQ if null_safe else exp.EQ
                for other in columns[1:]:
                    same = equal(this=exp.column(columns[0]), expression=exp.column(other))
                    pushed[m].append(_substitute(same, subs[m]))
            out.append(
                (tuple(sorted((k, columns[0]) for k, columns in by_input.items())), null_safe)
            )
        return tuple((c, n) for c, n in out if len(c) > 1)

    def semi_join(
        self,
        outer: Relation,
        predicate: exp.Expression,
        others: list[exp.Expression],
        ctes: Mapping[str, Node],
    ) -> Node:
        """``[NOT] EXISTS (SELECT ... FROM b WHERE b.k = a.k ...)`` or ``a.k IN (SELECT b.k ...)``.

        The subquery reads one collection; its WHERE may hold equalities with the outer row
        (the keys) and conditions on its own columns (its filter).
        """
        kind, query, probe = subquery_predicate(predicate)
        select, item = self._subquery_select(kind, query, predicate)
        inner = self.relation(item, ctes)
        if inner.qualifiers & outer.qualifiers:  # the inner name shadows the outer one
            alias = next(
                a for n in range(1, 100) if (a := f"{inner.alias}_in{n}") not in outer.qualifiers
            )
            select = shadowed(select, set(inner.qualifiers), alias)
            item = _arg(select, "from").this
            inner = self.relation(item, ctes)
        pair = Scope((outer, inner))
        keys, inner_filters = self._correlation(select, pair, kind)
        if probe is not None:
            keys.append(self._in_key(select, probe, pair, predicate))
        if not keys:
            raise self.unsupported(
                f"uncorrelated {kind} (it tests whether the subquery is empty at all)", predicate
            )
        mine, theirs = self._semi_inputs(pair, keys, others, inner_filters)
        plain_keys = tuple((a.split("__", 1)[1], b) for a, b in keys)
        if kind == "NOT IN":
            if len(plain_keys) != 1:
                raise self.unsupported(
                    "NOT IN over a correlated subquery (its NULL rules then depend on each "
                    "outer row; write NOT EXISTS)",
                    predicate,
                )
            return SemiJoin(mine, theirs, plain_keys, True, null_aware=True, label=self.label())
        return SemiJoin(mine, theirs, plain_keys, anti=kind == "NOT EXISTS")

    def _subquery_select(
        self, kind: str, query: exp.Expression, predicate: exp.Expression
    ) -> tuple[exp.Select, exp.Expression]:
        """The SELECT of an ``EXISTS``/``IN`` subquery and its one FROM item; refuses set
        operations, joins, grouping, limits and the clauses a SELECT may not have."""
        select = query
        while isinstance(select, exp.Subquery):
            select = select.this
        if not isinstance(select, exp.Select):
            raise self.unsupported(f"{kind} over a set operation", predicate)
        inner_clauses = {
            **_UNSUPPORTED_CLAUSES,
            "group": "GROUP BY",
            "having": "HAVING",
            "limit": "LIMIT",
            "offset": "OFFSET",
            "qualify": "QUALIFY",
        }  # DISTINCT is harmless: only whether a key occurs matters
        for key, construct in inner_clauses.items():
            value = _arg(select, key)
            if value:
                raise self.unsupported(f"{construct} inside {kind}", predicate)
        if _arg(select, "joins"):
            raise self.unsupported(f"a join inside {kind} (define it as a view)", predicate)
        from_ = _arg(select, "from")
        assert isinstance(from_, exp.From), "every SELECT reads a FROM (with_one_row)"
        return select, from_.this

    def _correlation(
        self, select: exp.Select, pair: Scope, kind: str
    ) -> tuple[list[tuple[str, str]], list[exp.Expression]]:
        """The subquery's WHERE split into key equalities with the outer row (``(outer
        column, inner column)`` plan names) and filters on its own columns; refuses the rest."""
        outer, inner = pair.relations
        conjuncts = []
        where = _arg(select, "where")
        if isinstance(where, exp.Where):
            conjuncts = [_qualified(c, outer, inner) for c in split_conjuncts(where.this)]
        keys: list[tuple[str, str]] = []
        inner_filters: list[exp.Expression] = []
        for original in conjuncts:
            c = self.expression(original, pair, "WHERE")
            owners = {pair.owner(n) for n in referenced_columns(c)}
            if owners == {1}:
                inner_filters.append(c)
            elif (
                isinstance(c, exp.EQ)
                and owners == {0, 1}
                and isinstance(c.this, exp.Column)
                and isinstance(c.expression, exp.Column)
            ):
                a, b = sorted([c.this.name, c.expression.name], key=pair.owner)
                keys.append((a, b))
            else:
                raise self.unsupported(
                    f"condition {original.sql(dialect='spark')!r} inside {kind} (use "
                    "equalities with the outer row, at most one other comparison with it, and "
                    "conditions on the subquery's own columns)",
                    original,
                )
        return keys, inner_filters

    def _in_key(
        self,
        select: exp.Select,
        probe: exp.Expression,
        pair: Scope,
        predicate: exp.Expression,
    ) -> tuple[str, str]:
        """The key of ``probe IN (SELECT item ...)``: an outer column and the subquery's one
        selected column (plan names); expressions on either side are refused."""
        outer, inner = pair.relations
        if len(select.expressions) != 1:
            raise self.error("the IN subquery must select exactly one column", select)
        if isinstance(probe, exp.Column) and not probe.table:
            probe = exp.column(probe.name, table=outer.alias)
        left = self.expression(probe, pair, "WHERE")
        item = _unalias(select.expressions[0])
        if isinstance(item, exp.Star) or isinstance(item.this, exp.Star):  # of one column
            columns = [c for c in inner.node.columns if c != ONE]
            if len(columns) != 1:
                raise self.error("the IN subquery must select exactly one column", select)
            item = exp.column(columns[0], table=inner.alias)
        right = self.expression(_qualified(item, outer, inner), pair, "WHERE")
        if not (isinstance(left, exp.Column) and isinstance(right, exp.Column)):
            raise self.unsupported("IN (subquery) over expressions (compare columns)", predicate)
        if pair.owner(left.name) != 0 or pair.owner(right.name) != 1:
            raise self.unsupported("IN (subquery) that does not compare an outer column", predicate)
        return left.name, right.name

    def _semi_inputs(
        self,
        pair: Scope,
        keys: list[tuple[str, str]],
        others: list[exp.Expression],
        inner_filters: list[exp.Expression],
    ) -> tuple[JoinInput, JoinInput]:
        """The semi-join's two inputs: the outer rows, filtered by the WHERE's ``others``
        conjuncts, and the subquery's collection, filtered, reduced to its key columns."""
        outer, inner = pair.relations
        get_a, pred_a, out_a = self.decompose(outer)
        get_b, pred_b, out_b = self.decompose(inner)
        sub_b = {pair.internal(1, c): out_b[c] for c in inner.node.columns}
        single = Scope((outer,))
        a_filters = [pred_a] if pred_a is not None else []
        a_filters += [_substitute(self.expression(o, single, "WHERE"), out_a) for o in others]
        b_filters = [pred_b] if pred_b is not None else []
        b_filters += [_substitute(f, sub_b) for f in inner_filters]
        mine = JoinInput(
            get_a,
            outer.alias,
            exp.and_(*a_filters) if a_filters else None,
            tuple((c, out_a[c]) for c in outer.node.columns),
        )
        theirs = JoinInput(
            get_b,
            inner.alias,
            exp.and_(*b_filters) if b_filters else None,
            tuple((b, sub_b[b]) for b in dict.fromkeys(b for _, b in keys)),
        )
        return mine, theirs

    def decompose(
        self, rel: Relation
    ) -> tuple[Get, exp.Expression | None, dict[str, exp.Expression]]:
        """A join input as (collection, filter, column -> expression over the collection);
        one that is a join, union or aggregate, or carries the constant an uncorrelated
        subquery joins on (:data:`ONE`), read from an internal view."""
        node = simplify(self.plain(rel.node))  # a ranking the subquery bounds: numbered
        if ONE in node.columns and rel.query is not None:
            get = self.internal_view(rel, node)
            return get, None, {c: exp.column(c) for c in get.columns}
        if isinstance(node, Get):
            return node, None, {c: exp.column(c) for c in node.columns}
        if isinstance(node, Filter) and isinstance(node.input, Get):
            return node.input, node.predicate, {c: exp.column(c) for c in node.columns}
        if isinstance(node, Project):
            inner, predicate = node.input, None
            if isinstance(inner, Filter):
                inner, predicate = inner.input, inner.predicate
            if isinstance(inner, Get):
                return inner, predicate, dict(node.outputs)
        if rel.query is None:
            raise self.unsupported(
                f"a join input that is itself a join, union or aggregate ({rel.label}); define "
                "it as a view and join the view",
                None,
            )
        get = self.internal_view(rel, node)
        return get, None, {c: exp.column(c) for c in get.columns}

    def internal_view(self, rel: Relation, node: Node) -> Get:
        """A join input that is a join, union or aggregate (a subquery's or CTE's ``node``)
        becomes an internal view, planned and maintained as a view of its own (its diff log
        feeds the join; its arrangements are shared), which the join reads as a collection:
        what a user would otherwise do by hand. Views whose inputs have the same SQL share
        one internal view."""
        query = self._standalone(rel.query)
        key = query.sql(dialect=DIALECT, normalize=True)
        found = self.internal.get(key)
        if found is None:
            label, alias = rel.label, rel.alias
            if alias.startswith(HIDDEN_PREFIX):  # a decorrelated subquery (ivm.sql.subqueries)
                line, col = position(rel.query, self.sql)
                label, alias = f"subquery at {line}:{col}", alias.replace(HIDDEN_PREFIX, "subquery")
            elif alias == JOINED:  # a join a NOT EXISTS/NOT IN filters (wrap_join)
                label, alias = "the join filtered by NOT EXISTS/NOT IN", "join"
            elif alias == DOMAIN_ALIAS:  # the outer values a subquery reads
                label, alias = "the outer values a subquery reads (its domain)", "domain"
            elif alias == SUBQUERY_JOIN:  # a join inside EXISTS/IN (wrap_subquery_join)
                label, alias = "the join inside an EXISTS/IN subquery", "subquery_join"
            elif alias.startswith(NESTED):  # a join's first inputs (nest_join)
                label, alias = (
                    "the first inputs of a join of more than two with an outer join",
                    "join",
                )
            elif alias == ONE_ROW:  # what a SELECT without FROM reads (ivm.sql.constants)
                label, alias = "the one row a SELECT without FROM reads", "row"
            elif alias == VALUES_ALIAS or isinstance(rel.node, Constant):  # VALUES: its alias
                alias = alias.strip("_") or "values"
            elif alias.startswith(LIMITED):  # a subquery's LIMIT (ivm.sql.limits)
                line, col = position(rel.query, self.sql)
                label, alias = f"the rows kept by the LIMIT at {line}:{col}", "limit"
            elif alias == GROUPED:  # groups HAVING compares with a subquery (lift_having)
                label, alias = "the groups HAVING compares with a subquery", "groups"
            base = f"{self.view.name}__{alias}"
            taken = {*self.catalog, *self.names_in_use, *(v.name for v in self.internal.values())}
            name = next(
                n for n in (base, *(f"{base}{i}" for i in range(2, 1000))) if n not in taken
            )
            found = InternalView(name, self.view.name, label, query, finished(node))
            self.internal[key] = found
        return Get(found.name, "view", found.root.columns)

    def _standalone(self, query: exp.Expression) -> exp.Expression:
        """``query`` with the definitions of the CTEs it reads (transitively, in the order
        they were written) as its own WITH: runnable on its own."""
        needed: list[str] = []
        pending = [query]
        while pending:
            q = pending.pop()
            for t in q.find_all(exp.Table):
                name = t.name.lower()
                if name in self._cte_queries and name not in needed:
                    needed.append(name)
                    pending.append(self._cte_queries[name])
        out = query.copy()
        for name in [n for n in self._cte_queries if n in needed]:
            out = out.with_(name, as_=self._cte_queries[name].copy(), append=True)
        return out

    def relation(self, item: exp.Expression, ctes: Mapping[str, Node]) -> Relation:
        """A FROM item (a source, view, CTE or subquery) as a relation with its qualifiers."""
        if isinstance(item, exp.Table):
            if item.args.get("db") or item.args.get("catalog"):
                raise self.error(
                    f"qualified table name {item.sql(dialect='spark')!r}: name sources in "
                    "ivm.toml and refer to them by that name",
                    item,
                )
            name = item.name.lower()
            alias = item.alias.lower() if item.alias else ""
            qualifiers = frozenset({alias} if alias else {name})
            if name in ctes:
                return Relation(ctes[name], qualifiers, f"CTE {name}", self._cte_queries[name])
            entry = self.catalog.get(name)
            if entry is None:
                known = ", ".join(sorted(self.catalog)) or "none"
                raise self.error(f"unknown table {name!r} (sources and views: {known})", item)
            kind, columns = entry
            if name == self.view.name:
                raise self.error(f"view {name!r} refers to itself", item)
            return Relation(Get(name, kind, columns), qualifiers, f"{kind} {name}")
        if isinstance(item, exp.Subquery):
            alias = item.alias.lower() if item.alias else "_subquery"  # Spark allows none
            node = self.query(item.this, ctes)
            label = f"subquery {item.alias}".strip()
            return Relation(node, frozenset({alias}), label, item.this)
        if isinstance(item, exp.Values):
            return self.values(item)
        raise self.unsupported(f"FROM {type(item).__name__}", item)

    def values(self, item: exp.Values) -> Relation:
        """A ``VALUES`` item (or the one row a ``SELECT`` without ``FROM`` reads) as a
        relation of its constant rows; as a join input, an internal view of them."""
        rows = values_rows(item)
        width = len(rows[0])
        for row in rows:
            if len(row) != width:
                raise self.error(
                    f"VALUES rows of {width} and {len(row)} values: every row needs as many "
                    "values as the first",
                    row[0],
                )
            for e in row:
                for n in e.walk():
                    if isinstance(n, exp.Column):
                        raise self.error(
                            f"column {n.sql(dialect='spark')} in VALUES: its rows are "
                            "constants (join the table instead)",
                            n,
                        )
                    self._refuse_in_expression(n, "VALUES", False)
        columns = values_columns(item, width)
        if len(columns) != width:
            raise self.error(f"VALUES with {width} values per row names {len(columns)}", item)
        alias = item.alias.lower() if item.alias else VALUES_ALIAS
        node = Constant(tuple(columns), tuple(tuple(e.copy() for e in r) for r in rows))
        label = "SELECT without FROM" if alias == ONE_ROW else f"VALUES {alias}"
        return Relation(node, frozenset({alias}), label, exp.select("*").from_(item.copy()))

    # -- expressions -----------------------------------------------------------------------

    def select_item(
        self,
        item: exp.Expression,
        rel: Scope,
        *,
        need_names: bool = True,
        placed: frozenset[str] = frozenset(),
    ) -> list[tuple[str, exp.Expression]]:
        """The ``(name, expression)`` outputs of one item of an ungrouped SELECT list
        (``placed``: window calls' columns it may read, see ``expression``)."""
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            qualifier = None
            if isinstance(item, exp.Column) and item.table:
                self.check_qualifier(item.table, item, rel)
                qualifier = item.table.lower()
            return [(name, exp.column(plan)) for name, plan in rel.star(qualifier) or []]
        if isinstance(item, exp.Alias):
            name = item.alias.lower()
            return [(name, self.expression(item.this, rel, "SELECT", placed=placed))]
        if isinstance(item, exp.Column):
            resolved = self.expression(item, rel, "SELECT", placed=placed)
            return [(item.name.lower(), resolved)]
        if not need_names:
            return [("_c", self.expression(item, rel, "SELECT", placed=placed))]
        raise self.error(
            f"expression {item.sql(dialect='spark')!r} needs a column name: add AS name", item
        )


@dataclass
class _Fold:
    """A FROM clause's joins folded left to right, so far: ``members``, the inputs joined;
    ``built``, their node once an outer join is built (None while every join is inner);
    until then ``pool``, the inner join's conjuncts not always true, and ``empty``, whether
    one is never true. ``keyed_outer``: the outer join with keys, if one is built. With an
    outer join: ``where``, WHERE's resolved conjuncts not yet placed; ``preserved``, the
    input a LEFT/RIGHT join of two inputs preserves."""

    members: list[int] = field(default_factory=lambda: [0])
    pool: list[tuple[exp.Expression, exp.Expression]] = field(default_factory=list)
    empty: bool = False
    built: Node | None = None
    keyed_outer: exp.Join | None = None
    where: list[exp.Expression] = field(default_factory=list)
    preserved: int | None = None


def _owners(scope: Scope, e: exp.Expression) -> set[int]:
    """The relations resolved expression ``e`` reads."""
    return {scope.owner(n) for n in referenced_columns(e)}


def _key_classes(equalities: list[_KeyEquality]) -> dict[tuple[_KeyColumn, ...], bool]:
    """The equivalence classes of ``(input, column)`` that key equalities make (union-find),
    each sorted, in the order their roots were first met (singletons left out), with whether
    NULL matches NULL in it: only when every equality joining it is ``<=>`` (one ``=``
    makes its columns non-NULL wherever the rows match, so the whole class is ``=``)."""
    parent: dict[_KeyColumn, _KeyColumn] = {}

    def find(x: _KeyColumn) -> _KeyColumn:
        while parent.setdefault(x, x) != x:
            x = parent[x]
        return x

    for a, b, _ in equalities:
        parent[find(a)] = find(b)
    groups: dict[_KeyColumn, list[_KeyColumn]] = {}
    for x in list(parent):
        groups.setdefault(find(x), []).append(x)
    plain = {find(a) for a, _, same in equalities if not same}
    return {tuple(sorted(g)): r not in plain for r, g in groups.items() if len(g) > 1}


def _qualified(e: exp.Expression, outer: Relation, inner: Relation) -> exp.Expression:
    """A copy of ``e``, written in a subquery over ``inner``, with each unqualified column
    qualified as SQL scopes it: the subquery's column if it has one, else the outer row's."""
    inner_cols = set(inner.node.columns)

    def qualify(n: exp.Expression) -> exp.Expression:
        if isinstance(n, exp.Column) and not n.table:
            owner = inner if n.name.lower() in inner_cols else outer
            return exp.column(n.name, table=owner.alias)
        return n

    return e.copy().transform(qualify)


def _has_joins(e: exp.Expression) -> bool:
    """Whether ``e`` is a FROM item that sqlglot gave joins: ``(a JOIN b ...)``."""
    return isinstance(e, (exp.Table, exp.Subquery)) and bool(e.args.get("joins"))


def _anti(conjunct: exp.Expression) -> bool:
    """Whether ``conjunct`` is ``NOT EXISTS (q)`` or ``x NOT IN (q)``."""
    found = subquery_predicate(conjunct)
    return found is not None and found[0] in ("NOT EXISTS", "NOT IN")


def _unfolded(item: exp.Expression, joins: list[exp.Join]) -> tuple[exp.Expression, list[exp.Join]]:
    """A FROM item and the joins after it, a parenthesized join at its head unfolded: joins
    associate to the left, so ``(a J1 b) J2 c`` is ``a J1 b J2 c`` (sqlglot hangs ``J1`` on
    ``a``). A parenthesized join with an alias stays one item (:meth:`_Lowerer.parenthesized`)."""
    while True:
        if (
            isinstance(item, exp.Subquery)
            and not item.alias
            and not item.args.get("joins")
            and _has_joins(item.this)
        ):
            item = item.this
            continue
        if _has_joins(item):
            bare = item.copy()  # the view's AST stays as parsed (verify regenerates its SQL)
            bare.set("joins", None)
            joins = [*item.args["joins"], *joins]
            item = bare
            continue
        return item, joins


def _union(branches: list[Node]) -> Node:
    """UNION ALL of ``branches`` (same column names), nested unions flattened."""
    flat: list[Node] = []
    for b in branches:
        flat.extend(b.branches if isinstance(b, UnionAll) else [b])
    return flat[0] if len(flat) == 1 else UnionAll(tuple(flat))


def _widened(node: Node, names: tuple[str, ...]) -> Node:
    """``node``'s rows with the columns ``names``: its own by name, the others NULL (for a
    UNION ALL, each branch's, by position)."""
    if isinstance(node, UnionAll):
        out: list[Node] = []
        for b in node.branches:
            by = dict(zip(node.columns, b.columns, strict=True))
            out.append(
                Project(b, tuple((n, exp.column(by[n]) if n in by else exp.null()) for n in names))
            )
        return _union(out)
    have = set(node.columns)
    return Project(node, tuple((n, exp.column(n) if n in have else exp.null()) for n in names))


def _no_rows(node: Node) -> Node:
    """A stateless ``node`` (Get/Filter/Project/UnionAll) with its collections read through
    ``Filter FALSE``: its columns and their types, no row."""
    if isinstance(node, Get | Constant):
        return Filter(node, exp.false())
    if isinstance(node, Filter):
        return Filter(_no_rows(node.input), node.predicate)
    if isinstance(node, Project):
        return Project(_no_rows(node.input), node.outputs)
    if isinstance(node, UnionAll):
        return UnionAll(tuple(_no_rows(b) for b in node.branches))
    raise TypeError(f"{type(node).__name__} is not stateless")


_Truth = Literal["true", "false", "null"] | None
"""A condition's constant value (SQL's three), or None: it reads columns, or the planner
does not evaluate it (Spark does, as any other condition)."""

_Conjunct = tuple[exp.Expression, exp.Expression, _Truth]
"""A join condition's conjunct: as written, resolved, and its constant value."""

_KeyColumn = tuple[int, str]
_KeyEquality = tuple[_KeyColumn, _KeyColumn, bool]
"""Two inputs' key columns equal, and whether NULL equals NULL (``<=>``)."""
"""A join key column: the input's position in the join and the column's plan name."""

_UNKNOWN = object()


def _truth(e: exp.Expression) -> _Truth:
    """The value of a condition that reads no column, when it is made of boolean, number
    and string literals, NULL, comparisons, NOT/AND/OR, IS NULL and CAST to BOOLEAN."""
    if referenced_columns(e):
        return None
    v = _constant(e)
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "true" if v else "false"
    return None


_COMPARE = {
    exp.EQ: lambda a, b: a == b,
    exp.NEQ: lambda a, b: a != b,
    exp.GT: lambda a, b: a > b,
    exp.GTE: lambda a, b: a >= b,
    exp.LT: lambda a, b: a < b,
    exp.LTE: lambda a, b: a <= b,
}


def _constant(e: exp.Expression) -> object:
    """A constant expression's value (bool, Decimal, str; None for NULL), or ``_UNKNOWN``.
    Only comparisons of like values are evaluated (Spark's casts between kinds are not
    the planner's to imitate)."""
    if isinstance(e, exp.Paren):
        return _constant(e.this)
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Null):
        return None
    if isinstance(e, exp.Literal):
        if e.is_string:
            return e.this
        try:
            return Decimal(e.this)
        except InvalidOperation:
            return _UNKNOWN
    if isinstance(e, exp.Neg):
        v = _constant(e.this)
        return -v if isinstance(v, Decimal) else _UNKNOWN
    if isinstance(e, exp.Not):
        v = _constant(e.this)
        return (not v) if isinstance(v, bool) else v if v is None else _UNKNOWN
    if isinstance(e, (exp.And, exp.Or)):
        a, b = _constant(e.this), _constant(e.expression)
        if not all(v is None or isinstance(v, bool) for v in (a, b)):
            return _UNKNOWN
        decisive = isinstance(e, exp.Or)  # TRUE decides OR, FALSE decides AND
        if decisive in (a, b):
            return decisive
        return None if None in (a, b) else not decisive
    if isinstance(e, exp.Is) and isinstance(e.expression, exp.Null):
        v = _constant(e.this)
        return _UNKNOWN if v is _UNKNOWN else v is None
    if isinstance(e, exp.Cast) and e.to.is_type(exp.DataType.Type.BOOLEAN):
        v = _constant(e.this)
        return v if v is None or isinstance(v, bool) else _UNKNOWN
    if isinstance(e, exp.NullSafeEQ):
        a, b = _constant(e.this), _constant(e.expression)
        if a is _UNKNOWN or b is _UNKNOWN:
            return _UNKNOWN
        if a is None or b is None:
            return a is None and b is None
        return a == b if type(a) is type(b) else _UNKNOWN
    compare = _COMPARE.get(type(e))
    if compare is not None:
        a, b = _constant(e.this), _constant(e.expression)
        if a is _UNKNOWN or b is _UNKNOWN:
            return _UNKNOWN
        if a is None or b is None:
            return None
        return compare(a, b) if type(a) is type(b) else _UNKNOWN
    return _UNKNOWN


def _rowless(node: Node) -> bool:
    """Whether ``node`` never has a row: a ``Filter`` with a ``FALSE`` conjunct in the way."""
    if isinstance(node, Filter):
        return any(
            isinstance(c, exp.Boolean) and not c.this for c in split_conjuncts(node.predicate)
        )
    if isinstance(node, Project):
        return _rowless(node.input)
    if isinstance(node, UnionAll):
        return all(_rowless(b) for b in node.branches)
    return False


def _without_void_branches(node: Node) -> Node:
    """``node`` without the UNION ALL branches that bring neither a row nor a type (no row,
    every column NULL): an input a constant join condition never matches, none of whose
    columns the view reads, is then not read at all."""
    if isinstance(node, (Get, Constant, Join, SemiJoin)):
        return node
    if isinstance(node, Filter):
        return Filter(_without_void_branches(node.input), node.predicate)
    if isinstance(node, Project):
        return Project(_without_void_branches(node.input), node.outputs)
    if isinstance(node, (Reduce, TopK, Window)):
        return replace(node, input=_without_void_branches(node.input))
    if isinstance(node, SetOp):
        return replace(
            node, left=_without_void_branches(node.left), right=_without_void_branches(node.right)
        )
    kept = [
        _without_void_branches(b)
        for b in node.branches
        if not (
            isinstance(b, Project)
            and _rowless(b)
            and all(isinstance(e, exp.Null) for _, e in b.outputs)
        )
    ] or [_without_void_branches(node.branches[0])]
    if kept[0].columns != node.columns:  # the first branch names the columns
        kept[0] = Project(
            kept[0],
            tuple((n, exp.column(c)) for n, c in zip(node.columns, kept[0].columns, strict=True)),
        )
    return kept[0] if len(kept) == 1 else UnionAll(tuple(kept))


def _unalias(e: exp.Expression) -> exp.Expression:
    """``e`` without its ``AS name``."""
    return e.this if isinstance(e, exp.Alias) else e


@dataclass(frozen=True, slots=True)
class InternalView:
    """A join input the lowerer made a view of its own (:meth:`_Lowerer.internal_view`).

    Attributes:
        name: its name, ``<view>__<alias>`` (the first view that needed it).
        owner: that view.
        label: what it is in the owner's SQL (``subquery t``, ``CTE revenue0``).
        query: its SQL, with the CTEs it reads as its own WITH.
        root: its plan.
    """

    name: str
    owner: str
    label: str
    query: exp.Expression
    root: Node

    @property
    def sql(self) -> str:
        """Its definition as a view file would hold it."""
        return f"CREATE VIEW {self.name} AS\n{self.query.sql(dialect=DIALECT, pretty=True)}\n"


def lower_view(
    view: ParsedView,
    catalog: Mapping[str, CatalogEntry],
    internal: dict[str, InternalView] | None = None,
    names_in_use: Collection[str] = (),
) -> Node:
    """Lower a parsed view to a demand-pruned plan.

    Args:
        view: the parsed file.
        catalog: every source and already-planned view by lowercase name.
        internal: the internal views planned so far, by their normalized SQL; the ones this
            view needs are added (a view with the same SQL is reused).
        names_in_use: the project's view names (an internal view takes none of them).

    Raises:
        SqlError: an unknown table or column, or a construct the planner does not support;
            the message names the file, line and column.
    """
    lowerer = _Lowerer(view, catalog, internal if internal is not None else {}, names_in_use)
    query = with_one_row(without_rowless_subqueries(view.query))
    node = finished(lowerer.plain(lowerer.query(query, {})))
    for v in lowerer.internal.values():
        _check_reserved(v.root, view)
    _check_reserved(node, view)
    return node


def finished(node: Node) -> Node:
    """A lowered query pruned to the columns read and simplified: a view's plan."""
    node = simplify(demand(node))
    return bounded_groups(simplify(_without_void_branches(node)))


def _check_reserved(node: Node, view: ParsedView) -> None:
    """No collection a plan reads may have a column the engine's updates reserve."""
    for get in collections(node):
        clash = {c for c in get.columns if c in RESERVED_COLUMNS or c.startswith(RESERVED_PREFIX)}
        if clash:
            raise SqlError(
                f"{get.kind} {get.collection!r} has a column named {sorted(clash)[0]!r}, which "
                "is reserved for the engine's updates; select other columns or rename it",
                file=view.file,
            )


def referenced_tables(view: ParsedView) -> set[str]:
    """Names of the tables (sources or views) a view reads, CTE names excluded."""
    cte_names = {c.alias_or_name.lower() for c in view.query.find_all(exp.CTE)}
    return {t.name.lower() for t in view.query.find_all(exp.Table)} - cte_names
