"""Sensors: the sources' observations, Declarative Automation, and the hand-written refresh
sensor.

- ``ivm_observe_sources`` (running by default) reads each source's Delta version (no Spark, no
  run) and records an observation of ``sources/<name>`` with that version as its data version
  when it differs from the last one recorded: what Declarative Automation sees as an update.
- ``ivm_automation`` (running by default, unless ``[dagster] automation = "none"``) evaluates
  the epoch's, arrangements' and views' automation conditions and requests their runs.
- ``ivm_source_versions`` (stopped by default; the alternative to the two above) requests one
  refresh run per new epoch: when some source's version is past the last epoch's, a run whose
  key names the next epoch and the versions seen, so a tick that sees the same versions again
  requests nothing new (Dagster skips a repeated run key). A view whose definition changed (so
  it must be rebuilt at a new epoch) also requests a run.
"""

from __future__ import annotations

import json

import dagster as dg
from dagster._core.definitions.data_version import DATA_VERSION_TAG

from assets.keys import AssetKeys
from engine.facade import Engine
from ivm.config import Project
from ivm.errors import SourceError
from resources.lake import SourceTable

OBSERVE_SENSOR = "ivm_observe_sources"
AUTOMATION_SENSOR = "ivm_automation"


def observe_sources_sensor(project: Project, keys: AssetKeys) -> dg.SensorDefinition:
    @dg.sensor(
        name=OBSERVE_SENSOR,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description=(
            "Records an observation of each source whose Delta version changed (data version "
            "= Delta version), without a run: Declarative Automation then sees it updated."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        seen: dict[str, int] = json.loads(context.cursor) if context.cursor else {}
        observations = []
        for name, uri in project.sources.items():
            try:
                version = SourceTable(name, uri).version()
            except SourceError as e:  # one unreadable source does not hide the others
                context.log.warning(f"source {name}: {e}")
                continue
            if seen.get(name) != version:
                seen[name] = version
                observations.append(
                    dg.AssetObservation(
                        keys.source(name),
                        metadata={"delta_version": version},
                        tags={DATA_VERSION_TAG: str(version)},
                    )
                )
        if not observations:
            return dg.SkipReason("no source has a new Delta version")
        return dg.SensorResult(asset_events=observations, cursor=json.dumps(seen, sort_keys=True))

    return _sensor


def automation_sensor() -> dg.AutomationConditionSensorDefinition:
    return dg.AutomationConditionSensorDefinition(
        AUTOMATION_SENSOR,
        target=dg.AssetSelection.all(),
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.RUNNING,
        description="Requests runs of the assets whose automation conditions hold.",
    )


def run_key(engine: Engine) -> str | None:
    """The run key for the pending epoch, or None when no source changed."""
    pending = engine.pending_changes()
    rebuilds = sorted(v for v in engine.plan.order if engine.rebuild_reason(v))
    if not pending and not rebuilds:
        return None
    if not pending:  # a definition changed: rebuild at a new epoch
        return f"epoch-{engine.latest_epoch() + 1}:rebuild:{','.join(rebuilds)}"
    versions = ",".join(f"{s}@{v}" for s, v in sorted(engine.source_versions().items()))
    return f"epoch-{engine.latest_epoch() + 1}:{versions}"


def source_sensor(project: Project, job: dg.UnresolvedAssetJobDefinition) -> dg.SensorDefinition:
    @dg.sensor(
        name="ivm_source_versions",
        job=job,
        minimum_interval_seconds=30,
        default_status=dg.DefaultSensorStatus.STOPPED,
        description=(
            "Requests a refresh run when any source table has a new Delta version (an "
            "alternative to Declarative Automation: run one or the other)."
        ),
    )
    def _sensor(context: dg.SensorEvaluationContext) -> dg.SensorResult | dg.SkipReason:
        engine = Engine(project)
        key = run_key(engine)
        if key is None:
            return dg.SkipReason(f"no source changed since epoch {engine.latest_epoch()}")
        if key == context.cursor:
            return dg.SkipReason(f"run {key} already requested")
        return dg.SensorResult(run_requests=[dg.RunRequest(run_key=key)], cursor=key)

    return _sensor
