"""``worker.profiler`` measures the dense layer under DeepSpeed-Ulysses as the runtime runs it: each rank on its
slice of the sequence, the all-to-alls around attention inside the time."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from solvers.cost_model.profile import Profile
from tests.worker.two_ranks import on_two_ranks
from worker.profiler import profile_ulysses_layers, ulysses_block
from worker.runtime.model import Block, ModelConfig

CFG = ModelConfig(num_layers=1, hidden_size=16, num_heads=2, num_kv_heads=2, head_dim=8, ffn_hidden_size=32,
                  vocab_size=32)
CPU = torch.device("cpu")
SEQ = 8


def _ulysses_output_and_profile(rank: int) -> tuple[float, float, list[dict[str, Any]]]:
    torch.manual_seed(1)
    x = torch.randn(2, SEQ, CFG.hidden_size)
    mine = x[:, rank * SEQ // 2:(rank + 1) * SEQ // 2]
    torch.manual_seed(0)
    full = Block(CFG)
    sharded = ulysses_block(CFG, 2, CPU)
    torch.manual_seed(0)
    alone = Block(CFG)  # the same weights, no exchange: attends only its own half of the sequence
    with torch.no_grad():
        want = full(x)[:, rank * SEQ // 2:(rank + 1) * SEQ // 2]
        gap = float((sharded(mine) - want).abs().max())
        control = float((alone(mine) - want).abs().max())
    return gap, control, profile_ulysses_layers(CFG, [1, 2], [SEQ, 6], [1, 2, 4], CPU, 2)


def test_a_ulysses_layer_is_measured_as_the_runtime_runs_it_on_real_ranks() -> None:
    got = on_two_ranks(_ulysses_output_and_profile)
    # each rank's half of the sequence, whole sequences attended after the all-to-all: the full layer's output
    assert got[0][0] < 1e-5 and got[1][0] < 1e-5
    # negative control: without the exchange the second half misses the first half's keys (and its positions)
    assert got[1][1] > 1e-3
    rows = got[0][2]
    assert rows == got[1][2]  # one figure for the node
    # degree 2 only (1 is the plain layer, 4 exceeds the ranks), at both sequences it divides
    assert sorted((r["seq"], r["ulysses"], r["batch"]) for r in rows) == [(6, 2, 1), (6, 2, 2), (8, 2, 1), (8, 2, 2)]
    profile = Profile.model_validate({"layer_times": rows})
    assert all(x.tp == 1 and x.forward_ms > 0 and (x.backward_ms or 0) > 0 for x in profile.layer_times)
    uly = profile.layer_s(np.array([1.0, 1.0, 1.0]), SEQ, np.ones(3), ulysses=np.array([2.0, 4.0, 1.0]))
    assert np.isfinite(uly[0]) and np.isnan(uly[1]) and np.isnan(uly[2])  # the plain layer was not profiled here
