"""Reductions and TopK: GROUP BY, towers, TopK buffers and distinct sets over state tables
(:mod:`ivm.plan.reduce`). :mod:`ops.reduce.spark` renders them on Spark DataFrames and
:mod:`ops.reduce.driver` in Arrow on the driver, both sharing :mod:`ops.reduce.accumulable`
and :mod:`ops.reduce.floatsum`; :mod:`ops.reduce.accumulate`, :mod:`ops.reduce.climb` and
:mod:`ops.reduce.buffer` are the driver's steps inside Spark's plan.
"""
