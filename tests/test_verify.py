"""Self-correction: ``verify`` recomputes views from scratch with Spark SQL and reports
differences; ``--repair`` rebuilds the view at a new epoch so its correcting updates reach
downstream views too."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.cli import main
from engine.facade import Engine
from tests.test_oracle import built_random_lake, check_all

pytestmark = pytest.mark.spark

VIEWS = {
    "per_grp": "CREATE VIEW per_grp AS SELECT grp, count(*) AS n, sum(price) AS s, "
    "min(qty) AS q FROM items GROUP BY grp",
    "big_grp": "CREATE VIEW big_grp AS SELECT grp, s FROM per_grp WHERE n > 3",
}


def test_verify_detects_and_repairs_corruption(spark, make_project, tmp_path, capsys):
    lake, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, 3)
    root = engine.project.root
    assert all(engine.verify(v).ok for v in VIEWS)

    # Corrupt the reduction's state: a phantom group sum written at the current epoch.
    state = engine.state_uri("per_grp", "r0.accumulable")
    phantom = DeltaTable(state).to_pyarrow_table().slice(0, 1)
    write_deltalake(state, phantom, mode="append")
    # A change to that group makes the engine read the corrupted sums.
    from tests.lakegen import ITEMS_SCHEMA, item_row

    row = item_row(lake.rng, 10_000) | {"grp": phantom.column("grp")[0].as_py()}
    write_deltalake(lake.items, pa.Table.from_pylist([row], schema=ITEMS_SCHEMA), mode="append")
    report = engine.refresh()
    # The sink refuses to delete result rows the table does not hold: the view stops, its
    # dependent waits, and nothing half-applied reaches the table.
    errors = {v.view: v.error or "" for v in report.views}
    assert "multiplicity would be -1" in errors["per_grp"], errors
    assert "waits for view 'per_grp'" in errors["big_grp"]
    bad = engine.verify("per_grp")
    assert not bad.ok and bad.missing + bad.extra > 0 and bad.examples, bad

    code = main(["--project", str(root), "verify"])
    assert code == 1
    assert "per_grp: DIFFERENT" in capsys.readouterr().out

    code = main(["--project", str(root), "verify", "--repair", "per_grp"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "per_grp: OK" in out and "(after repair)" in out
    engine = Engine(root, spark=spark)
    assert engine.verify("big_grp").ok  # downstream received the correction
    check_all(engine)
    # And the repaired view keeps going incrementally.
    lake.random_batch()
    assert engine.refresh().ok
    check_all(engine)


def test_verify_reports_rows_added_behind_the_engine(spark, make_project, tmp_path):
    _, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, 4)
    table = engine.layout.view_table("big_grp")
    rows = DeltaTable(table).to_pyarrow_table()
    write_deltalake(table, pa.concat_tables([rows.slice(0, 1)]), mode="append")
    result = engine.verify("big_grp")
    assert (result.extra, result.missing) == (1, 0), result
    assert engine.repair("big_grp").ok


FLOAT_VIEWS = {
    "stats": "CREATE VIEW stats AS SELECT grp, count(*) AS n, avg(price) AS mean, "
    "sum(CAST(price AS DOUBLE) * 1.1) AS s FROM items GROUP BY grp",
    "ratios": "CREATE VIEW ratios AS SELECT id, CAST(price AS DOUBLE) / 3 AS third, qty "
    "FROM items WHERE qty > 0",
}


def test_both_oracles_compare_floats_within_the_stated_tolerance(spark, make_project, tmp_path):
    """Views with DOUBLE columns (and a DECIMAL average, a DOUBLE in DuckDB) against DuckDB
    and against Spark's from-scratch result, through random batches; each comparison states
    its tolerance per column. Then the table is moved within the tolerance (still equal,
    though no longer its log's rows) and beyond it (a difference, found by each oracle)."""
    from engine.oracle import compare_views, spark_compare_views

    lake, engine = built_random_lake(spark, make_project, tmp_path, FLOAT_VIEWS, 5)
    for _ in range(2):
        lake.random_batch()
        assert engine.refresh().ok
        for c in compare_views(engine, log=True) + spark_compare_views(engine):
            assert c.equal, c.describe()
        assert all(engine.verify(v).ok for v in FLOAT_VIEWS)
    duck, from_spark = (
        compare_views(engine, ["stats"])[0],
        spark_compare_views(engine, ["stats"])[0],
    )
    assert duck.tolerances == (
        "mean: DuckDB's DOUBLE against the engine's DECIMAL(16,6): equal within half a unit of "
        "scale 6 (5E-7) plus 2^-52 of the double's magnitude",
        "s: DOUBLE within 1E-9 relative, 1E-12 absolute near zero; NaN = NaN, infinities "
        "exact, -0.0 = 0.0",
    )
    assert from_spark.tolerances == (duck.tolerances[1],)  # Spark's mean is the decimal
    assert "compared: s: DOUBLE within 1E-9 relative" in engine.verify("stats").describe()

    table_uri = engine.layout.view_table("ratios")
    rows = DeltaTable(table_uri).to_pyarrow_table()
    third = rows.column("third").to_pylist()

    def write(values: list[float]) -> None:
        moved = rows.set_column(1, "third", pa.array(values, pa.float64()))
        write_deltalake(table_uri, moved, mode="overwrite")

    write([x * (1 + 1e-12) if x else x for x in third])  # within 1e-9
    assert engine.verify("ratios").ok
    (duck,) = compare_views(engine, ["ratios"], log=True)
    assert not duck.missing and not duck.extra and duck.log_missing and duck.log_extra
    assert spark_compare_views(engine, ["ratios"])[0].equal
    i = next(i for i, x in enumerate(third) if x)
    write(third[:i] + [third[i] * (1 + 1e-8)] + third[i + 1 :])  # beyond
    result = engine.verify("ratios")
    assert (result.missing, result.extra) == (1, 1), result.describe()
    for c in compare_views(engine, ["ratios"]) + spark_compare_views(engine, ["ratios"]):
        assert (sum(c.missing.values()), sum(c.extra.values())) == (1, 1), c.describe()
        assert "third: DOUBLE within 1E-9 relative" in c.describe()
