"""Random source tables and random change batches, written with delta-rs (test helper).

Each batch mixes inserts (including exact duplicates of existing rows), deletes and updates,
so views see retractions, multiplicities above one and NULLs. Also: which Parquet writer made
a table's files (:func:`parquet_writers`), and the check every view of such a lake must pass
after each batch (:func:`check_both_oracles`).
"""

from __future__ import annotations

import datetime as dt
import os
import random
from collections.abc import Callable, Sequence
from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

from engine.facade import Engine
from engine.oracle import compare_views, log_multiset, spark_compare_views, table_multiset
from engine.results import RefreshReport
from ivm.plan.planner import ProjectPlan, plan_views
from ivm.policy import Policy
from ivm.sql.parse import parse_view

BATCHES_ENV = "IVM_TEST_BATCHES"
"""How many random batches the oracle tests run at most (by default each test's bound: the
suite's time); ``IVM_TEST_BATCHES=6 ./dev test`` runs each through up to six."""


def check_both_oracles(engine, *, spark: bool = True) -> None:
    """Every view of ``engine`` equals DuckDB's result (project views) and, with ``spark``,
    Spark's from scratch (internal views too) at its epoch, and its diff log sums to its
    table. (Tests check with DuckDB after every epoch and with Spark after their last one,
    to keep the suite's time.)"""
    spark_checks = spark_compare_views(engine) if spark else []
    for c in [*compare_views(engine), *spark_checks]:
        assert c.equal, c.describe()
        assert log_multiset(engine, c.view, c.epoch) == table_multiset(engine.read_view(c.view))


def epochs_on_both_paths(
    engine: Engine, lake: JoinLake, use_policy: Callable[..., Policy], paths: Sequence[str]
) -> list[RefreshReport]:
    """A random batch of ``lake`` per path, refreshed where the policy in force places it
    (``"driver"``) or by Spark alone (``"spark"``); after each, every view checked against
    DuckDB, and after the last against Spark too (:func:`check_both_oracles`). Returns the
    refreshes' reports."""
    default = use_policy()
    reports = []
    for n, path in enumerate(paths, 1):
        use_policy(Policy.spark_only() if path == "spark" else default)
        lake.random_batch()
        report = engine.refresh()
        reports.append(report)
        assert report.ok, [(v.view, v.error) for v in report.views if v.error]
        assert {v.view for v in report.views} == set(engine.plan.order)
        if path == "spark":  # nothing: no input of the view changed
            assert {v.computed_by for v in report.views} <= {"spark", "nothing"}
        else:  # what the policy placed on the driver and Spark computed says why
            silent = [
                v.view
                for v in report.views
                if v.computed_by == "spark"
                and (v.placement or "").startswith("driver")
                and not v.driver_declined
            ]
            assert not silent, silent
        check_both_oracles(engine, spark=n == len(paths))
    use_policy(default)
    return reports


def batches(n: int, bound: int = 2) -> int:
    """``n`` random batches, at most ``$IVM_TEST_BATCHES`` (default ``bound``)."""
    return min(n, int(os.environ.get(BATCHES_ENV, str(bound))))


ITEMS_SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("grp", pa.string()),
        ("qty", pa.int32()),
        ("price", pa.decimal128(12, 2)),
        ("day", pa.date32()),
        ("tag", pa.string()),
    ]
)
EVENTS_SCHEMA = pa.schema(
    [("id", pa.int64()), ("kind", pa.string()), ("amount", pa.decimal128(10, 2))]
)


def _maybe(rng: random.Random, value, p_null: float = 0.15):
    return None if rng.random() < p_null else value


def item_row(rng: random.Random, ident: int) -> dict:
    return {
        "id": ident,
        "grp": _maybe(rng, rng.choice(["a", "b", "c", "D"])),
        "qty": _maybe(rng, rng.randint(0, 9)),
        "price": Decimal(rng.randint(0, 9999)) / 100,
        "day": dt.date(2024, 1, 1) + dt.timedelta(days=rng.randint(0, 40)),
        "tag": _maybe(rng, rng.choice(["alpha", "beta", "apex", "zeta"]), 0.3),
    }


def event_row(rng: random.Random, ident: int) -> dict:
    return {
        "id": ident,
        "kind": rng.choice(["click", "view", "a"]),
        "amount": Decimal(rng.randint(-500, 5000)) / 100,
    }


class RandomLake:
    """Two sources: ``items`` (CDF on; gets inserts, updates, deletes) and ``events``
    (no CDF; append-only)."""

    def __init__(self, root, seed: int) -> None:
        self.rng = random.Random(seed)
        self.items = f"{root}/items"
        self.events = f"{root}/events"
        self.next_id = 0

    def _ids(self, n: int) -> list[int]:
        out = list(range(self.next_id, self.next_id + n))
        self.next_id += n
        return out

    def create(self, n_items: int = 60, n_events: int = 20) -> None:
        rows = [item_row(self.rng, i) for i in self._ids(n_items)]
        rows += [dict(r) for r in rows[:5]]  # exact duplicates from the start
        write_deltalake(
            self.items,
            pa.Table.from_pylist(rows, schema=ITEMS_SCHEMA),
            configuration={"delta.enableChangeDataFeed": "true"},
        )
        write_deltalake(
            self.events,
            pa.Table.from_pylist(
                [event_row(self.rng, i) for i in self._ids(n_events)], schema=EVENTS_SCHEMA
            ),
        )

    def item_ids(self) -> list[int]:
        return sorted(set(DeltaTable(self.items).to_pyarrow_table().column("id").to_pylist()))

    def random_batch(self) -> str:
        """Apply one random batch of changes (several Delta commits); returns a summary."""
        rng = self.rng
        ids = self.item_ids()
        table = DeltaTable(self.items)
        done = []
        # Updates: quantities, groups (to and from NULL), prices.
        upd = rng.sample(ids, min(len(ids), rng.randint(1, 6)))
        if upd:
            table.update(
                {"qty": "coalesce(qty, 0) + 3"}, predicate=f"id IN ({','.join(map(str, upd))})"
            )
            done.append(f"update qty {len(upd)}")
        upd = rng.sample(ids, min(len(ids), rng.randint(0, 3)))
        if upd:
            table.update({"grp": "NULL"}, predicate=f"id IN ({','.join(map(str, upd))})")
            done.append(f"update grp->NULL {len(upd)}")
        # Deletes (sometimes of duplicated rows: all copies go).
        dele = rng.sample(ids, min(len(ids), rng.randint(1, 5)))
        table = DeltaTable(self.items)
        table.delete(f"id IN ({','.join(map(str, dele))})")
        done.append(f"delete {len(dele)}")
        # Inserts: new rows, plus re-inserts of rows equal to existing ones.
        current = DeltaTable(self.items).to_pyarrow_table().to_pylist()
        new = [item_row(rng, i) for i in self._ids(rng.randint(1, 8))]
        new += [dict(r) for r in rng.sample(current, min(len(current), rng.randint(0, 3)))]
        write_deltalake(self.items, pa.Table.from_pylist(new, schema=ITEMS_SCHEMA), mode="append")
        done.append(f"insert {len(new)}")
        if rng.random() < 0.7:
            ev = [event_row(rng, i) for i in self._ids(rng.randint(1, 5))]
            write_deltalake(
                self.events, pa.Table.from_pylist(ev, schema=EVENTS_SCHEMA), mode="append"
            )
            done.append(f"events +{len(ev)}")
        return ", ".join(done)


CUSTOMERS = pa.schema([("c_id", pa.int64()), ("c_name", pa.string()), ("c_seg", pa.string())])
ORDERS = pa.schema(
    [
        ("o_id", pa.int64()),
        ("o_cust", pa.int64()),
        ("o_status", pa.string()),
        ("o_total", pa.decimal128(12, 2)),
    ]
)
LINES = pa.schema(
    [
        ("l_order", pa.int64()),
        ("l_no", pa.int32()),
        ("l_qty", pa.int32()),
        ("l_price", pa.decimal128(10, 2)),
    ]
)


JOIN_LAKE_COLUMNS = {
    "customers": ("c_id", "c_name", "c_seg"),
    "orders": ("o_id", "o_cust", "o_total", "o_status"),
    "lines": ("l_order", "l_no", "l_qty", "l_price"),
}
"""The columns of :class:`JoinLake`'s tables."""


def plan_over_join_lake(sql: str) -> ProjectPlan:
    """The plan of one view ``v.sql`` over :class:`JoinLake`'s tables (no Spark)."""
    return plan_views([parse_view(sql, "v.sql")], JOIN_LAKE_COLUMNS)


class JoinLake:
    """customers <- orders <- lines, all with CDF. Batches change all three at once: deletes of
    matched rows, re-keyed rows (stop/start matching), NULL keys, hot keys with many matches."""

    def __init__(self, root, seed: int) -> None:
        self.rng = random.Random(seed)
        self.paths = {n: f"{root}/{n}" for n in ("customers", "orders", "lines")}
        self.next_order = 0

    def _customer(self, i: int) -> dict:
        return {"c_id": i, "c_name": f"cust{i}", "c_seg": self.rng.choice(["AUTO", "BUILD", None])}

    def _order(self) -> dict:
        self.next_order += 1
        cust = self.rng.choice([1, 1, 1, 2, 3, 4, 5, 6, 7, 8, None])  # customer 1 is hot
        return {
            "o_id": self.next_order,
            "o_cust": cust,
            "o_status": self.rng.choice(["O", "F"]),
            "o_total": Decimal(self.rng.randint(100, 99999)) / 100,
        }

    def _lines(self, order: int) -> list[dict]:
        return [
            {
                "l_order": order,
                "l_no": n,
                "l_qty": self.rng.randint(1, 50),
                "l_price": Decimal(self.rng.randint(1, 9999)) / 100,
            }
            for n in range(self.rng.randint(0, 4))
        ]

    def create(self) -> dict[str, str]:
        conf = {"delta.enableChangeDataFeed": "true"}
        write_deltalake(
            self.paths["customers"],
            pa.Table.from_pylist([self._customer(i) for i in range(1, 8)], schema=CUSTOMERS),
            configuration=conf,
        )
        orders = [self._order() for _ in range(30)]
        lines = [ln for o in orders for ln in self._lines(o["o_id"])]
        lines.append({"l_order": None, "l_no": 1, "l_qty": 1, "l_price": Decimal("1.00")})
        write_deltalake(
            self.paths["orders"], pa.Table.from_pylist(orders, schema=ORDERS), configuration=conf
        )
        write_deltalake(
            self.paths["lines"], pa.Table.from_pylist(lines, schema=LINES), configuration=conf
        )
        return self.paths

    def random_batch(self) -> None:
        rng = self.rng
        p = self.paths
        order_ids = DeltaTable(p["orders"]).to_pyarrow_table().column("o_id").to_pylist()
        # New orders with lines, and lines for existing orders (several matches per key).
        new = [self._order() for _ in range(rng.randint(1, 4))]
        write_deltalake(p["orders"], pa.Table.from_pylist(new, schema=ORDERS), mode="append")
        lines = [ln for o in new for ln in self._lines(o["o_id"])]
        lines += self._lines(rng.choice(order_ids))
        if lines:
            write_deltalake(p["lines"], pa.Table.from_pylist(lines, schema=LINES), mode="append")
        # Re-key: orders move to another (or no) customer; lines move to another order.
        moved = rng.sample(order_ids, min(3, len(order_ids)))
        DeltaTable(p["orders"]).update(
            {"o_cust": rng.choice(["1", "3", "NULL", "99"])},
            predicate=f"o_id IN ({','.join(map(str, moved))})",
        )
        DeltaTable(p["orders"]).update(
            {"o_status": "'O'"}, predicate=f"o_id = {rng.choice(order_ids)}"
        )
        DeltaTable(p["lines"]).update(
            {"l_order": str(rng.choice(order_ids))}, predicate=f"l_order = {rng.choice(order_ids)}"
        )
        # Deletes of matched rows on every side.
        DeltaTable(p["orders"]).delete(f"o_id IN ({','.join(map(str, rng.sample(order_ids, 2)))})")
        DeltaTable(p["lines"]).delete(f"l_order = {rng.choice(order_ids)} AND l_no = 1")
        cust = rng.randint(2, 8)
        DeltaTable(p["customers"]).delete(f"c_id = {cust}")
        if rng.random() < 0.7:
            write_deltalake(
                p["customers"],
                pa.Table.from_pylist([self._customer(cust)], schema=CUSTOMERS),
                mode="append",
            )
        DeltaTable(p["customers"]).update(
            {"c_seg": "'AUTO'"}, predicate=f"c_id = {rng.randint(1, 8)}"
        )


def parquet_writers(dt: DeltaTable) -> set[str]:
    """Which Parquet writer made each file of ``dt``: ``parquet-mr`` is Spark's,
    ``parquet-cpp-arrow`` pyarrow's (the driver's)."""
    return {pq.ParquetFile(p).metadata.created_by.split(" ")[0] for p in dt.file_uris()}
