"""Random source tables and random change batches, written with delta-rs (test helper).

Each batch mixes inserts (including exact duplicates of existing rows), deletes and updates,
so views see retractions, multiplicities above one and NULLs.
"""

from __future__ import annotations

import datetime as dt
import random
from decimal import Decimal

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

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
