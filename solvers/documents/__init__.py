"""Typed plan documents: one pydantic model per result kind, from the solver to the database, the API, the
dashboard, the CLI, the exports and the worker.

``load_result`` reads a stored document of any schema version; ``PlanResult`` is the union of the kinds,
discriminated by ``kind`` (what ``/openapi.json`` publishes).
"""

from __future__ import annotations

from typing import Annotated, Any, Literal, get_args

from pydantic import Field, TypeAdapter, ValidationError

from solvers.documents.base import SCHEMA_VERSION, Document, ResultDocument
from solvers.documents.flexsp import FlexSPEstimateResult, FlexSPResult
from solvers.documents.hybrid import BASELINE_NAMES, BaselineName, HybridEstimateResult, HybridResult, StrategyDoc
from solvers.documents.spindle import SpindleEstimateResult, SpindleResult
from solvers.documents.status import ACTIVE, STATUSES, TERMINAL, Status

PlanKind = Literal["hybrid", "flexsp", "spindle"]
PLAN_KINDS: tuple[PlanKind, ...] = get_args(PlanKind)
DEFAULT_KIND: PlanKind = "hybrid"

PlanResult = Annotated[HybridResult | FlexSPResult | SpindleResult, Field(discriminator="kind")]
EstimateResult = HybridEstimateResult | FlexSPEstimateResult | SpindleEstimateResult

_RESULTS: TypeAdapter[HybridResult | FlexSPResult | SpindleResult] = TypeAdapter(PlanResult)


class DocumentError(ValueError):
    """A stored document that no reader of this version understands."""


def load_result(kind: str, data: dict[str, Any]) -> HybridResult | FlexSPResult | SpindleResult:
    """A stored result document as its typed model. Version 1 documents (no ``kind``, no ``schema_version``)
    are the version 2 fields without those two, so reading one adds them."""
    version = data.get("schema_version", 1)
    if version == 1:
        data = {**data, "kind": kind, "schema_version": SCHEMA_VERSION}
    elif version != SCHEMA_VERSION:
        raise DocumentError(f"a {kind} result of schema version {version!r}; this reader knows 1 and {SCHEMA_VERSION}")
    if data.get("kind") != kind:
        raise DocumentError(f"a result of kind {data.get('kind')!r} stored as {kind!r}")
    try:
        return _RESULTS.validate_python(data)
    except ValidationError as err:
        raise DocumentError(f"a stored {kind} result does not match its schema: {err}") from None


__all__ = [
    "ACTIVE",
    "BASELINE_NAMES",
    "DEFAULT_KIND",
    "PLAN_KINDS",
    "SCHEMA_VERSION",
    "STATUSES",
    "TERMINAL",
    "BaselineName",
    "Document",
    "DocumentError",
    "EstimateResult",
    "FlexSPEstimateResult",
    "FlexSPResult",
    "HybridEstimateResult",
    "HybridResult",
    "PlanKind",
    "PlanResult",
    "ResultDocument",
    "SpindleEstimateResult",
    "SpindleResult",
    "Status",
    "StrategyDoc",
    "load_result",
]
