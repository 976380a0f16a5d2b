"""Crash points for fault-injection tests.

``IVM_CRASH_AT=name`` (or ``name:n``) kills the process with SIGKILL the first (n-th) time
execution reaches ``crash_point(name)``: no exception handler, ``finally`` block or atexit
hook runs, as when a machine dies. Production runs never set the variable; the check is one
dictionary lookup.

Points (in the order a refresh reaches them): ``ingest`` (inputs read, nothing written),
``staged`` (a commit's Parquet files written, not committed), ``arrangement_committed``,
``state_committed``, ``log_committed`` (a view's diff log committed, its table not),
``vectors_enabled`` (a table given the deletion vectors feature, its change not committed),
``vectors_staged`` (the driver's inserted rows written, its deletion vectors not committed),
``table_committed`` (both committed), ``before_materialization`` (Dagster has not recorded
the materialization yet).

Contract in ``(data, time, diff)`` terms: wherever the process dies, rerunning the refresh
commits each epoch's updates exactly once (every commit carries ``txn(table, epoch)``).
"""

from __future__ import annotations

import os
import signal

ENV = "IVM_CRASH_AT"
_hits: dict[str, int] = {}


def crash_point(name: str) -> None:
    """Die here (SIGKILL) if ``$IVM_CRASH_AT`` names this point (and its count is reached)."""
    spec = os.environ.get(ENV)
    if not spec:
        return
    target, _, nth = spec.partition(":")
    if target != name:
        return
    _hits[name] = _hits.get(name, 0) + 1
    if _hits[name] == int(nth or 1):
        os.kill(os.getpid(), signal.SIGKILL)
