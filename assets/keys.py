"""Asset identities: what each asset of a project is, its default key, the translation hook
that may change its spec (key, group, tags, ...), and the keys in force after translation.

Contract: every asset is an :class:`IvmAsset` (kind and name). Its default key is
``sources/<name>``, ``ivm/epoch``, ``arrangements/<collection>_by_<column>`` or
``views/<name>``. A :data:`Translator` (the Dagster component's ``translation`` or
``get_asset_spec``) maps each default spec to the spec Dagster sees; :class:`AssetKeys` then
answers every question the assets, checks, jobs and sensors ask about keys (which key a view
has, which view a key is), so no other module assumes the default keys.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

import dagster as dg

from ivm.plan.join import ArrangementKey

AssetKind = Literal["source", "epoch", "arrangement", "view"]


@dataclass(frozen=True)
class IvmAsset:
    """One asset of a project, as a translation hook sees it (template variable ``asset``).

    Attributes:
        kind: ``source``, ``epoch``, ``arrangement`` or ``view``.
        name: the source's or view's name; ``epoch``; an arrangement's
            ``<collection>_by_<column>[_and_<column>...]``.
    """

    kind: AssetKind
    name: str


EPOCH = IvmAsset("epoch", "epoch")

Translator = Callable[[dg.AssetSpec, IvmAsset], dg.AssetSpec]
"""Maps an asset's default spec to the spec Dagster sees (a translation hook)."""

_PREFIX: dict[AssetKind, list[str]] = {
    "source": ["sources"],
    "epoch": ["ivm"],
    "arrangement": ["arrangements"],
    "view": ["views"],
}


def arrangement_asset(key: ArrangementKey) -> IvmAsset:
    return IvmAsset("arrangement", f"{key.collection}_by_{'_and_'.join(key.key)}")


def default_key(asset: IvmAsset) -> dg.AssetKey:
    return dg.AssetKey([*_PREFIX[asset.kind], asset.name])


class AssetKeys:
    """The key of each asset after translation (the default key when not translated)."""

    def __init__(self, keys: Mapping[IvmAsset, dg.AssetKey] | None = None) -> None:
        self._keys = dict(keys or {})
        self._assets = {k: a for a, k in self._keys.items()}
        if len(self._assets) != len(self._keys):
            counts = Counter(self._keys.values())
            dupes = sorted(k.to_user_string() for k, n in counts.items() if n > 1)
            raise dg.DagsterInvalidDefinitionError(
                f"the translation gives several assets the same key: {', '.join(dupes)}"
            )
        self._by_default = {default_key(a): k for a, k in self._keys.items()}

    def of(self, asset: IvmAsset) -> dg.AssetKey:
        return self._keys.get(asset) or default_key(asset)

    def source(self, name: str) -> dg.AssetKey:
        return self.of(IvmAsset("source", name))

    def view(self, name: str) -> dg.AssetKey:
        return self.of(IvmAsset("view", name))

    def arrangement(self, key: ArrangementKey) -> dg.AssetKey:
        return self.of(arrangement_asset(key))

    @property
    def epoch(self) -> dg.AssetKey:
        return self.of(EPOCH)

    def asset(self, key: dg.AssetKey) -> IvmAsset:
        """The asset a (translated) key names."""
        found = self._assets.get(key)
        if found is None:
            raise KeyError(f"no asset of the project has key {key.to_user_string()}")
        return found

    def translated(self, key: dg.AssetKey) -> dg.AssetKey:
        """An asset's key after translation, given its default key (other keys unchanged)."""
        return self._by_default.get(key, key)

    def of_kinds(self, *kinds: AssetKind) -> list[dg.AssetKey]:
        return [k for a, k in self._keys.items() if a.kind in kinds]


def _retarget(spec: dg.AssetSpec, keys: AssetKeys) -> dg.AssetSpec:
    """A translated spec whose dependencies and column lineage name translated keys."""
    deps = [
        dg.AssetDep(keys.translated(d.asset_key), partition_mapping=d.partition_mapping)
        for d in spec.deps
    ]
    lineage = spec.metadata.get("dagster/column_lineage")
    metadata = dict(spec.metadata)
    if isinstance(lineage, dg.TableColumnLineage):
        metadata["dagster/column_lineage"] = retarget_lineage(lineage, keys)
    return spec.replace_attributes(deps=deps, metadata=metadata)


def retarget_lineage(lineage: dg.TableColumnLineage, keys: AssetKeys) -> dg.TableColumnLineage:
    return dg.TableColumnLineage(
        deps_by_column={
            column: [dg.TableColumnDep(keys.translated(d.asset_key), d.column_name) for d in deps]
            for column, deps in lineage.deps_by_column.items()
        }
    )


def translate(
    specs: Mapping[IvmAsset, dg.AssetSpec], translator: Translator | None
) -> tuple[dict[IvmAsset, dg.AssetSpec], AssetKeys]:
    """Every asset's spec after ``translator`` (None: unchanged), its dependencies and column
    lineage following the translated keys; and those keys.

    Raises:
        DagsterInvalidDefinitionError: two assets were given the same key.
    """
    if translator is None:
        return dict(specs), AssetKeys({a: s.key for a, s in specs.items()})
    translated = {a: translator(s, a) for a, s in specs.items()}
    keys = AssetKeys({a: s.key for a, s in translated.items()})
    return {a: _retarget(s, keys) for a, s in translated.items()}, keys
