"""The driver's evaluation of expressions (ops.local) against Spark's own: the same values and
the same types for every expression it evaluates, and NotOnDriver for what it leaves to Spark."""

from __future__ import annotations

import datetime
import json
import random
from decimal import Decimal

import pyarrow as pa
import pytest
import sqlglot

from ivm.errors import NotOnDriver
from ivm.sql.parse import DIALECT
from ops import local
from ops.local import Evaluator, render_local
from ops.stateless import spark_sql

pytestmark = pytest.mark.spark

EVALUATED = [
    "price * (1 - disc)",
    "price * (1 - disc) * (1 + tax)",
    "price * price * price * price",
    "price + qty",
    "qty * 2 + 1",
    "CAST(qty AS BIGINT) + 1",
    "-price",
    "-qty",
    "qty > 2 AND seg IS NOT NULL",
    "NOT (qty IS NULL OR qty < 5)",
    "price > 50",
    "price > 10.5",
    "price < qty",
    "CASE WHEN price > 50 THEN 'high' WHEN price > 10 THEN 'mid' ELSE 'low' END",
    "CASE WHEN price < 0 THEN price ELSE qty END",
    "CASE WHEN flag THEN 1 END",
    "coalesce(name, 'none')",
    "coalesce(qty, price)",
    "CAST(price AS DECIMAL(10, 1))",
    "upper(seg)",
    "lower(seg)",
    "substr(seg, 1, 2)",
    "substr(seg, 3)",
    "length(name)",
    "concat(seg, '-', coalesce(name, '?'))",
    "day >= DATE '1998-01-01'",
    "day <= DATE '1998-09-02'",
    "seg = 'BUILDING'",
    "seg IN ('BUILDING', 'machinery')",
    "qty IN (1, 2, NULL)",
    "qty BETWEEN 1 AND 4",
    "price BETWEEN -10 AND 10.5",
    "qty <=> NULL",
    "qty = NULL",
    "flag = true",
]

LEFT_TO_SPARK = [
    "price / 2",  # decimal division
    "id % 2",
    "upper(name)",  # non-ASCII text: Java's and Arrow's case tables
    "substr(seg, -2)",
    "qty * 2147483647 * 2",  # integer overflow: Spark raises (ANSI) or wraps
    "CAST(price AS DECIMAL(3, 1))",  # overflow
    "ratio * 2",  # floating point
    "ratio > 0.5",
    "name LIKE 'a%'",
    "DATE '2024-1-5'",  # a date Spark reads more leniently
]


@pytest.fixture(scope="module")
def rows() -> pa.Table:
    rng = random.Random(11)
    n = 400

    def maybe(v):
        return None if rng.random() < 0.1 else v

    day0 = datetime.date(1995, 1, 1)
    return pa.table(
        {
            "id": pa.array(range(n), pa.int64()),
            "qty": pa.array([maybe(rng.randint(-5, 9)) for _ in range(n)], pa.int32()),
            "price": pa.array(
                [maybe(Decimal(rng.randint(-99999, 99999)) / 100) for _ in range(n)],
                pa.decimal128(12, 2),
            ),
            "disc": pa.array(
                [maybe(Decimal(rng.randint(0, 10)) / 100) for _ in range(n)], pa.decimal128(15, 2)
            ),
            "tax": pa.array(
                [maybe(Decimal(rng.randint(0, 8)) / 100) for _ in range(n)], pa.decimal128(15, 2)
            ),
            "name": pa.array(
                [maybe(rng.choice(["alpha", "Beta", "GAMMA x", "", "zé"])) for _ in range(n)]
            ),
            "seg": pa.array(
                [maybe(rng.choice(["BUILDING", "AUTOMOBILE", "machinery"])) for _ in range(n)]
            ),
            "day": pa.array(
                [maybe(day0 + datetime.timedelta(days=rng.randint(0, 2000))) for _ in range(n)]
            ),
            "flag": pa.array([maybe(rng.random() < 0.5) for _ in range(n)], pa.bool_()),
            "ratio": pa.array([maybe(rng.random()) for _ in range(n)], pa.float64()),
        }
    )


@pytest.mark.parametrize("sql", EVALUATED)
def test_driver_evaluates_as_spark_does(spark, rows, sql):
    e = sqlglot.parse_one(sql, read=DIALECT)
    mine = Evaluator(spark, rows, [e]).column(e)
    theirs = spark.createDataFrame(rows).selectExpr(f"{spark_sql(e)} AS v").toArrow()
    assert mine.type == theirs.schema.field("v").type
    assert mine.to_pylist() == theirs.column("v").to_pylist()


@pytest.mark.parametrize("sql", LEFT_TO_SPARK)
def test_what_the_driver_cannot_match_is_left_to_spark(spark, rows, sql):
    e = sqlglot.parse_one(sql, read=DIALECT)
    with pytest.raises(NotOnDriver):
        Evaluator(spark, rows, [e]).column(e)


def test_expression_types_are_kept_for_the_next_process(spark, rows, tmp_path, monkeypatch):
    """A process records under the lake the types Spark gave the driver's expressions; the
    next one (its caches empty) reads them instead of asking Spark, and computes the same
    values. A record made by another Spark version or typing settings is not used."""
    root = str(tmp_path)
    exprs = [
        sqlglot.parse_one(sql, read=DIALECT)
        for sql in ("price * (1 - disc)", "qty + 1", "upper(seg)", "day < DATE '1996-01-01'")
    ]
    analyses: list[object] = []
    real = spark.createDataFrame

    def counted(*args, **kwargs):
        analyses.append(args)
        return real(*args, **kwargs)

    def new_process() -> list[pa.Array]:
        monkeypatch.setattr(local, "_TYPES", {})
        monkeypatch.setattr(local, "_TYPES_LOADED", set())
        monkeypatch.setattr(local, "_TYPES_SAVED", {})
        analyses.clear()
        local.load_types(spark, root)
        monkeypatch.setattr(spark, "createDataFrame", counted)
        try:
            evaluator = Evaluator(spark, rows, exprs)
            columns = [evaluator.column(e) for e in exprs]
        finally:
            monkeypatch.setattr(spark, "createDataFrame", real)
        local.save_types(spark, root)
        return columns

    first = new_process()
    assert len(analyses) == 1  # one analysis of every expression
    record = tmp_path / local.TYPES_RECORD
    assert record.exists()
    assert new_process() == first and not analyses  # read, not analysed
    written = json.loads(record.read_text())
    written["typing"]["version"] = "0.0.1"
    record.write_text(json.dumps(written))
    assert new_process() == first and len(analyses) == 1  # analysed again
    assert json.loads(record.read_text())["typing"]["version"] == spark.version


def test_union_all_widens_numbers_as_spark(spark):
    from ivm.plan.ir import Get, UnionAll
    from ops import DIFF, TIME

    a = pa.table(
        {
            "k": pa.array([1, None], pa.int32()),
            "v": pa.array([Decimal("1.25"), None], pa.decimal128(5, 2)),
            TIME: pa.array([3, 3], pa.int64()),
            DIFF: pa.array([1, -1], pa.int64()),
        }
    )
    b = pa.table(
        {
            "k": pa.array([7], pa.int64()),
            "v": pa.array([Decimal("123456.5")], pa.decimal128(10, 1)),
            TIME: pa.array([3], pa.int64()),
            DIFF: pa.array([2], pa.int64()),
        }
    )
    union = UnionAll((Get("a", "source", ("k", "v")), Get("b", "source", ("k", "v"))))
    mine = render_local(spark, union, {"a": a, "b": b})
    theirs = spark.createDataFrame(a).unionAll(spark.createDataFrame(b)).toArrow()
    assert mine.schema == theirs.schema
    assert mine.to_pylist() == theirs.to_pylist()


def test_spark_xxhash64_is_sparks(spark):
    """MIN/MAX towers put a value in the bucket Spark's xxhash64 gives it: the driver's hash
    of every type it climbs equals Spark's, NULL included."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ops.local_reduce import spark_xxhash64

    rng = random.Random(5)
    columns = {
        "i": (pa.int32(), T.IntegerType(), [rng.randint(-(2**31), 2**31 - 1) for _ in range(50)]),
        "l": (pa.int64(), T.LongType(), [rng.randint(-(2**63), 2**63 - 1) for _ in range(50)]),
        "d": (
            pa.date32(),
            T.DateType(),
            [
                datetime.date(1992, 1, 1) + datetime.timedelta(rng.randint(0, 4000))
                for _ in range(50)
            ],
        ),
        "m": (
            pa.decimal128(15, 2),
            T.DecimalType(15, 2),
            [Decimal(rng.randint(-(10**13), 10**13)) / 100 for _ in range(50)],
        ),
        "s": (
            pa.string(),
            T.StringType(),
            [
                "",
                "a",
                "zé",
                "x" * 31,
                "y" * 32,
                "é" * 40,
                *(f"{rng.getrandbits(200):x}" for _ in range(40)),
            ],
        ),
        "b": (pa.bool_(), T.BooleanType(), [True, False] * 20),
    }
    for name, (arrow, spark_type, values) in columns.items():
        values = [*values, None]
        table = pa.table({name: pa.array(values, arrow)})
        theirs = spark.createDataFrame(table).select(F.xxhash64(name).alias("h")).toArrow()
        mine = [spark_xxhash64(v, spark_type) for v in values]
        assert mine == theirs.column("h").to_pylist(), name


def test_accumulated_results_are_sparks(spark):
    """COUNT, SUM and AVG from the driver's summed state equal Spark's own aggregates over
    the same rows: decimals exact, AVG's division rounded as Spark rounds it."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ivm.plan.ir import Aggregate
    from ops.local_reduce import _Accumulable

    rng = random.Random(8)
    rows = [
        {
            "g": rng.randint(0, 30),
            "p": None if rng.random() < 0.05 else Decimal(rng.randint(-(10**9), 10**9)) / 1000,
            "q": None if rng.random() < 0.05 else rng.randint(-50, 50),
            "_diff": 1,
        }
        for _ in range(3000)
    ]
    aggregates = [
        Aggregate("n", "count", None),
        Aggregate("np", "count", "p"),
        Aggregate("sp", "sum", "p"),
        Aggregate("ap", "avg", "p"),
        Aggregate("sq", "sum", "q"),
        Aggregate("aq", "avg", "q"),
    ]
    acc = _Accumulable(
        aggregates, {"g": T.IntegerType(), "p": T.DecimalType(12, 3), "q": T.IntegerType()}
    )
    table = pa.Table.from_pylist(
        rows,
        pa.schema(
            [
                ("g", pa.int32()),
                ("p", pa.decimal128(12, 3)),
                ("q", pa.int32()),
                ("_diff", pa.int64()),
            ]
        ),
    )
    mine = {g: acc.results(s) for g, s in acc.sums(table, ["g"]).items()}
    theirs = (
        spark.createDataFrame(table)
        .groupBy("g")
        .agg(F.count("*"), F.count("p"), F.sum("p"), F.avg("p"), F.sum("q"), F.avg("q"))
        .collect()
    )
    assert {(r[0],): list(r[1:]) for r in theirs} == mine
    assert {acc.result_type(a) for a in aggregates[2:4]} == {
        pa.decimal128(22, 3),
        pa.decimal128(16, 7),
    }
