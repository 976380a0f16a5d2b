"""The code location's one composition root.

Loads the project named by ``$IVM_PROJECT`` (an ``ivm.toml`` or its directory; default: the
demo project the README's demo command creates) and returns its Definitions: assets, the two
multi-asset checks, the refresh, verify and compact jobs, the sensors (sources' observations,
Declarative Automation, the hand-written refresh sensor), the schedules, and the Spark resource
built from the same settings ``ivm refresh`` uses, so both run identical engine code. Every run
executes in one process (the Definitions' executor), so its steps share one Spark session.
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from assets.views import CONSISTENCY_OP, automation_condition, build_asset_checks, build_assets
from dagster_project.jobs import compact_job, refresh_job, verify_job
from dagster_project.schedules import compact_schedule, refresh_schedule, verify_schedule
from dagster_project.sensors import automation_sensor, observe_sources_sensor, source_sensor
from ivm.config import CONFIG_ENV, load_project
from ivm.errors import ConfigError
from resources.spark import spark_conf

DEMO_PROJECT = Path(__file__).resolve().parent.parent / "demo" / "work" / "project" / "ivm.toml"


def build_definitions(project_path: str | os.PathLike[str]) -> dg.Definitions:
    """Definitions for one project."""
    project = load_project(project_path)
    checks = build_asset_checks(project)
    job = refresh_job([c for c in checks if c.node_def.name == CONSISTENCY_OP])
    verify = verify_job()
    compact = compact_job(project)
    sensors = [observe_sources_sensor(project), source_sensor(project, job)]
    if automation_condition(project) is not None:
        sensors.append(automation_sensor())
    return dg.Definitions(
        assets=build_assets(project),
        asset_checks=checks,
        jobs=[job, verify, compact],
        sensors=sensors,
        schedules=[refresh_schedule(job), verify_schedule(verify), compact_schedule(compact)],
        resources={"pyspark": LazyPySparkResource(spark_config=spark_conf(project.spark_conf))},
        executor=dg.in_process_executor,
    )


def _project_path() -> str:
    path = os.environ.get(CONFIG_ENV)
    if path:
        return path
    if not DEMO_PROJECT.exists():
        raise ConfigError(
            f"{CONFIG_ENV} is not set and the demo project {DEMO_PROJECT} does not exist yet: "
            "run the README's demo command first, or point IVM_PROJECT at your ivm.toml"
        )
    return str(DEMO_PROJECT)


@dg.definitions
def defs() -> dg.Definitions:
    """Loaded lazily by Dagster, so importing this module never needs a project."""
    return build_definitions(_project_path())
