"""EXPLAIN: the text a user reads to see how a view is maintained.

Owns the rendering of a :class:`~ivm.plan.planner.ViewPlan` as an indented tree, one node per
line, in the view's SQL dialect. The text is a tested contract (``tests/goldens``).

Contract in ``(data, time, diff)`` terms: each line names an operator that maps the updates of
the line(s) below it to updates; the header says which state (arrangements) the view keeps.
"""

from __future__ import annotations

import re
from pathlib import Path

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
)
from ivm.plan.join import plan_paths
from ivm.plan.planner import ProjectPlan, ViewPlan
from ivm.plan.reduce import (
    DEFAULT_GROUP_SIZE,
    GLOBAL_KEY,
    Branch,
    branches,
    presum_grain,
    state_tables,
    window_branch,
)
from ivm.policy import Policy
from ivm.sql.parse import DIALECT
from ivm.sql.scope import ONE

_INTERNAL = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*?)__([A-Za-z_][A-Za-z0-9_]*)\b")


def _pretty(text: str) -> str:
    """Join columns are planned as ``alias__column``; show them as ``alias.column``."""
    return _INTERNAL.sub(r"\1.\2", text)


def _join_lines(node: Join, depth: int) -> list[str]:
    pad = "  " * depth
    keys = []
    for k, cls in enumerate(node.equivalences):
        keys.append(
            (" <=> " if node.class_null_safe(k) else " = ").join(_pretty(c) for _, c in cls)
        )
    kind = {(0,): "LeftOuterJoin", (1,): "RightOuterJoin", (0, 1): "FullOuterJoin"}.get(
        node.preserve, "Join"
    )
    lines = [pad + f"{kind} {len(node.inputs)} inputs on {', '.join(keys)}"]
    for cls in node.equivalences:
        constant = [node.inputs[i].alias for i, c in cls if c.endswith(ONE)]
        if len(constant) == len(node.inputs):  # a domain without equalities (ivm.sql.domain)
            lines.append(
                pad + f"  note: no equality links {', '.join(constant)} (joined on a constant): "
                "a change to one input is compared with every row of the others"
            )
        elif constant:
            lines.append(
                pad + f"  note: {', '.join(constant)} joins an uncorrelated subquery's one row on "
                "a constant: when its value changes, every row of "
                f"{', '.join(constant)} is re-examined"
            )
    if node.residual:
        lines.append(
            pad
            + "  residual: "
            + " AND ".join(_pretty(r.sql(dialect=DIALECT)) for r in node.residual)
        )
    for inp in node.inputs:
        get = inp.get
        text = f"input {inp.alias}: Get {get.kind} {get.collection} [{', '.join(get.columns)}]"
        if inp.predicate is not None:
            text += f" | Filter {inp.predicate.sql(dialect=DIALECT)}"
        computed = [
            f"{e.sql(dialect=DIALECT)} AS {_pretty(n).split('.', 1)[1]}"
            for n, e in inp.outputs
            if inp.source_column(n) is None
        ]
        if computed:
            text += f" | Map {', '.join(computed)}"
        lines.append(pad + "  " + text)
    lines.append(pad + "  update paths (one per input; lookups read only the stream's keys):")
    for path in plan_paths(node):
        start = node.inputs[path.source].alias
        steps = []
        for st in path.stages:
            on = ", ".join(
                f"{_pretty(a)} {'<=>' if same else '='} {_pretty(b)}" for a, b, same in st.matches()
            )
            step = f"⋈ {node.inputs[st.input].alias} via {st.arrangement} at {st.as_of} on {on}"
            if st.residual:
                step += " then Filter " + " AND ".join(
                    _pretty(r.sql(dialect=DIALECT)) for r in st.residual
                )
            steps.append(step)
        lines.append(pad + f"    Δ{start}: " + "; ".join(steps))
    for side in node.preserve:
        mine, other = node.inputs[side].alias, node.inputs[1 - side].alias
        lines.append(
            pad
            + f"  unmatched {mine} rows (NULL-padded): Δ{mine} with no {other} match at new, plus "
            f"{mine} at old for keys whose {other} match count crossed zero (per-key counts "
            f"looked up at old and new)"
        )
    return lines


def _input_text(inp: JoinInput) -> str:
    text = f"Get {inp.get.kind} {inp.get.collection} [{', '.join(inp.get.columns)}]"
    if inp.predicate is not None:
        text += f" | Filter {inp.predicate.sql(dialect=DIALECT)}"
    return text


def _semi_lines(node: SemiJoin, depth: int) -> list[str]:
    pad = "  " * depth
    mine, other = node.input.alias, node.other.alias
    keys = ", ".join(f"{mine}.{a} = {_pretty(b)}" for a, b in node.keys)
    (forward, backward) = plan_paths(node.as_join)
    kind = "AntiJoin (NOT EXISTS)" if node.anti else "SemiJoin (EXISTS/IN)"
    if node.null_aware:
        kind = f"NullAwareAntiJoin {node.label} (NOT IN)"
    extra = []
    if node.null_aware:
        extra.append(
            pad + f"  NULL rules: state {node.label}.not_in counts the subquery's rows and NULL "
            "keys; no rows while it holds a NULL, every row while it is empty (recomputed "
            "when that mode flips)"
        )
    return [
        pad + f"{kind} on {keys}",
        pad + f"  input {mine}: {_input_text(node.input)}",
        pad + f"  subquery {other}: {_input_text(node.other)}",
        pad
        + f"  maintained by match counts: Δ{mine} checked against {forward.stages[0].arrangement} "
        f"at new; {mine} rows at old (via {backward.stages[0].arrangement}) for keys whose "
        f"{other} match count crossed zero",
        *extra,
    ]


def _branch_text(b: Branch, group_size: int | None) -> str:
    aggs = ", ".join(f"{a.describe()} AS {a.name}" for a in b.aggregates)
    if b.kind == "hierarchical" or b.kind == "topk":
        if b.levels == 0:
            how = "monotonic input (append-only): no tower, result combined with insertions"
        else:
            size = f"{group_size:,}" if group_size else f"{DEFAULT_GROUP_SIZE:,} (default)"
            how = f"tower of {b.levels} levels, 16-way, expected group size {size}"
        text = f"{b.kind} {b.name}: {how}"
    elif b.kind == "buffer":
        first = b.tables[-1].holds.removeprefix("per group: ")
        text = (
            f"buffer {b.name}: {first} per group and its row count; a group left with fewer "
            "rows than the limit is refilled from its input"
        )
    elif b.kind == "threshold":
        text = f"threshold {b.name}: per-row counts of both inputs"
    else:
        text = b.name + (" (over the distinct set)" if b.distinct else "")
    if aggs:
        text += f" [{aggs}]"
    names = [t.name for t in b.tables]
    if len(names) > 2 and b.levels:
        names = [f"{names[0]} .. {names[-1].rsplit('.', 1)[1]}"]
    return f"{text}; state {', '.join(names)}"


def _stateful_lines(node: Reduce | SetOp | TopK, depth: int) -> list[str]:
    pad = "  " * depth
    bs = branches(node)
    if isinstance(node, Reduce):
        keys = ", ".join(_pretty(k) for k in node.keys)
        if not node.aggregates:
            head = f"Distinct {node.label} on ({keys})"
        else:
            head = f"Reduce {node.label} " + (f"GROUP BY {keys}" if keys else "(one global row)")
    elif isinstance(node, SetOp):
        head = f"SetOp {node.label} {node.op.upper()}{' ALL' if node.all else ''}"
    else:
        order = ", ".join(
            f"{_pretty(c)}{' DESC' if d else ''}{' NULLS FIRST' if nf != (not d) else ''}"
            for c, d, nf in node.order
        )
        part = f" PARTITION BY {', '.join(node.partition)}" if node.partition else ""
        rank = f" numbered as {node.rank}" if node.rank and node.rank != "_rank" else ""
        skip = f" OFFSET {node.offset}" if node.offset else ""
        head = f"TopK {node.label}{part} ORDER BY {order} LIMIT {node.limit}{skip}{rank}"
    group_size = getattr(node, "group_size", None)
    lines = [pad + head]
    grain = presum_grain(node) if isinstance(node, Reduce) else None
    if grain is not None:
        shown = [_pretty(c) for c in grain if c != GLOBAL_KEY]
        by = f"by ({', '.join(shown)})" if shown else "into one row"
        lines.append(pad + f"  input summed {by} first")
    for b in bs:
        lines.append(pad + "  branch " + _branch_text(b, group_size))
    if len(bs) > 1:
        lines.append(pad + f"  collation: {len(bs)} branches joined on the group key")
    for child in node.inputs:
        lines.extend(_node_lines(child, depth + 1))
    return lines


def _window_lines(node: Window, depth: int) -> list[str]:
    pad = "  " * depth
    by = (
        f"partitions by ({', '.join(_pretty(k) for k in node.keys)})"
        if node.keys
        else ("one partition (no key every call partitions by): every change recomputes it whole")
    )
    lines = [pad + f"Window {node.label} {by}"]
    for w in node.calls:
        ties = "; ties ordered by the other columns" if w.ordered else ""
        lines.append(pad + f"  {_pretty(w.over.sql(dialect=DIALECT))} AS {w.name}{ties}")
    (table,) = window_branch(node).tables
    lines.append(
        pad + f"  state {table.name}: {table.holds}; a change recomputes the partitions it "
        "touches, at old and new"
    )
    return lines + _node_lines(node.input, depth + 1)


def _constant_rows(node: Constant, shown: int = 3) -> str:
    """A constant's rows as its SQL writes them (the first ``shown``), and what they cost."""
    rows = [f"({', '.join(e.sql(dialect=DIALECT) for e in r)})" for r in node.rows[:shown]]
    more = f", … {len(node.rows) - shown} more" if len(node.rows) > shown else ""
    count = f"{len(node.rows)} row{'s' if len(node.rows) > 1 else ''}"
    return f"{count}: {', '.join(rows)}{more} (written in the view: built once, never updated)"


def _node_lines(node: Node, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(node, Window):
        return _window_lines(node, depth)
    if isinstance(node, (Reduce, SetOp, TopK)):
        return _stateful_lines(node, depth)
    if isinstance(node, Join):
        return _join_lines(node, depth)
    if isinstance(node, SemiJoin):
        return _semi_lines(node, depth)
    if isinstance(node, Get):
        head = f"Get {node.kind} {node.collection} [{', '.join(node.columns)}]"
    elif isinstance(node, Constant):
        head = f"Constant [{', '.join(node.columns)}] {_constant_rows(node)}"
    elif isinstance(node, Filter):
        head = f"Filter {_pretty(node.predicate.sql(dialect=DIALECT))}"
    elif isinstance(node, Project):
        if node.is_identity():
            return _node_lines(node.input, depth)
        if not node.outputs:
            return [
                pad + "Project (no columns: rows are only counted)",
                *_node_lines(node.input, depth + 1),
            ]
        items = []
        for name, e in node.outputs:
            text = _pretty(e.sql(dialect=DIALECT))
            items.append(
                text
                if text in (name, f"{_pretty(name)}") or text.endswith("." + name)
                else f"{text} AS {name}"
            )
        head = f"Project {', '.join(items)}"
    else:
        assert isinstance(node, UnionAll)
        head = f"UnionAll ({len(node.branches)} inputs)"
    lines = [pad + head]
    for child in node.inputs:
        lines.extend(_node_lines(child, depth + 1))
    return lines


def explain(
    view: ViewPlan, project: ProjectPlan | None = None, policy: Policy | None = None
) -> str:
    """The EXPLAIN text of one view.

    >>> from ivm.sql.parse import parse_view
    >>> from ivm.plan.planner import plan_views
    >>> p = plan_views([parse_view("CREATE VIEW v AS SELECT a FROM t WHERE b > 1", "v.sql")],
    ...                {"t": ("a", "b", "c")})
    >>> print(explain(p.views["v"]).splitlines()[-1])
            Get source t [a, b]
    """
    inputs = ", ".join(
        f"{g.kind} {g.collection}" for g in {g.collection: g for g in view.gets}.values()
    )
    tables = state_tables(view.root)
    arrangements = sorted(
        {st.arrangement for j in view.joins for p in plan_paths(j) for st in p.stages}
    )
    parts = []
    if arrangements:
        parts.append(
            f"delta join ({len(arrangements)} shared arrangement"
            f"{'s' if len(arrangements) != 1 else ''}; no intermediate state)"
        )
    if tables:
        parts.append(f"state of its own ({len(tables)} table{'s' if len(tables) != 1 else ''})")
    maintenance = "incremental, " + (
        " + ".join(parts)
        if parts
        else "stateless (each update maps to its output on its own; no arrangements)"
    )
    what = f"VIEW {view.name}  ({Path(view.file).name}"
    if view.owner is not None:
        what = (
            f"INTERNAL VIEW {view.name}  ({view.label} of view {view.owner}, "
            f"{Path(view.file).name}; refreshed with the views that read it"
        )
    lines = [
        f"{what}, code version {view.sql_hash})",
        f"  columns: {', '.join(view.columns)}",
        f"  maintenance: {maintenance}",
        f"  inputs: {inputs or 'none (its rows are written in its SQL)'}",
    ]
    if policy is not None:
        lines.append(f"  refreshes run on: {policy.describe(view.root)}")
    for key in arrangements:
        plan = project.arrangements.get(key) if project else None
        detail = (
            f" holding [{', '.join(plan.columns)}], shared by {', '.join(plan.users)}"
            if plan
            else ""
        )
        lines.append(f"  arrangement {key}{detail}")
    for t in tables:
        lines.append(f"  state {t.name} by ({', '.join(t.key)}): {t.holds}")
    lines.append("  plan (updates flow bottom-up; every node keeps _time and _diff):")
    lines.extend(_node_lines(view.root, 2))
    return "\n".join(lines) + "\n"
