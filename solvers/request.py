"""The request document of the contract (``../shared/contract/plan-api.md``), parsed and validated."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from solvers.documents import PlanKind
from solvers.errors import FieldProblem, SpecError
from solvers.specs import ClusterSpec, Constraints, ModelSpec, SizingSpec, TrainingSpec
from solvers.unknown_keys import known_keys, unknown_key_message, where

CostModelKind = Literal["analytic", "galvatron", "flexsp", "profile"]


class CostModelSpec(BaseModel):
    """Which cost model to use; kind-specific fields are kept as extras for the solver to read (which extras a
    plan kind's cost models read: its request's ``COST_MODELS``)."""

    model_config = ConfigDict(extra="allow", frozen=True)
    kind: CostModelKind = "analytic"


# what the analytic cost model reads besides its kind (solvers.cost_model.factory and .profile)
# calibration_set: a stored set the service resolves into resolved_calibration_set (solvers.cost_model.calibration)
ANALYTIC_EXTRAS = frozenset({"calibration", "profile", "profile_path", "calibration_set", "resolved_calibration_set"})


class PlanRequestBase(BaseModel):
    # every key of a request is one the planner reads: a misspelt one is refused, never ignored
    model_config = ConfigDict(extra="forbid", frozen=True)
    # the cost model kinds a plan kind takes, each with the cost_model keys (besides CostModelSpec's fields) it
    # reads; None: the kind's own model validates them (extra="forbid" there)
    COST_MODELS: ClassVar[Mapping[str, frozenset[str] | None]] = {"analytic": frozenset()}
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

    def cost_model_problems(self) -> list[FieldProblem]:
        """A cost model kind this plan kind does not take, or a cost_model key its cost model does not read."""
        kind = self.cost_model.kind
        if kind not in self.COST_MODELS:
            takes = " or ".join(f"'{k}'" for k in self.COST_MODELS)
            return [FieldProblem(("cost_model", "kind"),
                                 f"the {self.kind} planner takes cost_model kind {takes}, not '{kind}'")]
        extras = self.COST_MODELS[kind]
        if extras is None:
            return []
        known = sorted({*CostModelSpec.model_fields, *extras})
        return [FieldProblem(("cost_model", key), unknown_key_message(key, known, f"cost_model (kind '{kind}')"))
                for key in self.cost_model.model_extra or {} if key not in extras]


class HybridRequest(PlanRequestBase):
    COST_MODELS: ClassVar[Mapping[str, frozenset[str] | None]] = {
        "analytic": ANALYTIC_EXTRAS, "profile": ANALYTIC_EXTRAS, "galvatron": None}
    model: ModelSpec
    training: TrainingSpec
    strategy: dict[str, Any] | None = None
    sizing: SizingSpec | None = None


def problems_from_validation(err: ValidationError, prefix: tuple[str | int, ...] = (),
                             model: type[BaseModel] | None = None) -> SpecError:
    """Each of pydantic's errors as a problem at its field under ``prefix``; an unknown key (``extra="forbid"``)
    names where it is and the closest key ``model`` knows there."""
    problems = []
    for e in err.errors():
        loc = tuple(e["loc"])
        msg = e["msg"]
        if e["type"] == "extra_forbidden" and loc:
            known = known_keys(model, loc[:-1]) if model is not None else []
            msg = unknown_key_message(loc[-1], known, where(prefix + loc[:-1]))
        problems.append(FieldProblem(prefix + loc, msg))
    return SpecError(problems)


def parse(model_cls: type[BaseModel], data: Any) -> Any:
    """Validate ``data`` with ``model_cls``; raise SpecError naming every bad field."""
    if not isinstance(data, dict):
        raise SpecError.at((), "request must be a JSON object")
    try:
        req = model_cls.model_validate(data)
    except ValidationError as err:
        raise problems_from_validation(err, model=model_cls) from None
    if isinstance(req, PlanRequestBase) and (problems := req.cost_model_problems()):
        raise SpecError(problems)
    return req
