"""IR expressions as Spark SQL text: the one translation every renderer of a plan shares.

Owns :func:`spark_sql`, the text a plan's expression (a sqlglot node of :mod:`ivm.plan.ir`)
is handed to Spark as: by Spark's renderers (:mod:`ops.stateless.spark` for Get/Filter/Project/
UnionAll, :mod:`ops.join.spark` for joins' filters, maps and residual predicates) and by the
driver's (:mod:`ops.stateless.driver`, which asks Spark the type of that same text). It imports no
renderer, so each renderer may import it without a cycle.

Contract in ``(data, time, diff)`` terms: none of its own. It turns an expression over
``data`` into text and never sees ``time`` or ``diff``: the renderers carry those through.
"""

from __future__ import annotations

from sqlglot import exp

from ivm.sql.parse import DIALECT


def spark_sql(e: exp.Expression) -> str:
    """An IR expression as Spark SQL text, every identifier quoted.

    >>> spark_sql(exp.column("a") + exp.Literal.number(1))
    '`a` + 1'
    """
    return e.sql(dialect=DIALECT, identify=True)
