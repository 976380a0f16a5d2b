"""The execution policy: where a refresh runs is decided before it runs, from the change's size
and the plan, recorded with its reason on the result, the CLI's output and EXPLAIN; a policy
set for an engine (or a project's ``[policy]``) steers every step, and both placements give the
same rows (DuckDB oracle)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from engine.facade import Engine
from engine.oracle import compare_views
from ivm import policy
from ivm.plan.driver import driver_support
from ivm.plan.planner import plan_views
from ivm.policy import Policy
from ivm.sql.parse import parse_view

T = pa.schema([("k", pa.int64()), ("grp", pa.string()), ("v", pa.int64())])
VIEWS = {
    "sums": "CREATE VIEW sums AS SELECT grp, sum(v) AS s, count(*) AS n FROM src GROUP BY grp",
    "reversed": "CREATE VIEW reversed AS SELECT k, reverse(grp) AS r FROM src",
}


def _plan(sql: str):
    return plan_views([parse_view(sql, "v.sql")], {"src": ("k", "grp", "v")}).views["v"]


def test_placement_is_decided_from_the_change_and_the_plan() -> None:
    """No Spark: the rules themselves, each with the reason it gives."""
    grouped = _plan("CREATE VIEW v AS SELECT grp, sum(v) AS s FROM src GROUP BY grp").root
    outer = _plan("CREATE VIEW v AS SELECT k, reverse(grp) AS r FROM src").root
    chosen = Policy(driver_change_rows=100)
    assert chosen.place(grouped, 100).where == "driver"
    assert "100 input updates <= driver_change_rows = 100" in chosen.place(grouped, 100).reason
    big = chosen.place(grouped, 101)
    assert (big.where, big.small) == ("spark", False)
    assert "101 input updates > driver_change_rows = 100" in big.reason
    assert driver_support(outer) == "Reverse is computed by Spark"
    unsupported = chosen.place(outer, 5)
    assert (unsupported.where, unsupported.small) == ("spark", True)  # small: driver writes
    assert "Reverse is computed by Spark" in unsupported.reason
    assert chosen.place(grouped, 5, build=True).where == "spark"
    assert Policy.spark_only().place(grouped, 0).where == "spark"
    assert "policy.driver = false" in Policy.spark_only().place(grouped, 0).reason
    assert "at most 100 updates" in chosen.describe(grouped)
    assert chosen.describe(outer) == "Spark (Reverse is computed by Spark)"


@pytest.mark.parametrize(
    ("select", "reason"),
    [
        ("SELECT k FROM src WHERE grp IS DISTINCT FROM 'a'", "computed by Spark"),
        ("SELECT substr(grp, v) AS s FROM src", "substr with a computed start"),
        ("SELECT substr(grp, -2) AS s FROM src", "substr from the end"),
        ("SELECT sqrt(v) AS r FROM src", "Sqrt is computed by Spark"),
        ("SELECT year(to_date(grp)) AS y FROM src", "TO_DATE is computed by Spark"),
        ("SELECT k, reverse(grp) AS r FROM src", "Reverse is computed by Spark"),
        ("SELECT a.k FROM src a JOIN src b ON a.k = b.v WHERE sqrt(b.v) > 1", "Sqrt"),
    ],
)
def test_what_the_driver_never_computes_is_placed_on_spark_before_the_refresh(
    select: str, reason: str
) -> None:
    """Expressions, aggregates and nodes the driver's renderers do not compute, whatever the
    types and rows, are known from the plan: the placement says so before anything runs (the
    renderers decline only for what depends on types or rows)."""
    root = _plan(f"CREATE VIEW v AS {select}").root
    placed = Policy().place(root, 1)
    assert placed.where == "spark" and reason in placed.reason, placed
    assert placed.small  # what it causes is still small: the driver writes it
    assert reason in Policy().describe(root)


@pytest.mark.parametrize(
    "select",
    [
        "SELECT k, upper(grp) AS g, substr(grp, 2, 3) AS s FROM src WHERE v IN (1, 2) AND grp IS "
        "NOT NULL",
        "SELECT grp, count(DISTINCT v) AS n, min(v) AS lo, avg(v) AS a FROM src GROUP BY grp",
        "SELECT a.k, b.grp FROM src a JOIN src b ON a.k = b.v WHERE CASE WHEN a.v > 1 THEN "
        "true ELSE false END",
        "SELECT sum(v) AS s, count(*) AS n, avg(DISTINCT v) AS a FROM src",
        "SELECT grp, string_agg(grp, ',') AS s, listagg(DISTINCT k, '|') AS d, "
        "percentile_disc(0.5) WITHIN GROUP (ORDER BY k) AS p FROM src GROUP BY grp",
        "SELECT k, year(v) AS y, month(v) AS m FROM src WHERE day(v) > 3",
        "SELECT k FROM src WHERE grp LIKE 'a\\_%' AND EXTRACT(YEAR FROM v) = 1994 "
        "AND v < DATE '1994-01-01' + INTERVAL '1' YEAR",
        "SELECT a.k FROM src a JOIN src b ON a.grp <=> b.grp",
        "SELECT k, CASE grp WHEN 'a' THEN 1 END AS c FROM src WHERE (v > 1) IS NOT TRUE",
    ],
)
def test_what_the_driver_computes_is_placed_on_it(select: str) -> None:
    root = _plan(f"CREATE VIEW v AS {select}").root
    assert driver_support(root) is None
    assert Policy().place(root, 1).where == "driver"


def test_using_restores_the_previous_policy() -> None:
    before = policy.current()
    with policy.using(driver_state_rows=7) as inner:
        assert policy.current() is inner and inner.driver_state_rows == 7
        with policy.using(Policy.spark_only()):
            assert not policy.current().driver
        assert policy.current() is inner
    assert policy.current() is before


@pytest.fixture
def src(tmp_path: Path) -> str:
    path = str(tmp_path / "src")
    data = pa.Table.from_pylist(
        [{"k": k, "grp": "ab"[k % 2], "v": k * 10} for k in range(1, 41)], schema=T
    )
    write_deltalake(path, data, configuration={"delta.enableChangeDataFeed": "true"})
    return path


def _change(path: str, k: int) -> None:
    row = pa.Table.from_pylist([{"k": k, "grp": "b", "v": k}], schema=T)
    write_deltalake(path, row, mode="append")


@pytest.mark.spark
@pytest.mark.parametrize("driver", [True, False], ids=["defaults", "spark_only"])
def test_the_engines_policy_places_every_refresh(spark, make_project, src, driver) -> None:
    """An engine given a policy runs under it: the defaults put a small change of an
    aggregate on the driver, ``spark_only`` on Spark, a function the driver does not evaluate always on Spark; each
    result says where and why, EXPLAIN says the rule, and every view equals DuckDB's."""
    chosen = Policy() if driver else Policy.spark_only()
    before = policy.current()
    try:
        engine = Engine(make_project(VIEWS, {"src": src}), spark=spark, policy=chosen)
        assert policy.current() is chosen
        first = engine.refresh()
        assert first.ok, [v.error for v in first.views]
        _change(src, 41)
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        results = {v.view: v for v in report.views}
        sums, outer = results["sums"], results["reversed"]
        if driver:
            assert sums.computed_by == "driver", sums.driver_declined
            assert sums.placement.startswith("driver (1 input updates <= driver_change_rows")
            assert "the driver (Arrow) when its inputs change" in engine.explain("sums")
        else:
            assert sums.computed_by == "spark"
            assert sums.placement == "spark (the driver is off: policy.driver = false)"
            assert "refreshes run on: Spark (policy.driver = false)" in engine.explain("sums")
        assert outer.computed_by == "spark"
        assert ("Reverse is computed" if driver else "policy.driver = false") in outer.placement
        assert sums.metadata()["placement"] == sums.placement
        for c in compare_views(engine):
            assert c.equal, c.describe()
    finally:
        policy.install(before)


@pytest.mark.spark
def test_a_projects_policy_table_is_put_in_force(spark, make_project, src) -> None:
    before = policy.current()
    try:
        root = make_project(VIEWS, {"src": src}, "[policy]\ndriver = false")
        Engine(root, spark=spark)
        assert policy.current() == Policy(driver=False)
    finally:
        policy.install(before)
