"""training.stack.elementwise = "eager" (PyTorch eager mode, torchtitan without torch.compile): the HBM traffic of
the unfused ops, counted by hand from the ops a Llama layer runs, in every pass that runs them."""

from __future__ import annotations

import pytest

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import StageContext
from solvers.specs import ClusterSpec, ModelSpec, TrainingSpec
from solvers.strategy import LayerStrategy

LLAMA = ModelSpec(num_layers=4, hidden_size=4096, num_attention_heads=32, num_kv_heads=8, ffn_hidden_size=14336,
                  vocab_size=128256, mlp="swiglu", hidden_dropout=0.0, attention_dropout=0.0)
GPT = ModelSpec(num_layers=4, hidden_size=2048, num_attention_heads=16, vocab_size=51200, mlp="gelu")
S, SAMPLES = 8192, 2


def _parts(model: ModelSpec, elementwise: str, strategy: LayerStrategy) -> tuple[dict[str, float], float]:
    """A layer's time parts (seconds) on a torchtitan stack, and the HBM bandwidth they are priced at."""
    cluster = ClusterSpec(gpu="H100-SXM", nodes=1, gpus_per_node=8)
    training = TrainingSpec(global_batch_size=SAMPLES, seq_length=S,
                            stack={"framework": "torchtitan", "elementwise": elementwise})
    cost = AnalyticCostModel(model, cluster, training)
    ctx = StageContext(pp=1, stage=0, micro_batches=1, micro_batch_samples=SAMPLES * strategy.dp)
    parts = cost.layer_costs(0, [strategy], ctx).parts_s
    return {k: float(v[0]) for k, v in parts.items()}, cost.hbm_Bps


@pytest.mark.parametrize(("tp", "sp", "recompute", "replays"), [
    (1, None, "none", 0), (2, "megatron", "selective", 1), (2, None, "full", 1), (4, "ulysses", "selective", 1)])
def test_eager_mode_adds_the_unfused_norms_rotary_embeddings_and_swiglu(tp: int, sp: str | None, recompute: str,
                                                                       replays: int) -> None:
    """Per token of the forward, eager mode adds: two RMSNorms decomposed with an fp32 upcast (36 bytes an element
    against 4 fused), rotary embeddings on q and k (20 against 4), SwiGLU's silu and product (10 against 6 an
    element of the FFN width). The norms' tensors are split over tp only under SP, the others always; Ulysses
    splits the tokens. Forward once, backward twice, and once more wherever the pass is replayed."""
    h, q, kv, ffn = 4096, 4096, 1024, 14336
    strategy = LayerStrategy(tp=tp, dp=1, sp=sp, recompute=recompute)
    tokens = S * SAMPLES / (tp if sp == "ulysses" else 1)
    norms = 2 * (36 - 4) * h / (tp if sp == "megatron" else 1)
    split = ((20 - 4) * (q + kv) + (10 - 6) * ffn) / (1 if sp == "ulysses" else tp)
    fused, bandwidth = _parts(LLAMA, "fused", strategy)
    eager, _ = _parts(LLAMA, "eager", strategy)
    forward_s = tokens * (norms + split) / bandwidth
    assert eager["compute"] - fused["compute"] == pytest.approx(3 * forward_s, rel=1e-9)
    assert eager["recompute"] - fused["recompute"] == pytest.approx(replays * forward_s, rel=1e-9, abs=1e-12)


def test_a_gelu_layer_differs_only_by_its_dropout_and_residual_add() -> None:
    """GPT's LayerNorm and GeLU are one kernel each in eager mode too; its hidden dropout and residual add run as
    two kernels instead of one (4 bytes an element more, twice a layer). Without dropout nothing differs."""
    strategy = LayerStrategy(tp=2, dp=1, recompute="none")
    fused, bandwidth = _parts(GPT, "fused", strategy)
    eager, _ = _parts(GPT, "eager", strategy)
    assert eager["compute"] - fused["compute"] == pytest.approx(3 * S * SAMPLES * 2 * 4 * 2048 / bandwidth, rel=1e-9)
    no_dropout = GPT.model_copy(update={"hidden_dropout": 0.0})
    assert _parts(no_dropout, "eager", strategy)[0] == pytest.approx(_parts(no_dropout, "fused", strategy)[0])
