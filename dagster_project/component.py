"""The Dagster component: an ``ivm.toml`` project as Dagster definitions, in the manner of
dagster-dbt's ``DbtProjectComponent``.

Owns the component's attributes (``project``, ``automation``, ``cron``, ``translation``), its
translation hook (:meth:`IvmProjectComponent.get_asset_spec`, overridable in a subclass) and
its scaffolder (``dg scaffold defs dagster_project.component.IvmProjectComponent <name>``).

Contract: the component builds exactly the Definitions :func:`dagster_project.definitions.
build_definitions` builds for the project (assets, checks, jobs, sensors, schedules, the
Spark resource, the in-process executor), each asset spec passed through
:meth:`~IvmProjectComponent.get_asset_spec`; the assets, checks, jobs and sensors follow the
translated keys. ``project`` is relative to the component's folder; omitted, it is
``$IVM_PROJECT`` or the demo project, as for ``workspace.yaml``. A code location holds one
such component: op, job and sensor names are fixed.
"""

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import dagster as dg
from dagster.components.utils.translation import TranslationFn, TranslationFnResolver
from pydantic import BaseModel

from assets.keys import IvmAsset
from dagster_project.definitions import build_definitions, default_project_path
from ivm.config import Project, load_project, with_automation


class IvmScaffoldParams(BaseModel):
    """``dg scaffold defs ... --project-path path/to/ivm.toml`` (optional)."""

    project_path: str | None = None


class IvmProjectComponentScaffolder(dg.Scaffolder[IvmScaffoldParams]):
    """Writes the component's ``defs.yaml``: ``project`` relative to the component's folder
    when ``--project-path`` is given (else omitted: ``$IVM_PROJECT`` or the demo)."""

    @classmethod
    def get_scaffold_params(cls) -> type[IvmScaffoldParams]:
        return IvmScaffoldParams

    def scaffold(self, request: dg.ScaffoldRequest[IvmScaffoldParams]) -> None:
        attributes: dict[str, str] = {}
        if request.params.project_path is not None:
            project = Path(request.params.project_path).resolve()
            attributes["project"] = os.path.relpath(project, request.target_path.resolve())
        dg.scaffold_component(request, attributes)


def _asset_vars(asset: IvmAsset) -> dict[str, IvmAsset]:
    return {"asset": asset}


@dg.scaffold_with(IvmProjectComponentScaffolder)
@dataclass
class IvmProjectComponent(dg.Component, dg.Resolvable):
    """An ivm.toml project's incrementally maintained views as Dagster assets.

    The observed sources, the epoch, the shared arrangements and one asset per view, with
    their checks, jobs, sensors and schedules (those ``dagster_project.definitions`` builds).

    Example:

        .. code-block:: yaml

            # defs.yaml
            type: dagster_project.component.IvmProjectComponent
            attributes:
              project: ../../../demo/work/project/ivm.toml
              automation: eager
              translation:
                key_prefix: tpch
                group_name: "ivm_{{ asset.kind }}"
    """

    project: Annotated[
        str | None,
        dg.Resolver.default(
            description=(
                "The project's ivm.toml (or its directory), relative to this component's "
                "folder. Omitted: $IVM_PROJECT, else the demo project."
            ),
            examples=["../../../demo/work/project/ivm.toml", "{{ env.IVM_PROJECT }}"],
        ),
    ] = None
    automation: Annotated[
        Literal["eager", "on_cron", "none"] | None,
        dg.Resolver.default(
            description=(
                "The automation condition of the epoch, arrangements and views; overrides "
                "ivm.toml's [dagster] automation."
            ),
        ),
    ] = None
    cron: Annotated[
        str | None,
        dg.Resolver.default(
            description="The cron schedule of automation on_cron; overrides [dagster] cron.",
            examples=["0 * * * *"],
        ),
    ] = None
    translation: Annotated[
        TranslationFn[IvmAsset] | None,
        TranslationFnResolver(template_vars_for_translation_fn=_asset_vars),
    ] = None

    def project_path(self, context: dg.ComponentLoadContext) -> Path:
        """The project file (or directory) this component loads."""
        if self.project is None:
            return Path(default_project_path())
        path = Path(self.project)
        return path if path.is_absolute() else (context.path / path).resolve()

    def load_project(self, context: dg.ComponentLoadContext) -> Project:
        """The project with the component's automation settings in force."""
        project = load_project(self.project_path(context))
        if self.automation is None and self.cron is None:
            return project
        return with_automation(
            project, self.automation, self.cron, f"{context.path / 'defs.yaml'}: attributes"
        )

    def get_asset_spec(self, spec: dg.AssetSpec, asset: IvmAsset) -> dg.AssetSpec:
        """The spec Dagster sees for one asset, given its default spec (key ``sources/<name>``,
        ``ivm/epoch``, ``arrangements/<name>`` or ``views/<name>``, group ``sources``,
        ``arrangements`` or ``views``): ``translation`` applied, if any. Override it in a
        subclass to change keys, groups, tags, owners, ...; dependencies, column lineage,
        checks, jobs and sensors follow the keys it returns.

        Example:

            .. code-block:: python

                class TeamIvm(IvmProjectComponent):
                    def get_asset_spec(self, spec, asset):
                        spec = super().get_asset_spec(spec, asset)
                        return spec.replace_attributes(owners=["team:lake"])
        """
        return spec if self.translation is None else self.translation(spec, asset)

    def build_defs(self, context: dg.ComponentLoadContext) -> dg.Definitions:
        return build_definitions(self.load_project(context), self.get_asset_spec)
