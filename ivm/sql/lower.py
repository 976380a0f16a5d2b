"""Lowering: a parsed view's sqlglot AST -> a plan IR tree (:mod:`ivm.plan.ir`).

Owns name resolution (tables, aliases, CTEs, columns, ``*``), the list of SQL constructs the
planner supports, and the errors for everything else: each names the construct and its
``line:col``. The result is demand-pruned: every ``Get`` reads only the columns used.

Contract in ``(data, time, diff)`` terms: the returned plan, applied to the updates of its
inputs, yields the updates of the view; this holds because every construct admitted here
is linear and deterministic (see :mod:`ivm.plan.ir`). Constructs that are not (aggregates,
joins, DISTINCT, LIMIT, window functions, non-deterministic functions) are rejected by name.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from ivm.errors import SqlError
from ivm.plan.ir import (
    CollectionKind,
    Filter,
    Get,
    Node,
    Project,
    UnionAll,
    collections,
    demand,
    simplify,
)
from ivm.sql.parse import ParsedView, position, sql_error

CatalogEntry = tuple[CollectionKind, tuple[str, ...]]
"""What the planner knows of a named collection: its kind and its (lowercase) columns."""

_NONDETERMINISTIC_ANONYMOUS = {
    "monotonically_increasing_id",
    "spark_partition_id",
    "input_file_name",
    "input_file_block_start",
    "input_file_block_length",
    "now",
    "shuffle",
    "random",
    "uuid",
}

# Clauses of a SELECT that this release does not maintain, with the name the user knows them by.
RESERVED_COLUMNS = ("_time", "_diff")
"""Column names the engine uses for the time and diff of every update."""

_UNSUPPORTED_CLAUSES = {
    "joins": "JOIN",
    "laterals": "LATERAL VIEW",
    "group": "GROUP BY",
    "having": "HAVING",
    "qualify": "QUALIFY",
    "windows": "WINDOW clause",
    "limit": "LIMIT",
    "offset": "OFFSET",
    "distinct": "SELECT DISTINCT",
    "pivots": "PIVOT",
    "sample": "TABLESAMPLE",
    "connect": "CONNECT BY",
    "distribute": "DISTRIBUTE BY",
    "cluster": "CLUSTER BY",
    "sort": "SORT BY",
}


def _arg(node: exp.Expression, key: str) -> object:
    return node.args.get(key) or node.args.get(key + "_")


@dataclass(frozen=True, slots=True)
class _Relation:
    """A FROM item: the plan producing it and the qualifiers that name it."""

    node: Node
    qualifiers: frozenset[str]
    label: str  # for messages: "table orders", "view v", "subquery t"


class _Lowerer:
    def __init__(self, view: ParsedView, catalog: Mapping[str, CatalogEntry]) -> None:
        self.view = view
        self.catalog = catalog
        self.sql = view.sql

    def error(
        self, message: str, node: exp.Expression | None, *, construct: str | None = None
    ) -> SqlError:
        return sql_error(
            message, node, self.sql, unsupported=construct is not None, construct=construct
        ).located(self.view.file)

    def unsupported(self, construct: str, node: exp.Expression | None) -> SqlError:
        return self.error(
            f"{construct} is not supported yet (this release maintains projections, WHERE, "
            f"UNION ALL and views over views)",
            node,
            construct=construct,
        )

    # -- queries ---------------------------------------------------------------------------

    def query(
        self, q: exp.Expression, ctes: Mapping[str, Node], *, need_names: bool = True
    ) -> Node:
        """Lower a query. ``need_names=False`` for UNION branches after the first, whose
        column names SQL ignores (the first branch names the columns)."""
        with_ = _arg(q, "with")
        if isinstance(with_, exp.With):
            if with_.args.get("recursive"):
                raise self.unsupported("WITH RECURSIVE", with_)
            scope = dict(ctes)
            for cte in with_.expressions:
                scope[cte.alias_or_name.lower()] = self.query(cte.this, scope)
            ctes = scope
        if isinstance(q, exp.Subquery):
            return self.query(q.this, ctes, need_names=need_names)
        if isinstance(q, exp.Union):
            if q.args.get("distinct"):
                raise self.unsupported("UNION (distinct; use UNION ALL)", q.expression)
            if q.args.get("by_name"):
                raise self.unsupported("UNION ALL BY NAME", q.expression)
            return self.union_all(q, ctes, need_names=need_names)
        if isinstance(q, exp.Intersect):
            raise self.unsupported("INTERSECT", q.expression)
        if isinstance(q, exp.Except):
            raise self.unsupported("EXCEPT", q.expression)
        if isinstance(q, exp.Select):
            return self.select(q, ctes, need_names=need_names)
        raise self.unsupported(type(q).__name__.upper(), q)

    def union_all(self, q: exp.Union, ctes: Mapping[str, Node], *, need_names: bool = True) -> Node:
        branches: list[Node] = []
        for i, side in enumerate((q.this, q.expression)):
            node = self.query(side, ctes, need_names=need_names and i == 0)
            if isinstance(node, UnionAll) and not isinstance(side, exp.Subquery):
                branches.extend(node.branches)
            else:
                branches.append(node)
        if q.args.get("order") or q.args.get("limit"):
            raise self.unsupported("ORDER BY/LIMIT on a UNION", q)
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
        for key, construct in _UNSUPPORTED_CLAUSES.items():
            value = _arg(s, key)
            if value:
                at = value[0] if isinstance(value, list) else value
                if key == "joins" and isinstance(at, exp.Join):
                    construct = self._join_name(at)
                raise self.unsupported(construct, self._located(at, s))
        from_ = _arg(s, "from")
        if not isinstance(from_, exp.From):
            raise self.unsupported("SELECT without FROM", s)
        rel = self.relation(from_.this, ctes)
        node: Node = rel.node
        where = _arg(s, "where")
        if isinstance(where, exp.Where):
            node = Filter(node, self.expression(where.this, rel, "WHERE"))
        outputs: list[tuple[str, exp.Expression]] = []
        for item in s.expressions:
            outputs.extend(self.select_item(item, rel, need_names=need_names))
        if not need_names:  # positional branch: any unique names do
            outputs = [(f"_c{i}", e) for i, (_, e) in enumerate(outputs)]
        seen: dict[str, exp.Expression] = {}
        for (name, _), item in zip(outputs, self._items_for(s, rel), strict=False):
            if name in RESERVED_COLUMNS:
                raise self.error(
                    f"column name {name!r} is reserved for the engine's updates; rename it", item
                )
            if name in seen:
                raise self.error(
                    f"duplicate output column {name!r}: give one of them another alias", item
                )
            seen[name] = item
        # ORDER BY without LIMIT does not change a multiset: a view has no order.
        return Project(node, tuple(outputs))

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

    def _located(self, node: object, fallback: exp.Expression) -> exp.Expression:
        """``node`` if sqlglot recorded where it is, else ``fallback``."""
        if isinstance(node, exp.Expression) and position(node, self.sql)[0] is not None:
            return node
        return fallback

    def _items_for(self, s: exp.Select, rel: _Relation) -> list[exp.Expression]:
        out: list[exp.Expression] = []
        for item in s.expressions:
            if isinstance(item, exp.Star) or (
                isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
            ):
                out.extend([item] * len(rel.node.columns))
            else:
                out.append(item)
        return out

    def relation(self, item: exp.Expression, ctes: Mapping[str, Node]) -> _Relation:
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
                return _Relation(ctes[name], qualifiers, f"CTE {name}")
            entry = self.catalog.get(name)
            if entry is None:
                known = ", ".join(sorted(self.catalog)) or "none"
                raise self.error(f"unknown table {name!r} (sources and views: {known})", item)
            kind, columns = entry
            if name == self.view.name:
                raise self.error(f"view {name!r} refers to itself", item)
            return _Relation(Get(name, kind, columns), qualifiers, f"{kind} {name}")
        if isinstance(item, exp.Subquery):
            if not item.alias:
                raise self.error("a subquery in FROM needs an alias", item)
            node = self.query(item.this, ctes)
            return _Relation(node, frozenset({item.alias.lower()}), f"subquery {item.alias}")
        raise self.unsupported(f"FROM {type(item).__name__}", item)

    # -- expressions -----------------------------------------------------------------------

    def select_item(
        self, item: exp.Expression, rel: _Relation, *, need_names: bool = True
    ) -> list[tuple[str, exp.Expression]]:
        if isinstance(item, exp.Star) or (
            isinstance(item, exp.Column) and isinstance(item.this, exp.Star)
        ):
            if isinstance(item, exp.Column) and item.table:
                self.check_qualifier(item.table, item, rel)
            return [(c, exp.column(c)) for c in rel.node.columns]
        if isinstance(item, exp.Alias):
            name = item.alias.lower()
            return [(name, self.expression(item.this, rel, "SELECT"))]
        if isinstance(item, exp.Column):
            resolved = self.expression(item, rel, "SELECT")
            return [(resolved.name, resolved)]
        if not need_names:
            return [("_c", self.expression(item, rel, "SELECT"))]
        raise self.error(
            f"expression {item.sql(dialect='spark')!r} needs a column name: add AS name", item
        )

    def check_qualifier(self, qualifier: str, node: exp.Expression, rel: _Relation) -> None:
        if qualifier.lower() not in rel.qualifiers:
            raise self.error(
                f"unknown table or alias {qualifier!r} in {node.sql(dialect='spark')!r} "
                f"(in scope: {', '.join(sorted(rel.qualifiers))})",
                node,
            )

    def expression(self, e: exp.Expression, rel: _Relation, clause: str) -> exp.Expression:
        """Validate ``e`` and return it with columns resolved to unqualified input names."""
        for node in e.walk():
            if isinstance(node, exp.AggFunc):
                raise self.unsupported(f"aggregate function {node.key.upper()}", node)
            if isinstance(node, exp.Window):
                raise self.unsupported("window function (OVER)", node)
            if isinstance(node, (exp.Subquery, exp.Exists)) or (
                isinstance(node, exp.In) and node.args.get("query")
            ):
                raise self.unsupported(f"subquery in {clause}", node)
            if isinstance(node, (exp.Rand, exp.Randn, exp.Uuid)) or type(node).__name__.startswith(
                "Current"
            ):
                raise self.error(
                    f"{node.sql(dialect='spark')} is not deterministic: a view must give the "
                    "same row for the same input, or deletes could not retract it",
                    node,
                    construct=type(node).__name__,
                )
            if isinstance(node, exp.Anonymous) and node.name.lower() in _NONDETERMINISTIC_ANONYMOUS:
                raise self.error(
                    f"{node.name}() is not deterministic: a view must give the same row for "
                    "the same input",
                    node,
                    construct=node.name,
                )
            if isinstance(node, exp.Star) and not isinstance(node.parent, exp.Column):
                raise self.error(f"'*' is not allowed in {clause} expressions", node)

        def resolve(node: exp.Expression) -> exp.Expression:
            if not isinstance(node, exp.Column):
                return node
            if node.table:
                self.check_qualifier(node.table, node, rel)
            name = node.name.lower()
            if name not in rel.node.columns:
                raise self.error(
                    f"unknown column {node.sql(dialect='spark')!r} in {rel.label} "
                    f"(columns: {', '.join(rel.node.columns)})",
                    node,
                )
            return exp.column(name)

        return e.copy().transform(resolve)


def lower_view(view: ParsedView, catalog: Mapping[str, CatalogEntry]) -> Node:
    """Lower a parsed view to a demand-pruned plan.

    Args:
        view: the parsed file.
        catalog: every source and already-planned view by lowercase name.

    Raises:
        SqlError: an unknown table or column, or a construct the planner does not support;
            the message names the file, line and column.
    """
    lowerer = _Lowerer(view, catalog)
    node = simplify(demand(lowerer.query(view.query, {})))
    for get in collections(node):
        clash = set(get.columns) & set(RESERVED_COLUMNS)
        if clash:
            raise SqlError(
                f"{get.kind} {get.collection!r} has a column named {sorted(clash)[0]!r}, which "
                "is reserved for the engine's updates; select other columns or rename it",
                file=view.file,
            )
    return node


def referenced_tables(view: ParsedView) -> set[str]:
    """Names of the tables (sources or views) a view reads, CTE names excluded."""
    cte_names = {c.alias_or_name.lower() for c in view.query.find_all(exp.CTE)}
    return {t.name.lower() for t in view.query.find_all(exp.Table)} - cte_names
