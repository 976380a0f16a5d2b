"""Every table the engine writes is a Delta table that delta-spark reads as the engine does.

A project with joins, aggregates (sums, towers, DISTINCT counts), a TopK and a view over a view
is built and changed; then every Delta table under its lake (views, diff logs, arrangements,
state tables, epochs, quarantine) is read by Spark's Delta reader and by the engine's own
reader (delta-rs), and the two multisets must be equal, column names and values alike.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.facade import Engine
from resources.lake import has_vectors, snapshot_rows
from tests.marks import by_turns

pytestmark = pytest.mark.spark

ORDERS = pa.schema(
    [("id", pa.int64()), ("cust", pa.int32()), ("grp", pa.string()), ("amount", pa.float64())]
)
VIEWS = {
    "totals": """
        CREATE VIEW totals AS
        SELECT grp, count(*) AS n, sum(amount) AS total, min(amount) AS lo,
               count(DISTINCT cust) AS custs
        FROM orders GROUP BY grp
    """,
    "pairs": """
        CREATE VIEW pairs AS
        SELECT a.id, b.id AS other FROM orders a JOIN orders b ON a.cust = b.cust
        WHERE a.id < b.id
    """,
    "top": """
        CREATE VIEW top AS
        SELECT id, amount FROM orders ORDER BY amount DESC LIMIT 3
    """,
    "busy": "CREATE VIEW busy AS SELECT grp FROM totals WHERE n > 2",
}


def _rows(n: int, start: int) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"id": i, "cust": i % 5, "grp": f"g{i % 3}", "amount": (i * 37 % 101) / 4}
            for i in range(start, start + n)
        ],
        schema=ORDERS,
    )


def _delta_tables(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("_delta_log") if p.is_dir())


def _multiset(table: pa.Table) -> Counter:
    names = sorted(table.column_names)
    return Counter(tuple(r[c] for c in names) for r in table.select(names).to_pylist())


@pytest.mark.parametrize(
    "vectors", [by_turns(False, id="files rewritten"), pytest.param(True, id="deletion vectors")]
)
def test_every_lake_table_reads_the_same_in_delta_spark(spark, make_project, tmp_path, vectors):
    """``vectors``: the view tables take every deletion as deletion vectors, which the
    engine reads through delta-rs's DataFusion scan (its pyarrow reader refuses them)."""
    source = str(tmp_path / "orders")
    write_deltalake(source, _rows(20, 0), configuration={"delta.enableChangeDataFeed": "true"})
    policy = (
        "[policy]\nrewrite_copy_rows = 0\n" if vectors else "[policy]\ndeletion_vectors = false\n"
    )
    root = make_project(VIEWS, {"orders": source}, extra=policy)
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    write_deltalake(source, _rows(5, 100), mode="append")
    DeltaTable(source).delete("id % 4 = 1")
    assert engine.refresh().ok
    tables = _delta_tables(Path(engine.layout.root))
    kinds = {p.relative_to(engine.layout.root).parts[0] for p in tables}
    assert {"views", "logs", "arrangements", "state", "_ivm"} <= kinds, kinds
    views = [DeltaTable(engine.layout.view_table(v)) for v in VIEWS]
    assert any(has_vectors(dt) for dt in views) is vectors
    for path in tables:
        ours = snapshot_rows(DeltaTable(str(path)))
        theirs = spark.read.format("delta").load(str(path)).toArrow()
        where = path.relative_to(engine.layout.root)
        assert sorted(theirs.column_names) == sorted(ours.column_names), where
        assert _multiset(theirs) == _multiset(ours), where
