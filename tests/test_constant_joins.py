"""Joins on constant conditions (``ON false``, ``ON 1 = 0``, ``ON CAST(NULL AS BOOLEAN)``,
``ON true``) of every kind, and parenthesized joins: planned with every column (an outer join
never matching keeps its preserved sides padded with NULLs, an inner one is empty), checked
against DuckDB (and Spark's own evaluation) after a build and after random inserts and
deletes; a cross join left by ``ON true`` is refused by name and position. Also: a build
whose plan's columns differ from Spark's analysis of the SQL fails, naming view and column."""

from __future__ import annotations

import random
from dataclasses import replace
from decimal import Decimal

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from sqlglot import exp

from engine.columns import check_columns
from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, table_multiset
from ivm.errors import InvariantViolation, SqlError
from ivm.plan.ir import Project
from ivm.plan.planner import plan_views
from ivm.policy import Policy
from ivm.sql.parse import parse_view
from tests.lakegen import batches
from tests.marks import by_turns

L2 = pa.schema([("lk", pa.int64()), ("ls", pa.string()), ("lv", pa.decimal128(5, 2))])
R2 = pa.schema([("rk", pa.int64()), ("rd", pa.decimal128(7, 3)), ("rs", pa.string())])

VIEWS = {
    # Materialize's joins.slt case: both ON false inputs keep their columns.
    "mz_nested": """
        CREATE VIEW mz_nested AS
        SELECT * FROM (((SELECT 1 AS x FROM l2) LEFT JOIN (SELECT 1 AS y FROM r2) ON false)
                       LEFT JOIN (SELECT 1 AS z FROM r2) ON false)
    """,
    "left_false": "CREATE VIEW left_false AS SELECT * FROM l2 LEFT JOIN r2 ON false",
    # r2 shows no column: the plan does not read it (Spark's analysis and verify still do).
    "only_left": "CREATE VIEW only_left AS SELECT ls, lv FROM l2 LEFT JOIN r2 ON false",
    "left_outer_keyed_false": """
        CREATE VIEW left_outer_keyed_false AS
        SELECT ls, rd, rs FROM l2 LEFT OUTER JOIN r2 ON lk = rk AND 1 = 0
    """,
    "right_one_is_zero": "CREATE VIEW right_one_is_zero AS SELECT * FROM l2 RIGHT JOIN r2 ON 1 = 0",
    "full_null": """
        CREATE VIEW full_null AS SELECT * FROM l2 FULL JOIN r2 ON CAST(NULL AS BOOLEAN)
    """,
    "full_null_and_key": """
        CREATE VIEW full_null_and_key AS
        SELECT lk, lv, rk, rd FROM l2 FULL OUTER JOIN r2 ON lk = rk AND NULL
    """,
    "inner_false": "CREATE VIEW inner_false AS SELECT * FROM l2 JOIN r2 ON false",
    # WHERE filters an inner join's result padded by a never-matching outer join
    "inner_then_padded_where": """
        CREATE VIEW inner_then_padded_where AS
        SELECT ls, r2.rd, c.rs FROM l2 JOIN r2 ON lk = r2.rk LEFT JOIN r2 c ON false
        WHERE lv > 10 OR r2.rd IS NULL
    """,
    # the padded join is an internal view, which the inner join reads (ivm.sql.nest)
    "padded_then_inner": """
        CREATE VIEW padded_then_inner AS
        SELECT ls, c.rs FROM l2 LEFT JOIN r2 ON false JOIN r2 c ON c.rk = lk
    """,
    "inner_keyed_false": """
        CREATE VIEW inner_keyed_false AS SELECT ls, rd FROM l2 JOIN r2 ON lk = rk AND 1 = 0
    """,
    "cross_where_false": "CREATE VIEW cross_where_false AS SELECT * FROM l2 CROSS JOIN r2 WHERE false",
    "left_true_and_key": """
        CREATE VIEW left_true_and_key AS SELECT lk, ls, rd FROM l2 LEFT JOIN r2 ON true AND lk = rk
    """,
    "inner_true_where_key": """
        CREATE VIEW inner_true_where_key AS SELECT lk, rd FROM l2 JOIN r2 ON true WHERE lk = rk
    """,
    "chain_right_false": """
        CREATE VIEW chain_right_false AS
        SELECT a.ls, b.rd, c.rs AS cs
        FROM l2 a JOIN r2 b ON a.lk = b.rk RIGHT JOIN r2 c ON false
    """,
    "chain_left_false": """
        CREATE VIEW chain_left_false AS
        SELECT a.lk, b.rd, c.rs AS cs
        FROM l2 a LEFT JOIN r2 b ON a.lk = b.rk LEFT JOIN r2 c ON 1 = 0
    """,
    "padded_grouped": """
        CREATE VIEW padded_grouped AS
        SELECT ls, count(*) AS n, count(rd) AS with_rd, sum(lv) AS total
        FROM l2 LEFT JOIN r2 ON false WHERE lv > 1 GROUP BY ls
    """,
    "grouped_left_false": """
        CREATE VIEW grouped_left_false AS
        SELECT * FROM (SELECT ls AS g, count(*) AS c, sum(lv) AS sv FROM l2 GROUP BY ls) t
        LEFT JOIN r2 ON false
    """,
    "parenthesized_keyed": """
        CREATE VIEW parenthesized_keyed AS
        SELECT t.ls, t.rd FROM ((SELECT lk, ls FROM l2) a JOIN r2 b ON a.lk = b.rk) t
    """,
    "over_padded_view": """
        CREATE VIEW over_padded_view AS SELECT x, y, z FROM mz_nested WHERE y IS NULL
    """,
}


class ConstantLake:
    """Two small CDF sources whose keys overlap; batches insert and delete on both sides."""

    def __init__(self, root, seed: int) -> None:
        self.rng = random.Random(seed)
        self.paths = {"l2": f"{root}/l2", "r2": f"{root}/r2"}
        self.next = 0

    def _l(self) -> dict:
        self.next += 1
        r = self.rng
        return {
            "lk": r.choice([1, 2, 3, 4, None]),
            "ls": f"s{self.next % 5}" if r.random() > 0.1 else None,
            "lv": Decimal(r.randint(-999, 99999)) / 100,
        }

    def _r(self) -> dict:
        self.next += 1
        r = self.rng
        return {
            "rk": r.choice([1, 2, 3, 5, None]),
            "rd": Decimal(r.randint(-9999, 9999999)) / 1000 if r.random() > 0.1 else None,
            "rs": f"r{self.next}",
        }

    def create(self) -> dict[str, str]:
        conf = {"delta.enableChangeDataFeed": "true"}
        for name, schema, row, n in (("l2", L2, self._l, 8), ("r2", R2, self._r, 6)):
            rows = [row() for _ in range(n)]
            write_deltalake(
                self.paths[name], pa.Table.from_pylist(rows, schema=schema), configuration=conf
            )
        return self.paths

    def random_batch(self) -> None:
        r = self.rng
        for name, schema, row, key in (("l2", L2, self._l, "ls"), ("r2", R2, self._r, "rs")):
            rows = [row() for _ in range(r.randint(0, 3))]
            if rows:
                write_deltalake(
                    self.paths[name], pa.Table.from_pylist(rows, schema=schema), mode="append"
                )
            present = DeltaTable(self.paths[name]).to_pyarrow_table().column(key).to_pylist()
            gone = [v for v in present if v is not None and r.random() < 0.3]
            if gone:
                quoted = ", ".join(f"'{v}'" for v in gone)
                DeltaTable(self.paths[name]).delete(f"{key} IN ({quoted})")


@pytest.mark.spark
@pytest.mark.parametrize(
    "driver", [pytest.param(True, id="small changes by the driver"), by_turns(False, id="by Spark")]
)
def test_constant_join_conditions_match_duckdb(spark, make_project, tmp_path, use_policy, driver):
    use_policy(None if driver else Policy.spark_only())
    lake = ConstantLake(tmp_path / "data", seed=5 if driver else 6)
    root = make_project(VIEWS, lake.create())
    engine = Engine(root, spark=spark)
    report = engine.refresh()
    assert report.ok, [(v.view, v.error) for v in report.views if v.error]
    table = engine.read_view("mz_nested")
    assert table.column_names == ["x", "y", "z"]
    assert set(table.to_pylist()[0].items()) == {("x", 1), ("y", None), ("z", None)}
    assert engine.read_view("left_false").schema.field("rd").type == pa.decimal128(7, 3)
    assert engine.read_view("inner_false").column_names == ["lk", "ls", "lv", "rk", "rd", "rs"]
    assert engine.view("only_left").inputs == ("l2",)
    verified = engine.verify("only_left")  # Spark from scratch: r2 is named by the SQL
    assert verified.ok and verified.expected_rows == 8, verified.describe()
    check(engine)
    by_driver: set[str] = set()
    for _ in range(batches(4)):
        lake.random_batch()
        report = Engine(root, spark=spark).refresh()
        assert report.ok, [v.error for v in report.views]
        by_driver |= {v.view for v in report.views if v.computed_by == "driver"}
        check(engine)
    if driver:  # the padded unions are stateless: the driver computes their small changes
        assert {"mz_nested", "left_false", "right_one_is_zero"} <= by_driver, by_driver
    else:
        assert not by_driver


@pytest.mark.spark
def test_cross_join_on_false_matches_spark(spark, make_project, tmp_path):
    """DuckDB has no ``CROSS JOIN ... ON``: Spark's from-scratch evaluation checks it."""
    lake = ConstantLake(tmp_path / "data", seed=8)
    root = make_project(
        {"cross_on_false": "CREATE VIEW cross_on_false AS SELECT * FROM l2 CROSS JOIN r2 ON false"},
        lake.create(),
    )
    engine = Engine(root, spark=spark)
    for step in range(3):
        if step:
            lake.random_batch()
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        verified = engine.verify("cross_on_false")
        assert verified.ok and verified.expected_rows == 0, verified.describe()
    assert engine.read_view("cross_on_false").schema.field("rd").type == pa.decimal128(7, 3)


def check(engine: Engine) -> None:
    for c in compare_views(engine):
        assert c.equal, c.describe()
        log = log_multiset(engine, c.view, c.epoch)
        assert log == table_multiset(engine.read_view(c.view)), f"{c.view}: log != table"


def _plan(sql: str):
    view = parse_view(f"CREATE VIEW v AS {sql}", "v.sql")
    plan = plan_views([view], {"l2": ("lk", "ls", "lv"), "r2": ("rk", "rd", "rs")})
    return plan


@pytest.mark.parametrize(
    "sql, where",
    [
        ("SELECT ls FROM l2 LEFT JOIN r2 ON true", "v.sql:1:46"),
        ("SELECT ls FROM l2 RIGHT JOIN r2 ON 1 = 1", "v.sql:1:47"),
        ("SELECT ls FROM l2 FULL JOIN r2 ON NOT false", "v.sql:1:46"),
        ("SELECT ls FROM l2 JOIN r2 ON true", "v.sql:1:41"),
        ("SELECT ls FROM l2 CROSS JOIN r2", "v.sql:1:47"),
        ("SELECT ls FROM l2 CROSS JOIN r2 ON true", "v.sql:1:47"),
    ],
)
def test_on_true_is_a_cross_join_refused_by_name(sql, where):
    error = _plan(sql).broken["v"]
    assert isinstance(error, SqlError) and error.construct == "cross join", error
    assert str(error).startswith(where + ": cross join: no equality links source r2"), error


def test_on_null_is_refused_as_spark_refuses_it():
    error = _plan("SELECT ls FROM l2 LEFT JOIN r2 ON NULL").broken["v"]
    assert str(error).startswith("v.sql:1:46: LEFT JOIN ... ON NULL: the condition has type VOID")


def test_constant_conditions_plan_every_column():
    """No join kind drops an input's columns; never-matching inputs are read through
    ``Filter FALSE`` (types only) and need no arrangement."""
    cases = {
        "SELECT * FROM l2 LEFT JOIN r2 ON false": ("l2", "r2"),
        "SELECT * FROM l2 RIGHT JOIN r2 ON 1 = 0": ("l2", "r2"),
        "SELECT * FROM l2 FULL JOIN r2 ON CAST(NULL AS BOOLEAN)": ("l2", "r2"),
        "SELECT * FROM l2 JOIN r2 ON false": ("l2", "r2"),
        "SELECT * FROM l2 CROSS JOIN r2 ON 1 > 2": ("l2", "r2"),
        "SELECT * FROM l2, r2 WHERE 1 = 0 AND lk = rk": ("l2", "r2"),
    }
    for sql, inputs in cases.items():
        plan = _plan(sql)
        assert not plan.broken, plan.broken
        view = plan.views["v"]
        assert view.columns == ("lk", "ls", "lv", "rk", "rd", "rs"), sql
        assert view.inputs == inputs, sql
        assert not plan.arrangements, sql
    # Only the preserved side's columns read: the other input is not read at all.
    assert _plan("SELECT ls FROM l2 LEFT JOIN r2 ON false").views["v"].inputs == ("l2",)


def test_unsupported_chains_are_refused_by_name():
    sql = "SELECT ls FROM (l2 LEFT JOIN r2 ON false JOIN r2 c ON c.rk = lk) t"
    error = _plan(sql).broken["v"]
    assert error.construct and "JOIN of an outer join's result in an aliased parenthesized" in str(
        error
    )
    assert str(error).startswith("v.sql:1:64: JOIN of an outer join's result"), error
    error = _plan("SELECT ls FROM (l2 a LEFT JOIN l2 b ON false) t").broken["v"]
    assert "parenthesized join has two columns named 'lk'" in str(error)


def test_column_check_names_view_column_and_types():
    from pyspark.sql import types as T

    spark_schema = T.StructType(
        [T.StructField("k", T.LongType(), False), T.StructField("d", T.DecimalType(7, 3))]
    )
    same = T.StructType([T.StructField("K", T.LongType()), T.StructField("d", T.DecimalType(7, 3))])
    check_columns("v", "v.sql", spark_schema, same)  # case and a weaker NOT NULL: equal
    wrong = T.StructType([T.StructField("k", T.LongType()), T.StructField("d", T.DoubleType())])
    with pytest.raises(
        InvariantViolation, match=r"view 'v' .*column 'd' is double in the plan but decimal\(7,3\)"
    ):
        check_columns("v", "v.sql", spark_schema, wrong)
    not_null = T.StructType(
        [T.StructField("k", T.LongType()), T.StructField("d", T.DecimalType(7, 3), False)]
    )
    with pytest.raises(InvariantViolation, match="column 'd' is decimal.* NOT NULL in the plan"):
        check_columns("v", "v.sql", spark_schema, not_null)
    with pytest.raises(InvariantViolation, match="column 2 is 'e' in the plan but 'd'"):
        check_columns(
            "v",
            "v.sql",
            spark_schema,
            T.StructType([same[0], T.StructField("e", T.DecimalType(7, 3))]),
        )
    with pytest.raises(InvariantViolation, match="the plan gives 1 columns"):
        check_columns("v", "v.sql", spark_schema, T.StructType([same[0]]))


@pytest.mark.spark
def test_a_build_with_a_wrong_column_type_fails_naming_view_and_column(
    spark, make_project, tmp_path
):
    lake = ConstantLake(tmp_path / "data", seed=7)
    root = make_project(
        {
            "ok": "CREATE VIEW ok AS SELECT lk, ls FROM l2",
            "planted": "CREATE VIEW planted AS SELECT lk, lv FROM l2",
        },
        lake.create(),
    )
    engine = Engine(root, spark=spark)
    plan = engine.plan.views["planted"]
    wrong = Project(
        plan.root, (("lk", exp.column("lk")), ("lv", exp.cast(exp.column("lv"), "DOUBLE")))
    )
    engine.plan.views["planted"] = replace(plan, root=wrong)  # a planner bug, planted
    report = engine.refresh()
    result = {v.view: v for v in report.views}
    assert result["ok"].status == "built"
    assert result["planted"].status == "failed"
    assert "view 'planted'" in result["planted"].error
    assert "column 'lv' is double in the plan but decimal(5,2)" in result["planted"].error
    assert engine.view_status("planted").table_epoch == 0  # nothing committed
