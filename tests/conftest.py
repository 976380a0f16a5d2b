"""Shared fixtures: one local Spark session per test run, and throw-away projects on disk.

Tests that need Spark take the ``spark`` fixture (marked ``spark``); everything else runs
without a JVM.
"""

from __future__ import annotations

import os
import subprocess
import textwrap
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path

import pytest

from ivm import policy
from ivm.policy import Policy
from resources.spark import free_port

os.environ.setdefault("PYSPARK_PYTHON", os.sys.executable)

TEST_SPARK_CONF = {
    "spark.master": "local[2]",
    "spark.sql.shuffle.partitions": "2",
    "spark.default.parallelism": "2",
    "spark.ui.enabled": "false",
    "spark.driver.memory": "2g",
}


LONGEST_FIRST = (
    "test_reduce.py",
    "test_tpch.py",
    "test_faults.py",
    "test_delta_sources.py",
    "test_subquery_limits.py",
    "test_fuzz.py",
    "test_domains.py",
    "test_subqueries.py",
    "test_outer_joins.py",
    "test_catalog.py",
    "test_interop.py",
    "test_arrange.py",
    "test_compact.py",
    "test_lifecycle.py",
    "test_fuzz_regressions.py",
    "test_constants.py",
    "test_constant_joins.py",
    "test_dagster.py",
    "test_verify.py",
    "test_oracle.py",
    "test_exact_floats.py",
    "test_cluster.py",
    "test_sink.py",
)
"""The test files that take longest (``--durations`` of a whole run), longest first: the
workers (``./dev test``: a file at a time, in this order, ``--no-loadscope-reorder``) start
them first and fill in with the short ones, rather than finding the long ones last, one
worker busy while the other has nothing left. (xdist's own order, most tests first, left the
oracle tests of few test functions each for the end.)"""


SLOW_SHARDS = 12
"""A whole-suite run (``./dev test``, what CI runs) takes one in this many of the tests marked
``slow`` (the longest oracle runs, the second path of tests run over two: ``tests.marks``'s
``by_turns``, and the deployment checks), by turns: see :func:`slow_shard`."""

SLOW_SECONDS = {
    "test_tpch.py::test_accepted_queries_stay_equal_to_the_oracles[part 1 of 3]": 290,
    "test_tpch.py::test_accepted_queries_stay_equal_to_the_oracles[part 2 of 3]": 290,
    "test_tpch.py::test_accepted_queries_stay_equal_to_the_oracles[part 3 of 3]": 290,
    "test_domains.py::test_domain_views_match_both_oracles": 320,
    "test_reduce.py::test_reductions_match_duckdb[by Spark]": 260,
    "test_subquery_limits.py::test_subquery_limits_match_both_oracles": 230,
    "test_catalog.py::test_views_are_registered_and_read_by_name_from_another_session": 180,
    "test_subqueries.py::test_subquery_views_match_both_oracles[part 1 of 2]": 150,
    "test_subqueries.py::test_subquery_views_match_both_oracles[part 2 of 2]": 150,
    "test_outer_joins.py::test_outer_joins_of_more_inputs_match_both_oracles": 150,
    "test_cluster.py::test_refreshes_on_a_standalone_cluster_match_duckdb": 130,
    "test_delta_sources.py::test_views_over_deletion_vectors_and_column_mapping_stay_exact"
    "[by Spark]": 110,
    "test_classes.py::test_a_recorded_archive_is_complete_and_the_next_jvm_loads_classes_from_it": 95,
}
"""Seconds a ``slow`` test took in a whole run (``--durations``, rounded), for those over a
minute and a half: :func:`slow_shards` deals the tests out by them, so that each shard takes
about the same time (a test not named here counts :data:`SLOW_DEFAULT_SECONDS`)."""

SLOW_DEFAULT_SECONDS = 60

SLOW_ENV = "IVM_TEST_SLOW"
"""``all``: every ``slow`` test; ``none``: none; a number: that shard of them; unset: the
shard of the commit checked out."""


def slow_shard(config: pytest.Config) -> int | None:
    """Which shard of the ``slow`` tests this run takes (:func:`slow_shards`), None for all
    of them, -1 for none.

    All of them when the run names files or tests, or a ``-m`` expression: only a whole-suite
    run is bounded. Otherwise ``$IVM_TEST_SLOW``, else the checked-out commit's hash modulo
    :data:`SLOW_SHARDS`: a rerun of a commit runs the same tests (every xdist worker agrees),
    and successive commits take the shards in turn."""
    value = os.environ.get(SLOW_ENV, "").strip().lower()
    if value == "all" or config.option.markexpr:
        return None
    if value == "none":
        return -1
    if value:
        if not value.isdigit():
            raise pytest.UsageError(f"{SLOW_ENV}={value!r}: all, none or a shard number")
        return int(value) % SLOW_SHARDS
    if any(not Path(a.split("::")[0]).is_dir() for a in config.args):
        return None
    head = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=config.rootpath, capture_output=True, text=True
    )
    return int(head.stdout.strip() or "0", 16) % SLOW_SHARDS if head.returncode == 0 else 0


def slow_shards(nodeids: list[str]) -> dict[str, int]:
    """Each ``slow`` test's shard: the longest first (:data:`SLOW_SECONDS`), each to the
    shard with the fewest seconds so far (the lowest of equals), so the shards take about the
    same time and every xdist worker, given the same tests, deals them alike."""

    def seconds(nodeid: str) -> float:
        return SLOW_SECONDS.get(nodeid.split("/")[-1], SLOW_DEFAULT_SECONDS)

    totals = [0.0] * SLOW_SHARDS
    out: dict[str, int] = {}
    for nodeid in sorted(nodeids, key=lambda n: (-seconds(n), n)):
        shard = totals.index(min(totals))
        totals[shard] += seconds(nodeid)
        out[nodeid] = shard
    return out


def pytest_report_header(config: pytest.Config) -> str:
    shard = slow_shard(config)
    if shard is None:
        return "slow tests: all"
    taken = "none" if shard < 0 else f"shard {shard} of {SLOW_SHARDS}"
    return f"slow tests: {taken} (by the commit, or ${SLOW_ENV}); {SLOW_ENV}=all runs them all"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Longest files first (:data:`LONGEST_FIRST`); the rest keep their order. Of the tests
    marked ``slow``, those outside this run's shard (:func:`slow_shard`) are deselected."""
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))
    shard = slow_shard(config)
    if shard is None:
        return
    dealt = slow_shards([item.nodeid for item in items if item.get_closest_marker("slow")])
    skipped = {nodeid for nodeid, mine in dealt.items() if mine != shard}
    if skipped:
        config.hook.pytest_deselected(items=[i for i in items if i.nodeid in skipped])
        items[:] = [i for i in items if i.nodeid not in skipped]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-goldens",
        action="store_true",
        help="rewrite the expected EXPLAIN/error goldens from the current planner",
    )
    fuzz = parser.getgroup("fuzz", "differential fuzzer (tests/test_fuzz.py)")
    fuzz.addoption(
        "--fuzz-seed",
        default=None,
        help="run the fuzzer on this seed (or 'random'); with --fuzz-cases N, N seeds from it",
    )
    fuzz.addoption(
        "--fuzz-cases",
        default=None,
        help="number of fuzz cases (implies the long run's grammar and sizes)",
    )
    fuzz.addoption(
        "--fuzz-long",
        action="store_true",
        help="the long fuzz run: many seeds, every grammar feature, larger cases",
    )


@pytest.fixture(scope="session")
def update_goldens(request: pytest.FixtureRequest) -> bool:
    return bool(request.config.getoption("--update-goldens"))


CONNECT_PORT = free_port()
"""The shared session also serves Spark Connect here (as ``ivm spark-server`` does), so tests
can run the engine in a fresh process that computes on it (see ``spark_connect_url``)."""


@pytest.fixture(scope="session")
def spark():
    from resources.spark import serve

    session = serve(TEST_SPARK_CONF, port=CONNECT_PORT)
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_connect_url(spark) -> str:
    """The shared session's Spark Connect address."""
    return f"sc://localhost:{CONNECT_PORT}"


ProjectFactory = Callable[..., Path]


@pytest.fixture
def make_project(tmp_path: Path) -> ProjectFactory:
    """Write an ``ivm.toml`` and view files under a temp dir; returns the project dir."""

    def make(views: Mapping[str, str], sources: Mapping[str, str], extra: str = "") -> Path:
        root = tmp_path / "project"
        (root / "views").mkdir(parents=True, exist_ok=True)
        lines = ['lake = "lake"', 'views = "views"', extra, "[sources]"]
        lines += [f'{k} = "{v}"' for k, v in sources.items()]
        (root / "ivm.toml").write_text("\n".join(lines) + "\n")
        for name, sql in views.items():
            (root / "views" / f"{name}.sql").write_text(textwrap.dedent(sql).strip() + "\n")
        return root

    return make


@pytest.fixture(autouse=True)
def _policy_per_test() -> Iterator[None]:
    """Each test starts with the policy in force before it: an engine installs its project's
    ``[policy]`` for the whole process, which must not reach the tests after it."""
    before = policy.current()
    yield
    policy.install(before)


@pytest.fixture
def use_policy() -> Iterator[Callable[..., Policy]]:
    """``use_policy(p=None, **changes)`` puts ``p`` (default: the current policy) with
    ``changes`` in force for the rest of the test; the previous policy is restored after."""
    before = policy.current()

    def use(chosen: Policy | None = None, **changes: object) -> Policy:
        policy.install((chosen or policy.current()).replace(**changes))
        return policy.current()

    yield use
    policy.install(before)
