"""The driver's evaluation of expressions (ops.stateless.driver) against Spark's own: the same
values and the same types for every expression it evaluates, the same kind of error where Spark's
ANSI mode raises (EvaluationError on the driver), and NotOnDriver for what it leaves to Spark."""

from __future__ import annotations

import datetime
import json
import math
import random
from decimal import Decimal

import pyarrow as pa
import pytest
import sqlglot

from ivm.errors import NotOnDriver
from ivm.sql.parse import DIALECT
from ops.expressions import spark_sql
from ops.stateless import driver as stateless_driver
from ops.stateless.driver import Evaluator, render_local

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
    "price / 2",  # decimal division, rounded as java.math.BigDecimal
    "price / (qty + 10)",
    "CASE WHEN qty = 0 THEN NULL ELSE price / qty END",  # the division not taken never fails
    "price * disc / (1 + tax)",
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
    "name LIKE 'a%'",
    "name LIKE '_é'",  # one character, not one byte
    "name LIKE '%A%'",  # case-sensitive
    "NOT (name LIKE 'G%x')",
    "name NOT LIKE '%a'",
    "(qty > 2) IS TRUE",
    "(qty > 2) IS NOT FALSE",
    "flag IS FALSE",
    "CASE seg WHEN 'BUILDING' THEN 1 WHEN 'machinery' THEN qty END",
    "CASE qty WHEN 1 THEN 'one' WHEN 2.0 THEN 'two' ELSE name END",
    "CASE qty WHEN NULL THEN 'never' ELSE 'else' END",
    "CASE qty WHEN 0 THEN 0 ELSE price / qty END",  # the division not taken never fails
    "seg LIKE 'BUILD_NG'",
    "concat(name, '%_') LIKE '%\\\\%\\\\_'",  # escaped: the literal characters
    "EXTRACT(YEAR FROM day)",
    "id % 2",
    "qty % -3 + id % 7",
    "price % 7",
    "price % 2.125",
    "id % price",
    "CASE WHEN qty <> 0 THEN price % qty END",
    "EXTRACT(MONTH FROM day) * 100 + EXTRACT(DAY FROM day)",
    "year(day) * 10000 + month(day) * 100 + day(day)",
    "dayofmonth(day) = EXTRACT(DAY FROM day)",
    # an expression of no column holding what the driver does not compute: Spark's value
    "day < DATE '1995-01-31' + INTERVAL '1' MONTH",  # February's last day: Spark's clamping
    "day >= DATE '1998-12-01' - INTERVAL '90' DAY",
    "DATE '1996-02-29' + INTERVAL '1' YEAR",
    "CASE WHEN flag THEN make_date(2024, 2, 30 - 1) END",
]

LEFT_TO_SPARK = [
    "qty / 2",  # floating-point division
    "ratio % 2",  # floating point
    "upper(name)",  # non-ASCII text: Java's and Arrow's case tables
    "substr(seg, -2)",
    "ratio * 2",  # floating point
    "ratio > 0.5",
    "DATE '2024-1-5'",  # a date Spark reads more leniently
    "name LIKE seg",  # a computed pattern
    "name LIKE 'a!%' ESCAPE '!'",
    "CASE WHEN flag THEN make_date(2024, 13, 1) END",  # Spark's plan decides whether it fails
    "EXTRACT(HOUR FROM day)",
    "year(seg)",  # of a string: Spark's reading of it as a date
    "month(to_date(seg))",
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
        monkeypatch.setattr(stateless_driver, "_TYPES", {})
        monkeypatch.setattr(stateless_driver, "_TYPES_LOADED", set())
        monkeypatch.setattr(stateless_driver, "_TYPES_SAVED", {})
        analyses.clear()
        stateless_driver.load_types(spark, root)
        monkeypatch.setattr(spark, "createDataFrame", counted)
        try:
            evaluator = Evaluator(spark, rows, exprs)
            columns = [evaluator.column(e) for e in exprs]
        finally:
            monkeypatch.setattr(spark, "createDataFrame", real)
        stateless_driver.save_types(spark, root)
        return columns

    first = new_process()
    assert len(analyses) == 1  # one analysis of every expression
    record = tmp_path / stateless_driver.TYPES_RECORD
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
    """MIN/MAX and TopK towers put a row in the bucket Spark's xxhash64 gives it: the
    driver's hash of every type it climbs equals Spark's, NULL included, and of rows of
    several columns."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ops.reduce.driver import spark_row_hash, spark_xxhash64

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
        "w": (  # past 18 digits: hashed as Java's BigInteger bytes (sign and length edges)
            pa.decimal128(38, 4),
            T.DecimalType(38, 4),
            [
                *(Decimal(f"{n}e-4") for n in (0, 1, -1, 127, 128, -128, -129, 255, 256)),
                *(Decimal(f"{rng.randint(-(10**37), 10**37)}e-4") for _ in range(40)),
                Decimal(f"{10**38 - 1}e-4"),
                Decimal(f"{-(10**38) + 1}e-4"),
            ],
        ),
    }
    for name, (arrow, spark_type, values) in columns.items():
        values = [*values, None]
        table = pa.table({name: pa.array(values, arrow)})
        theirs = spark.createDataFrame(table).select(F.xxhash64(name).alias("h")).toArrow()
        mine = [spark_xxhash64(v, spark_type) for v in values]
        assert mine == theirs.column("h").to_pylist(), name
    # Several columns (a TopK tower's bucket): each column's hash seeds the next one's.
    names = list(columns)
    n = min(len(v) for _, _, v in columns.values())
    rows = [
        [columns[c][2][i] if (i + j) % 7 else None for j, c in enumerate(names)] for i in range(n)
    ]
    table = pa.table(
        {c: pa.array([r[j] for r in rows], columns[c][0]) for j, c in enumerate(names)}
    )
    theirs = spark.createDataFrame(table).select(F.xxhash64(*names).alias("h")).toArrow()
    types = [columns[c][1] for c in names]
    assert [spark_row_hash(r, types) for r in rows] == theirs.column("h").to_pylist()


def test_accumulated_results_are_sparks(spark):
    """COUNT, SUM and AVG from the driver's summed state equal Spark's own aggregates over
    the same rows: decimals exact, AVG's division rounded as Spark rounds it."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ivm.plan.ir import Aggregate
    from ops.reduce.driver import _Accumulable

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


def test_a_decimal_average_is_truncated_to_39_places_first(spark):
    """AVG of eleven DECIMAL(38, 38) values from the driver's summed state equals Spark's:
    Spark truncates the quotient to 39 places before it rounds it half up to the result's 38
    (5E-38 / 11 is 0E-38, 16E-38 / 11 is 1E-38; rounded half up to 39 places first, they came
    out 1E-38 larger)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    from ivm.plan.ir import Aggregate
    from ops.reduce.driver import _Accumulable

    sums = {1: 5, 2: -5, 3: 16, 4: 6}
    rows = [
        {"g": g, "p": Decimal(v).scaleb(-38), "_diff": 1}
        for g, total in sums.items()
        for v in (total, *[0] * 10)
    ]
    schema = pa.schema([("g", pa.int32()), ("p", pa.decimal128(38, 38)), ("_diff", pa.int64())])
    table = pa.Table.from_pylist(rows, schema)
    acc = _Accumulable(
        [Aggregate("ap", "avg", "p")], {"g": T.IntegerType(), "p": T.DecimalType(38, 38)}
    )
    mine = {g: acc.results(s) for g, s in acc.sums(table, ["g"]).items()}
    theirs = spark.createDataFrame(table).groupBy("g").agg(F.avg("p")).collect()
    assert {(r[0],): [r[1]] for r in theirs} == mine
    assert [mine[(g,)][0] for g in sums] == [Decimal(v).scaleb(-38) for v in (0, 0, 1, 1)]


@pytest.fixture(scope="module")
def edge() -> pa.Table:
    """Rows at the edges of their types: extremes, zeros, NULLs, -0.0, NaN, infinities."""
    d = Decimal
    return pa.table(
        {
            "i": pa.array([2147483647, -2147483648, 0, 7, None], pa.int32()),
            "j": pa.array([1, 1, 0, -2, None], pa.int32()),
            "small": pa.array([5, -5, 0, 100, None], pa.int32()),
            "b": pa.array([2**63 - 1, -(2**63), 0, 3, None], pa.int64()),
            "t": pa.array([127, -128, 0, 1, None], pa.int8()),
            "x": pa.array([d("9.99"), d("-9.95"), d("0.00"), d("0.05"), None], pa.decimal128(3, 2)),
            "c": pa.array([d("9.95"), d("-0.05"), d("1.00"), d("9.94"), None], pa.decimal128(3, 2)),
            "w": pa.array(
                [
                    d("12345678901234567890.123456789012345678"),
                    d("-0.000000000000000001"),
                    d(0),
                    d("3.333333333333333333"),
                    None,
                ],
                pa.decimal128(38, 18),
            ),
            "v": pa.array([d("1.5"), d("2.25"), d(0), d(-7), None], pa.decimal128(38, 18)),
            "n": pa.array([d(10) ** 37, d(3), d(0), d(-1), None], pa.decimal128(38, 0)),
            "q": pa.array([d(1), d(3), d(0), d(7), None], pa.decimal128(10, 4)),
            "nz": pa.array([d(1), d(3), d(2), d("0.0007"), None], pa.decimal128(10, 4)),
            "f": pa.array([-0.0, math.nan, math.inf, 1.5, None]),
            "g": pa.array([0.0, 1.0, -math.inf, 0.0, None]),
            "s": pa.array(["12", "abc", " 7 ", "", None]),
            "u": pa.array(["1", "2", "3", "4", None]),
            "flag": pa.array([True, False, None, True, None]),
        }
    )


EDGE_CASES = [
    # decimal casts: a carry into a new digit fits a wider type, overflows a narrow one
    ("CAST(x AS DECIMAL(5, 1))", "value"),  # 9.99 -> 10.0
    ("CAST(x AS DECIMAL(3, 1))", "value"),
    ("CAST(c AS DECIMAL(2, 1))", "overflow"),  # 9.95 -> 10.0
    ("CAST(w AS DECIMAL(10, 2))", "overflow"),
    ("try_cast(x AS DECIMAL(5, 1))", "value"),
    ("try_cast(b AS INT)", "declined"),  # TRY_CAST's NULL for what fails: Spark's
    # integers: checked in their own type, as ANSI mode checks them
    ("small + j", "value"),
    ("small * j - 3", "value"),
    ("-small", "value"),
    ("CAST(small AS TINYINT)", "value"),
    ("i + j", "overflow"),
    ("-i", "overflow"),
    ("b + 1", "overflow"),
    ("b * 2", "overflow"),
    ("t + t", "overflow"),
    ("-t", "overflow"),
    ("CAST(b AS INT)", "overflow"),
    ("2147483647 + 1 + small * 0", "overflow"),
    # decimals: exact sums, products and quotients rounded once to the scale (Spark's 39 digits)
    ("x * c", "value"),
    ("x + c - 1", "value"),
    ("x * 2", "value"),
    ("x / 3", "value"),
    ("x / nz", "value"),
    ("w + v", "value"),
    ("w * v", "value"),  # (38,18) x (38,18): scale lost, rounded as Spark rounds
    ("w * v * v", "value"),
    ("v * v", "value"),
    ("w * 1.5", "value"),
    ("w / nz", "value"),
    ("-x", "value"),
    ("-w", "value"),  # Spark negates through a 34-digit Scala BigDecimal
    ("n + w", "overflow"),
    ("w - n", "overflow"),
    ("n * n", "overflow"),
    ("n * v", "overflow"),
    ("w * w", "overflow"),
    # division by zero (a NULL dividend is NULL); floating-point division is Spark's
    ("x / q", "division by zero"),
    ("w / v", "division by zero"),
    ("x / 0", "division by zero"),
    ("i / 0", "declined"),
    # remainders: the dividend's sign, exact; by zero of a non-NULL dividend fails
    ("i % nullif(j, 0)", "value"),  # -2147483648 % 1, 7 % -2
    ("i % j", "division by zero"),  # 0 % 0
    ("b % 3", "value"),
    ("b % -1", "value"),
    ("t % nullif(j, 0)", "value"),
    ("x % nullif(v, 0)", "value"),
    ("w % nz", "value"),
    ("n % 7", "value"),
    ("i % 0", "division by zero"),
    ("x % q", "division by zero"),
    ("NULL % i", "value"),
    ("f / 0", "declined"),
    ("1 / 0 + i", "declined"),
    # text that is not a number: Spark's to read
    ("CAST(s AS INT)", "declined"),
    ("CAST(u AS INT)", "declined"),
    # NULL in every operand position
    ("NULL + i", "value"),
    ("i + NULL", "value"),
    ("NULL * x", "value"),
    ("x / NULL", "value"),
    ("-NULL", "value"),
    ("CAST(NULL AS DECIMAL(5, 1))", "value"),
    ("coalesce(NULL, i)", "value"),
    ("NULL = i", "value"),
    ("i IN (NULL, 1)", "value"),
    ("upper(NULL)", "value"),
    ("concat(NULL, s)", "value"),
    ("length(NULL)", "value"),
    ("substr(NULL, 1, 2)", "value"),
    ("NOT NULL", "value"),
    ("NULL AND flag", "value"),
    ("flag OR NULL", "value"),
    ("nullif(NULL, 1)", "value"),
    ("NULL / x", "declined"),  # typed double by Spark
    # conditional parts evaluated for the rows that reach them only
    ("CASE WHEN q = 0 THEN NULL ELSE x / q END", "value"),
    ("CASE WHEN i < 100 THEN i + j END", "value"),
    ("IF(q = 0, 0, x / q)", "value"),
    ("x / nullif(q, 0)", "value"),
    ("coalesce(nullif(q, 0), 1)", "value"),
    ("coalesce(small, i + j)", "value"),
    ("q <> 0 AND x / q > 1", "value"),
    ("q = 0 OR x / q > 1", "value"),
    ("small BETWEEN 0 AND i + j", "overflow"),
    # doubles: carried as they are (-0.0, NaN, infinities); their arithmetic is Spark's
    ("f", "value"),
    ("coalesce(f, g)", "value"),
    ("CASE WHEN flag THEN f ELSE g END", "value"),
    ("f IS NULL", "value"),
    ("f * 2", "declined"),
    ("f > 0", "declined"),
]


def _same_value(a: object, b: object) -> bool:
    """Equal, a NaN equal to a NaN and -0.0 not equal to 0.0."""
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return a == b and math.copysign(1, a) == math.copysign(1, b)
    return a == b


@pytest.mark.parametrize("sql,expected", EDGE_CASES)
def test_edge_cases_evaluate_or_fail_as_spark(spark, edge, sql, expected):
    """The driver gives Spark's value and type, or fails where Spark's ANSI mode fails with
    the same kind of error (naming the expression), or leaves the expression to Spark."""
    from pyspark.errors import PySparkException

    from ivm.errors import EvaluationError
    from ops.stateless.spark import evaluation_error

    e = sqlglot.parse_one(sql, read=DIALECT)
    frame = spark.createDataFrame(edge).selectExpr(f"{spark_sql(e)} AS v")
    if expected == "declined":
        with pytest.raises(NotOnDriver):
            Evaluator(spark, edge, [e]).column(e)
        return
    if expected == "value":
        mine = Evaluator(spark, edge, [e]).column(e)
        theirs = frame.toArrow()
        assert mine.type == theirs.schema.field("v").type
        values = list(zip(mine.to_pylist(), theirs.column("v").to_pylist(), strict=True))
        assert all(_same_value(a, b) for a, b in values), values
        return
    with pytest.raises(EvaluationError) as found:
        Evaluator(spark, edge, [e]).column(e)
    with pytest.raises(PySparkException) as raised:
        frame.toArrow()
    theirs = evaluation_error(raised.value)
    assert theirs is not None, raised.value
    assert found.value.kind == theirs.kind == expected
    assert found.value.operation and found.value.operation in spark_sql(e)


def test_without_ansi_mode_failures_are_left_to_spark(spark, edge):
    """With ANSI mode off Spark returns NULL (or wraps) where it would raise: the driver
    leaves those expressions to Spark, and still computes the others."""
    failing = [sql for sql, expected in EDGE_CASES if expected in ("overflow", "division by zero")]
    spark.conf.set("spark.sql.ansi.enabled", "false")
    try:
        for sql in failing:
            e = sqlglot.parse_one(sql, read=DIALECT)
            with pytest.raises(NotOnDriver):
                Evaluator(spark, edge, [e]).column(e)
        e = sqlglot.parse_one("CAST(x AS DECIMAL(5, 1))", read=DIALECT)
        assert Evaluator(spark, edge, [e]).column(e).to_pylist()[:2] == [
            Decimal("10.0"),
            Decimal("-10.0"),
        ]
    finally:
        spark.conf.unset("spark.sql.ansi.enabled")


def test_a_failure_names_its_column(spark, edge):
    """A projection's failure names the output column and the expression; over no rows
    nothing fails."""
    from ivm.errors import EvaluationError
    from ivm.plan.ir import Get, Project
    from ops import DIFF, TIME

    n = edge.num_rows
    rows = edge.append_column(TIME, pa.array([1] * n, pa.int64()))
    rows = rows.append_column(DIFF, pa.array([1] * n, pa.int64()))
    node = Project(
        Get("t", "source", tuple(edge.column_names)),
        (
            ("k", sqlglot.parse_one("small", read=DIALECT)),
            ("y", sqlglot.parse_one("CAST(c AS DECIMAL(2, 1))", read=DIALECT)),
        ),
    )
    with pytest.raises(EvaluationError) as found:
        render_local(spark, node, {"t": rows})
    assert (found.value.column, found.value.kind) == ("y", "overflow")
    assert "CAST(`c` AS DECIMAL(2, 1))" in str(found.value)
    assert render_local(spark, node, {"t": rows.slice(0, 0)}).num_rows == 0
