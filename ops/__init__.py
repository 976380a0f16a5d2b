"""Operators: execute plan nodes on Spark DataFrames of updates ``(columns..., _time, _diff)``.

One module per family, mirroring the planner: :mod:`ops.ingest` (sources and views -> updates),
:mod:`ops.stateless` (filter, project, union all; joins dispatched to :mod:`ops.join`),
:mod:`ops.expressions` (IR expressions as Spark SQL, shared by every renderer),
:mod:`ops.consolidate`, :mod:`ops.sink` (writing updates and readable tables), :mod:`ops.rows`
(rows the driver holds), :mod:`ops.arrange`, :mod:`ops.join`, :mod:`ops.reduce` and
:mod:`ops.buffer` (a buffered TopK computed by the driver when its change is small).
Operators decide nothing the plan has not decided; where a size chooses between two ways of
computing the same updates, the threshold is the execution policy's (:mod:`ivm.policy`).
"""

TIME = "_time"
DIFF = "_diff"
RESERVED = (TIME, DIFF)
