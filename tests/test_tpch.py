"""The 22 TPC-H queries as views (``tests/tpch/qNN.sql``: the standard text in Spark SQL at
the validation parameters, each ``ORDER BY ... LIMIT`` made total).

Planning (no Spark): each query the planner accepts has an EXPLAIN golden (``qNN.explain``);
each one it refuses is listed in ``refused.expected`` with its message, which must name the
file, line and column. Both lists are goldens, so a query that becomes accepted, or whose
refusal changes, shows in the diff of ``--update-goldens``.

Maintenance (Spark): every accepted query is built over the eight TPC-H tables as Delta
sources at SF0.01, then after each random epoch (one by default,
:func:`tests.lakegen.batches`: TPC-H's refresh functions, updates of every
table, NULLs written into nullable columns, deletions of parts and suppliers) every view must
equal DuckDB's result, and after the last one Spark's from-scratch results too, internal
views included (exact multisets, exact decimals), the epochs computed in turn on the
driver's path and on Spark's.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable

from demo.tpch import ALL_TABLES, apply_change_batch, create_sources, generate_parquet
from engine.facade import Engine
from engine.oracle import compare_views, spark_compare_views
from ivm.errors import SqlError
from ivm.plan.explain import explain
from ivm.plan.planner import plan_views
from ivm.policy import Policy
from ivm.sql.parse import parse_view
from tests.lakegen import batches
from tests.test_goldens import check_golden

QUERIES = Path(__file__).parent / "tpch"

COLUMNS = {
    "region": "r_regionkey r_name r_comment",
    "nation": "n_nationkey n_name n_regionkey n_comment",
    "supplier": "s_suppkey s_name s_address s_nationkey s_phone s_acctbal s_comment",
    "part": "p_partkey p_name p_mfgr p_brand p_type p_size p_container p_retailprice p_comment",
    "partsupp": "ps_partkey ps_suppkey ps_availqty ps_supplycost ps_comment",
    "customer": "c_custkey c_name c_address c_nationkey c_phone c_acctbal c_mktsegment c_comment",
    "orders": "o_orderkey o_custkey o_orderstatus o_totalprice o_orderdate o_orderpriority "
    "o_clerk o_shippriority o_comment",
    "lineitem": "l_orderkey l_partkey l_suppkey l_linenumber l_quantity l_extendedprice "
    "l_discount l_tax l_returnflag l_linestatus l_shipdate l_commitdate l_receiptdate "
    "l_shipinstruct l_shipmode l_comment",
}
SOURCES = {t: tuple(c.split()) for t, c in COLUMNS.items()}


def planned() -> tuple[dict[str, str], dict[str, SqlError]]:
    """Each query's text by name, split into those the planner accepts and its refusals."""
    accepted, refused = {}, {}
    for path in sorted(QUERIES.glob("q*.sql")):
        try:
            plan_views([parse_view(path.read_text(), path.name)], SOURCES).check()
        except SqlError as e:
            refused[path.stem] = e
        else:
            accepted[path.stem] = path.read_text()
    return accepted, refused


def test_the_queries_plan_or_are_refused_by_construct_and_position(update_goldens) -> None:
    accepted, refused = planned()
    assert len(accepted) + len(refused) == 22
    for name, sql in accepted.items():
        plan = plan_views([parse_view(sql, f"{name}.sql")], SOURCES)
        check_golden(QUERIES / f"{name}.explain", explain(plan.views[name], plan), update_goldens)
    for name, e in refused.items():
        assert e.line is not None and e.col is not None, (name, str(e))
    text = "".join(f"{name}: {e}\n" for name, e in refused.items())
    check_golden(QUERIES / "refused.expected", text, update_goldens)


@pytest.fixture(scope="module")
def tpch_parquet(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return generate_parquet(0.01, tmp_path_factory.mktemp("tpch"), ALL_TABLES)


def _update(uri: str, key: str, keys: list[int], set_: dict[str, str]) -> None:
    """delta-rs MERGE: rows whose ``key`` is in ``keys`` get ``set_`` (SQL over ``t``)."""
    source = pa.table({"k": pa.array(sorted(set(keys)), pa.int64())})
    DeltaTable(uri).merge(
        source, predicate=f"t.{key} = s.k", source_alias="s", target_alias="t"
    ).when_matched_update(set_).execute()


def _delete(uri: str, key: str, keys: list[int]) -> None:
    source = pa.table({"k": pa.array(sorted(set(keys)), pa.int64())})
    DeltaTable(uri).merge(
        source, predicate=f"t.{key} = s.k", source_alias="s", target_alias="t"
    ).when_matched_delete().execute()


def _random_epoch(sources: dict[str, str], rng: random.Random) -> None:
    """TPC-H's refresh functions with updates (``apply_change_batch``), then changes to the
    other tables: values that move rows in and out of the queries' filters, NULLs, deletions."""
    apply_change_batch(sources, 0.02, seed=rng.randrange(1 << 30))

    def some(n: int, upto: int) -> list[int]:
        return rng.sample(range(1, upto + 1), n)

    dec = "DECIMAL(15,2)"
    _update(sources["part"], "p_partkey", some(60, 2000), {"p_brand": "'Brand#23'"})
    _update(sources["part"], "p_partkey", some(40, 2000), {"p_container": "'MED BOX'"})
    _update(sources["part"], "p_partkey", some(20, 2000), {"p_size": "CAST(15 AS INT)"})
    _update(sources["part"], "p_partkey", some(10, 2000), {"p_type": "NULL", "p_size": "NULL"})
    _delete(sources["part"], "p_partkey", some(5, 2000))
    _update(
        sources["partsupp"], "ps_partkey", some(40, 2000),
        {"ps_supplycost": f"CAST(t.ps_supplycost - 1 AS {dec})", "ps_availqty": "CAST(t.ps_availqty + 5 AS INT)"},
    )  # fmt: skip
    _update(sources["partsupp"], "ps_partkey", some(5, 2000), {"ps_supplycost": "NULL"})
    _update(sources["supplier"], "s_suppkey", some(5, 100), {"s_acctbal": "NULL"})
    _update(sources["supplier"], "s_suppkey", some(5, 100), {"s_nationkey": "t.s_nationkey % 5"})
    _delete(sources["supplier"], "s_suppkey", some(2, 100))
    _update(sources["customer"], "c_custkey", some(20, 1500), {"c_mktsegment": "'BUILDING'"})
    _update(sources["customer"], "c_custkey", some(5, 1500), {"c_nationkey": "NULL"})
    orders = rng.sample(sorted(_keys(sources["orders"], "o_orderkey")), 30)
    _update(sources["lineitem"], "l_orderkey", orders[:10], {"l_discount": "NULL"})
    _update(sources["lineitem"], "l_orderkey", orders[10:20], {"l_shipdate": "NULL"})
    _update(sources["lineitem"], "l_orderkey", orders[20:], {"l_returnflag": "'R'"})
    _update(sources["orders"], "o_orderkey", orders[:5], {"o_orderdate": "NULL"})
    _update(sources["nation"], "n_nationkey", [rng.randrange(25)], {"n_regionkey": "3"})


def _keys(uri: str, column: str) -> list[int]:
    return DeltaTable(uri).to_pyarrow_dataset().to_table(columns=[column]).column(0).to_pylist()


def _check(engine: Engine, epoch: int, *, spark: bool) -> None:
    """Every view against DuckDB; with ``spark``, every view, internal ones too, against
    Spark (after the last epoch: the suite's time)."""
    spark_checks = spark_compare_views(engine) if spark else []
    for c in [*compare_views(engine), *spark_checks]:
        assert c.equal, f"epoch {epoch}: {c.describe()}"


PARTS = 3
"""The maintained queries are checked in this many parts (every ``PARTS``-th query in order,
each over a lake of its own), each a ``slow`` test: a whole-suite run takes one part, by turns
(``tests/conftest.py``'s ``slow_shard``)."""


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.parametrize(
    "part", range(PARTS), ids=[f"part {p + 1} of {PARTS}" for p in range(PARTS)]
)
def test_accepted_queries_stay_equal_to_the_oracles(
    spark, make_project, tmp_path, use_policy, tpch_parquet, part
) -> None:
    """Built once, then random epochs computed in turn where the policy places them (the
    driver computes the small changes it can) and by Spark alone; every view checked against
    DuckDB after each, and all, internal ones too, against Spark after the last."""
    default = use_policy()
    accepted = {
        name: sql for i, (name, sql) in enumerate(sorted(planned()[0].items())) if i % PARTS == part
    }
    sources = create_sources(tpch_parquet, tmp_path / "data", ALL_TABLES)
    engine = Engine(make_project(accepted, sources), spark=spark)
    rng = random.Random(11)
    paths = ["driver", "spark"] * batches(3, bound=1)
    for epoch, path in enumerate([None, *paths], 1):
        if path is not None:
            _random_epoch(sources, rng)
        use_policy(Policy.spark_only() if path == "spark" else default)
        report = engine.refresh()
        assert report.ok, [(v.view, v.error) for v in report.views if v.error]
        assert engine.latest_epoch() == epoch
        computed = {v.computed_by for v in report.views}
        if path == "spark":
            assert computed <= {"spark", "nothing"}, computed  # nothing: no input changed
        elif path == "driver":  # small changes: the driver computes some views
            assert "driver" in computed, computed
        _check(engine, epoch, spark=epoch == len(paths) + 1)
