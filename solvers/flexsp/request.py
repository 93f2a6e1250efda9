"""The ``kind = "flexsp"`` request of the contract, validated; errors name the field."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from solvers.errors import InfeasibleError
from solvers.flexsp.constants import FlexSPConstants, derived_constants, explicit_constants
from solvers.request import PlanRequestBase, parse, problems_from_validation
from solvers.specs import MAX_BANDWIDTH, MAX_SEQ_LENGTH, ModelSpec, Precision, memory_limit_bytes

MIN_ALLTOALL_GBPS = 1e-3  # (1 MB/s; 1e-300 overflowed CP-SAT's integer coefficients)


class BatchSpec(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    sequence_lengths: list[int] = Field(min_length=1, max_length=1_000_000)

    @field_validator("sequence_lengths")
    @classmethod
    def _positive(cls, v: list[int]) -> list[int]:
        bad = [i for i, s in enumerate(v) if s <= 0 or s > MAX_SEQ_LENGTH]
        if bad:
            raise ValueError(f"lengths must be 1..{MAX_SEQ_LENGTH:,} tokens (the specs' limit; 10^20 overflowed the "
                             f"cost table); index {bad[0]} is {v[bad[0]]}")
        return v


class FlexSPCostForm(BaseModel):
    """The reference's explicit constants (``cost_model.kind = "flexsp"``)."""

    # Physical ranges, well around the reference's values (5.1e-6, 0.18, 629, 4.5, 7.1, 5-120 GB/s): a constant
    # near the float limits (1e300, 1e-300, Infinity) overflowed the cost table or the solvers' integer scaling.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    kind: Literal["flexsp"] = "flexsp"
    alpha1_ms_per_token2: float = Field(ge=0, le=1.0)
    alpha2_ms_per_token: float = Field(ge=0, le=1e4)
    beta_ms: float = Field(ge=0, le=1e7)
    activation_mb_per_token: float = Field(ge=1e-6, le=1e6)
    params_billion: float = Field(gt=0, le=1e5)
    alltoall_GBps_by_group_size: dict[str, float] = Field(min_length=1)

    @model_validator(mode="after")
    def _some_compute(self) -> FlexSPCostForm:
        if self.alpha1_ms_per_token2 + self.alpha2_ms_per_token < 1e-12:
            # (zero work: every packing costs nothing and the filling found no best one)
            raise ValueError("alpha1_ms_per_token2 and alpha2_ms_per_token are both 0: a sequence must take time")
        return self

    @field_validator("alltoall_GBps_by_group_size")
    @classmethod
    def _sizes(cls, v: dict[str, float]) -> dict[str, float]:
        for k, bw in v.items():
            if not k.isdigit() or int(k) < 2:
                raise ValueError(f"group size {k!r} must be an integer ≥ 2 (sizes that do not tile the "
                                 f"cluster in node-aligned blocks are ignored)")
            if not MIN_ALLTOALL_GBPS <= bw <= MAX_BANDWIDTH:
                raise ValueError(f"bandwidth for group size {k} must be {MIN_ALLTOALL_GBPS:g}..{MAX_BANDWIDTH:g} GB/s, "
                                 f"got {bw}")
        return v


class SolverOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)
    milp: Literal["cpsat", "highs", "cbc", "none"] = "cpsat"
    max_deterministic_time_s: float = Field(default=0.05, gt=0, le=60)
    max_nodes: int = Field(default=2000, gt=0)
    max_buckets: int = Field(default=16, ge=2, le=256)
    exact_up_to: int = Field(default=24, ge=1, le=512)
    max_sequences: int = Field(default=24, ge=1)
    max_runs: int = Field(default=2, ge=0)
    # Largest SP degree a group may have (e.g. the head count, for Ulysses); None: the cost model's.
    max_sp: int | None = Field(default=None, ge=1)


class FlexSPRequest(PlanRequestBase):
    # the reference's explicit form (FlexSPCostForm), or constants derived from the specs
    COST_MODELS: ClassVar[Mapping[str, frozenset[str] | None]] = {"flexsp": None, "analytic": frozenset()}
    model: ModelSpec
    batch: BatchSpec
    precision: Precision = "bf16"
    solver: SolverOptions = Field(default_factory=SolverOptions)


def parse_request(data: Any) -> tuple[FlexSPRequest, FlexSPConstants]:
    """Validate a request and resolve its cost-model constants (explicit form or derived from specs)."""
    req: FlexSPRequest = parse(FlexSPRequest, data)
    zero = 3 if req.constraints.zero is None else req.constraints.zero
    mem = memory_limit_bytes(req.cluster, req.constraints) / 2**30
    kind = req.cost_model.kind
    if kind == "flexsp":
        try:
            form = FlexSPCostForm.model_validate(req.cost_model.model_dump())
        except ValidationError as err:
            raise problems_from_validation(err, ("cost_model",), FlexSPCostForm) from None
        consts = explicit_constants(form.model_dump(), req.model, req.cluster, mem, zero)
    else:  # "analytic" (parse refuses the kinds COST_MODELS does not name)
        consts = derived_constants(req.model, req.cluster, req.precision, mem, zero)
    if consts.token_capacity_per_gpu <= 0:
        raise InfeasibleError.at(
            ("constraints", "memory_limit_gib"),
            f"model states need {consts.model_states_mb_per_gpu / 1024:.2f} GiB per GPU under ZeRO-{zero}, "
            f"leaving no room for activations within {mem} GiB",
        )
    return req, consts
