"""``solvers.run_spindle``: a Spindle plan as the worker's runtime runs it, and every plan it cannot run refused
with the field (the runtime's own equivalence is tests/worker/test_spindle_runtime.py)."""

from __future__ import annotations

import itertools
from typing import Any

import pytest

from solvers.api import solve
from solvers.errors import SpecError
from solvers.run_spindle import load_program, moves, sample_range
from tests.worker.spindle_plans import planned, rl_request


def locations(doc: Any, world_size: int | None = None) -> list[tuple[str | int, ...]]:
    with pytest.raises(SpecError) as err:
        load_program(doc, world_size)
    return [tuple(p.loc) for p in err.value.problems]


@pytest.mark.parametrize(("batch", "src", "dst"), [
    (b, s, d) for b in (1, 5, 10) for s, d in itertools.product([(0,), (0, 1), (1, 2, 3), (3, 0)], repeat=2)])
def test_moves_hand_every_sample_once_from_its_holder_to_its_reader(batch: int, src: tuple[int, ...],
                                                                     dst: tuple[int, ...]) -> None:
    seen: list[int] = []
    for frm, to, a, b in moves(batch, src, dst):
        assert sample_range(batch, src, frm)[0] <= a < b <= sample_range(batch, src, frm)[1]
        assert sample_range(batch, dst, to)[0] <= a < b <= sample_range(batch, dst, to)[1]
        seen += range(a, b)
    assert seen == list(range(batch))


def test_the_planners_slices_run_in_start_order() -> None:
    doc = planned("captioning")
    program = load_program(doc)
    slices = doc["result"]["slices"]
    assert sorted(s.index for s in program.steps) == list(range(len(slices)))
    starts = [slices[s.index]["start_s"] for s in program.steps]
    assert starts == sorted(starts)
    assert program.predicted_iteration_time_s == doc["result"]["estimate"]["iteration_time_s"]
    assert program.tasks == ("caption", "text")
    roles = {op.name: op.role for op in load_program(planned("rl")).metaops.values()}
    assert roles == {"rollout/text": "rollout", "reward/score": "score", "reference/logp": "score",
                     "update/policy": "update"}


def test_a_plan_of_explicit_times_has_no_model_to_run() -> None:
    request = {"kind": "spindle", "cluster": {"nodes": 1, "gpus_per_node": 4}, "workload": {"metaops": [
        {"name": "m", "task": "t", "batch_size": 8, "num_layers": 4,
         "time_ms_per_layer": {"slope_ms_per_sample": 0.3, "intercept_ms": 1.0}}]},
        "options": {"exact": False}}
    doc = {"kind": "spindle", "request": request, "result": solve(request).model_dump(mode="json")}
    assert locations(doc) == [("request", "workload", "metaops", 0, "module")]


def test_what_the_runtime_cannot_follow_is_refused_by_field() -> None:
    doc = planned("captioning")
    assert locations(doc, world_size=2) == [("request", "cluster")]
    tp = planned("captioning")
    tp["result"]["slices"][4]["layout"] = {"tp": 2, "dp": 2}
    assert locations(tp) == [("result", "slices", 4, "layout")]
    # the reader scheduled before the slice it reads (the captioning decoder before its encoder's last slice)
    early = planned("captioning")
    reader = next(i for i, s in enumerate(early["result"]["slices"]) if s["metaop"] == "caption/llm")
    early["result"]["slices"][reader]["start_s"] = -1.0
    assert locations(early) == [("result", "slices", reader, "start_s")]
    gap = planned("captioning")
    gap["result"]["slices"] = [s for s in gap["result"]["slices"] if not (s["metaop"] == "caption/vit"
                                                                          and s["layer_start"] > 0)]
    vit = next(i for i, s in enumerate(gap["result"]["slices"]) if s["metaop"] == "caption/vit")
    assert ("result", "slices", vit, "layers") in locations(gap)
    assert locations({"kind": "spindle", "request": doc["request"]}) == [("result",)]


def test_rl_workloads_the_runtime_does_not_model_are_refused() -> None:
    """One-step off-policy (the update reads no rollout of this step; the runtime keeps none of the previous one)
    and a multi-pass forward (denoising) would run as something else: refused by field."""
    off = rl_request()
    off["workload"]["edges"] = [e for e in off["workload"]["edges"] if e[1] != "update/policy"]
    doc = {"kind": "spindle", "request": off, "result": solve(off).model_dump(mode="json")}
    assert locations(doc) == [("request", "workload", "metaops", 3, "name")]
    denoise = rl_request()
    denoise["workload"]["metaops"][1]["steps"] = 4
    doc = {"kind": "spindle", "request": denoise, "result": solve(denoise).model_dump(mode="json")}
    assert locations(doc) == [("request", "workload", "metaops", 1, "steps")]
