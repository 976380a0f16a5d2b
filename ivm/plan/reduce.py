"""Reduce planning: how each stateful node is factored into branches, and the state each keeps.

Owns the decisions of DESIGN section 4 and seed 000:

- Every aggregate is *accumulable* (COUNT, SUM, AVG, STDDEV/VARIANCE, BOOL_AND/OR: sums of
  per-row contributions), *hierarchical* (MIN, MAX) or *basic* (STRING_AGG, percentiles).
  All accumulable aggregates of a reduce share one branch whose state is a few sums per
  group; MIN and MAX of one column share a tower; basic aggregates recompute the touched
  groups from an arrangement of the reduce's input by group key. ``agg(DISTINCT x)`` first
  goes through its own distinct ``(group, x)`` arrangement, so a change that does not alter
  the distinct set stops there. Several branches are *collated* by group key; one alone is not.
- A tower has ``levels = ceil(log16(expected group size))`` levels (default group size
  65,536: four levels). Level 0 holds the input values with their counts, each in a bucket
  ``b = hash(value) mod 16^levels``; level ``l`` holds one row per group and bucket
  ``b >> 4l`` (MIN/MAX: the bucket's extremes; TopK: the bucket's first k rows), so a change
  re-examines at most about 16 entries per level. A monotonic (append-only) input needs no
  tower: the new result is the old one combined with the insertions.
- A TopK whose input keeps no state of its own is *buffered* instead: per group it keeps the
  first ``k + spare`` rows (the ``topk_spare`` hint; default ``max(k, 64)``) and its row count.
  A change ranked below a group's buffer is only counted; deletions eat into the spare rows, and
  a group left with fewer than ``k`` rows (out of more) is refilled from its input evaluated
  from scratch. In a lake read by pages of ~1,000 rows, a tower's level 0 is read whole as soon
  as a change touches more buckets than it has pages (BENCHMARKS.md, "Policy thresholds:
  reductions"); the buffer reads the touched groups' first rows only. Over a stateful
  input (an aggregate) the tower stays: that input cannot be evaluated from scratch.
- ``SetOp`` and DISTINCT keep per-row counts (accumulable) and threshold them.
- A ``Window`` keeps its input's rows with their counts by its partition keys; a change
  recomputes the partitions it touches from them, at the old and the new time.

Contract in ``(data, time, diff)`` terms: each state table is a log of updates ``(key..., values,
_time, _diff)`` (accumulable: ``(key..., sums..., _time)`` whose sums add up), readable at any
epoch since it was built; the engine writes each epoch's change once (txn per epoch).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from ivm.plan.ir import (
    Aggregate,
    Constant,
    Filter,
    Get,
    Join,
    Node,
    Project,
    Reduce,
    SemiJoin,
    SetOp,
    TopK,
    UnionAll,
    Window,
    walk,
)

DEFAULT_GROUP_SIZE = 65_536
"""Expected rows per group when the view gives no ``expected_group_size`` hint: 4 levels."""

FANOUT_BITS = 4
"""Each tower level merges 2**4 = 16 buckets of the level below (seed 000)."""

GLOBAL_KEY = "_g"
"""The constant key of a reduce without GROUP BY (its state tables need a key column)."""

DEFAULT_TOPK_SPARE = 64
"""Rows a buffered TopK keeps per group beyond ``k`` (at least ``k``) unless hinted."""

BranchKind = Literal[
    "accumulable", "hierarchical", "basic", "threshold", "topk", "buffer", "window"
]


def tower_levels(group_size: int | None) -> int:
    """``ceil(log16(group_size))``, at least 1."""
    n = group_size or DEFAULT_GROUP_SIZE
    levels = 1
    while (1 << (FANOUT_BITS * levels)) < n:
        levels += 1
    return levels


@dataclass(frozen=True, slots=True)
class StateTable:
    """A state table of a stateful node: ``state/<view>/<name>``, sorted by ``key``.

    ``format`` changes when the same table comes to hold its columns another way: a view's
    commits record it (see ``engine.facade``), and state of an older format is rebuilt rather
    than continued. 2: sums of decimals keep every decimal place (format 1 rounded the
    contributions of ``decimal(p, s)`` with ``s`` > 6 to 6 places). 3: sums of floating
    point (and every VARIANCE/STDDEV) are kept exactly in a ``float_sums`` table beside it
    (:mod:`ops.reduce.floatsum`), with NaN and infinity counts here; format 2 kept running doubles.

    ``hash`` names the function that places a tower's rows in buckets: state bucketed by
    another function cannot be continued either, so it is part of the layout too.
    """

    name: str
    key: tuple[str, ...]
    holds: str
    format: int = 1
    hash: str | None = None


SUMMED = frozenset({"sum", "avg", "stddev_samp", "stddev_pop", "var_samp", "var_pop"})
"""Accumulable aggregates whose state holds sums of their argument."""


BUCKET_HASH = "xxhash64(seed 42)"
"""How tower rows are bucketed: Spark's ``xxhash64`` (``ops.reduce.spark._bucket``), reproduced on
the driver by ``ops.reduce.driver.spark_xxhash64``. Recorded in each tower table's layout."""

FLOAT_SUMS_KEY = ("_t", "_b")
"""Key columns of a ``float_sums`` table after the group keys: the argument and the exponent."""


def _sums_format(aggregates: Sequence[Aggregate]) -> int:
    return 3 if any(a.func in SUMMED for a in aggregates) else 1


def _sums_tables(prefix: str, sk: tuple[str, ...], holds: str, aggs: Sequence[Aggregate]):
    """An accumulable branch's state tables: its sums per group last, and before it (when
    it sums values) the exact floating-point sums per group, term and bin."""
    sums = StateTable(prefix, sk, holds, _sums_format(aggs))
    if not any(a.func in SUMMED for a in aggs):
        return (sums,)
    floats = StateTable(
        f"{prefix}.float_sums",
        (*sk, *FLOAT_SUMS_KEY),
        "written only for SUM/AVG of floating point and for VARIANCE/STDDEV: per group, "
        "argument and exponent, exact sums of the values and of their squares",
    )
    return (floats, sums)


@dataclass(frozen=True, slots=True)
class Branch:
    """One branch of a stateful node.

    Attributes:
        kind: how it is maintained.
        name: unique within its node (names its state tables).
        keys: the group keys (input columns; empty for a global aggregate or ORDER BY LIMIT).
        aggregates: the aggregates it computes.
        value: hierarchical: the column whose MIN/MAX it keeps; distinct: the distinct column.
        distinct: it reads the distinct ``(keys, value)`` set rather than the input.
        levels: tower height; 0 for a monotonic input (no tower).
        tables: its state tables, in the order they are written.
    """

    kind: BranchKind
    name: str
    keys: tuple[str, ...]
    aggregates: tuple[Aggregate, ...] = ()
    value: str | None = None
    distinct: bool = False
    levels: int = 0
    tables: tuple[StateTable, ...] = ()

    @property
    def float_table(self) -> StateTable | None:
        """An accumulable branch's exact floating-point sums (:mod:`ops.reduce.floatsum`), if
        any."""
        return next((t for t in self.tables if t.name.endswith(".float_sums")), None)

    @property
    def state_keys(self) -> tuple[str, ...]:
        """The key columns of its per-group state (a constant one when there are no keys)."""
        return self.keys or (GLOBAL_KEY,)


def _tower_tables(prefix: str, keys: tuple[str, ...], levels: int, what: str) -> tuple:
    if levels == 0:
        return (StateTable(f"{prefix}.top", keys or (GLOBAL_KEY,), f"per group: {what}"),)
    tables = [
        StateTable(
            f"{prefix}.l0",
            (*keys, "_p", "_b"),
            "input values with counts, by bucket",
            hash=BUCKET_HASH,
        )
    ]
    for level in range(1, levels + 1):
        span = 16**levels // 16**level
        holds = f"{what} of each of {span} bucket(s) per group" if span > 1 else f"{what} per group"
        tables.append(
            StateTable(f"{prefix}.l{level}", (*keys, "_p", "_b"), holds, hash=BUCKET_HASH)
        )
    return tuple(tables)


def reduce_branches(node: Reduce) -> tuple[Branch, ...]:
    """The branches of a GROUP BY (see module doc)."""
    keys = node.keys
    sk = keys or (GLOBAL_KEY,)
    label = node.label
    out: list[Branch] = []
    plain_acc = [a for a in node.aggregates if a.kind == "accumulable" and not a.distinct]
    if plain_acc or not node.aggregates:
        holds = "per group: row count" + (", non-null counts and sums" if plain_acc else "")
        out.append(
            Branch(
                "accumulable",
                "accumulable",
                keys,
                tuple(plain_acc),
                tables=_sums_tables(f"{label}.accumulable", sk, holds, plain_acc),
            )
        )
    hier: dict[str, list[Aggregate]] = {}
    for a in node.aggregates:
        if a.kind == "hierarchical":
            hier.setdefault(a.arg or "", []).append(a)
    for column, aggs in hier.items():
        funcs = "/".join(dict.fromkeys(a.func for a in aggs))
        name = f"{funcs}({column})"
        levels = 0 if node.monotonic else tower_levels(node.group_size)
        out.append(
            Branch(
                "hierarchical",
                name,
                keys,
                tuple(aggs),
                value=column,
                levels=levels,
                tables=_tower_tables(
                    f"{label}.{funcs.replace('/', '_')}_{column}",
                    keys,
                    levels,
                    funcs.upper().replace("/", " and "),
                ),
            )
        )
    basic = [a for a in node.aggregates if a.kind == "basic" and not a.distinct]
    if basic:
        out.append(
            Branch(
                "basic",
                "basic",
                keys,
                tuple(basic),
                tables=(
                    StateTable(f"{label}.basic", sk, "the input's arguments by group (counts)"),
                ),
            )
        )
    distinct: dict[str, list[Aggregate]] = {}
    for a in node.aggregates:
        if a.distinct and a.kind != "hierarchical":
            distinct.setdefault(a.arg or "", []).append(a)
    for column, aggs in distinct.items():
        dtable = StateTable(
            f"{label}.distinct_{column}", (*sk, column), "per (group, value): row count"
        )
        for kind in ("accumulable", "basic"):
            mine = tuple(a for a in aggs if a.kind == kind)
            if not mine:
                continue
            tables: tuple[StateTable, ...] = (dtable,)
            if kind == "accumulable":
                tables += _sums_tables(
                    f"{label}.distinct_{column}.accumulable",
                    sk,
                    "per group: counts and sums of the distinct values",
                    mine,
                )
            out.append(
                Branch(kind, f"{kind}(DISTINCT {column})", keys, mine, column, True, 0, tables)
            )
    return tuple(out)


PRESUMMABLE: frozenset[BranchKind] = frozenset({"accumulable", "hierarchical", "basic"})


def branch_columns(branch: Branch) -> tuple[str, ...]:
    """The input columns besides the group keys that a branch reads row by row (a plain
    accumulable branch reads only its sums)."""
    if branch.distinct or branch.kind == "hierarchical":
        return (branch.value or "",)
    if branch.kind == "basic":
        return tuple(sorted({c for a in branch.aggregates for c in a.reads}))
    return ()


def presum_grain(node: Reduce) -> tuple[str, ...] | None:
    """The columns a GROUP BY's input is summed by before its branches read it, or None.

    The grain is the group keys plus every column a branch reads row by row (a DISTINCT or
    MIN/MAX value, a basic aggregate's arguments); per grain the input's ``_diff`` and the
    plain accumulable branch's sums are added up (they are linear in ``_diff``, so adding
    them again per group is exact). Chosen when every branch reads such a grain and there is
    a plain accumulable branch (it then sums few rows) or more than one branch (they share
    one copy of the summed input instead of one of the raw input).
    """
    found = reduce_branches(node)
    if not found or any(b.kind not in PRESUMMABLE for b in found):
        return None
    plain = any(b.kind == "accumulable" and not b.distinct for b in found)
    if not plain and len(found) < 2:
        return None
    keys = node.keys or (GLOBAL_KEY,)
    return tuple(dict.fromkeys([*keys, *[c for b in found for c in branch_columns(b)]]))


def setop_branch(node: SetOp) -> Branch:
    return Branch(
        "threshold",
        f"{node.op}{' all' if node.all else ''}",
        node.columns,
        tables=(
            StateTable(f"{node.label}.counts", node.columns, "per row: its count in each input"),
        ),
    )


def topk_spare(node: TopK) -> int:
    """The spare rows a buffered TopK keeps per group beyond its ``k``."""
    k = node.limit + node.offset
    return node.spare if node.spare is not None else max(k, DEFAULT_TOPK_SPARE)


def stateless(node: Node) -> bool:
    """Whether ``node`` keeps no state: it can be evaluated from its inputs' snapshots."""
    return not any(
        isinstance(n, (Reduce, SetOp, TopK, Window)) or (isinstance(n, SemiJoin) and n.null_aware)
        for n in walk(node)
    )


def topk_branch(node: TopK) -> Branch:
    k = node.limit + node.offset
    if not node.monotonic and stateless(node.input):
        spare = topk_spare(node)
        sk = node.partition or (GLOBAL_KEY,)
        return Branch(
            "buffer",
            f"top {k}",
            node.partition,
            tables=(
                StateTable(f"{node.label}.topk.count", sk, "per group: row count"),
                StateTable(
                    f"{node.label}.topk.first",
                    sk,
                    f"per group: first {k + spare} rows ({k} + {spare} spare)",
                ),
            ),
        )
    levels = 0 if node.monotonic else tower_levels(node.group_size)
    return Branch(
        "topk",
        f"top {k}",
        node.partition,
        levels=levels,
        tables=_tower_tables(f"{node.label}.topk", node.partition, levels, f"first {k} rows"),
    )


def window_branch(node: Window) -> Branch:
    """A Window's one branch: its input's rows (with counts) by the partition keys."""
    return Branch(
        "window",
        "partitions",
        node.keys,
        tables=(
            StateTable(
                f"{node.label}.window",
                node.keys or (GLOBAL_KEY,),
                "the input's rows (counts) by partition",
            ),
        ),
    )


def branches(node: Node) -> tuple[Branch, ...]:
    """The branches of any stateful node (empty for the stateless ones)."""
    if isinstance(node, Reduce):
        return reduce_branches(node)
    if isinstance(node, SetOp):
        return (setop_branch(node),)
    if isinstance(node, TopK):
        return (topk_branch(node),)
    if isinstance(node, Window):
        return (window_branch(node),)
    return ()


def state_tables(root: Node) -> list[StateTable]:
    """Every state table of a view's plan, each once."""
    seen: dict[str, StateTable] = {}
    for node in walk(root):
        if isinstance(node, SemiJoin) and node.null_aware:
            t = StateTable(
                f"{node.label}.not_in", (GLOBAL_KEY,), "the subquery's rows and NULL keys"
            )
            seen.setdefault(t.name, t)
        for b in branches(node):
            for t in b.tables:
                seen.setdefault(t.name, t)
    return list(seen.values())


def monotonic(node: Node, append_only: Collection[str]) -> bool:
    """Whether ``node`` only ever receives insertions, given the append-only sources.

    Stateless operators and inner/semi joins of growing inputs only grow; outer and anti
    joins and every stateful node may retract.
    """
    if isinstance(node, Get):
        return node.kind == "source" and node.collection in append_only
    if isinstance(node, Constant):  # rows at the build, no update after it
        return True
    if isinstance(node, Join):
        return not node.preserve and all(monotonic(i.get, append_only) for i in node.inputs)
    if isinstance(node, SemiJoin):
        return not node.anti and all(
            monotonic(i.get, append_only) for i in (node.input, node.other)
        )
    if isinstance(node, (Filter, Project, UnionAll)):
        return all(monotonic(i, append_only) for i in node.inputs)
    return False


def mark_monotonic(node: Node, append_only: Collection[str]) -> Node:
    """``node`` with every Reduce and TopK over a growing input marked ``monotonic``."""
    if isinstance(node, (Get, Constant, Join, SemiJoin)):
        return node
    if isinstance(node, (Reduce, TopK)):
        child = mark_monotonic(node.input, append_only)
        return replace(node, input=child, monotonic=monotonic(child, append_only))
    if isinstance(node, SetOp):
        return replace(
            node,
            left=mark_monotonic(node.left, append_only),
            right=mark_monotonic(node.right, append_only),
        )
    if isinstance(node, UnionAll):
        return UnionAll(tuple(mark_monotonic(b, append_only) for b in node.branches))
    return replace(node, input=mark_monotonic(node.input, append_only))


def not_in_table(join: SemiJoin) -> StateTable:
    """The state of ``x NOT IN (subquery)``: the subquery's row and NULL-key counts."""
    return next(t for t in state_tables(join) if t.name == f"{join.label}.not_in")


def not_in_mode(rows: int, nulls: int) -> str:
    """What ``x NOT IN (subquery)`` keeps when the subquery has ``rows`` rows, ``nulls`` of
    them NULL: ``"all"`` rows (no subquery row), ``"none"`` (a NULL among them), else
    ``"anti"``: the rows whose non-NULL ``x`` matches none."""
    return "all" if rows == 0 else ("none" if nulls > 0 else "anti")
