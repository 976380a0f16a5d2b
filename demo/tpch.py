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
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from deltalake import DeltaTable, write_deltalake
from deltalake.table import TableMerger

TABLES = ("customer", "orders", "lineitem")
"""The tables the demo's views read."""
ALL_TABLES = ("region", "nation", "supplier", "part", "partsupp", *TABLES)
"""Every TPC-H table (the 22 queries as views, tests/tpch)."""


def _plain(table: pa.Table) -> pa.Table:
    """Plain string types, nullable fields, no Parquet field ids (portable Delta schemas)."""
    fields = []
    for f in table.schema:
        t = pa.string() if f.type in (pa.string_view(), pa.large_string()) else f.type
        fields.append(pa.field(f.name, t, nullable=True))
    return table.cast(pa.schema(fields))


def generate_parquet(scale: float, out: Path, tables: Sequence[str] = TABLES) -> Path:
    """Generate the TPC-H ``tables`` at ``scale`` as Parquet under ``out/sf<scale>`` (cached)."""
    target = out / f"sf{scale:g}"
    if all((target / f"{t}.parquet").exists() for t in tables):
        return target
    target.mkdir(parents=True, exist_ok=True)
    exe = Path(sys.executable).parent / "tpchgen-cli"
    cmd = [str(exe if exe.exists() else "tpchgen-cli"), "parquet", "-s", f"{scale:g}"]
    cmd += [f"--tables={','.join(tables)}", f"--output-dir={target}"]
    subprocess.run(cmd, check=True, capture_output=True)
    return target


def create_sources(
    parquet_dir: Path, data_dir: Path, tables: Sequence[str] = TABLES
) -> dict[str, str]:
    """Write each of ``tables`` as a Delta table with CDF on; returns name -> path."""
    paths = {}
    for t in tables:
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


def _keys(uri: str, column: str) -> list[int]:
    """Every value of an integer key column (read alone, as Arrow)."""
    return DeltaTable(uri).to_pyarrow_dataset().to_table(columns=[column]).column(0).to_pylist()


def _rows_with(uri: str, column: str, keys: list[int]) -> pa.Table:
    """The rows whose ``column`` is one of ``keys`` (a filtered Arrow scan: only matching rows
    are kept in memory)."""
    dataset = DeltaTable(uri).to_pyarrow_dataset()
    return dataset.to_table(filter=pc.field(column).isin(pa.array(keys, pa.int64())))


def _merge_on(uri: str, column: str, keys: list[int]) -> TableMerger:
    """A delta-rs MERGE of the table at ``uri`` against the distinct ``keys`` of ``column``.

    Deletes and updates go through MERGE, a hash join against the small key table: delta-rs's
    UPDATE with an ``IN`` list held SF3's whole ``lineitem`` in memory (19 GB; MERGE: 1.5 GB)
    and wrote the same change feed (``update_preimage``/``update_postimage``, ``delete``).
    """
    source = pa.table({"k": pa.array(sorted(set(keys)), pa.int64())})
    return DeltaTable(uri).merge(
        source, predicate=f"t.{column} = s.k", source_alias="s", target_alias="t"
    )


def _remap(table: pa.Table, column: str, remap: dict[int, int]) -> pa.Table:
    index = table.schema.get_field_index(column)
    keys = table.column(column).to_pylist()
    return table.set_column(index, column, pa.array([remap[k] for k in keys], pa.int64()))


def apply_change_batch(sources: dict[str, str], fraction: float, seed: int = 1) -> BatchSummary:
    """Apply one TPC-H-style batch touching ``fraction`` of the orders (each part)."""
    rng = random.Random(seed)
    keys = sorted(_keys(sources["orders"], "o_orderkey"))
    n = max(1, int(len(keys) * fraction))
    picked = rng.sample(keys, 3 * n)
    copy_keys, delete_keys, update_keys = picked[:n], picked[n : 2 * n], picked[2 * n :]

    # RF1: new orders (copies of existing ones under fresh keys) with their line items.
    next_key = max(keys) + 1
    remap = {k: next_key + i for i, k in enumerate(copy_keys)}
    new_orders = _remap(_rows_with(sources["orders"], "o_orderkey", copy_keys), "o_orderkey", remap)
    new_items = _remap(
        _rows_with(sources["lineitem"], "l_orderkey", copy_keys), "l_orderkey", remap
    )
    write_deltalake(sources["orders"], _plain(new_orders), mode="append")
    write_deltalake(sources["lineitem"], _plain(new_items), mode="append")

    # RF2: delete orders and their line items.
    _merge_on(sources["orders"], "o_orderkey", delete_keys).when_matched_delete().execute()
    _merge_on(sources["lineitem"], "l_orderkey", delete_keys).when_matched_delete().execute()

    # Updates: status flips, discounts, balances.
    _merge_on(sources["orders"], "o_orderkey", update_keys).when_matched_update(
        {"o_orderstatus": "CASE WHEN t.o_orderstatus = 'O' THEN 'F' ELSE 'O' END"}
    ).execute()
    item_metrics = (
        _merge_on(sources["lineitem"], "l_orderkey", update_keys)
        .when_matched_update({"l_discount": "CAST(0.10 AS DECIMAL(15,2))"})
        .execute()
    )
    customers = _keys(sources["customer"], "c_custkey")
    ckeys = rng.sample(sorted(customers), max(1, int(len(customers) * fraction)))
    _merge_on(sources["customer"], "c_custkey", ckeys).when_matched_update(
        {"c_acctbal": "t.c_acctbal - CAST(1000.00 AS DECIMAL(15,2))"}
    ).execute()
    updated_items = int(item_metrics.get("num_target_rows_updated", 0))
    return BatchSummary(
        len(copy_keys),
        new_items.num_rows,
        len(delete_keys),
        len(update_keys),
        updated_items,
        len(ckeys),
    )
