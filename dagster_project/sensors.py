"""The source-version sensor: one refresh run per new epoch.

It reads only the Delta logs (no Spark): when some source's version is past the last epoch's,
it requests a run whose key names the next epoch and the versions seen, so a tick that sees
the same versions again requests nothing new (Dagster skips a repeated run key). A view whose
definition changed (so it must be rebuilt at a new epoch) also requests a run.
"""

from __future__ import annotations

import dagster as dg

from engine.facade import Engine
from ivm.config import Project


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
        description="Requests a refresh run when any source table has a new Delta version.",
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
