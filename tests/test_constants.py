"""Rows written in a view (``ivm.sql.constants``, the ``Constant`` plan leaf), against both
oracles: ``VALUES`` joined (inner, LEFT) with sources as a mapping table, a view that is
``VALUES``, ``SELECT`` without ``FROM`` (alone, with scalar subqueries over tables),
``UNION ALL VALUES`` under a GROUP BY, ``EXCEPT VALUES``, and subqueries over no table in
WHERE and SELECT (``IN (SELECT e WHERE c)``, ``EXISTS (SELECT 1 WHERE c)``, ``IN (SELECT * FROM VALUES …)``);
over customers <- orders <- lines with NULL keys (``tests.lakegen.JoinLake``).

After every epoch each view equals DuckDB's and Spark's from-scratch results of its own SQL,
on the driver's path and on Spark's. VALUES that read a column, or whose rows differ in width,
are refused with their position.
"""

from __future__ import annotations

import pytest

from engine.facade import Engine
from ivm.errors import SqlError
from ivm.plan.explain import explain
from ivm.plan.ir import Constant, walk
from tests.lakegen import JoinLake, batches, check_both_oracles, epochs_on_both_paths
from tests.lakegen import plan_over_join_lake as _plan

VIEWS = {
    # a mapping table written in the view, with a duplicate key, a NULL key and decimals
    "segment_weights": """
        CREATE VIEW segment_weights AS
        SELECT c.c_name, w.weight, o.o_total * w.weight AS weighted
        FROM customers c
        JOIN orders o ON o.o_cust = c.c_id
        JOIN (VALUES ('AUTO', 1.5), ('BUILD', 0.25), ('BUILD', 2.0), (NULL, 9.0)) AS w(seg, weight)
          ON w.seg = c.c_seg
    """,
    "status_labels": """
        CREATE VIEW status_labels AS
        SELECT o_id, s.label, s.rank
        FROM orders o LEFT JOIN VALUES ('O', 'open', 1), ('X', 'lost', 3) AS s(st, label, rank)
          ON o.o_status = s.st
    """,
    "calendar": "CREATE VIEW calendar AS VALUES (1, 'jan', DATE '2024-01-01'), (2, 'feb', NULL)",
    "one_row": "CREATE VIEW one_row AS SELECT 1 AS a, 'x' AS b, CAST(2.50 AS DECIMAL(6, 3)) AS c",
    "totals": """
        CREATE VIEW totals AS
        SELECT (SELECT max(o_total) FROM orders) AS most,
               (SELECT count(*) FROM lines WHERE l_qty > 45) AS big_lines
    """,
    "per_customer_with_extra": """
        CREATE VIEW per_customer_with_extra AS
        SELECT k, count(*) AS n, sum(x) AS s
        FROM (SELECT o_cust AS k, o_total AS x FROM orders
              UNION ALL VALUES (1, 10.50), (NULL, 2.25), (99, 0.01))
        GROUP BY k
    """,
    "statuses_but_filled": """
        CREATE VIEW statuses_but_filled AS
        SELECT o_status FROM orders EXCEPT VALUES ('F')
    """,
    "rowless_subqueries": """
        CREATE VIEW rowless_subqueries AS
        SELECT o_id, (SELECT o_total * 2 WHERE o_cust > 3) AS doubled
        FROM orders
        WHERE o_status IN (SELECT * FROM VALUES ('O'), ('F'))
          AND o_cust NOT IN (SELECT o_id % 5 WHERE o_total > 200)
          AND EXISTS (SELECT 1 WHERE o_total > (SELECT 10))
    """,
}


@pytest.mark.spark
def test_constant_views_match_both_oracles(spark, make_project, tmp_path, use_policy):
    """Built once, then random batches computed in turn where the policy places them and by
    Spark alone; every view checked against both oracles after each."""
    lake = JoinLake(tmp_path / "data", seed=27)
    engine = Engine(make_project(VIEWS, lake.create()), spark=spark)
    assert not engine.plan.broken
    plans = engine.plan.views
    assert plans["calendar"].inputs == () and plans["one_row"].inputs == ()
    assert plans["segment_weights__w"].inputs == ()  # the VALUES a join reads: an internal view
    report = engine.refresh()
    assert report.ok, "\n".join(f"{v.view}: {v.error}" for v in report.views if v.error)
    check_both_oracles(engine, spark=False)
    reports = epochs_on_both_paths(engine, lake, use_policy, ["driver", "spark"] * batches(2, 1))
    by_driver = {v.view: v.computed_by for v in reports[0].views}  # a union's constant: none
    assert by_driver["per_customer_with_extra"] == "driver", by_driver
    constant = {v.view: v.computed_by for v in reports[-1].views if not plans[v.view].inputs}
    assert set(constant.values()) == {"nothing"}, constant  # built once, never computed again


def test_subqueries_over_no_table_are_expressions():
    """No join and no internal view: each is an expression over the outer row."""
    plan = _plan(VIEWS["rowless_subqueries"]).check()
    view = plan.views["rowless_subqueries"]
    assert [n for n, v in plan.views.items() if not v.inputs] == ["rowless_subqueries__values"]
    text = explain(view, plan)
    assert "CASE WHEN o_cust > 3 THEN (o_total * 2) END" in text
    assert "COALESCE(o_total > (10), FALSE)" in text


def test_explain_shows_the_rows_and_that_they_never_change():
    plan = _plan(VIEWS["calendar"]).check()
    text = explain(plan.views["calendar"], plan)
    assert "inputs: none (its rows are written in its SQL)" in text
    assert "Constant [col1, col2, col3] 2 rows: (1, 'jan', CAST('2024-01-01' AS DATE))" in text
    constants = [n for n in walk(plan.views["calendar"].root) if isinstance(n, Constant)]
    assert len(constants) == 1 and len(constants[0].rows) == 2


def test_a_values_join_input_is_an_internal_view_named_after_its_alias():
    plan = _plan(VIEWS["segment_weights"].replace("segment_weights", "v")).check()
    assert sorted(plan.views) == ["v", "v__w"]
    assert "VALUES w of view v" in explain(plan.views["v__w"], plan)


@pytest.mark.parametrize(
    ("sql", "at", "said"),
    [
        (
            "CREATE VIEW v AS SELECT * FROM orders o\n"
            "JOIN (VALUES (1, o.o_id)) AS t(a, b) ON t.a = o.o_cust",
            "o.o_id",
            "column o.o_id in VALUES",
        ),
        (
            "CREATE VIEW v AS SELECT * FROM\n  VALUES (1, 2), (3) AS t(a, b)",
            "3)",
            "VALUES rows of 2 and 1 values",
        ),
        (
            "CREATE VIEW v AS SELECT * FROM VALUES\n  (1, rand()) AS t(a, b)",
            "rand()",
            "is not deterministic",
        ),
    ],
)
def test_values_that_are_not_constant_rows_are_refused_where_written(sql, at, said):
    error = _plan(sql).broken["v"]
    assert isinstance(error, SqlError)
    assert said in str(error)
    line = next(i for i, text in enumerate(sql.splitlines(), 1) if at in text)
    start = sql.splitlines()[line - 1].index(at) + 1
    assert any(f"v.sql:{line}:{c}:" in str(error) for c in range(start, start + len(at)))


def test_a_values_without_a_name_is_named_as_spark_names_it():
    """``col1``, … of a ``VALUES`` with no alias, which an uncorrelated subquery joins."""
    sql = (
        "CREATE VIEW v AS SELECT col1, (SELECT max(o_total) FROM orders) AS m FROM VALUES (1), (2)"
    )
    plan = _plan(sql).check()
    assert plan.views["v"].columns == ("col1", "m")
    assert plan.views["v__values"].inputs == ()
