"""A view's SQL evaluated on a small change by the driver and on a large one by Spark, end to
end: a decimal cast that carries refreshes (it aborted the refresh with a pyarrow error); a
row Spark's ANSI mode fails on fails the view's refresh with an EvaluationError naming the view,
the column and the expression, on either path, committing nothing and leaving the other views
be; a failure the driver finds where Spark's plan does not evaluate the row is Spark's to
decide; and every decline of the driver is recorded on the view's result, its metadata and the
`ivm refresh` output."""

from __future__ import annotations

import argparse
import json
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from engine.cli import _refresh
from engine.facade import Engine
from ivm.errors import EvaluationError
from ivm.policy import Policy

pytestmark = pytest.mark.spark


def rows(*values: tuple[int, str, str, float]) -> pa.Table:
    """``(k, x, d, r)`` rows: x and d DECIMAL(3,2), r DOUBLE."""
    return pa.table(
        {
            "k": pa.array([v[0] for v in values], pa.int32()),
            "x": pa.array([Decimal(v[1]) for v in values], pa.decimal128(3, 2)),
            "d": pa.array([Decimal(v[2]) for v in values], pa.decimal128(3, 2)),
            "r": pa.array([v[3] for v in values], pa.float64()),
        }
    )


def delta_source(path: str, first: pa.Table) -> str:
    write_deltalake(path, first, configuration={"delta.enableChangeDataFeed": "true"})
    return path


@pytest.fixture
def source(tmp_path) -> str:
    return delta_source(str(tmp_path / "t"), rows((1, "1.00", "1.00", 0.5)))


def table_of(engine: Engine, view: str) -> list[tuple]:
    return sorted(tuple(r.values()) for r in engine.read_view(view).to_pylist())


def test_a_decimal_cast_that_carries_refreshes(spark, make_project, tmp_path):
    """t(k INT, x DECIMAL(3,2)) holding 9.99, viewed as DECIMAL(5,1); another 9.99 comes:
    the driver rounds it to 10.0 as Spark does (it raised ArrowInvalid)."""
    source = delta_source(str(tmp_path / "t"), rows((1, "9.99", "1.00", 0.5)))
    views = {"v": "CREATE VIEW v AS SELECT k, CAST(x AS DECIMAL(5,1)) AS y FROM t"}
    engine = Engine(make_project(views, {"t": source}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(
        source, rows((2, "9.99", "1.00", 0.5), (3, "-9.95", "1.00", 0.5)), mode="append"
    )
    report = engine.refresh()
    assert report.ok, report.views
    (result,) = report.views
    assert (result.computed_by, result.driver_declined) == ("driver", [])
    assert table_of(engine, "v") == [
        (1, Decimal("10.0")),
        (2, Decimal("10.0")),
        (3, Decimal("-10.0")),
    ]
    assert engine.verify("v").ok


FAILING = [
    ("CAST(x AS DECIMAL(2,1)) AS y", "9.95", "1.00", "y", "overflow", "CAST(`x` AS DECIMAL(2, 1))"),
    ("x / d AS q", "1.00", "0.00", "q", "division by zero", "`x` / `d`"),
]


@pytest.mark.parametrize("driver", [True, False], ids=["driver", "spark"])
@pytest.mark.parametrize("select,x,d,column,kind,operation", FAILING)
def test_a_row_spark_fails_on_fails_the_view_naming_it(
    spark, make_project, source, use_policy, driver, select, x, d, column, kind, operation
):
    """On the driver's path (a small change) and on Spark's alike: the view's refresh fails
    with an EvaluationError naming the view, the column and the expression, nothing of it is
    committed, and the other views refresh."""
    use_policy(None if driver else Policy.spark_only())
    views = {
        "bad": f"CREATE VIEW bad AS SELECT k, {select} FROM t",
        "good": "CREATE VIEW good AS SELECT k, x FROM t",
    }
    engine = Engine(make_project(views, {"t": source}), spark=spark)
    assert engine.refresh().ok
    log = engine.layout.view_log("bad")
    before = engine.table_epoch(log)
    write_deltalake(source, rows((2, x, d, 0.5)), mode="append")
    report = engine.refresh()
    results = {r.view: r for r in report.views}
    assert results["good"].status == "refreshed"
    assert results["bad"].status == "failed"
    error = results["bad"].error or ""
    for said in ("view 'bad'", f"column {column!r}", kind, operation):
        assert said in error, error
    assert engine.table_epoch(log) == before
    with pytest.raises(EvaluationError) as raised:
        engine.refresh_view("bad")
    assert (raised.value.view, raised.value.column, raised.value.kind) == ("bad", column, kind)


def test_a_failure_the_driver_finds_is_sparks_to_decide(spark, make_project, source):
    """The driver divides every row of the projection under the filter; Spark's plan filters
    first (it pushes the filter below the projection) and never divides by zero: Spark's
    answer stands, and the driver's decline says why."""
    views = {
        "ratio": "CREATE VIEW ratio AS SELECT k, q FROM "
        "(SELECT k, d, x / d AS q FROM t) AS s WHERE d <> 0"
    }
    engine = Engine(make_project(views, {"t": source}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(source, rows((2, "1.00", "0.00", 0.5), (3, "1.00", "4.00", 0.5)), mode="append")
    report = engine.refresh()
    assert report.ok, report.views
    (result,) = report.views
    assert result.computed_by == "spark"
    assert any("division by zero" in why for why in result.driver_declined)
    assert [k for k, _ in table_of(engine, "ratio")] == [1, 3]
    assert engine.verify("ratio").ok


def test_declines_are_counted_and_visible(spark, make_project, source, capsys):
    """A view the driver cannot evaluate reports why it declined, in its result, its
    metadata, and `ivm refresh` (JSON and text); a view it evaluates reports none."""
    views = {
        "exact": "CREATE VIEW exact AS SELECT k, x * 2 AS y FROM t",
        "floating": "CREATE VIEW floating AS SELECT k, r * 2 AS y FROM t",
    }
    engine = Engine(make_project(views, {"t": source}), spark=spark)
    assert engine.refresh().ok
    write_deltalake(source, rows((2, "1.00", "1.00", 0.25)), mode="append")
    args = argparse.Namespace(views=None, rebuild=False, json=True)
    assert _refresh(engine, args) == 0
    out = json.loads(capsys.readouterr().out)["views"]
    assert out["exact"]["computed_by"] == "driver"
    assert out["exact"]["driver_declined"] == []
    assert out["floating"]["computed_by"] == "spark"
    (why,) = out["floating"]["driver_declined"]
    assert "double" in why
    write_deltalake(source, rows((3, "1.00", "1.00", 0.75)), mode="append")
    report = engine.refresh()
    results = {r.view: r for r in report.views}
    assert results["exact"].metadata()["driver_declined"] == []
    assert results["floating"].metadata()["driver_declined"] == [why]
    write_deltalake(source, rows((4, "1.00", "1.00", 1.0)), mode="append")
    assert _refresh(engine, argparse.Namespace(views=None, rebuild=False, json=False)) == 0
    text = capsys.readouterr().out
    assert f"floating: driver declined: {why}" in text
    assert "exact: driver declined" not in text
