"""The demo's and the bench's TPC-H change batches (no Spark): what each batch writes to the
sources' change feeds, since every demo and benchmark figure rests on it.

A batch of ``n`` orders per kind must show in the change feeds as: ``n`` new orders and their
line items (``insert``), ``n`` deleted orders and every line item of theirs (``delete``), ``n``
orders and their line items and a share of the customers updated (``update_preimage`` /
``update_postimage`` pairs), and nothing else.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable

from demo.tpch import apply_change_batch, create_sources, generate_parquet
from resources.lake import spark_compatible


@pytest.fixture(scope="module")
def tpch(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("tpch")
    return create_sources(generate_parquet(0.01, root / "parquet"), root / "data")


def _feed(uri: str, after: int) -> pa.Table:
    dt = DeltaTable(uri)
    feed = dt.load_cdf(starting_version=after + 1, ending_version=dt.version()).read_all()
    return spark_compatible(pa.table(feed))  # plain strings: pyarrow cannot filter views


def _kinds(feed: pa.Table) -> Counter:
    return Counter(feed.column("_change_type").to_pylist())


def test_a_batch_writes_the_refresh_functions_and_updates_to_the_change_feeds(tpch) -> None:
    before = {name: DeltaTable(uri).version() for name, uri in tpch.items()}
    old_orders = DeltaTable(tpch["orders"]).to_pyarrow_table()
    old_items = DeltaTable(tpch["lineitem"]).to_pyarrow_table(columns=["l_orderkey"])
    items_per_order = Counter(old_items.column("l_orderkey").to_pylist())

    summary = apply_change_batch(tpch, 0.01, seed=7)

    n = old_orders.num_rows // 100
    assert (summary.new_orders, summary.deleted_orders, summary.updated_orders) == (n, n, n)
    orders = _feed(tpch["orders"], before["orders"])
    assert _kinds(orders) == {
        "insert": n,
        "delete": n,
        "update_preimage": n,
        "update_postimage": n,
    }
    # New orders take fresh keys; deleted ones are gone with every line item they had.
    inserted = pc.filter(orders, pc.equal(orders.column("_change_type"), "insert"))
    assert min(inserted.column("o_orderkey").to_pylist()) > max(
        old_orders.column("o_orderkey").to_pylist()
    )
    deleted = pc.filter(orders, pc.equal(orders.column("_change_type"), "delete"))
    deleted_keys = deleted.column("o_orderkey").to_pylist()
    items = _feed(tpch["lineitem"], before["lineitem"])
    kinds = _kinds(items)
    assert kinds["delete"] == sum(items_per_order[k] for k in deleted_keys)
    assert kinds["insert"] == summary.new_lineitems > 0
    assert kinds["update_preimage"] == kinds["update_postimage"] == summary.updated_lineitems > 0
    assert set(kinds) == {"insert", "delete", "update_preimage", "update_postimage"}
    # An update changes the discount and nothing else.
    post = pc.filter(items, pc.equal(items.column("_change_type"), "update_postimage"))
    assert {str(d) for d in post.column("l_discount").to_pylist()} == {"0.10"}
    customers = _kinds(_feed(tpch["customer"], before["customer"]))
    assert customers == {
        "update_preimage": summary.updated_customers,
        "update_postimage": summary.updated_customers,
    }
    assert DeltaTable(tpch["orders"]).to_pyarrow_table().num_rows == old_orders.num_rows


def test_batches_with_the_same_seed_pick_the_same_orders(tmp_path: Path) -> None:
    parquet = generate_parquet(0.01, tmp_path / "parquet")
    first = apply_change_batch(create_sources(parquet, tmp_path / "a"), 0.005, seed=3)
    second = apply_change_batch(create_sources(parquet, tmp_path / "b"), 0.005, seed=3)
    assert str(first) == str(second)
