"""Subqueries made joins, against both oracles: correlated scalar subqueries (in WHERE and in
the SELECT list, of a grouped query too, correlated or not, in HAVING), EXISTS and IN in
joins, NOT EXISTS and NOT IN over joins, EXISTS, NOT EXISTS and IN correlated by <>, < or >
besides equalities or alone, joined subqueries that aggregate (internal views), ``JOIN ...
USING``, ``NATURAL JOIN`` and keys written in every branch of an OR; over customers <- orders
<- lines with NULL keys, hot keys, duplicates and rows that stop and start matching
(``tests.lakegen.JoinLake``).

After every epoch each view equals DuckDB's and Spark's from-scratch results of its own SQL
(the SQL as written: neither oracle sees the rewrite), on the driver's path and on Spark's.
(``SELECT *`` over a NATURAL JOIN puts the join columns first in Spark, in their place in
DuckDB: the engine's build checks the columns against Spark's analysis.)
Internal views refresh with their readers, also when only a reader is asked for; they are not
Dagster assets, and the asset of their reader depends on what they read.
"""

from __future__ import annotations

import dagster as dg
import pytest

from assets.keys import AssetKeys
from assets.views import VIEWS_OP, build_assets
from dagster_project.definitions import build_definitions
from dagster_project.jobs import REFRESH_JOB
from engine.facade import Engine
from engine.oracle import compare_views, spark_compare_views
from ivm.config import load_project
from ivm.plan.planner import plan_views
from ivm.sql.parse import parse_view
from tests.lakegen import (
    JOIN_LAKE_COLUMNS,
    JoinLake,
    batches,
    check_both_oracles,
    epochs_on_both_paths,
)

VIEWS = {
    "above_customer_average": """
        CREATE VIEW above_customer_average AS
        SELECT o_id, o_cust, o_total FROM orders o
        WHERE o_total > (SELECT avg(o_total) FROM orders i WHERE i.o_cust = o.o_cust)
    """,
    "biggest_line_of_order": """
        CREATE VIEW biggest_line_of_order AS
        SELECT o.o_id, l.l_no, l.l_qty
        FROM orders o JOIN lines l ON l.l_order = o.o_id
        WHERE l.l_qty >= (SELECT max(l_qty) - 1 FROM lines x WHERE x.l_order = o.o_id)
    """,
    "big_orders_of_customers": """
        CREATE VIEW big_orders_of_customers AS
        SELECT c.c_name, o.o_id
        FROM customers c JOIN orders o ON o.o_cust = c.c_id
        WHERE o.o_id IN (SELECT l_order FROM lines GROUP BY l_order HAVING sum(l_qty) > 40)
          AND EXISTS (SELECT * FROM lines WHERE l_order = o.o_id AND l_qty > 30)
    """,
    "customers_with_finished": """
        CREATE VIEW customers_with_finished AS
        SELECT c.c_id, c.c_seg, o.o_status
        FROM customers c, orders o
        WHERE c.c_id = o.o_cust AND c.c_id IN (SELECT o_cust FROM orders WHERE o_status = 'F')
    """,
    "lines_per_order": """
        CREATE VIEW lines_per_order AS
        SELECT o_id, (SELECT count(*) FROM lines WHERE l_order = o_id) AS n FROM orders
    """,
    "top_line_of_order": """
        CREATE VIEW top_line_of_order AS
        SELECT o_id, o_status, (SELECT max(l_qty) FROM lines l WHERE l.l_order = o.o_id) + 1 AS top
        FROM orders o WHERE o_total > 100
    """,
    "orders_without_big_lines": """
        CREATE VIEW orders_without_big_lines AS
        SELECT c.c_name, o.o_id FROM customers c JOIN orders o ON o.o_cust = c.c_id
        WHERE NOT EXISTS (SELECT * FROM lines WHERE l_order = o.o_id AND l_qty > 40)
    """,
    "segments_not_in": """
        CREATE VIEW segments_not_in AS
        SELECT c.c_seg, count(*) AS n FROM customers c, orders o
        WHERE c.c_id = o.o_cust AND o.o_id NOT IN (SELECT l_order FROM lines WHERE l_qty > 45)
        GROUP BY c.c_seg
    """,
    "above_overall_average": """
        CREATE VIEW above_overall_average AS
        SELECT o_id, o_total FROM orders
        WHERE o_total > (SELECT avg(o_total) FROM orders WHERE o_status = 'O')
    """,
    "busy_customers": """
        CREATE VIEW busy_customers AS
        SELECT o_cust, count(*) AS n FROM orders GROUP BY o_cust
        HAVING count(*) > (SELECT count(*) FROM orders) / 10 AND o_cust IS NOT NULL
    """,
    "orders_with_other_lines": """
        CREATE VIEW orders_with_other_lines AS
        SELECT o_id, o_cust FROM orders o
        WHERE EXISTS (SELECT * FROM lines l WHERE l.l_order = o.o_id AND l.l_no <> o.o_cust)
    """,
    "lines_alone": """
        CREATE VIEW lines_alone AS
        SELECT l1.l_order, l1.l_no FROM lines l1
        WHERE NOT EXISTS (SELECT * FROM lines l2
                          WHERE l2.l_order = l1.l_order AND l2.l_no <> l1.l_no AND l2.l_qty > 20)
    """,
    "cheapest_lines": """
        CREATE VIEW cheapest_lines AS
        SELECT l_order, l_no, l_price FROM lines l1
        WHERE NOT EXISTS (SELECT * FROM lines l2
                          WHERE l2.l_order = l1.l_order AND l2.l_price < l1.l_price)
    """,
    "orders_with_bigger_line": """
        CREATE VIEW orders_with_bigger_line AS
        SELECT c.c_name, o.o_id FROM customers c JOIN orders o ON o.o_cust = c.c_id
        WHERE EXISTS (SELECT * FROM lines l WHERE l.l_order = o.o_id AND l.l_qty > o.o_total / 100)
    """,
    "orders_under_some_line": """
        CREATE VIEW orders_under_some_line AS
        SELECT o_id, o_total FROM orders o
        WHERE EXISTS (SELECT * FROM lines l WHERE l.l_price * 3 > o.o_total)
    """,
    # a subquery empty in some epochs (its span NULL) and not in others
    "orders_above_big_lines": """
        CREATE VIEW orders_above_big_lines AS
        SELECT o_id, o_status FROM orders o
        WHERE NOT EXISTS (SELECT * FROM lines l
                          WHERE l.l_qty >= 49 AND l.l_no = 1 AND o.o_total <= l.l_price * 20)
    """,
    "orders_in_cheaper_lines": """
        CREATE VIEW orders_in_cheaper_lines AS
        SELECT o_id, o_cust FROM orders o
        WHERE o.o_id IN (SELECT l_order FROM lines l WHERE l.l_price * 2 < o.o_total)
    """,
    # (a correlated one Spark refuses: SCALAR_SUBQUERY_IS_IN_GROUP_BY_OR_AGGREGATE_FUNCTION)
    "status_totals_beside_lines": """
        CREATE VIEW status_totals_beside_lines AS
        SELECT o_status, count(*) AS n, (SELECT count(*) FROM lines) + count(*) AS with_lines
        FROM orders GROUP BY o_status
    """,
    "orders_per_customer": """
        CREATE VIEW orders_per_customer AS
        SELECT c.c_name, t.n, t.total
        FROM customers c
        JOIN (SELECT o_cust, count(*) AS n, sum(o_total) AS total FROM orders GROUP BY o_cust) t
          ON t.o_cust = c.c_id
    """,
    "lines_using": """
        CREATE VIEW lines_using AS
        SELECT * FROM (SELECT o_id AS k, o_status FROM orders) a
        JOIN (SELECT l_order AS k, l_qty FROM lines) b USING (k)
    """,
    "same_name_inside": """
        CREATE VIEW same_name_inside AS
        SELECT o_id, o_cust FROM orders
        WHERE o_cust IN (SELECT o_cust FROM orders WHERE o_total > 600)
    """,
    "lines_natural": """
        CREATE VIEW lines_natural AS
        SELECT k, c, c_seg FROM (SELECT o_id AS k, o_cust AS c FROM orders) a
        NATURAL LEFT JOIN (SELECT c_id AS c, c_seg FROM customers) b
    """,
    "open_or_big": """
        CREATE VIEW open_or_big AS
        SELECT o.o_id, l.l_no FROM orders o, lines l
        WHERE (o.o_id = l.l_order AND o.o_status = 'O') OR (l.l_order = o.o_id AND l.l_qty > 40)
    """,
}


def test_subqueries_plan_their_internal_views() -> None:
    """The planner's rewriting of every subquery view into internal views (no Spark)."""
    views = [parse_view(sql, f"{name}.sql") for name, sql in VIEWS.items()]
    plan = plan_views(views, JOIN_LAKE_COLUMNS).check()
    internal = {n for n, v in plan.views.items() if v.owner is not None}
    # 2 + 2 scalar, 2 + 1 IN/EXISTS, 2 joins under NOT EXISTS/NOT IN, 1 derived table, 2
    # uncorrelated scalars with 2 outer inputs carrying their constant (1 of them groups), 4
    # EXISTS/NOT EXISTS correlated by <>, < or > (their value spans), 3 EXISTS, NOT EXISTS
    # and IN correlated by a comparison alone or beside IN's value (their spans; the outer
    # table carrying the constant is shared), a grouped query with a scalar subquery in its
    # SELECT list (its groups and its subquery)
    assert len(internal) == 24, internal


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize("part", [0, 1], ids=["part 1 of 2", "part 2 of 2"])
def test_subquery_views_match_both_oracles(spark, make_project, tmp_path, use_policy, part):
    """Built once, then random batches computed in turn where the policy places them and by
    Spark alone; every view checked against both oracles after each. In two parts (every
    other view), so that a whole-suite run's shard of the slow tests takes at most half."""
    lake = JoinLake(tmp_path / "data", seed=21)
    views = {name: VIEWS[name] for name in sorted(VIEWS)[part::2]}
    engine = Engine(make_project(views, lake.create()), spark=spark)
    assert engine.refresh().ok
    check_both_oracles(engine, spark=False)
    epochs_on_both_paths(engine, lake, use_policy, ["driver", "spark"] * batches(4, bound=1))


@pytest.mark.spark
def test_asking_for_a_view_refreshes_its_internal_views(spark, make_project, tmp_path):
    lake = JoinLake(tmp_path / "data", seed=5)
    views = {k: VIEWS[k] for k in ("above_customer_average", "orders_per_customer")}
    engine = Engine(make_project(views, lake.create()), spark=spark)
    assert engine.refresh(["above_customer_average"]).ok
    lake.random_batch()
    report = engine.refresh(["above_customer_average"])
    assert {v.view for v in report.views} == {
        "above_customer_average",
        "above_customer_average__subquery1",
    }
    check_one = compare_views(engine, ["above_customer_average"])
    assert all(c.equal for c in check_one), [c.describe() for c in check_one]
    status = engine.status()["views"]
    assert status["above_customer_average__subquery1"]["internal_of"] == "above_customer_average"
    assert "INTERNAL VIEW above_customer_average__subquery1" in engine.explain(
        "above_customer_average"
    )


def test_internal_views_are_not_assets_and_their_readers_depend_on_their_inputs(
    make_project, tmp_path
):
    lake = JoinLake(tmp_path / "data", seed=3)
    root = make_project({"orders_per_customer": VIEWS["orders_per_customer"]}, lake.create())
    assets, keys = build_assets(load_project(root))
    specs = {s.key: s for a in assets for s in a.specs}
    assert dg.AssetKey(["views", "orders_per_customer__t"]) not in specs
    spec = specs[keys.view("orders_per_customer")]
    deps = {d.asset_key for d in spec.deps}
    assert {keys.source("orders"), keys.source("customers")} <= deps
    assert keys.view("orders_per_customer__t") not in deps  # its arrangement is an asset
    # Column lineage goes through the internal view to the source's columns.
    lineage = spec.metadata["dagster/column_lineage"].deps_by_column
    assert [(d.asset_key, d.column_name) for d in lineage["total"]] == [
        (keys.source("orders"), "o_total")
    ]


@pytest.mark.spark
def test_a_dagster_run_of_one_view_refreshes_its_internal_view(
    spark, make_project, tmp_path
) -> None:
    """Materializing one view's asset refreshes the internal view it reads in the same step;
    the run materializes that asset (and the epoch), not the internal view, and its check
    passes."""
    lake = JoinLake(tmp_path / "data", seed=7)
    root = make_project({"orders_per_customer": VIEWS["orders_per_customer"]}, lake.create())
    defs = build_definitions(root)
    key = AssetKeys().view("orders_per_customer")
    job = defs.resolve_job_def(REFRESH_JOB)
    for _ in range(2):
        result = job.execute_in_process(
            instance=dg.DagsterInstance.ephemeral(), asset_selection=[key]
        )
        assert result.success
        mats = {m.asset_key for m in result.asset_materializations_for_node(VIEWS_OP)}
        assert key in mats and not any("__t" in k.path[-1] for k in mats), mats  # and the epoch
        assert all(e.passed for e in result.get_asset_check_evaluations())
        lake.random_batch()
    engine = Engine(root, spark=spark)
    assert engine.view_status("orders_per_customer__t").table_epoch == 2
    assert all(c.equal for c in spark_compare_views(engine)), "internal view or reader differs"
