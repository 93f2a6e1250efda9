"""The request document of the contract (``../shared/contract/plan-api.md``), parsed and validated."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from solvers.documents import PlanKind
from solvers.errors import FieldProblem, SpecError
from solvers.specs import ClusterSpec, Constraints, ModelSpec, SizingSpec, TrainingSpec


class CostModelSpec(BaseModel):
    """Which cost model to use; kind-specific fields are kept as extras for the solver to read."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: Literal["analytic", "galvatron", "flexsp", "profile"] = "analytic"


class PlanRequestBase(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    kind: PlanKind = "hybrid"
    cluster: ClusterSpec
    constraints: Constraints = Field(default_factory=Constraints)
    cost_model: CostModelSpec = Field(default_factory=CostModelSpec)

    @field_validator("cluster")
    @classmethod
    def _groups_for_hybrid(cls, v: ClusterSpec, info: ValidationInfo) -> ClusterSpec:
        kind = info.data.get("kind", "hybrid")
        if v.groups is not None and kind != "hybrid":
            raise ValueError(f"groups (a cluster of several GPU types) is planned for kind hybrid only, not {kind}")
        return v


class HybridRequest(PlanRequestBase):
    model: ModelSpec
    training: TrainingSpec
    strategy: dict[str, Any] | None = None
    sizing: SizingSpec | None = None


def problems_from_validation(err: ValidationError, prefix: tuple[str | int, ...] = ()) -> SpecError:
    return SpecError([FieldProblem(prefix + tuple(e["loc"]), e["msg"]) for e in err.errors()])


def parse(model_cls: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` with ``model_cls``; raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError.at((), "request must be a JSON object")
    try:
        return model_cls.model_validate(data)
    except ValidationError as err:
        raise problems_from_validation(err) from None
