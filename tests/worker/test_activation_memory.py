"""What the worker's runtime keeps for backward, measured with autograd's saved-tensor hooks on a real layer (CPU,
fp32), against the memory model's count for the runtime's stack (``training.stack.framework = "paraplan"``: fused
attention through SDPA, eager elementwise ops, no dropout).

Measured on CPU, where ``F.rms_norm`` runs as its composite ops and so keeps, besides its input, the normalised
input for the weight's gradient: CUDA runs it as one fused kernel (``torch._fused_rms_norm``, PyTorch 2.9 and
later), which keeps the input and a per-token statistic only, as the model counts. The comparison adds that
CPU-only tensor to the model's count."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from solvers.cost_model.memory import RC_NONE, SP_NONE, activation_bytes
from solvers.cost_model.shapes import layer_shape
from solvers.specs import ModelSpec
from worker.runtime.model import Block, ModelConfig

BATCH, SEQ = 2, 128


def saved_bytes(module: nn.Module, x: torch.Tensor) -> int:
    """Bytes of the distinct storages autograd saves for backward in ``module``'s forward, its parameters aside."""
    sizes: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        sizes[storage.data_ptr()] = max(sizes.get(storage.data_ptr(), 0), storage.nbytes())
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        module(x)
    params = {p.untyped_storage().data_ptr() for p in module.parameters()}
    return sum(n for ptr, n in sizes.items() if ptr not in params)


@pytest.mark.parametrize(("mlp", "kv_heads"), [("swiglu", 4), ("gelu", 8)])
def test_the_runtimes_layer_keeps_what_the_memory_model_counts_for_its_eager_stack(mlp: str, kv_heads: int) -> None:
    """Within 2 % (the rest: per-token norm statistics, softmax log-sum-exp, rotary tables); an eager SwiGLU keeps
    silu's output besides its inputs and product, which the count for fused kernels leaves out (a seventh of this
    layer)."""
    spec = ModelSpec.model_validate({
        "name": "t", "num_layers": 1, "hidden_size": 256, "num_attention_heads": 8, "num_kv_heads": kv_heads,
        "ffn_hidden_size": 704, "vocab_size": 128, "mlp": mlp, "attention_dropout": 0.0, "hidden_dropout": 0.0})
    torch.manual_seed(0)
    x = torch.randn(BATCH, SEQ, spec.hidden_size, requires_grad=True)
    measured = saved_bytes(Block(ModelConfig.from_spec(spec)), x)

    def counted(eager: bool) -> float:
        kept, _ = activation_bytes(layer_shape(spec, 0), SEQ, BATCH, 1, 1, SP_NONE, RC_NONE, elem_bytes=4.0,
                                   flash=True, eager=eager)
        cpu_norms = 2 * BATCH * SEQ * spec.hidden_size * 4  # the two norms' normalised inputs (module docstring)
        return float(kept) + cpu_norms

    assert measured == pytest.approx(counted(eager=True), rel=0.02)
    if mlp == "swiglu":
        assert abs(measured / counted(eager=False) - 1) > 0.1
    else:  # no elementwise op of a GeLU layer keeps more run eagerly
        assert counted(eager=False) == counted(eager=True)
