"""Operators: render plan nodes as updates ``(columns..., _time, _diff)``, each family with a
renderer on Spark DataFrames and one on Arrow in the driver that give the same updates.

Each family is a package with its renderers side by side, ``spark.py`` and ``driver.py``:

- stateless: :mod:`ops.stateless.spark` and :mod:`ops.stateless.driver` (with the driver's
  expression evaluator); expressions as Spark SQL in :mod:`ops.expressions`;
- joins: :mod:`ops.join.spark` and :mod:`ops.join.driver` (inner joins), lookups in shared
  arrangements through :mod:`ops.arrange`;
- reductions and TopK: :mod:`ops.reduce.spark` and :mod:`ops.reduce.driver`, sharing
  :mod:`ops.reduce.accumulable` and :mod:`ops.reduce.floatsum`; the driver's steps inside
  Spark's plan in :mod:`ops.reduce.accumulate`, :mod:`ops.reduce.climb` and
  :mod:`ops.reduce.buffer`;
- inputs and outputs: :mod:`ops.ingest` (sources and logs), :mod:`ops.log_sink` (diff logs),
  :mod:`ops.sink` (readable tables), :mod:`ops.consolidate`, :mod:`ops.rows`.

Operators decide nothing the plan has not decided; where a size chooses between two ways of
computing the same updates, the threshold is the execution policy's (:mod:`ivm.policy`), and
what the driver hands to Spark is recorded (:mod:`ops.declines`).
"""

TIME = "_time"
DIFF = "_diff"
RESERVED = (TIME, DIFF)
