"""Joins: a join's change by delta paths through shared arrangements (:mod:`ivm.plan.join`).
:mod:`ops.join.spark` renders every join on Spark DataFrames (snapshots, delta paths, outer,
semi and anti joins by counts); :mod:`ops.join.driver` renders inner joins in Arrow on the
driver.
"""
