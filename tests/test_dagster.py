"""The Dagster layer on the real stack: definitions load with the metadata Dagster renders, the
refresh job and "Materialize all" materialize views in one process with the cheap checks (the
from-scratch ones only in the verify job), Declarative Automation requests views when a source
moved or a view's SQL changed, the sensor requests a run exactly when a source moved, and the
webserver serves the asset graph (sources upstream of the views that read them); the dg
component builds the same location (translated keys followed throughout); and in headless
Chromium, "Materialize all" and a launchpad full refresh succeed and show on a view's page."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pyarrow as pa
import pytest
import yaml
from dagster.components.core.component_tree import ComponentTreeException
from dagster.components.testing import create_defs_folder_sandbox
from dagster.components.testing.utils import component_defs
from deltalake import DeltaTable, write_deltalake

from assets.keys import IvmAsset
from assets.views import (
    CONSISTENCY_OP,
    CONSISTENT_CHECK,
    EPOCH_KEY,
    FROM_SCRATCH_CHECK,
    FULL_REFRESH_TAG,
    VIEWS_OP,
    source_key,
    view_key,
)
from dagster_project.component import IvmProjectComponent
from dagster_project.definitions import build_definitions
from dagster_project.jobs import COMPACT_JOB, REFRESH_JOB, VERIFY_JOB
from dagster_project.sensors import AUTOMATION_SENSOR, OBSERVE_SENSOR
from engine.facade import Engine
from engine.oracle import compare_views
from ivm.errors import ConfigError

REPO = Path(__file__).resolve().parent.parent

VIEWS = {
    "open_orders": """
        CREATE VIEW open_orders AS
        SELECT o_orderkey, o_custkey, o_price FROM orders WHERE o_status = 'O'
    """,
    "vip_open_orders": """
        CREATE VIEW vip_open_orders AS
        SELECT o_orderkey, o_price * 2 AS doubled FROM open_orders WHERE o_custkey < 10
    """,
    "customers_upper": "CREATE VIEW customers_upper AS SELECT c_custkey, upper(c_name) AS name FROM customer",
    "customer_orders": """
        CREATE VIEW customer_orders AS
        SELECT c.c_name, o.o_orderkey FROM customer c JOIN open_orders o ON o.o_custkey = c.c_custkey
    """,
}


def orders_table(keys: range) -> pa.Table:
    return pa.table(
        {
            "o_orderkey": pa.array(list(keys), pa.int64()),
            "o_custkey": pa.array([k % 13 for k in keys], pa.int64()),
            "o_status": ["O" if k % 3 else "F" for k in keys],
            "o_price": pa.array([k * 10 for k in keys], pa.int64()),
        }
    )


@pytest.fixture
def project(make_project, tmp_path: Path) -> Path:
    orders, customer = str(tmp_path / "orders"), str(tmp_path / "customer")
    write_deltalake(
        orders, orders_table(range(30)), configuration={"delta.enableChangeDataFeed": "true"}
    )
    write_deltalake(customer, pa.table({"c_custkey": [1, 2], "c_name": ["ann", "bob"]}))
    return make_project(VIEWS, {"orders": orders, "customer": customer})


BY_CUST = dg.AssetKey(["arrangements", "open_orders_by_o_custkey"])
CUSTOMER_BY_KEY = dg.AssetKey(["arrangements", "customer_by_c_custkey"])


def test_definitions_load_with_lineage(project: Path) -> None:
    defs = build_definitions(project)
    dg.Definitions.validate_loadable(defs)
    graph = defs.resolve_asset_graph()
    # Only edges that carry data: no view is wired to the epoch, which reads the sources.
    assert graph.get(view_key("open_orders")).parent_keys == {source_key("orders")}
    assert graph.get(EPOCH_KEY).parent_keys == {source_key("orders"), source_key("customer")}
    assert view_key("open_orders") in graph.get(view_key("vip_open_orders")).parent_keys
    spec = graph.get(view_key("vip_open_orders"))
    assert spec.code_version == Engine(project).plan.views["vip_open_orders"].sql_hash
    # Arrangements sit between their collection and the views that read them.
    assert graph.get(BY_CUST).parent_keys == {view_key("open_orders")}
    assert BY_CUST in graph.get(view_key("customer_orders")).parent_keys
    assert CUSTOMER_BY_KEY in graph.get(view_key("customer_orders")).parent_keys
    groups = {k.to_user_string(): graph.get(k).group_name for k in graph.get_all_asset_keys()}
    assert groups["sources/orders"] == groups["ivm/epoch"] == "sources"
    assert groups[BY_CUST.to_user_string()] == "arrangements"
    assert groups["views/open_orders"] == "views"
    assert defs.resolve_job_def(REFRESH_JOB) is not None
    assert defs.resolve_sensor_def("ivm_source_versions") is not None
    assert defs.resolve_schedule_def("ivm_refresh_schedule") is not None
    # Every run of the location executes in one process (so one Spark session).
    assert defs.resolve_implicit_global_asset_job_def().executor_def is dg.in_process_executor


def test_definitions_carry_what_dagster_renders(project: Path) -> None:
    defs = build_definitions(project)
    graph = defs.resolve_asset_graph()
    orders = graph.get(source_key("orders"))
    assert orders.kinds == {"delta"} and orders.metadata["dagster/storage_kind"] == "delta"
    meta = graph.get(view_key("customer_orders")).metadata
    table = Engine(project).layout.view_table("customer_orders")
    assert meta["dagster/storage_kind"] == "delta"
    assert meta["dagster/uri"].value == Path(table).as_uri()
    assert meta["dagster/table_name"] == f"delta.`{table}`"
    schema = meta["dagster/column_schema"]
    assert [c.name for c in schema.columns] == ["c_name", "o_orderkey"]
    lineage = meta["dagster/column_lineage"].deps_by_column
    assert lineage["c_name"] == [dg.TableColumnDep(source_key("customer"), "c_name")]
    assert lineage["o_orderkey"] == [dg.TableColumnDep(view_key("open_orders"), "o_orderkey")]
    doubled = graph.get(view_key("vip_open_orders")).metadata["dagster/column_lineage"]
    assert doubled.deps_by_column["doubled"] == [
        dg.TableColumnDep(view_key("open_orders"), "o_price")
    ]
    (ref,) = meta["dagster/code_references"].code_references
    assert ref.file_path == str(project / "views" / "customer_orders.sql")
    # One multi-asset check per kind, each over every view.
    checks = {c.node_def.name: c for c in defs.asset_checks}
    names = {k.name for c in checks.values() for k in c.check_keys}
    assert names == {CONSISTENT_CHECK, FROM_SCRATCH_CHECK} and len(checks) == 2
    assert {k.asset_key for k in checks[CONSISTENCY_OP].check_keys} == {view_key(v) for v in VIEWS}
    # Declarative Automation: eager by default, sources observed by a sensor, both running.
    assert "eager" in graph.get(view_key("open_orders")).automation_condition.get_label()
    assert graph.get(EPOCH_KEY).automation_condition is not None
    for name in (OBSERVE_SENSOR, AUTOMATION_SENSOR):
        assert defs.resolve_sensor_def(name).default_status == dg.DefaultSensorStatus.RUNNING
    assert (
        defs.resolve_schedule_def("ivm_verify_schedule").default_status
        == dg.DefaultScheduleStatus.STOPPED
    )


def test_dagster_settings_in_ivm_toml(make_project, tmp_path: Path) -> None:
    orders = str(tmp_path / "orders")
    write_deltalake(orders, orders_table(range(3)))
    views = {"open_orders": VIEWS["open_orders"]}
    cron = make_project(
        views, {"orders": orders}, '[dagster]\nautomation = "on_cron"\ncron = "5 * * * *"'
    )
    graph = build_definitions(cron).resolve_asset_graph()
    assert (
        "on_cron(5 * * * *" in graph.get(view_key("open_orders")).automation_condition.get_label()
    )
    none = make_project(views, {"orders": orders}, '[dagster]\nautomation = "none"')
    defs = build_definitions(none)
    assert defs.resolve_asset_graph().get(view_key("open_orders")).automation_condition is None
    assert AUTOMATION_SENSOR not in {s.name for s in defs.sensors}
    wrong = make_project(views, {"orders": orders}, "[dagster]\nautomaton = 'eager'")
    with pytest.raises(ConfigError, match=r"ivm.toml: \[dagster\] has unknown key 'automaton'"):
        build_definitions(wrong)
    bad = make_project(views, {"orders": orders}, "[dagster]\nautomation = 'lazy'")
    with pytest.raises(ConfigError, match=r"\[dagster\] automation must be one of"):
        build_definitions(bad)


def test_definitions_module_reads_env(project: Path, monkeypatch) -> None:
    monkeypatch.setenv("IVM_PROJECT", str(project / "ivm.toml"))
    import importlib

    import dagster_project.definitions as module

    module = importlib.reload(module)
    keys = {k.to_user_string() for k in module.defs().resolve_asset_graph().get_all_asset_keys()}
    assert {"sources/orders", "views/open_orders", "ivm/epoch"} <= keys


def test_sensor_requests_one_run_per_new_version(project: Path, spark) -> None:
    defs = build_definitions(project)
    sensor = defs.resolve_sensor_def("ivm_source_versions")
    instance = dg.DagsterInstance.ephemeral()
    # Nothing consumed yet: the first epoch is pending.
    result = sensor(dg.build_sensor_context(instance=instance))
    assert [r.run_key for r in result.run_requests] == ["epoch-1:customer@0,orders@0"]
    Engine(project, spark=spark).refresh()
    result = sensor(dg.build_sensor_context(instance=instance))
    assert isinstance(result, dg.SkipReason) and "no source changed" in result.skip_message
    # A new source version -> exactly one request, and not again for the same version.
    orders = Engine(project).project.sources["orders"]
    DeltaTable(orders).delete("o_orderkey = 4")
    result = sensor(dg.build_sensor_context(instance=instance))
    (request,) = result.run_requests
    assert request.run_key == "epoch-2:customer@0,orders@1"
    again = sensor(dg.build_sensor_context(instance=instance, cursor=result.cursor))
    assert isinstance(again, dg.SkipReason)


def test_schedule_requests_the_refresh_job(project: Path) -> None:
    defs = build_definitions(project)
    schedule = defs.resolve_schedule_def("ivm_refresh_schedule")
    assert schedule.job_name == REFRESH_JOB
    assert schedule.default_status == dg.DefaultScheduleStatus.STOPPED
    with dg.build_schedule_context(instance=dg.DagsterInstance.ephemeral()) as context:
        (request,) = schedule.evaluate_tick(context).run_requests
    assert request.job_name in (None, REFRESH_JOB)


def test_dagster_cli_validates_workspace(project: Path, tmp_path: Path) -> None:
    env = {**os.environ, "IVM_PROJECT": str(project), "DAGSTER_HOME": str(tmp_path)}
    dagster = Path(sys.executable).parent / "dagster"
    proc = subprocess.run(
        [str(dagster), "definitions", "validate", "-w", str(REPO / "workspace.yaml")],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_definitions_without_project_say_what_to_do(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("IVM_PROJECT", raising=False)
    import dagster_project.definitions as module

    monkeypatch.setattr(module, "DEMO_PROJECT", tmp_path / "nope" / "ivm.toml")
    with pytest.raises(ConfigError, match="IVM_PROJECT"):
        module.default_project_path()
    # Loaded through the defs folder: Dagster names the component, the cause says what to do.
    with pytest.raises(ComponentTreeException, match=r"defs.yaml \(IvmProjectComponent\)") as e:
        module.defs()
    assert isinstance(e.value.__cause__, ConfigError) and "IVM_PROJECT" in str(e.value.__cause__)


@pytest.mark.spark
def test_refresh_job_materializes_views(project: Path, spark) -> None:
    defs = build_definitions(project)
    job = defs.resolve_job_def(REFRESH_JOB)
    instance = dg.DagsterInstance.ephemeral()
    result = job.execute_in_process(instance=instance)
    assert result.success
    # One step mints the epoch and refreshes every view and arrangement (side by side);
    # another runs every view's cheap check (no Spark), none of the from-scratch ones.
    mats = {m.asset_key: m for m in result.asset_materializations_for_node(VIEWS_OP)}
    assert set(mats) == {view_key(v) for v in VIEWS} | {BY_CUST, CUSTOMER_BY_KEY, EPOCH_KEY}
    assert mats[BY_CUST].metadata["epoch"].value == 1
    assert mats[EPOCH_KEY].metadata["epoch"].value == 1
    assert mats[EPOCH_KEY].metadata["ranges"].value.records[0].data["upper"] == 0
    steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {VIEWS_OP, CONSISTENCY_OP}
    evaluations = result.get_asset_check_evaluations()
    assert {(e.asset_key, e.check_name) for e in evaluations} == {
        (view_key(v), CONSISTENT_CHECK) for v in VIEWS
    }
    assert all(e.passed for e in evaluations), [e.description for e in evaluations]
    meta = mats[view_key("open_orders")].metadata
    assert meta["epoch"].value == 1 and meta["rows_inserted"].value == 20
    assert meta["dagster/row_count"].value == 20
    assert "Get source orders" in meta["explain"].value
    # Change a source, run again: only the change flows, and views equal the oracle.
    orders = Engine(project).project.sources["orders"]
    DeltaTable(orders).update({"o_status": "'O'"}, predicate="o_orderkey = 27")
    write_deltalake(orders, orders_table(range(30, 33)), mode="append")
    result = job.execute_in_process(instance=instance)
    assert result.success
    mats = {m.asset_key: m for m in result.asset_materializations_for_node(VIEWS_OP)}
    mat = mats[view_key("open_orders")]
    assert mat.metadata["epoch"].value == 2
    assert mat.metadata["rows_changed"].value == 3  # order 27 opens, +31, +32 (30 is F)
    engine = Engine(project, spark=spark)
    assert all(c.equal for c in compare_views(engine)), [
        c.describe() for c in compare_views(engine)
    ]
    joined = mats[view_key("customer_orders")].metadata
    assert joined["epoch"].value == 2 and joined["rows_changed"].value == 1
    assert any(k.startswith("arrangement ") for k in joined)
    record = instance.get_latest_materialization_event(view_key("vip_open_orders"))
    assert record.asset_materialization.metadata["epoch"].value == 2
    # The verify job runs every view's checks, the from-scratch one among them; all pass.
    checked = defs.resolve_job_def(VERIFY_JOB).execute_in_process(instance=instance)
    assert checked.success
    evaluations = checked.get_asset_check_evaluations()
    assert {(e.asset_key, e.check_name) for e in evaluations} == {
        (view_key(v), c) for v in VIEWS for c in (CONSISTENT_CHECK, FROM_SCRATCH_CHECK)
    }
    assert all(e.passed for e in evaluations), [e.description for e in evaluations]
    # The maintenance job compacts the lake; the views stay as they were.
    compacted = defs.resolve_job_def(COMPACT_JOB).execute_in_process(
        instance=instance, run_config={"ops": {"compact_lake": {"config": {"retention_hours": 0}}}}
    )
    assert compacted.success
    (output,) = [e for e in compacted.all_events if e.event_type_value == "STEP_OUTPUT"]
    meta = output.event_specific_data.metadata
    assert meta["files_after"].value < meta["files_before"].value
    assert any(r.data["what"].startswith("arrangement") for r in meta["storage"].value.records)
    assert all(c.equal for c in compare_views(Engine(project, spark=spark)))


def _requested(result: dg.EvaluateAutomationConditionsResult) -> set[dg.AssetKey]:
    return {
        k
        for k in [source_key("orders"), source_key("customer"), EPOCH_KEY, BY_CUST]
        + [CUSTOMER_BY_KEY, *(view_key(v) for v in VIEWS)]
        if result.get_num_requested(k)
    }


def _observe_sources(defs: dg.Definitions, instance: dg.DagsterInstance, cursor: str | None) -> str:
    """One tick of the observation sensor, its observations recorded as the daemon would."""
    sensor = defs.resolve_sensor_def(OBSERVE_SENSOR)
    result = sensor(dg.build_sensor_context(instance=instance, cursor=cursor))
    if isinstance(result, dg.SkipReason):
        return cursor or ""
    for event in result.asset_events:
        instance.report_runless_asset_event(event)
    return result.cursor


@pytest.mark.spark
def test_materialize_all_runs_cheap_checks_only(project: Path, spark) -> None:
    """'Materialize all' (the implicit job, every asset and every check selected): one step
    refreshes, one runs the cheap checks; the from-scratch checks compute nothing. A view
    materialized alone after a source change mints the epoch itself and picks the change up;
    a table that disagrees with its log fails the cheap check."""
    defs = build_definitions(project)
    instance = dg.DagsterInstance.ephemeral()
    job = defs.resolve_implicit_global_asset_job_def()
    graph = defs.resolve_asset_graph()
    everything = sorted(graph.materializable_asset_keys)
    result = job.execute_in_process(instance=instance, asset_selection=everything)
    assert result.success
    steps = {e.step_key for e in result.all_events if e.event_type_value == "STEP_SUCCESS"}
    assert steps == {VIEWS_OP, CONSISTENCY_OP, "ivm_from_scratch"}
    evaluations = result.get_asset_check_evaluations()
    assert {e.check_name for e in evaluations} == {CONSISTENT_CHECK}
    assert len(evaluations) == len(VIEWS) and all(e.passed for e in evaluations)
    logs = [e.message for e in instance.all_logs(result.run_id) if e.message]
    assert any("from-scratch checks not run" in m for m in logs)
    # A source change, then only one view: it mints epoch 2 and consumes it.
    orders = Engine(project).project.sources["orders"]
    write_deltalake(orders, orders_table(range(30, 33)), mode="append")
    result = job.execute_in_process(instance=instance, asset_selection=[view_key("open_orders")])
    assert result.success
    (mat,) = [
        m
        for m in result.asset_materializations_for_node(VIEWS_OP)
        if m.asset_key == view_key("open_orders")
    ]
    assert mat.metadata["epoch"].value == 2 and mat.metadata["rows_changed"].value == 2
    epoch = instance.get_latest_materialization_event(EPOCH_KEY).asset_materialization
    assert epoch.metadata["epoch"].value == 2
    (check,) = result.get_asset_check_evaluations()
    assert check.asset_key == view_key("open_orders") and check.passed
    # The epoch alone: minted (its ranges as a table), no view refreshed.
    write_deltalake(orders, orders_table(range(33, 35)), mode="append")
    result = job.execute_in_process(instance=instance, asset_selection=[EPOCH_KEY])
    (mat,) = result.asset_materializations_for_node(VIEWS_OP)
    assert mat.asset_key == EPOCH_KEY and mat.metadata["epoch"].value == 3
    ranges = {r.data["source"]: r.data for r in mat.metadata["ranges"].value.records}
    assert (ranges["orders"]["lower"], ranges["orders"]["upper"]) == (1, 2)
    assert Engine(project).view_status("open_orders").table_epoch == 2
    # A readable table that lost rows: its cheap check fails, naming the counts.
    engine = Engine(project, spark=spark)
    table = engine.layout.view_table("customers_upper")
    write_deltalake(table, DeltaTable(table).to_pyarrow_table().slice(0, 1), mode="overwrite")
    cheap = dg.define_asset_job(
        "cheap",
        selection=dg.AssetSelection.checks(
            dg.AssetCheckKey(view_key("customers_upper"), CONSISTENT_CHECK)
        ),
    )
    defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[cheap]))
    result = defs.resolve_job_def("cheap").execute_in_process(instance=instance)
    (check,) = result.get_asset_check_evaluations()
    assert not check.passed
    assert "table has 1 rows, its log sums to 2" in check.description


@pytest.mark.spark
def test_declarative_automation_requests_changed_views(project: Path, spark) -> None:
    """Observed sources and eager conditions: nothing is requested before the sources are
    observed; then every asset (missing); after a run, nothing; after a new version of
    orders, the epoch and what reads orders, not the rest; after a view's SQL changed, that
    view."""
    defs = build_definitions(project)
    instance = dg.DagsterInstance.ephemeral()
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance)
    assert _requested(result) == set()  # sources never observed: missing inputs
    observed = _observe_sources(defs, instance, None)
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
    requested = _requested(result)
    assert requested == {EPOCH_KEY, BY_CUST, CUSTOMER_BY_KEY} | {view_key(v) for v in VIEWS}
    job = defs.resolve_implicit_global_asset_job_def()
    assert job.execute_in_process(instance=instance, asset_selection=sorted(requested)).success
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
    assert _requested(result) == set()
    # The sensor sees nothing new: no observation, nothing requested.
    assert _observe_sources(defs, instance, observed) == observed
    orders = Engine(project).project.sources["orders"]
    DeltaTable(orders).delete("o_orderkey = 4")
    observed = _observe_sources(defs, instance, observed)
    record = instance.get_latest_data_version_record(source_key("orders"), is_source=True)
    assert record.asset_observation.data_version == "1"
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
    reads_orders = {EPOCH_KEY, BY_CUST, view_key("open_orders"), view_key("vip_open_orders")}
    assert _requested(result) == reads_orders | {view_key("customer_orders")}
    assert job.execute_in_process(
        instance=instance, asset_selection=sorted(_requested(result))
    ).success
    result = dg.evaluate_automation_conditions(defs=defs, instance=instance, cursor=result.cursor)
    assert _requested(result) == set()
    # A changed definition: its code version changed, the view is requested.
    (project / "views" / "customers_upper.sql").write_text(
        "CREATE VIEW customers_upper AS SELECT c_custkey, lower(c_name) AS name FROM customer\n"
    )
    changed = build_definitions(project)
    result = dg.evaluate_automation_conditions(
        defs=changed, instance=instance, cursor=result.cursor
    )
    assert _requested(result) == {view_key("customers_upper")}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _graphql(port: int, query: str) -> dict:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/graphql",
        data=json.dumps({"query": query}).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


@contextmanager
def _webserver(project: Path, home: Path) -> Iterator[int]:
    """``dagster-webserver -w workspace.yaml`` on ``project`` with the instance ``home`` (runs
    launched at once, no daemon: no sensor runs on its own), serving the asset graph; yields
    its port. Its output goes to ``home/webserver.log``."""
    port = _free_port()
    home.mkdir(exist_ok=True)
    (home / "dagster.yaml").write_text(
        "run_coordinator:\n  module: dagster._core.run_coordinator\n"
        "  class: DefaultRunCoordinator\ntelemetry:\n  enabled: false\n"
    )
    env = {**os.environ, "IVM_PROJECT": str(project), "DAGSTER_HOME": str(home)}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    webserver = Path(sys.executable).parent / "dagster-webserver"
    log = (home / "webserver.log").open("wb")
    proc = subprocess.Popen(
        [str(webserver), "-w", str(REPO / "workspace.yaml"), "-h", "127.0.0.1", "-p", str(port)],
        cwd=REPO,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"webserver exited: {(home / 'webserver.log').read_text()[-2000:]}")
            try:
                if _graphql(port, "{ assetNodes { id } }")["data"]["assetNodes"]:
                    break
            except (OSError, KeyError, TypeError):
                pass
            time.sleep(1)
        else:
            pytest.fail("webserver did not serve the asset graph in time")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.slow
def test_webserver_serves_asset_graph(project: Path, tmp_path: Path) -> None:
    with _webserver(project, tmp_path / "dagster_home") as port:
        data = _graphql(port, "{ assetNodes { assetKey { path } dependencyKeys { path } } }")
    deps = {
        "/".join(n["assetKey"]["path"]): {"/".join(d["path"]) for d in n["dependencyKeys"]}
        for n in data["data"]["assetNodes"]
    }
    assert "sources/orders" in deps["views/open_orders"]
    assert "views/open_orders" in deps["views/vip_open_orders"]
    assert "sources/customer" in deps["views/customers_upper"]
    assert "sources/customer" in deps["arrangements/customer_by_c_custkey"]
    assert "arrangements/customer_by_c_custkey" in deps["views/customer_orders"]
    assert "sources/orders" not in deps["views/customers_upper"]


def test_instance_settings_serialize_lake_writes(project: Path) -> None:
    """The shipped dagster.yaml gives the lake's pool one slot, and every asset that writes
    the lake is in that pool: two runs never write a view at once."""
    from assets.views import POOL

    home = Path(__file__).resolve().parent.parent / "dagster_home"
    instance = dg.DagsterInstance.from_config(str(home))
    try:
        assert instance.event_log_storage.get_concurrency_info(POOL).limit == 1
    finally:
        instance.dispose()
    defs = build_definitions(project)
    writers = [
        a
        for a in defs.assets
        if isinstance(a, dg.AssetsDefinition)
        and any(k.path[0] in ("views", "arrangements", "ivm") for k in a.keys)
    ]
    written = {k for a in writers for k in a.keys}
    assert {view_key(v) for v in VIEWS} | {EPOCH_KEY} <= written
    assert any(k.path[0] == "arrangements" for k in written)
    assert all(a.op.pool == POOL for a in writers)


def test_full_refresh_from_a_backfill_and_broken_views(project: Path, spark) -> None:
    defs = build_definitions(project)
    instance = dg.DagsterInstance.ephemeral()
    assert defs.resolve_job_def(REFRESH_JOB).execute_in_process(instance=instance).success
    # One view, by its asset config (the launchpad of a UI backfill): rebuilt at a new epoch.
    one = dg.define_asset_job("one", selection=[view_key("open_orders")])
    defs = dg.Definitions.merge(defs, dg.Definitions(jobs=[one]))
    result = defs.resolve_job_def("one").execute_in_process(
        instance=instance,
        run_config={"ops": {VIEWS_OP: {"config": {"full_refresh": True}}}},
    )
    mats = result.asset_materializations_for_node(VIEWS_OP)
    (mat,) = [m for m in mats if m.asset_key == view_key("open_orders")]
    assert {m.asset_key for m in mats} == {view_key("open_orders"), EPOCH_KEY}  # minted
    assert mat.metadata["status"].value == "rebuilt" and mat.metadata["epoch"].value == 2
    assert mat.metadata["rows_changed"].value == 0  # same data: downstream receives nothing
    # Every view of a run, by the run tag; then a broken view fails alone.
    result = (
        build_definitions(project)
        .resolve_job_def(REFRESH_JOB)
        .execute_in_process(instance=instance, tags={FULL_REFRESH_TAG: "true"})
    )
    mats = [
        e.event_specific_data.materialization for e in result.get_asset_materialization_events()
    ]
    views = {view_key(v) for v in VIEWS}
    statuses = {m.asset_key: m.metadata["status"].value for m in mats if m.asset_key in views}
    assert set(statuses.values()) == {"rebuilt"} and len(statuses) == len(VIEWS)
    (project / "views" / "broken.sql").write_text("CREATE VIEW broken AS SELECT nope FROM orders")
    orders = Engine(project).project.sources["orders"]
    write_deltalake(orders, orders_table(range(40, 43)), mode="append")
    result = (
        build_definitions(project)
        .resolve_job_def(REFRESH_JOB)
        .execute_in_process(instance=instance, raise_on_error=False)
    )
    assert not result.success
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == "views__broken"
    assert (
        "broken.sql:1:30: unknown column 'nope' in source orders"
        in failure.step_failure_data.error.cause.message
    )
    refreshed = {m.asset_key for m in result.asset_materializations_for_node(VIEWS_OP)}
    assert {k for k in refreshed if k.path[0] == "views"} == {view_key(v) for v in VIEWS}
    engine = Engine(project, spark=spark)
    assert all(c.equal for c in compare_views(engine))
    # A view that fails at run time: the others materialize, its readers are skipped, and
    # the step fails naming them.
    (project / "views" / "broken.sql").unlink()
    table = engine.layout.view_table("open_orders")
    write_deltalake(table, DeltaTable(table).to_pyarrow_table().slice(0, 0), mode="overwrite")
    DeltaTable(orders).delete("o_orderkey < 6")
    result = (
        build_definitions(project)
        .resolve_job_def(REFRESH_JOB)
        .execute_in_process(instance=instance, raise_on_error=False)
    )
    (failure,) = [e for e in result.all_events if e.is_step_failure]
    assert failure.step_key == VIEWS_OP
    listed = failure.step_failure_data.user_failure_data.metadata["views"].value
    assert "open_orders: failed: view 'open_orders' epoch" in listed
    assert "vip_open_orders: skipped" in listed and "customer_orders: skipped" in listed
    refreshed = {m.asset_key for m in result.asset_materializations_for_node(VIEWS_OP)}
    assert view_key("customers_upper") in refreshed and view_key("open_orders") not in refreshed


def _summary(defs: dg.Definitions) -> dict[str, object]:
    """What a location offers: assets (with groups and parents), checks, jobs, sensors,
    schedules, resources and the executor."""
    graph = defs.resolve_asset_graph()
    return {
        "assets": {
            k.to_user_string(): (
                graph.get(k).group_name,
                sorted(p.to_user_string() for p in graph.get(k).parent_keys),
            )
            for k in graph.get_all_asset_keys()
        },
        "checks": sorted(k.to_user_string() for c in defs.asset_checks for k in c.check_keys),
        "jobs": sorted(j.name for j in defs.jobs),
        "sensors": sorted(s.name for s in defs.sensors),
        "schedules": sorted(s.name for s in defs.schedules),
        "resources": sorted(defs.resources),
        "executor": defs.executor,
    }


def test_component_scaffolds_and_builds_the_location(project: Path) -> None:
    """`dg scaffold defs dagster_project.component.IvmProjectComponent <name>` writes a
    defs.yaml naming the project relative to its folder; loaded, the component builds what
    build_definitions builds; its automation attributes override ivm.toml's."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=IvmProjectComponent,
            defs_path="lake",
            scaffold_params={"project_path": str(project / "ivm.toml")},
        )
        written = yaml.safe_load((path / "defs.yaml").read_text())
        assert written["type"] == "dagster_project.component.IvmProjectComponent"
        relative = written["attributes"]["project"]
        assert not Path(relative).is_absolute()
        assert (path / relative).resolve() == (project / "ivm.toml").resolve()
        with sandbox.load_component_and_build_defs(defs_path=path) as (component, defs):
            assert isinstance(component, IvmProjectComponent)
            assert _summary(defs) == _summary(build_definitions(project))
            graph = defs.resolve_asset_graph()
            assert "eager" in graph.get(view_key("open_orders")).automation_condition.get_label()
        attributes = {"project": relative, "automation": "on_cron", "cron": "5 * * * *"}
        (path / "defs.yaml").write_text(
            yaml.safe_dump({"type": written["type"], "attributes": attributes})
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            condition = defs.resolve_asset_graph().get(view_key("open_orders")).automation_condition
            assert "on_cron(5 * * * *" in condition.get_label()
        attributes = {"project": relative, "cron": "5 * * * *"}  # cron without on_cron
        (path / "defs.yaml").write_text(
            yaml.safe_dump({"type": written["type"], "attributes": attributes})
        )
        with pytest.raises(ComponentTreeException) as e:
            with sandbox.load_component_and_build_defs(defs_path=path):
                pass
        assert 'cron is used only with automation = "on_cron"' in str(e.value.__cause__)


TRANSLATION = {"key_prefix": "tpch", "group_name": "ivm_{{ asset.kind }}", "tags": {"team": "lake"}}


def test_component_translation_changes_keys_and_groups(project: Path) -> None:
    """The `translation` attribute (templated on `asset.kind`, `asset.name`) changes every
    asset's spec; dependencies, column lineage, checks, jobs and sensors follow the keys."""
    with create_defs_folder_sandbox() as sandbox:
        path = sandbox.scaffold_component(
            component_cls=IvmProjectComponent,
            defs_path="lake",
            defs_yaml_contents={
                "type": "dagster_project.component.IvmProjectComponent",
                "attributes": {"project": str(project), "translation": TRANSLATION},
            },
        )
        with sandbox.load_component_and_build_defs(defs_path=path) as (_, defs):
            pass
    graph = defs.resolve_asset_graph()
    keys = {k.to_user_string() for k in graph.get_all_asset_keys()}
    assert keys == {f"tpch/{k}" for k in _summary(build_definitions(project))["assets"]}
    vip = graph.get(dg.AssetKey(["tpch", "views", "vip_open_orders"]))
    assert vip.group_name == "ivm_view" and vip.tags["team"] == "lake"
    assert dg.AssetKey(["tpch", "views", "open_orders"]) in vip.parent_keys
    assert graph.get(dg.AssetKey(["tpch", "ivm", "epoch"])).group_name == "ivm_epoch"
    assert graph.get(dg.AssetKey(["tpch", "sources", "orders"])).group_name == "ivm_source"
    lineage = vip.metadata["dagster/column_lineage"].deps_by_column["doubled"]
    assert lineage == [dg.TableColumnDep(dg.AssetKey(["tpch", "views", "open_orders"]), "o_price")]
    checks = {k.asset_key.to_user_string() for c in defs.asset_checks for k in c.check_keys}
    assert checks == {f"tpch/views/{v}" for v in VIEWS}
    refresh = defs.resolve_job_def(REFRESH_JOB)
    assert {k.path[0] for k in refresh.asset_layer.selected_asset_keys} == {"tpch"}
    assert len(refresh.asset_layer.selected_asset_keys) == len(keys) - 2  # not the sources


class OwnedIvm(IvmProjectComponent):
    """A subclass overriding the translation hook (what the README shows)."""

    def get_asset_spec(self, spec: dg.AssetSpec, asset: IvmAsset) -> dg.AssetSpec:
        spec = super().get_asset_spec(spec, asset)
        if asset.kind != "view":
            return spec
        return spec.replace_attributes(key=["lake", asset.name], owners=["team:lake"])


@pytest.mark.spark
def test_translated_component_refreshes_views(project: Path, spark) -> None:
    """A subclass's get_asset_spec renames the views: the refresh job materializes them under
    their new keys, with their cheap checks; a translation that merges two keys is refused."""
    defs = component_defs(component=OwnedIvm(project=str(project)))
    graph = defs.resolve_asset_graph()
    assert graph.get(dg.AssetKey(["lake", "open_orders"])).owners == ["team:lake"]
    assert dg.AssetKey(["lake", "open_orders"]) in graph.get(BY_CUST).parent_keys
    instance = dg.DagsterInstance.ephemeral()
    result = defs.resolve_job_def(REFRESH_JOB).execute_in_process(instance=instance)
    assert result.success
    mats = {m.asset_key for m in result.asset_materializations_for_node(VIEWS_OP)}
    assert mats == {dg.AssetKey(["lake", v]) for v in VIEWS} | {BY_CUST, CUSTOMER_BY_KEY, EPOCH_KEY}
    evaluations = result.get_asset_check_evaluations()
    assert {e.asset_key for e in evaluations} == {dg.AssetKey(["lake", v]) for v in VIEWS}
    assert all(e.passed for e in evaluations)
    with pytest.raises(dg.DagsterInvalidDefinitionError, match="same key: views/open_orders"):
        build_definitions(
            project,
            lambda spec, asset: (
                spec.replace_attributes(key=view_key("open_orders"))
                if asset.kind == "view"
                else spec
            ),
        )


def test_dg_lists_and_checks_the_component(project: Path, tmp_path: Path) -> None:
    """`dg list components` shows the component; `dg check defs` loads the repository's dg
    project (its defs folder: the component on $IVM_PROJECT) as `dg dev` would."""
    env = {
        **os.environ,
        "IVM_PROJECT": str(project),
        "DAGSTER_HOME": str(tmp_path),
        "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
        "PYTHONPATH": str(REPO),
    }
    dg_cli = Path(sys.executable).parent / "dg"
    listed = subprocess.run(
        [str(dg_cli), "list", "components", "--json"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert listed.returncode == 0, listed.stdout + listed.stderr
    keys = {c["key"] for c in json.loads(listed.stdout)["items"]}
    assert "dagster_project.component.IvmProjectComponent" in keys
    checked = subprocess.run(
        [str(dg_cli), "check", "defs"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert "All definitions loaded successfully" in checked.stdout + checked.stderr


CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
RUNS_QUERY = "{ runsOrError { ... on Runs { results { runId status runConfigYaml } } } }"


def _wait_for_new_run(port: int, known: set[str], timeout: float = 240) -> dict:
    """The run launched after ``known`` (run ids), once it has finished."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        runs = _graphql(port, RUNS_QUERY)["data"]["runsOrError"]["results"]
        new = [r for r in runs if r["runId"] not in known]
        if new and new[0]["status"] in ("SUCCESS", "FAILURE", "CANCELED"):
            return new[0]
        time.sleep(2)
    pytest.fail(f"no run launched after {sorted(known)} finished within {timeout} s")


def _metadata_value(page, label: str) -> str:
    """The value of one row of the asset page's metadata table (latest materialization)."""
    row = page.locator("tr").filter(has=page.get_by_text(label, exact=True)).first
    return row.locator("td").last.inner_text().strip()


def _open_asset(page, port: int, path: str, status: str) -> str:
    """The asset page's text once its latest materialization's metadata (``status``) shows."""
    page.goto(f"http://127.0.0.1:{port}/assets/{path}")
    row = page.locator("tr").filter(has=page.get_by_text("status", exact=True)).first
    row.get_by_text(status, exact=True).wait_for()
    page.get_by_text("Get source orders").first.wait_for()
    return page.inner_text("body")


@pytest.mark.slow
def test_browser_materializes_views_and_full_refresh(project: Path, tmp_path: Path) -> None:
    """In headless Chromium: "Materialize all" on the asset graph launches one run that
    succeeds; a view's page shows its EXPLAIN, row count and epoch; the launchpad (shift-click
    on Materialize) with ``full_refresh: true`` for ``ivm_views`` rebuilds the view."""
    if not CHROMIUM.exists():
        pytest.skip(
            f"{CHROMIUM} is absent: install Debian's chromium (apt-get install -y chromium)"
        )
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (dev)")
    with (project / "ivm.toml").open("a") as f:  # a light Spark for the runs
        f.write('[spark]\n"spark.master" = "local[2]"\n"spark.driver.memory" = "1g"\n')
    with _webserver(project, tmp_path / "dagster_home") as port, sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        # Dagster's page forbids eval by its Content Security Policy; Playwright's polling
        # predicates are evaluated by eval, so the context bypasses the policy.
        page = browser.new_context(
            viewport={"width": 1600, "height": 1200}, bypass_csp=True
        ).new_page()
        page.set_default_timeout(60_000)
        # A fresh instance greets with a "Join the Dagster community" dialog: skip it.
        page.add_locator_handler(
            page.get_by_text("Join the Dagster community"),
            lambda _: page.get_by_role("button", name="Skip").click(),
        )
        page.goto(f"http://127.0.0.1:{port}/asset-groups")
        page.locator("button", has_text="Materialize all").first.click()
        page.get_by_text("Launched run").wait_for()
        run = _wait_for_new_run(port, set())
        assert run["status"] == "SUCCESS", f"run {run['runId']}: see {tmp_path}/dagster_home"
        text = _open_asset(page, port, "views/open_orders", "built")
        assert "Get source orders [o_orderkey, o_custkey, o_status, o_price]" in text
        assert re.search(r"Row count\s+20\b", text), text[:2000]
        assert _metadata_value(page, "epoch") == "1"
        assert _metadata_value(page, "status") == "built"
        # The launchpad: its config editor scaffolds full_refresh: false; set it, launch.
        page.locator("button", has_text="Materialize").first.click(modifiers=["Shift"])
        page.get_by_text("Launchpad").first.wait_for()
        page.locator(".CodeMirror").first.wait_for()
        page.evaluate(
            "() => { const cm = document.querySelector('.CodeMirror').CodeMirror;"
            " cm.setValue(cm.getValue().replace('full_refresh: false', 'full_refresh: true')); }"
        )
        page.get_by_role("dialog").locator("button", has_text="Materialize").last.click()
        rebuilt = _wait_for_new_run(port, {run["runId"]})
        assert rebuilt["status"] == "SUCCESS", f"run {rebuilt['runId']}: see {tmp_path}"
        assert "full_refresh: true" in rebuilt["runConfigYaml"]
        _open_asset(page, port, "views/open_orders", "rebuilt")
        assert _metadata_value(page, "epoch") == "2"
        browser.close()
