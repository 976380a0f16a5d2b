"""The plan IR: small immutable relational nodes over collections of updates.

Every node denotes a collection of ``(data, time, diff)`` updates and has a derived ``columns``
tuple (the data part; ``_time`` and ``_diff`` are implicit). Nodes are validated when built, so
a bad plan fails in the planner, never inside a Spark job.

Algebra the stateless nodes rely on (why they can be applied to updates directly): each is
*linear*, ``op(A + B) = op(A) + op(B)`` and ``op(-A) = -op(A)``, and acts on every update
independently of the others, keeping its time and diff:

- ``Get``: the updates of a source or a view, restricted to the columns some consumer needs.
- ``Constant``: rows written in the view itself (``VALUES``, a ``SELECT`` without ``FROM``):
  each ``+1`` at the time of the view's build, no update after it.
- ``Filter``: keeps ``(d, t, r)`` where the predicate holds on ``d`` (NULL counts as false).
- ``Project``: maps ``(d, t, r)`` to ``(f(d), t, r)``; ``f`` must be deterministic, or a
  retraction would not cancel the insertion it retracts.
- ``UnionAll``: the concatenation of its inputs' updates (positional columns).

The stateful nodes are not linear; each keeps state of its own (see :mod:`ivm.plan.reduce`):

- ``Reduce``: GROUP BY with aggregates (and SELECT DISTINCT, UNION: a reduce without any).
- ``SetOp``: INTERSECT / EXCEPT [ALL]: per-row counts of both sides and a threshold.
- ``TopK``: ``ORDER BY ... LIMIT k`` and ``ROW_NUMBER() OVER (PARTITION BY ...) <= k``.
- ``Window``: window functions, each row with its values over its partition.

Expressions are sqlglot expressions whose column references are unqualified input column names.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, replace
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
class Constant:
    """Rows the view's SQL writes out (``VALUES``; one row of no table for a ``SELECT`` without
    ``FROM``): each row's expressions read no column and are deterministic, so the collection
    is its rows, each ``+1`` at the build, and has no update after it (a refresh's updates of
    a constant are none). Its column types are Spark's for ``VALUES`` with these rows."""

    columns: tuple[str, ...]
    rows: tuple[tuple[exp.Expression, ...], ...]

    def __post_init__(self) -> None:
        if not self.columns or not self.rows:
            raise InvariantViolation("Constant: no column or no row")
        _check_unique(self.columns, "Constant")
        if any(len(r) != len(self.columns) for r in self.rows):
            raise InvariantViolation("Constant: a row's width differs from its columns'")
        if any(referenced_columns(e) for r in self.rows for e in r):
            raise InvariantViolation("Constant: a row reads a column")

    @property
    def inputs(self) -> tuple[Node, ...]:
        return ()

    @property
    def key(self) -> str:
        """Its name among a render's inputs (the same rows and columns, the same key)."""
        text = repr((self.columns, [[e.sql() for e in r] for r in self.rows]))
        return "__ivm_values_" + hashlib.sha256(text.encode()).hexdigest()[:16]

    def kept(self, names: tuple[str, ...]) -> Constant:
        """Only the columns ``names`` (in its order), every row kept."""
        at = [i for i, c in enumerate(self.columns) if c in names] or [0]
        return Constant(
            tuple(self.columns[i] for i in at), tuple(tuple(r[i] for i in at) for r in self.rows)
        )


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


ColumnRef = tuple[int, str]
"""A join input's column: ``(input index, output column name)``."""


@dataclass(frozen=True, slots=True)
class JoinInput:
    """One input of a join: a collection, its own filter, and the columns it contributes.

    The filter and map apply to the collection's rows (or updates) before they meet the
    other inputs, so the arrangement a lookup reads can be the *unfiltered* collection,
    shared by every view that needs it by the same key.

    Attributes:
        get: the collection, with the columns this input reads.
        alias: the name the SQL gives it (for EXPLAIN and messages).
        predicate: a filter on ``get``'s columns, or None.
        outputs: ``(name, expression over get's columns)``; names are unique in the join.
    """

    get: Get
    alias: str
    predicate: exp.Expression | None
    outputs: tuple[tuple[str, exp.Expression], ...]

    def __post_init__(self) -> None:
        available = set(self.get.columns)
        used = set().union(*(referenced_columns(e) for _, e in self.outputs))
        if self.predicate is not None:
            used |= referenced_columns(self.predicate)
        if used - available:
            raise InvariantViolation(
                f"join input {self.alias}: unknown columns {sorted(used - available)}"
            )

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.outputs)

    def source_column(self, name: str) -> str | None:
        """The collection column an output passes through unchanged, if it is one."""
        for n, e in self.outputs:
            if n == name and isinstance(e, exp.Column):
                return e.name
        return None


@dataclass(frozen=True, slots=True)
class Join:
    """An inner equi-join: the product of its inputs restricted to equal keys and residuals.

    Algebra: the join is *bilinear* in each pair of inputs, so for a change at one time,
    ``Δ(A ⋈ B) = ΔA ⋈ B_old + A_new ⋈ ΔB`` (and for n inputs one such term per input, inputs
    before it at the new time, after it at the old: each combination of changes counted once).
    Diffs multiply: ``(a, t, r) ⋈ (b, t, s) = ((a, b), t, r * s)``.

    Attributes:
        inputs: the join's inputs, in FROM order.
        equivalences: classes of columns constrained to be equal (each of >= 2 inputs).
        residual: other conjuncts over several inputs' columns, applied once all are joined.
    """

    inputs: tuple[JoinInput, ...]
    equivalences: tuple[tuple[ColumnRef, ...], ...]
    residual: tuple[exp.Expression, ...] = ()
    preserve: tuple[int, ...] = ()
    """Inputs whose unmatched rows are kept, padded with NULLs: (0,) LEFT, (1,) RIGHT,
    (0, 1) FULL OUTER JOIN; outer joins have two inputs and no residual."""
    null_safe: tuple[bool, ...] = ()
    """Per equivalence class, whether NULL matches NULL in it (``a <=> b``); empty: none
    does."""

    def __post_init__(self) -> None:
        if len(self.inputs) < 2:
            raise InvariantViolation("a join needs at least two inputs")
        if self.null_safe and len(self.null_safe) != len(self.equivalences):
            raise InvariantViolation("a join's null_safe flags are one per equivalence class")
        if self.preserve and (len(self.inputs) != 2 or self.residual):
            raise InvariantViolation("an outer join has two inputs and only key conditions")
        _check_unique(self.columns, "Join")
        for cls in self.equivalences:
            for i, c in cls:
                if c not in self.inputs[i].columns:
                    raise InvariantViolation(f"join key {c!r} is not a column of input {i}")
        known = set(self.columns)
        for r in self.residual:
            if referenced_columns(r) - known:
                raise InvariantViolation("join residual reads unknown columns")

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(c for inp in self.inputs for c in inp.columns)

    def class_null_safe(self, i: int) -> bool:
        """Whether equivalence class ``i`` matches NULL with NULL."""
        return bool(self.null_safe) and self.null_safe[i]

    def owner(self, column: str) -> int:
        """Index of the input that produces ``column``."""
        for i, inp in enumerate(self.inputs):
            if column in inp.columns:
                return i
        raise InvariantViolation(f"no join input has column {column!r}")


@dataclass(frozen=True, slots=True)
class SemiJoin:
    """Rows of ``input`` with a match in ``other`` on ``keys`` (``anti``: with none).

    ``EXISTS``, ``NOT EXISTS`` and ``IN (subquery)`` lower to this. Not bilinear: an ``other``
    change flips the rows of ``input`` whose key's match count crosses zero, so it is
    maintained with per-key counts read from ``other``'s arrangement at the old and new times
    (see :mod:`ops.join.spark`). NULL keys match nothing, as SQL's equality says.

    Attributes:
        input: the rows kept or dropped; its outputs are the node's columns.
        other: the subquery's collection, its own filter, and its key columns as outputs.
        keys: ``(input column, other column)`` pairs that must be equal.
        anti: keep the rows *without* a match.
    """

    input: JoinInput
    other: JoinInput
    keys: tuple[tuple[str, str], ...]
    anti: bool
    null_aware: bool = False
    """``x NOT IN (subquery)``: no row at all if the subquery yields a NULL, every row (NULL
    ``x`` included) if it yields nothing, else the rows whose non-NULL ``x`` has no match.
    Maintained with the subquery's row and NULL counts as state (table ``<label>.not_in``)."""
    label: str = ""

    def __post_init__(self) -> None:
        if not self.keys:
            raise InvariantViolation("a semi-join needs at least one key equality")
        for mine, theirs in self.keys:
            if mine not in self.input.columns or theirs not in self.other.columns:
                raise InvariantViolation(f"semi-join key {mine} = {theirs} is not in its inputs")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns

    @property
    def as_join(self) -> Join:
        """The same two inputs as a join (for path planning and arrangements)."""
        return Join((self.input, self.other), tuple(((0, a), (1, b)) for a, b in self.keys))


AggKind = Literal["accumulable", "hierarchical", "basic"]

ACCUMULABLE_FUNCS = frozenset(
    {
        "count",
        "sum",
        "avg",
        "stddev_samp",
        "stddev_pop",
        "var_samp",
        "var_pop",
        "bool_and",
        "bool_or",
    }
)
HIERARCHICAL_FUNCS = frozenset({"min", "max"})
BASIC_FUNCS = frozenset({"string_agg", "median", "percentile_cont", "percentile_disc"})


@dataclass(frozen=True, slots=True)
class Aggregate:
    """One aggregate of a :class:`Reduce`.

    Attributes:
        name: its output column.
        func: the canonical function name (``count``, ``sum``, ``min``, ``string_agg``...).
        arg: the input column it reads; None for ``COUNT(*)``.
        distinct: ``func(DISTINCT arg)``.
        params: literal parameters: the separator of ``string_agg``, the fraction of a
            percentile.
        order: ``(column, descending, nulls_first)`` of ``WITHIN GROUP (ORDER BY ...)``.
    """

    name: str
    func: str
    arg: str | None
    distinct: bool = False
    params: tuple[object, ...] = ()
    order: tuple[tuple[str, bool, bool], ...] = ()

    def __post_init__(self) -> None:
        if self.func not in ACCUMULABLE_FUNCS | HIERARCHICAL_FUNCS | BASIC_FUNCS:
            raise InvariantViolation(f"unknown aggregate {self.func!r}")
        if self.arg is None and self.func != "count":
            raise InvariantViolation(f"{self.func} needs an argument")

    @property
    def kind(self) -> AggKind:
        """Accumulable (sums of contributions), hierarchical (MIN/MAX) or basic."""
        if self.func in ACCUMULABLE_FUNCS:
            return "accumulable"
        if self.func in HIERARCHICAL_FUNCS:
            return "hierarchical"
        return "basic"

    @property
    def reads(self) -> set[str]:
        return ({self.arg} if self.arg else set()) | {o[0] for o in self.order}

    def describe(self) -> str:
        arg = "*" if self.arg is None else self.arg
        inner = ("DISTINCT " if self.distinct else "") + arg
        extra = "".join(f", {p!r}" for p in self.params)
        return f"{self.func}({inner}{extra})"


@dataclass(frozen=True, slots=True)
class Reduce:
    """GROUP BY ``keys`` with ``aggregates``; no aggregates means DISTINCT over ``keys``.

    Output: one row per group that has input rows (``keys..., aggregates...``); with no
    keys, one row even over empty input (SQL). Not linear: maintained from per-group state,
    see :mod:`ivm.plan.reduce` for the branches it is factored into. No aggregate reads a
    key column (an aggregate of a key reads a copy of it): state keyed by group and value
    names each column once.

    Attributes:
        label: a name unique within the view (``r0``, ``r1``...), naming its state tables.
        group_size: the expected number of distinct values per group (towers' height).
        monotonic: its input only ever grows (append-only sources): no towers needed.
    """

    input: Node
    keys: tuple[str, ...]
    aggregates: tuple[Aggregate, ...]
    label: str
    group_size: int | None = None
    monotonic: bool = False

    def __post_init__(self) -> None:
        _check_unique(self.columns, "Reduce")
        missing = (set(self.keys) | {c for a in self.aggregates for c in a.reads}) - set(
            self.input.columns
        )
        if missing:
            raise InvariantViolation(f"Reduce reads unknown columns {sorted(missing)}")
        keyed = sorted({c for a in self.aggregates for c in a.reads} & set(self.keys))
        if keyed:  # its state, keyed by group and value, would hold the column twice
            raise InvariantViolation(f"Reduce aggregates read group keys {keyed}")
        if not self.keys and not self.aggregates:
            raise InvariantViolation("a Reduce needs keys or aggregates")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.keys + tuple(a.name for a in self.aggregates)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


SetOpKind = Literal["intersect", "except"]


@dataclass(frozen=True, slots=True)
class SetOp:
    """``left INTERSECT|EXCEPT [ALL] right``: rows with their multiplicity thresholded.

    With ``ca``/``cb`` a row's counts in ``left``/``right``: INTERSECT ALL keeps
    ``min(ca, cb)`` copies, EXCEPT ALL ``max(ca - cb, 0)``, INTERSECT one if both are
    positive, EXCEPT one if ``ca > 0 = cb``. NULLs compare equal, as in SQL set operations.
    """

    left: Node
    right: Node
    op: SetOpKind
    all: bool
    label: str

    def __post_init__(self) -> None:
        if len(self.left.columns) != len(self.right.columns):
            raise InvariantViolation(f"{self.op.upper()} inputs differ in width")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.left.columns

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.left, self.right)


@dataclass(frozen=True, slots=True)
class TopK:
    """The first ``limit`` rows of each ``partition`` group in ``order``.

    ``ORDER BY ... LIMIT k`` has no partition; ``ROW_NUMBER() OVER (PARTITION BY p ORDER BY
    o) <= k`` has one, and ``rank`` names the row-number column when the query selects it.
    Ties are broken by the remaining columns (ascending), so the result is deterministic.
    Maintained with a buffer of the first rows, or a tower of top-k reductions over a stateful
    input (:mod:`ivm.plan.reduce`).

    Attributes:
        order: ``(column, descending, nulls_first)`` triples.
        offset: rows ranked ``offset + 1 .. offset + limit`` are kept (``LIMIT k OFFSET n``).
        spare: rows a buffered TopK keeps per group beyond ``offset + limit`` (a hint).
    """

    input: Node
    partition: tuple[str, ...]
    order: tuple[tuple[str, bool, bool], ...]
    limit: int
    label: str
    rank: str | None = None
    offset: int = 0
    group_size: int | None = None
    monotonic: bool = False
    spare: int | None = None

    def __post_init__(self) -> None:
        if self.limit < 1:
            raise InvariantViolation("TopK needs a positive limit")
        missing = (set(self.partition) | {o[0] for o in self.order}) - set(self.input.columns)
        if missing:
            raise InvariantViolation(f"TopK reads unknown columns {sorted(missing)}")
        if len(set(self.partition)) < len(self.partition):
            raise InvariantViolation(f"TopK partitions by a column twice: {self.partition}")
        if self.rank is not None:
            _check_unique(self.columns, "TopK")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns + ((self.rank,) if self.rank else ())

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


TIE_SENSITIVE = (
    exp.RowNumber,
    exp.Ntile,
    exp.Lag,
    exp.Lead,
    exp.FirstValue,
    exp.LastValue,
    exp.NthValue,
)
"""Window functions whose value depends on the order among rows that tie in ORDER BY."""


@dataclass(frozen=True, slots=True)
class WindowCall:
    """One window function of a :class:`Window`: ``over`` is the call as written (an
    ``exp.Window``), its columns the input's; its value is the output column ``name``.

    Rows that tie in its ORDER BY are ordered by the input's other columns where the value
    depends on that order (:data:`TIE_SENSITIVE`, and ROWS frames): the result is then one
    function of the partition's multiset, recomputed alike at every time (two rows tied on
    every column are equal, so their order changes nothing). A frame over the whole
    partition is computed in that order too, so floating-point sums add up alike.
    """

    name: str
    over: exp.Window

    @property
    def reads(self) -> set[str]:
        return referenced_columns(self.over)

    @property
    def ordered(self) -> bool:
        """Whether its rows' order is fixed by the input's other columns (see above)."""
        spec = self.over.args.get("spec")
        rows = spec is not None and str(spec.args.get("kind") or "").upper() == "ROWS"
        order = self.over.args.get("order")
        whole = order is None or not order.expressions
        return whole or rows or isinstance(window_function(self.over), TIE_SENSITIVE)

    def sql(self, others: tuple[str, ...]) -> exp.Window:
        """The call to evaluate, ``others`` (the input's columns not in it) appended to its
        ORDER BY where :attr:`ordered` (a whole-partition frame then made explicit)."""
        if not self.ordered:
            return self.over
        out = self.over.copy()
        order = out.args.get("order")
        items = list(order.expressions) if order is not None else []
        if not items and out.args.get("spec") is None:  # still the whole partition
            out.set(
                "spec",
                exp.WindowSpec(
                    kind="ROWS",
                    start="UNBOUNDED",
                    start_side="PRECEDING",
                    end="UNBOUNDED",
                    end_side="FOLLOWING",
                ),
            )
        there = {o.this.name for o in items if isinstance(o.this, exp.Column)}
        items += [
            exp.Ordered(this=exp.column(c), nulls_first=True) for c in others if c not in there
        ]
        if items:
            out.set("order", exp.Order(expressions=items))
        return out


def window_function(w: exp.Window) -> exp.Expression:
    """The function a window calls (under IGNORE/RESPECT NULLS)."""
    f = w.this
    while isinstance(f, (exp.IgnoreNulls, exp.RespectNulls)):
        f = f.this
    return f


@dataclass(frozen=True, slots=True)
class Window:
    """Window functions: each input row with its calls' values (``calls``' names appended).

    Not linear: a change to one row can change every value of its partition. Maintained by
    recomputing the partitions a change touches from the input's rows kept by ``keys``
    (state: :mod:`ivm.plan.reduce`), at the old and the new time; ``keys`` are the columns
    every call partitions by (none: one partition, recomputed whole on every change).
    """

    input: Node
    keys: tuple[str, ...]
    calls: tuple[WindowCall, ...]
    label: str

    def __post_init__(self) -> None:
        _check_unique(self.columns, "Window")
        missing = (set(self.keys) | {c for w in self.calls for c in w.reads}) - set(
            self.input.columns
        )
        if missing:
            raise InvariantViolation(f"Window reads unknown columns {sorted(missing)}")
        if not self.calls:
            raise InvariantViolation("a Window needs a call")

    @property
    def columns(self) -> tuple[str, ...]:
        return self.input.columns + tuple(w.name for w in self.calls)

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.input,)


Node = (
    Get | Constant | Filter | Project | UnionAll | Join | SemiJoin | Reduce | SetOp | TopK | Window
)
STATEFUL = (Reduce, SetOp, TopK, Window)


def walk(node: Node) -> list[Node]:
    """``node`` and every node under it, parents first (join inputs' Gets included)."""
    if isinstance(node, Join):
        return [node, *(inp.get for inp in node.inputs)]
    if isinstance(node, SemiJoin):
        return [node, node.input.get, node.other.get]
    if isinstance(node, Get):
        return [node]
    out: list[Node] = [node]
    for child in node.inputs:
        out.extend(walk(child))
    return out


def collections(node: Node) -> list[Get]:
    """Every ``Get`` under ``node``, left to right."""
    if isinstance(node, Get):
        return [node]
    if isinstance(node, Join):
        return [inp.get for inp in node.inputs]
    if isinstance(node, SemiJoin):
        return [node.input.get, node.other.get]
    out: list[Get] = []
    for child in node.inputs:
        out.extend(collections(child))
    return out


Origin = tuple[str, str]
"""A collection's column: ``(collection, column)``."""


def column_lineage(node: Node) -> dict[str, frozenset[Origin]]:
    """For each output column of ``node``, the collections' columns its values are computed
    from: a column passed through or computed by an expression, a group key, an aggregate's
    argument (``COUNT(*)``: none), a union's or set operation's columns at the same position,
    a row number's partition and order columns. Exact for what the plan holds; columns that
    only filter, join or group rows are not origins of any value."""
    if isinstance(node, Get):
        return {c: frozenset({(node.collection, c)}) for c in node.columns}
    if isinstance(node, Constant):  # written in the SQL: computed from no collection
        return {c: frozenset() for c in node.columns}
    if isinstance(node, Join | SemiJoin):
        inputs = node.inputs if isinstance(node, Join) else (node.input,)
        return {
            name: frozenset((inp.get.collection, c) for c in referenced_columns(e))
            for inp in inputs
            for name, e in inp.outputs
        }
    if isinstance(node, Filter):
        return column_lineage(node.input)
    if isinstance(node, Project):
        below = column_lineage(node.input)
        return {
            name: frozenset().union(*(below[c] for c in referenced_columns(e)))
            for name, e in node.outputs
        }
    if isinstance(node, UnionAll | SetOp):
        branches = [column_lineage(b) for b in node.inputs]
        return {
            name: frozenset().union(
                *(b[bn.columns[i]] for b, bn in zip(branches, node.inputs, strict=True))
            )
            for i, name in enumerate(node.columns)
        }
    if isinstance(node, Reduce):
        below = column_lineage(node.input)
        out = {k: below[k] for k in node.keys}
        for a in node.aggregates:
            out[a.name] = frozenset().union(*(below[c] for c in sorted(a.reads)))
        return out
    below = column_lineage(node.input)
    if isinstance(node, Window):
        out = dict(below)
        for w in node.calls:
            out[w.name] = frozenset().union(*(below[c] for c in sorted(w.reads)))
        return out
    out = dict(below)  # TopK
    if node.rank is not None:
        ranked = {*node.partition, *(o[0] for o in node.order)}
        out[node.rank] = frozenset().union(*(below[c] for c in sorted(ranked)))
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
    if isinstance(node, Constant):
        return node.kept(tuple(want))
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
    if isinstance(node, Join):
        return _demand_join(node, want)
    if isinstance(node, SemiJoin):
        as_join = _demand_join(Join((node.input, node.other), node.as_join.equivalences), want)
        return replace(node, input=as_join.inputs[0], other=as_join.inputs[1])
    if isinstance(node, Reduce):
        aggregates = tuple(a for a in node.aggregates if a.name in want)
        if not node.keys and not aggregates:
            aggregates = node.aggregates[:1]
        reads = set(node.keys) | {c for a in aggregates for c in a.reads}
        child = demand(node.input, tuple(c for c in node.input.columns if c in reads))
        return replace(node, input=child, aggregates=aggregates)
    if isinstance(node, SetOp):  # every column decides a row's identity
        return replace(node, left=demand(node.left), right=demand(node.right))
    if isinstance(node, TopK):  # the rows are the output; keep them whole
        return replace(node, input=demand(node.input))
    if isinstance(node, Window):  # the calls wanted, and the columns they and others read
        calls = tuple(w for w in node.calls if w.name in want) or node.calls[:1]
        reads = (want | set(node.keys)).union(*(w.reads for w in calls))
        child = demand(node.input, tuple(c for c in node.input.columns if c in reads))
        return replace(node, input=child, calls=calls)
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


def _demand_join(node: Join, want: set[str]) -> Join:
    keys = {c for cls in node.equivalences for _, c in cls}
    need = want | keys
    for r in node.residual:
        need |= referenced_columns(r)
    inputs = []
    for inp in node.inputs:
        outputs = tuple((n, e) for n, e in inp.outputs if n in need) or inp.outputs[:1]
        used: set[str] = set()
        for _, e in outputs:
            used |= referenced_columns(e)
        if inp.predicate is not None:
            used |= referenced_columns(inp.predicate)
        kept = tuple(c for c in inp.get.columns if c in used) or inp.get.columns[:1]
        inputs.append(
            JoinInput(
                Get(inp.get.collection, inp.get.kind, kept), inp.alias, inp.predicate, outputs
            )
        )
    return Join(tuple(inputs), node.equivalences, node.residual, node.preserve, node.null_safe)


def _substitute(e: exp.Expression, by: dict[str, exp.Expression]) -> exp.Expression:
    def sub(node: exp.Expression) -> exp.Expression:
        if isinstance(node, exp.Column) and node.name in by:
            inner = by[node.name].copy()
            atomic = isinstance(
                inner, (exp.Column, exp.Literal, exp.Null, exp.Boolean, exp.Paren, exp.Func)
            )
            return inner if atomic else exp.Paren(this=inner)
        return node

    return e.copy().transform(sub)


def simplify(node: Node) -> Node:
    """Fuse adjacent stateless operators: Project∘Project, Filter∘Filter, identity projections.

    Fusing is exact because each operator is a pure per-update function (see module doc);
    it saves Spark nothing (Catalyst fuses too) but keeps EXPLAIN as short as the SQL.
    """
    if isinstance(node, Get | Constant):
        return node
    if isinstance(node, UnionAll):
        return UnionAll(tuple(simplify(b) for b in node.branches))
    if isinstance(node, (Join, SemiJoin)):
        return node
    if isinstance(node, (Reduce, TopK, Window)):
        return replace(node, input=simplify(node.input))
    if isinstance(node, SetOp):
        return replace(node, left=simplify(node.left), right=simplify(node.right))
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


def bounded_groups(node: Node) -> Node:
    """``node`` with each :class:`Reduce`'s ``group_size`` lowered to the most rows a group of
    its input can hold, where the plan says: grouped by (at least) a :class:`TopK`'s
    partition, through projections and filters, a group holds at most its ``limit`` rows (a
    subquery's ``LIMIT 1`` per key, then its value's ``max``). Towers are then as tall as
    that; the result is the same."""
    if isinstance(node, Get | Constant | Join | SemiJoin):
        return node
    if isinstance(node, UnionAll):
        return UnionAll(tuple(bounded_groups(b) for b in node.branches))
    if isinstance(node, SetOp):
        return replace(node, left=bounded_groups(node.left), right=bounded_groups(node.right))
    out = replace(node, input=bounded_groups(node.input))
    if isinstance(out, Reduce) and out.keys:
        most = _rows_per_key(out.input, set(out.keys))
        if most is not None and (out.group_size is None or most < out.group_size):
            out = replace(out, group_size=most)
    return out


def _rows_per_key(node: Node, keys: set[str]) -> int | None:
    """At most how many rows of ``node`` share a value of ``keys`` (None: the plan does not
    say). A key computed by a projection is left out: fewer keys, larger groups."""
    if isinstance(node, Filter):
        return _rows_per_key(node.input, keys)
    if isinstance(node, Project):
        plain = {e.name for n, e in node.outputs if n in keys and isinstance(e, exp.Column)}
        return _rows_per_key(node.input, plain)
    if isinstance(node, TopK) and set(node.partition) <= keys:
        return node.limit
    return None
