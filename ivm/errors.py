"""The one error root of the engine and its subclasses.

Every failure the engine reports on purpose is an :class:`IvmError`. User-input errors also
subclass the matching builtin (``ValueError``, ``FileNotFoundError``) so callers that only know
Python's builtins still catch them. Each message is one line that names the file, the object
and, for SQL, the line and column; the CLI prints exactly ``str(error)``.

Contract in ``(data, time, diff)`` terms: an error raised before a commit leaves every table as
it was (no update at any time is written); :class:`InvariantViolation` is raised instead of
committing updates that would make some multiplicity negative.
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


class ViewNotFoundError(IvmError, KeyError):
    """A view name given on the command line or to the API does not exist in the project."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""
