"""``worker.profiler`` measures the MoE layer as the runtime runs it: besides every expert on one rank and expert TP
under TP, with its experts dealt over ep ranks, the dispatch and combine all-to-alls inside the time."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from solvers.cost_model.profile import Profile
from tests.worker.two_ranks import on_two_ranks
from worker.profiler import moe_block, moe_layouts, profile_moe_layers
from worker.runtime.model import Block, ModelConfig
from worker.runtime.moe import MoEConfig, MoELayer

CFG = ModelConfig(num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=2, head_dim=8, ffn_hidden_size=32,
                  vocab_size=32, moe=MoEConfig(num_experts=4, top_k=2, ffn_hidden_size=16))
CPU = torch.device("cpu")


def test_the_moe_layer_is_measured_in_every_layout_a_plan_may_give_it_on_the_node() -> None:
    assert moe_layouts(CFG, 8, [2, 4], 4) == [
        (1, False, 1), (1, False, 2), (1, False, 4), (2, False, 1), (2, False, 2), (2, True, 1), (2, True, 2),
        (4, False, 1), (4, True, 1)]
    # ep divides the experts and ep x tp the ranks; tp the sequence and the expert width
    two_experts = replace(CFG, moe=MoEConfig(num_experts=2, top_k=1, ffn_hidden_size=6))
    assert moe_layouts(two_experts, 8, [2, 4], 4) == [(1, False, 1), (1, False, 2), (2, False, 1), (2, False, 2),
                                                      (2, True, 1), (2, True, 2)]
    assert moe_layouts(CFG, 6, [2, 4], 2) == [(1, False, 1), (1, False, 2), (2, False, 1), (2, True, 1)]


def _expert_parallel_output_and_profile(rank: int) -> tuple[float, int, list[dict[str, Any]]]:
    torch.manual_seed(1)
    x = torch.randn(2, 8, CFG.hidden_size)
    torch.manual_seed(0)
    full = Block(CFG, 0)
    sharded, tp_mesh = moe_block(CFG, 0, 1, 2, CPU, False)
    assert tp_mesh is None and isinstance(sharded.feed_forward, MoELayer)
    with torch.no_grad():
        gap = float((sharded(x) - full(x)).abs().max())
    return gap, sharded.feed_forward.experts.count, profile_moe_layers(CFG, [1, 2], [8], CPU, 2, tps=[2])


def test_an_expert_parallel_moe_layer_is_measured_as_the_runtime_runs_it_on_real_ranks() -> None:
    got = on_two_ranks(_expert_parallel_output_and_profile)
    for gap, experts, _ in got.values():
        # half the experts on each rank, tokens reaching them by all-to-all: the full layer's output
        assert experts == 2 and gap < 1e-5
    rows = got[0][2]
    assert rows == got[1][2]  # one figure for the node
    assert sorted((r["tp"], r.get("sp", False), r.get("ep", 1), r["batch"]) for r in rows) == [
        (1, False, 1, 1), (1, False, 1, 2), (1, False, 2, 1), (1, False, 2, 2),
        (2, False, 1, 1), (2, False, 1, 2), (2, True, 1, 1), (2, True, 1, 2)]
    profile = Profile.model_validate({"layer_times": rows})
    assert all(x.layer_type == "moe" and x.forward_ms > 0 and (x.backward_ms or 0) > 0 for x in profile.layer_times)
    ep2 = profile.layer_s(np.array([1.0, 1.0]), 8, np.array([1.0, 1.0]), "moe", ep=np.array([2.0, 4.0]))
    assert np.isfinite(ep2[0]) and np.isnan(ep2[1])  # ep 2 measured, ep 4 (over 4 ranks) not
