"""Window functions lowered to a :class:`~ivm.plan.ir.Window`: which functions and frames
are maintained, and how a SELECT's window calls become the Window's columns.

Maintained: aggregates ``OVER (PARTITION BY ... [ORDER BY ...] [frame])`` (COUNT, SUM, AVG,
MIN, MAX, STDDEV/VARIANCE, BOOL_AND/BOOL_OR, COUNT_IF), ``RANK``, ``DENSE_RANK``,
``PERCENT_RANK``, ``CUME_DIST``, ``ROW_NUMBER`` and ``NTILE``, ``LAG``, ``LEAD``,
``FIRST_VALUE``, ``LAST_VALUE``, ``NTH_VALUE``, anywhere in the SELECT list or QUALIFY
(``x - avg(x) OVER (...)``), with Spark's semantics for frames and ties: the Window
evaluates each call as written (Spark's own window functions), ordering rows that tie only
where Spark's result would depend on their order (:class:`~ivm.plan.ir.WindowCall`). So
``FIRST_VALUE``/``LAST_VALUE``/``NTH_VALUE`` over a RANGE frame are maintained only where
ties cannot change their value (the frame starts at the partition's first row, or is the
whole partition). ``ROW_NUMBER() ... <= k`` stays a TopK (:mod:`ivm.sql.lower_reduce`).

Contract in ``(data, time, diff)`` terms: a Window's updates at ``t`` are its rows at ``t``
minus its rows before, over the partitions whose input rows changed (:mod:`ops.window`).
"""

from __future__ import annotations

from collections.abc import Callable

from sqlglot import exp

from ivm.errors import IvmError
from ivm.plan.ir import Filter, Node, Window, WindowCall, window_function
from ivm.sql.scope import LoweringContext, Scope, is_aggregate
from ivm.sql.subqueries import scalar_subqueries

AGGREGATES = (
    exp.Count,
    exp.Sum,
    exp.Avg,
    exp.Min,
    exp.Max,
    exp.Stddev,
    exp.StddevSamp,
    exp.StddevPop,
    exp.Variance,
    exp.VariancePop,
    exp.LogicalAnd,
    exp.LogicalOr,
    exp.CountIf,
)
RANKS = (exp.Rank, exp.DenseRank, exp.PercentRank, exp.CumeDist, exp.RowNumber, exp.Ntile)
OFFSETS = (exp.Lag, exp.Lead)
VALUES = (exp.FirstValue, exp.LastValue, exp.NthValue)
PLACEHOLDER = "_ivm_w"
"""Prefix of the Window's columns holding the calls' values (``_ivm_w0``...): the engine
reserves it, so no input column has such a name."""


def windows_in(e: exp.Expression) -> list[exp.Window]:
    """The window calls in ``e``, outermost first, not inside subqueries."""
    return [
        n
        for n in e.walk(prune=lambda n: isinstance(n, (exp.Window, exp.Subquery)))
        if isinstance(n, exp.Window)
    ]


def window_calls(s: exp.Select) -> list[exp.Window]:
    """The window calls of a SELECT's list and its QUALIFY."""
    qualify = s.args.get("qualify")
    parts = [*s.expressions, *([qualify.this] if qualify is not None else [])]
    return [w for p in parts for w in windows_in(p)]


def placed(e: exp.Expression, names: list[str]) -> exp.Expression:
    """A copy of ``e`` with its window calls (:func:`windows_in`'s order) replaced by the
    columns ``names`` holding their values."""
    out = e.copy()
    found = windows_in(out)
    if isinstance(out, exp.Window):
        return exp.column(names[0])
    for w, name in zip(found, names, strict=True):
        w.replace(exp.column(name))
    return out


GROUPS = "_ivm_wg"
"""The alias of a grouped query whose SELECT list or QUALIFY has window calls
(:func:`lift_grouped`)."""


class WindowRefused(IvmError):
    """A grouped query with window calls :func:`lift_grouped` cannot rewrite."""

    def __init__(self, construct: str, at: exp.Expression) -> None:
        super().__init__(construct)
        self.construct, self.at = construct, at


OuterReads = Callable[[exp.Subquery], list[exp.Column]]
"""A scalar subquery -> the columns it reads of the query around it (its correlation)."""


def lift_grouped(s: exp.Select, outer_reads: OuterReads | None = None) -> exp.Select | None:
    """A grouped query with window calls, ``SELECT g, sum(x) AS s, rank() OVER (ORDER BY
    sum(x) DESC) AS r FROM t GROUP BY g``, as windows over its groups: ``SELECT g, s,
    rank() OVER (ORDER BY _ivm_wg.__w0 DESC) AS r FROM (SELECT g, sum(x) AS s, sum(x) AS
    __w0 FROM t GROUP BY g) AS _ivm_wg``. In the items and QUALIFY that hold window calls,
    every aggregate and every column outside one (a group key) becomes a column of the
    groups (``__w<n>``), except the window's own function. With ``outer_reads``, a scalar
    subquery in the SELECT list lifts the same way, its reads of the grouped query (by
    ``outer_reads``) becoming columns of the groups: it is then a subquery over a derived
    table. None when ``s`` groups nothing or has neither.

    Raises:
        WindowRefused: an output without a name, or ORDER BY reading an aggregate.
    """
    grouped = bool(s.args.get("group") or s.args.get("having")) or any(
        is_aggregate(n)
        for i in s.expressions
        for n in i.walk(prune=lambda n: isinstance(n, (exp.Window, exp.Subquery)))
    )

    def lifts(e: exp.Expression) -> bool:
        return bool(windows_in(e)) or (outer_reads is not None and bool(scalar_subqueries(e)))

    if not grouped or not (window_calls(s) or any(lifts(i) for i in s.expressions)):
        return None
    hidden: list[exp.Expression] = []
    outputs = {i.alias_or_name.lower() for i in s.expressions if isinstance(i, exp.Alias)}

    def lifted(e: exp.Expression, aliases: frozenset[str] = frozenset()) -> exp.Expression:
        return _over_groups(e.copy(), None, hidden, aliases, outer_reads)

    outer_items, inner_items = [], []
    for item in s.expressions:
        if not lifts(item):
            if not isinstance(item, (exp.Alias, exp.Column)) or isinstance(item.this, exp.Star):
                raise WindowRefused(
                    "a grouped query with window calls or subqueries and an unnamed item", item
                )
            inner_items.append(item.copy())
            outer_items.append(exp.column(item.alias_or_name, table=GROUPS))
            continue
        if not isinstance(item, exp.Alias):
            what = "a window call" if windows_in(item) else "a scalar subquery"
            raise WindowRefused(f"{what} without a name (add AS name)", item)
        # an Alias node: ``as_`` of a subquery would name the subquery, not the item
        outer_items.append(exp.Alias(this=lifted(item.this), alias=item.args["alias"].copy()))
    qualify = s.args.get("qualify")
    outer_qualify = lifted(qualify.this, frozenset(outputs)) if qualify is not None else None
    order = s.args.get("order")
    if order is not None and any(is_aggregate(n) for n in order.walk()):
        raise WindowRefused(
            "ORDER BY an aggregate in a grouped query with window calls or subqueries", order
        )
    inner = s.copy()
    for key in ("qualify", "order", "limit", "offset", "distinct"):
        inner.set(key, None)
    inner.set("expressions", [*inner_items, *hidden])
    out = exp.select(*outer_items).from_(
        exp.Subquery(this=inner, alias=exp.TableAlias(this=exp.to_identifier(GROUPS)))
    )
    if outer_qualify is not None:
        out.set("qualify", exp.Qualify(this=outer_qualify))
    for key in ("order", "limit", "offset", "distinct"):
        if s.args.get(key) is not None:
            out.set(key, s.args[key].copy())
    return out


def _over_groups(
    n: exp.Expression,
    own: exp.Expression | None,
    hidden: list[exp.Expression],
    aliases: frozenset[str],
    outer_reads: OuterReads | None = None,
) -> exp.Expression:
    """``n`` (a copy, changed in place) over the groups of :func:`lift_grouped`: each
    aggregate and bare column (not one of the SELECT list's ``aliases``, nor ``own``, the
    window function being read) appended to ``hidden`` as ``__w<i>`` and read from there;
    in a scalar subquery, only its reads of the grouped query (``outer_reads``)."""

    def hide(e: exp.Expression) -> exp.Expression:
        hidden.append(e.copy().as_(f"__w{len(hidden)}"))
        return exp.column(f"__w{len(hidden) - 1}", table=GROUPS)

    if isinstance(n, exp.Subquery) and outer_reads is not None:
        reads = outer_reads(n)
        for col in reads:
            agg = col.find_ancestor(exp.AggFunc, exp.Subquery)  # the grouped query's own?
            if isinstance(agg, exp.AggFunc) and all(c in reads for c in agg.find_all(exp.Column)):
                raise WindowRefused("an aggregate of the grouped query inside its subquery", col)
            col.replace(hide(col))
        return n
    named = isinstance(n, exp.Column) and not n.table and n.name.lower() in aliases
    if n is not own and not named and (is_aggregate(n) or isinstance(n, exp.Column)):
        return hide(n)
    if isinstance(n, exp.Window):  # its function stays; what it reads is lifted
        own = window_function(n)
    for key, value in list(n.args.items()):
        if isinstance(value, exp.Expression):
            n.set(key, _over_groups(value, own, hidden, aliases, outer_reads))
        elif isinstance(value, list):
            items = [
                _over_groups(v, own, hidden, aliases, outer_reads)
                if isinstance(v, exp.Expression)
                else v
                for v in value
            ]
            n.set(key, items)
    return n


class WindowLowering(LoweringContext):
    """The lowerer's methods for window functions; :mod:`ivm.sql.lower` uses them."""

    def window_node(
        self, s: exp.Select, node: Node, scope: Scope
    ) -> tuple[Node, Callable[[exp.Expression], exp.Expression], frozenset[str]]:
        """``node`` with the SELECT's window calls as columns (a :class:`Window`), filtered
        by QUALIFY; with a function giving a SELECT item over those columns, and their
        names (plan names the item's expression may hold, see ``expression``'s ``placed``).
        """
        calls: list[WindowCall] = []
        per_item: dict[int, list[str]] = {}
        for i, item in enumerate(s.expressions):
            per_item[i] = []
            for w in windows_in(item):
                name = f"{PLACEHOLDER}{len(calls)}"
                calls.append(WindowCall(name, self._over(w, scope)))
                per_item[i].append(name)
        qualify = s.args.get("qualify")
        condition = None
        if qualify is not None:
            inline = windows_in(qualify.this)
            names = [f"{PLACEHOLDER}{len(calls) + k}" for k in range(len(inline))]
            calls += [
                WindowCall(n, self._over(w, scope)) for n, w in zip(names, inline, strict=True)
            ]
            condition = placed(qualify.this, names) if inline else qualify.this.copy()
        keys = self._common_keys(calls)
        window: Node = Window(node, keys, tuple(calls), self.label())
        everything = frozenset(c.name for c in calls)
        if condition is not None:
            condition = self._qualify_aliases(s, condition, per_item)
            window = Filter(window, self.expression(condition, scope, "QUALIFY", placed=everything))
        index = {id(item): i for i, item in enumerate(s.expressions)}

        def item_over(item: exp.Expression) -> exp.Expression:
            names = per_item[index[id(item)]]
            if not names:
                return item
            if isinstance(item, exp.Window):
                raise self.error(
                    f"window function {item.sql(dialect='spark')} needs a column name: add AS name",
                    item,
                )
            return placed(item, names)

        return window, item_over, everything

    def _qualify_aliases(
        self, s: exp.Select, condition: exp.Expression, per_item: dict[int, list[str]]
    ) -> exp.Expression:
        """QUALIFY's references to a SELECT alias of a window call, as its column."""
        aliases = {
            item.alias.lower(): per_item[i][0]
            for i, item in enumerate(s.expressions)
            if isinstance(item, exp.Alias) and isinstance(item.this, exp.Window)
        }
        if isinstance(condition, exp.Column) and not condition.table:
            name = aliases.get(condition.name.lower())
            return exp.column(name) if name else condition
        for col in list(condition.find_all(exp.Column)):
            if not col.table and col.name.lower() in aliases:
                col.replace(exp.column(aliases[col.name.lower()]))
        return condition

    def _common_keys(self, calls: list[WindowCall]) -> tuple[str, ...]:
        """The columns every call partitions by (in the first call's order)."""
        sets = []
        for c in calls:
            part = c.over.args.get("partition_by") or []
            sets.append([p.name for p in part if isinstance(p, exp.Column)])
        first = list(dict.fromkeys(sets[0]))
        return tuple(k for k in first if all(k in other for other in sets[1:]))

    def _over(self, w: exp.Window, scope: Scope) -> exp.Window:
        """Window call ``w`` checked (:meth:`_check_call`) with its columns resolved."""
        self._check_call(w)
        parts: list[exp.Expression] = [
            *window_function(w).iter_expressions(),
            *(w.args.get("partition_by") or []),
        ]
        order = w.args.get("order")
        parts += [o.this for o in order.expressions] if order is not None else []
        for p in parts:
            if not isinstance(p, exp.Star):  # COUNT(*)
                self.expression(p, scope, "OVER")  # validates: no aggregate, subquery, window
        return w.copy().transform(lambda n: self._resolved(n, scope))

    def _check_call(self, w: exp.Window) -> None:
        """Refuse a window function or frame this release does not maintain, by name."""
        f = window_function(w)
        name = f.sql(dialect="spark").split("(")[0].upper()  # as Spark names it
        if not isinstance(f, (*AGGREGATES, *RANKS, *OFFSETS, *VALUES)):
            raise self.unsupported(f"window function {name}", w)
        if isinstance(f, AGGREGATES) and isinstance(f.this, exp.Distinct):
            raise self.unsupported(f"{name}(DISTINCT ...) OVER (...)", w)
        order = w.args.get("order")
        ordered = order is not None and bool(order.expressions)
        if isinstance(f, (*RANKS, *OFFSETS)) and not ordered:
            raise self.error(f"{name}() needs ORDER BY in its OVER clause", w)
        spec = w.args.get("spec")
        if not isinstance(f, VALUES):
            return
        kind = str(spec.args.get("kind") or "").upper() if spec is not None else "RANGE"
        if kind == "ROWS" or not ordered:
            return
        start = str(spec.args.get("start") or "").upper() if spec is not None else "UNBOUNDED"
        end = str(spec.args.get("end") or "").upper() if spec is not None else "CURRENT ROW"
        whole = start == "UNBOUNDED" and end == "UNBOUNDED"
        # FIRST_VALUE from the first row on: ties only choose among equal ORDER BY values
        # (no RANGE offset: ties ordered, ORDER BY has several columns, which it refuses)
        first = isinstance(f, exp.FirstValue) and start == "UNBOUNDED" and end == "CURRENT ROW"
        if whole or first:
            return
        raise self.unsupported(
            f"{name} over a RANGE frame whose rows depend on ties (rows equal in ORDER BY "
            "would give it different values; write ROWS BETWEEN ...)",
            w,
        )
