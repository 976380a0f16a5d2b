"""On a cluster: refreshes computed by a standalone Spark cluster, every view checked with DuckDB.

The fixture starts a standalone master and one worker (1 core, 1 GiB) from PySpark's own
scripts (``bin/spark-class``), each a JVM of its own; executors are the worker's child
processes. A project names the master in its ``[spark]`` table and puts every step on Spark
(``[policy] driver = false``); a driver process of its own (:mod:`tests.cluster_driver`: the
test's process holds the suite's local SparkContext) builds its views, then refreshes them
after change batches (inserts, deletes and updates by delta-rs, change data feed on; one, or
up to two with ``IVM_TEST_BATCHES``),
comparing every view and diff log with DuckDB after each refresh.

The executors' Python is this interpreter without its ``.pth`` files (``python -S``, the
installed packages on ``PYTHONPATH``): the project is installed editable here, and a cluster's
nodes have PySpark and pyarrow but not the project. So the Python functions the engine runs in
Spark's workers (exact float sums and decimal averages, by ``mapInArrow``) must reach them
pickled by value; the driver's probe asserts the project's packages cannot be imported there.
The project sets that Python with ``spark.pyspark.python``, which must win over the test
process's ``PYSPARK_PYTHON`` (the driver process inherits it).

It also asserts the work ran on the cluster: the session's master, the application on the
master with its core, the executor on the worker, and Python workers started by an executor
JVM. Needs Java (marked ``spark``), not the shared session.
"""

from __future__ import annotations

import json
import os
import random
import signal
import site
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyspark
import pytest
from deltalake import DeltaTable, write_deltalake

from resources.spark import free_port
from tests.lakegen import batches

pytestmark = [pytest.mark.slow, pytest.mark.spark]

REPO = Path(__file__).resolve().parent.parent
SPARK_HOME = Path(pyspark.__file__).resolve().parent
DRIVER = Path(__file__).resolve().parent / "cluster_driver.py"
STEP_TIMEOUT = 300.0

# -- the cluster -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Cluster:
    """A running standalone master and worker."""

    url: str
    master_ui: str
    worker_ui: str
    home: Path

    def master_state(self) -> dict[str, Any]:
        return _get_json(self.master_ui)

    def worker_state(self) -> dict[str, Any]:
        return _get_json(self.worker_ui)


def _get_json(ui: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{ui}/json/", timeout=5) as response:
        return json.load(response)


def _cluster_env(home: Path) -> dict[str, str]:
    """The daemons' environment: PySpark's installation as SPARK_HOME, the loopback address,
    and nothing that would put this repository or this Python on the executors' path (an
    executor inherits its worker's environment)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "PYSPARK_PYTHON", "SPARK_REMOTE", "SPARK_CONF_DIR")
    }
    env.update(
        SPARK_HOME=str(SPARK_HOME),
        SPARK_LOCAL_IP="127.0.0.1",
        SPARK_LOCAL_DIRS=str(home / "local"),
        SPARK_DAEMON_MEMORY="512m",
    )
    return env


def _start(args: list[str], env: dict[str, str], log: Path) -> subprocess.Popen:
    """A daemon in a process group of its own (its executors join it), logging to ``log``."""
    with open(log, "wb") as out:
        return subprocess.Popen(
            [str(SPARK_HOME / "bin" / "spark-class"), *args],
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )


def _stop(proc: subprocess.Popen) -> None:
    """End a daemon's process group: TERM (the worker then kills its executors), KILL after
    20 s."""
    for sig, wait in ((signal.SIGTERM, 20.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break  # the group is gone
        try:
            proc.wait(wait)
            break
        except subprocess.TimeoutExpired:
            continue


def _wait_for_worker(cluster: Cluster, procs: list[subprocess.Popen], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for p in procs:
            if p.poll() is not None:
                pytest.fail(f"{p.args[1]} exited ({p.returncode}); logs in {cluster.home}")
        try:
            if cluster.master_state().get("aliveworkers", 0) >= 1:
                return
        except (urllib.error.URLError, ConnectionError, json.JSONDecodeError):
            pass  # the master's UI is not up yet
        time.sleep(0.5)
    pytest.fail(
        f"no worker registered with {cluster.url} within {timeout} s; logs in {cluster.home}"
    )


@pytest.fixture(scope="module")
def standalone_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """A standalone master and one worker (1 core, 1 GiB) on 127.0.0.1, stopped at the end."""
    home = tmp_path_factory.mktemp("cluster")
    port, master_ui, worker_ui = free_port(), free_port(), free_port()
    env = _cluster_env(home)
    cluster = Cluster(
        f"spark://127.0.0.1:{port}",
        f"http://127.0.0.1:{master_ui}",
        f"http://127.0.0.1:{worker_ui}",
        home,
    )
    master = ["org.apache.spark.deploy.master.Master", "--host", "127.0.0.1"]
    master += ["--port", str(port), "--webui-port", str(master_ui)]
    worker = ["org.apache.spark.deploy.worker.Worker", cluster.url, "--cores", "1"]
    worker += ["--memory", "1g", "--webui-port", str(worker_ui), "--work-dir", str(home / "work")]
    procs: list[subprocess.Popen] = []
    try:
        procs.append(_start(master, env, home / "master.log"))
        procs.append(_start(worker, env, home / "worker.log"))
        _wait_for_worker(cluster, procs, timeout=120)
        yield cluster
    finally:
        for p in reversed(procs):
            _stop(p)


def executor_python(folder: Path) -> tuple[Path, Path]:
    """A Python for the executors: this interpreter with its installed packages (pyarrow,
    PySpark) on ``PYTHONPATH`` and no ``site`` (so no ``.pth`` file, and no editable install
    of the project). It logs each start, and whether an executor JVM started it, to the
    second path returned."""
    script, log = folder / "executor-python", folder / "executor-python.log"
    packages = os.pathsep.join(site.getsitepackages())
    script.write_text(
        "#!/bin/sh\n"
        'case "$(tr "\\0" " " < /proc/$PPID/cmdline 2>/dev/null)" in\n'
        f'  *CoarseGrainedExecutorBackend*) echo "executor $*" >> {log} ;;\n'
        f'  *) echo "other $*" >> {log} ;;\n'
        "esac\n"
        f'PYTHONPATH="${{PYTHONPATH:+$PYTHONPATH:}}{packages}" exec {sys.executable} -S "$@"\n'
    )
    script.chmod(0o755)
    return script, log


# -- the project -----------------------------------------------------------------------------

ORDERS = pa.schema(
    [
        ("id", pa.int64()),
        ("cust", pa.int32()),
        ("grp", pa.string()),
        ("amount", pa.decimal128(10, 1)),  # AVG in Python workers: no exact SQL division
        ("weight", pa.float64()),  # SUM and AVG kept exact in Python workers
    ]
)
CUSTOMERS = pa.schema(
    [("cust", pa.int32()), ("region", pa.string()), ("credit", pa.decimal128(12, 2))]
)

VIEWS = {
    "by_grp": """
        CREATE VIEW by_grp AS
        SELECT grp, count(*) AS n, sum(amount) AS amount, avg(amount) AS avg_amount,
               sum(weight) AS weight, avg(weight) AS avg_weight, min(weight) AS lightest,
               max(amount) AS largest, count(DISTINCT cust) AS custs
        FROM orders GROUP BY grp
    """,
    "by_region": """
        CREATE VIEW by_region AS
        SELECT c.region, count(*) AS n, sum(o.amount) AS amount, avg(c.credit) AS avg_credit,
               sum(o.weight) AS weight, max(o.weight) AS heaviest, min(o.amount) AS smallest,
               count(DISTINCT o.grp) AS grps
        FROM orders o JOIN customers c ON o.cust = c.cust
        GROUP BY c.region
    """,
    "big_regions": """
        CREATE VIEW big_regions AS
        SELECT region, amount, heaviest FROM by_region WHERE n >= 3
    """,
}


class Lake:
    """Two CDF sources written by delta-rs; each batch inserts, deletes and updates."""

    def __init__(self, root: Path, seed: int) -> None:
        self.rng = random.Random(seed)
        self.orders, self.customers = str(root / "orders"), str(root / "customers")
        self.next_id = 0

    def _orders(self, n: int) -> pa.Table:
        r, rows = self.rng, []
        for _ in range(n):
            rows.append(
                {
                    "id": self.next_id,
                    "cust": r.randint(0, 6),
                    "grp": f"g{r.randint(0, 3)}",
                    "amount": Decimal(r.randint(-500, 9999)) / 10 if r.random() > 0.1 else None,
                    "weight": round(r.uniform(-50, 200), 3) if r.random() > 0.1 else None,
                }
            )
            self.next_id += 1
        return pa.Table.from_pylist(rows, schema=ORDERS)

    def create(self) -> dict[str, str]:
        cdf = {"delta.enableChangeDataFeed": "true"}
        write_deltalake(self.orders, self._orders(30), configuration=cdf)
        customers = [
            {"cust": c, "region": f"r{c % 3}", "credit": Decimal(c * 1234 + 5) / 100}
            for c in range(6)
        ]
        write_deltalake(
            self.customers, pa.Table.from_pylist(customers, schema=CUSTOMERS), configuration=cdf
        )
        return {"orders": self.orders, "customers": self.customers}

    def batch(self, number: int) -> None:
        """Batch 1: inserts, deletes of orders, a customer moved and one added; batch 2:
        inserts, updates and deletes of orders, a customer deleted."""
        write_deltalake(self.orders, self._orders(8), mode="append")
        orders, customers = DeltaTable(self.orders), DeltaTable(self.customers)
        if number == 1:
            orders.delete("id % 5 = 0")
            customers.update(updates={"region": "'west'"}, predicate="cust = 2")
            extra = [{"cust": 6, "region": "west", "credit": Decimal("17.25")}]
            write_deltalake(
                self.customers, pa.Table.from_pylist(extra, schema=CUSTOMERS), mode="append"
            )
        else:
            orders.update(updates={"grp": "'g1'", "weight": "weight * 2"}, predicate="id % 3 = 1")
            orders.delete("id % 7 = 2")
            customers.delete("cust = 3")


def cluster_project(make_project: Any, lake: Lake, cluster: Cluster, python: Path) -> Path:
    """The project: its ``[spark]`` names the cluster, small executors, the executors' Python;
    ``[policy] driver = false`` puts every step on Spark."""
    spark = {
        "spark.master": cluster.url,
        "spark.app.name": "ivm-cluster-test",
        "spark.driver.memory": "1g",
        "spark.executor.memory": "1g",
        "spark.executor.cores": "1",
        "spark.cores.max": "1",
        "spark.sql.shuffle.partitions": "2",
        "spark.default.parallelism": "2",
        "spark.pyspark.python": str(python),
    }
    lines = ["[spark]", *(f'"{k}" = "{v}"' for k, v in spark.items()), "[policy]", "driver = false"]
    return make_project(VIEWS, lake.create(), extra="\n".join(lines))


# -- the driver process ----------------------------------------------------------------------


class Driver:
    """:mod:`tests.cluster_driver` in a process of its own: PySpark's ``PYSPARK_PYTHON`` as
    this test process has it (the project's ``spark.pyspark.python`` must win), the
    repository on the driver's path only."""

    def __init__(self, project: Path, out: Path, steps: int) -> None:
        self.out = out
        env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
        env.pop("SPARK_REMOTE", None)
        self.log = out / "driver.log"
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, str(DRIVER), str(project), str(out), str(steps)],
                cwd=out,
                env=env,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
            )

    def result(self, step: int) -> dict[str, Any]:
        """Step ``step``'s report, once written; fails if the driver exits first."""
        path = self.out / f"step-{step}.json"
        deadline = time.monotonic() + STEP_TIMEOUT
        while not path.exists():
            if self.proc.poll() is not None:
                pytest.fail(f"the driver exited ({self.proc.returncode}):\n{self._tail()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no step {step} within {STEP_TIMEOUT} s:\n{self._tail()}")
            time.sleep(0.2)
        return json.loads(path.read_text())

    def next(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"next\n")
        self.proc.stdin.flush()

    def finish(self) -> int:
        """Close its input (it stops its session and exits); its exit code."""
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def _tail(self, lines: int = 40) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])


def check_step(result: dict[str, Any], cluster: Cluster, statuses: set[str]) -> None:
    """Every view refreshed by Spark on ``cluster`` and equal to DuckDB, its log too."""
    assert result["master"] == cluster.url
    views = {v["view"]: v for v in result["views"]}
    assert set(views) == set(VIEWS), views
    for v in views.values():
        assert v["status"] in statuses and not v["error"], v
        assert v["computed_by"] in ("spark", "nothing"), v  # [policy] driver = false
    assert {c["view"] for c in result["comparisons"]} == set(VIEWS)
    unequal = [c["describe"] for c in result["comparisons"] if not c["equal"]]
    assert not unequal, unequal


def test_refreshes_on_a_standalone_cluster_match_duckdb(
    standalone_cluster: Cluster, make_project: Any, tmp_path: Path
) -> None:
    cluster = standalone_cluster
    python, python_log = executor_python(tmp_path)
    lake = Lake(tmp_path / "data", seed=44)
    project = cluster_project(make_project, lake, cluster, python)
    out = tmp_path / "driver"
    out.mkdir()
    refreshes = batches(2, bound=1)
    driver = Driver(project, out, steps=refreshes + 1)
    try:
        first = driver.result(0)
        check_step(first, cluster, {"built"})
        # The executors' Python: the project's, without the project's packages.
        assert [(p["no_site"], p["importable"]) for p in first["probe"]] == [(True, [])]
        for batch in range(1, refreshes + 1):
            lake.batch(batch)
            driver.next()
            result = driver.result(batch)
            check_step(result, cluster, {"refreshed", "up-to-date"})
            assert result["app_id"] == first["app_id"]
            assert any(v["status"] == "refreshed" for v in result["views"]), result["views"]
    finally:
        code = driver.finish()
    assert code == 0, driver._tail()
    # The work ran on the cluster: the application had its core on the master, its executor
    # ran on the worker, and Python workers were started by an executor JVM.
    apps = {a["id"]: a for a in cluster.master_state()["completedapps"]}
    assert apps[first["app_id"]]["cores"] >= 1, apps
    assert apps[first["app_id"]]["name"] == "ivm-cluster-test"
    worker = cluster.worker_state()
    executors = [e for e in worker["finishedexecutors"] + worker["executors"]]
    assert any(e["appid"] == first["app_id"] for e in executors), executors
    started = python_log.read_text().splitlines()
    assert any(line.startswith("executor -m pyspark.daemon") for line in started), started
