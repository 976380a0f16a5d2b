"""Self-correction: ``verify`` recomputes views from scratch with Spark SQL and reports
differences; ``--repair`` rebuilds the view at a new epoch so its correcting updates reach
downstream views too."""

from __future__ import annotations

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from ivm.cli import main
from ivm.engine import Engine
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
