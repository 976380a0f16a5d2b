"""Source contracts enforced: each source's updates that break its contract (a pandera schema's
row checks) are set aside in ``quarantine/<source>`` once per epoch; views never read them.

Contract in ``(data, time, diff)`` terms: ``quarantine/<source>`` holds, at each epoch ``e``,
the source's updates of time ``e`` that fail the contract's predicate, with ``_violations``
naming the failed checks; the rest are what views read (:meth:`engine.inputs.Inputs.updates`).
"""

from __future__ import annotations

import time

import pyarrow.dataset as ds
from pyspark.sql import functions as F

from engine.catalog import Catalog
from engine.definitions import Definitions
from engine.epochs import Epochs
from engine.inputs import Inputs
from engine.results import QuarantineResult
from ops import DIFF, TIME
from ops.sink import append_updates
from resources.contracts import Contract, spark_type_name
from resources.lake import open_table


class Quarantine:
    """Setting aside the updates that break their source's contract (see the module)."""

    def __init__(
        self, catalog: Catalog, epochs: Epochs, inputs: Inputs, definitions: Definitions
    ) -> None:
        self.catalog = catalog
        self.epochs = epochs
        self.inputs = inputs
        self.definitions = definitions

    def run(self) -> list[QuarantineResult]:
        """Set aside, up to the latest epoch, the updates of each source that break its
        contract: appended to ``quarantine/<source>`` (the source's columns, ``_violations``,
        ``_time``, ``_diff``) once per epoch (txn), so a rerun adds nothing."""
        cat = self.catalog
        if not cat.project.contracts:
            return []
        out = []
        target = cat.latest_epoch()
        for name in cat.sources:
            contract, valid = cat.contract(name), cat.contract_predicate(name)
            if contract is None or valid is None:
                continue
            uri = cat.quarantine_uri(name)
            done = cat.table_epoch(uri)
            if done < target:
                out.append(self._source(name, contract, valid, uri, done, target))
        return out

    def _source(
        self, name: str, contract: Contract, valid: str, uri: str, done: int, target: int
    ) -> QuarantineResult:
        cat = self.catalog
        started = time.perf_counter()
        anew = done > 0 and self._schema(uri) != self.definitions.source_types(
            name, cat.sources[name].column_names()
        )
        if anew:  # the source's schema changed: keep its invalid rows as of now
            cat.progress(f"source {name}: schema changed; the quarantine starts anew")
            done = 0
        bad = self.inputs.source_updates(name, done, target).where(f"NOT ({valid})")
        bad = bad.withColumn("_violations", F.expr(contract.reasons_sql("spark")))
        cols = [c for c in bad.columns if c not in (TIME, DIFF)]
        bad = bad.select(*cols, TIME, DIFF).coalesce(1)
        commit = append_updates(
            bad,
            uri,
            app_id=cat.app_id(uri),
            epoch=target,
            metadata={"ivm.quarantine": name},
            description=f"ivm quarantine: updates of source {name} that break its contract",
            overwrite=anew,
            small=self.epochs.small_change([name], done, target),
        )
        result = QuarantineResult(name, target, commit.rows, uri)
        if commit.rows:  # one row of this epoch's, read from the files (not all of them)
            dataset = open_table(uri).to_pyarrow_dataset()
            first = dataset.head(1, filter=ds.field(TIME) == target).to_pylist()
            result.example = first[0] if first else None
        cat.progress(f"{result.describe()} ({time.perf_counter() - started:.2f}s)")
        return result

    def _schema(self, uri: str) -> dict[str, str]:
        return {
            f.name: spark_type_name(f.type)
            for f in self.catalog.table_schema(uri)
            if f.name not in ("_violations", TIME, DIFF)
        }
