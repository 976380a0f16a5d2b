"""Window functions, against both oracles: aggregates over partitions (whole, running,
ROWS frames), RANK, DENSE_RANK, PERCENT_RANK, CUME_DIST, ROW_NUMBER (unbounded), NTILE,
LAG, LEAD, FIRST_VALUE, LAST_VALUE, window calls inside expressions, over a join, without
PARTITION BY (one partition), in QUALIFY and over a grouped query's groups; over customers <- orders <- lines with NULL
keys, hot keys, duplicates and rows that move between partitions (``tests.lakegen.JoinLake``).

Each view orders its rows totally where its values depend on the order (the SQL is then
deterministic, so both oracles give one answer). After every epoch each view equals DuckDB's
and Spark's from-scratch results of its own SQL; windows are computed by Spark.
"""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from assets.views import build_assets
from engine.facade import Engine
from ivm.config import load_project
from ivm.errors import SqlError
from ivm.plan.explain import explain
from ivm.plan.ir import Window, walk
from ivm.plan.planner import plan_views
from ivm.sql.parse import parse_view
from tests.lakegen import JoinLake, batches, check_both_oracles, epochs_on_both_paths

VIEWS = {
    "order_ranks": """
        CREATE VIEW order_ranks AS
        SELECT o_id, o_cust, o_total,
               rank() OVER (PARTITION BY o_cust ORDER BY o_total DESC) AS r,
               dense_rank() OVER (PARTITION BY o_cust ORDER BY o_status) AS dr,
               sum(o_total) OVER (PARTITION BY o_cust) AS cust_total,
               count(*) OVER (PARTITION BY o_cust, o_status) AS n
        FROM orders
    """,
    "running_orders": """
        CREATE VIEW running_orders AS
        SELECT o_id, o_cust,
               sum(o_total) OVER (PARTITION BY o_cust ORDER BY o_id
                                  ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS running,
               max(o_total) OVER (PARTITION BY o_cust ORDER BY o_id) AS top_so_far,
               lag(o_total, 1) OVER (PARTITION BY o_cust ORDER BY o_id) AS prev,
               lead(o_id, 1, -1) OVER (PARTITION BY o_cust ORDER BY o_id) AS next_id
        FROM orders WHERE o_status = 'O'
    """,
    "line_positions": """
        CREATE VIEW line_positions AS
        SELECT l_order, l_no, l_qty,
               row_number() OVER (PARTITION BY l_order ORDER BY l_qty DESC, l_no) AS rn,
               first_value(l_no) OVER (PARTITION BY l_order ORDER BY l_qty DESC, l_no) AS first_no,
               last_value(l_qty) OVER (PARTITION BY l_order ORDER BY l_no, l_qty
                   ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) AS last_qty,
               ntile(2) OVER (PARTITION BY l_order ORDER BY l_no, l_qty) AS half
        FROM lines
    """,
    "cheapest_two_per_customer": """
        CREATE VIEW cheapest_two_per_customer AS
        SELECT o_id, o_cust, o_total FROM orders
        QUALIFY dense_rank() OVER (PARTITION BY o_cust ORDER BY o_total) <= 2
    """,
    "customer_shares": """
        CREATE VIEW customer_shares AS
        SELECT c.c_name, o.o_id,
               o.o_total * count(*) OVER (PARTITION BY c.c_id)
                 - sum(o.o_total) OVER (PARTITION BY c.c_id) AS spread,
               percent_rank() OVER (PARTITION BY c.c_seg ORDER BY o.o_total) AS pr,
               cume_dist() OVER (ORDER BY o.o_id) AS cd
        FROM customers c JOIN orders o ON o.o_cust = c.c_id
    """,
    "later_orders": """
        CREATE VIEW later_orders AS
        SELECT * FROM (
            SELECT o_id, o_cust,
                   row_number() OVER (PARTITION BY o_cust ORDER BY o_total DESC, o_id) AS rn
            FROM orders) t
        WHERE rn > 1
    """,
    "customer_revenue_rank": """
        CREATE VIEW customer_revenue_rank AS
        SELECT o_cust, sum(o_total) AS s, count(*) AS n,
               rank() OVER (ORDER BY sum(o_total) DESC) AS r
        FROM orders GROUP BY o_cust
    """,
    "top_status_per_customer": """
        CREATE VIEW top_status_per_customer AS
        SELECT o_cust, o_status, count(*) AS n FROM orders GROUP BY o_cust, o_status
        QUALIFY dense_rank() OVER (PARTITION BY o_cust ORDER BY count(*) DESC) = 1
    """,
}
CATALOG = {
    "customers": ("c_id", "c_name", "c_seg"),
    "orders": ("o_id", "o_cust", "o_status", "o_total"),
    "lines": ("l_order", "l_no", "l_qty", "l_price"),
}


def test_windows_plan_by_partition_and_say_when_there_is_one() -> None:
    plan = plan_views([parse_view(sql, f"{n}.sql") for n, sql in VIEWS.items()], CATALOG).check()
    keys = {
        name: [n.keys for n in walk(v.root) if isinstance(n, Window)]
        for name, v in plan.views.items()
    }
    assert keys == {
        "order_ranks": [("o_cust",)],  # the key every call partitions by
        "running_orders": [("o_cust",)],
        "line_positions": [("l_order",)],
        "cheapest_two_per_customer": [("o_cust",)],
        "customer_shares": [()],  # CUME_DIST over every row: one partition
        "later_orders": [("o_cust",)],  # an unbounded ROW_NUMBER numbers every row
        "customer_revenue_rank": [()],  # over the groups (the aggregate's output)
        "top_status_per_customer": [("__w0",)],  # o_cust, a column of the groups
    }
    text = explain(plan.views["customer_shares"], plan)
    assert "one partition" in text and "every change recomputes it whole" in text


@pytest.mark.parametrize(
    ("sql", "message"),
    [
        (
            "SELECT o_id, last_value(o_total) OVER (PARTITION BY o_cust ORDER BY o_status) AS v "
            "FROM orders",
            "LAST_VALUE over a RANGE frame whose rows depend on ties",
        ),
        (
            "SELECT o_id, count(DISTINCT o_status) OVER (PARTITION BY o_cust) AS v FROM orders",
            r"COUNT\(DISTINCT \.\.\.\) OVER",
        ),
        (
            "SELECT o_id, collect_list(o_status) OVER (PARTITION BY o_cust) AS v FROM orders",
            "window function COLLECT_LIST",
        ),
        ("SELECT o_id, rank() OVER (PARTITION BY o_cust) AS v FROM orders", "needs ORDER BY"),
        ("SELECT o_id, rank() OVER (ORDER BY o_total) FROM orders", "needs a column name"),
        (
            "SELECT o_cust, count(*) AS n, rank() OVER (ORDER BY count(*)) FROM orders "
            "GROUP BY o_cust",
            "a window call without a name",
        ),
        (
            "SELECT o_cust, rank() OVER (ORDER BY o_cust) AS r FROM orders GROUP BY o_cust "
            "ORDER BY count(*) LIMIT 3",
            "ORDER BY an aggregate in a grouped query with window calls",
        ),
    ],
)
def test_windows_refused_by_name_and_position(sql: str, message: str) -> None:
    view = parse_view(f"CREATE VIEW v AS {sql}", "v.sql")
    error = plan_views([view], CATALOG).broken["v"]
    assert isinstance(error, SqlError), error
    assert str(error).startswith("v.sql:1:"), error
    with pytest.raises(SqlError, match=message):
        raise error


def test_window_columns_have_lineage_in_dagster(make_project, tmp_path) -> None:
    lake = JoinLake(tmp_path / "data", seed=2)
    root = make_project({"order_ranks": VIEWS["order_ranks"]}, lake.create())
    assets, keys = build_assets(load_project(root))
    spec = next(s for a in assets for s in a.specs if s.key == keys.view("order_ranks"))
    lineage = spec.metadata["dagster/column_lineage"].deps_by_column
    # a window value comes from its partition, order and argument columns (as a TopK's rank)
    assert {d.column_name for d in lineage["r"]} == {"o_cust", "o_total"}
    assert {d.column_name for d in lineage["cust_total"]} == {"o_cust", "o_total"}
    assert {d.column_name for d in lineage["dr"]} == {"o_cust", "o_status"}
    assert {d.column_name for d in lineage["o_id"]} == {"o_id"}


@pytest.mark.spark
def test_window_views_match_both_oracles(spark, make_project, tmp_path, use_policy):
    """Every view after every batch against DuckDB (and Spark from scratch after the
    last), by turns where the policy places the change and by Spark alone. On the driver's
    turns every window view is the driver's: it reads and appends the touched partitions'
    rows, and Spark's window functions value them over local relations (one job)."""
    lake = JoinLake(tmp_path / "data", seed=41)
    engine = Engine(make_project(VIEWS, lake.create()), spark=spark)
    assert engine.refresh().ok
    check_both_oracles(engine)
    paths = ["driver", "spark", "driver"][: batches(3)]
    reports = epochs_on_both_paths(engine, lake, use_policy, paths)
    for path, report in zip(paths, reports, strict=True):
        if path == "driver":
            by = {v.view: (v.computed_by, v.driver_declined) for v in report.views}
            assert all(b[0] in ("driver", "nothing") for b in by.values()), by


@pytest.mark.spark
def test_a_floating_point_sum_over_a_range_frame_is_refused_when_built(
    spark, make_project, tmp_path
):
    """Spark adds rows tied in ORDER BY in an order it does not fix, so a floating-point
    running sum over RANGE could be recomputed differently at the old time than the view
    holds: refused by name when the view is built; over ROWS (ties ordered) it builds."""
    path = str(tmp_path / "m")
    rows = [{"k": k % 3, "t": k % 4, "x": k / 7} for k in range(24)]
    write_deltalake(
        path, pa.Table.from_pylist(rows), configuration={"delta.enableChangeDataFeed": "true"}
    )
    views = {
        "range_sum": "CREATE VIEW range_sum AS "
        "SELECT k, t, sum(x) OVER (PARTITION BY k ORDER BY t) AS s FROM m",
        "rows_sum": "CREATE VIEW rows_sum AS SELECT k, t, sum(x) OVER (PARTITION BY k ORDER BY t "
        "ROWS BETWEEN UNBOUNDED PRECEDING AND CURRENT ROW) AS s FROM m",
    }
    engine = Engine(make_project(views, {"m": path}), spark=spark)
    errors = {v.view: v.error for v in engine.refresh().views}
    assert errors["rows_sum"] is None
    assert "SUM of a floating-point value over a RANGE frame" in str(errors["range_sum"])
    assert "write ROWS BETWEEN" in str(errors["range_sum"])
