"""TPC-H data as Delta sources with the Change Data Feed on, and TPC-H-style change batches.

``tpchgen-cli`` generates Parquet offline; delta-rs writes the Delta tables. A change batch
follows the TPC-H refresh functions: RF1 inserts new orders with their line items, RF2 deletes
orders with their line items; on top, some orders change status, some line items their
discount, some customers their balance (update pre/post images in the change feed).
"""

from __future__ import annotations

import random
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake

TABLES = ("customer", "orders", "lineitem")


def _plain(table: pa.Table) -> pa.Table:
    """Plain string types, nullable fields, no Parquet field ids (portable Delta schemas)."""
    fields = []
    for f in table.schema:
        t = pa.string() if f.type in (pa.string_view(), pa.large_string()) else f.type
        fields.append(pa.field(f.name, t, nullable=True))
    return table.cast(pa.schema(fields))


def generate_parquet(scale: float, out: Path) -> Path:
    """Generate the TPC-H tables at ``scale`` as Parquet under ``out/sf<scale>`` (cached)."""
    target = out / f"sf{scale:g}"
    if all((target / f"{t}.parquet").exists() for t in TABLES):
        return target
    target.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "tpchgen-cli"
    cmd = [str(exe if exe.exists() else "tpchgen-cli"), "parquet", "-s", f"{scale:g}"]
    cmd += [f"--tables={','.join(TABLES)}", f"--output-dir={target}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return target


def create_sources(parquet_dir: Path, data_dir: Path) -> dict[str, str]:
    """Write each TPC-H table as a Delta table with CDF on; returns name -> path."""
    paths = {}
    for t in TABLES:
        path = data_dir / t
        if path.exists():
            shutil.rmtree(path)
        table = _plain(pq.read_table(parquet_dir / f"{t}.parquet"))
        write_deltalake(str(path), table, configuration={"delta.enableChangeDataFeed": "true"})
        paths[t] = str(path)
    return paths


@dataclass
class BatchSummary:
    new_orders: int
    new_lineitems: int
    deleted_orders: int
    updated_orders: int
    updated_lineitems: int
    updated_customers: int

    def __str__(self) -> str:
        return (
            f"RF1 +{self.new_orders} orders / +{self.new_lineitems} line items; "
            f"RF2 -{self.deleted_orders} orders with their line items; updates: "
            f"{self.updated_orders} orders, {self.updated_lineitems} line items, "
            f"{self.updated_customers} customers"
        )


def _in_list(column: str, keys: list[int]) -> str:
    return f"{column} IN ({','.join(str(k) for k in keys)})"


def apply_change_batch(sources: dict[str, str], fraction: float, seed: int = 1) -> BatchSummary:
    """Apply one TPC-H-style batch touching ``fraction`` of the orders (each part)."""
    rng = random.Random(seed)
    orders_dt = DeltaTable(sources["orders"])
    orders = orders_dt.to_pyarrow_table(columns=["o_orderkey"])
    keys = sorted(orders.column("o_orderkey").to_pylist())
    n = max(1, int(len(keys) * fraction))
    picked = rng.sample(keys, 3 * n)
    copy_keys, delete_keys, update_keys = picked[:n], picked[n : 2 * n], picked[2 * n :]

    # RF1: new orders (copies of existing ones under fresh keys) with their line items.
    next_key = max(keys) + 1
    remap = {k: next_key + i for i, k in enumerate(copy_keys)}
    src = orders_dt.to_pyarrow_table(filters=[("o_orderkey", "in", copy_keys)])
    new_orders = src.set_column(
        0,
        "o_orderkey",
        pa.array([remap[k] for k in src.column("o_orderkey").to_pylist()], pa.int64()),
    )
    items = DeltaTable(sources["lineitem"]).to_pyarrow_table(
        filters=[("l_orderkey", "in", copy_keys)]
    )
    new_items = items.set_column(
        0,
        "l_orderkey",
        pa.array([remap[k] for k in items.column("l_orderkey").to_pylist()], pa.int64()),
    )
    write_deltalake(sources["orders"], new_orders, mode="append")
    write_deltalake(sources["lineitem"], new_items, mode="append")

    # RF2: delete orders and their line items.
    DeltaTable(sources["orders"]).delete(_in_list("o_orderkey", delete_keys))
    DeltaTable(sources["lineitem"]).delete(_in_list("l_orderkey", delete_keys))

    # Updates: status flips, discounts, balances.
    DeltaTable(sources["orders"]).update(
        {"o_orderstatus": "CASE WHEN o_orderstatus = 'O' THEN 'F' ELSE 'O' END"},
        predicate=_in_list("o_orderkey", update_keys),
    )
    item_metrics = DeltaTable(sources["lineitem"]).update(
        {"l_discount": "CAST(0.10 AS DECIMAL(15,2))"}, predicate=_in_list("l_orderkey", update_keys)
    )
    cust = DeltaTable(sources["customer"]).to_pyarrow_table(columns=["c_custkey"])
    ckeys = rng.sample(
        sorted(cust.column("c_custkey").to_pylist()), max(1, int(cust.num_rows * fraction))
    )
    DeltaTable(sources["customer"]).update(
        {"c_acctbal": "c_acctbal - CAST(1000.00 AS DECIMAL(15,2))"},
        predicate=_in_list("c_custkey", ckeys),
    )
    updated_items = int(item_metrics.get("num_updated_rows", 0))
    return BatchSummary(
        len(copy_keys),
        new_items.num_rows,
        len(delete_keys),
        len(update_keys),
        updated_items,
        len(ckeys),
    )
