"""Under Megatron SP the norms' weights are replicated over tp while each tp rank normalises its own slice of the
sequence: their gradients come out of backward partial (each rank's sum over its slice). The runtime sums them
over tp once per step (``reduce_partial_gradients``) instead of leaving the optimizer to redistribute each one."""

from __future__ import annotations

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate

from tests.worker.two_ranks import on_two_ranks
from worker.runtime.model import ModelConfig, build_model, lm_loss
from worker.runtime.tensor_parallel import apply_tensor_parallel, reduce_partial_gradients

CFG = ModelConfig(num_layers=2, hidden_size=16, num_heads=2, num_kv_heads=2, head_dim=8, ffn_hidden_size=32,
                  vocab_size=32)

Gaps = dict[str, tuple[bool, float, bool, float]]


def _norm_gradients(rank: int) -> Gaps:
    torch.manual_seed(3)
    tokens = torch.randint(0, CFG.vocab_size, (2, 9))
    x, y = tokens[:, :-1], tokens[:, 1:]
    reference = build_model(CFG, 0)
    lm_loss(reference(x), y).backward()
    expected = {n: p.grad for n, p in reference.named_parameters() if "norm" in n and p.grad is not None}

    model = build_model(CFG, 0)
    apply_tensor_parallel(model, init_device_mesh("cpu", (2,)), sequence_parallel=True)
    lm_loss(model(x), y).backward()
    params = dict(model.named_parameters())
    # (placement, this rank's part) before the call, which sums the parts in place
    before = {n: (g.placements[0], g.to_local().clone()) for n in expected if isinstance(g := params[n].grad, DTensor)}
    reduce_partial_gradients(model.parameters())
    out: Gaps = {}
    for n, want in expected.items():
        (placement, part), reduced = before[n], params[n].grad
        assert isinstance(reduced, DTensor)
        # the partial gradient's own part (this rank's slice alone) against the sum it becomes, relative to the
        # gradient's largest element
        scale = float(want.abs().max())
        out[n] = (isinstance(placement, Partial), float((part - want).abs().max()) / scale,
                  reduced.placements == (Replicate(),), float((reduced.to_local() - want).abs().max()) / scale)
    return out


def test_sequence_parallel_norm_gradients_are_summed_over_tp_once_to_the_full_gradient() -> None:
    got = on_two_ranks(_norm_gradients)
    for gaps in got.values():
        # two norms per block and the final one, every one of them
        assert len(gaps) == 2 * CFG.num_layers + 1
        for name, (was_partial, partial_gap, replicated, gap) in gaps.items():
            assert was_partial and replicated, name
            assert gap < 1e-5, name
            # negative control: one rank's part alone is far from the gradient
            assert partial_gap > 0.05, name
