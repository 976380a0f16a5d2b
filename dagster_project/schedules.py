"""The refresh schedule (cron from ``IVM_REFRESH_CRON``, default hourly; stopped by default)."""

from __future__ import annotations

import os

import dagster as dg

DEFAULT_CRON = "0 * * * *"


def refresh_schedule(job: dg.UnresolvedAssetJobDefinition) -> dg.ScheduleDefinition:
    return dg.ScheduleDefinition(
        name="ivm_refresh_schedule",
        job=job,
        cron_schedule=os.environ.get("IVM_REFRESH_CRON", DEFAULT_CRON),
        default_status=dg.DefaultScheduleStatus.STOPPED,
        description="Refreshes all views on a cron schedule.",
    )
