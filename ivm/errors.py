"""The one error root of the engine and its subclasses.

Every failure the engine reports on purpose is an :class:`IvmError`. User-input errors also
subclass the matching builtin (``ValueError``, ``FileNotFoundError``) so callers that only know
Python's builtins still catch them. Each message is one line that names the file, the object
and, for SQL, the line and column; the CLI prints exactly ``str(error)``.

Contract in ``(data, time, diff)`` terms: an error raised before a commit leaves every table as
it was (no update at any time is written); :class:`InvariantViolation` is raised instead of
committing updates that would make some multiplicity negative; :class:`EvaluationError` is
raised instead of committing a view's updates when its SQL fails on one of their rows.
"""

from __future__ import annotations


class IvmError(Exception):
    """Root of every error the engine raises on purpose."""


class ConfigError(IvmError, ValueError):
    """``ivm.toml`` is missing, malformed, or names something that is not there."""


class SqlError(IvmError, ValueError):
    """A view's SQL is invalid or uses a construct the planner does not support.

    Attributes:
        file: the ``.sql`` file, when known.
        line: 1-based line of the offending construct, when known.
        col: 1-based column of the offending construct, when known.
        construct: the SQL construct at fault (``"JOIN"``, ``"column o.x"``, ...).
    """

    def __init__(
        self,
        message: str,
        *,
        file: str | None = None,
        line: int | None = None,
        col: int | None = None,
        construct: str | None = None,
    ) -> None:
        self.file = file
        self.line = line
        self.col = col
        self.construct = construct
        self.bare_message = message
        where = ""
        if file:
            where = file
            if line is not None:
                where += f":{line}"
                if col is not None:
                    where += f":{col}"
            where += ": "
        super().__init__(where + message)

    def located(self, file: str) -> SqlError:
        """The same error, attributed to ``file`` if it names none yet."""
        if self.file:
            return self
        return SqlError(
            self.bare_message, file=file, line=self.line, col=self.col, construct=self.construct
        )


class UpstreamBroken(IvmError):
    """A view cannot be planned or refreshed because a view it reads is broken; it waits."""


class UnsupportedSqlError(SqlError):
    """Valid SQL, but a construct the planner cannot maintain (yet); names the construct."""


class SourceError(IvmError):
    """A source table cannot be read as the epoch requires (missing, no CDF, vacuumed, ...)."""


class SourceNotFoundError(SourceError, FileNotFoundError):
    """A configured source path holds no Delta table."""


class ContractError(SourceError):
    """A source's schema differs from the pandera schema declared for it in ``[contracts]``."""


class ChangeFeedError(SourceError):
    """The change feed of a source cannot give the updates of a version range."""


class LakeError(IvmError):
    """The system's own tables are missing, corrupt or inconsistent."""


class CommitConflictError(LakeError):
    """A commit kept conflicting with concurrent writers after all retries."""


class InvariantViolation(IvmError):
    """An internal invariant failed (e.g. a multiplicity would become negative). A bug: report it."""


class NotOnDriver(IvmError):
    """The driver cannot compute this part of a plan exactly as Spark would (an expression it
    does not evaluate, floating point, a decimal past 38 digits, an overflow); Spark computes
    it instead. Internal: the engine catches it, it never reaches a user."""


class EvaluationError(IvmError, ArithmeticError):
    """A view's expression fails on a row as Spark SQL (ANSI mode) fails it: an overflow, a
    division by zero, text that is not a number. The view's refresh stops before its commit.

    Attributes:
        kind: ``"overflow"``, ``"division by zero"`` or ``"invalid input"``.
        operation: the failing expression (Spark SQL text), when known.
        detail: what failed (``"9.99 does not fit decimal(2,1)"``), when known.
        view: the view whose refresh failed, when known.
        column: the view's output column (or ``"WHERE"``) computing it, when known.
        condition: Spark's error condition (``"ARITHMETIC_OVERFLOW"``) when Spark raised it.
    """

    def __init__(
        self,
        kind: str,
        *,
        operation: str | None = None,
        detail: str | None = None,
        view: str | None = None,
        column: str | None = None,
        condition: str | None = None,
    ) -> None:
        self.kind = kind
        self.operation = operation
        self.detail = detail
        self.view = view
        self.column = column
        self.condition = condition
        where = ", ".join(
            part
            for part in (
                f"view {view!r}" if view else "",
                f"column {column!r}" if column else "",
            )
            if part
        )
        message = kind + (f" in {operation}" if operation else "")
        message += f": {detail}" if detail else ""
        message += f" (Spark: {condition})" if condition else ""
        super().__init__(f"{where}: {message}" if where else message)

    def located(self, **known: str | None) -> EvaluationError:
        """The same error, with the attributes in ``known`` (``view``, ``column``,
        ``operation``, ``detail``, ``condition``) filled in where it has none yet."""
        fields = {
            "operation": self.operation,
            "detail": self.detail,
            "view": self.view,
            "column": self.column,
            "condition": self.condition,
        }
        for name, value in known.items():
            if fields.get(name) is None:
                fields[name] = value
        return EvaluationError(self.kind, **fields)


class ViewNotFoundError(IvmError, KeyError):
    """A view name given on the command line or to the API does not exist in the project."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
