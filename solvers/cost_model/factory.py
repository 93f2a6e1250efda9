"""Build the cost model a request asks for, and plans from the uniform strategy shorthand."""

from __future__ import annotations

import importlib
from dataclasses import fields, replace
from typing import Any, get_args

from solvers.cost_model import pipeline
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import CostModel
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.profile import profile_from_request
from solvers.cost_model.validate import check_plan
from solvers.errors import FieldProblem, SpecError
from solvers.request import HybridRequest
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Schedule

LAYER_KEYS = {f.name for f in fields(LayerStrategy)}
SHORTHAND_KEYS = {"tp", "pp", "dp", "cp", "sp", "zero", "recompute", "micro_batch_size", "micro_batches",
                  "schedule", "virtual_stages", "ep", "etp", "lsh", "stage_layers", "embedding"}


def make_cost_model(req: HybridRequest) -> CostModel:
    """``cost_model.kind``: "analytic" (default), "profile" (analytic with a measured profile on top) or
    "galvatron" (Galvatron's formulas on Galvatron's profile files)."""
    spec = req.cost_model
    extras: dict[str, Any] = dict(spec.model_extra or {})
    if spec.kind == "galvatron":
        galvatron = importlib.import_module("solvers.cost_model.galvatron")
        model: CostModel = galvatron.GalvatronCostModel.from_request(req)
        return model
    if spec.kind not in ("analytic", "profile"):
        raise SpecError.at(("cost_model", "kind"), f"cost model {spec.kind!r} does not apply to hybrid plans")
    calibration = DEFAULT_CALIBRATION.with_overrides(extras.get("calibration"), ("cost_model", "calibration"))
    return AnalyticCostModel(req.model, req.cluster, req.training, req.constraints, calibration,
                             profile=profile_from_request(req))


def _int(d: dict[str, Any], key: str, default: int | None, problems: list[FieldProblem]) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "zero" else 1):
        problems.append(FieldProblem(("strategy", key), f"must be a positive integer, got {v!r}"))
        return None
    return v


def _shorthand_split(layers: int, pp: int, chunks: int) -> tuple[int, ...]:
    """The split Megatron-LM runs for a uniform strategy; where none is whole model chunks, the most even one
    in layers (the cost model prices it; Megatron would refuse it)."""
    split = pipeline.even_split(layers, pp, chunks) or pipeline.even_split(layers, pp)
    assert split is not None  # pp <= layers is checked first: one layer a stage always splits
    return split


def plan_from_shorthand(d: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec
                        ) -> PlanStrategy:
    """A uniform plan from ``{"tp", "pp", "dp", "cp", "sp", "zero", "recompute", "micro_batch_size",
    "schedule", "virtual_stages"}`` (``micro_batch_size`` is per data-parallel rank; ``dp`` defaults to
    whatever the other degrees leave of the cluster; a field given as null takes its default, as an absent one).
    Raises SpecError naming the field."""
    d = {k: v for k, v in d.items() if v is not None}
    problems = [FieldProblem(("strategy", k), "unknown strategy field") for k in d if k not in SHORTHAND_KEYS]
    tp, pp, cp, ep = (_int(d, k, 1, problems) for k in ("tp", "pp", "cp", "ep"))
    zero = _int(d, "zero", 0, problems)
    v = _int(d, "virtual_stages", 1, problems)
    etp = _int(d, "etp", None, problems)
    if not isinstance(d.get("lsh", False), bool):
        problems.append(FieldProblem(("strategy", "lsh"), f"must be true or false, got {d['lsh']!r}"))
    if model.moe is None:  # the expert fields apply to MoE layers only: on a dense model they would be ignored
        problems += [FieldProblem(("strategy", k), "the model has no MoE layers (model.moe is not set)")
                     for k in ("ep", "etp", "lsh") if k in d and d[k] not in (None, False, 1)]
    if problems:
        raise SpecError(problems)
    assert tp and pp and cp and ep and v and zero is not None
    n = cluster.num_gpus
    if model.num_attention_heads % tp:
        problems.append(FieldProblem(("strategy", "tp"), f"num_attention_heads ({model.num_attention_heads}) "
                                     f"is not divisible by tp ({tp})"))
    if "dp" not in d and n % (tp * pp * cp):
        problems.append(FieldProblem(("strategy", "tp"), f"tp*pp*cp = {tp * pp * cp} does not divide the "
                                     f"cluster's {n} GPUs"))
    dp = _int(d, "dp", max(1, n // (tp * pp * cp)), problems)
    if problems:
        raise SpecError(problems)
    assert dp
    if tp * pp * cp * dp != n:
        raise SpecError.at(("strategy",), f"tp*pp*cp*dp = {tp}*{pp}*{cp}*{dp} = {tp * pp * cp * dp} GPUs, "
                           f"but the cluster has {n}")
    if "micro_batches" in d:
        m = _int(d, "micro_batches", None, problems)
    else:
        mbs = _int(d, "micro_batch_size", 1, problems)
        if mbs and training.global_batch_size % (mbs * dp):
            problems.append(FieldProblem(("strategy", "micro_batch_size"), f"global_batch_size "
                            f"({training.global_batch_size}) is not a multiple of micro_batch_size*dp ({mbs * dp})"))
        m = training.global_batch_size // (mbs * dp) if mbs else None
    if problems:
        raise SpecError(problems)
    assert m
    schedule: Schedule = d.get("schedule") or ("interleaved" if v > 1 else "1f1b")
    if schedule not in get_args(Schedule):
        raise SpecError.at(("strategy", "schedule"), f"must be one of {', '.join(get_args(Schedule))}")
    if pp > model.num_layers:
        raise SpecError.at(("strategy", "pp"), f"pp ({pp}) exceeds the model's {model.num_layers} layers")
    stage_layers = d.get("stage_layers") or _shorthand_split(model.num_layers, pp, pipeline.chunks(schedule, v))
    layer = LayerStrategy(tp=tp, dp=dp, cp=cp, sp=d.get("sp"), zero=zero, recompute=d.get("recompute", "none"))
    # expert fields apply to the MoE layers (a model may interleave dense ones)
    moe_layer = replace(layer, ep=ep, etp=etp, lsh=bool(d.get("lsh", False)))
    layers = tuple(moe_layer if model.is_moe_layer(i) else layer for i in range(model.num_layers))
    emb = d.get("embedding") or {"tp": tp, "dp": dp * cp, "zero": zero}
    try:
        plan = PlanStrategy(pp=pp, micro_batches=m, layers=layers,
                            stage_layers=tuple(int(x) for x in stage_layers), schedule=schedule, virtual_stages=v,
                            embedding=EmbeddingStrategy(**emb))
    except (TypeError, ValueError) as err:
        raise SpecError.at(("strategy", "stage_layers"), str(err)) from None
    _raise_if_bad(plan, model, cluster, training, uniform=True)
    return plan


def plan_from_dict(d: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> PlanStrategy:
    """A full strategy object as the hybrid planner returns it (``layers`` per layer, ``stage_layers``...)."""
    layers = d.get("layers")
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
        raise SpecError.at(("strategy", "layers"), "must be a list of per-layer strategy objects")
    unknown = [FieldProblem(("strategy", "layers", i, k), "unknown layer strategy field")
               for i, x in enumerate(layers) for k in x if k not in LAYER_KEYS]
    if unknown:
        raise SpecError(unknown)
    try:
        plan = PlanStrategy.from_dict(d)
    except KeyError as err:
        raise SpecError.at(("strategy", str(err.args[0])), "missing") from None
    except (TypeError, ValueError) as err:
        raise SpecError.at(("strategy",), str(err)) from None
    _raise_if_bad(plan, model, cluster, training)
    return plan


def _raise_if_bad(plan: PlanStrategy, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                  uniform: bool = False) -> None:
    problems = check_plan(plan, model, cluster, training)
    if uniform:  # report a uniform plan's layer problems once, at the shorthand's own field names
        seen: dict[tuple[str | int, ...], FieldProblem] = {}
        for p in problems:
            loc = ("strategy", p.loc[-1]) if len(p.loc) == 4 and p.loc[1] == "layers" else p.loc
            seen.setdefault(loc, FieldProblem(loc, p.msg))
        problems = list(seen.values())
    if problems:
        raise SpecError(problems)
