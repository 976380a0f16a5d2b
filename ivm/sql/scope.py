"""Name resolution and the state shared by the lowering modules (:mod:`ivm.sql.lower`,
:mod:`ivm.sql.lower_reduce`); imports neither, so they import it.

Owns the FROM items a query names (:class:`Relation`), the scope its expressions see
(:class:`Scope`: with one relation a column keeps its name, in a join column ``c`` of ``a`` is
``a__c``; after ``USING``/``NATURAL`` the columns ``*`` shows), :func:`split_conjuncts` (a
condition's conjuncts, those common to an OR's branches among them), and
:class:`LoweringContext`: one view's lowering state (view, catalog, hints, fresh labels for
stateful nodes) and its errors, each naming the construct and its ``line:col``.

Contract: :meth:`LoweringContext.expression` takes an expression as written and returns a copy
with every column resolved to its plan name; it builds no plan node. It raises ``SqlError`` for
an unknown or ambiguous column, an unknown qualifier, an aggregate outside a grouped query's
SELECT and HAVING, a window function, a subquery, a non-deterministic function and a ``*``
outside ``COUNT(*)`` or a select item.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from sqlglot import exp

from ivm.errors import SqlError
from ivm.plan.ir import CollectionKind, Node
from ivm.sql.parse import ParsedView, position, sql_error

RESERVED_PREFIX = "_ivm_"
"""Column names the engine's operators use for their own columns start with it."""
HIDDEN_PREFIX = "_ivm_sq"
"""The aliases of the joins :mod:`ivm.sql.subqueries` adds: ``SELECT *`` leaves them out."""
ONE = "__ivm_one"
"""The constant column :mod:`ivm.sql.subqueries` adds to join an uncorrelated subquery's one
row: ``SELECT *`` leaves it out."""

CatalogEntry = tuple[CollectionKind, tuple[str, ...]]
"""What the planner knows of a named collection: its kind and its (lowercase) columns."""

ANONYMOUS_AGGREGATES: dict[str, str] = {
    "every": "bool_and",
    "some": "bool_or",
    "bool_and": "bool_and",
    "bool_or": "bool_or",
    "std": "stddev_samp",
    "stddev_samp": "stddev_samp",
    "var_samp": "var_samp",
    "mean": "avg",
    "string_agg": "string_agg",
    "listagg": "string_agg",
}
"""Aggregates sqlglot parses as anonymous functions (their names in Spark) -> the canonical
aggregate each is."""


def is_aggregate(node: exp.Expression) -> bool:
    """Whether ``node`` calls an aggregate: one sqlglot knows, or one of
    :data:`ANONYMOUS_AGGREGATES` (``EVERY``, ``SOME``, ``STD``, ``MEAN`` ...)."""
    return isinstance(node, exp.AggFunc) or (
        isinstance(node, exp.Anonymous) and node.name.lower() in ANONYMOUS_AGGREGATES
    )


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


def split_conjuncts(e: exp.Expression) -> list[exp.Expression]:
    """``a AND (b AND c)`` -> ``[a, b, c]`` (parentheses around a conjunction dropped); a
    disjunction contributes the conjuncts common to all its branches (:func:`_factored`)."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.And):
        return split_conjuncts(e.this) + split_conjuncts(e.expression)
    if isinstance(e, exp.Or):
        same = _null_safe(e)
        return [same] if same is not None else _factored(e)
    return [e]


def _null_safe(e: exp.Or) -> exp.NullSafeEQ | None:
    """``a = b OR (a IS NULL AND b IS NULL)`` (either order) as ``a <=> b``: where a
    condition filters, the two keep the same rows (the first is NULL where ``<=>`` is false).
    None for any other disjunction."""
    branches = _disjuncts(e)
    if len(branches) != 2:
        return None
    for eq, nulls in (branches, branches[::-1]):
        if not isinstance(eq, exp.EQ):
            continue
        tested = [split_conjuncts(nulls)] if isinstance(nulls, (exp.And, exp.Paren)) else []
        if tested and len(tested[0]) == 2 and all(isinstance(t, exp.Is) for t in tested[0]):
            if all(isinstance(t.expression, exp.Null) for t in tested[0]):
                operands = sorted(t.this.sql(dialect="spark") for t in tested[0])
                sides = sorted(x.sql(dialect="spark") for x in (eq.this, eq.expression))
                if operands == sides:
                    return exp.NullSafeEQ(this=eq.this.copy(), expression=eq.expression.copy())
    return None


def _disjuncts(e: exp.Expression) -> list[exp.Expression]:
    """``a OR (b OR c)`` -> ``[a, b, c]``."""
    while isinstance(e, exp.Paren):
        e = e.this
    if isinstance(e, exp.Or):
        return _disjuncts(e.this) + _disjuncts(e.expression)
    return [e]


def _factored(e: exp.Or) -> list[exp.Expression]:
    """``(k AND a) OR (k AND b)`` -> ``[k, a OR b]``, and ``(k AND a) OR k`` -> ``[k]``: a
    conjunct common to every branch of a disjunction is a conjunct of the whole (distributivity
    and absorption hold in SQL's three-valued logic). So an equality written in each branch
    is a join key (TPC-H Q19), and a filter written in each branch filters its input."""
    branches = [split_conjuncts(b) for b in _disjuncts(e)]
    keyed = [{_canonical(c): c for c in b} for b in branches]
    common = [k for k in keyed[0] if all(k in b for b in keyed[1:])]
    if not common:
        return [e]
    out = [keyed[0][k] for k in common]
    rest = [[c for k, c in b.items() if k not in common] for b in keyed]
    if all(rest):  # a branch left empty is true once the common conjuncts hold
        out.append(exp.or_(*(exp.and_(*r) for r in rest)))
    return out


def _canonical(e: exp.Expression) -> str:
    """A conjunct's text, an (in)equality's operands in sorted order (``a = b`` is ``b = a``)."""
    if isinstance(e, (exp.EQ, exp.NEQ, exp.NullSafeEQ)):
        sides = sorted(x.sql(dialect="spark") for x in (e.this, e.expression))
        return f"{e.key}:{sides[0]}:{sides[1]}"
    return e.sql(dialect="spark")


@dataclass(frozen=True, slots=True)
class Relation:
    """A FROM item: the plan producing it and the qualifiers that name it."""

    node: Node
    qualifiers: frozenset[str]
    label: str  # for messages: "table orders", "view v", "subquery t"
    query: exp.Expression | None = None
    """The SQL of a subquery or CTE (None for a table): what an internal view of it runs."""

    @property
    def alias(self) -> str:
        """The qualifier naming the relation's columns in a join (``alias__column``)."""
        return min(self.qualifiers)


@dataclass(frozen=True, slots=True)
class Scope:
    """The relations a SELECT's expressions may name, and the plan names of their columns.

    With one relation a column keeps its name; in a join, column ``c`` of relation ``a`` is
    ``a__c`` in the plan, so equal names from different inputs stay apart.
    """

    relations: tuple[Relation, ...]
    visible: tuple[tuple[int, str], ...] | None = None
    """With ``JOIN ... USING`` or ``NATURAL JOIN``: the ``(relation, column)`` pairs that
    ``*`` gives and unqualified names see, in order (a USING column once); None: all."""

    @property
    def joined(self) -> bool:
        """Whether the scope has several relations (then plan names are qualified)."""
        return len(self.relations) > 1

    def internal(self, i: int, column: str) -> str:
        """The plan name of column ``column`` of relation ``i``."""
        return f"{self.relations[i].alias}__{column}" if self.joined else column

    def owner(self, internal: str) -> int:
        """The index of the relation a plan name belongs to."""
        if not self.joined:
            return 0
        for i, rel in enumerate(self.relations):
            if (
                internal.startswith(rel.alias + "__")
                and internal[len(rel.alias) + 2 :] in rel.node.columns
            ):
                return i
        raise KeyError(internal)

    @property
    def qualifiers(self) -> list[str]:
        """Every name a column may be qualified with, sorted (for messages)."""
        return sorted(q for r in self.relations for q in r.qualifiers)

    def star(self, qualifier: str | None) -> list[tuple[str, str]] | None:
        """``(output name, plan name)`` of ``*`` or ``q.*``; None if ``q`` is unknown."""
        if qualifier is None and self.visible is not None:
            return [
                (c, self.internal(i, c))
                for i, c in self.visible
                if not self.relations[i].alias.startswith(HIDDEN_PREFIX) and c != ONE
            ]
        out = []
        for i, rel in enumerate(self.relations):
            if qualifier is None and rel.alias.startswith(HIDDEN_PREFIX):
                continue  # a decorrelated subquery's join (ivm.sql.subqueries)
            if qualifier is None or qualifier in rel.qualifiers:
                out.extend((c, self.internal(i, c)) for c in rel.node.columns if c != ONE)
                if qualifier is not None:
                    return out
        return out if qualifier is None else None


class LoweringContext:
    """One view's lowering state (view, catalog, hints, labels), its errors and name
    resolution; the lowerer's base class."""

    def __init__(self, view: ParsedView, catalog: Mapping[str, CatalogEntry]) -> None:
        self.view = view
        self.catalog = catalog
        self.sql = view.sql
        self._labels = 0
        self.group_size = self._count_hint("expected_group_size", least=1)
        self.topk_spare = self._count_hint("topk_spare", least=0)

    def _count_hint(self, name: str, least: int) -> int | None:
        """The integer value of hint ``name`` (at least ``least``), or None when absent."""
        text = self.view.hints.get(name)
        if text is None:
            return None
        try:
            value = int(text.replace("_", ""))
        except ValueError:
            value = least - 1
        if value < least:
            what = "a positive integer" if least == 1 else f"an integer >= {least}"
            raise SqlError(f"hint {name} = {text!r} is not {what}", file=self.view.file)
        return value

    def label(self) -> str:
        """A fresh name for a stateful node (names its state tables)."""
        self._labels += 1
        return f"r{self._labels - 1}"

    # -- errors ----------------------------------------------------------------------------

    def error(
        self, message: str, node: exp.Expression | None, *, construct: str | None = None
    ) -> SqlError:
        """An error at ``node``'s ``line:col``; ``construct``: the unsupported construct."""
        return sql_error(
            message, node, self.sql, unsupported=construct is not None, construct=construct
        ).located(self.view.file)

    def unsupported(self, construct: str, node: exp.Expression | None) -> SqlError:
        """The error refusing ``construct`` by name, at ``node``."""
        return self.error(
            f"{construct} is not supported (see the README's list of maintained SQL)",
            node,
            construct=construct,
        )

    def _located(self, node: object, fallback: exp.Expression) -> exp.Expression:
        """``node`` if sqlglot recorded where it is, else ``fallback``."""
        if isinstance(node, exp.Expression) and position(node, self.sql)[0] is not None:
            return node
        return fallback

    # -- names -----------------------------------------------------------------------------

    def check_qualifier(self, qualifier: str, node: exp.Expression, rel: Scope) -> None:
        """Refuse a qualifier (``q.c``, ``q.*``) that names no relation of the scope."""
        if qualifier.lower() not in rel.qualifiers:
            raise self.error(
                f"unknown table or alias {qualifier!r} in {node.sql(dialect='spark')!r} "
                f"(in scope: {', '.join(rel.qualifiers)})",
                node,
            )

    def expression(
        self,
        e: exp.Expression,
        rel: Scope,
        clause: str,
        *,
        aggregates: bool = False,
        placed: frozenset[str] = frozenset(),
    ) -> exp.Expression:
        """Validate ``e`` and return it with columns resolved to unqualified input names.

        Args:
            aggregates: aggregate calls are allowed (SELECT and HAVING of a grouped query).
            placed: plan names an unqualified column may hold already (a window call's
                value, :mod:`ivm.sql.windows`): kept as they are.
        """
        for node in e.walk():
            self._refuse_in_expression(node, clause, aggregates)

        def resolved(node: exp.Expression) -> exp.Expression:
            if isinstance(node, exp.Column) and not node.table and node.name in placed:
                return node
            return self._resolved(node, rel)

        return e.copy().transform(resolved)

    def _refuse_in_expression(self, node: exp.Expression, clause: str, aggregates: bool) -> None:
        """Raise for a node no expression of ``clause`` may hold."""
        if is_aggregate(node) and not aggregates:
            name = node.name if isinstance(node, exp.Anonymous) else node.key
            raise self.error(
                f"aggregate function {name.upper()} in {clause}",
                node,
                construct=f"aggregate in {clause}",
            )
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
        if isinstance(node, exp.Star) and not (
            isinstance(node.parent, exp.Column)
            or (aggregates and isinstance(node.parent, exp.Count))
        ):
            raise self.error(f"'*' is not allowed in {clause} expressions", node)

    def _resolved(self, node: exp.Expression, rel: Scope) -> exp.Expression:
        """A column reference as its plan name in ``rel``; any other node as it is."""
        if not isinstance(node, exp.Column):
            return node
        name = node.name.lower()
        if node.table:
            self.check_qualifier(node.table, node, rel)
            candidates = [
                i for i, r in enumerate(rel.relations) if node.table.lower() in r.qualifiers
            ]
        else:
            candidates = [i for i, r in enumerate(rel.relations) if name in r.node.columns]
            if rel.visible is not None:  # a USING column is one of them
                candidates = [i for i in candidates if (i, name) in rel.visible]
            if len(candidates) > 1:
                owners = ", ".join(rel.relations[i].alias for i in candidates)
                raise self.error(
                    f"column {name!r} is ambiguous: it is in {owners}; qualify it", node
                )
        if not candidates or name not in rel.relations[candidates[0]].node.columns:
            where = rel.relations[candidates[0]] if candidates else None
            label = where.label if where else " or ".join(r.label for r in rel.relations)
            columns = (
                where.node.columns if where else [c for r in rel.relations for c in r.node.columns]
            )
            raise self.error(
                f"unknown column {node.sql(dialect='spark')!r} in {label} "
                f"(columns: {', '.join(columns)})",
                node,
            )
        return exp.column(rel.internal(candidates[0], name))
