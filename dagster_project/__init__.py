"""The Dagster code location: definitions, jobs, sensors and schedules for one project."""
