"""The kind = "spindle" contract: request parsing, result fields, estimate, errors naming fields."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from solvers.errors import SpecError
from solvers.spindle.gantt import gantt_svg
from tests import contract_json as api

CONTRACT: dict[str, Any] = {"kind": "spindle", "cluster": {"nodes": 2, "gpus_per_node": 8},
            "workload": {"metaops": [
                {"name": "cap-vision", "task": "cap", "batch_size": 64, "num_layers": 48,
                 "time_ms_per_layer": {"slope_ms_per_sample": 0.2908, "intercept_ms": 0.944}},
                {"name": "cap-llm", "task": "cap", "batch_size": 64, "num_layers": 32,
                 "time_ms_per_layer": {"slope_ms_per_sample": 0.6, "intercept_ms": 1.2}},
                {"name": "vqa-vision", "task": "vqa", "batch_size": 32, "num_layers": 48,
                 "time_ms_per_layer": {"slope_ms_per_sample": 0.2908, "intercept_ms": 0.944}},
                {"name": "vqa-llm", "task": "vqa", "batch_size": 32, "num_layers": 32,
                 "time_ms_per_layer": {"slope_ms_per_sample": 0.6, "intercept_ms": 1.2}},
                {"name": "text", "task": "text", "batch_size": 128, "num_layers": 32,
                 "time_ms_per_layer": {"slope_ms_per_sample": 0.6, "intercept_ms": 1.2}}],
                "edges": [["cap-vision", "cap-llm"], ["vqa-vision", "vqa-llm"]]},
            "options": {"exact": True, "exact_time_limit_s": 2.0, "exact_workers": 1}}


def solve(req: dict[str, Any]) -> dict[str, Any]:
    return api.solve(req)


def test_contract_fields_and_explicit_time_model() -> None:
    out = solve(CONTRACT)
    assert {"estimate", "slices", "lower_bound_s", "baselines", "search", "waves"} <= set(out)
    assert set(out["baselines"]) == {"sequential_full_cluster_s", "task_uniform_s", "task_optimus_s"}
    assert out["search"]["time_s"] > 0
    est = out["estimate"]["iteration_time_s"]
    # explicit times are the whole cost: iteration = last slice end, each slice = layers * (slope*ceil(b/n)+c)
    assert est == pytest.approx(max(s["end_s"] for s in out["slices"]))
    ops = {m["name"]: m for m in CONTRACT["workload"]["metaops"]}
    for s in out["slices"]:
        m, n = ops[s["metaop"]], len(s["devices"])
        t = m["time_ms_per_layer"]
        per_layer = t["slope_ms_per_sample"] * -(-m["batch_size"] // n) + t["intercept_ms"]
        assert s["end_s"] - s["start_s"] == pytest.approx(s["layers"] * per_layer / 1e3)
    assert out["lower_bound_s"] <= est <= min(out["baselines"].values()) + 1e-12
    # the exact model was warm-started from the wavefront plan and never does worse
    assert est <= out["search"]["wavefront_iteration_time_s"] + 1e-9


def test_estimate_of_a_returned_plan_reproduces_it() -> None:
    out = solve({**CONTRACT, "options": {"exact": False}})
    est = api.estimate({**CONTRACT, "slices": out["slices"]})
    assert est["iteration_time_s"] == pytest.approx(out["estimate"]["iteration_time_s"])
    assert est["lower_bound_s"] == pytest.approx(out["lower_bound_s"])


def _problems(req: dict[str, Any], fn: Any = solve) -> list[tuple[Any, ...]]:
    with pytest.raises(SpecError) as err:
        fn(req)
    return [tuple(p.loc) for p in err.value.problems]


def test_bad_input_names_the_field() -> None:
    bad = copy.deepcopy(CONTRACT)
    bad["workload"]["edges"].append(["cap-llm", "nowhere"])
    assert ("workload", "edges", 2, 1) in _problems(bad)
    cyc = copy.deepcopy(CONTRACT)
    cyc["workload"]["edges"].append(["cap-llm", "cap-vision"])
    assert ("workload", "edges") in _problems(cyc)
    neg = copy.deepcopy(CONTRACT)
    neg["workload"]["metaops"][0]["batch_size"] = 0
    assert ("workload", "metaops", 0, "batch_size") in _problems(neg)
    none = copy.deepcopy(CONTRACT)
    del none["workload"]["metaops"][1]["time_ms_per_layer"]
    assert any(loc[:3] == ("workload", "metaops", 1) for loc in _problems(none))
    dup = copy.deepcopy(CONTRACT)
    dup["workload"]["metaops"][1]["name"] = "cap-vision"
    assert ("workload", "metaops", 1, "name") in _problems(dup)
    typo = copy.deepcopy(CONTRACT)
    typo["workload"]["metaops"][0]["num_layer"] = 3
    assert any("num_layer" in loc for loc in _problems(typo))
    preset = {**CONTRACT, "workload": {"preset": "nope"}}
    assert any(loc[0] == "workload" for loc in _problems(preset))
    assert ("training", "precision") in _problems({**CONTRACT, "training": {"precision": "int3"}})
    assert ("training",) in _problems({**CONTRACT, "training": "bf16"})
    assert ("slices",) in _problems(CONTRACT, api.estimate)
    est = {**CONTRACT, "slices": [{"metaop": "cap-vision", "devices": [0, 2], "layers": 48}]}
    assert ("slices", 0, "devices") in _problems(est, api.estimate)


def test_cli_reports_bad_spindle_input_cleanly(tmp_path: Path) -> None:
    bad = copy.deepcopy(CONTRACT)
    bad["workload"]["edges"].append(["cap-llm", "nowhere"])
    f = tmp_path / "r.json"
    f.write_text(json.dumps(bad))
    out = subprocess.run([sys.executable, "-m", "paraplan_cli.main", "estimate", "-f", str(f), "--json"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "workload.edges" in out.stderr and "Traceback" not in out.stderr


def test_gantt_svg_draws_every_slice_coloured_by_task() -> None:
    import xml.etree.ElementTree as ET

    out = solve({**CONTRACT, "options": {"exact": False}})
    svg = gantt_svg(out)
    root = ET.fromstring(svg)
    ns = "{http://www.w3.org/2000/svg}"
    titles = [t.text or "" for t in root.iter(f"{ns}title")]
    assert len(titles) == len(out["slices"])
    boxes = [g.find(f"{ns}rect") for g in root.iter(f"{ns}g")]
    by_task: dict[str, set[str]] = {}
    for s, box in zip(out["slices"], boxes, strict=True):
        assert box is not None
        by_task.setdefault(s["task"], set()).add(box.get("fill", ""))
        assert float(box.get("height", 0)) == pytest.approx(len(s["devices"]) * 18 - 2)
    assert all(len(c) == 1 for c in by_task.values())  # one colour per task
    assert len({c for cs in by_task.values() for c in cs}) == len(by_task)  # distinct tasks, distinct colours


def test_baseline_plans_are_valid_schedules_with_the_reported_times() -> None:
    out = solve({**CONTRACT, "options": {"exact": False}})
    for name, plan in out["baseline_plans"].items():
        assert plan is not None
        assert plan["iteration_time_s"] == pytest.approx(out["baselines"][f"{name}_s"])
        est = api.estimate({**CONTRACT, "slices": plan["slices"]})
        assert est["iteration_time_s"] == pytest.approx(plan["iteration_time_s"])
    # sequential: every metaop on the whole cluster
    assert all(len(s["devices"]) == 16 for s in out["baseline_plans"]["sequential_full_cluster"]["slices"])


TINY: dict[str, Any] = {"kind": "spindle", "cluster": {"nodes": 1, "gpus_per_node": 2},
                        "workload": {"metaops": [{"name": "a", "batch_size": 2, "num_layers": 1, "time_ms_per_layer":
                                                  {"slope_ms_per_sample": 0.3, "intercept_ms": 1.0}}]},
                        "options": {"exact": False}}


def _op(**change: Any) -> dict[str, Any]:
    op = copy.deepcopy(TINY["workload"]["metaops"][0])
    for key, value in change.items():
        if key in ("slope_ms_per_sample", "intercept_ms"):
            op["time_ms_per_layer"][key] = value
        else:
            op[key] = value
    return {**TINY, "workload": {"metaops": [op]}}


@pytest.mark.parametrize(("request_", "loc"), [
    # numbers near the float limits crashed the planners (found by a fuzz): OverflowError, NaN splits, CP-SAT
    # domains, a zero division
    (_op(batch_size=10**400), ("workload", "metaops", 0, "batch_size")),
    (_op(slope_ms_per_sample=1e308), ("workload", "metaops", 0, "time_ms_per_layer", "slope_ms_per_sample")),
    (_op(intercept_ms=1e300), ("workload", "metaops", 0, "time_ms_per_layer", "intercept_ms")),
    (_op(slope_ms_per_sample=0, intercept_ms=5e-324), ("workload", "metaops", 0, "time_ms_per_layer")),
    (_op(intercept_ms=float("inf")), ("workload", "metaops", 0, "time_ms_per_layer", "intercept_ms")),
    # each in range, together centuries: CP-SAT's integer microseconds overflowed its domains
    (_op(batch_size=2**24, num_layers=4096, slope_ms_per_sample=1e7), ("workload", "metaops")),
])
def test_times_and_counts_beyond_physical_ranges_name_the_field(request_: dict[str, Any],
                                                                loc: tuple[str | int, ...]) -> None:
    assert loc in _problems(request_)


@pytest.mark.parametrize(("slice_", "field"), [
    ({"metaop": ["a"]}, "metaop"),  # TypeError: unhashable
    ({"wave": "a"}, "wave"),  # ValueError out of int()
    ({"wave": None}, "wave"),  # TypeError out of int()
    ({"start_s": float("nan")}, "start_s"),  # accepted
    ({"devices": [True]}, "devices"),  # accepted as device 1
    ({"layers": True}, "layers"),  # accepted as 1 layer
])
def test_an_estimates_malformed_slice_names_its_field(slice_: dict[str, Any], field: str) -> None:
    est = {**TINY, "slices": [{"metaop": "a", "devices": [0], "layers": 1, **slice_}]}
    assert _problems(est, api.estimate) == [("slices", 0, field)]


def test_a_module_given_as_a_model_preset_takes_its_layer_shape() -> None:
    """(The preset's dropout fields were refused as module fields: every Llama, Qwen, Mixtral and vit-huge preset,
    the very example of the module's docstring.)"""
    req = {**TINY, "workload": {"metaops": [{"name": "v", "batch_size": 8,
                                             "module": {"preset": "vit-huge", "seq_length": 257}}]}}
    out = solve(req)
    assert out["estimate"]["iteration_time_s"] > 0 and out["slices"]


VIT_SHAPE: dict[str, Any] = {"name": "vit", "num_layers": 6, "hidden_size": 1024, "num_attention_heads": 16,
                             "seq_length": 257}
LLM_SHAPE: dict[str, Any] = {"name": "llm", "num_layers": 8, "hidden_size": 2048, "num_attention_heads": 16,
                             "seq_length": 512, "causal": True, "mlp": "swiglu"}
GIVEN = {"slope_ms_per_sample": 1.5, "intercept_ms": 4.0}


def _shaped(given: dict[str, float] | None) -> dict[str, Any]:
    vit: dict[str, Any] = {"name": "cap/vit", "task": "cap", "batch_size": 16, "module": VIT_SHAPE}
    if given is not None:
        vit["time_ms_per_layer"] = given
    return {"kind": "spindle", "cluster": {"nodes": 1, "gpus_per_node": 4},
            "workload": {"metaops": [vit, {"name": "cap/llm", "task": "cap", "batch_size": 16, "module": LLM_SHAPE}],
                         "edges": [["cap/vit", "cap/llm"]]},
            "options": {"exact": False, "hybrid_layouts": False}}


def test_a_module_metaop_with_a_given_layer_time_is_priced_by_it_and_sized_by_its_shape() -> None:
    """A metaop giving both a module shape and time_ms_per_layer (e.g. measured on the cluster): the given time
    prices its layers (it was once silently ignored), the shape still sizes memory, hand-overs and sync."""
    given = solve(_shaped(GIVEN))
    assert given["estimate"]["given_layer_times"] == ["cap/vit"]
    assert given["estimate"]["memory_estimated"] and given["estimate"]["peak_memory_gib"] > 0
    for s in given["slices"]:
        if s["metaop"] == "cap/vit":
            per_layer = GIVEN["slope_ms_per_sample"] * -(-16 // len(s["devices"])) + GIVEN["intercept_ms"]
            assert s["ms_per_layer"] == pytest.approx(per_layer)
            assert s["compute_s"] == pytest.approx(s["layers"] * per_layer / 1e3)
    # the same schedule without the given time: the vit's layers are priced from its shape, everything the
    # shape sizes is unchanged, and the llm's own slices are priced alike
    derived = api.estimate({**_shaped(None), "slices": given["slices"]})
    again = api.estimate({**_shaped(GIVEN), "slices": given["slices"]})
    assert again["iteration_time_s"] == pytest.approx(given["estimate"]["iteration_time_s"])
    assert derived["given_layer_times"] == []
    assert derived["iteration_time_s"] != pytest.approx(again["iteration_time_s"])
    assert derived["memory_gib_per_device"] == pytest.approx(again["memory_gib_per_device"])
    assert derived["module_grad_sync_s"] == pytest.approx(again["module_grad_sync_s"])


def test_link_latency_prices_every_message_of_the_gradient_sync() -> None:
    """options.link_latency_us (gloo over TCP pays far more than NCCL's 20 us): each bucketed all-reduce of a
    module's gradients over g devices of k nodes pays g + k latencies. Both modules here run on all 4 devices of
    one node (one bucket each), so one more millisecond adds 5 ms to each module's sync; hidden behind the last
    backward at first, a large enough latency makes the iteration slower."""
    plan = solve(_shaped(GIVEN))
    assert all(s["devices"] == [0, 1, 2, 3] for s in plan["slices"])

    def at(latency_us: float) -> dict[str, Any]:
        req = _shaped(GIVEN)
        req["options"]["link_latency_us"] = latency_us
        return api.estimate({**req, "slices": plan["slices"]})

    base, plus_1ms, plus_50ms = at(20.0), at(1020.0), at(50_020.0)
    for module, secs in base["module_grad_sync_s"].items():
        assert plus_1ms["module_grad_sync_s"][module] - secs == pytest.approx(5e-3)
    assert plus_1ms["iteration_time_s"] >= base["iteration_time_s"]
    assert plus_50ms["iteration_time_s"] > base["iteration_time_s"] and plus_50ms["grad_sync_exposed_s"] > 0


def test_gradient_sync_hides_behind_the_last_slice_only_as_far_as_told() -> None:
    """options.grad_sync_overlap: the share of a module's last training slice its all-reduce may hide behind
    (DDP's buckets during the backward: 2/3 by default). At 0 the sync starts when the slice ends: the llm's last
    slice ends the schedule, so all of its sync is exposed; at the default some of it hides."""
    plan = solve(_shaped(GIVEN))

    def at(overlap: float | None) -> dict[str, Any]:
        req = _shaped(GIVEN)
        req["options"]["link_latency_us"] = 2000.0  # a sync long enough to matter
        if overlap is not None:
            req["options"]["grad_sync_overlap"] = overlap
        return api.estimate({**req, "slices": plan["slices"]})

    none, default = at(0.0), at(None)
    llm_end = max(s["end_s"] for s in plan["slices"] if s["metaop"] == "cap/llm")
    assert llm_end == pytest.approx(none["makespan_s"])
    assert none["grad_sync_exposed_s"] == pytest.approx(none["module_grad_sync_s"]["llm"])
    assert 0.0 <= default["grad_sync_exposed_s"] < none["grad_sync_exposed_s"]
    assert none["iteration_time_s"] == pytest.approx(none["makespan_s"] + none["module_grad_sync_s"]["llm"])
