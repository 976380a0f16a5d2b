"""Stateless operators: Get, Filter, Project and UnionAll, each update ``(d, t, r)`` mapped to
``(f(d), t, r)`` or dropped. :mod:`ops.stateless.spark` renders them on Spark DataFrames (and
dispatches the other nodes to their families); :mod:`ops.stateless.driver` renders them in
Arrow on the driver, with the expression evaluator both driver renderers share.
"""
