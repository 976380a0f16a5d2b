"""Reductions, DISTINCT, set operations and TopK against the DuckDB oracle.

Random batches of inserts, updates and deletes (``tests.lakegen.RandomLake``) hit every kind
of state: deletes of current minima and maxima (prices and tags are re-drawn), groups that
empty and refill (few groups, rows deleted and re-inserted), NULL-only groups and NULL group
keys (``grp`` and ``tag`` go NULL), duplicate values under COUNT(DISTINCT), one large group
(global aggregates), aggregates over a join, and churn in the first k rows.
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Callable, Iterator

import pytest

import ivm.policy
from engine.facade import Engine
from tests.lakegen import JoinLake, batches
from tests.marks import by_turns
from tests.test_oracle import built_random_lake, check_all

pytestmark = pytest.mark.spark


@pytest.fixture
def policy() -> Iterator[Callable[..., ivm.policy.Policy]]:
    """``policy(**changes)``: the policy in force with ``changes``, until the test ends
    (:func:`ivm.policy.using`)."""
    with contextlib.ExitStack() as stack:
        yield lambda **changes: stack.enter_context(ivm.policy.using(**changes))


VIEWS = {
    "r_acc": """
        CREATE VIEW r_acc AS
        SELECT grp, count(*) AS n, count(qty) AS nq, sum(qty) AS sq, sum(price) AS sp,
               avg(price) AS ap, avg(qty) AS aq
        FROM items GROUP BY grp
    """,
    "r_var": """
        CREATE VIEW r_var AS
        SELECT tag, stddev_samp(price) AS sd, var_pop(qty) AS vp, bool_and(qty > 3) AS ba,
               bool_or(qty > 8) AS bo, count(*) AS n
        FROM items GROUP BY tag
    """,
    "r_global": """
        -- ivm: expected_group_size = 300
        CREATE VIEW r_global AS
        SELECT count(*) AS n, sum(price) AS s, avg(price) AS a, min(price) AS lo,
               max(day) AS hi, count(DISTINCT grp) AS dg
        FROM items
    """,
    "r_empty_global": """
        CREATE VIEW r_empty_global AS
        SELECT count(*) AS n, sum(qty) AS s, max(price) AS m FROM items WHERE qty > 100
    """,
    # global COUNT/SUM/AVG/VARIANCE (DISTINCT too): the driver's; one row even over no row
    "r_global_sums": """
        CREATE VIEW r_global_sums AS
        SELECT count(*) AS n, count(qty) AS nq, sum(qty) AS sq, avg(price) AS ap,
               sum(DISTINCT qty) AS sdq, var_samp(qty) AS vq
        FROM items
    """,
    "r_sparse_global": """
        CREATE VIEW r_sparse_global AS
        SELECT count(*) AS n, sum(price) AS sp, avg(qty) AS aq FROM items WHERE qty >= 11
    """,
    "r_minmax": """
        -- ivm: expected_group_size = 200
        CREATE VIEW r_minmax AS
        SELECT grp, min(price) AS lo, max(price) AS hi, min(tag) AS mt, count(*) AS n
        FROM items GROUP BY grp
    """,
    "r_distinct_aggs": """
        CREATE VIEW r_distinct_aggs AS
        SELECT grp, count(DISTINCT tag) AS dt, sum(DISTINCT qty) AS sdq, count(DISTINCT qty) AS cq,
               listagg(DISTINCT tag, '|') WITHIN GROUP (ORDER BY tag) AS tags
        FROM items GROUP BY grp
    """,
    "r_having": """
        CREATE VIEW r_having AS
        SELECT grp, year(day) AS yr, sum(qty) AS s FROM items GROUP BY grp, year(day)
        HAVING count(*) > 5
    """,
    "r_basic": """
        CREATE VIEW r_basic AS
        SELECT grp, string_agg(tag, ',') WITHIN GROUP (ORDER BY tag) AS tags,
               percentile_disc(0.5) WITHIN GROUP (ORDER BY qty) AS pq
        FROM items GROUP BY grp
    """,
    "r_grain": """
        -- ivm: expected_group_size = 200
        -- Its input is summed per (grp, tag), the grain of both the DISTINCT counts and
        -- the MAX tower: they take that sum as their change, with no pass of their own.
        CREATE VIEW r_grain AS
        SELECT grp, count(*) AS n, sum(qty) AS sq, count(DISTINCT tag) AS dt, max(tag) AS mt
        FROM items GROUP BY grp
    """,
    "r_select_distinct": "CREATE VIEW r_select_distinct AS SELECT DISTINCT grp, qty FROM items",
    "r_union": """
        CREATE VIEW r_union AS SELECT grp AS k FROM items UNION SELECT kind FROM events
    """,
    "r_intersect_all": """
        CREATE VIEW r_intersect_all AS
        SELECT qty % 5 AS m FROM items INTERSECT ALL SELECT id % 5 FROM events
    """,
    "r_except": """
        CREATE VIEW r_except AS
        SELECT grp, qty FROM items EXCEPT SELECT grp, qty FROM items WHERE price < 20
    """,
    "r_except_all": """
        CREATE VIEW r_except_all AS
        SELECT grp FROM items EXCEPT ALL SELECT grp FROM items WHERE price < 30
    """,
    "r_topk": """
        CREATE VIEW r_topk AS SELECT id, price FROM items ORDER BY price DESC, id LIMIT 5
    """,
    "r_topk_group": """
        -- ivm: expected_group_size = 100
        CREATE VIEW r_topk_group AS
        SELECT * FROM (
            SELECT grp, id, qty,
                   ROW_NUMBER() OVER (PARTITION BY grp ORDER BY qty DESC, id) AS rn
            FROM items
        ) WHERE rn <= 3
    """,
    "r_over_agg": "CREATE VIEW r_over_agg AS SELECT grp, sp FROM r_acc WHERE n > 2",
    "r_topk_tight": """
        -- ivm: topk_spare = 0
        CREATE VIEW r_topk_tight AS
        SELECT * FROM (
            SELECT grp, id, price,
                   ROW_NUMBER() OVER (PARTITION BY grp ORDER BY price DESC NULLS LAST, id) AS rn
            FROM items
        ) WHERE rn <= 2
    """,
    "r_topk_offset": """
        -- ivm: topk_spare = 0
        CREATE VIEW r_topk_offset AS
        SELECT id, price FROM items ORDER BY price DESC NULLS LAST, id LIMIT 3 OFFSET 2
    """,
    "r_top_of_view": """
        -- ivm: topk_spare = 0
        CREATE VIEW r_top_of_view AS
        SELECT grp, sp FROM r_acc ORDER BY sp DESC NULLS LAST, grp NULLS FIRST LIMIT 2
    """,
    "r_top_sums": """
        -- ivm: expected_group_size = 20
        CREATE VIEW r_top_sums AS
        SELECT grp, sum(qty) AS sq FROM items GROUP BY grp
        ORDER BY sq DESC NULLS LAST, grp NULLS FIRST LIMIT 2
    """,
    # TopK towers over aggregates: an OFFSET and wide decimal sums (their buckets hashed as
    # Spark hashes them), and a row number per partition
    "r_top_offset_sums": """
        -- ivm: expected_group_size = 300
        CREATE VIEW r_top_offset_sums AS
        SELECT grp, tag, sum(price) AS sp, count(*) AS n FROM items GROUP BY grp, tag
        ORDER BY sp DESC NULLS LAST, grp NULLS FIRST, tag NULLS FIRST LIMIT 3 OFFSET 1
    """,
    "r_top_per_grp": """
        CREATE VIEW r_top_per_grp AS
        SELECT grp, tag, sq, r FROM (
            SELECT grp, tag, sum(qty) AS sq,
                   row_number() OVER (PARTITION BY grp ORDER BY sum(qty) DESC NULLS LAST, tag) AS r
            FROM items GROUP BY grp, tag
        ) t WHERE r <= 2
    """,
}


@pytest.mark.parametrize(
    "driver", [pytest.param(True, id="small state by the driver"), by_turns(False, id="by Spark")]
)
def test_reductions_match_duckdb(spark, make_project, tmp_path, driver, policy):
    builds: list[str] = []
    if not driver:  # towers, buffers, sums of a small change, builds: Spark's jobs alone
        policy(driver_state_rows=0, driver_sort_rows=0, driver_build_rows=0)
    lake, engine = built_random_lake(spark, make_project, tmp_path, VIEWS, 2025, builds.append)
    # A build's DISTINCT counts (their size known) sorted and written by the driver.
    built_counts = [m for m in builds if ".distinct_" in m and "at epoch 1, written by" in m]
    assert bool(built_counts) == driver, builds
    messages: list[str] = []
    engine.progress = messages.append
    for _ in range(batches(3)):
        summary = lake.random_batch()
        report = engine.refresh()
        assert report.ok, (summary, [v.error for v in report.views])
        # GROUP BY with COUNT/SUM/AVG/VARIANCE/STDDEV (DISTINCT too), MIN/MAX and basic
        # aggregates (their values by Spark's functions over the groups' rows), with or
        # without GROUP BY, TopKs (buffered, and towers over aggregates) and INTERSECT/EXCEPT
        # [ALL]: a small change is the driver's (ops.reduce.driver), unless the
        # driver's state rows are off; a TopK to refill from its input is Spark's
        # (r_top_of_view, some rounds).
        by_driver = {v.view for v in report.views if v.computed_by == "driver"}
        grouped = {"r_acc", "r_grain", "r_minmax", "r_select_distinct", "r_union", "r_var"}
        grouped |= {"r_global_sums", "r_sparse_global", "r_global", "r_empty_global"}
        grouped |= {"r_basic", "r_distinct_aggs"}  # STRING_AGG, PERCENTILE_DISC (DISTINCT)
        grouped |= {"r_having"}  # GROUP BY year(day)
        ranked = {"r_topk", "r_topk_group", "r_topk_offset", "r_topk_tight"}
        ranked |= {"r_top_sums", "r_top_offset_sums", "r_top_per_grp"}  # towers
        setops = {"r_intersect_all", "r_except", "r_except_all"}
        expected = (grouped | ranked | setops if driver else set()) | {"r_over_agg"}
        # With the driver's state rows off, a change reaching no state row at all (nothing
        # to read: r_sparse_global's empty filter) is still the driver's: it changes nothing.
        idle = set() if driver else {v.view for v in report.views if v.rows_changed == 0}
        assert by_driver - {"r_top_of_view"} - idle == expected, by_driver
        check_all(engine)
    # A TopK over a view with no spare rows refilled from the view's contents at least once.
    refilled = {m.split(":", 1)[0] for m in messages if "refilled from the input" in m}
    assert "r_top_of_view" in refilled, messages
    # Sums per group and DISTINCT counts (a global COUNT/SUM's aside) written by the driver.
    driver_writes = [  # (an idle change's empty write aside, as above)
        m.split(": state ")[-1] for m in messages if "by the driver" in m and ": 0 rows" not in m
    ]
    sums = [m for m in driver_writes if ".accumulable:" in m]
    counts = [m for m in driver_writes if ".distinct_" in m and ".accumulable:" not in m]
    assert bool(sums) == bool(counts) == driver, messages


JOIN_VIEWS = {
    "agg_join": """
        CREATE VIEW agg_join AS
        SELECT c.c_seg, count(*) AS n, sum(l.l_qty) AS q, max(l.l_price) AS mp,
               count(DISTINCT o.o_id) AS orders, avg(l.l_price) AS ap
        FROM customers c JOIN orders o ON o.o_cust = c.c_id JOIN lines l ON l.l_order = o.o_id
        GROUP BY c.c_seg
    """,
    "top_orders": """
        CREATE VIEW top_orders AS
        SELECT * FROM (
            SELECT o_cust, o_id, o_total,
                   ROW_NUMBER() OVER (PARTITION BY o_cust ORDER BY o_total DESC, o_id) AS rn
            FROM orders
        ) WHERE rn <= 2
    """,
    "top_lines": """
        -- ivm: topk_spare = 0
        CREATE VIEW top_lines AS
        SELECT c.c_seg, o.o_id, l.l_no, l.l_price
        FROM customers c JOIN orders o ON o.o_cust = c.c_id JOIN lines l ON l.l_order = o.o_id
        ORDER BY l.l_price DESC NULLS LAST, o.o_id NULLS FIRST, l.l_no NULLS FIRST LIMIT 3
    """,
}


@pytest.mark.slow
@pytest.mark.parametrize("driver", [True, False], ids=["joins by the driver", "by Spark"])
def test_aggregates_over_joins_match_duckdb(spark, make_project, tmp_path, policy, driver):
    policy(driver=driver)
    lake = JoinLake(tmp_path / "data", 5)
    root = make_project(JOIN_VIEWS, lake.create())
    messages: list[str] = []
    engine = Engine(root, spark=spark, progress=messages.append)
    assert engine.refresh().ok
    check_all(engine)
    for _ in range(batches(3)):
        lake.random_batch()
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        # The driver computes the GROUP BY and the TopK over the join whole (ops.reduce.driver).
        computed = {v.view: v.computed_by for v in report.views if v.view != "top_orders"}
        assert computed == dict.fromkeys(computed, "driver" if driver else "spark"), computed
        check_all(engine)
    # Deleting its rows leaves a TopK with no spare rows short: the join under it is
    # evaluated from the snapshots to refill it.
    from deltalake import DeltaTable

    top = engine.read_view("top_lines").to_pylist()
    assert len(top) == 3
    DeltaTable(lake.paths["lines"]).delete(
        " OR ".join(f"(l_order = {r['o_id']} AND l_no = {r['l_no']})" for r in top)
    )
    messages.clear()
    report = engine.refresh()
    assert report.ok
    check_all(engine)
    # A refill is Spark's; the join's change under it is still the driver's, handed to Spark.
    computed = {v.view: v.computed_by for v in report.views}
    assert computed["top_lines"] == ("mixed" if driver else "spark"), computed
    refilled = {m.split(":", 1)[0] for m in messages if "refilled from the input" in m}
    assert refilled == {"top_lines"}, messages


@pytest.mark.parametrize(
    "by_driver", [by_turns(False, id="spark"), pytest.param(True, id="driver")]
)
def test_deleting_the_minimum_reexamines_few_entries(
    spark, make_project, tmp_path, monkeypatch, policy, by_driver
):
    """One group of 20,000 values: deleting its minimum and maximum reads a few pages of
    each tower level, not the group (rows measured in Spark's Parquet scans). The driver's
    climb (``ops.reduce.climb``, for a small change) reads whole files but runs no Spark job."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from engine.oracle import compare_views

    page_rows = ivm.policy.current().page_rows
    if not by_driver:  # Spark's jobs alone, its scans skipping pages (no file in memory)
        import ops.arrange
        from resources.filecache import FileCache

        policy(driver_state_rows=0)
        monkeypatch.setattr(ops.arrange, "FILES", FileCache(0))

    n = 20_000
    path = str(tmp_path / "big")
    values = list(range(n))
    import random

    random.Random(3).shuffle(values)
    rows = {"g": ["x"] * n + ["y"] * 3, "v": values + [5, 6, 7]}
    write_deltalake(path, pa.table(rows), configuration={"delta.enableChangeDataFeed": "true"})
    root = make_project(
        {
            "extremes": """
                -- ivm: expected_group_size = 20000
                CREATE VIEW extremes AS
                SELECT g, min(v) AS lo, max(v) AS hi, count(*) AS n FROM big GROUP BY g
            """
        },
        {"big": path},
    )
    messages: list[str] = []
    engine = Engine(root, spark=spark, measure_lookups=True, progress=messages.append)
    assert engine.refresh().ok
    DeltaTable(path).delete(f"g = 'x' AND v IN (0, {n - 1})")
    messages.clear()
    report = engine.refresh()
    assert report.ok
    assert all(c.equal for c in compare_views(engine)), [
        c.describe() for c in compare_views(engine)
    ]
    assert engine.read_view("extremes").sort_by("g").to_pylist()[0] == {
        "g": "x",
        "lo": 1,
        "hi": n - 2,
        "n": n - 2,
    }
    lookups = report.views[0].lookups
    levels = sorted(k for k in lookups if ".min_max_v.l" in k)
    assert len(levels) == 5, levels  # 4 levels above the values' level
    climbed = [m for m in messages if "tower climbed by the driver" in m]
    jobs = report.views[0].spark_jobs or 0  # 23 against 67 when written (scans measured)
    if by_driver:
        assert climbed == [
            "extremes: min/max(v): tower climbed by the driver (4 level(s) reached, 2 change rows)"
        ], messages
        assert jobs <= 30, jobs
        return
    assert not climbed and jobs >= 45, (messages, jobs)
    for name in levels:
        st = lookups[name]
        assert st.rows_scanned <= 4 * page_rows, (name, st)
    assert sum(lookups[name].rows_scanned for name in levels) < n // 2


def test_a_tower_the_driver_builds_is_the_one_spark_builds(spark, make_project, tmp_path):
    """A build whose level 0 is small computes the levels above it on the driver (one Spark
    job, not some three a level): the same rows and Delta schema per level as Spark's build
    (strings and dates, NULL keys and NULL values); a rebuild by the driver replaces the
    tables Spark built; the next refresh climbs from them, equal to DuckDB."""
    import datetime

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from engine.oracle import compare_views
    from ivm.plan.reduce import state_tables

    path = str(tmp_path / "events")
    n = 3_000
    rows = {
        "g": [None if i % 11 == 0 else f"g{i % 3}" for i in range(n)],
        "day": [
            None if i % 7 == 0 else datetime.date(2020, 1, 1) + datetime.timedelta(i % 500)
            for i in range(n)
        ],
        "who": [f"é{(i * 37) % 1001}" for i in range(n)],
    }
    write_deltalake(path, pa.table(rows), configuration={"delta.enableChangeDataFeed": "true"})
    root = make_project(
        {
            "spans": """
                -- ivm: expected_group_size = 5000
                CREATE VIEW spans AS
                SELECT g, min(day) AS first, max(day) AS last, min(who) AS least, count(*) AS n
                FROM events GROUP BY g
            """
        },
        {"events": path},
    )
    messages: list[str] = []
    engine = Engine(root, spark=spark, progress=messages.append)

    def levels() -> dict[str, tuple[object, Counter]]:
        out = {}
        for t in state_tables(engine.view("spans").root):
            if ".l" in t.name and not t.name.endswith(".l0"):
                dt = DeltaTable(engine.state_uri("spans", t.name))
                table = dt.to_pyarrow_table()
                out[t.name] = (
                    dt.schema().to_json(),
                    Counter(tuple(r.values()) for r in table.drop_columns(["_time"]).to_pylist()),
                )
        return out

    with ivm.policy.using(driver_state_rows=0):
        assert engine.refresh().ok
    assert not [m for m in messages if "tower built by the driver" in m]
    by_spark = levels()
    assert len(by_spark) == 2 * 4 and all(rows for _, rows in by_spark.values())
    messages.clear()
    report = engine.refresh(rebuild=True)
    assert report.ok
    built = [m for m in messages if "tower built by the driver" in m]
    assert len(built) == 2, messages  # the two towers: day and who
    assert levels() == by_spark
    DeltaTable(path).delete("day = DATE '2020-01-01' OR who = 'é0' OR g IS NULL")
    assert engine.refresh().ok
    assert all(c.equal for c in compare_views(engine)), [
        c.describe() for c in compare_views(engine)
    ]


@pytest.mark.parametrize(
    "by_driver", [pytest.param(True, id="driver"), by_turns(False, id="spark")]
)
def test_buffered_topk_refills_only_a_depleted_group(
    spark, make_project, tmp_path, policy, by_driver
):
    """A TopK keeps its first k + spare rows per group: deleting buffered rows eats the spare
    ones, a group left with fewer than k is refilled from the input (only then), and changes
    ranked below the buffer only count. A TopK over an aggregate keeps its tower.

    The same steps with the small changes refreshed by the driver (``ops.reduce.buffer``: one Spark
    job, collecting the change, where Spark's path takes a dozen or more) and by Spark."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    from engine.oracle import compare_views
    from ops import DIFF

    if not by_driver:
        policy(driver_state_rows=0)

    path = str(tmp_path / "t")
    rows = {"g": ["x"] * 1000 + ["y"] * 3 + [None] * 2, "v": [*range(1000), 7, 8, 9, 1, 2]}
    write_deltalake(path, pa.table(rows), configuration={"delta.enableChangeDataFeed": "true"})
    root = make_project(
        {
            "top3": """
                -- ivm: topk_spare = 2
                CREATE VIEW top3 AS SELECT * FROM (
                  SELECT g, v, ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC) AS rn FROM t
                ) WHERE rn <= 3
            """,
            "best": """
                -- ivm: topk_spare = 2
                CREATE VIEW best AS SELECT g, v FROM t ORDER BY v DESC, g LIMIT 3
            """,
            "sums": "CREATE VIEW sums AS SELECT g, sum(v) AS s FROM t GROUP BY g "
            "ORDER BY s DESC NULLS LAST LIMIT 1",
        },
        {"t": path},
    )
    messages: list[str] = []
    engine = Engine(root, spark=spark, progress=messages.append)
    assert "buffer top 3: first 5 rows (3 + 2 spare)" in engine.explain("top3")
    assert "tower of" in engine.explain("sums")
    assert engine.refresh().ok
    table = DeltaTable(path)

    def refresh() -> list[str]:
        messages.clear()
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        for c in compare_views(engine):
            assert c.equal, c.describe()
        refilled = [m.split(": ", 1)[0] for m in messages if "rows: refilled from the input" in m]
        by_driver_now = {m.split(": ", 1)[0] for m in messages if "refreshed by the driver" in m}
        jobs = {v.view: v.spark_jobs for v in report.views if v.view in ("top3", "best")}
        if by_driver:  # the driver, but where a group is refilled (Spark evaluates the input)
            assert by_driver_now == {"top3", "best"} - set(refilled), messages
            # One job collects the change; the rest are the view's table and log.
            assert all(jobs[v] <= 6 for v in by_driver_now), jobs
        else:
            assert not by_driver_now and min(jobs.values()) >= 20, jobs
        return refilled

    def buffered(view: str) -> dict:
        uri = engine.state_uri(view, "r0.topk.first")
        counts: dict = {}
        for r in DeltaTable(uri).to_pyarrow_table().to_pylist():
            key = (r["g"], r["v"])
            counts[key] = counts.get(key, 0) + r[DIFF]
        return {key: n for key, n in counts.items() if n}

    table.delete("v = 999")  # in both buffers: 4 of 5 rows left, no refill
    assert refresh() == []
    table.delete("g = 'x' AND v IN (998, 997, 3)")  # 2 left in x's buffer: refilled
    refilled = refresh()
    assert sorted(refilled) == ["best", "top3"], messages
    assert sorted(v for (g, v) in buffered("top3") if g == "x") == [992, 993, 994, 995, 996]
    # Below the buffer: counted only; into a whole group (y): taken; above it: taken.
    write_deltalake(path, pa.table({"g": ["x", "y", "x"], "v": [5, 0, 5000]}), mode="append")
    table = DeltaTable(path)
    table.update(predicate="v = 4", updates={"v": "4000"})
    assert refresh() == []
    assert sorted(v for (g, v) in buffered("top3") if g == "x") == [994, 995, 996, 4000, 5000]
    assert sorted(v for (g, v) in buffered("top3") if g == "y") == [0, 7, 8, 9]
    assert len(buffered("best")) == 5
    assert engine.read_view("best").sort_by("v").column("v").to_pylist() == [996, 4000, 5000]
    # A row ranked below a buffer that is not full stays out of it: taken in, it would
    # stand in for the rows ranked between it and the buffer once those above it are gone.
    table.delete("v = 5000")
    write_deltalake(path, pa.table({"g": ["x"], "v": [10]}), mode="append")
    table = DeltaTable(path)
    assert refresh() == []
    table.delete("v IN (4000, 996)")
    assert sorted(refresh()) == ["best", "top3"]
    table.delete("v >= 990")  # a group emptied of its buffer at once
    assert sorted(refresh()) == ["best", "top3"]
    assert sorted(v for (g, v) in buffered("top3") if g == "x") == [985, 986, 987, 988, 989]


def test_state_laid_out_by_another_planner_is_rebuilt(spark, make_project, tmp_path, monkeypatch):
    """A view whose commits record other state tables (here: a TopK built on a tower, as an
    earlier planner did) is rebuilt with that reason instead of reading tables it lacks."""
    import pyarrow as pa
    from deltalake import write_deltalake

    import ivm.plan.reduce
    from engine.oracle import compare_views

    path = str(tmp_path / "t")
    write_deltalake(
        path,
        pa.table({"v": list(range(50))}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    views = {"best": "CREATE VIEW best AS SELECT v FROM t ORDER BY v DESC LIMIT 3"}
    root = make_project(views, {"t": path})
    with monkeypatch.context() as m:
        m.setattr(ivm.plan.reduce, "stateless", lambda node: False)
        old = Engine(root, spark=spark)
        assert "tower of" in old.explain("best")
        assert old.refresh().ok
    write_deltalake(path, pa.table({"v": [100]}), mode="append")
    engine = Engine(root, spark=spark)
    assert "buffer top 3" in engine.explain("best")
    assert "state tables changed" in (engine.rebuild_reason("best") or "")
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert all(c.equal for c in compare_views(engine))
    assert engine.rebuild_reason("best") is None
    assert sorted(engine.read_view("best").column("v").to_pylist()) == [48, 49, 100]


@pytest.mark.parametrize("driver", [pytest.param(True, id="driver"), by_turns(False, id="spark")])
def test_append_only_sources_skip_the_tower(spark, make_project, tmp_path, use_policy, driver):
    """MIN/MAX and TopK over an append-only source keep no tower: the extremes (the first
    rows) are the old ones combined with the insertions (NULLs among them), per group and
    without; by the driver for a small change (ops.reduce.driver._appended_extremes and
    _topk_appended: a limit, an offset, a row number per partition), or by Spark alone; both
    equal to DuckDB after every batch."""
    import pyarrow as pa
    from deltalake import write_deltalake

    if not driver:
        use_policy(ivm.policy.Policy.spark_only())
    path = str(tmp_path / "ticks")
    schema = pa.schema([("sym", pa.string()), ("px", pa.int64()), ("seq", pa.int64())])
    conf = {"delta.appendOnly": "true"}
    write_deltalake(
        path,
        pa.Table.from_pylist(
            [{"sym": "a", "px": 5, "seq": 1}, {"sym": "b", "px": 7, "seq": 2}], schema=schema
        ),
        configuration=conf,
    )
    root = make_project(
        {
            "hi_lo": "CREATE VIEW hi_lo AS SELECT sym, min(px) AS lo, max(seq) AS last FROM ticks "
            "GROUP BY sym",
            "span": "CREATE VIEW span AS SELECT max(px) AS hi, min(sym) AS first_sym, "
            "count(*) AS n FROM ticks",
            "top2": "CREATE VIEW top2 AS SELECT sym, px, seq FROM ticks ORDER BY px DESC, seq "
            "LIMIT 2",
            "next_two": "CREATE VIEW next_two AS SELECT sym, px, seq FROM ticks "
            "ORDER BY px NULLS FIRST, seq DESC LIMIT 2 OFFSET 1",
            "first_per_sym": "CREATE VIEW first_per_sym AS SELECT * FROM (SELECT sym, seq, "
            "row_number() OVER (PARTITION BY sym ORDER BY seq) AS rn FROM ticks) t WHERE rn <= 2",
        },
        {"ticks": path},
    )
    engine = Engine(root, spark=spark)
    assert "monotonic input (append-only): no tower" in engine.explain("hi_lo")
    assert "monotonic input (append-only): no tower" in engine.explain("top2")
    assert engine.refresh().ok
    batches_ = (
        [("a", 3, 3), ("c", 9, 4)],
        [("b", 8, 5), ("a", 4, 6), ("c", 1, 7), ("d", None, 8)],
        [("d", None, 9), ("b", 2, 10), (None, 12, 11)],
    )
    for batch in batches_:
        rows = [{"sym": s, "px": p, "seq": q} for s, p, q in batch]
        write_deltalake(path, pa.Table.from_pylist(rows, schema=schema), mode="append")
        report = engine.refresh()
        assert report.ok
        by = {v.view: v.computed_by for v in report.views}
        assert set(by.values()) == {"driver" if driver else "spark"}, by
        check_all(engine)
    # One per-group table per column, no tower levels.
    state_dir = tmp_path / "project" / "lake" / "state" / "hi_lo"
    state = {p.name for p in state_dir.iterdir() if not p.name.startswith(".")}  # not locks
    assert state == {"r0.min_px.top", "r0.max_seq.top"}, state


def test_groups_empty_and_refill(spark, make_project, tmp_path):
    """Every branch kind over a group that loses all its rows, then gets new ones; and a
    group whose values are all NULL."""
    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    path = str(tmp_path / "t")
    schema = pa.schema([("g", pa.string()), ("v", pa.int64()), ("s", pa.string())])
    rows = [("z", 1, "a"), ("z", 5, "b"), ("z", 5, "b"), ("y", 2, "c"), ("n", None, None)]
    write_deltalake(
        path,
        pa.Table.from_pylist(
            [dict(zip(("g", "v", "s"), r, strict=True)) for r in rows], schema=schema
        ),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    root = make_project(
        {
            "every_kind": """
                -- ivm: expected_group_size = 20
                CREATE VIEW every_kind AS
                SELECT g, count(*) AS n, count(v) AS nv, sum(v) AS sv, avg(v) AS av,
                       min(v) AS lo, max(s) AS hi, count(DISTINCT v) AS dv,
                       string_agg(s, '/') WITHIN GROUP (ORDER BY s) AS ss
                FROM t GROUP BY g
            """,
            "top_per_g": """
                CREATE VIEW top_per_g AS SELECT g, v, s FROM t
                QUALIFY ROW_NUMBER() OVER (PARTITION BY g ORDER BY v DESC, s) <= 2
            """,
            "overall": "CREATE VIEW overall AS SELECT count(*) AS n, min(v) AS lo, "
            "count(DISTINCT g) AS groups FROM t",
        },
        {"t": path},
    )
    engine = Engine(root, spark=spark)
    assert engine.refresh().ok
    check_all(engine)
    DeltaTable(path).delete("g = 'z'")  # z empties
    assert engine.refresh().ok
    check_all(engine)
    assert "z" not in engine.read_view("every_kind").column("g").to_pylist()
    DeltaTable(path).delete("true")  # everything empties: the global row stays
    assert engine.refresh().ok
    check_all(engine)
    assert engine.read_view("overall").to_pylist() == [{"n": 0, "lo": None, "groups": 0}]
    refill = [("z", 7, "q"), ("z", None, None), ("n", None, None)]
    write_deltalake(
        path,
        pa.Table.from_pylist(
            [dict(zip(("g", "v", "s"), r, strict=True)) for r in refill], schema=schema
        ),
        mode="append",
    )
    assert engine.refresh().ok
    check_all(engine)


def test_a_reduction_keeps_a_copy_of_its_input_only_when_it_is_costly_to_read_again(
    spark, tmp_path
) -> None:
    """A reduction's input is read by each branch: files read (filtered and mapped) are read
    again; anything computed (a join, an aggregate) or sent from the driver is kept once."""
    import pyarrow as pa
    from pyspark.sql import functions as F

    from ops.reduce.spark import scan_only

    path = str(tmp_path / "t")
    spark.range(10).withColumn("g", F.col("id") % 3).write.parquet(path)
    files = spark.read.parquet(path)
    assert scan_only(files.where("id > 2").select("g", (F.col("id") * 2).alias("v")))
    assert scan_only(files.unionByName(files.where("g = 1")))
    assert not scan_only(spark.createDataFrame(pa.table({"id": [1], "g": [2]})))
    assert not scan_only(files.groupBy("g").count())
    assert not scan_only(files.join(files.select("g"), "g"))


@pytest.mark.parametrize(
    "column_type",
    ["decimal(15,2)", "decimal(20,10)", "decimal(30,12)", "decimal(38,18)", "bigint", "double"],
)
def test_a_sum_weighs_values_by_diff_exactly(spark, column_type):
    """A sum's contribution ``x * _diff`` is exact, in the sum's type, where Spark's own
    product rounds ``decimal(38, s)`` to 6 decimals; only a diff with more digits than the
    value's precision leaves room for (a row repeated millions of times at once) gets
    Spark's product. Where Spark's product was exact the type is the product's, so state
    written before keeps its type."""
    from decimal import Decimal, localcontext

    from pyspark.sql import functions as F

    from ops.reduce.accumulable import sum_type
    from ops.reduce.spark import _times_diff

    values = ("1.1234567891", "-7.25", "0", None)
    diffs = (1, -1, 2, -3, 0, 1234567, -98765432109)
    df = spark.createDataFrame(
        [(v, d) for v in values for d in diffs], "v string, _diff bigint"
    ).select(F.col("v").cast("decimal(20,10)").cast(column_type).alias("x"), "_diff")
    dt = df.schema["x"].dataType
    st = sum_type(dt, "SUM")
    product = F.col("x").cast(st) * F.col("_diff")
    out = df.select("x", "_diff", product.alias("spark"), _times_diff(F.col("x"), dt, st))
    weighed = out.schema[3].dataType
    decimal = dt.typeName() == "decimal"
    assert weighed == (st if decimal else out.schema["spark"].dataType)
    if not decimal or dt.scale <= 6:
        assert weighed == out.schema["spark"].dataType
    rows = out.collect()
    assert len(rows) == len(values) * len(diffs)
    with localcontext() as context:
        context.prec = 80  # Python's decimals: room for 38 digits times 19
        for r in rows:
            exact = None if r.x is None else r.x * r._diff
            room = 37 - dt.precision if decimal else 19
            if decimal and abs(r._diff) > 1 and len(str(abs(r._diff))) > room:
                exact = None if r.spark is None else r.spark  # Spark's product, in the sum's type
            if isinstance(exact, Decimal):
                exact = exact.quantize(Decimal(1).scaleb(-st.scale))
            assert r[3] == exact, (r.x, r._diff, r[3], exact)


def test_sums_of_decimals_with_many_decimal_places_are_exact(spark, make_project, tmp_path):
    """SUM and AVG over ``decimal(20, 10)`` equal DuckDB's exactly, built and refreshed, also
    over a view whose log sums a row inserted twice in one batch into a diff of 2 (Spark's
    own ``decimal(38, 10) * bigint`` rounds to 6 decimals)."""
    from decimal import Decimal

    import pyarrow as pa
    from deltalake import DeltaTable, write_deltalake

    def rows(*pairs: tuple[str, str]) -> pa.Table:
        return pa.table(
            {
                "g": [g for g, _ in pairs],
                "x": pa.array([Decimal(x) for _, x in pairs], pa.decimal128(20, 10)),
            }
        )

    path = str(tmp_path / "t")
    write_deltalake(
        path,
        rows(("a", "1.1234567891"), ("a", "2.0000000001"), ("b", "-0.0000000004")),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    views = {
        "s": "CREATE VIEW s AS SELECT g, sum(x) AS sx, avg(x) AS ax FROM t GROUP BY g",
        "u": "CREATE VIEW u AS SELECT g, x FROM t",
        "su": "CREATE VIEW su AS SELECT g, sum(x) AS sx, avg(x) AS ax FROM u GROUP BY g",
    }
    engine = Engine(make_project(views, {"t": path}), spark=spark)
    assert engine.refresh().ok
    check_all(engine)
    sums = {r["g"]: r["sx"] for r in engine.read_view("s").to_pylist()}
    assert sums == {"a": Decimal("3.1234567892"), "b": Decimal("-0.0000000004")}
    write_deltalake(path, rows(("b", "0.0000000007"), ("b", "0.0000000007")), mode="append")
    DeltaTable(path).delete("x = 2.0000000001")
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    check_all(engine)
    sums = {r["g"]: r["sx"] for r in engine.read_view("su").to_pylist()}
    assert sums == {"a": Decimal("1.1234567891"), "b": Decimal("0.0000000010")}


def test_sums_kept_in_an_older_format_are_rebuilt(spark, make_project, tmp_path, monkeypatch):
    """State whose sums an earlier engine kept another way (format 1 rounded decimals beyond
    6 places) is rebuilt, not continued; state without sums is continued as it is."""
    import pyarrow as pa
    from deltalake import write_deltalake

    import ivm.plan.reduce

    path = str(tmp_path / "t")
    write_deltalake(
        path,
        pa.table({"g": ["a", "b", "a"], "v": [1, 2, 3]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    views = {
        "sums": "CREATE VIEW sums AS SELECT g, sum(v) AS s, count(*) AS n FROM t GROUP BY g",
        "counts": "CREATE VIEW counts AS SELECT g, count(*) AS n FROM t GROUP BY g",
    }
    root = make_project(views, {"t": path})
    with monkeypatch.context() as m:
        m.setattr(ivm.plan.reduce, "_sums_format", lambda aggregates: 1)
        assert Engine(root, spark=spark).refresh().ok
    write_deltalake(path, pa.table({"g": ["b"], "v": [5]}), mode="append")
    engine = Engine(root, spark=spark)
    assert "state tables changed" in (engine.rebuild_reason("sums") or "")
    assert engine.rebuild_reason("counts") is None
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert {v.view: v.status for v in report.views} == {"sums": "rebuilt", "counts": "refreshed"}
    check_all(engine)
    assert engine.rebuild_reason("sums") is None


def test_towers_bucketed_by_another_hash_are_rebuilt(spark, make_project, tmp_path, monkeypatch):
    """A tower's buckets come from a hash function (Spark's xxhash64, reproduced on the
    driver); state bucketed by another one would leave towers silently stale, so the hash is
    part of the state layout and a change of it rebuilds the view."""
    import pyarrow as pa
    from deltalake import write_deltalake

    import ivm.plan.reduce

    path = str(tmp_path / "t")
    write_deltalake(
        path,
        pa.table({"g": ["a", "b", "a"], "v": [1, 2, 3]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    views = {"lo": "CREATE VIEW lo AS SELECT g, min(v) AS m FROM t GROUP BY g"}
    root = make_project(views, {"t": path})
    with monkeypatch.context() as m:
        m.setattr(ivm.plan.reduce, "BUCKET_HASH", "murmur3(seed 42)")
        assert Engine(root, spark=spark).refresh().ok
    write_deltalake(path, pa.table({"g": ["b"], "v": [0]}), mode="append")
    engine = Engine(root, spark=spark)
    assert "state tables changed" in (engine.rebuild_reason("lo") or "")
    report = engine.refresh()
    assert report.ok, [v.error for v in report.views]
    assert [v.status for v in report.views] == ["rebuilt"]
    check_all(engine)
    assert engine.rebuild_reason("lo") is None


AVERAGED_DECIMALS = [(38, 18), (38, 6), (25, 3), (23, 2), (20, 10), (15, 2), (12, 1), (10, 0)]
"""Decimal shapes whose AVG Spark's path divides in SQL (p <= 24, s >= 2) and in its Python
workers (the others), each once rounded twice before (a DECIMAL(38, 18)'s last 4 digits)."""


def test_avg_of_a_decimal_is_sparks_on_both_renderers(spark):
    """AVG (and SUM) of decimals from an accumulable branch's summed state, by Spark's renderer
    (a decimal division of the sum by the count, or ``ops.reduce.accumulable.decimal_averages`` in
    Spark's Python workers) and by the driver's, equal Spark's own aggregates over the same rows:
    the quotient truncated to 39 places, then rounded half up to the result's scale."""
    import random
    from decimal import Decimal

    import pyarrow as pa
    from pyspark.sql import functions as F
    from pyspark.sql.pandas.types import from_arrow_schema

    from ivm.plan.ir import Aggregate
    from ops.reduce.driver import _Accumulable
    from ops.reduce.spark import _accumulator, _group_sums, _results

    rng = random.Random(11)
    aggregates = [Aggregate("a", "avg", "x"), Aggregate("s", "sum", "x")]
    in_workers = set()
    for p, s in AVERAGED_DECIMALS:
        bound = 10 ** (min(p - s, 6) + s)
        drawn = [
            (g, None if rng.random() < 0.05 else rng.randrange(-bound, bound))
            for g in range(60)
            for _ in range(rng.choice([1, 2, 3, 7, 11, 101]))
        ]
        rows = [
            {"g": g, "x": None if x is None else Decimal(x).scaleb(-s), "_diff": 1}
            for g, x in drawn
        ]
        schema = pa.schema([("g", pa.int32()), ("x", pa.decimal128(p, s)), ("_diff", pa.int64())])
        table = pa.Table.from_pylist(rows, schema)
        df = spark.createDataFrame(table)
        spark_aggregates = df.groupBy("g").agg(F.avg("x").alias("a"), F.sum("x").alias("s"))
        theirs = {r.g: (r.a, r.s) for r in spark_aggregates.collect()}
        acc = _accumulator(aggregates, df.schema)
        if acc.averages:
            in_workers.add((p, s))
        state = _group_sums(acc, df, ["g"])
        by_spark = {r.g: (r.a, r.s) for r in _results(acc, ["g"], state).collect()}
        assert by_spark == theirs, (p, s)
        types = {f.name: f.dataType for f in from_arrow_schema(schema).fields}
        driver = _Accumulable(aggregates, types)
        by_driver = {g: tuple(driver.results(v)) for (g,), v in driver.sums(table, ["g"]).items()}
        assert by_driver == theirs, (p, s)
    assert in_workers == {(38, 18), (38, 6), (25, 3), (12, 1), (10, 0)}


@pytest.mark.parametrize(
    "spark_only", [pytest.param(False, id="driver"), by_turns(True, id="spark")]
)
def test_avg_of_a_wide_decimal_keeps_its_digits_after_a_change(
    spark, make_project, tmp_path, spark_only
):
    """The fuzzer's case: AVG of a DECIMAL(38, 18) after an insert equals Spark's from-scratch
    AVG to its 22nd decimal (incrementally it lost the last 4: ...7407407400000), grouped and
    global, computed by the driver and by Spark alone."""
    from decimal import Decimal

    import pyarrow as pa
    from deltalake import write_deltalake

    from engine.oracle import spark_compare_views

    schema = pa.schema([("g", pa.string()), ("x", pa.decimal128(38, 18))])
    values = ["123456789012.123456789012345678", "987654321098.987654321098765432"]
    path = str(tmp_path / "t")
    write_deltalake(
        path,
        pa.Table.from_pylist([{"g": "a", "x": Decimal(v)} for v in values], schema),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    views = {
        "grouped": "CREATE VIEW grouped AS SELECT g, avg(x) AS a, sum(x) AS s FROM t GROUP BY g",
        "overall": "CREATE VIEW overall AS SELECT avg(x) AS a FROM t",
    }
    policy = ivm.policy.Policy.spark_only() if spark_only else ivm.policy.current()
    with ivm.policy.using(policy):
        engine = Engine(make_project(views, {"t": path}), spark=spark)
        assert engine.refresh().ok
        added = [{"g": "a", "x": Decimal("111111111111.111111111111111111")}]
        write_deltalake(path, pa.Table.from_pylist(added, schema), mode="append")
        report = engine.refresh()
        assert report.ok, [v.error for v in report.views]
        computed = {v.view: v.computed_by for v in report.views}
        assert computed["grouped"] == ("spark" if spark_only else "driver"), computed
        for c in spark_compare_views(engine):
            assert c.equal, c.describe()
    mean = Decimal("407407407074.0740740737407407403333")
    assert engine.read_view("grouped").column("a").to_pylist() == [mean]
    assert engine.read_view("overall").column("a").to_pylist() == [mean]
