"""``[catalog] database``: every view table is registered in Spark's catalog, so Spark SQL in
another session reads ``analytics.<view>`` (here through an embedded Hive metastore under the
project, ``[catalog] metastore``), and Dagster names the table so."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from assets.views import _view_table_metadata
from engine.inspect import Inspector
from ivm.config import load_project
from ivm.errors import ConfigError

VIEWS = {
    "big_orders": "CREATE VIEW big_orders AS SELECT id, amount FROM orders WHERE amount > 10",
    "per_cust": "CREATE VIEW per_cust AS SELECT cust, count(*) AS n FROM orders GROUP BY cust",
}
SPARK = '[spark]\n"spark.master" = "local[1]"\n"spark.ui.enabled" = "false"\n'

READ = """
import json, sys
from ivm.config import load_project
from resources.spark import get_spark
spark = get_spark(load_project(sys.argv[1]).spark_conf)
out = {v: [list(r) for r in spark.sql(f"SELECT * FROM analytics.{v}").collect()] for v in sys.argv[2:]}
print(json.dumps(out))
"""


def _run(args: list[str], cwd: Path) -> tuple[str, str]:
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, proc.stderr


@pytest.mark.slow
@pytest.mark.spark
def test_views_are_registered_and_read_by_name_from_another_session(make_project, tmp_path):
    source = str(tmp_path / "orders")
    rows = [{"id": i, "cust": i % 3, "amount": float(i)} for i in range(30)]
    write_deltalake(
        source, pa.Table.from_pylist(rows), configuration={"delta.enableChangeDataFeed": "true"}
    )
    catalog = '[catalog]\ndatabase = "analytics"\nmetastore = "metastore"\n'
    root = make_project(VIEWS, {"orders": source}, extra=SPARK + catalog)
    project = load_project(root)
    assert project.spark_conf["spark.sql.catalogImplementation"] == "hive"
    _, said = _run(["-m", "engine.cli", "--project", str(root), "refresh"], tmp_path)
    assert "registered as analytics.big_orders in Spark's catalog" in said, said
    DeltaTable(source).delete("id < 15")  # the registered table follows the view's changes
    _run(["-m", "engine.cli", "--project", str(root), "-q", "refresh"], tmp_path)
    out, _ = _run(["-c", READ, str(root), *VIEWS], tmp_path)
    read = json.loads(out.strip().splitlines()[-1])
    inspector = Inspector(root)
    for view in VIEWS:
        ours = inspector.read_view(view)
        expected = Counter(tuple(r.values()) for r in ours.to_pylist())
        assert Counter(tuple(r) for r in read[view]) == expected, view
        assert _view_table_metadata(inspector, view)["dagster/table_name"] == f"analytics.{view}"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('database = "my db"', "database must be a name"),
        ('metastore = "m"', "metastore is used only with a database"),
        ('database = "a"\nowner = "x"', "unknown key 'owner'"),
    ],
)
def test_catalog_settings_are_checked(make_project, table, message):
    root = make_project({}, {}, extra=f"[catalog]\n{table}\n")
    with pytest.raises(ConfigError, match=message):
        load_project(root)
