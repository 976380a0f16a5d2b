"""SUM, AVG, VARIANCE and STDDEV over floating point stay exact under any inserts and deletes.

The guarantee (README, "Floating point"): each is the exact value over the rows present,
rounded once to a double (SUM equals ``math.fsum``), and NaN and infinities combine as Spark
combines them. The kernel (:mod:`ops.reduce.floatsum`) is checked against rational arithmetic
without Spark; the views are checked after every epoch, bit for bit, against the same exact values
computed here from the source's rows, and the issue's cases against Spark's from-scratch
answer too.
"""

from __future__ import annotations

import math
import random
from decimal import Decimal
from fractions import Fraction

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

import ivm.policy
from engine.facade import Engine
from ops.reduce import floatsum
from tests.marks import by_turns

SCHEMA = pa.schema(
    [("id", pa.int64()), ("g", pa.string()), ("v", pa.float64()), ("d", pa.decimal128(38, 18))]
)

VIEWS = {
    "f_group": """
        CREATE VIEW f_group AS
        SELECT g, sum(v) AS s, avg(v) AS a, var_samp(v) AS vs, var_pop(v) AS vp,
               stddev_samp(v) AS ss, stddev_pop(v) AS sp, count(v) AS n, var_samp(d) AS vd
        FROM t GROUP BY g
    """,
    "f_global": """
        CREATE VIEW f_global AS SELECT sum(v) AS s, var_pop(v) AS vp, count(*) AS n FROM t
    """,
    "f_distinct": """
        CREATE VIEW f_distinct AS SELECT g, sum(DISTINCT v) AS sd FROM t GROUP BY g
    """,
}


def _wild(rng: random.Random) -> float:
    """Doubles of every magnitude, with cancellation: huge values next to small ones."""
    k = rng.random()
    if k < 0.25:
        return rng.choice([1e20, -1e20, 1e300, -1e300, 5e-324, -0.0, 0.0, 2.0**-1022])
    if k < 0.5:
        return 1e9 + rng.randint(1, 5)
    if k < 0.75:
        return math.ldexp(rng.random() * 2 - 1, rng.randint(-1074, 1000))
    return rng.uniform(-10, 10)


# -- the kernel, without Spark -------------------------------------------------------------------


def test_terms_hold_every_double_and_square_exactly():
    rng = random.Random(5)
    values = [5e-324, -5e-324, 1.7976931348623157e308, 2.0**-1022, 1.0, -3.0, 0.1]
    values += [_wild(rng) for _ in range(2000)]
    for x in values:
        if x == 0:
            continue
        e, m, qh, ql = floatsum.terms(x)
        assert Fraction(m) * Fraction(2) ** e == Fraction(x), x
        assert qh * Fraction(2) ** (2 * e + 54) + ql * Fraction(2) ** (2 * e) == Fraction(x) ** 2
        assert abs(m) < 2**53 and 0 <= qh < 2**52 and 0 <= ql < 2**82, x  # DECIMAL(38, 0) sums
        total, squares = floatsum.fixed([(e, m, qh, ql)])
        unit = Fraction(1, 2**floatsum.OFFSET)
        assert (total * unit, squares * unit) == (Fraction(x), Fraction(x) ** 2), x


def _sums(values: list[float]) -> tuple[int, int]:
    return floatsum.fixed(floatsum.terms(x) for x in values if x != 0)


def rounded(q: Fraction) -> float:
    try:
        return q.numerator / q.denominator
    except OverflowError:
        return math.inf if q > 0 else -math.inf


def exact(func: str, values: list[float | None]) -> float | None:
    """The guarantee computed independently: Fractions over the values present."""
    xs = [x for x in values if x is not None]
    n = len(xs)
    if func in ("sum", "avg"):
        if not n:
            return None
        if any(math.isnan(x) for x in xs) or (math.inf in xs and -math.inf in xs):
            return math.nan
        if math.inf in xs or -math.inf in xs:
            return math.inf if math.inf in xs else -math.inf
        if func == "sum":
            return math.fsum(xs)
        return rounded(sum(map(Fraction, xs)) / n)
    ddof = 1 if func.endswith("samp") else 0
    if n <= ddof:
        return None
    if any(not math.isfinite(x) for x in xs):
        return math.nan
    fx = [Fraction(x) for x in xs]
    mean = sum(fx) / n
    var = sum((x - mean) ** 2 for x in fx) / (n - ddof)
    value = rounded(var)
    return math.sqrt(value) if func.startswith("stddev") else value


def same(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is b
    return (math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("seed", range(4))
def test_exact_result_equals_rational_arithmetic(seed):
    rng = random.Random(seed)
    present: list[float] = []
    funcs = ("sum", "avg", "var_samp", "var_pop", "stddev_samp", "stddev_pop")
    for _ in range(60):
        if present and rng.random() < 0.4:
            present.remove(rng.choice(present))  # a retraction: the bins subtract its parts
        else:
            present.append(_wild(rng))
        finite = [x for x in present if math.isfinite(x)]
        for func in funcs:
            got = floatsum.exact_result(func, len(present), 0, 0, 0, *_sums(finite))
            assert same(got, exact(func, present)), (func, present)


def test_issue_cases_in_the_kernel():
    # 1e20 inserted, then retracted: its terms cancel exactly
    total = floatsum.fixed([floatsum.terms(1e20), floatsum.terms(1.0), floatsum.terms(0.5)])[0]
    total -= floatsum.fixed([floatsum.terms(1e20)])[0]
    assert floatsum.exact_result("sum", 2, 0, 0, 0, total, 0) == 1.5
    xs = [1e9 + 1, 1e9 + 2, 1e9 + 3, 1e9 + 2]
    got = floatsum.exact_result("var_samp", 4, 0, 0, 0, *_sums(xs))
    assert got == 2 / 3


# -- views, on Spark -----------------------------------------------------------------------------


class FloatLake:
    """One source ``t`` (CDF on) of wild doubles and wide decimals, changed at random."""

    def __init__(self, path: str, seed: int, specials: bool = True) -> None:
        self.path, self.rng, self.next_id = path, random.Random(seed), 0
        self.specials = specials  # NaN and infinities among the values

    def rows(self, n: int) -> list[dict]:
        out = []
        for _ in range(n):
            self.next_id += 1
            v = _wild(self.rng) if self.rng.random() > 0.1 else None
            if self.specials and self.rng.random() < 0.03:
                v = self.rng.choice([math.inf, -math.inf, math.nan])
            d = Decimal(self.rng.randint(-(10**12), 10**12)) / Decimal(10**6) + Decimal(10**19)
            out.append({"id": self.next_id, "g": self.rng.choice("abc"), "v": v, "d": d})
        return out

    def write(self, rows: list[dict], mode: str = "append") -> None:
        config = {"delta.enableChangeDataFeed": "true"}
        write_deltalake(
            self.path, pa.Table.from_pylist(rows, SCHEMA), mode=mode, configuration=config
        )

    def batch(self, inserts: int, deletes: int) -> None:
        ids = DeltaTable(self.path).to_pyarrow_table(columns=["id"]).column("id").to_pylist()
        gone = self.rng.sample(ids, min(len(ids), deletes))
        if gone:
            DeltaTable(self.path).delete(f"id IN ({','.join(map(str, gone))})")
        self.write(self.rows(inserts))

    def current(self) -> list[dict]:
        return DeltaTable(self.path).to_pyarrow_table().to_pylist()


def expected(rows: list[dict]) -> dict[str, dict]:
    """Every view's rows computed here from the source (the guarantee, not Spark)."""
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["g"], []).append(r)
    f_group, f_distinct = {}, {}
    for g, rs in groups.items():
        vs = [r["v"] for r in rs]
        f_group[g] = (
            exact("sum", vs),
            exact("avg", vs),
            exact("var_samp", vs),
            exact("var_pop", vs),
            exact("stddev_samp", vs),
            exact("stddev_pop", vs),
            sum(v is not None for v in vs),
            exact("var_samp", [float(r["d"]) for r in rs]),
        )
        distinct = {v for v in vs if v is not None and not math.isnan(v)}
        distinct_nan = any(v is not None and math.isnan(v) for v in vs)
        f_distinct[g] = exact("sum", [*distinct, *([math.nan] if distinct_nan else [])])
    vs = [r["v"] for r in rows]
    f_global = (exact("sum", vs), exact("var_pop", vs), len(rows))
    return {"f_group": f_group, "f_distinct": f_distinct, "f_global": f_global}


def check(engine: Engine, rows: list[dict]) -> None:
    want = expected(rows)
    group = {r["g"]: r for r in engine.read_view("f_group").to_pylist()}
    assert set(group) == set(want["f_group"])
    cols = ("s", "a", "vs", "vp", "ss", "sp", "n", "vd")
    for g, values in want["f_group"].items():
        got = tuple(group[g][c] for c in cols)
        assert all(same(a, b) for a, b in zip(got, values, strict=True)), (g, got, values)
    distinct = {r["g"]: r["sd"] for r in engine.read_view("f_distinct").to_pylist()}
    assert set(distinct) == set(want["f_distinct"])
    for g, value in want["f_distinct"].items():
        assert same(distinct[g], value), (g, distinct[g], value)
    [glob] = engine.read_view("f_global").to_pylist()
    got = (glob["s"], glob["vp"], glob["n"])
    assert all(same(a, b) for a, b in zip(got, want["f_global"], strict=True)), got


@pytest.mark.spark
@pytest.mark.parametrize(
    "driver", [pytest.param(True, id="driver and Spark"), by_turns(False, id="Spark alone")]
)
def test_views_stay_exact_through_random_batches(spark, make_project, tmp_path, driver):
    # A NaN result is grouped by Spark (the driver declines it before writing any state), so
    # the driver's run has no NaN or infinity; Spark's has them.
    lake = FloatLake(str(tmp_path / "t"), 11 if driver else 12, specials=not driver)
    lake.write(lake.rows(60), mode="overwrite")
    root = make_project(VIEWS, {"t": lake.path})
    engine = Engine(root, spark=spark)
    # Spark alone: the driver takes on no state rows.
    with ivm.policy.using(**({} if driver else {"driver_state_rows": 0})):
        assert engine.refresh().ok
        check(engine, lake.current())
        for inserts, deletes in ((3, 2), (1, 4), (40, 30), (2, 1)):
            lake.batch(inserts, deletes)
            report = engine.refresh()
            assert report.ok, [v.error for v in report.views]
            check(engine, lake.current())
            by = {v.view: v.computed_by for v in report.views}
            # The driver computes a small change's GROUP BY with exact float sums (not a
            # global one, nor a DISTINCT over floating point: Spark's), bit for bit as Spark
            # does.
            assert (by["f_group"] == "driver") == driver, by


@pytest.mark.spark
def test_issue_cases_equal_sparks_from_scratch_answer(spark, make_project, tmp_path):
    path = str(tmp_path / "t")
    rows = [{"id": i, "g": "a", "v": v, "d": None} for i, v in enumerate([1e20, 1.0, 0.5])]
    rows += [{"id": 10 + i, "g": "b", "v": 1e9 + i, "d": None} for i in (1, 2, 3)]
    config = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(path, pa.Table.from_pylist(rows, SCHEMA), configuration=config)
    views = {
        "s": "CREATE VIEW s AS SELECT g, sum(v) AS s FROM t WHERE g = 'a' GROUP BY g",
        "vs": "CREATE VIEW vs AS SELECT g, var_samp(v) AS v FROM t WHERE g = 'b' GROUP BY g",
    }
    engine = Engine(make_project(views, {"t": path}), spark=spark)
    assert engine.refresh().ok
    DeltaTable(path).delete("id = 0")
    write_deltalake(
        path,
        pa.Table.from_pylist([{"id": 20, "g": "b", "v": 1e9 + 2, "d": None}], SCHEMA),
        mode="append",
    )
    assert engine.refresh().ok
    assert engine.read_view("s").to_pylist() == [{"g": "a", "s": 1.5}]
    assert engine.read_view("vs").to_pylist() == [{"g": "b", "v": 2 / 3}]
    from_scratch = spark.createDataFrame(DeltaTable(path).to_pyarrow_table().to_pandas())
    from_scratch.createOrReplaceTempView("t_now")
    [s] = spark.sql("SELECT sum(v) FROM t_now WHERE g = 'a'").collect()
    [v] = spark.sql("SELECT var_samp(v) FROM t_now WHERE g = 'b'").collect()
    assert (s[0], v[0]) == (1.5, 2 / 3)


@pytest.mark.spark
def test_sparks_terms_equal_the_kernels(spark):
    """Spark's column expressions give every double the same exponent and terms as the
    kernel (log2 corrected by pow(2, e); the smallest and largest doubles, powers of two)."""
    from pyspark.sql import functions as F

    rng = random.Random(3)
    values = [5e-324, -5e-324, 1.7976931348623157e308, 2.0**-1022, 2.0**-1023, 2.0**1023]
    values += [math.ldexp(1.0, rng.randint(-1074, 1023)) for _ in range(300)]
    values += [x for x in (_wild(rng) for _ in range(1500)) if x != 0]
    df = spark.createDataFrame([(x,) for x in values], "x double")
    e = floatsum.spark_exponent(F.col("x"), F)
    df = df.select("x", e.alias("e"))
    low, m, qh, ql = floatsum.spark_mantissa(F.col("x"), F.col("e"), F)
    rows = df.select("x", low.alias("low"), m.alias("m"), qh.alias("qh"), ql.alias("ql")).collect()
    for r in rows:
        assert (r["low"], r["m"], int(r["qh"]), int(r["ql"])) == floatsum.terms(r["x"]), r["x"]
