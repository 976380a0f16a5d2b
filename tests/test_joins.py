"""Delta joins against the DuckDB oracle: changes to all inputs in the same epoch, deletes of
matched rows, hot keys, NULL keys, rows that stop and start matching, self-joins, joins of
views, and arrangements shared between views."""

from __future__ import annotations

import pytest

import ivm.policy
from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from tests.lakegen import JoinLake, batches
from tests.marks import by_turns

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
    # NULL-safe keys (<=>): orders without a customer pair up; beside a key compared by =
    "same_customer_or_none": """
        CREATE VIEW same_customer_or_none AS
        SELECT a.o_id AS first_order, b.o_id AS second_order, a.o_status
        FROM orders a JOIN orders b ON a.o_cust <=> b.o_cust AND a.o_status = b.o_status
        WHERE a.o_id < b.o_id
    """,
    # customers of the same segment (or both without one), with the orders of the second
    "segment_peers_orders": """
        CREATE VIEW segment_peers_orders AS
        SELECT c.c_id, d.c_id AS peer, o.o_id, o.o_total
        FROM customers c JOIN customers d ON c.c_seg <=> d.c_seg JOIN orders o ON o.o_cust = d.c_id
        WHERE c.c_id < d.c_id
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
    # a function Spark evaluates over EXISTS: the driver computes the semi-join, Spark the
    # function and the aggregate above it
    "statuses_reversed_of_orders_with_lines": """
        CREATE VIEW statuses_reversed_of_orders_with_lines AS
        SELECT reverse(o_status) AS sutats, count(*) AS n
        FROM orders o WHERE EXISTS (SELECT 1 FROM lines l WHERE l.l_order = o.o_id)
        GROUP BY reverse(o_status)
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
    "orders_not_of_auto": """
        CREATE VIEW orders_not_of_auto AS
        SELECT o_id, o_cust FROM orders
        WHERE o_cust NOT IN (SELECT c_id FROM customers WHERE c_seg = 'AUTO')
    """,
    "customers_without_open_orders": """
        CREATE VIEW customers_without_open_orders AS
        SELECT c_id, c_seg FROM customers
        WHERE c_id NOT IN (SELECT o_cust FROM orders WHERE o_status = 'O' AND o_total > 900)
    """,
    "lines_not_in_nothing": """
        CREATE VIEW lines_not_in_nothing AS
        SELECT l_order, l_no FROM lines WHERE l_order NOT IN (SELECT o_id FROM orders WHERE o_total < 0)
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


BY_DRIVER = {
    "order_lines",
    "cust_order_lines",
    "same_customer",
    "same_customer_or_none",
    "segment_peers_orders",
    "line_pairs",
    "open_by_seg",
    "orders_of_auto",
    "customers_right_orders",
    "orders_without_lines",
    "orders_full_lines",
    "orders_with_lines",
    "orders_left_customers",
}
"""The views whose small changes the driver computes (ops.join.driver): inner joins on keys
compared by ``=`` or ``<=>``, outer joins, EXISTS and NOT EXISTS."""
NOT_IN = {"orders_not_of_auto", "customers_without_open_orders", "lines_not_in_nothing"}
"""NOT IN: the driver's too, by its state's counts, unless the epoch turns its mode (the
subquery empties or fills, gains or loses its last NULL): Spark recomputes it then."""


@pytest.mark.spark
@pytest.mark.parametrize(
    "driver", [pytest.param(True, id="joins by the driver"), by_turns(False, id="by Spark")]
)
def test_delta_joins_match_duckdb(spark, make_project, tmp_path, driver):
    with ivm.policy.using(driver=driver):
        _delta_joins_match_duckdb(spark, make_project, tmp_path, driver)


def _delta_joins_match_duckdb(spark, make_project, tmp_path, driver: bool) -> None:
    lake = JoinLake(tmp_path / "data", seed=11 if driver else 12)
    root = make_project(VIEWS, lake.create())
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    check(engine)
    not_in_by_driver: set[str] = set()
    for _ in range(batches(4)):
        lake.random_batch()
        report = Engine(root, spark=spark).refresh()
        assert report.ok, [v.error for v in report.views]
        by_driver = {v.view for v in report.views if v.computed_by == "driver"}
        if driver:
            assert BY_DRIVER <= by_driver <= BY_DRIVER | NOT_IN, by_driver
            mixed = next(v for v in report.views if v.view.startswith("statuses_reversed"))
            assert mixed.computed_by == "mixed", mixed
            not_in_by_driver |= by_driver & NOT_IN
        else:
            assert not by_driver, by_driver
        check(engine)
    assert not_in_by_driver or not driver, "no NOT IN computed by the driver"
    # Lookups happened through arrangements, reading only some keys.
    report_views = {v.view: v for v in report.views}
    assert report_views["order_lines"].lookups
    # The paths from customers' and from orders' changes both read lines at the old time:
    # they share one lookup (one scan) instead of one each.
    shared = report_views["cust_order_lines"].lookups
    assert shared["lines[l_order]"].lookups == 1, shared


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
        "segment_peers_orders",
        "open_by_seg",
        "orders_left_customers",
        "customers_right_orders",
        "orders_of_auto",
        "orders_not_of_auto",
        "customers_without_open_orders",
    }
    assert {k.name for k in arrangements} >= {"orders__by__o_id", "lines__by__l_order"}


def test_not_in_follows_null_rules_through_every_mode(spark, make_project, tmp_path):
    """The subquery goes empty -> values -> a NULL -> values -> empty; the outer side has
    NULL keys. Each step equals DuckDB (which applies SQL's NOT IN rules)."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from tests.test_oracle import check_all

    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    conf = {"delta.enableChangeDataFeed": "true"}
    sa = pa.schema([("id", pa.int64()), ("k", pa.int64())])
    sb = pa.schema([("x", pa.int64()), ("keep", pa.bool_())])
    write_deltalake(
        a,
        pa.Table.from_pylist(
            [{"id": i, "k": k} for i, k in enumerate([1, 2, 3, None, 2])], schema=sa
        ),
        configuration=conf,
    )
    write_deltalake(b, pa.Table.from_pylist([], schema=sb), configuration=conf)
    root = make_project(
        {
            "not_in": "CREATE VIEW not_in AS SELECT id, k FROM a "
            "WHERE k NOT IN (SELECT x FROM b WHERE keep)"
        },
        {"a": a, "b": b},
    )
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    check_all(engine)
    assert len(engine.read_view("not_in")) == 5  # empty subquery: every row, NULL k too

    def add_b(rows):
        write_deltalake(
            b,
            pa.Table.from_pylist([{"x": x, "keep": True} for x in rows], schema=sb),
            mode="append",
        )

    steps = [
        lambda: add_b([2]),  # values: anti-join
        lambda: write_deltalake(
            a, pa.Table.from_pylist([{"id": 9, "k": 4}], schema=sa), mode="append"
        ),  # change in anti mode
        lambda: add_b([None]),  # a NULL: no rows
        lambda: DeltaTable(a).delete("id = 0"),  # change in none mode
        lambda: DeltaTable(b).delete("x IS NULL"),  # back to anti
        lambda: DeltaTable(b).delete("true"),  # empty again: every row
    ]
    sizes = []
    for step in steps:
        step()
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        check_all(engine)
        sizes.append(len(engine.read_view("not_in")))
    assert sizes == [2, 3, 0, 0, 2, 5]


def test_key_equalities_joining_two_columns_of_one_input(spark, make_project, tmp_path):
    """``a.grp = b.grp AND a.grp = b.lg`` puts two columns of ``b`` in one key class: the
    join compares one key per input, so ``b.grp = b.lg`` must become a filter of ``b``, not
    be dropped (the fuzzer found rows of 'D', whose lower case differs, joined anyway)."""
    from tests.test_oracle import built_random_lake, check_all

    views = {
        "same_class": """
            CREATE VIEW same_class AS
            SELECT a.id, b.id AS bid, a.grp
            FROM items a JOIN (SELECT id, grp, lower(grp) AS lg FROM items) b
              ON a.grp = b.grp AND a.grp = b.lg
        """,
    }
    lake, engine = built_random_lake(spark, make_project, tmp_path, views, 41)
    assert "D" not in {r["grp"] for r in engine.read_view("same_class").to_pylist()}
    for _ in range(2):
        lake.random_batch()
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        check_all(engine)
