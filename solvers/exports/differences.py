"""Each way a framework's run of an export differs from the plan, as a change that can be applied to the plan alone,
so that every difference an export header lists comes with its own price (#33): the plan with only that change,
estimated by the plan's cost model, against the plan.

Differences are found by comparing the plan with the run layer by layer, per *aspect*: a layer's layout (tp, cp,
dp and the sequence-parallel kind, which only change together), its ZeRO stage, its recomputation and its expert
layout; and for the whole plan, the pipeline (depth, split, schedule, chunks, micro-batches) and the embedding.
One difference is one aspect changing from one value to another (``tp2 cp4 -> tp8 cp1`` on 5 layers).
Differences interact, so their prices need not add up to the whole run's: the header says so."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

from solvers.strategy import LayerStrategy, PlanStrategy

# A layer aspect: its name, how to read it from a layer, how to write a value into one, how to show a value.
Read = Callable[[LayerStrategy], Any]
Write = Callable[[LayerStrategy, Any], LayerStrategy]


@dataclass(frozen=True)
class _Aspect:
    name: str
    read: Read
    write: Write
    show: Callable[[Any], str]
    moot: Callable[[LayerStrategy], bool] = lambda run_layer: False  # no difference on such a layer of the run


def _show_layout(v: tuple[int, int, int, str | None]) -> str:
    tp, cp, dp, sp = v
    return f"tp{tp} cp{cp} dp{dp}" + (f" sp={sp}" if sp else "")


def _show_experts(v: tuple[int, int | None]) -> str:
    ep, etp = v
    return f"ep{ep}" + (f" etp{etp}" if etp is not None else "")


_ASPECTS: tuple[_Aspect, ...] = (
    _Aspect("layout", lambda s: (s.tp, s.cp, s.dp, s.sp),
            lambda s, v: replace(s, tp=v[0], cp=v[1], dp=v[2], sp=v[3]), _show_layout),
    # ZeRO shards over the data- and context-parallel ranks: a run's layer without them has none to speak of
    _Aspect("ZeRO", lambda s: s.zero, lambda s, v: replace(s, zero=v), str, lambda r: r.dp * r.cp == 1),
    _Aspect("recomputation", lambda s: s.recompute, lambda s, v: replace(s, recompute=v), str),
    _Aspect("experts", lambda s: (s.ep, s.etp, s.lsh), lambda s, v: replace(s, ep=v[0], etp=v[1], lsh=v[2]),
            lambda v: _show_experts(v[:2]) + (" lsh" if v[2] else "")),
)


@dataclass(frozen=True)
class Difference:
    """One way the run differs from the plan, and the plan with only that difference."""

    what: str
    changed: PlanStrategy


def _show_embedding(plan: PlanStrategy) -> str:
    e = plan.embedding
    return f"tp{e.tp} dp{e.dp} zero{e.zero}" + (f" sp={e.sp}" if e.sp else "")


def _pipeline(plan: PlanStrategy) -> dict[str, Any]:
    return {"pp": plan.pp, "stages": list(plan.stage_layers), "schedule": plan.schedule,
            "virtual_stages": plan.virtual_stages, "micro_batches": plan.micro_batches}


def _layer_differences(plan: PlanStrategy, run: PlanStrategy, aspects: tuple[_Aspect, ...]) -> list[Difference]:
    out: list[Difference] = []
    for aspect in aspects:
        def moves(a: LayerStrategy, b: LayerStrategy, aspect: _Aspect = aspect) -> bool:
            return aspect.read(a) != aspect.read(b) and not aspect.moot(b)

        pairs = list(zip(plan.layers, run.layers, strict=True))
        for (old, new), n in Counter((aspect.read(a), aspect.read(b)) for a, b in pairs if moves(a, b)).most_common():
            layers = tuple(aspect.write(a, new) if moves(a, b) and aspect.read(a) == old and aspect.read(b) == new
                           else a for a, b in pairs)
            out.append(Difference(f"{aspect.name} {aspect.show(old)} -> {aspect.show(new)} on {n} of "
                                  f"{len(plan.layers)} layers", plan.with_layers(layers)))
    return out


def _plan_differences(plan: PlanStrategy, run: PlanStrategy) -> list[Difference]:
    out: list[Difference] = []
    before, after = _pipeline(plan), _pipeline(run)
    if before != after:
        said = ", ".join(f"{k} {before[k]} -> {after[k]}" for k in before if before[k] != after[k])
        changed = replace(plan, pp=run.pp, stage_layers=run.stage_layers, schedule=run.schedule,
                          virtual_stages=run.virtual_stages, micro_batches=run.micro_batches)
        if plan.pp != run.pp:  # a stage's GPUs change with the depth: the layers' layouts go with it
            layout = _ASPECTS[0]
            changed = changed.with_layers(tuple(layout.write(a, layout.read(b))
                                                for a, b in zip(plan.layers, run.layers, strict=True)))
            said += " (with the run's layer layouts, which a stage's GPU count fixes)"
        out.append(Difference(f"pipeline {said}", changed))
    if plan.embedding != run.embedding:
        out.append(Difference(f"embedding {_show_embedding(plan)} -> {_show_embedding(run)}",
                              replace(plan, embedding=run.embedding)))
    return out


def differences(plan: PlanStrategy, run: PlanStrategy) -> list[Difference]:
    """Every difference between the plan and a framework's run of it (of the same layers), each applied alone to
    the plan; empty where the run is the plan."""
    if len(plan.layers) != len(run.layers):
        raise ValueError(f"the run has {len(run.layers)} layers, the plan {len(plan.layers)}")
    aspects = _ASPECTS if plan.pp == run.pp else _ASPECTS[1:]  # else layouts change with the pipeline's depth
    return [*_layer_differences(plan, run, aspects), *_plan_differences(plan, run)]
