"""Lowering of the stateful constructs: GROUP BY, aggregates, HAVING, DISTINCT, set operations
and TopK (``ORDER BY ... LIMIT`` and ``ROW_NUMBER() ... <= k``), as :class:`ReduceLowering`,
the base class of :mod:`ivm.sql.lower`'s lowerer (names resolve in :mod:`ivm.sql.scope`).

Owns how SQL's grouped queries become ``Project -> Reduce -> Filter (HAVING) -> Project``:
group expressions and aggregate arguments are computed by a projection before the reduce, so
the reduce itself only groups columns; aggregates in the SELECT list and HAVING are replaced
by the reduce's output columns. Which aggregate is which kind, and what state each keeps, is
decided later by :mod:`ivm.plan.reduce`.

Contract in ``(data, time, diff)`` terms: the nodes built here denote the same collection as
the SQL; they are not linear, so the engine maintains them from state, never by mapping
updates one by one. Refused with ``SqlError`` naming the construct and its ``line:col``:
ROLLUP/CUBE/GROUPING SETS, ``SELECT *`` or a column neither grouped nor aggregated in a
grouped query, aggregates not in ``SUPPORTED_AGGREGATES``, LIMIT without ORDER BY or with a
bound that is no integer literal, window functions other than ``ROW_NUMBER()``, and a ranking
no filter bounds.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace

from sqlglot import exp

from ivm.errors import InvariantViolation
from ivm.plan.ir import Aggregate, Filter, Node, Project, Reduce, SetOp, TopK, Window, WindowCall
from ivm.sql.scope import ANONYMOUS_AGGREGATES, Scope, is_aggregate
from ivm.sql.windows import WindowLowering

_AGG_CLASSES: dict[str, str] = {
    "Count": "count",
    "Sum": "sum",
    "Avg": "avg",
    "Min": "min",
    "Max": "max",
    "Stddev": "stddev_samp",
    "StddevSamp": "stddev_samp",
    "StddevPop": "stddev_pop",
    "Variance": "var_samp",
    "VarianceSamp": "var_samp",
    "VariancePop": "var_pop",
    "LogicalAnd": "bool_and",
    "LogicalOr": "bool_or",
    "GroupConcat": "string_agg",
    "Median": "median",
    "PercentileCont": "percentile_cont",
    "PercentileDisc": "percentile_disc",
}
SUPPORTED_AGGREGATES = (
    "COUNT, SUM, AVG, MIN, MAX, STDDEV/VARIANCE (_SAMP/_POP), BOOL_AND/EVERY, BOOL_OR/SOME, "
    "STRING_AGG/LISTAGG, MEDIAN, PERCENTILE_CONT/PERCENTILE_DISC"
)


@dataclass(frozen=True)
class _Call:
    """An aggregate call as written: function, argument (resolved), modifiers."""

    func: str
    arg: exp.Expression | None
    distinct: bool
    params: tuple[object, ...]
    order: tuple[tuple[exp.Expression, bool, bool], ...]


@dataclass
class _Grouping:
    """One grouped SELECT being lowered: the columns the projection before the reduce
    computes, the group keys among them, and the aggregate calls registered so far."""

    scope: Scope
    pre: dict[str, tuple[str, exp.Expression]] = field(default_factory=dict)
    """An expression's SQL -> (its column, the expression), in the projection's order."""
    keys: list[str] = field(default_factory=list)
    key_sql: dict[str, str] = field(default_factory=dict)
    """A group key's SQL -> its column, once every key is known."""
    calls: dict[tuple[object, ...], str] = field(default_factory=dict)
    """A call's signature -> the reduce's output column for it."""
    aggregates: list[Aggregate] = field(default_factory=list)
    frozen: bool = False
    """The reduce node is built: ORDER BY may use its aggregates but add none."""

    def column(self, e: exp.Expression, prefix: str) -> str:
        """The projection's column computing ``e`` (a new ``_<prefix>N`` unless ``e`` is
        a column or already computed)."""
        key = e.sql()
        if key not in self.pre:
            name = e.name if isinstance(e, exp.Column) else f"_{prefix}{len(self.pre)}"
            self.pre[key] = (name, e)
        return self.pre[key][0]

    def argument(self, e: exp.Expression) -> str:
        """The projection's column an aggregate reads ``e`` from: :meth:`column`, unless that
        is a group key; then a copy of its own (``_aN``), so the aggregate's state, keyed by
        the group and the value (a tower, distinct counts), never holds one column twice.

        Every key is known when the first aggregate is registered."""
        name = self.column(e, "a")
        if name not in self.keys:
            return name
        key = f"argument: {e.sql()}"
        if key not in self.pre:
            taken = {n for n, _ in self.pre.values()}
            n = len(self.pre)
            while f"_a{n}" in taken:
                n += 1
            self.pre[key] = (f"_a{n}", e.copy())
        return self.pre[key][0]


@dataclass(frozen=True)
class Ranked:
    """A SELECT with ``ROW_NUMBER() OVER (...) AS rank``: a TopK waiting for its ``rank <= k``.

    Not a plan node: the enclosing query must filter the rank (or the view is rejected).
    """

    input: Node
    partition: tuple[str, ...]
    order: tuple[tuple[str, bool, bool], ...]
    rank: str
    visible: tuple[str, ...]
    at: exp.Expression

    @property
    def columns(self) -> tuple[str, ...]:
        return self.visible + (self.rank,)


class ReduceLowering(WindowLowering):
    """The lowerer's methods for the stateful constructs; :mod:`ivm.sql.lower` extends it."""

    # -- GROUP BY -------------------------------------------------------------------------

    def grouped(
        self, s: exp.Select, node: Node, scope: Scope, *, need_names: bool
    ) -> tuple[Node, Callable[[exp.Expression], exp.Expression]]:
        """A grouped SELECT: ``Project(Filter(Reduce(Project(node))))``.

        Returns:
            the plan, and a function rewriting an expression over the FROM scope (e.g. an
            ORDER BY item) into one over the reduce's output.
        """
        self._refuse_grouping(s)
        grouping = _Grouping(scope)
        self._group_keys(grouping, s)
        outputs: list[tuple[str, exp.Expression]] = []
        for i, item in enumerate(s.expressions):
            name = self._grouped_output_name(item, i, need_names)
            inner = item.this if isinstance(item, exp.Alias) else item
            outputs.append((name, self._over_groups(grouping, inner, "SELECT", name)))
        having = s.args.get("having")
        having_expr = (
            self._over_groups(grouping, having.this, "HAVING") if having is not None else None
        )
        if not grouping.keys and not grouping.aggregates:
            raise self.error("GROUP BY without keys or aggregates", s)
        pre_project = Project(node, tuple((n, e) for n, e in grouping.pre.values()))
        reduce_node: Node = Reduce(
            pre_project,
            tuple(grouping.keys),
            tuple(grouping.aggregates),
            self.label(),
            self.group_size,
        )
        if having_expr is not None:
            reduce_node = Filter(reduce_node, having_expr)
        grouping.frozen = True
        return Project(reduce_node, tuple(outputs)), lambda e: self._over_groups(
            grouping, e, "ORDER BY"
        )

    def _refuse_grouping(self, s: exp.Select) -> None:
        """Refuse ROLLUP, CUBE, GROUPING SETS and ``SELECT *`` in a grouped query."""
        group = s.args.get("group")
        for key in ("rollup", "cube", "grouping_sets"):  # GROUP BY a WITH ROLLUP
            if group is not None and group.args.get(key):
                raise self.unsupported(f"GROUP BY {key.upper().replace('_', ' ')}", group)
        for item in group.expressions if group is not None else []:  # GROUP BY ROLLUP(a)
            if isinstance(item, (exp.Rollup, exp.Cube, exp.GroupingSets)):
                name = {exp.Rollup: "ROLLUP", exp.Cube: "CUBE"}.get(type(item), "GROUPING SETS")
                raise self.unsupported(f"GROUP BY {name}", item)
        for item in s.expressions:
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                raise self.error("SELECT * in a grouped query: name the columns", s)

    def _group_keys(self, grouping: _Grouping, s: exp.Select) -> None:
        """Resolve the GROUP BY items into key columns of the pre-projection, in order,
        each once; then note each key's SQL (to recognise it in SELECT, HAVING, ORDER BY)."""
        group = s.args.get("group")
        items = list(s.expressions)
        for g in group.expressions if group is not None else []:
            target = self._group_target(g, items, grouping.scope)
            resolved = self.expression(target, grouping.scope, "GROUP BY")
            name = grouping.column(resolved, "g")
            if name not in grouping.keys:
                grouping.keys.append(name)
        grouping.key_sql = {e.sql(): n for n, e in grouping.pre.values() if n in grouping.keys}

    def _group_target(
        self, g: exp.Expression, items: list[exp.Expression], scope: Scope
    ) -> exp.Expression:
        """What a GROUP BY item groups by: a SELECT item by position (``GROUP BY 1``) or by
        alias (unless an input column has that name), else the item itself."""
        target = g
        if isinstance(g, exp.Literal) and not g.is_string:
            position = int(g.this)
            if not 1 <= position <= len(items):
                raise self.error(f"GROUP BY {position}: the SELECT list has {len(items)}", g)
            target = items[position - 1]
        elif isinstance(g, exp.Column) and not g.table:
            alias = next(
                (i for i in items if isinstance(i, exp.Alias) and i.alias.lower() == g.name),
                None,
            )
            known = {c for r in scope.relations for c in r.node.columns}
            if alias is not None and g.name.lower() not in known:
                target = alias
        if isinstance(target, exp.Alias):
            target = target.this
        return target

    def _grouped_output_name(self, item: exp.Expression, i: int, need_names: bool) -> str:
        """The output column name of SELECT item ``i`` of a grouped query."""
        if isinstance(item, exp.Alias):
            return item.alias.lower()
        if isinstance(item, exp.Column):
            return item.name.lower()
        if not need_names:
            return f"_c{i}"
        raise self.error(
            f"expression {item.sql(dialect='spark')!r} needs a column name: add AS name",
            item,
        )

    def _over_groups(
        self, grouping: _Grouping, e: exp.Expression, clause: str, prefer: str | None = None
    ) -> exp.Expression:
        """``e`` (over the FROM scope) as an expression over the reduce's output: group
        keys and aggregate calls become its columns; any other column is refused.

        Args:
            prefer: the name for the aggregate when ``e`` is one call (its SELECT alias).
        """
        resolved = self.expression(e, grouping.scope, clause, aggregates=True)

        def sub(n: exp.Expression) -> exp.Expression:
            if n.sql() in grouping.key_sql:
                return exp.column(grouping.key_sql[n.sql()])
            call = self.aggregate_call(n)
            if call is not None:
                name = self._register(grouping, call, n, prefer if n.parent is None else None)
                return exp.column(name)
            if isinstance(n, exp.Column):
                user = n.name.replace("__", ".", 1)
                raise self.error(
                    f"column {user!r} must appear in GROUP BY or inside an aggregate function",
                    _find_column(e, n.name.split("__")[-1]) or e,
                )
            return n

        return resolved.transform(sub)

    def _register(
        self, grouping: _Grouping, call: _Call, at: exp.Expression, prefer: str | None
    ) -> str:
        """The reduce's output column for ``call``: an equal call already registered shares
        it; a new one is named ``prefer`` when free, else ``_aggN``."""
        arg = grouping.argument(call.arg) if call.arg is not None else None
        order = tuple((grouping.argument(e), d, nf) for e, d, nf in call.order)
        func = call.func
        distinct = call.distinct and func not in ("min", "max")
        if func == "median":
            func, params = "percentile_cont", (0.5,)
        else:
            params = call.params
        sig = (func, arg, distinct, params, order)
        calls = grouping.calls
        if sig not in calls and grouping.frozen:
            raise self.unsupported(
                "ORDER BY an aggregate that is not in SELECT (add it to the SELECT list)", at
            )
        if sig not in calls:
            taken = set(grouping.keys) | set(calls.values())
            calls[sig] = prefer if prefer and prefer not in taken else f"_agg{len(calls)}"
            try:
                grouping.aggregates.append(
                    Aggregate(calls[sig], func, arg, distinct, params, order)
                )
            except InvariantViolation as e:  # a malformed call
                raise self.error(str(e), at) from e
        return calls[sig]

    # -- aggregate calls --------------------------------------------------------------------

    def aggregate_call(self, n: exp.Expression) -> _Call | None:
        """The aggregate ``n`` calls, or None if it is not one (``n`` is resolved)."""
        where = None
        if isinstance(n, exp.Filter) and (
            is_aggregate(n.this) or isinstance(n.this, exp.WithinGroup)
        ):
            where = n.expression.this if isinstance(n.expression, exp.Where) else n.expression
            n = n.this
        if isinstance(n, exp.WithinGroup):
            call = self._percentile_call(n)
            return _filtered(call, where) if where is not None else call
        named = self._function_and_args(n)
        if named is None:
            return None
        func, args = named
        order, args = _listagg_order(func, args)
        distinct, args = self._distinct_argument(func, args, order, n)
        params: tuple[object, ...] = ()
        if func == "string_agg":
            params = (self._separator(args, n),)
            args = args[:1]
        arg = self._aggregate_argument(func, args, distinct, n)
        call = _Call(func, arg, distinct, params, tuple(order))
        return _filtered(call, where) if where is not None else call

    def _percentile_call(self, n: exp.WithinGroup) -> _Call:
        """``PERCENTILE_CONT/DISC(fraction) WITHIN GROUP (ORDER BY x)``; other ordered-set
        aggregates are refused."""
        ordered = n.expression.expressions if isinstance(n.expression, exp.Order) else []
        inner = n.this
        name = _AGG_CLASSES.get(type(inner).__name__)
        if name not in ("percentile_cont", "percentile_disc") or len(ordered) != 1:
            raise self.unsupported(f"{n.sql(dialect='spark')} (WITHIN GROUP)", n)
        frac = inner.this
        if not (isinstance(frac, exp.Literal) and not frac.is_string):
            raise self.error(f"{name} needs a literal fraction", n)
        if not 0 <= float(frac.this) <= 1:
            raise self.error(f"{name} fraction {frac.this} is not between 0 and 1", frac)
        return _Call(
            name,
            ordered[0].this.copy(),
            False,
            (float(frac.this),),
            (
                (
                    ordered[0].this.copy(),
                    bool(ordered[0].args.get("desc")),
                    bool(ordered[0].args.get("nulls_first")),
                ),
            ),
        )

    def _function_and_args(self, n: exp.Expression) -> tuple[str, list[exp.Expression]] | None:
        """The aggregate function ``n`` calls (our name) and its arguments as written, or None
        if ``n`` is no aggregate; an aggregate without a maintained kind is refused."""
        if isinstance(n, exp.Anonymous) and n.name.lower() in ANONYMOUS_AGGREGATES:
            return ANONYMOUS_AGGREGATES[n.name.lower()], list(n.expressions)
        if not isinstance(n, exp.AggFunc):
            return None
        func = _AGG_CLASSES.get(type(n).__name__)
        if func is None:
            raise self.unsupported(
                f"aggregate function {n.key.upper()} (supported: {SUPPORTED_AGGREGATES})", n
            )
        args = [n.this] if n.this is not None else []
        if func == "string_agg":
            sep = n.args.get("separator")
            args.append(sep if sep is not None else exp.Literal.string(","))
        return func, args

    def _distinct_argument(
        self,
        func: str,
        args: list[exp.Expression],
        order: list[tuple[exp.Expression, bool, bool]],
        n: exp.Expression,
    ) -> tuple[bool, list[exp.Expression]]:
        """Whether the call is ``f(DISTINCT x)``, and its arguments with ``x`` unwrapped; a
        DISTINCT over several columns, or ordered by another expression, is refused."""
        if not (args and isinstance(args[0], exp.Distinct)):
            return False, args
        inner_args = list(args[0].expressions)
        if len(inner_args) != 1:
            raise self.unsupported(f"{func.upper()}(DISTINCT a, b) over several columns", n)
        args = [inner_args[0], *args[1:]]
        if any(o.sql() != args[0].sql() for o, _, _ in order):
            raise self.unsupported(
                f"{func.upper()}(DISTINCT x) ordered by something other than x", n
            )
        return True, args

    def _separator(self, args: list[exp.Expression], n: exp.Expression) -> str:
        """STRING_AGG's separator: its second argument, a string literal (default ``,``)."""
        sep = args[1] if len(args) > 1 else exp.Literal.string(",")
        if not (isinstance(sep, exp.Literal) and sep.is_string):
            raise self.error("STRING_AGG needs a literal string separator", n)
        return sep.this

    def _aggregate_argument(
        self, func: str, args: list[exp.Expression], distinct: bool, n: exp.Expression
    ) -> exp.Expression | None:
        """The one argument of the call (None for ``COUNT(*)`` and ``COUNT(literal)``);
        several arguments or a nested aggregate are refused."""
        if func == "count" and (
            not args or isinstance(args[0], exp.Star) or _non_null_literal(args[0])
        ):
            if distinct:
                raise self.unsupported("COUNT(DISTINCT *)", n)
            return None
        if len(args) != 1:
            raise self.error(f"{func.upper()} takes one argument", n)
        arg = args[0].copy()
        for inner in arg.walk():
            if is_aggregate(inner):
                raise self.error("an aggregate inside an aggregate", n)
        return arg

    # -- DISTINCT, set operations -----------------------------------------------------------

    def distinct(self, node: Node) -> Node:
        """``SELECT DISTINCT`` / ``UNION``: a reduce with every column as key, no aggregates."""
        return Reduce(node, node.columns, (), self.label(), self.group_size)

    def set_operation(self, q: exp.Expression, left: Node, right: Node) -> Node:
        """``INTERSECT``/``EXCEPT`` [ALL]: a SetOp, the right side's columns renamed by position."""
        op = "intersect" if isinstance(q, exp.Intersect) else "except"
        if len(left.columns) != len(right.columns):
            raise self.error(
                f"{op.upper()} inputs have {len(left.columns)} and {len(right.columns)} columns",
                q.expression,
            )
        if right.columns != left.columns:
            right = Project(
                right,
                tuple((n, exp.column(c)) for n, c in zip(left.columns, right.columns, strict=True)),
            )
        return SetOp(left, right, op, not q.args.get("distinct"), self.label())

    # -- TopK -------------------------------------------------------------------------------

    def order_limit(
        self,
        q: exp.Expression,
        node: Node,
        sort_key: Callable[[exp.Expression], exp.Expression] | None,
    ) -> Node:
        """``ORDER BY ... LIMIT k [OFFSET n]`` on ``node``: a global TopK.

        Args:
            sort_key: rewrites an ORDER BY expression that is not an output column into an
                expression over ``node``'s input (None: only output columns may be named).
        """
        limit, offset = q.args.get("limit"), q.args.get("offset")
        order = q.args.get("order")
        if offset is not None and limit is None:
            raise self.unsupported("OFFSET without LIMIT", offset)
        if limit is None:
            return node  # ORDER BY alone does not change a multiset: a view has no order
        k = _integer(limit.expression if isinstance(limit, exp.Limit) else limit)
        n = (
            _integer(offset.expression if isinstance(offset, exp.Offset) else offset)
            if offset
            else 0
        )
        if k is None or n is None:
            raise self.unsupported("LIMIT/OFFSET that is not an integer literal", limit)
        if order is None:
            raise self.error(
                "LIMIT without ORDER BY keeps arbitrary rows, which cannot be maintained: add "
                "ORDER BY",
                limit,
                construct="LIMIT without ORDER BY",
            )
        if k == 0:
            raise self.unsupported("LIMIT 0", limit)
        hidden: list[tuple[str, exp.Expression]] = []
        keys: list[tuple[str, bool, bool]] = []
        for o in order.expressions:
            name = self._sort_column(o.this, node, sort_key, hidden)
            keys.append((name, bool(o.args.get("desc")), bool(o.args.get("nulls_first"))))
        visible = node.columns
        if hidden:
            assert isinstance(node, Project)
            node = Project(node.input, node.outputs + tuple(hidden))
        top: Node = TopK(
            node,
            (),
            tuple(keys),
            k,
            self.label(),
            offset=n,
            group_size=self.group_size,
            spare=self.topk_spare,
        )
        if hidden:
            top = Project(top, tuple((c, exp.column(c)) for c in visible))
        return top

    def _sort_column(
        self,
        target: exp.Expression,
        node: Node,
        sort_key: Callable[[exp.Expression], exp.Expression] | None,
        hidden: list[tuple[str, exp.Expression]],
    ) -> str:
        """The column of ``node`` an ORDER BY item sorts by: by position, by output name, or
        (``node`` a projection) an output computing the same expression, else a new hidden
        column appended to ``hidden``."""
        name = None
        if isinstance(target, exp.Literal) and not target.is_string:
            pos = int(target.this)
            if not 1 <= pos <= len(node.columns):
                raise self.error(
                    f"ORDER BY {pos}: the query has {len(node.columns)} columns", target
                )
            name = node.columns[pos - 1]
        elif (
            isinstance(target, exp.Column)
            and not target.table
            and (target.name.lower() in node.columns)
        ):
            name = target.name.lower()
        elif isinstance(node, Project):
            rewritten = sort_key(target) if sort_key is not None else None
            if rewritten is not None:
                match = [c for c, e in node.outputs if e.sql() == rewritten.sql()]
                name = match[0] if match else f"_o{len(hidden)}"
                if not match:
                    hidden.append((name, rewritten))
        if name is None:
            raise self.unsupported(
                "ORDER BY an expression that is not a column of the result (select it)",
                target,
            )
        return name

    def ranked(
        self,
        window: exp.Window,
        node: Project,
        scope: Scope,
    ) -> tuple[Project, tuple[str, ...], tuple[tuple[str, bool, bool], ...]]:
        """The partition and order columns of ``ROW_NUMBER() OVER (...)``, added to the
        projection as hidden columns when the query does not select them."""
        if not isinstance(window.this, exp.RowNumber):
            raise self.unsupported(
                f"window function {window.this.sql(dialect='spark')} (only ROW_NUMBER() "
                "filtered by <= k is maintained)",
                window,
            )
        hidden: list[tuple[str, exp.Expression]] = []

        def column(e: exp.Expression) -> str:
            resolved = self.expression(e, scope, "OVER")
            for c, out in list(node.outputs) + hidden:
                if out.sql() == resolved.sql():
                    return c
            hidden.append((f"_w{len(hidden)}", resolved))
            return hidden[-1][0]

        # each key once: PARTITION BY c, c (or two outputs of one column) is PARTITION BY c
        partition = tuple(dict.fromkeys(column(p) for p in window.args.get("partition_by") or []))
        order_node = window.args.get("order")
        if order_node is None or not order_node.expressions:
            raise self.error("ROW_NUMBER() needs ORDER BY in its OVER clause", window)
        order = tuple(
            (column(o.this), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
            for o in order_node.expressions
        )
        if window.args.get("spec") is not None:
            raise self.unsupported("a window frame on ROW_NUMBER()", window)
        return Project(node.input, node.outputs + tuple(hidden)), partition, order

    def plain(self, node: Node | Ranked) -> Node:
        """``node``; a ranking nobody bounded as its rows numbered (:meth:`numbered`)."""
        return self.numbered(node) if isinstance(node, Ranked) else node

    def numbered(self, ranked: Ranked) -> Node:
        """An unbounded ``ROW_NUMBER()``: every row numbered, a :class:`Window` (a change
        renumbers its partition)."""
        over = exp.Window(
            this=exp.RowNumber(),
            partition_by=[exp.column(p) for p in ranked.partition],
            order=exp.Order(
                expressions=[
                    exp.Ordered(this=exp.column(c), desc=d, nulls_first=nf)
                    for c, d, nf in ranked.order
                ]
            ),
        )
        calls = (WindowCall(ranked.rank, over),)
        window = Window(ranked.input, ranked.partition, calls, self.label())
        return Project(window, tuple((c, exp.column(c)) for c in ranked.columns))

    def rank_filter(
        self, ranked: Ranked, conjuncts: list[exp.Expression]
    ) -> tuple[Node, list[exp.Expression]]:
        """Turn ``rank <= k`` (or ``< k``, ``= 1``) among ``conjuncts`` into a TopK; without
        one, every row numbered (:meth:`numbered`).

        Returns:
            the TopK (projected to the visible columns and the rank), and the other conjuncts.
        """
        limit = None
        rest = []
        for c in conjuncts:
            k = rank_bound(c, ranked.rank)
            if k is not None and limit is None:
                limit = k
            else:
                rest.append(c)
        if limit is None:
            return self.numbered(ranked), rest
        if limit < 1:
            raise self.error(f"{ranked.rank} filter keeps no rows", conjuncts[0])
        top = TopK(
            ranked.input,
            ranked.partition,
            ranked.order,
            limit,
            self.label(),
            rank=ranked.rank,
            group_size=self.group_size,
            spare=self.topk_spare,
        )
        keep = ranked.visible + (ranked.rank,)
        return Project(top, tuple((c, exp.column(c)) for c in keep)), rest


def _filtered(call: _Call, where: exp.Expression) -> _Call:
    """``call FILTER (WHERE where)``: its argument is ``CASE WHEN where THEN arg END`` (``1``
    for ``COUNT(*)``), which every aggregate skips where NULL. An ORDER BY item that is the
    argument itself orders by that CASE too: the rows it keeps are ordered alike, and
    ``f(DISTINCT x) ... ORDER BY x`` stays ordered by its argument."""
    arg = exp.Case(ifs=[exp.If(this=where.copy(), true=call.arg or exp.Literal.number(1))])
    written = call.arg.sql() if call.arg is not None else None
    order = tuple((arg.copy() if e.sql() == written else e, d, nf) for e, d, nf in call.order)
    return replace(call, arg=arg, order=order)


def rank_bound(c: exp.Expression, rank: str) -> int | None:
    """``k`` when ``c`` says ``rank <= k`` (``rank < k+1``, ``rank = 1``, ``k >= rank``)."""
    while isinstance(c, exp.Paren):
        c = c.this
    if not isinstance(c, (exp.LTE, exp.LT, exp.EQ, exp.GTE, exp.GT)):
        return None
    left, right = c.this, c.expression
    flipped = isinstance(right, exp.Column) and right.name.lower() == rank
    if flipped:
        left, right = right, left
    if not (isinstance(left, exp.Column) and left.name.lower() == rank):
        return None
    k = _integer(right)
    if k is None:
        return None
    op = type(c)
    if flipped:
        op = {exp.GTE: exp.LTE, exp.GT: exp.LT, exp.LTE: exp.GTE, exp.LT: exp.GT}.get(op, op)
    if op is exp.LTE:
        return k
    if op is exp.LT:
        return k - 1
    if op is exp.EQ and k == 1:
        return 1
    return None


def _listagg_order(
    func: str, args: list[exp.Expression]
) -> tuple[list[tuple[exp.Expression, bool, bool]], list[exp.Expression]]:
    """The order of ``LISTAGG(x, sep) WITHIN GROUP (ORDER BY ...)``, which parses as an ORDER
    around ``x``, and the arguments with ``x`` unwrapped; no order for other calls."""
    if not (func == "string_agg" and args and isinstance(args[0], exp.Order)):
        return [], args
    order = [
        (o.this.copy(), bool(o.args.get("desc")), bool(o.args.get("nulls_first")))
        for o in args[0].expressions
    ]
    return order, [args[0].this, *args[1:]]


def _integer(e: exp.Expression | None) -> int | None:
    """The value of an integer literal, else None."""
    if isinstance(e, exp.Literal) and not e.is_string:
        try:
            return int(e.this)
        except ValueError:
            return None
    return None


def _non_null_literal(e: exp.Expression) -> bool:
    """Whether ``e`` is a literal other than NULL (``COUNT(1)`` counts rows)."""
    return isinstance(e, exp.Literal) and not isinstance(e, exp.Null)


def _find_column(e: exp.Expression, name: str) -> exp.Expression | None:
    """The first column of ``e`` named ``name`` (where to point an error), or None."""
    for c in e.find_all(exp.Column):
        if c.name.lower() == name:
            return c
    return None
