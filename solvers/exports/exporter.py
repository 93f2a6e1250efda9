"""The one interface every framework module offers the registry (``solvers.exports.EXPORTERS``): what the
service's export route and the CLI need to serve a format, and what a benchmark needs to price its run."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol

from solvers.exports.inputs import ExportInput, Request
from solvers.strategy import PlanStrategy

if TYPE_CHECKING:  # the vocabulary is the package's; its modules are imported while it initialises
    from solvers.exports import ExportFormat


class RunPlan(Protocol):
    def __call__(self, plan: PlanStrategy, expert_layers: Sequence[bool] | None = None,
                 request: Request | None = None) -> PlanStrategy | None:
        """What the framework runs from the plan's export (with the request: the setting the export writes by
        the cost model); None where the framework cannot run it as a plan the cost model can price."""
        ...


@dataclass(frozen=True)
class Exporter:
    name: ExportFormat
    media_type: str
    extension: str  # of the file the service names the export
    run_plan: RunPlan
    write: Callable[[ExportInput], str]
