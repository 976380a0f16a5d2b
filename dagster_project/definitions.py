"""The code location's one composition root.

:func:`build_definitions` returns one project's Definitions: assets, the two
multi-asset checks, the refresh, verify and compact jobs, the sensors (sources' observations,
Declarative Automation, the hand-written refresh sensor), the schedules, and the Spark resource
built from the same settings ``ivm refresh`` uses, so both run identical engine code. Every run
executes in one process (the Definitions' executor), so its steps share one Spark session.
:func:`defs` (the module ``workspace.yaml`` and ``dg`` load) loads the defs folder, whose
``IvmProjectComponent`` (:mod:`dagster_project.component`) calls :func:`build_definitions` on
the project named by ``$IVM_PROJECT`` (an ``ivm.toml`` or its directory; default: the demo
project the README's demo command creates).
"""

from __future__ import annotations

import os
from pathlib import Path

import dagster as dg
from dagster_pyspark import LazyPySparkResource

from assets.keys import Translator
from assets.views import CONSISTENCY_OP, automation_condition, build_asset_checks, build_assets
from dagster_project.jobs import compact_job, refresh_job, verify_job
from dagster_project.schedules import compact_schedule, refresh_schedule, verify_schedule
from dagster_project.sensors import automation_sensor, observe_sources_sensor, source_sensor
from ivm.config import CONFIG_ENV, Project, load_project
from ivm.errors import ConfigError
from resources.spark import spark_conf

DEMO_PROJECT = Path(__file__).resolve().parent.parent / "demo" / "work" / "project" / "ivm.toml"


def build_definitions(
    project: str | os.PathLike[str] | Project, translator: Translator | None = None
) -> dg.Definitions:
    """Definitions for one project (an ``ivm.toml``, its directory, or the loaded project),
    every asset's spec passed through ``translator`` (see :mod:`assets.keys`; None: the
    default keys and groups)."""
    if not isinstance(project, Project):
        project = load_project(project)
    assets, keys = build_assets(project, translator)
    checks = build_asset_checks(project, keys)
    job = refresh_job(keys, [c for c in checks if c.node_def.name == CONSISTENCY_OP])
    verify = verify_job()
    compact = compact_job(project)
    sensors = [observe_sources_sensor(project, keys), source_sensor(project, job)]
    if automation_condition(project) is not None:
        sensors.append(automation_sensor())
    return dg.Definitions(
        assets=assets,
        asset_checks=checks,
        jobs=[job, verify, compact],
        sensors=sensors,
        schedules=[refresh_schedule(job), verify_schedule(verify), compact_schedule(compact)],
        resources={"pyspark": LazyPySparkResource(spark_config=spark_conf(project.spark_conf))},
        executor=dg.in_process_executor,
    )


def default_project_path() -> str:
    """``$IVM_PROJECT``, else the demo project (which must exist).

    Raises:
        ConfigError: neither is there, saying what to do.
    """
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
    """The dg project's defs folder (``dagster_project/defs``: the ``IvmProjectComponent`` of
    ``defs/ivm/defs.yaml``), which ``dg dev``, ``dg check defs`` and ``workspace.yaml`` all
    load. Loaded lazily by Dagster, so importing this module never needs a project."""
    return dg.load_from_defs_folder(path_within_project=Path(__file__).resolve().parent)
