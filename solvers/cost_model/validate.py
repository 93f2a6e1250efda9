"""Checks that a plan can run as described on the model and cluster; every problem names its field."""

from __future__ import annotations

from solvers.errors import FieldProblem, shown
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import RECOMPUTE_MODES, SCHEDULES, SP_KINDS, EmbeddingStrategy, LayerStrategy, PlanStrategy

Loc = tuple[str | int, ...]
_LAYER_DEGREES = ("tp", "dp", "cp", "ep", "zero")


def _non_integers(x: LayerStrategy | EmbeddingStrategy, fields: tuple[str, ...], loc: Loc) -> list[FieldProblem]:
    """Problems of ``x``'s parallel degrees (positive integers) and ZeRO stage (a non-negative one)."""
    return [FieldProblem((*loc, field), f"must be a positive integer, got {shown(v)}") for field in fields
            if not isinstance(v := getattr(x, field), int) or isinstance(v, bool) or v < (0 if field == "zero" else 1)]


def _bad_sp_and_zero(x: LayerStrategy | EmbeddingStrategy, loc: Loc) -> list[FieldProblem]:
    out = []
    if x.sp not in SP_KINDS:
        out.append(FieldProblem((*loc, "sp"), f"must be null, 'megatron' or 'ulysses', got {shown(x.sp)}"))
    if x.zero > 3:
        out.append(FieldProblem((*loc, "zero"), f"ZeRO stage must be 0..3, got {x.zero}"))
    return out


def _layer_kinds(x: LayerStrategy, loc: Loc) -> list[FieldProblem]:
    """A layer's SP kind, ZeRO stage and recomputation, checked whatever model and cluster it is for."""
    out = _bad_sp_and_zero(x, loc)
    if x.recompute not in RECOMPUTE_MODES:
        out.append(FieldProblem((*loc, "recompute"),
                                f"must be one of {', '.join(RECOMPUTE_MODES)}, got {shown(x.recompute)}"))
    if not isinstance(x.lsh, bool):  # ("y" or [1] crashed the cost model's candidate arrays: an HTTP 500)
        out.append(FieldProblem((*loc, "lsh"), f"must be true or false, got {shown(x.lsh)}"))
    return out


def check_layer(x: LayerStrategy, index: int, model: ModelSpec, stage_gpus: int, micro_batch_samples: float,
                seq_length: int, loc: Loc) -> list[FieldProblem]:
    out = _non_integers(x, _LAYER_DEGREES, loc)
    if out:
        return out
    out = _layer_kinds(x, loc)

    def bad(field: str, msg: str) -> None:
        out.append(FieldProblem((*loc, field), msg))

    if x.world != stage_gpus:
        bad("dp", f"tp*cp*dp = {x.tp}*{x.cp}*{x.dp} = {x.world} GPUs, but each pipeline stage has {stage_gpus}")
    if model.num_attention_heads % x.tp:
        bad("tp", f"num_attention_heads ({model.num_attention_heads}) is not divisible by tp ({x.tp})")
    elif x.sp != "ulysses" and model.kv_heads % x.tp and x.tp % model.kv_heads:
        bad("tp", f"num_kv_heads ({model.kv_heads}) and tp ({x.tp}) must divide one another")
    split = x.cp * (x.tp if x.sp is not None else 1)
    if seq_length % split:
        bad("cp" if x.cp > 1 else "sp", f"seq_length ({seq_length}) is not divisible by the sequence split ({split})")
    per_rank = micro_batch_samples / x.dp
    if per_rank < 1 or abs(per_rank - round(per_rank)) > 1e-9:
        bad("dp", f"the micro-batch of {micro_batch_samples:g} samples does not split over dp={x.dp} ranks")
    if x.etp is not None and (not isinstance(x.etp, int) or isinstance(x.etp, bool) or x.etp < 1):
        bad("etp", f"must be a positive integer, got {shown(x.etp)}")
    elif x.ep > 1 or x.etp is not None or x.lsh is True:  # (an lsh not true or false: said once, above)
        field = "ep" if x.ep > 1 else "etp" if x.etp is not None else "lsh"
        if not model.is_moe_layer(index):
            bad(field, "expert parallelism, expert TP and LSH compression need an MoE layer")
        elif model.moe is not None and model.moe.num_experts % x.ep:
            bad("ep", f"ep ({x.ep}) must divide the number of experts ({model.moe.num_experts})")
        elif x.world % (x.ep * x.expert_tp):
            # parallel folding: the layer's tp*cp*dp ranks are re-read as etp * ep * expert-dp
            bad("ep" if x.ep > 1 else "etp",
                f"ep*etp ({x.ep}*{x.expert_tp}) must divide the layer's tp*cp*dp = {x.world} ranks")
    if not any(p.loc[len(loc):][:1] in (("tp",), ("etp",)) for p in out):  # (one problem a field)
        # the MLP's weights split over (expert) TP; Ulysses keeps the MLP whole (its expert TP is 1)
        if model.is_moe_layer(index) and model.expert_ffn_size % x.expert_tp:
            bad("etp" if x.etp is not None else "tp", f"{'etp' if x.etp is not None else 'the expert TP, tp,'} "
                f"({x.expert_tp}) must divide the expert FFN width ({model.expert_ffn_size})")
        elif not model.is_moe_layer(index) and x.sp != "ulysses" and model.ffn_size % x.tp:
            bad("tp", f"tp ({x.tp}) must divide the FFN width ({model.ffn_size})")
    return out


def check_structure(plan: PlanStrategy, loc: Loc = ("strategy",)) -> list[FieldProblem]:
    """The problems a plan has whatever model and cluster it is for: counts below 1, unknown kinds, ZeRO stages
    past 3 (what a stored result of another version may hold; PlanStrategy checks that the stages add up)."""
    out = [FieldProblem((*loc, f), f"must be at least 1, got {shown(v)}")
           for f in ("pp", "micro_batches", "virtual_stages")
           if not isinstance(v := getattr(plan, f), int) or isinstance(v, bool) or v < 1]
    if plan.schedule not in SCHEDULES:
        out.append(FieldProblem((*loc, "schedule"), f"must be one of {', '.join(SCHEDULES)}"))
    for i, x in enumerate(plan.layers):
        at = (*loc, "layers", i)
        out.extend(_non_integers(x, _LAYER_DEGREES, at) or _layer_kinds(x, at))
    emb_loc = (*loc, "embedding")
    out.extend(_non_integers(plan.embedding, ("tp", "dp", "zero"), emb_loc)
               or _bad_sp_and_zero(plan.embedding, emb_loc))
    return out


def check_plan(plan: PlanStrategy, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
               loc: Loc = ("strategy",)) -> list[FieldProblem]:
    """All problems of ``plan`` (empty when it is runnable)."""
    out: list[FieldProblem] = []
    n = cluster.num_gpus
    if plan.pp < 1 or n % plan.pp:
        return [FieldProblem((*loc, "pp"), f"pp ({plan.pp}) must divide the cluster's {n} GPUs")]
    if len(plan.layers) != model.num_layers:
        return [FieldProblem((*loc, "layers"), f"{len(plan.layers)} layer strategies for {model.num_layers} layers")]
    if any(k < 1 for k in plan.stage_layers):
        out.append(FieldProblem((*loc, "stage_layers"), "every pipeline stage needs at least one layer"))
    if plan.schedule not in SCHEDULES:
        out.append(FieldProblem((*loc, "schedule"), f"must be one of {', '.join(SCHEDULES)}"))
    if plan.micro_batches < 1 or training.global_batch_size % plan.micro_batches:
        out.append(FieldProblem((*loc, "micro_batches"), f"{plan.micro_batches} micro-batches do not divide the "
                                f"global batch of {training.global_batch_size}"))
        return out
    if plan.virtual_stages < 1:
        out.append(FieldProblem((*loc, "virtual_stages"), "must be at least 1"))
    elif plan.virtual_stages > 1:
        if plan.schedule != "interleaved":
            out.append(FieldProblem((*loc, "schedule"), "virtual_stages > 1 needs the interleaved schedule"))
        if plan.pp == 1:  # as the planner's space: Megatron-LM and torchtitan refuse to interleave one stage
            out.append(FieldProblem((*loc, "virtual_stages"), "interleaving needs a pipeline of pp ≥ 2 stages"))
        if plan.micro_batches % plan.pp:
            out.append(FieldProblem((*loc, "micro_batches"), f"the interleaved schedule needs micro_batches "
                                    f"({plan.micro_batches}) to be a multiple of pp ({plan.pp})"))
        if min(plan.stage_layers) < plan.virtual_stages:
            out.append(FieldProblem((*loc, "virtual_stages"), "a stage has fewer layers than virtual stages"))
    mb = training.global_batch_size / plan.micro_batches
    stage_gpus = n // plan.pp
    for i, layer in enumerate(plan.layers):
        out.extend(check_layer(layer, i, model, stage_gpus, mb, training.seq_length, (*loc, "layers", i)))
    emb, emb_loc = plan.embedding, (*loc, "embedding")
    bad_emb = _non_integers(emb, ("tp", "dp", "zero"), emb_loc)
    out.extend(bad_emb or _bad_sp_and_zero(emb, emb_loc))
    if model.vocab_size and not bad_emb and stage_gpus % emb.tp:
        out.append(FieldProblem((*emb_loc, "tp"), f"must divide the stage's {stage_gpus} GPUs"))
    if not training.stack.distributed_optimizer:
        parts: list[tuple[Loc, LayerStrategy | EmbeddingStrategy]] = [
            *(((*loc, "layers", i), y) for i, y in enumerate(plan.layers)), (emb_loc, emb)]
        out.extend(FieldProblem((*at, "zero"), f"ZeRO-{x.zero} shards states over data-parallel ranks and "
                                "training.stack.distributed_optimizer is false")
                   for at, x in parts if isinstance(x.zero, int) and x.zero > 0)
    return out
