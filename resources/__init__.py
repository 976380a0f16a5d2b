"""Owns the two external systems: the Spark session (:mod:`resources.spark`) and the Delta lake
through delta-rs (:mod:`resources.lake`). No Dagster here; the Dagster resources that hand these
to assets live in :mod:`dagster_project.definitions`."""
