"""Calibration sets: the analytic model's constants fitted for one GPU type and software stack, and which set an
estimate was priced with (``estimate.calibration_set``)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from solvers.documents.base import Document
from solvers.specs import StackSpec


class CalibrationFitDoc(Document):
    """How well a set's constants predict the measurements they were fitted on, and ones they were not."""

    measurements: int = Field(description="measured steps the fit used")
    keys: list[str] = Field(description="the constants the fit searched (the others kept their start values)")
    start_mape: float = Field(description="mean absolute percentage error of the start constants on the "
                                          "measurements (fraction), before the fit")
    fit_mape: float = Field(description="the same with the fitted constants: in-sample")
    held_out_mape: float | None = Field(description="each measurement predicted by constants fitted without it "
                                                    "(fraction): leave one out up to five measurements, five folds "
                                                    "(every fifth measurement held out together) above; null with "
                                                    "one measurement")
    held_out_note: str | None = None
    identified: list[str] | None = Field(default=None, description="the searched constants the measurements pin "
                                         "down (moving one by 20 % from the fit changes the in-sample error by more "
                                         "than 0.5 points); the others stay as assumed as before the fit. Null: a "
                                         "set fitted before this was reported")
    unfinished: list[str] | None = Field(default=None, description="the searched constants that one more 20 % move "
                                         "would still improve the in-sample error by more than 0.5 points: the "
                                         "search ran out of sweeps before it reached them, so the fit is the best it "
                                         "reached, not its measurements' best. Null: a set fitted before this was "
                                         "reported")
    network_Gbps: float | None = Field(default=None, description="the network, per node (the fastest, where they "
                                       "ran on several), that the measurements across nodes ran on: what the "
                                       "fitted network efficiency is relative to; null: none ran across nodes")
    network_stated: bool | None = Field(default=None, description="true: each profile or run's request stated it "
                                        "(inter_node_bandwidth_Gbps); false: some did not, and the GPU preset's "
                                        "was assumed for them; null: none ran across nodes")


ChosenBy = Literal["request", "cluster", "shipped"]


class CalibrationSetUse(Document):
    """The constants an estimate was priced with: a stored set (named by the request, or the one matching the
    cluster's GPU type and stack), or the shipped constants when no set applies (``note`` says why)."""

    name: str | None = Field(description="the stored set; null: the shipped constants")
    version: int | None = None
    chosen_by: ChosenBy = Field(description="request: cost_model.calibration_set named it; cluster: the set "
                                            "matching the cluster's GPU type and stack; shipped: no stored set")
    gpu: str | None = Field(default=None, description="the GPU type the set was fitted on")
    stack: StackSpec | None = Field(default=None, description="the stack the set was fitted on")
    fit: CalibrationFitDoc | None = None
    constants: dict[str, float] = Field(default_factory=dict, description="the set's constants (the shipped "
                                                                          "values for the others)")
    overridden: list[str] = Field(default_factory=list, description="constants cost_model.calibration overrode "
                                                                    "on top of the set")
    note: str
