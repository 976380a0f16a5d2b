"""A view's SQL evaluated on a small change by the driver and on a large one by Spark, end to
end: a decimal cast that carries refreshes (it aborted the refresh with a pyarrow error);
decimal products and quotients are rounded once, as Spark's 39 digits round them; a row
Spark's ANSI mode fails on fails the view's refresh with an EvaluationError naming the view,
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


ROUNDED_ONCE = [
    # (operator, the operands' types (precision, scale), the operands, Spark's value): past the
    # result's scale the exact value reads 4999...9 to the 38th place (or digit) and 5 or more
    # after it, so that rounding it half up to 38 places (or digits) first carries into the
    # result's last place; Spark's 39 truncated ones do not.
    (
        "/",  # DECIMAL(38, 6); exactly 0.4018364999...999249...
        ((38, 18), (38, 18)),
        ("31396509370431242156.852744949446412181", "78132547367974890675.318804910570374222"),
        "0.401836",
    ),
    (
        "/",  # DECIMAL(38, 6)
        ((38, 36), (38, 36)),
        ("61.378201900839937473306195232571591071", "65.181925770118062042847587632669856906"),
        "0.941644",
    ),
    (
        "/",  # DECIMAL(38, 37)
        ((10, 9), (38, 0)),
        ("-1.759411562", "-236427626051655500201692013884913"),
        "7.4416E-33",
    ),
    (
        "*",  # DECIMAL(38, 6)
        ((38, 18), (38, 18)),
        ("61379972300.528378194889497536", "7709388507161651283.538740223102594115"),
        "473202053023593980188983232323.374035",
    ),
    (
        "*",  # DECIMAL(38, 6)
        ((38, 10), (38, 10)),
        ("2116547242014531652095711002.5585113776", "-3583.9825592954"),
        "-7585668401304861520955576681903.182184",
    ),
    (
        "*",  # DECIMAL(38, 33)
        ((38, 36), (38, 36)),
        ("-96.937786151439040986073327356903975008", "-97.164032601351287458921425897105384897"),
        "9418.866213921242330005611576600718177",
    ),
]


def operand_rows(*rows: tuple[int, int | None]) -> pa.Table:
    """``(k, i)`` rows holding :data:`ROUNDED_ONCE`'s ``i``-th operands in columns ``x{i}`` and
    ``y{i}`` and NULL in the others' (every operand 1 where ``i`` is None)."""
    columns = {"k": pa.array([k for k, _ in rows], pa.int32())}
    for i, (_, shapes, operands, _) in enumerate(ROUNDED_ONCE):
        for name, (precision, scale), operand in zip("xy", shapes, operands, strict=True):
            given = {i: Decimal(operand), None: Decimal(1)}
            values = [given.get(j) for _, j in rows]
            columns[f"{name}{i}"] = pa.array(values, pa.decimal128(precision, scale))
    return pa.table(columns)


def test_decimal_products_and_quotients_are_rounded_once(spark, make_project, tmp_path):
    """Spark 4 truncates a decimal product to 39 digits and a quotient to 39 places before it
    rounds them half up to the result's scale: on a small change the driver gives Spark's
    values where the exact one lies just below half of the result's last place (rounded to 38
    first, they came out one unit too large)."""
    results = [f"x{i} {op} y{i} AS r{i}" for i, (op, _, _, _) in enumerate(ROUNDED_ONCE)]
    source = delta_source(str(tmp_path / "t"), operand_rows((0, None)))
    views = {"v": f"CREATE VIEW v AS SELECT k, {', '.join(results)} FROM t"}
    engine = Engine(make_project(views, {"t": source}), spark=spark)
    assert engine.refresh().ok
    change = operand_rows(*((i + 1, i) for i in range(len(ROUNDED_ONCE))))
    write_deltalake(source, change, mode="append")
    report = engine.refresh()
    assert report.ok, report.views
    (result,) = report.views
    assert (result.computed_by, result.driver_declined) == ("driver", [])
    mine = table_of(engine, "v")[1:]
    theirs = spark.createDataFrame(change).selectExpr("k", *results).toArrow()
    assert mine == sorted(tuple(r.values()) for r in theirs.to_pylist())
    assert [row[i + 1] for i, row in enumerate(mine)] == [Decimal(v) for *_, v in ROUNDED_ONCE]
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
