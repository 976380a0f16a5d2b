"""Subqueries correlated by any condition (``ivm.sql.domain``), against both oracles: EXISTS,
NOT EXISTS, IN, NOT IN and scalar subqueries correlated by two comparisons, ``BETWEEN``, a
comparison alone under NOT IN or in a scalar subquery, with or without an equality, under OR
and over a join; EXISTS/NOT IN subqueries that join (the join one internal view); EXISTS, NOT EXISTS and IN
subqueries that group (grouped by their correlation too); over customers <- orders <- lines with NULL keys, hot keys, duplicates and
rows that stop and start matching (``tests.lakegen.JoinLake``).

After every epoch each view equals DuckDB's and Spark's from-scratch results of its own SQL
(neither oracle sees the rewrite), on the driver's path and on Spark's. A correlation that may
hold for a NULL outer value is refused with its position.
"""

from __future__ import annotations

import pytest

from engine.facade import Engine
from ivm.errors import SqlError
from ivm.plan.explain import explain
from tests.lakegen import (
    JoinLake,
    batches,
    check_both_oracles,
    epochs_on_both_paths,
    plan_over_join_lake,
)

VIEWS = {
    "orders_with_line_in_band": """
        CREATE VIEW orders_with_line_in_band AS
        SELECT o_id, o_cust FROM orders o
        WHERE EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id
                      AND l.l_price * 20 > o.o_total AND l.l_price * 5 < o.o_total)
    """,
    "orders_without_line_in_band": """
        CREATE VIEW orders_without_line_in_band AS
        SELECT o_id, o_status FROM orders o
        WHERE o_status = 'F' OR NOT EXISTS (
            SELECT * FROM lines l
            WHERE l.l_order = o.o_id AND l.l_price BETWEEN o.o_total / 100 AND o.o_total / 10)
    """,
    # no equality: the domain joins every line on a constant
    "orders_under_two_bounds": """
        CREATE VIEW orders_under_two_bounds AS
        SELECT c.c_name, o.o_id FROM customers c JOIN orders o ON o.o_cust = c.c_id
        WHERE EXISTS (SELECT 1 FROM lines l
                      WHERE l.l_qty >= 49 AND l.l_price * 40 > o.o_total
                        AND l.l_price < o.o_total / 20)
    """,
    "big_lines_per_order": """
        CREATE VIEW big_lines_per_order AS
        SELECT o_id, (SELECT count(*) FROM lines l
                      WHERE l.l_order = o.o_id AND l.l_price * 10 > o.o_total) AS n
        FROM orders o
    """,
    "orders_above_other_lines": """
        CREATE VIEW orders_above_other_lines AS
        SELECT o_id, o_total FROM orders o
        WHERE o_total > (SELECT sum(l_price) FROM lines l
                         WHERE l.l_order = o.o_id AND l.l_no <> o.o_cust % 3)
    """,
    "lines_with_new_qty": """
        CREATE VIEW lines_with_new_qty AS
        SELECT l_order, l_no, l_qty FROM lines l1
        WHERE l_qty NOT IN (SELECT l2.l_qty FROM lines l2
                            WHERE l2.l_order = l1.l_order AND l2.l_no < l1.l_no)
    """,
    "orders_in_later_lines": """
        CREATE VIEW orders_in_later_lines AS
        SELECT o_id, o_cust FROM orders o
        WHERE o_cust IN (SELECT l_qty FROM lines l
                         WHERE l.l_order > o.o_id AND l.l_order < o.o_id + 3)
    """,
    # subqueries that join: the join one FROM item (an internal view), then as a table
    "orders_with_auto_lines": """
        CREATE VIEW orders_with_auto_lines AS
        SELECT o_id, o_status FROM orders o
        WHERE EXISTS (SELECT 1 FROM lines l JOIN customers c ON c.c_id = l.l_no
                      WHERE l.l_order = o.o_id AND c.c_seg = 'AUTO')
    """,
    "orders_not_in_joined": """
        CREATE VIEW orders_not_in_joined AS
        SELECT o_id, o_cust FROM orders o
        WHERE o_cust NOT IN (SELECT c.c_id FROM lines l JOIN customers c ON c.c_id = l.l_qty
                             WHERE l.l_price > 90)
    """,
    "orders_under_joined_bounds": """
        CREATE VIEW orders_under_joined_bounds AS
        SELECT o_id FROM orders o
        WHERE EXISTS (SELECT 1 FROM lines l, customers c
                      WHERE c.c_id = l.l_no AND l.l_order = o.o_id
                        AND l.l_price * 20 > o.o_total AND c.c_id < o.o_cust)
    """,
    # subqueries that group, correlated: grouped by their correlation too
    "orders_with_repeated_qty": """
        CREATE VIEW orders_with_repeated_qty AS
        SELECT o_id, o_cust FROM orders o
        WHERE o_cust IN (SELECT l_qty FROM lines l WHERE l.l_order < o.o_id + 2
                         GROUP BY l_qty HAVING count(*) > 1)
    """,
    "orders_without_heavy_lines": """
        CREATE VIEW orders_without_heavy_lines AS
        SELECT o_id, o_status FROM orders o
        WHERE NOT EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id
                          HAVING sum(l_qty) > 60)
          AND EXISTS (SELECT l_no FROM lines l WHERE l.l_order = o.o_id
                      GROUP BY l_no HAVING max(l_price) > 50)
    """,
}


@pytest.mark.slow
@pytest.mark.spark
def test_domain_views_match_both_oracles(spark, make_project, tmp_path, use_policy):
    """Built once, then random batches computed in turn where the policy places them and by
    Spark alone; every view checked against both oracles after each."""
    lake = JoinLake(tmp_path / "data", seed=33)
    engine = Engine(make_project(VIEWS, lake.create()), spark=spark)
    assert not engine.plan.broken
    internal = {n for n, v in engine.plan.views.items() if v.owner is not None}
    domains = {n for n in internal if "__domain" in n}
    # views that read the same values of orders share one domain (3 views, and 2)
    assert len(domains) == 6, internal
    assert engine.refresh().ok
    check_both_oracles(engine, spark=False)
    epochs_on_both_paths(engine, lake, use_policy, ["driver", "spark"] * batches(4, bound=1))


@pytest.mark.parametrize(
    ("sql", "at", "construct"),
    [
        (
            "CREATE VIEW v AS SELECT o_id FROM orders o\n"
            "WHERE EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id OR l.l_no = o.o_cust)",
            "l.l_order = o.o_id OR",
            "EXISTS correlated by a condition that may hold where o.o_cust is NULL",
        ),
        (
            "CREATE VIEW v AS SELECT o_id,\n"
            "  (SELECT count(*) FROM lines l WHERE coalesce(o.o_total, 0) < l.l_price) AS n\n"
            "FROM orders o",
            "coalesce(o.o_total",
            "a scalar subquery correlated by a condition that may hold where o.o_total is NULL",
        ),
    ],
)
def test_a_correlation_true_for_null_is_refused_where_written(sql, at, construct):
    error = plan_over_join_lake(sql).broken["v"]
    assert isinstance(error, SqlError)
    assert construct in str(error)
    line = next(i for i, text in enumerate(sql.splitlines(), 1) if at in text)
    start = sql.splitlines()[line - 1].index(at) + 1  # positions name a column of the condition
    assert any(f"v.sql:{line}:{c}:" in str(error) for c in range(start, start + len(at)))


def test_the_domain_is_an_internal_view_in_explain():
    sql = VIEWS["orders_with_line_in_band"]
    plan = plan_over_join_lake(sql).check()
    names = sorted(plan.views)
    assert names == [
        "orders_with_line_in_band",
        "orders_with_line_in_band__domain",
        "orders_with_line_in_band__l",
    ]
    assert plan.views["orders_with_line_in_band__domain"].columns == ("__ivm_d0", "__ivm_d1")


def test_a_domain_without_equalities_says_what_a_change_costs():
    plan = plan_over_join_lake(VIEWS["orders_under_two_bounds"]).check()
    text = "\n".join(explain(v, plan) for v in plan.views.values())
    assert "no equality links l, _ivm_domain (joined on a constant)" in text
    assert "orders_under_two_bounds__domain" in text
