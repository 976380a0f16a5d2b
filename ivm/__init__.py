"""Incremental materialized views over Delta Lake: the SQL front end, planner and engine.

The package never imports Dagster; :mod:`dagster_project` and :mod:`assets` wrap it.
"""
