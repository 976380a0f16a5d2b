"""The central test: random batches of inserts, updates and deletes; after every refresh each
view must equal DuckDB's from-scratch evaluation of the same SQL (exact multisets, exact
decimals), and its diff log must sum to the same collection."""

from __future__ import annotations

import glob

import pyarrow.parquet as pq
import pytest

from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from ivm.policy import Policy
from resources.lake import local_path, table_files
from tests.lakegen import RandomLake
from tests.marks import by_turns

pytestmark = pytest.mark.spark

VIEWS = {
    "v_filter": """
        CREATE VIEW v_filter AS
        SELECT id, grp, price * qty AS total, day
        FROM items WHERE qty > 2 AND grp IS NOT NULL
    """,
    "v_case": """
        CREATE VIEW v_case AS
        SELECT i.id,
               CASE WHEN i.price > 50 THEN 'high' WHEN i.price > 10 THEN 'mid' ELSE 'low' END AS band,
               coalesce(i.tag, 'none') AS tag2,
               CAST(i.qty AS BIGINT) + 1 AS q1,
               NOT (i.qty IS NULL OR i.qty < 5) AS many
        FROM items AS i
    """,
    "v_strings": """
        CREATE VIEW v_strings AS
        SELECT lower(grp) AS g, concat(coalesce(tag, ''), '-', coalesce(grp, '?')) AS label,
               substr(coalesce(tag, 'xx'), 1, 2) AS t2, length(grp) AS glen,
               year(day) AS yr, date_add(day, 7) AS next_week
        FROM items
        WHERE day >= DATE '2024-01-20' OR tag LIKE 'a%'
    """,
    "v_over_view": """
        CREATE VIEW v_over_view AS
        SELECT grp, total FROM v_filter WHERE total > 100
    """,
    "v_union": """
        CREATE VIEW v_union AS
        SELECT grp AS k, price AS amount FROM items WHERE grp = 'a'
        UNION ALL SELECT kind, amount FROM events
        UNION ALL SELECT grp, total FROM v_filter
    """,
    "v_dups": """
        CREATE VIEW v_dups AS SELECT grp, qty FROM items
    """,
    "v_cte": """
        CREATE VIEW v_cte AS
        WITH x AS (SELECT id, qty FROM items WHERE qty IS NOT NULL)
        SELECT id, qty * 2 AS q2 FROM (SELECT * FROM x WHERE id % 2 = 0) t
    """,
}


def check_all(engine: Engine) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        log = log_multiset(engine, c.view, c.epoch)
        assert log == table_multiset(engine.read_view(c.view)), f"{c.view}: log != table"


def built_random_lake(
    spark, make_project, tmp_path, views, seed, progress=None
) -> tuple[RandomLake, Engine]:
    """A RandomLake with ``views`` over it, built at epoch 1 and checked against DuckDB
    (``progress``: the engine's progress messages)."""
    lake = RandomLake(tmp_path / "data", seed)
    lake.create()
    root = make_project(views, {"items": lake.items, "events": lake.events})
    engine = Engine(root, spark=spark, progress=progress)
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert report.minted is not None and report.minted.epoch == 1
    check_all(engine)
    return lake, engine


@pytest.mark.parametrize(
    ("seed", "mode"),
    [
        pytest.param(7, "driver", id="small changes written by the driver"),
        by_turns(2024, "spark", id="every file written by Spark"),
        pytest.param(31, "vectors", id="deletions as deletion vectors"),
    ],
)
def test_random_batches_match_duckdb(spark, make_project, tmp_path, use_policy, seed, mode):
    driver_writes = mode != "spark"
    use_policy(
        Policy.spark_only()
        if mode == "spark"
        else Policy(rewrite_copy_rows=0)
        if mode == "vectors"
        else None
    )
    lake, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, seed)
    for round_ in range(2 if mode == "vectors" else 4):  # vectors: the suite's time
        summary = lake.random_batch()
        report = engine.refresh()
        assert report.ok, (summary, [v.error for v in report.views])
        assert engine.latest_epoch() == round_ + 2
        assert {v.epoch for v in report.views} == {round_ + 2}
        # The driver computes the small changes of the views whose expressions it evaluates
        # as Spark does (ops.stateless.driver), % among them; date_add() is left to Spark.
        by_driver = {v.view for v in report.views if v.computed_by == "driver"}
        if driver_writes:
            assert by_driver >= {"v_filter", "v_case", "v_over_view", "v_dups", "v_cte"}, by_driver
            assert "v_strings" not in by_driver
        else:
            assert not by_driver
        check_all(engine)
    if mode == "vectors":  # the view tables took their deletions as deletion vectors
        tables = [engine.layout.view_table(v) for v in VIEWS]
        assert any(f.deleted for t in tables for f in table_files(t)), tables
        return
    # Every file of the last epoch (logs, state, arrangements, tables) came from one writer.
    files = glob.glob(
        f"{local_path(engine.layout.root)}/**/*-e{engine.latest_epoch():08d}-*/*.parquet",
        recursive=True,
    )
    writers = {pq.ParquetFile(f).metadata.created_by.split(" ")[0] for f in files}
    assert files and writers == {"parquet-cpp-arrow" if driver_writes else "parquet-mr"}
