"""Reading and tending the lake without Spark: each view's status and rows, the whole project's
status, the tables the engine writes, and vacuum (deleting files no recent version needs).

Contract in ``(data, time, diff)`` terms: none of these change any table's contents; vacuum
removes only files that no table version within the retention references.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from engine.catalog import Catalog
from engine.results import ViewStatus
from ivm.errors import IvmError, SourceError
from ivm.plan.reduce import state_tables
from resources.lake import SourceTable, last_commit_metadata, open_for_write, open_table


class Maintenance:
    """Status, reading views, vacuum (see the module)."""

    def __init__(self, catalog: Catalog) -> None:
        self.catalog = catalog

    def view_status(self, name: str) -> ViewStatus:
        cat = self.catalog
        table = cat.layout.view_table(name)
        dt = open_table(table)
        rows = None
        if dt is not None:
            actions = pa.table(dt.get_add_actions(flatten=True))
            rows = int(sum(r or 0 for r in actions.column("num_records").to_pylist()))
        log_epoch = cat.table_epoch(cat.layout.view_log(name))
        return ViewStatus(name, log_epoch, cat.table_epoch(table), rows)

    def read_view(self, name: str) -> pa.Table:
        """The view's current rows, read with delta-rs (no Spark)."""
        cat = self.catalog
        cat.view(name)
        dt = open_table(cat.layout.view_table(name))
        if dt is None:
            raise IvmError(
                f"view {name!r} has not been materialized yet: run `ivm --project "
                f"{cat.project.root} refresh`"
            )
        return dt.to_pyarrow_table()

    def lake_tables(self) -> list[str]:
        """Every Delta table the engine writes: views, logs, arrangements, state, epochs,
        quarantines."""
        cat = self.catalog
        out = [cat.layout.epochs]
        for name in cat.plan.order:
            out += [cat.layout.view_log(name), cat.layout.view_table(name)]
            out += [cat.state_uri(name, t.name) for t in state_tables(cat.plan.views[name].root)]
        out += [cat.arrangement_uri(k) for k in cat.plan.arrangements]
        out += [cat.quarantine_uri(s) for s in cat.project.contracts]
        return [u for u in out if open_table(u) is not None]

    def vacuum(self, retention_hours: float = 168.0) -> dict[str, int]:
        """Delete files no table version within ``retention_hours`` references: files of
        commits that never happened (a crash between writing and committing) and files
        replaced by rebuilds. Readers of older versions need those versions' files, hence
        the retention (default 7 days). Returns files deleted per table."""
        out = {}
        for uri in self.lake_tables():
            dt = open_for_write(uri)
            deleted = dt.vacuum(
                retention_hours=int(retention_hours),
                enforce_retention_duration=False,
                dry_run=False,
                full=True,  # also files no version ever referenced (never committed)
            )
            if deleted:
                out[self.catalog.app_id(uri)] = len(deleted)
                self.catalog.progress(
                    f"vacuum {self.catalog.app_id(uri)}: {len(deleted)} files deleted"
                )
        return out

    def status(self) -> dict[str, Any]:
        """Consumed source versions, latest epoch, and each view's epoch (no Spark)."""
        cat = self.catalog
        epochs = cat.epochs()
        last = epochs[-1] if epochs else None
        sources = {}
        for name, uri in cat.project.sources.items():
            consumed = last.ranges.get(name, (None, None))[1] if last else None
            try:
                current: int | None = SourceTable(name, uri).version()
            except SourceError:
                current = None
            sources[name] = {"path": uri, "consumed_version": consumed, "current_version": current}
        views = {}
        for name in cat.plan.order:
            st = self.view_status(name)
            views[name] = {"epoch": st.table_epoch, "log_epoch": st.log_epoch, "rows": st.rows}
        for name, error in sorted(cat.plan.broken.items()):
            views[name] = {"epoch": None, "log_epoch": None, "rows": None, "error": str(error)}
        return {
            "lake": cat.layout.root,
            "epoch": last.epoch if last else 0,
            "minted_at": last.minted_at.isoformat() if last else None,
            "sources": sources,
            "views": views,
        }

    def arrangement_status(self) -> list[dict[str, Any]]:
        """Every arrangement: key, columns, users and its table's size (no Spark).

        The analogue of Materialize's ``mz_arrangement_sizes`` and ``mz_arrangement_sharing``.
        """
        out = []
        for key, aplan in self.catalog.plan.arrangements.items():
            uri = self.catalog.arrangement_uri(key)
            dt = open_table(uri)
            rows = size = files = 0
            if dt is not None:
                actions = pa.table(dt.get_add_actions(flatten=True))
                files = actions.num_rows
                rows = int(sum(r or 0 for r in actions.column("num_records").to_pylist()))
                size = int(sum(actions.column("size_bytes").to_pylist()))
            info = last_commit_metadata(uri, "ivm.since")
            out.append(
                {
                    "arrangement": str(key),
                    "collection": f"{key.kind} {key.collection}",
                    "key": list(key.key),
                    "columns": list(aplan.columns),
                    "users": list(aplan.users),
                    "epoch": self.catalog.table_epoch(uri),
                    "since": int(info["ivm.since"]) if info else None,
                    "rows": rows,
                    "bytes": size,
                    "files": files,
                    "path": uri,
                }
            )
        return out
