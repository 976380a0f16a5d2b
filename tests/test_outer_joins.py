"""Outer joins of more than two inputs, and mixes of inner and outer joins, against both
oracles: each join's first inputs become an internal view (``ivm.sql.nest``), so every join
the engine maintains has two inputs. The subqueries that become LEFT JOINs after the FROM
clause's joins are nested the same way:

- scalar subqueries in a SELECT list (several, over a join, uncorrelated);
- EXISTS and IN under an OR, and several NOT EXISTS (the subquery's distinct keys);
- a correlated NOT IN, NOT IN under an OR, several NOT IN (per key, or on a constant, its
  rows and NULLs, and its distinct values);
- a correlated scalar subquery whose value over no rows is not NULL (COUNT);
- an uncorrelated EXISTS or NOT EXISTS (the subquery's one row when it has any, joined on a
  constant).

Over customers <- orders <- lines with NULL keys, hot keys, duplicates and rows that stop and
start matching (``tests.lakegen.JoinLake``). After every epoch each view equals DuckDB's and
Spark's from-scratch results of its own SQL, on the driver's path and on Spark's; the
planning tests check the shapes and the refusals.
"""

from __future__ import annotations

import pytest

from engine.facade import Engine
from ivm.errors import SqlError
from ivm.plan.ir import Filter, Join, Node, walk
from ivm.plan.planner import plan_views
from ivm.sql.parse import parse_view
from tests.lakegen import JoinLake, batches, check_both_oracles, epochs_on_both_paths

VIEWS = {
    "left_chain": """
        CREATE VIEW left_chain AS
        SELECT c.c_name, o.o_id, l.l_no, l.l_qty
        FROM customers c LEFT JOIN orders o ON o.o_cust = c.c_id
        LEFT JOIN lines l ON l.l_order = o.o_id AND l.l_qty > 10
        WHERE c.c_seg = 'AUTO' OR c.c_seg IS NULL
    """,
    "full_chain": """
        CREATE VIEW full_chain AS
        SELECT coalesce(c.c_id, o.o_cust, l.l_order) AS k, c_name, o_id, l_no
        FROM customers c FULL JOIN orders o ON o.o_cust = c.c_id
        FULL JOIN lines l ON l.l_order = coalesce(c.c_id, o.o_cust)
    """,
    "inner_after_left": """
        CREATE VIEW inner_after_left AS
        SELECT * FROM orders o LEFT JOIN customers c ON c.c_id = o.o_cust
        JOIN lines l ON l.l_order = o.o_id
        WHERE l.l_qty < 40
    """,
    "segments_of_lines": """
        CREATE VIEW segments_of_lines AS
        SELECT c_seg, count(l_no) AS n, sum(l_qty) AS q, count(*) AS r
        FROM orders o JOIN lines l ON l.l_order = o.o_id
        RIGHT JOIN customers c ON c.c_id = o.o_cust
        WHERE o.o_status = 'O' OR o.o_status IS NULL
        GROUP BY c_seg
    """,
    "four_left": """
        CREATE VIEW four_left AS
        SELECT c.*, l.l_no, x.l_no AS other
        FROM customers c LEFT JOIN orders o USING (c_id)
        LEFT JOIN lines l ON l.l_order = o.o_id
        LEFT JOIN lines x ON x.l_order = l.l_no AND x.l_qty > 5
    """,
    "order_line_figures": """
        CREATE VIEW order_line_figures AS
        SELECT o_id,
               (SELECT count(*) FROM lines WHERE l_order = o_id) AS n,
               (SELECT max(l_qty) FROM lines WHERE l_order = o_id) AS top,
               (SELECT max(c_name) FROM customers WHERE c_id = o_cust) AS customer
        FROM orders
    """,
    "quantities_of_customer_orders": """
        CREATE VIEW quantities_of_customer_orders AS
        SELECT c.c_name, o.o_id, (SELECT sum(l_qty) FROM lines l WHERE l.l_order = o.o_id) AS q
        FROM customers c JOIN orders o ON o.o_cust = c.c_id
    """,
    "against_overall": """
        CREATE VIEW against_overall AS
        SELECT o_id, o_total, (SELECT avg(o_total) FROM orders WHERE o_status = 'O') AS avg_open,
               (SELECT count(*) FROM lines WHERE l_qty > 45) AS big_lines
        FROM orders
    """,
    "orders_without_either": """
        CREATE VIEW orders_without_either AS
        SELECT c.c_name, o.o_id FROM customers c JOIN orders o ON o.o_cust = c.c_id
        WHERE NOT EXISTS (SELECT * FROM lines WHERE l_order = o.o_id AND l_qty > 40)
          AND NOT EXISTS (SELECT * FROM lines l2 WHERE l2.l_no = o.o_id)
          AND o.o_id NOT IN (SELECT l_order FROM lines WHERE l_qty < 3)
    """,
    "orders_neither": """
        CREATE VIEW orders_neither AS
        SELECT o_id FROM orders o
        WHERE NOT EXISTS (SELECT * FROM lines WHERE l_order = o.o_id AND l_qty > 40)
          AND NOT EXISTS (SELECT * FROM customers WHERE c_id = o.o_cust AND c_seg = 'AUTO')
    """,
    "price_not_in_lines": """
        CREATE VIEW price_not_in_lines AS
        SELECT o_id, o_total FROM orders o
        WHERE o.o_total NOT IN (SELECT CASE WHEN l_qty > 45 THEN NULL ELSE l_price * 10 END
                                FROM lines l WHERE l.l_order = o.o_id AND l_qty > 3)
    """,
    "orders_with_few_lines": """
        CREATE VIEW orders_with_few_lines AS
        SELECT o_id FROM orders o
        WHERE 2 > (SELECT count(*) FROM lines l WHERE l.l_order = o.o_id AND l_qty > 10)
    """,
    "line_totals": """
        CREATE VIEW line_totals AS
        SELECT o_id, (SELECT coalesce(sum(l_qty), 0) + count(*) FROM lines l
                      WHERE l.l_order = o.o_id) AS q
        FROM orders o
    """,
    "orders_while_big_lines": """
        CREATE VIEW orders_while_big_lines AS
        SELECT o_id FROM orders o WHERE EXISTS (SELECT 1 FROM lines WHERE l_qty > 47)
    """,
    "orders_unless_huge_lines": """
        CREATE VIEW orders_unless_huge_lines AS
        SELECT o_id, o_status FROM orders o
        WHERE NOT EXISTS (SELECT 1 FROM lines WHERE l_qty > 49) AND o_total > 100
    """,
    "total_not_in_or_open": """
        CREATE VIEW total_not_in_or_open AS
        SELECT o_id, o_status FROM orders o
        WHERE o_total NOT IN (SELECT l_price * 10 FROM lines WHERE l_qty > 40) OR o_status = 'O'
    """,
    "two_not_in": """
        CREATE VIEW two_not_in AS
        SELECT o_id, o_cust FROM orders
        WHERE o_id NOT IN (SELECT l_order FROM lines WHERE l_qty > 45)
          AND o_cust NOT IN (SELECT c_id FROM customers WHERE c_seg = 'BUILD')
    """,
    "matched_or_big": """
        CREATE VIEW matched_or_big AS
        SELECT o_id, o_total FROM orders o
        WHERE o_id IN (SELECT l_order FROM lines WHERE l_qty > 40)
           OR EXISTS (SELECT * FROM customers c WHERE c.c_id = o.o_cust AND c.c_seg = 'AUTO')
           OR o_total > 900
    """,
    "lineless_or_open": """
        CREATE VIEW lineless_or_open AS
        SELECT o_id, o_status FROM orders o
        WHERE NOT EXISTS (SELECT * FROM lines l WHERE l.l_order = o.o_id AND l.l_qty > 10)
           OR o_status = 'O'
    """,
    # NULL-safe keys: orders without a customer match each other
    "same_customer": """
        CREATE VIEW same_customer AS
        SELECT a.o_id, b.o_id AS other FROM orders a JOIN orders b ON a.o_cust <=> b.o_cust
        WHERE a.o_status = 'O'
    """,
    "same_customer_finished": """
        CREATE VIEW same_customer_finished AS
        SELECT a.o_id, a.o_cust, b.o_id AS other
        FROM orders a LEFT JOIN orders b
          ON (a.o_cust = b.o_cust OR (a.o_cust IS NULL AND b.o_cust IS NULL))
         AND b.o_status = 'F'
    """,
    "orders_of_lines_null_safe": """
        CREATE VIEW orders_of_lines_null_safe AS
        SELECT l.l_no, l.l_order, o.o_total
        FROM lines l FULL JOIN orders o ON l.l_order <=> o.o_id
    """,
}
"""``four_left`` joins orders USING a column orders lacks: see the refusal test; the view
used in the oracle run renames it."""
VIEWS["four_left"] = VIEWS["four_left"].replace(
    "orders o USING (c_id)", "(SELECT o_cust AS c_id, o_id FROM orders) o USING (c_id)"
)
CATALOG = {
    "customers": ("c_id", "c_name", "c_seg"),
    "orders": ("o_id", "o_cust", "o_status", "o_total"),
    "lines": ("l_order", "l_no", "l_qty", "l_price"),
}


def _plan(sql: str):
    return plan_views([parse_view(sql, "v.sql")], CATALOG).check()


def test_null_safe_keys_are_keys() -> None:
    """``a <=> b`` and ``a = b OR (a IS NULL AND b IS NULL)`` are join keys matching NULL
    with NULL (EXPLAIN writes ``<=>``); the driver computes inner and outer joins on them; one
    ``=`` in a class makes it plain equality."""
    from ivm.plan.driver import driver_support
    from ivm.plan.explain import explain

    for name in ("same_customer", "same_customer_finished", "orders_of_lines_null_safe"):
        plan = _plan(VIEWS[name])
        text = explain(plan.views[name.lower()], plan)
        assert " <=> " in text and "residual" not in text, text
        why = driver_support(plan.views[name].root)
        assert why is None, why
    mixed = _plan(
        "CREATE VIEW v AS SELECT a.o_id FROM orders a JOIN orders b ON a.o_cust <=> b.o_cust "
        "JOIN orders c ON c.o_cust = b.o_cust"
    )
    assert " <=> " not in explain(mixed.views["v"], mixed)


def test_every_join_has_two_inputs_and_the_first_ones_are_internal_views() -> None:
    plan = plan_views([parse_view(sql, f"{n}.sql") for n, sql in VIEWS.items()], CATALOG).check()
    internal = {n: v for n, v in plan.views.items() if v.owner is not None}
    assert sorted(n for n in internal if "subquery" not in n) == [
        "against_overall__join",
        "against_overall__orders",  # orders carrying the constant the one row joins on
        "four_left__join",
        "four_left__join2",
        "full_chain__join",
        "inner_after_left__join",
        "left_chain__join",
        "matched_or_big__join",
        "order_line_figures__join",
        "order_line_figures__join2",
        "orders_neither__join",
        "orders_while_big_lines__o",  # orders with the constant: shared by both uncorrelated
        "orders_without_either__join",
        "orders_without_either__join2",
        "price_not_in_lines__join",
        "quantities_of_customer_orders__join",
        "segments_of_lines__join",
        "total_not_in_or_open__join",
        "two_not_in__join",
        "two_not_in__join2",
        "two_not_in__join3",
    ]
    for v in plan.views.values():
        for node in walk(v.root):
            if isinstance(node, Join):
                assert len(node.inputs) == 2, (v.name, node)
    # The FULL join's key over both earlier inputs is a column of the internal view.
    full = plan.views["full_chain__join"].root.columns
    assert any(c.endswith("_e0") for c in full), full
    # WHERE over the preserved side of LEFT joins filters that input of the internal view...
    assert "c_seg" in _filters(plan.views["left_chain__join"].root)
    assert "c_seg" not in _filters(plan.views["left_chain"].root)
    # ... but not where a later join pads it: WHERE then filters the padded rows too.
    assert "o_status" not in _filters(plan.views["segments_of_lines__join"].root)
    assert "o_status" in _filters(plan.views["segments_of_lines"].root)


def _filters(root: Node) -> str:
    """The conditions of a plan's filters and join input filters, as SQL."""
    out = [n.predicate for n in walk(root) if isinstance(n, Filter)]
    out += [i.predicate for n in walk(root) if isinstance(n, Join) for i in n.inputs]
    return " AND ".join(p.sql() for p in out if p is not None)


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT c_id FROM customers c LEFT JOIN orders o ON o.o_cust = c.c_id "
            "LEFT JOIN lines l ON l.l_order = o_id WHERE c_id IN (SELECT 1 FROM lines)",
            None,  # the IN is a join (decorrelated) before the nesting: accepted
        ),
        (
            "SELECT * FROM (SELECT o_id, o_cust FROM orders) "
            "LEFT JOIN (SELECT c_id, c_name FROM customers) ON c_id = o_cust "
            "LEFT JOIN (SELECT l_order, l_no FROM lines) ON l_order = o_id",
            None,  # unaliased subqueries keep their names when the first two are nested
        ),
        (
            "SELECT l_no FROM customers c LEFT JOIN orders o ON o.o_cust = c.c_id "
            "LEFT JOIN lines l ON l.l_order = o.o_id LEFT JOIN lines l2 ON l2.l_order = l.l_no "
            "WHERE l_no > 1",
            "column 'l_no' is ambiguous",
        ),
        (
            "SELECT o.nope FROM customers c LEFT JOIN orders o ON o.o_cust = c.c_id "
            "LEFT JOIN lines l ON l.l_order = o.o_id",
            "nope",
        ),
    ],
)
def test_nesting_resolves_names_as_the_query_does(sql: str, message: str | None) -> None:
    view = f"CREATE VIEW v AS {sql}"
    if message is None:
        _plan(view)
        return
    with pytest.raises(SqlError, match=message):
        _plan(view)


@pytest.mark.slow
@pytest.mark.spark
def test_outer_joins_of_more_inputs_match_both_oracles(spark, make_project, tmp_path, use_policy):
    """Built once, then random batches computed in turn where the policy places them (the
    driver computes the outer joins) and by Spark alone; every view checked against DuckDB
    after each, and all, internal ones included, against Spark after the last."""
    lake = JoinLake(tmp_path / "data", seed=31)
    engine = Engine(make_project(VIEWS, lake.create()), spark=spark)
    assert engine.refresh().ok
    check_both_oracles(engine, spark=False)
    paths = (["driver", "spark"] * 4)[: batches(8, bound=1)]  # Spark's too with more batches
    reports = epochs_on_both_paths(engine, lake, use_policy, paths)
    by_driver = {v.view for v in reports[0].views if v.computed_by == "driver"}
    # LEFT, FULL and RIGHT joins, and scalar subqueries' LEFT JOINs, all on the driver
    outer = {"left_chain", "full_chain", "segments_of_lines__join", "order_line_figures__join"}
    assert outer <= by_driver, outer - by_driver
