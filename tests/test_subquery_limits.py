"""``ORDER BY ... LIMIT`` inside subqueries (``ivm.sql.limits``), against both oracles: a
correlated scalar subquery with ``LIMIT 1`` in the SELECT list (the last line of each order)
and with ``LIMIT 1 OFFSET 1`` in WHERE (orders at least their customer's second biggest), a
correlated and an uncorrelated ``IN`` with ``LIMIT``, ``EXISTS`` with ``LIMIT 1``, and an
uncorrelated scalar ``LIMIT 1`` in HAVING; and an uncorrelated grouped ``NOT IN`` beside another
and a DISTINCT one under OR (``ivm.sql.subqueries._as_rows``); over customers <- orders <-
lines with NULL keys (``tests.lakegen.JoinLake``). Every ORDER BY orders the rows it may keep
totally.

After every epoch each view equals DuckDB's and Spark's from-scratch results of its own SQL,
on the driver's path and on Spark's. A LIMIT without ORDER BY, a scalar subquery that keeps
more than one row and a correlation other than equalities are refused with their position.
"""

from __future__ import annotations

import pytest

from engine.facade import Engine
from ivm.errors import SqlError
from ivm.plan.explain import explain
from tests.lakegen import JoinLake, batches, check_both_oracles, epochs_on_both_paths
from tests.lakegen import plan_over_join_lake as _plan

VIEWS = {
    "last_line": """
        CREATE VIEW last_line AS
        SELECT o.o_id,
               (SELECT l.l_qty FROM lines l WHERE l.l_order = o.o_id
                ORDER BY l.l_no DESC LIMIT 1) AS last_qty
        FROM orders o
    """,
    "above_second_biggest": """
        CREATE VIEW above_second_biggest AS
        SELECT o.o_id, o.o_total
        FROM orders o
        WHERE o.o_total >= (SELECT p.o_total FROM orders p WHERE p.o_cust = o.o_cust
                            ORDER BY p.o_total DESC, p.o_id LIMIT 1 OFFSET 1)
    """,
    "dearest_two_lines": """
        CREATE VIEW dearest_two_lines AS
        SELECT o.o_id, o.o_status
        FROM orders o
        WHERE o.o_cust IN (SELECT l.l_qty AS q FROM lines l
                           WHERE l.l_order = o.o_id AND l.l_price > 10
                           ORDER BY l.l_price DESC, l.l_no LIMIT 2)
    """,
    "top_order_customers": """
        CREATE VIEW top_order_customers AS
        SELECT c.c_id, c.c_name
        FROM customers c
        WHERE c.c_id IN (SELECT o_cust FROM orders ORDER BY o_total DESC, o_id LIMIT 5)
          AND EXISTS (SELECT 1 FROM orders o WHERE o.o_cust = c.c_id AND o.o_status = 'O'
                      ORDER BY o.o_id LIMIT 1)
    """,
    "over_the_dearest_line": """
        CREATE VIEW over_the_dearest_line AS
        SELECT o_cust, sum(o_total) AS total
        FROM orders
        GROUP BY o_cust
        HAVING sum(o_total) > (SELECT l_price * 10 FROM lines
                               ORDER BY l_price DESC, l_order, l_no LIMIT 1)
    """,
    # a grouped NOT IN beside another NOT IN, and one under OR (the rows of a derived table)
    "beside_a_grouped_not_in": """
        CREATE VIEW beside_a_grouped_not_in AS
        SELECT o.o_id, c.c_name
        FROM orders o JOIN customers c ON c.c_id = o.o_cust
        WHERE o.o_id NOT IN (SELECT l_order FROM lines GROUP BY l_order HAVING count(*) > 2)
          AND o.o_cust NOT IN (SELECT l_qty FROM lines WHERE l_price > 90)
          AND (o.o_total > 900 OR o.o_cust NOT IN (SELECT DISTINCT l_no FROM lines))
    """,
}


@pytest.mark.slow
@pytest.mark.spark
def test_subquery_limits_match_both_oracles(spark, make_project, tmp_path, use_policy):
    """Built once, then random batches computed in turn where the policy places them and by
    Spark alone; every view checked against both oracles after each."""
    lake = JoinLake(tmp_path / "data", seed=28)
    engine = Engine(make_project(VIEWS, lake.create()), spark=spark)
    assert not engine.plan.broken, engine.plan.broken
    report = engine.refresh()
    assert report.ok, "\n".join(f"{v.view}: {v.error}" for v in report.views if v.error)
    check_both_oracles(engine, spark=False)
    epochs_on_both_paths(engine, lake, use_policy, ["driver", "spark"] * batches(2, 1))


def test_a_limit_per_key_is_a_topk_per_key_of_an_internal_view() -> None:
    plan = _plan(VIEWS["dearest_two_lines"])
    plan.check()
    (internal,) = [v for v in plan.views if v != "dearest_two_lines"]
    text = explain(plan.views[internal], plan)
    assert "the rows kept by the LIMIT at 7:66" in text, text
    assert "TopK r" in text and "PARTITION BY _c0 ORDER BY _w0 DESC, _w1 LIMIT 2" in text, text
    assert "Filter l_price > 10" in text, text  # the subquery's own condition, under the TopK
    scalar = _plan(VIEWS["last_line"])
    scalar.check()
    texts = "\n".join(explain(v, scalar) for v in scalar.views.values())
    assert "PARTITION BY _c0 ORDER BY _w0 DESC LIMIT 1" in texts, texts
    # the max of at most one row per key: a tower of one level (ivm.plan.ir.bounded_groups)
    assert "tower of 1 levels, 16-way, expected group size 1 " in texts, texts
    assert "LeftOuterJoin" in texts, texts  # an order without lines reads NULL


def test_exists_and_an_aggregate_drop_their_limit() -> None:
    plan = _plan(
        "CREATE VIEW v AS SELECT o_id FROM orders o "
        "WHERE EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id ORDER BY l_no LIMIT 3)"
    )
    plan.check()
    assert list(plan.views) == ["v"]  # a semi-join on the lines themselves: no ranking
    assert "TopK" not in explain(plan.views["v"], plan)
    one_row = _plan(  # an aggregate without GROUP BY has one row: its LIMIT 1 changes nothing
        "CREATE VIEW v AS SELECT o_id FROM orders o WHERE o_total > "
        "(SELECT max(l_price) FROM lines l WHERE l.l_order = o.o_id ORDER BY 1 LIMIT 1)"
    )
    one_row.check()
    assert "TopK" not in "\n".join(explain(v, one_row) for v in one_row.views.values())


@pytest.mark.parametrize(
    "sql, message, col",
    [
        (
            "SELECT o_id FROM orders o WHERE o_cust IN "
            "(SELECT l_qty FROM lines l WHERE l.l_order = o.o_id LIMIT 2)",
            "an IN subquery with LIMIT and no ORDER BY (it keeps any rows)",
            118,
        ),
        (
            "SELECT o_id, (SELECT l_qty FROM lines l WHERE l.l_order = o.o_id "
            "ORDER BY l_no LIMIT 2) AS q FROM orders o",
            "a scalar subquery with a LIMIT other than 1 (several rows)",
            103,
        ),
        (
            "SELECT o_id FROM orders o WHERE o_cust IN "
            "(SELECT l_qty FROM lines l WHERE l.l_order > o.o_id ORDER BY l_no LIMIT 2)",
            "an IN subquery with LIMIT correlated by a condition other than inner = outer "
            "(l.l_order > o.o_id)",
            95,
        ),
        (
            "SELECT o_id FROM orders o WHERE o_cust IN "
            "(SELECT l_qty FROM lines l WHERE l.l_order = o.o_id ORDER BY o.o_total LIMIT 2)",
            "an IN subquery with LIMIT whose SELECT list or ORDER BY reads the outer row's "
            "o.o_total",
            123,
        ),
    ],
)
def test_limits_it_cannot_rank_are_refused_by_name_and_position(sql, message, col) -> None:
    with pytest.raises(SqlError) as e:
        _plan(f"CREATE VIEW v AS {sql}").check()
    assert message in str(e.value), str(e.value)
    assert (e.value.line, e.value.col) == (1, col), str(e.value)


def test_an_in_subquery_over_rows_numbered_in_a_derived_table_plans() -> None:
    """A ranking the subquery's own WHERE bounds is every row numbered (a Window), not a
    crash of the planner (it read the ranking as a projection)."""
    plan = _plan(
        "CREATE VIEW v AS SELECT o_id FROM orders o WHERE o_cust IN (SELECT s.q FROM "
        "(SELECT l_qty AS q, l_order AS k, ROW_NUMBER() OVER (PARTITION BY l_order "
        "ORDER BY l_no) AS rn FROM lines) AS s WHERE s.rn <= 2 AND s.k = o.o_id)"
    )
    plan.check()
    texts = "\n".join(explain(v, plan) for v in plan.views.values())
    assert "ROW_NUMBER() OVER (PARTITION BY" in texts and "Filter rn <= 2" in texts, texts


def test_a_group_of_a_topk_partition_expects_at_most_its_limit_rows() -> None:
    plan = _plan(
        "CREATE VIEW v AS SELECT k, max(q) AS m, min(q) AS n FROM (SELECT l_order AS k, "
        "l_qty AS q, ROW_NUMBER() OVER (PARTITION BY l_order ORDER BY l_no) AS rn FROM lines) "
        "WHERE rn <= 3 GROUP BY k"
    )
    plan.check()
    text = explain(plan.views["v"], plan)
    assert "max/min(q): tower of 1 levels, 16-way, expected group size 3 " in text, text
    wider = _plan(  # grouped by less than the partition: groups of any size
        "CREATE VIEW v AS SELECT q, max(k) AS m FROM (SELECT l_order AS k, l_qty AS q, "
        "ROW_NUMBER() OVER (PARTITION BY l_order ORDER BY l_no) AS rn FROM lines) "
        "WHERE rn <= 3 GROUP BY q"
    )
    assert "(default)" in explain(wider.views["v"], wider)
