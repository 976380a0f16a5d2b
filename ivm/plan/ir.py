"""The plan IR: small immutable relational nodes over collections of updates.

Every node denotes a collection of ``(data, time, diff)`` updates and has a derived ``columns``
tuple (the data part; ``_time`` and ``_diff`` are implicit). Nodes are validated when built, so
a bad plan fails in the planner, never inside a Spark job.

Algebra the stateless nodes rely on (why they can be applied to updates directly): each is
*linear*, ``op(A + B) = op(A) + op(B)`` and ``op(-A) = -op(A)``, and acts on every update
independently of the others, keeping its time and diff:

- ``Get``: the updates of a source or a view, restricted to the columns some consumer needs.
- ``Filter``: keeps ``(d, t, r)`` where the predicate holds on ``d`` (NULL counts as false).
- ``Project``: maps ``(d, t, r)`` to ``(f(d), t, r)``; ``f`` must be deterministic, or a
  retraction would not cancel the insertion it retracts.
- ``UnionAll``: the concatenation of its inputs' updates (positional columns).

Expressions are sqlglot expressions whose column references are unqualified input column names.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from ivm.errors import InvariantViolation

CollectionKind = Literal["source", "view"]


def _check_unique(columns: tuple[str, ...], where: str) -> None:
    seen: set[str] = set()
    for c in columns:
        if c in seen:
            raise InvariantViolation(f"{where}: duplicate output column {c!r}")
        seen.add(c)


def referenced_columns(expression: exp.Expression) -> set[str]:
    """Names of the input columns an expression reads."""
    return {c.name for c in expression.find_all(exp.Column)}


@dataclass(frozen=True, slots=True)
class Get:
    """The updates of a collection, restricted to ``columns`` (demand analysis)."""

    collection: str
    kind: CollectionKind
    columns: tuple[str, ...]

    def __post_init__(self) -> None:
        if not self.columns:
            raise InvariantViolation(f"Get {self.collection}: no columns")
        _check_unique(self.columns, f"Get {self.collection}")

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()


@dataclass(frozen=True, slots=True)
class Filter:
    """Keeps the updates whose data satisfies ``predicate``."""

    input: Node
    predicate: exp.Expression

    def __post_init__(self) -> None:
        missing = referenced_columns(self.predicate) - set(self.input.columns)
        if missing:
            raise InvariantViolation(f"Filter reads unknown columns {sorted(missing)}")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


@dataclass(frozen=True, slots=True)
class Project:
    """Maps each update's data to ``outputs`` (name, expression) pairs."""

    input: Node
    outputs: tuple[tuple[str, exp.Expression], ...]

    def __post_init__(self) -> None:
        _check_unique(self.columns, "Project")
        available = set(self.input.columns)
        for name, expression in self.outputs:
            missing = referenced_columns(expression) - available
            if missing:
                raise InvariantViolation(f"Project {name}: reads unknown columns {sorted(missing)}")

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.outputs)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)

    def is_identity(self) -> bool:
        """True when this projection passes its input through unchanged."""
        return self.columns == self.input.columns and all(
            isinstance(e, exp.Column) and e.name == n for n, e in self.outputs
        )


@dataclass(frozen=True, slots=True)
class UnionAll:
    """The concatenation of its inputs' updates; columns are positional, named by the first."""

    branches: tuple[Node, ...]

    def __post_init__(self) -> None:
        if len(self.branches) < 2:
            raise InvariantViolation("UnionAll needs at least two inputs")
        width = len(self.branches[0].columns)
        for b in self.branches[1:]:
            if len(b.columns) != width:
                raise InvariantViolation("UnionAll inputs differ in width")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.branches[0].columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.branches


Node = Get | Filter | Project | UnionAll


def collections(node: Node) -> list[Get]:
    """Every ``Get`` under ``node``, left to right."""
    if isinstance(node, Get):
        return [node]
    out: list[Get] = []
    for child in node.inputs:
        out.extend(collections(child))
    return out


def demand(node: Node, needed: tuple[str, ...] | None = None) -> Node:
    """Push column demand down to the ``Get`` nodes (projection pushdown).

    Args:
        node: the plan.
        needed: the columns consumers read from ``node``; ``None`` means all of them.

    Returns:
        An equivalent plan whose ``Get`` nodes keep only the columns something reads, and whose
        projections compute only the columns something reads.
    """
    want = set(node.columns if needed is None else needed)
    if isinstance(node, Get):
        kept = tuple(c for c in node.columns if c in want) or node.columns[:1]
        return Get(node.collection, node.kind, kept)
    if isinstance(node, Filter):
        child_need = want | referenced_columns(node.predicate)
        child = demand(node.input, tuple(c for c in node.input.columns if c in child_need))
        return Filter(child, node.predicate)
    if isinstance(node, Project):
        outputs = tuple((n, e) for n, e in node.outputs if n in want) or node.outputs[:1]
        child_need: set[str] = set()
        for _, e in outputs:
            child_need |= referenced_columns(e)
        child = demand(node.input, tuple(c for c in node.input.columns if c in child_need))
        return Project(child, outputs)
    # UnionAll: positional, so every branch keeps the same positions.
    positions = [i for i, c in enumerate(node.columns) if c in want]
    branches = []
    for b in node.branches:
        names = tuple(b.columns[i] for i in positions)
        pruned = demand(b, names)
        if pruned.columns != names:
            pruned = Project(pruned, tuple((n, exp.column(n)) for n in names))
        branches.append(pruned)
    return UnionAll(tuple(branches))


def _substitute(e: exp.Expression, by: dict[str, exp.Expression]) -> exp.Expression:
    def sub(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in by:
            inner = by[node.name].copy()
            atomic = isinstance(inner, (exp.Column, exp.Literal, exp.Paren, exp.Func))
            return inner if atomic else exp.Paren(this=inner)
        return node

    return e.copy().transform(sub)


def simplify(node: Node) -> Node:
    """Fuse adjacent stateless operators: Project∘Project, Filter∘Filter, identity projections.

    Fusing is exact because each operator is a pure per-update function (see module doc);
    it saves Spark nothing (Catalyst fuses too) but keeps EXPLAIN as short as the SQL.
    """
    if isinstance(node, Get):
        return node
    if isinstance(node, UnionAll):
        return UnionAll(tuple(simplify(b) for b in node.branches))
    child = simplify(node.input)
    if isinstance(node, Filter):
        if isinstance(child, Filter):
            return Filter(child.input, exp.and_(child.predicate, node.predicate))
        return Filter(child, node.predicate)
    if isinstance(child, Project):
        by = dict(child.outputs)
        return simplify(
            Project(child.input, tuple((n, _substitute(e, by)) for n, e in node.outputs))
        )
    fused = Project(child, node.outputs)
    return child if fused.is_identity() else fused
