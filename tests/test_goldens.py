"""SQL -> plan goldens, no Spark: EXPLAIN texts and planner error messages are contracts.

Run ``pytest tests/test_goldens.py --update-goldens`` to rewrite the expected files after an
intended planner change, then review the diff. Only that flag writes them: a golden file that
is missing fails its test.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from ivm.errors import SourceError, SqlError, UpstreamBroken
from ivm.plan.explain import explain
from ivm.plan.planner import plan_views
from ivm.sql.parse import parse_view

GOLDENS = Path(__file__).parent / "goldens"


def parse_sources(text: str) -> dict[str, tuple[str, ...]]:
    """``-- sources: t(a, b); u(c)`` -> {"t": ("a", "b"), "u": ("c",)}."""
    line = next(ln for ln in text.splitlines() if ln.startswith("-- sources:"))
    out = {}
    for name, cols in re.findall(r"(\w+)\(([^)]*)\)", line):
        out[name] = tuple(c.strip() for c in cols.split(","))
    return out


def append_only(text: str) -> set[str]:
    """``-- append-only: t, u`` -> {"t", "u"} (sources with ``delta.appendOnly``)."""
    for ln in text.splitlines():
        if ln.startswith("-- append-only:"):
            return {n.strip() for n in ln.split(":", 1)[1].split(",")}
    return set()


def split_views(text: str) -> list[str]:
    body = "\n".join(
        ln for ln in text.splitlines() if not ln.startswith("-- ") or ln.startswith("-- ivm:")
    )
    return [s.strip() for s in body.split(";") if s.strip()]


def check_golden(expected_file: Path, actual: str, update: bool) -> None:
    """``actual`` must equal the golden file's text. Only ``--update-goldens`` writes golden
    files: a missing one fails, saying how to create it."""
    if update:
        expected_file.write_text(actual)
    elif not expected_file.exists():
        pytest.fail(
            f"golden file {expected_file} is missing: create it with `.venv/bin/python -m "
            "pytest tests/test_goldens.py --update-goldens`, review it, and commit it",
            pytrace=False,
        )
    assert actual == expected_file.read_text()


@pytest.mark.parametrize("path", sorted((GOLDENS / "explain").glob("*.sql")), ids=lambda p: p.stem)
def test_explain_golden(path: Path, update_goldens: bool) -> None:
    text = path.read_text()
    views = [parse_view(sql, f"{i}.sql") for i, sql in enumerate(split_views(text))]
    plan = plan_views(views, parse_sources(text), append_only(text)).check()
    actual = "\n".join(explain(v, plan) for v in plan.views.values())
    check_golden(path.with_suffix(".explain"), actual, update_goldens)


def test_a_missing_golden_fails_and_only_the_flag_writes_it(tmp_path: Path) -> None:
    golden = tmp_path / "new.explain"
    with pytest.raises(pytest.fail.Exception, match="--update-goldens") as info:
        check_golden(golden, "plan", update=False)
    assert "is missing" in str(info.value) and not golden.exists()
    check_golden(golden, "plan", update=True)
    assert golden.read_text() == "plan"
    check_golden(golden, "plan", update=False)
    with pytest.raises(AssertionError):
        check_golden(golden, "other plan", update=False)


def error_cases() -> list[tuple[str, str]]:
    text = (GOLDENS / "errors.sql").read_text()
    cases = re.split(r"^-- case: (.*)$", text, flags=re.M)
    return [(cases[i].strip(), cases[i + 1].strip()) for i in range(1, len(cases), 2)]


def test_error_goldens(update_goldens: bool) -> None:
    sources = parse_sources((GOLDENS / "errors.sql").read_text())
    lines = []
    for title, sql in error_cases():
        with pytest.raises(SqlError) as info:
            plan_views([parse_view(sql, "v.sql")], sources).check()
        lines.append(f"{title}: {info.value}")
    actual = "\n".join(lines) + "\n"
    check_golden(GOLDENS / "errors.expected", actual, update_goldens)


def test_error_carries_position() -> None:
    with pytest.raises(SqlError) as info:
        plan_views(
            [parse_view("CREATE VIEW v AS\nSELECT a,\n       nope\nFROM t", "v.sql")], {"t": ("a",)}
        ).check()
    assert (info.value.file, info.value.line, info.value.col) == ("v.sql", 3, 8)


def test_unsupported_names_construct() -> None:
    with pytest.raises(SqlError) as info:
        plan_views(
            [parse_view("CREATE VIEW v AS SELECT a FROM t LIMIT 3", "v.sql")], {"t": ("a",)}
        ).check()
    assert info.value.construct == "LIMIT without ORDER BY"


def test_cycle_between_views_is_rejected() -> None:
    a = parse_view("CREATE VIEW a AS SELECT x FROM b", "a.sql")
    b = parse_view("CREATE VIEW b AS SELECT x FROM a", "b.sql")
    with pytest.raises(SqlError, match="cycle"):
        plan_views([a, b], {"t": ("x",)})


def test_demand_reads_only_used_columns() -> None:
    plan = plan_views(
        [parse_view("CREATE VIEW v AS SELECT b + 1 AS c FROM t WHERE d > 0", "v.sql")],
        {"t": ("a", "b", "c", "d")},
    )
    (get,) = plan.views["v"].gets
    assert get.columns == ("b", "d")


def test_code_version_ignores_formatting() -> None:
    one = parse_view("CREATE VIEW v AS SELECT a FROM t WHERE b > 1", "v.sql")
    two = parse_view("create view v as\n  select a\n  from t\n  where b > 1", "v.sql")
    three = parse_view("CREATE VIEW v AS SELECT a FROM t WHERE b > 2", "v.sql")
    assert one.sql_hash == two.sql_hash != three.sql_hash


def test_a_broken_view_sets_aside_itself_and_its_dependents_only() -> None:
    views = [
        parse_view("CREATE VIEW good AS SELECT a FROM t", "good.sql"),
        parse_view("CREATE VIEW bad AS SELECT nope FROM t", "bad.sql"),
        parse_view("CREATE VIEW after_bad AS SELECT nope FROM bad", "after_bad.sql"),
        parse_view("CREATE VIEW after_good AS SELECT a FROM good", "after_good.sql"),
        parse_view("CREATE VIEW from_u AS SELECT a FROM u", "from_u.sql"),
    ]
    plan = plan_views(views, {"t": ("a",)}, broken_sources={"u": SourceError("gone")})
    assert list(plan.order) == ["good", "after_good"]
    assert "bad.sql:1:27: unknown column 'nope'" in str(plan.broken["bad"])
    assert isinstance(plan.broken["after_bad"], UpstreamBroken)
    assert "waits for view 'bad'" in str(plan.broken["after_bad"])
    assert str(plan.broken["from_u"]) == "from_u.sql: view 'from_u' reads source 'u': gone"
    with pytest.raises(SqlError, match="unknown column 'nope'"):
        plan.check()


def test_lowering_leaves_the_parsed_view_as_written() -> None:
    """Planning twice from one parse gives the same plan: lowering rewrites copies (QUALIFY's
    inline ROW_NUMBER() included), never the parsed query."""
    sql = (
        "CREATE VIEW v AS SELECT o_custkey, o_orderkey FROM orders "
        "QUALIFY row_number() OVER (PARTITION BY o_custkey ORDER BY o_orderkey) <= 2"
    )
    view = parse_view(sql, "v.sql")
    before = view.query.sql(dialect="spark")
    sources = {"orders": ("o_orderkey", "o_custkey")}
    first = plan_views([view], sources).views["v"].root
    assert view.query.sql(dialect="spark") == before
    assert "ROW_NUMBER()" in before
    assert plan_views([view], sources).views["v"].root == first
