"""Delta joins against the DuckDB oracle: changes to all inputs in the same epoch, deletes of
matched rows, hot keys, NULL keys, rows that stop and start matching, self-joins, joins of
views, and arrangements shared between views."""

from __future__ import annotations

import pytest

from ivm.engine import Engine
from ivm.oracle import compare_views, log_multiset, table_multiset
from tests.lakegen import JoinLake

VIEWS = {
    "order_lines": """
        CREATE VIEW order_lines AS
        SELECT o.o_id, o.o_status, l.l_no, l.l_qty * l.l_price AS amount
        FROM orders o JOIN lines l ON o.o_id = l.l_order
        WHERE l.l_qty > 5
    """,
    "cust_order_lines": """
        CREATE VIEW cust_order_lines AS
        SELECT c.c_name, c.c_seg, o.o_id, l.l_qty
        FROM customers c, orders o, lines l
        WHERE c.c_id = o.o_cust AND o.o_id = l.l_order AND o.o_status = 'O'
          AND l.l_qty < o.o_total
    """,
    "same_customer": """
        CREATE VIEW same_customer AS
        SELECT a.o_id AS first_order, b.o_id AS second_order
        FROM orders a JOIN orders b ON a.o_cust = b.o_cust
        WHERE a.o_id < b.o_id
    """,
    "orders_left_customers": """
        CREATE VIEW orders_left_customers AS
        SELECT o.o_id, o.o_cust, c.c_name, c.c_seg
        FROM orders o LEFT JOIN customers c ON o.o_cust = c.c_id AND c.c_seg = 'AUTO'
    """,
    "customers_right_orders": """
        CREATE VIEW customers_right_orders AS
        SELECT c.c_id, o.o_id, o.o_total
        FROM orders o RIGHT OUTER JOIN customers c ON c.c_id = o.o_cust
        WHERE o.o_id IS NULL OR o.o_status = 'O'
    """,
    "orders_full_lines": """
        CREATE VIEW orders_full_lines AS
        SELECT o.o_id, l.l_order, l.l_no
        FROM orders o FULL OUTER JOIN lines l ON o.o_id = l.l_order
    """,
    "line_pairs": """
        CREATE VIEW line_pairs AS
        SELECT a.l_order, a.l_no, a.l_qty, b.l_price
        FROM lines a JOIN lines b ON a.l_order = b.l_order AND a.l_no = b.l_no
    """,
    "orders_with_lines": """
        CREATE VIEW orders_with_lines AS
        SELECT o_id, o_status FROM orders o
        WHERE o_total > 100 AND EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id AND l_qty > 10)
    """,
    "orders_without_lines": """
        CREATE VIEW orders_without_lines AS
        SELECT o_id, o_cust FROM orders
        WHERE NOT EXISTS (SELECT * FROM lines WHERE l_order = o_id)
    """,
    "orders_of_auto": """
        CREATE VIEW orders_of_auto AS
        SELECT o_id, o_total FROM orders WHERE o_cust IN (SELECT c_id FROM customers WHERE c_seg = 'AUTO')
    """,
    "open_by_seg": """
        CREATE VIEW open_by_seg AS
        SELECT ol.o_id, ol.amount, c.c_seg
        FROM order_lines ol JOIN orders o ON ol.o_id = o.o_id JOIN customers c ON c.c_id = o.o_cust
        WHERE ol.o_status = 'O'
    """,
}


def check(engine: Engine) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        assert log_multiset(engine, c.view, c.epoch) == table_multiset(engine.read_view(c.view))


@pytest.mark.spark
def test_delta_joins_match_duckdb(spark, make_project, tmp_path):
    lake = JoinLake(tmp_path / "data", seed=11)
    root = make_project(VIEWS, lake.create())
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    check(engine)
    for _ in range(4):
        lake.random_batch()
        report = Engine(root, spark=spark).refresh()
        assert report.ok, [v.error for v in report.views]
        check(engine)
    # Lookups happened through arrangements, reading only some keys.
    report_views = {v.view: v for v in report.views}
    assert report_views["order_lines"].lookups


def test_views_share_arrangements(make_project, tmp_path):
    lake = JoinLake(tmp_path / "data", seed=1)
    engine = Engine(make_project(VIEWS, lake.create()))
    arrangements = engine.plan.arrangements
    by_cust = [
        a for k, a in arrangements.items() if k.collection == "orders" and k.key == ("o_cust",)
    ]
    assert len(by_cust) == 1
    assert set(by_cust[0].users) == {
        "cust_order_lines",
        "same_customer",
        "open_by_seg",
        "orders_left_customers",
        "customers_right_orders",
        "orders_of_auto",
    }
    assert {k.name for k in arrangements} >= {"orders__by__o_id", "lines__by__l_order"}
