"""Source contracts (pandera schemas declared in ``[contracts]``) and source schema changes.

Row checks: rows that break them never reach a view and are quarantined with a count and an
example; views equal their SQL over the valid rows (DuckDB oracle) through inserts, updates
that make a row valid or invalid, and deletes. Table checks: a declared column that
disappears or changes type makes the source unreadable by name, and only its views wait.
"""

from __future__ import annotations

import textwrap
from decimal import Decimal
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from ivm.config import load_project
from ivm.errors import ConfigError, ContractError
from resources.contracts import load_contract

ORDERS = pa.schema(
    [
        ("o_orderkey", pa.int64()),
        ("o_status", pa.string()),
        ("o_price", pa.decimal128(10, 2)),
        ("o_note", pa.string()),
    ]
)

CONTRACT = """
import pyspark.sql.types as T
from pandera.pyspark import DataFrameModel, Field


class Orders(DataFrameModel):
    o_orderkey: T.LongType() = Field(gt=0)
    o_status: T.StringType() = Field(isin=["O", "F"])
    o_price: T.DecimalType(10, 2) = Field(ge=0)
    o_note: T.StringType() = Field(nullable=True, str_length={"max_value": 8})


import pandera.pandas as pdp

Custom = pdp.DataFrameSchema(
    {"o_orderkey": pdp.Column("int64", pdp.Check(lambda s: s > 0, name="positive"))}
)
"""

VIEWS = {
    "by_status": "CREATE VIEW by_status AS SELECT o_status, COUNT(*) AS n, SUM(o_price) AS total FROM orders GROUP BY o_status",
    "notes": "CREATE VIEW notes AS SELECT o_orderkey, o_note FROM orders WHERE o_note IS NOT NULL",
    "other": "CREATE VIEW other AS SELECT k FROM plain",
}


def orders(*rows) -> pa.Table:
    return pa.Table.from_pylist(
        [
            dict(zip(ORDERS.names, (k, s, None if p is None else Decimal(p), n), strict=True))
            for k, s, p, n in rows
        ],
        schema=ORDERS,
    )


@pytest.fixture
def project(make_project, tmp_path: Path) -> Path:
    src, plain = str(tmp_path / "orders"), str(tmp_path / "plain")
    write_deltalake(
        src,
        orders((1, "O", "10.00", None), (2, "F", "-1.00", "neg"), (3, "X", "5.00", "bad status")),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    write_deltalake(plain, pa.table({"k": pa.array([1, 2], pa.int64())}))
    root = make_project(
        VIEWS,
        {"orders": src, "plain": plain},
        extra='[contracts]\norders = "contracts.py:Orders"\n',
    )
    # make_project puts `extra` before [sources]; a table header there must come last.
    text = (root / "ivm.toml").read_text()
    head, contracts = text.split("[contracts]")
    contracts, sources = contracts.split("[sources]")
    (root / "ivm.toml").write_text(head + "[sources]" + sources + "[contracts]" + contracts)
    (root / "contracts.py").write_text(textwrap.dedent(CONTRACT))
    return root


def test_contract_becomes_one_predicate(project: Path) -> None:
    contract = load_contract(project, "orders", "contracts.py:Orders")
    spark_sql = contract.predicate_sql("spark")
    assert "`o_status` IN ('O', 'F')" in spark_sql and "`o_price` >= 0" in spark_sql
    assert "LENGTH(`o_note`) <= 8" in spark_sql and "`o_orderkey` IS NULL" in spark_sql
    assert "\"o_status\" IN ('O', 'F')" in contract.predicate_sql("duckdb")
    contract.check_schema(ORDERS)
    with pytest.raises(ContractError, match="column 'o_price' is double, but contracts.py:"):
        contract.check_schema(
            pa.schema(
                [f if f.name != "o_price" else pa.field("o_price", pa.float64()) for f in ORDERS]
            )
        )
    with pytest.raises(
        ContractError, match="column 'o_note' declared in contracts.py:Orders is missing"
    ):
        contract.check_schema(pa.schema(list(ORDERS)[:3]))
    with pytest.raises(ConfigError, match="check 'positive' on column 'o_orderkey' cannot be"):
        load_contract(project, "orders", "contracts.py:Custom")
    with pytest.raises(ConfigError, match="defines no 'Nope'"):
        load_contract(project, "orders", "contracts.py:Nope")
    bad = project / "ivm.toml"
    bad.write_text(bad.read_text().replace('orders = "contracts.py', 'ordrs = "contracts.py'))
    with pytest.raises(ConfigError, match="\\[contracts\\] names 'ordrs', which is not a source"):
        load_project(project)


@pytest.mark.spark
def test_rows_breaking_the_contract_are_quarantined_and_never_counted(project, spark) -> None:
    engine = Engine(project, spark=spark)
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    (q,) = report.quarantined
    assert q.rows == 2 and q.example is not None
    assert q.example["_violations"] in ("o_price greater_than_or_equal_to", "o_status isin")
    assert_matches_valid_rows(engine)
    src = engine.project.sources["orders"]
    # Valid -> invalid (note too long), invalid -> valid (price fixed), a new invalid row
    # (NULL key), a new valid one, and a delete of an invalid row.
    DeltaTable(src).update({"o_note": "'far too long'"}, predicate="o_orderkey = 1")
    DeltaTable(src).update({"o_price": "3.50"}, predicate="o_orderkey = 2")
    write_deltalake(src, orders((None, "O", "1.00", None), (4, "O", "2.25", "ok")), mode="append")
    DeltaTable(src).delete("o_orderkey = 3")
    engine = Engine(project, spark=spark)
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert_matches_valid_rows(engine)
    totals = {r["o_status"]: r["total"] for r in engine.read_view("by_status").to_pylist()}
    assert totals == {"F": Decimal("3.50"), "O": Decimal("2.25")}
    (q,) = report.quarantined
    # +1 order 1 (note), -1 order 2 (old price), +1 NULL key, -1 order 3 (deleted)
    assert q.rows == 4
    quarantine = DeltaTable(engine.quarantine_uri("orders")).to_pyarrow_table().to_pylist()
    assert sum(r["_diff"] for r in quarantine) == 2  # orders 1 and the NULL-key row
    reasons = {r["o_orderkey"]: r["_violations"] for r in quarantine if r["_time"] == 2}
    assert reasons[None] == "o_orderkey not null" and reasons[1] == "o_note str_length"
    assert Engine(project, spark=spark).refresh().quarantined == []  # nothing new: no rows


@pytest.mark.spark
def test_a_change_to_a_column_only_the_contract_reads_still_reaches_the_views(
    project, spark
) -> None:
    engine = Engine(project, spark=spark)
    assert engine.refresh().ok
    # `by_status` reads o_status and o_price; the contract also checks o_note's length, so
    # a row whose note grows too long leaves the view.
    DeltaTable(engine.project.sources["orders"]).update(
        {"o_note": "'far too long'"}, predicate="o_orderkey = 1"
    )
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    by_view = {v.view: v for v in report.views}
    assert by_view["by_status"].inputs_changed and by_view["by_status"].rows_changed == 1
    assert engine.read_view("by_status").to_pylist() == []
    assert_matches_valid_rows(engine)


def assert_matches_valid_rows(engine: Engine) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        assert log_multiset(engine, c.view, c.epoch) == table_multiset(engine.read_view(c.view))


@pytest.mark.spark
def test_source_schema_changes(project, spark) -> None:
    engine = Engine(project, spark=spark)
    assert engine.refresh().ok
    src = engine.project.sources["orders"]
    # A column added (the contract is not strict): every view goes on.
    wider = orders((5, "O", "7.00", "new")).append_column("o_clerk", pa.array(["c1"]))
    write_deltalake(src, wider, mode="append", schema_mode="merge")
    engine = Engine(project, spark=spark)
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert_matches_valid_rows(engine)
    # A declared column changes type: the source is unreadable by name, its views wait, the
    # view over another source refreshes.
    retyped = wider.set_column(2, "o_price", pa.array([7.0]))
    write_deltalake(src, retyped, mode="overwrite", schema_mode="overwrite")
    write_deltalake(
        engine.project.sources["plain"], pa.table({"k": pa.array([3], pa.int64())}), mode="append"
    )
    engine = Engine(project, spark=spark)
    report = engine.refresh()
    status = {v.view: (v.status, v.error) for v in report.views}
    assert status["other"][0] == "refreshed"
    assert status["by_status"][0] == "failed"
    assert (
        "column 'o_price' is double, but contracts.py:Orders declares decimal(10,2)"
        in (status["by_status"][1])
    )
    # The contract follows the new type, and a column a view reads is dropped: that view
    # fails by name; the view that reads the retyped column is rebuilt without being asked.
    (project / "contracts.py").write_text(
        textwrap.dedent(CONTRACT)
        .replace("T.DecimalType(10, 2)", "T.DoubleType()")
        .replace(
            '    o_note: T.StringType() = Field(nullable=True, str_length={"max_value": 8})\n', ""
        )
    )
    write_deltalake(src, retyped.drop(["o_note"]), mode="overwrite", schema_mode="overwrite")
    engine = Engine(project, spark=spark)
    report = engine.refresh()
    status = {v.view: (v.status, v.error) for v in report.views}
    assert status["notes"][0] == "failed" and "unknown column 'o_note'" in status["notes"][1]
    assert status["by_status"][0] == "rebuilt", status
    assert [c.equal for c in compare_views(engine, ["by_status", "other"])] == [True, True]
