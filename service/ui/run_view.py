"""What the run page shows: predicted vs measured step time and memory, memory per rank, the loss curve.

``predicted`` is what the run was predicted to measure when it was queued (``service.runs``: for a hybrid plan its
strategy priced on the runtime's stack, else the plan's document); ``metrics`` are what the worker measured,
free-form JSON that only some workers fill in, so its numbers are read tolerantly.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from service.ui import format as fmt
from service.ui.charts import Chart, bars, lines
from service.ui.request_info import gpu_label, has_profile


@dataclass
class Comparison:
    name: str
    predicted: float | None
    measured: float | None
    unit: str

    @property
    def error(self) -> float | None:
        """Relative error of the prediction against the measurement (+ = predicted too high)."""
        if self.predicted is None or not self.measured:
            return None
        return self.predicted / self.measured - 1.0


@dataclass
class RunView:
    comparisons: list[Comparison] = field(default_factory=list)
    # why the prediction may be far from the measurement (another device, a placeholder speed, what is measured)
    notes: list[str] = field(default_factory=list)
    memory_chart: Chart | None = None
    loss_chart: Chart | None = None
    step_chart: Chart | None = None
    metrics: dict[str, Any] = field(default_factory=dict)


def _floats(value: Any) -> list[float]:
    if not isinstance(value, list):
        return []
    return [f for f in (fmt.as_float(v) for v in value) if f is not None]


def _same_device(planned: str, device: str) -> bool:
    """Whether a CUDA device name ("NVIDIA A100-SXM4-80GB") is of the planned GPU ("A100-80GB")."""
    family = planned.split("-")[0].lower()
    return bool(family) and family in device.lower()


def prediction_notes(request: Mapping[str, Any], metrics: Mapping[str, Any]) -> list[str]:
    """What the prediction is for, where a reader would take its error for the cost model's: a run on other
    hardware than planned, a CPU plan priced without a profile of the host, a CPU's memory being its processes'."""
    planned, device = gpu_label(request), str(metrics.get("device") or "")
    if not planned or not device:
        return []
    notes = []
    on_cpu = device.lower() == "cpu"
    if planned.lower() == "cpu" and on_cpu:
        if not has_profile(request):
            notes.append("The plan was priced for the cpu preset's nominal speed, without a profile of this host: "
                         "its step time is a placeholder, not a measurement of this machine. `paraplan worker "
                         "profile --out profile.json` measures the host; a request with \"cost_model\": "
                         "{\"kind\": \"profile\", \"profile\": ...} is priced from it.")
    elif on_cpu or not _same_device(planned, device):
        notes.append(f"The prediction is for the planned GPU ({planned}); this run ran on "
                     f"{'a CPU host' if on_cpu else device}, so the prediction error measures the difference between "
                     "the two devices, not the cost model.")
    if on_cpu:
        notes.append("On a CPU host the measured memory is each process's peak resident set (Python, torch and the "
                     "tensors); the prediction counts the training's tensors (no GPU runtime reserve on a CPU host).")
    return notes


def _runtime_stack_note(predicted: Mapping[str, Any]) -> str | None:
    """What stack a hybrid run's prediction priced: paraplan's runtime, and the plan's own figure where the plan
    was priced for another stack (``service.runs.runtime_predicted``)."""
    stack = predicted.get("stack")
    if not isinstance(stack, Mapping):
        note = predicted.get("note")
        return note if isinstance(note, str) else None
    text = (f"Predicted for paraplan's runtime, what runs the plan (framework {stack.get('framework')}: "
            f"{stack.get('elementwise')} elementwise ops, TP overlap {stack.get('tp_comm_overlap')}, gradient sync "
            f"{'behind the backward' if stack.get('dp_overlap') else 'after the backward'}).")
    plan_s = fmt.as_float(predicted.get("plan_step_time_s"))
    if plan_s is not None:
        text += f" The plan's own estimate, for the stack its request names: {fmt.seconds(plan_s)} a step."
    return text


def build(run: Mapping[str, Any], request: Mapping[str, Any] | None = None) -> RunView:
    """The run's page; ``request``: its plan's request (what the prediction was made for)."""
    metrics, predicted = run["metrics"], run["predicted"]
    view = RunView(metrics=dict(metrics), notes=prediction_notes(request or {}, metrics))
    used = predicted.get("calibration_set")
    if isinstance(used, Mapping):
        view.notes.insert(0, f"Predicted with calibration set {used.get('name')} v{used.get('version')} (chosen by "
                             f"{used.get('chosen_by')})." if used.get("name") else
                             "Predicted with the shipped constants (no calibration set applied).")
    runtime_note = _runtime_stack_note(predicted)
    if runtime_note:
        view.notes.insert(1 if isinstance(used, Mapping) else 0, runtime_note)
    per_rank = _floats(metrics.get("peak_memory_gib_per_rank"))
    measured_peak = max(per_rank) if per_rank else fmt.as_float(metrics.get("peak_memory_gib"))
    per = "rank" if str(metrics.get("device") or "").lower() == "cpu" else "GPU"
    view.comparisons = [
        Comparison("step time", fmt.as_float(predicted.get("step_time_s")), fmt.as_float(metrics.get("step_time_s")),
                   "s"),
        Comparison(f"peak memory per {per}", fmt.as_float(predicted.get("peak_memory_gib")), measured_peak, "GiB"),
    ]
    step = view.comparisons[0]
    if step.predicted is not None or step.measured is not None:
        view.step_chart = bars("step-chart", "Step time: predicted vs measured", ["predicted", "measured"],
                               [step.predicted or 0.0, step.measured or 0.0], "step time (s)", "seconds")
    if per_rank:
        limit = fmt.as_float(predicted.get("peak_memory_gib"))
        view.memory_chart = bars("memory-chart", "Peak memory per rank", [f"rank {i}" for i in range(len(per_rank))],
                                 per_rank, "measured peak (GiB)", "GiB", reference=limit,
                                 reference_label=f"predicted {fmt.gib(limit)}" if limit is not None else "")
    # While a run executes only its per-step progress points (each a MetricsReport) exist; the final metrics
    # replace them.
    points = run["progress"]
    loss = _floats(metrics.get("loss")) or [p["loss"] for p in points]
    if loss:
        view.loss_chart = lines("loss-chart", "Training loss", list(range(1, len(loss) + 1)), {"loss": loss},
                                "step", "loss")
        view.loss_chart.config["options"]["scales"]["y"].pop("beginAtZero", None)
    step_times = _floats(metrics.get("step_times_s")) or [p["step_time_s"] for p in points]
    per_step = _per_step_predictions(metrics, len(step_times))
    if per_step is not None:  # (FlexSP: every step its own batch and grouping, so its own prediction)
        _add_per_step(view, metrics, per_step, step_times)
    elif step_times and step.predicted is not None:
        view.step_chart = lines("step-chart", "Step time per step: measured vs predicted",
                                list(range(1, len(step_times) + 1)),
                                {"measured": step_times, "predicted": [step.predicted] * len(step_times)},
                                "step", "seconds")
    return view


def _per_step_predictions(metrics: Mapping[str, Any], steps: int) -> list[float] | None:
    """Each step's own predicted time, where the run reports one per step (a FlexSP run's ``flexsp_steps``: each
    step trains another batch with its own grouping); None otherwise."""
    records = metrics.get("flexsp_steps")
    if not isinstance(records, list) or not records or len(records) != steps:
        return None
    got = [fmt.as_float(r.get("predicted_step_time_s")) if isinstance(r, Mapping) else None for r in records]
    return None if any(g is None for g in got) else [g for g in got if g is not None]


def _add_per_step(view: RunView, metrics: Mapping[str, Any], predicted: list[float], measured: list[float]) -> None:
    """Per-step predictions: the chart of both curves, a comparison of their medians, and which grouping each step
    ran (the plan's, planned for its batch, or the previous step's rule where its plan was late)."""
    view.step_chart = lines("step-chart", "Step time per step: measured vs each step's prediction",
                            list(range(1, len(measured) + 1)), {"measured": measured, "predicted": predicted},
                            "step", "seconds")
    view.comparisons.insert(1, Comparison("step time, each step's own prediction (median)",
                                          fmt.as_float(metrics.get("predicted_step_time_s")),
                                          fmt.as_float(metrics.get("step_time_s")), "s"))
    kinds = metrics.get("groupings")
    if isinstance(kinds, Mapping) and kinds:
        ran = ", ".join(f"{n} {k}" for k, n in kinds.items() if isinstance(n, int) and n)
        view.notes.append(f"Each step trained its own batch with its own grouping ({ran}: "
                          "plan = the plan's own, planned = the planner's for that batch, fallback = the previous "
                          "step's rule where its plan was late), and is predicted for that grouping; the first "
                          "row is the plan's prediction for its own batch.")
