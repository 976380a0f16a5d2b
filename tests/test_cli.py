"""The ``ivm`` command: output of each subcommand, and one clear line (exit 2, nothing
written) for each kind of bad input."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from engine.cli import main
from ivm.config import (
    DEFAULT_PARALLELISM,
    DEFAULT_RECOMPUTE_ABOVE,
    load_project,
)
from ivm.errors import ConfigError
from ivm.policy import Policy

ORDERS = pa.table(
    {
        "o_orderkey": pa.array([1, 2, 3, 4], pa.int64()),
        "o_status": ["O", "F", "O", "O"],
        "o_price": pa.array([10, 20, 30, 30], pa.int64()),
    }
)
GOOD_VIEW = {
    "open_orders": "CREATE VIEW open_orders AS SELECT o_orderkey, o_price FROM orders WHERE o_status = 'O'",
    "same_price": "CREATE VIEW same_price AS SELECT a.o_orderkey AS a, b.o_orderkey AS b FROM open_orders a JOIN open_orders b ON a.o_price = b.o_price WHERE a.o_orderkey < b.o_orderkey",
}


@pytest.fixture
def orders(tmp_path: Path) -> str:
    path = str(tmp_path / "data" / "orders")
    write_deltalake(path, ORDERS, configuration={"delta.enableChangeDataFeed": "true"})
    return path


def run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_malformed_toml(tmp_path: Path, capsys) -> None:
    (tmp_path / "ivm.toml").write_text("lake = \n")
    code, _, err = run(capsys, "--project", str(tmp_path), "status")
    assert code == 2
    assert "ivm.toml" in err and "malformed TOML" in err
    assert len(err.strip().splitlines()) == 1


def test_unknown_key_in_toml(tmp_path: Path, capsys) -> None:
    (tmp_path / "views").mkdir()
    (tmp_path / "ivm.toml").write_text('lake = "lake"\nsourcse = 1\n')
    code, _, err = run(capsys, "--project", str(tmp_path), "status")
    assert code == 2 and "unknown key 'sourcse'" in err


@pytest.mark.parametrize(
    ("refresh", "message"),
    [
        ("parallelism = 0", "parallelism must be a whole number >= 1"),
        ("parallelism = 'two'", "parallelism must be a whole number >= 1"),
        ("threads = 2", "[refresh] takes parallelism"),
        ("recompute_above = 1.5", "recompute_above must be a number from 0 to 1"),
        ("recompute_above = '5%'", "recompute_above must be a number from 0 to 1"),
        ("cache_mb = -1", "cache_mb must be a whole number of MiB >= 0"),
        ("cache_mb = 1.5", "cache_mb must be a whole number of MiB >= 0"),
    ],
)
def test_invalid_refresh_settings(tmp_path: Path, capsys, refresh: str, message: str) -> None:
    (tmp_path / "views").mkdir()
    (tmp_path / "ivm.toml").write_text(f'lake = "lake"\n[refresh]\n{refresh}\n')
    code, _, err = run(capsys, "--project", str(tmp_path), "status")
    assert code == 2 and message in err


def test_refresh_parallelism_setting(tmp_path: Path) -> None:
    (tmp_path / "views").mkdir()
    (tmp_path / "ivm.toml").write_text('lake = "lake"\n')
    project = load_project(tmp_path)
    assert project.parallelism == DEFAULT_PARALLELISM
    assert project.recompute_above == DEFAULT_RECOMPUTE_ABOVE
    assert project.cache_mb is None  # the file cache's default budget
    assert project.policy is None  # the process's policy stays in force
    (tmp_path / "ivm.toml").write_text(
        'lake = "lake"\n[refresh]\nparallelism = 1\nrecompute_above = 1\ncache_mb = 0\n'
        "[policy]\ndriver_change_rows = 5\ndriver = false\n"
    )
    project = load_project(tmp_path)
    assert (project.parallelism, project.recompute_above, project.cache_mb) == (1, 1.0, 0)
    assert project.policy == Policy(driver_change_rows=5, driver=False)


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("driver_rows = 5", "unknown policy setting 'driver_rows'"),
        ("driver_change_rows = -1", "driver_change_rows must be >= 0"),
        ("driver_change_rows = 1.5", "driver_change_rows must be int"),
        ('driver = "yes"', "driver must be bool"),
        ("page_rows = 0", "policy.page_rows must be > 0"),
    ],
)
def test_policy_settings_are_checked(tmp_path: Path, setting: str, message: str) -> None:
    """A wrong ``[policy]`` setting is refused naming the file, the table and the key."""
    (tmp_path / "views").mkdir()
    (tmp_path / "ivm.toml").write_text(f'lake = "lake"\n[policy]\n{setting}\n')
    with pytest.raises(ConfigError, match=re.escape(message)) as raised:
        load_project(tmp_path)
    assert "[policy]" in str(raised.value) and "ivm.toml" in str(raised.value)


def test_missing_project(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "--project", str(tmp_path / "nope"), "status")
    assert code == 2 and "project file not found" in err


def test_missing_source_path(make_project, tmp_path: Path, capsys) -> None:
    root = make_project(GOOD_VIEW, {"orders": str(tmp_path / "no" / "such")})
    code, _, err = run(capsys, "--project", str(root), "refresh")
    assert code == 2
    assert "source 'orders'" in err and "no Delta table" in err
    assert not (root / "lake").exists()


def test_unknown_column_names_file_line_col(make_project, orders, capsys) -> None:
    root = make_project(
        {"bad": "CREATE VIEW bad AS\nSELECT o_orderkey,\n       o_prise FROM orders"},
        {"orders": orders},
    )
    code, _, err = run(capsys, "--project", str(root), "refresh")
    assert code == 2
    assert f"{root}/views/bad.sql:3:8: unknown column 'o_prise'" in err
    assert not (root / "lake").exists(), "nothing may be written on bad input"


def test_unsupported_construct_is_named(make_project, orders, capsys) -> None:
    root = make_project(
        {
            "agg": "CREATE VIEW agg AS SELECT o_status, collect_list(o_id) "
            "OVER (ORDER BY o_id) AS r FROM orders"
        },
        {"orders": orders},
    )
    code, _, err = run(capsys, "--project", str(root), "explain", "agg")
    assert code == 2 and "window function COLLECT_LIST " in err and "agg.sql:1:" in err


def test_unknown_view(make_project, orders, capsys) -> None:
    root = make_project(GOOD_VIEW, {"orders": orders})
    code, _, err = run(capsys, "--project", str(root), "show", "nope")
    assert code == 2 and "unknown view 'nope' (views: open_orders, same_price)" in err


def test_show_before_refresh_says_what_to_do(make_project, orders, capsys) -> None:
    root = make_project(GOOD_VIEW, {"orders": orders})
    code, _, err = run(capsys, "--project", str(root), "show", "open_orders")
    assert code == 2 and "not been materialized yet" in err and "refresh" in err


@pytest.mark.spark
def test_refresh_then_show_explain_status_without_spark(spark, make_project, orders, capsys):
    root = make_project(GOOD_VIEW, {"orders": orders})
    code, out, _ = run(capsys, "--project", str(root), "refresh")
    assert code == 0
    assert "rows changed  table rows rewritten  seconds" in out
    assert "open_orders      1             3                     0" in out and "built" in out
    assert "same_price       1             1" in out
    code, out, _ = run(capsys, "--project", str(root), "refresh", "--json")
    assert code == 0 and json.loads(out)["views"]["open_orders"]["status"] == "up-to-date"

    # show/explain/status in a fresh interpreter: they must not even import pyspark.
    script = (
        "import sys, contextlib, io\n"
        "from engine.cli import main\n"
        "outs = []\n"
        "for argv in sys.argv[1:]:\n"
        "    buf = io.StringIO()\n"
        "    with contextlib.redirect_stdout(buf):\n"
        "        assert main(argv.split('|')) == 0, argv\n"
        "    outs.append(buf.getvalue())\n"
        "assert 'pyspark' not in sys.modules, 'a read-only command imported pyspark'\n"
        "print('\\n=====\\n'.join(outs))\n"
    )
    p = str(root)
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            script,
            f"--project|{p}|show|open_orders|--format|csv",
            f"--project|{p}|show|open_orders|--format|json",
            f"--project|{p}|show|open_orders",
            f"--project|{p}|explain|open_orders",
            f"--project|{p}|status",
            f"--project|{p}|arrangements",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    csv_out, json_out, table_out, explain_out, status_out, arr_out = proc.stdout.split("\n=====\n")
    header, _, row = arr_out.splitlines()[:3]
    assert header.split()[:2] == ["arrangement", "columns"]
    assert row.split()[:4] == ["open_orders[o_price]", "o_price,", "o_orderkey", "3"]
    assert row.split()[-1] == "same_price"
    assert csv_out.splitlines() == ["o_orderkey,o_price", "1,10", "3,30", "4,30"]
    assert json.loads(json_out) == [
        {"o_orderkey": 1, "o_price": 10},
        {"o_orderkey": 3, "o_price": 30},
        {"o_orderkey": 4, "o_price": 30},
    ]
    assert table_out.splitlines()[-1] == "(3 rows)"
    assert "Get source orders [o_orderkey, o_status, o_price]" in explain_out
    assert "orders: consumed version 0, current version 0" in status_out
    assert "open_orders: epoch 1, 3 rows" in status_out


@pytest.mark.spark
def test_verify_with_either_oracle(spark, make_project, orders, capsys):
    """``verify --oracle duckdb`` compares each view with DuckDB (no Spark: not even
    imported), and its log with its table; a row added behind the engine's back is found by
    both oracles; ``--repair`` goes with Spark's only."""
    root = make_project(GOOD_VIEW, {"orders": orders})
    p = str(root)
    assert run(capsys, "--project", p, "refresh")[0] == 0
    script = (
        "import sys\n"
        "from engine.cli import main\n"
        "code = main(sys.argv[1:])\n"
        "assert 'pyspark' not in sys.modules, 'verify --oracle duckdb imported pyspark'\n"
        "sys.exit(code)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script, "--project", p, "verify", "--oracle", "duckdb"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "open_orders: equal to DuckDB's result (3 rows at epoch 1)",
        "same_price: equal to DuckDB's result (1 rows at epoch 1)",
    ]
    code, out, _ = run(capsys, "--project", p, "verify", "--oracle", "duckdb", "--json")
    assert code == 0
    (result,) = [r for r in json.loads(out) if r["view"] == "open_orders"]
    assert result["ok"] and result["oracle"] == "DuckDB" and result["tolerances"] == []

    table = str(root / "lake" / "views" / "open_orders")
    write_deltalake(table, pa.table({"o_orderkey": [9], "o_price": [99]}), mode="append")
    code, out, _ = run(capsys, "--project", p, "verify", "--oracle", "duckdb", "open_orders")
    assert code == 1
    assert out.startswith("open_orders: DIFFERENT from DuckDB's result at epoch 1: 0 rows missing")
    assert "1 extra (e.g. [(9, 99)])" in out
    assert (
        "its log summed differs from its table: 1 rows only in the table, 0 only in the log" in out
    )
    code, out, _ = run(capsys, "--project", p, "verify", "open_orders")  # Spark's oracle
    assert code == 1 and "open_orders: DIFFERENT at epoch 1: 0 rows missing, 1 extra" in out

    code, out, err = run(capsys, "--project", p, "verify", "--oracle", "duckdb", "--repair")
    assert code == 2 and not out
    assert "--repair" in err and "--oracle spark" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as info:
        main(["--project", p, "verify", "--oracle", "sqlite"])
    assert info.value.code == 2 and "invalid choice: 'sqlite'" in capsys.readouterr().err
