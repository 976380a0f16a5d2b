"""Turns a project's sources, epoch and views into Dagster assets (:mod:`assets.views`)."""
