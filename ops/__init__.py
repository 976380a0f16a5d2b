"""Operators: render plan nodes as updates ``(columns..., _time, _diff)``, each family with a
renderer on Spark DataFrames and one on Arrow in the driver that give the same updates.

- stateless: :mod:`ops.stateless` (Spark) and :mod:`ops.local` (driver); expressions as Spark
  SQL in :mod:`ops.expressions`;
- joins: :mod:`ops.join` (Spark) and :mod:`ops.local` (driver, inner joins), lookups in shared
  arrangements through :mod:`ops.arrange`;
- reductions and TopK: :mod:`ops.reduce` (Spark) and :mod:`ops.local_reduce` (driver), sharing
  :mod:`ops.accumulable` and :mod:`ops.floatsum`; the driver's steps inside Spark's plan in
  :mod:`ops.accumulate`, :mod:`ops.climb` and :mod:`ops.buffer`;
- inputs and outputs: :mod:`ops.ingest` (sources and logs), :mod:`ops.log_sink` (diff logs),
  :mod:`ops.sink` (readable tables), :mod:`ops.consolidate`, :mod:`ops.rows`.

Operators decide nothing the plan has not decided; where a size chooses between two ways of
computing the same updates, the threshold is the execution policy's (:mod:`ivm.policy`), and
what the driver hands to Spark is recorded (:mod:`ops.declines`).
"""

TIME = "_time"
DIFF = "_diff"
RESERVED = (TIME, DIFF)
