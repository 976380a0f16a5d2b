"""Delta-join planning: one update path per join input, each with its own lookup order.

Owns the decisions of seed 001: for ``V = A ⋈ B ⋈ C`` the change over ``(old, new]`` is

    ΔA ⋈ B(old) ⋈ C(old)  +  A(new) ⋈ ΔB ⋈ C(old)  +  A(new) ⋈ B(new) ⋈ ΔC

so each path starts from one input's updates and looks the others up in their arrangements,
inputs before it (in FROM order) at the new time and inputs after it at the old one: changes
to several inputs in one epoch are then counted exactly once. Each path orders its lookups
greedily, always joining next an input linked to what is already joined by the most key
columns (ties: FROM order), and applies each residual predicate as soon as all its inputs are
joined. No intermediate result is stored: the only state is the arrangements, shared by every
path and view that needs the same collection by the same key.

Contract in ``(data, time, diff)`` terms: the sum over paths of each path's output is the
join's change; every output update carries time ``new`` and diff = product of its parts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from sqlglot import exp

from ivm.errors import UnsupportedSqlError
from ivm.plan.ir import CollectionKind, Join, JoinInput, referenced_columns


@dataclass(frozen=True, slots=True, order=True)
class ArrangementKey:
    """Names an arrangement: a collection indexed by some of its columns."""

    collection: str
    kind: CollectionKind
    key: tuple[str, ...]

    @property
    def name(self) -> str:
        """Its table name under ``arrangements/``, e.g. ``lineitem__by__l_orderkey``."""
        return f"{self.collection}__by__{'__'.join(self.key)}"

    def __str__(self) -> str:
        return f"{self.collection}[{', '.join(self.key)}]"


@dataclass(frozen=True, slots=True)
class LookupStage:
    """One step of a path: join the stream with input ``input`` through an arrangement.

    Attributes:
        input: the join input looked up.
        arrangement: the arrangement read.
        stream_keys: the stream's columns matched, in the arrangement's key order.
        input_keys: the input's (output) columns matched, same order.
        as_of: read the arrangement at the ``new`` time (input before the path's) or ``old``.
        residual: predicates applied right after this stage.
    """

    input: int
    arrangement: ArrangementKey
    stream_keys: tuple[str, ...]
    input_keys: tuple[str, ...]
    as_of: Literal["new", "old"]
    residual: tuple[exp.Expression, ...] = ()
    null_safe: tuple[bool, ...] = ()
    """Per key pair, whether NULL matches NULL (``<=>``); empty: none does."""

    def matches(self) -> tuple[tuple[str, str, bool], ...]:
        """``(stream key, input key, NULL-safe)`` per key pair."""
        flags = self.null_safe or (False,) * len(self.stream_keys)
        return tuple(zip(self.stream_keys, self.input_keys, flags, strict=True))


@dataclass(frozen=True, slots=True)
class DeltaPath:
    """The update path that starts from input ``source``'s changes."""

    source: int
    stages: tuple[LookupStage, ...]


def _links(join: Join, joined: set[int], j: int) -> list[tuple[str, str, bool]]:
    """``(joined column, j's column, NULL-safe)`` linking input ``j`` to the joined set."""
    pairs = []
    for k, cls in enumerate(join.equivalences):
        mine = [c for i, c in cls if i == j]
        theirs = [c for i, c in cls if i in joined]
        if mine and theirs:
            pairs.append((theirs[0], mine[0], join.class_null_safe(k)))
    return pairs


def _residual_owners(join: Join, r: exp.Expression) -> set[int]:
    return {join.owner(c) for c in referenced_columns(r)}


def plan_paths(join: Join, view: str = "") -> tuple[DeltaPath, ...]:
    """One :class:`DeltaPath` per input.

    Raises:
        UnsupportedSqlError: a join key is computed rather than a column of its collection
            (arrangements index collections by their columns).
    """
    paths = []
    for start in range(len(join.inputs)):
        joined = {start}
        pending = list(join.residual)
        stages = []
        while len(joined) < len(join.inputs):
            best = max(
                (j for j in range(len(join.inputs)) if j not in joined),
                key=lambda j: (len(_links(join, joined, j)), -j),
            )
            links = _links(join, joined, best)
            inp = join.inputs[best]
            key_cols = []
            for _, mine, _ in links:
                col = inp.source_column(mine)
                if col is None:
                    raise UnsupportedSqlError(
                        f"{view + ': ' if view else ''}join key {mine.split('__', 1)[-1]!r} of "
                        f"{inp.alias} is computed; arrangements index columns, so compute it "
                        "in a view and join that view",
                        construct="computed join key",
                    )
                key_cols.append(col)
            joined.add(best)
            ready = tuple(r for r in pending if _residual_owners(join, r) <= joined)
            pending = [r for r in pending if r not in ready]
            stages.append(
                LookupStage(
                    input=best,
                    arrangement=ArrangementKey(inp.get.collection, inp.get.kind, tuple(key_cols)),
                    stream_keys=tuple(s for s, _, _ in links),
                    input_keys=tuple(m for _, m, _ in links),
                    as_of="new" if best < start else "old",
                    residual=ready,
                    null_safe=tuple(n for _, _, n in links) if join.null_safe else (),
                )
            )
        paths.append(DeltaPath(start, tuple(stages)))
    return tuple(paths)


def arrangement_needs(
    join: Join, view: str = ""
) -> Iterable[tuple[ArrangementKey, tuple[str, ...]]]:
    """Every arrangement the join's paths read, with the collection columns it must hold."""
    for path in plan_paths(join, view):
        for stage in path.stages:
            yield stage.arrangement, join.inputs[stage.input].get.columns


def shared_lookups(
    paths: Sequence[DeltaPath], depth: int, old: int, new: int
) -> dict[tuple[ArrangementKey, int], list[int]]:
    """The paths advance stage by stage together, so the stages at ``depth`` that read one
    arrangement at one time share a single lookup with the union of their keys:
    ``(arrangement, time) -> indexes of the paths`` whose stage reads it."""
    shared: dict[tuple[ArrangementKey, int], list[int]] = {}
    for i, path in enumerate(paths):
        stage = path.stages[depth]
        at = new if stage.as_of == "new" else old
        shared.setdefault((stage.arrangement, at), []).append(i)
    return shared


KeyPair = tuple[str, str, bool]
"""``(this input's column, the other input's column, NULL-safe)``: one key of a two-input
join or semi-join, matched by ``=``, or by ``<=>`` where NULL-safe."""


def key_pairs(join: Join, side: int) -> list[KeyPair]:
    """The keys of a two-input join from input ``side``'s point of view (an outer join's
    unmatched rows of ``side`` are its anti-join with the other input on these)."""
    other = 1 - side
    pairs = []
    for k, cls in enumerate(join.equivalences):
        mine = [c for i, c in cls if i == side]
        theirs = [c for i, c in cls if i == other]
        if mine and theirs:
            pairs.append((mine[0], theirs[0], join.class_null_safe(k)))
    return pairs


def count_stage(inp: JoinInput, keys: Sequence[str], null_safe: Sequence[bool] = ()) -> LookupStage:
    """A lookup of ``inp``'s arrangement by its (output) columns ``keys``: the match counts
    of outer and semi-joins read the rows of the keys a change touched through it."""
    cols = tuple(inp.source_column(k) or k for k in keys)
    arrangement = ArrangementKey(inp.get.collection, inp.get.kind, cols)
    safe = tuple(null_safe) if any(null_safe) else ()
    return LookupStage(0, arrangement, tuple(keys), tuple(keys), "new", null_safe=safe)
