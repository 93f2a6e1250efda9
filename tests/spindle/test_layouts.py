"""Hybrid layouts inside metaops: a metaop on k devices runs the best memory-checked layout for k devices."""

from __future__ import annotations

import itertools
import time
from typing import Any

import pytest

from solvers import api
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import StageContext
from solvers.documents import SpindleResult
from solvers.errors import InfeasibleError
from solvers.specs import ClusterSpec, TrainingSpec
from solvers.spindle.layouts import RESERVE_BYTES, LayoutQuery, layout_table
from solvers.spindle.summary import summarise
from solvers.spindle.workload import ModuleShape
from solvers.strategy import LayerStrategy

LARGE_64: dict[str, Any] = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 8, "gpus_per_node": 8},
                            "workload": {"preset": "llm70b-vision-audio"}, "options": {"exact": False}}


def test_a_70b_llm_branch_with_two_encoders_plans_on_64_gpus_in_5_s() -> None:
    t0 = time.perf_counter()
    out = api.solve(LARGE_64)
    took = time.perf_counter() - t0
    assert isinstance(out, SpindleResult)
    assert took <= 5.0 and out.estimate.fits and out.estimate.peak_memory_gib is not None
    assert out.estimate.memory_limit_gib is not None
    assert out.estimate.peak_memory_gib <= out.estimate.memory_limit_gib
    llm = [s for s in out.slices if s.module == "llama-70b"]
    assert llm and all(s.layout is not None for s in llm)
    for s in llm:
        assert s.layout is not None and s.layout.tp * s.layout.cp * s.layout.dp == len(s.devices)
    # the layouts are what place it: data parallelism alone cannot hold a 70B layer's states on a device
    with pytest.raises(InfeasibleError):
        api.solve({**LARGE_64, "options": {"exact": False, "hybrid_layouts": False}})
    # the summary names each slice's layout
    text = "\n".join(summarise(LARGE_64, out))
    assert all(f"[{s.layout.label()}]" in text for s in llm if s.layout is not None)


MODULE = ModuleShape(name="m", num_layers=8, hidden_size=2048, num_attention_heads=16, seq_length=8192,
                     ffn_hidden_size=8192)
CLUSTER = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8})


def _brute_force(q: LayoutQuery, dp_fits: tuple[bool, ...]) -> list[tuple[float, float] | None]:
    """Per width, (time factor, per-device memory) of the best layout, each candidate priced on its own: every
    tp x cp x dp factorisation (any divisor), ZeRO 0-3, every recomputation; None where plain data parallelism
    stays (it fits and no layout is faster)."""
    model = q.module.model_spec()
    cost = AnalyticCostModel(model, q.cluster, TrainingSpec(global_batch_size=q.batch, seq_length=q.module.seq_length))
    ctx = StageContext(pp=1, stage=0, micro_batches=1, micro_batch_samples=float(q.batch))

    def price(st: LayerStrategy) -> tuple[float, float]:
        c = cost.layer_costs(0, [st], ctx)
        mem = q.layers * (c.state_bytes[0] + c.activation_bytes[0]) + c.peak_extra_bytes[0] + RESERVE_BYTES
        return float(c.time_s[0] + c.step_time_s[0]), float(mem)

    out: list[tuple[float, float] | None] = []
    for n in range(1, q.widths + 1):
        ref, _ = price(LayerStrategy(dp=min(n, q.batch), zero=1, recompute="full" if q.recompute else "none"))
        best: tuple[float, float] | None = None
        for tp, cp in itertools.product(range(1, n + 1), repeat=2):
            valid = (tp <= q.cluster.gpus_per_node and model.num_attention_heads % tp == 0
                     and q.module.seq_length % (2 * cp) == 0)  # (ring attention: two balanced chunks per rank)
            if n % (tp * cp) or not valid or n // (tp * cp) > q.batch:
                continue
            for zero, rc in itertools.product((0, 1, 2, 3), ("none", "selective", "full")):
                if q.recompute and rc != "full":
                    continue
                st = LayerStrategy(tp=tp, cp=cp, dp=n // (tp * cp), sp="megatron" if tp > 1 else None, zero=zero,
                                   recompute=rc)  # type: ignore[arg-type]
                t, mem = price(st)
                if mem <= q.memory_limit_bytes and (best is None or t < best[0]):
                    best = (t, mem)
        if best is None or (dp_fits[n - 1] and best[0] >= ref * (1 - 1e-9)):
            out.append(None)
        else:
            out.append((best[0] / ref, best[1]))
    return out


@pytest.mark.parametrize(("batch", "limit_gib", "dp_fits"), [
    (4, 40.0, (False,) * 8),  # data parallelism never holds it: the fastest layout that fits, every width
    (4, 79.0, (True,) * 8),  # it does: a layout only where it is faster (context parallelism past 4 devices)
])
def test_the_layout_choice_matches_brute_force_on_a_small_case(batch: int, limit_gib: float,
                                                               dp_fits: tuple[bool, ...]) -> None:
    q = LayoutQuery(MODULE, 0, MODULE.num_layers, batch, False, CLUSTER, "bf16", limit_gib * 2**30, 8)
    table = layout_table(q, dp_fits)
    expect = _brute_force(q, dp_fits)
    assert any(want is not None for want in expect) and any(want is None for want in expect)
    for n, (lay, want) in enumerate(zip(table, expect, strict=True), start=1):
        if want is None:
            assert lay is None, n
            continue
        assert lay is not None, n
        # the search's candidates are a subset of the brute force's (tp and cp powers of two): it must not lose
        assert lay.time_factor == pytest.approx(want[0], rel=0.05), (n, lay.strategy)
        mem = MODULE.num_layers * (lay.state_bytes_per_layer + lay.act_bytes_per_layer) + lay.work_bytes
        assert mem + RESERVE_BYTES <= q.memory_limit_bytes


def test_the_layout_search_is_cached_per_module_and_width() -> None:
    q = LayoutQuery(MODULE, 0, MODULE.num_layers, 8, True, CLUSTER, "bf16", 60 * 2**30, 8)
    layout_table(q, (False,) * 8)
    hits = layout_table.cache_info().hits
    t0 = time.perf_counter()
    again = layout_table(q, (False,) * 8)
    assert layout_table.cache_info().hits == hits + 1 and time.perf_counter() - t0 < 1e-3
    assert again is layout_table(q, (False,) * 8)
