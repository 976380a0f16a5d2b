"""Parsing view files: one ``CREATE VIEW name AS SELECT ...`` per ``.sql`` file (Spark dialect).

Owns turning text into a sqlglot AST and turning positions in that AST into ``line:col``
for error messages. Knows nothing of collections or updates; :mod:`ivm.sql.lower` gives the
AST its ``(data, time, diff)`` meaning.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from pathlib import Path

import sqlglot
from sqlglot import exp
from sqlglot.errors import ParseError, TokenError

from ivm.errors import SqlError, UnsupportedSqlError

DIALECT = "spark"

_HINT = re.compile(r"^\s*--\s*ivm:\s*(.*)$", re.MULTILINE | re.IGNORECASE)
HINTS = {
    "expected_group_size": (
        "the expected number of distinct MIN/MAX values (or TopK rows) per group: a tower's height"
    ),
    "topk_spare": "rows a TopK keeps per group beyond its limit, against deletions",
}


def position(node: exp.Expression | None, sql: str) -> tuple[int | None, int | None]:
    """1-based ``(line, column)`` where ``node`` starts in ``sql``, if sqlglot recorded it.

    sqlglot keeps token offsets on identifiers and literals; for other nodes the first
    descendant that has one stands in.

    >>> q = "SELECT a,\\n  b FROM t"
    >>> position(sqlglot.parse_one(q).expressions[1], q)
    (2, 3)
    """
    if node is None:
        return None, None
    for n in node.walk():
        start = n.meta.get("start") if hasattr(n, "meta") else None
        if isinstance(start, int):
            line = sql.count("\n", 0, start) + 1
            col = start - (sql.rfind("\n", 0, start) + 1) + 1
            return line, col
    return None, None


def sql_error(
    message: str,
    node: exp.Expression | None,
    sql: str,
    *,
    unsupported: bool = False,
    construct: str | None = None,
) -> SqlError:
    """A :class:`SqlError` (or :class:`UnsupportedSqlError`) located at ``node``."""
    line, col = position(node, sql)
    cls = UnsupportedSqlError if unsupported else SqlError
    return cls(message, line=line, col=col, construct=construct)


@dataclass(frozen=True, slots=True)
class ParsedView:
    """A view file parsed to its query.

    Attributes:
        name: the view name (lowercase).
        file: the ``.sql`` file.
        sql: the file's full text (positions refer to it).
        query: the ``SELECT``/``UNION`` after ``AS``.
        sql_hash: short hash of the normalized query; the view's code version.
    """

    name: str
    file: str
    sql: str
    query: exp.Expression

    @property
    def hints(self) -> dict[str, str]:
        """``-- ivm: name = value`` comment lines of the file, by name.

        Raises:
            SqlError: a hint line that is not ``name = value``, or an unknown name.
        """
        out: dict[str, str] = {}
        for m in _HINT.finditer(self.sql):
            line = self.sql.count("\n", 0, m.start()) + 1
            name, eq, value = m.group(1).partition("=")
            name = name.strip().lower()
            if not eq or not value.strip():
                raise SqlError(
                    f"hint {m.group(1).strip()!r} is not 'name = value'", file=self.file, line=line
                )
            if name not in HINTS:
                known = ", ".join(HINTS)
                raise SqlError(f"unknown hint {name!r} (known: {known})", file=self.file, line=line)
            out[name] = value.strip()
        return out

    @property
    def sql_hash(self) -> str:
        normalized = self.query.sql(dialect=DIALECT, normalize=True)
        if self.hints:  # they shape the view's state, so they are part of its definition
            normalized += repr(sorted(self.hints.items()))
        return hashlib.sha256(normalized.encode()).hexdigest()[:16]


def parse_view(sql: str, file: str = "<sql>") -> ParsedView:
    """Parse one view definition.

    Args:
        sql: the text of the file.
        file: its path, for messages.

    Raises:
        SqlError: the text is not exactly one ``CREATE VIEW name AS <query>``.
    """
    try:
        statements = [s for s in sqlglot.parse(sql, dialect=DIALECT) if s is not None]
    except ParseError as e:
        first = e.errors[0] if e.errors else {}
        desc = str(first.get("description", e)).split(". Line")[0]
        if "<Token" in desc:
            desc = desc.split("<Token")[0].strip() + f" {first.get('highlight', '')!r}".rstrip()
        raise SqlError(
            f"syntax error: {desc}", file=file, line=first.get("line"), col=first.get("col")
        ) from e
    except TokenError as e:
        raise SqlError(f"syntax error: {e}", file=file) from e
    if len(statements) != 1:
        raise SqlError(
            f"expected exactly one CREATE VIEW statement, found {len(statements)}", file=file
        )
    stmt = statements[0]
    if not isinstance(stmt, exp.Create) or str(stmt.args.get("kind", "")).upper() != "VIEW":
        line, col = position(stmt, sql)
        raise SqlError("expected CREATE VIEW name AS SELECT ...", file=file, line=line, col=col)
    target = stmt.this
    if isinstance(target, exp.Schema):  # CREATE VIEW v (a, b) AS ...
        raise sql_error(
            "a column list after the view name is not supported; alias the SELECT columns",
            target,
            sql,
            unsupported=True,
            construct="CREATE VIEW column list",
        ).located(file)
    query = stmt.expression
    if isinstance(query, exp.Values):  # CREATE VIEW v AS VALUES …: its rows
        query = exp.select("*").from_(query)
    if not isinstance(query, exp.Query):
        raise SqlError("CREATE VIEW needs AS SELECT ...", file=file)
    name = target.name.lower()
    if not name:
        raise SqlError("CREATE VIEW needs a view name", file=file)
    return ParsedView(name=name, file=file, sql=sql, query=query)


def parse_view_file(path: Path) -> ParsedView:
    """Parse a ``.sql`` view file; errors name the file."""
    return parse_view(path.read_text(), str(path))
