"""Why the driver declined: the reasons a part of a refresh that the driver computes for small
changes (:mod:`ops.stateless.driver`, :mod:`ops.reduce.driver`, the state it takes on within Spark's
path in :mod:`ops.reduce.accumulate`, :mod:`ops.reduce.climb` and :mod:`ops.reduce.buffer`, the
driver's reads and writes in :mod:`ops.ingest` and :mod:`ops.arrange`) was handed to Spark instead.

Each decision to decline is taken from the schemas, types and sizes before the driver writes
anything, and says why (:func:`declined`); the engine records the reasons of each view's
refresh (:func:`recorded`, on the thread refreshing it) and reports them with its result.

Contract in ``(data, time, diff)`` terms: none of its own. A decline changes who computes a
view's updates, never which: Spark then computes the same ``(data, time, diff)``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from contextlib import contextmanager

log = logging.getLogger("ivm")

_RECORD = threading.local()  # .reasons: the list the thread's declines go to, if any


def declined(reason: str) -> None:
    """Note that the driver handed work to Spark, and why (each reason once per record)."""
    reasons: list[str] | None = getattr(_RECORD, "reasons", None)
    if reasons is not None and reason not in reasons:
        reasons.append(reason)
    log.debug("driver declined: %s", reason)


@contextmanager
def recorded() -> Iterator[list[str]]:
    """The reasons declined on this thread while inside, in order (an enclosing record
    receives them too)."""
    outer: list[str] | None = getattr(_RECORD, "reasons", None)
    reasons: list[str] = []
    _RECORD.reasons = reasons
    try:
        yield reasons
    finally:
        _RECORD.reasons = outer
        if outer is not None:
            outer.extend(r for r in reasons if r not in outer)
