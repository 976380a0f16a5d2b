"""EXPLAIN: the text a user reads to see how a view is maintained.

Owns the rendering of a :class:`~ivm.plan.planner.ViewPlan` as an indented tree, one node per
line, in the view's SQL dialect. The text is a tested contract (``tests/goldens``).

Contract in ``(data, time, diff)`` terms: each line names an operator that maps the updates of
the line(s) below it to updates; the header says which state (arrangements) the view keeps.
"""

from __future__ import annotations

from pathlib import Path

from ivm.plan.ir import Filter, Get, Node, Project, UnionAll
from ivm.plan.planner import ViewPlan
from ivm.sql.parse import DIALECT


def _node_lines(node: Node, depth: int) -> list[str]:
    pad = "  " * depth
    if isinstance(node, Get):
        head = f"Get {node.kind} {node.collection} [{', '.join(node.columns)}]"
    elif isinstance(node, Filter):
        head = f"Filter {node.predicate.sql(dialect=DIALECT)}"
    elif isinstance(node, Project):
        if node.is_identity():
            return _node_lines(node.input, depth)
        items = []
        for name, e in node.outputs:
            text = e.sql(dialect=DIALECT)
            items.append(text if text == name else f"{text} AS {name}")
        head = f"Project {', '.join(items)}"
    else:
        assert isinstance(node, UnionAll)
        head = f"UnionAll ({len(node.branches)} inputs)"
    lines = [pad + head]
    for child in node.inputs:
        lines.extend(_node_lines(child, depth + 1))
    return lines


def explain(view: ViewPlan) -> str:
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
    lines = [
        f"VIEW {view.name}  ({Path(view.file).name}, code version {view.sql_hash})",
        f"  columns: {', '.join(view.columns)}",
        "  maintenance: incremental, stateless (each update maps to its output on its own;"
        " no arrangements)",
        f"  inputs: {inputs}",
        "  plan (updates flow bottom-up; every node keeps _time and _diff):",
    ]
    lines.extend(_node_lines(view.root, 2))
    return "\n".join(lines) + "\n"
