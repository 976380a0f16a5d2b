"""Sources as delta-spark and Databricks write them: deletion vectors and column mapping.

The sources are created and changed by delta-spark itself (``DELETE``, ``UPDATE`` and ``MERGE``
with deletion vectors on; column mapping by name with classic checkpoints, or by id with V2
checkpoints on a partitioned table; columns renamed and dropped), and every view is compared
after every
change with DuckDB over delta-rs's DataFusion scan and with Spark's own from-scratch result,
on both execution paths: deleted rows never reappear, columns are read by their names in the
table, not in its files. An append-only table with deletion vectors on and no Change Data Feed
(Databricks' default for new tables) is maintained from its appended files while it only
appends; its first DELETE is refused by name, as for any table without a feed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from ivm.errors import SqlError
from ivm.policy import Policy
from tests.marks import by_turns

pytestmark = pytest.mark.spark

VIEWS = {
    "by_group": """
        CREATE VIEW by_group AS
        SELECT o.grp, count(*) AS n, sum(o.amount) AS total, max(o.amount) AS top
        FROM orders o GROUP BY o.grp
    """,
    "joined": """
        CREATE VIEW joined AS
        SELECT o.id, o.amount, c.label FROM orders o JOIN customers c ON o.cust = c.cust
        WHERE o.amount > 10
    """,
    "labels": "CREATE VIEW labels AS SELECT label, count(*) AS n FROM customers GROUP BY label",
}

DV = "'delta.enableDeletionVectors' = 'true'"
NAMED = (
    f"TBLPROPERTIES ({DV}, 'delta.enableChangeDataFeed' = 'true', "
    "'delta.columnMapping.mode' = 'name', 'delta.checkpointInterval' = '2')"
)
"""Column mapping by name, classic checkpoints every second commit."""
BY_ID_PARTITIONED = (
    f"PARTITIONED BY (grp) TBLPROPERTIES ({DV}, 'delta.enableChangeDataFeed' = 'true', "
    "'delta.columnMapping.mode' = 'id', 'delta.checkpointPolicy' = 'v2', "
    "'delta.checkpointInterval' = '2')"
)
"""Column mapping by id, partitioned, V2 checkpoints every second commit."""


class SparkLake:
    """Two sources written by delta-spark: ``orders`` (deletion vectors, Change Data Feed,
    column mapping by name) and ``customers`` (deletion vectors, no feed: append-only)."""

    def __init__(self, spark, root, seed: int, layout: str = "") -> None:
        self.spark, self.rng, self.next = spark, random.Random(seed), 0
        self.layout = layout  # more of the orders table's CREATE: PARTITIONED BY, properties
        self.paths = {"orders": str(root / "orders"), "customers": str(root / "customers")}

    def sql(self, text: str) -> None:
        self.spark.sql(text.format(**{k: f"delta.`{v}`" for k, v in self.paths.items()}))

    def create(self) -> dict[str, str]:
        self.sql(
            "CREATE TABLE {orders} (id BIGINT, cust INT, grp STRING, amount DECIMAL(10, 2)) "
            f"USING delta {self.layout or NAMED}"
        )
        self.sql(
            f"CREATE TABLE {{customers}} (cust INT, label STRING) USING delta TBLPROPERTIES ({DV})"
        )
        self.sql(
            "INSERT INTO {customers} VALUES " + ", ".join(f"({c}, 'c{c % 3}')" for c in range(6))
        )
        self.insert_orders(40)
        return self.paths

    def insert_orders(self, n: int) -> None:
        rows = []
        for _ in range(n):
            self.next += 1
            amount = f"{self.rng.randint(-500, 99999) / 100:.2f}"
            grp = self.rng.choice(["'a'", "'b'", "'c'", "NULL"])
            rows.append(f"({self.next}, {self.rng.randint(0, 7)}, {grp}, {amount})")
        self.sql("INSERT INTO {orders} (id, cust, grp, amount) VALUES " + ", ".join(rows))

    def random_batch(self) -> None:
        r = self.rng
        self.insert_orders(r.randint(1, 6))
        self.sql(f"DELETE FROM {{orders}} WHERE id % {r.randint(5, 9)} = {r.randint(0, 4)}")
        self.sql(f"UPDATE {{orders}} SET amount = amount + 1.25 WHERE id % 7 = {r.randint(0, 6)}")
        self.sql(
            "MERGE INTO {orders} t USING (SELECT id, 'b' AS grp FROM {orders} WHERE id % 5 = "
            f"{r.randint(0, 4)}) s ON t.id = s.id WHEN MATCHED THEN UPDATE SET t.grp = s.grp"
        )
        cust = 6 + self.next
        self.sql(f"INSERT INTO {{customers}} VALUES ({cust}, 'c{cust % 4}')")


def check(engine: Engine, views: list[str]) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        assert log_multiset(engine, c.view, c.epoch) == table_multiset(engine.read_view(c.view))
    for view in views:
        verified = engine.verify(view)  # Spark from scratch, over delta-spark's reads
        assert verified.ok, verified.describe()


@pytest.mark.parametrize(
    "driver", [pytest.param(True, id="small changes by the driver"), by_turns(False, id="by Spark")]
)
def test_views_over_deletion_vectors_and_column_mapping_stay_exact(
    spark, make_project, tmp_path, use_policy, driver
):
    use_policy(None if driver else Policy.spark_only())
    layout = NAMED if driver else BY_ID_PARTITIONED
    lake = SparkLake(spark, tmp_path / "data", seed=11 if driver else 12, layout=layout)
    root = make_project(VIEWS, lake.create())
    lake.sql("DELETE FROM {orders} WHERE id % 4 = 0")  # a deletion vector before the build
    engine = Engine(root, spark=spark)
    assert engine.sources["orders"].needs_delta_reader(engine.sources["orders"].version())
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    check(engine, list(VIEWS))
    for _ in range(2):
        lake.random_batch()
        report = Engine(root, spark=spark).refresh()
        assert report.ok, [v.error for v in report.views]
        check(engine, ["joined"])
    history = spark.sql(f"DESCRIBE HISTORY delta.`{lake.paths['orders']}`").collect()
    assert any(int(h.operationMetrics.get("numDeletionVectorsAdded", 0)) for h in history)
    log = Path(lake.paths["orders"]) / "_delta_log"
    assert list(log.glob("*.checkpoint*.parquet")) or list(log.glob("*.checkpoint*.json"))


def test_an_append_only_table_with_deletion_vectors_and_no_feed(spark, make_project, tmp_path):
    """Appends are read from the appended files; the first DELETE (a deletion vector on an
    existing file: the file stays, so only its vector shows the change) is refused, naming
    the source and what to do, and nothing is committed."""
    lake = SparkLake(spark, tmp_path / "data", seed=3)
    root = make_project({"labels": VIEWS["labels"]}, lake.create())
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    lake.sql("INSERT INTO {customers} VALUES (100, 'c9'), (101, 'c9')")
    assert engine.refresh().ok
    check(engine, ["labels"])
    lake.sql("DELETE FROM {customers} WHERE cust = 1")
    before = engine.view_status("labels")
    report = engine.refresh()
    assert not report.ok
    (failed,) = [v for v in report.views if v.error]
    assert "customers" in failed.error and "Change Data Feed" in failed.error, failed.error
    after = engine.view_status("labels")
    assert (after.log_epoch, after.table_epoch) == (before.log_epoch, before.table_epoch)


def test_renamed_and_dropped_columns_of_a_column_mapped_source(spark, make_project, tmp_path):
    """Column mapping lets a table rename and drop columns without rewriting its files. Delta
    refuses a batch read of the change feed across such a change, so the refresh fails naming
    the source and the way out (a rebuild from its current state); after the rebuild the views
    are exact and stay so. Renaming a column a view reads fails that view by name."""
    lake = SparkLake(spark, tmp_path / "data", seed=21)
    paths = lake.create()
    lake.sql("ALTER TABLE {orders} ADD COLUMNS (note STRING, spare INT)")
    root = make_project({"by_group": VIEWS["by_group"], "joined": VIEWS["joined"]}, paths)
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    lake.sql("ALTER TABLE {orders} RENAME COLUMN note TO remark")
    lake.sql("ALTER TABLE {orders} DROP COLUMN spare")
    lake.random_batch()
    report = engine.refresh()
    errors = " ".join(v.error or "" for v in report.views)
    assert not report.ok and "'orders'" in errors and "--rebuild" in errors, errors
    rebuilt = engine.refresh(rebuild=True)
    assert rebuilt.ok, [v.error for v in rebuilt.views]
    check(engine, ["by_group"])
    lake.random_batch()
    assert engine.refresh().ok
    check(engine, ["by_group", "joined"])
    lake.sql("ALTER TABLE {orders} RENAME COLUMN amount TO value")
    with pytest.raises(SqlError, match=r"unknown column 'o\.amount' in source orders"):
        Engine(root, spark=spark).refresh()  # a new run plans on the new columns
