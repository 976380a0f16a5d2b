"""What a view's commits record about the definition they were computed with, and whether the
stored view can continue incrementally: its SQL, its state tables' layout, its upstream views'
identities, its sources' contracts and column types. Any change means a rebuild.

Contract in ``(data, time, diff)`` terms: updates computed under one definition are only ever
summed with updates computed under the same one; a changed definition starts from the view's
recomputation at a new epoch (the difference to the stored view logged as updates).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable

from engine.catalog import Catalog
from ivm.plan.planner import ViewPlan
from ivm.plan.reduce import state_tables
from resources.contracts import spark_type_name
from resources.lake import last_commit_metadata

LOG_START = "ivm.log_start"
"""Commit metadata of a diff log: the epoch since which it holds the view's whole history."""


def state_layout(plan: ViewPlan) -> str:
    """The names, sort keys and formats (after the first) of a view's state tables, as its
    commits record them: state laid out another way (another planner's) cannot be continued."""
    return json.dumps(
        {
            t.name: [
                *t.key,
                *([f"format {t.format}"] if t.format > 1 else []),
                *([f"hash {t.hash}"] if t.hash else []),
            ]
            for t in state_tables(plan.root)
        },
        sort_keys=True,
    )


class Definitions:
    """The recorded definitions of a project's views (see the module)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def record(self, plan: ViewPlan) -> dict[str, str]:
        """What a view's commits record about the definition they were computed with."""
        inputs = {u: self.upstream_identity(u) for u in plan.view_inputs}
        return {
            "ivm.view": plan.name,
            "ivm.sql_hash": plan.sql_hash,
            "ivm.inputs": json.dumps(inputs, sort_keys=True),
            "ivm.contracts": json.dumps(self.contract_hashes(plan.source_inputs), sort_keys=True),
            "ivm.input_types": json.dumps(self.input_types(plan), sort_keys=True),
            "ivm.state_tables": state_layout(plan),
        }

    def log_start(self, log_uri: str) -> int:
        """The epoch since which the diff log holds the view's whole history (0: no log)."""
        info = last_commit_metadata(log_uri, LOG_START)
        return int(info[LOG_START]) if info else 0

    def upstream_identity(self, view: str) -> str:
        """``sql_hash@log_start`` of an upstream view: a downstream view computed from
        another definition, or from a history that has since started anew, is rebuilt."""
        cat = self.catalog
        return f"{cat.plan.views[view].sql_hash}@{self.log_start(cat.layout.view_log(view))}"

    def contract_hashes(self, collections: Iterable[str]) -> dict[str, str]:
        """Per source among ``collections`` read under a contract, a hash of its predicate."""
        out = {}
        for source in collections:
            if source not in self.catalog.sources:
                continue
            valid = self.catalog.contract_predicate(source)
            if valid is not None:
                out[source] = hashlib.sha256(valid.encode()).hexdigest()[:16]
        return out

    def source_types(self, source: str, columns: Iterable[str]) -> dict[str, str]:
        """Current Spark type names of some columns of a source."""
        schema = {f.name.lower(): f.type for f in self.catalog.sources[source].arrow_schema()}
        return {c: spark_type_name(schema[c]) for c in columns if c in schema}

    def input_types(self, plan: ViewPlan) -> dict[str, dict[str, str]]:
        """The types of the source columns a view reads (its own and its arrangements'):
        when one changes, the view is rebuilt rather than fed updates of another type."""
        columns: dict[str, set[str]] = {}
        for get in plan.gets:
            if get.kind == "source":
                columns.setdefault(get.collection, set()).update(get.columns)
        for arrangement in self.catalog.plan.arrangements_of(plan.name):
            if arrangement.key.collection in self.catalog.sources:
                columns.setdefault(arrangement.key.collection, set()).update(arrangement.columns)
        return {s: self.source_types(s, sorted(cols)) for s, cols in columns.items()}

    def rebuild_reason(self, name: str) -> str | None:
        """Why a view must be rebuilt before it can continue incrementally, or None."""
        plan = self.catalog.view(name)
        info = last_commit_metadata(self.catalog.layout.view_log(plan.name), "ivm.sql_hash")
        if info is None:
            return None
        return (
            self._changed_code(info, plan)
            or self._changed_upstream(info, plan)
            or self._changed_sources(info, plan)
        )

    def _changed_code(self, info: dict[str, str], plan: ViewPlan) -> str | None:
        if info["ivm.sql_hash"] != plan.sql_hash:
            return "its SQL changed"
        layout = info.get("ivm.state_tables")
        if layout != state_layout(plan) and (layout is not None or plan.has_state):
            return "its state tables changed (written by another version of the planner)"
        return None

    def _changed_upstream(self, info: dict[str, str], plan: ViewPlan) -> str | None:
        recorded = json.loads(info.get("ivm.inputs", "{}"))
        for upstream in plan.view_inputs:
            was_hash, _, was_start = str(recorded.get(upstream)).partition("@")
            now_hash, _, now_start = self.upstream_identity(upstream).partition("@")
            if was_hash != now_hash:
                return f"upstream view {upstream!r} was redefined"
            if was_start and was_start != now_start:
                return (
                    f"upstream view {upstream!r} started its history anew at epoch {now_start} "
                    "(its columns changed)"
                )
        return None

    def _changed_sources(self, info: dict[str, str], plan: ViewPlan) -> str | None:
        contracts = json.loads(info.get("ivm.contracts", "{}"))
        current = self.contract_hashes(plan.source_inputs)
        for source in sorted(set(contracts) | set(current)):
            if contracts.get(source) != current.get(source):
                return f"the row checks of source {source!r}'s contract changed"
        types = json.loads(info.get("ivm.input_types", "{}"))
        for source, now in self.input_types(plan).items():
            for column, was in types.get(source, {}).items():
                if column in now and now[column] != was:
                    return (
                        f"source {source!r} column {column!r} changed type from {was} to "
                        f"{now[column]}"
                    )
        return None
