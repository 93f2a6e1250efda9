"""Build the cost model a request asks for, and plans from the uniform strategy shorthand."""

from __future__ import annotations

import importlib
from dataclasses import fields, replace
from typing import Any, get_args

from solvers.cost_model import pipeline
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import CostModel
from solvers.cost_model.calibration_set import priced_calibration
from solvers.cost_model.profile import profile_from_request
from solvers.cost_model.validate import check_plan
from solvers.errors import FieldProblem, SpecError, shown
from solvers.request import HybridRequest
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy, Schedule
from solvers.unknown_keys import unknown_key_problems

LAYER_KEYS = {f.name for f in fields(LayerStrategy)}
EMBEDDING_KEYS = {f.name for f in fields(EmbeddingStrategy)}
# a full strategy object, as a hybrid plan returns it
FULL_KEYS = {f.name for f in fields(PlanStrategy)}
SHORTHAND_KEYS = {"tp", "pp", "dp", "cp", "sp", "zero", "recompute", "micro_batch_size", "micro_batches",
                  "schedule", "virtual_stages", "ep", "etp", "lsh", "stage_layers", "embedding"}


def make_cost_model(req: HybridRequest) -> CostModel:
    """``cost_model.kind``: "analytic" (default), "profile" (analytic with a measured profile on top) or
    "galvatron" (Galvatron's formulas on Galvatron's profile files)."""
    spec = req.cost_model
    extras: dict[str, Any] = dict(spec.model_extra or {})
    if req.cluster.groups is not None:
        return _hetero(req, extras)
    if spec.kind == "galvatron":
        galvatron = importlib.import_module("solvers.cost_model.galvatron")
        model: CostModel = galvatron.GalvatronCostModel.from_request(req)
        return model
    if spec.kind not in ("analytic", "profile"):
        raise SpecError.at(("cost_model", "kind"), f"cost model {spec.kind!r} does not apply to hybrid plans")
    calibration, used = priced_calibration(extras, req.cluster, req.training)
    return AnalyticCostModel(req.model, req.cluster, req.training, req.constraints, calibration,
                             profile=profile_from_request(req), calibration_set=used)


def _hetero(req: HybridRequest, extras: dict[str, Any]) -> CostModel:
    """A cluster of groups: the analytic model per GPU type, stage by stage (``solvers.cost_model.hetero``); the
    pipeline runs through the groups in the order the request lists them."""
    from solvers.cost_model.hetero import HeteroCostModel

    if req.cost_model.kind != "analytic" or extras.get("profile") is not None or extras.get("profile_path"):
        raise SpecError.at(("cost_model", "kind"), "a cluster of groups is priced by the analytic model only "
                                                   "(a profile or Galvatron's files describe one GPU type)")
    calibration, used = priced_calibration(extras, req.cluster, req.training)
    assert req.cluster.groups is not None
    return HeteroCostModel(req.model, req.cluster, req.training, req.constraints, calibration,
                           range(len(req.cluster.groups)), calibration_set=used)


def _int(d: dict[str, Any], key: str, default: int | None, problems: list[FieldProblem]) -> int | None:
    v = d.get(key, default)
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or v < (0 if key == "zero" else 1):
        problems.append(FieldProblem(("strategy", key), f"must be a positive integer, got {shown(v)}"))
        return None
    return v


def _stage_layers(value: Any, problems: list[FieldProblem]) -> tuple[int, ...] | None:
    if not isinstance(value, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in value):
        problems.append(FieldProblem(("strategy", "stage_layers"), f"must be a list of layer counts, one per "
                                     f"pipeline stage, got {shown(value)}"))
        return None
    return tuple(value)


def _embedding(value: Any, problems: list[FieldProblem]) -> EmbeddingStrategy | None:
    """The embedding / LM-head strategy object (its values are checked with the plan's)."""
    if not isinstance(value, dict):
        problems.append(FieldProblem(("strategy", "embedding"), f"must be an object with tp, dp, zero and sp, "
                                     f"got {shown(value)}"))
        return None
    unknown = unknown_key_problems(value, EMBEDDING_KEYS, ("strategy", "embedding"))
    problems += unknown
    return None if unknown else EmbeddingStrategy(**value)


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
    problems = unknown_key_problems(d, SHORTHAND_KEYS, ("strategy",))
    tp, pp, cp, ep = (_int(d, k, 1, problems) for k in ("tp", "pp", "cp", "ep"))
    zero = _int(d, "zero", 0, problems)
    v = _int(d, "virtual_stages", 1, problems)
    etp = _int(d, "etp", None, problems)
    if not isinstance(d.get("lsh", False), bool):
        problems.append(FieldProblem(("strategy", "lsh"), f"must be true or false, got {shown(d['lsh'])}"))
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
    stage_layers = (_stage_layers(d["stage_layers"], problems) if "stage_layers" in d
                    else _shorthand_split(model.num_layers, pp, pipeline.chunks(schedule, v)))
    emb = _embedding(d.get("embedding", {"tp": tp, "dp": dp * cp, "zero": zero}), problems)
    if problems:
        raise SpecError(problems)
    assert stage_layers is not None and emb is not None
    layer = LayerStrategy(tp=tp, dp=dp, cp=cp, sp=d.get("sp"), zero=zero, recompute=d.get("recompute", "none"))
    # expert fields apply to the MoE layers (a model may interleave dense ones)
    moe_layer = replace(layer, ep=ep, etp=etp, lsh=bool(d.get("lsh", False)))
    layers = tuple(moe_layer if model.is_moe_layer(i) else layer for i in range(model.num_layers))
    plan = _plan(pp=pp, micro_batches=m, layers=layers, stage_layers=stage_layers, schedule=schedule,
                 virtual_stages=v, embedding=emb)
    _raise_if_bad(plan, model, cluster, training, uniform=True)
    return plan


def _plan(**parts: Any) -> PlanStrategy:
    try:
        return PlanStrategy(**parts)
    except ValueError as err:  # stage_layers that do not match pp or the layers
        raise SpecError.at(("strategy", "stage_layers"), str(err)) from None


def plan_from_dict(d: dict[str, Any], model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec) -> PlanStrategy:
    """A full strategy object as the hybrid planner returns it (``layers`` per layer, ``stage_layers``...);
    a field given as null is an absent one."""
    d = {k: v for k, v in d.items() if v is not None}
    layers = d.get("layers")
    if not isinstance(layers, list) or not all(isinstance(x, dict) for x in layers):
        raise SpecError.at(("strategy", "layers"), "must be a list of per-layer strategy objects")
    problems = unknown_key_problems(d, FULL_KEYS, ("strategy",))
    for i, x in enumerate(layers):
        problems += unknown_key_problems(x, LAYER_KEYS, ("strategy", "layers", i))
    problems += [FieldProblem(("strategy", k), "missing") for k in ("pp", "micro_batches", "stage_layers")
                 if k not in d]
    if problems:
        raise SpecError(problems)
    pp, m, v = _int(d, "pp", None, problems), _int(d, "micro_batches", None, problems), \
        _int(d, "virtual_stages", 1, problems)
    stage_layers = _stage_layers(d["stage_layers"], problems)
    emb = _embedding(d.get("embedding", {}), problems)
    if problems:
        raise SpecError(problems)
    plan = _plan(pp=pp, micro_batches=m, layers=tuple(LayerStrategy.from_dict(x) for x in layers),
                 stage_layers=stage_layers, schedule=d.get("schedule", "1f1b"), virtual_stages=v, embedding=emb)
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
