"""Which constants a hybrid request is priced with: a stored calibration set the service resolved, or the
shipped ones, and the ``estimate.calibration_set`` document that says which.

The solver never reads the database. A request names a set with ``cost_model.calibration_set: "NAME"`` (or
``"NAME@VERSION"``); the service looks it up (or picks the set matching the cluster's GPU type and stack) and
puts what it found into ``cost_model.resolved_calibration_set`` (a ``CalibrationSetUse`` document) before the
request is stored; where no stored set applies it leaves the request as sent. Without a resolution (that case,
the CLI, ``solvers.api``) the shipped constants are priced and said to be, and a named set is refused.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from pydantic import ValidationError

from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.documents.calibration import CalibrationSetUse
from solvers.errors import SpecError
from solvers.request import problems_from_validation
from solvers.specs import ClusterSpec, StackSpec, TrainingSpec

RESOLVED = "resolved_calibration_set"
SHIPPED_NOTE = ("the shipped constants (fitted on vTrain and SC21: A100, 2021 Megatron-LM, unfused attention)")


def set_key(gpu: str, stack: StackSpec) -> str:
    """What a set is for: a GPU type and a stack with its defaults resolved (the key a cluster matches on)."""
    fields_ = stack.model_dump(mode="json")
    return gpu + "|" + ",".join(f"{k}={fields_[k]}" for k in sorted(fields_))


def cluster_key(cluster: ClusterSpec, training: TrainingSpec) -> str | None:
    """The set key a cluster matches; None for a cluster of several GPU types (no one set describes it)."""
    if cluster.groups is not None:
        return None
    return set_key(cluster.gpu.name, training.priced_stack())


def shipped_use(why: str) -> CalibrationSetUse:
    return CalibrationSetUse(name=None, chosen_by="shipped", note=f"{SHIPPED_NOTE}: {why}")


def parse_name(value: Any) -> tuple[str, int | None]:
    """``"NAME"`` (the latest version) or ``"NAME@VERSION"``; SpecError at cost_model.calibration_set."""
    loc = ("cost_model", "calibration_set")
    if not isinstance(value, str) or not value.strip() or len(value) > 160:
        raise SpecError.at(loc, "must name a stored calibration set: \"NAME\" or \"NAME@VERSION\"")
    name, _, version = value.partition("@")
    if not version:
        return name, None
    if not version.isdigit() or int(version) < 1:
        raise SpecError.at(loc, f"version after '@' must be a positive integer, got {version!r}")
    return name, int(version)


def priced_calibration(extras: dict[str, Any], cluster: ClusterSpec,
                       training: TrainingSpec) -> tuple[AnalyticCalibration, CalibrationSetUse]:
    """The constants to price with and the document that says where they came from."""
    overrides = extras.get("calibration")
    resolved = extras.get(RESOLVED)
    if resolved is None:
        if extras.get("calibration_set") is not None:
            parse_name(extras["calibration_set"])
            raise SpecError.at(("cost_model", "calibration_set"),
                               "a stored calibration set is resolved by the service (POST /v1/plans or "
                               "/v1/estimate); here give its constants as cost_model.calibration")
        use = shipped_use("the request names no calibration set and none is stored for its GPU type and stack"
                          if cluster.groups is None else "a cluster of several GPU types matches no one set")
        base = DEFAULT_CALIBRATION
    else:
        try:
            use = CalibrationSetUse.model_validate(resolved)
        except ValidationError as err:
            raise problems_from_validation(err, ("cost_model", RESOLVED)) from None
        base = DEFAULT_CALIBRATION.with_overrides(use.constants or None, ("cost_model", RESOLVED, "constants"))
    cal = base.with_overrides(overrides, ("cost_model", "calibration"))
    if isinstance(overrides, dict) and overrides:
        known = {f.name for f in fields(AnalyticCalibration)}
        use = use.model_copy(update={"overridden": sorted(k for k in overrides if k in known)})
    return cal, use
