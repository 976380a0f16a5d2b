"""Jobs: refresh and verify. Each runs in one process so its steps share one Spark session."""

from __future__ import annotations

import dagster as dg

from assets.views import VIEWS_GROUP

REFRESH_JOB = "ivm_refresh"


def refresh_job() -> dg.UnresolvedAssetJobDefinition:
    """Mint an epoch and bring every view to it (the epoch asset and all view assets).

    Without the from-scratch checks: they recompute every view, which is what a refresh
    avoids; they run in :func:`verify_job` (or on demand in the UI).
    """
    return dg.define_asset_job(
        REFRESH_JOB,
        selection=dg.AssetSelection.groups(VIEWS_GROUP).without_checks(),
        executor_def=dg.in_process_executor,
        description="One epoch: mint it from the sources' new versions, refresh every view.",
    )


VERIFY_JOB = "ivm_verify"


def verify_job() -> dg.UnresolvedAssetJobDefinition:
    """Run every view's from-scratch check (``ivm verify`` as a job)."""
    return dg.define_asset_job(
        VERIFY_JOB,
        selection=dg.AssetSelection.all_asset_checks(),
        executor_def=dg.in_process_executor,
        description="Recompute every view from scratch at its epoch and compare (asset checks).",
    )
