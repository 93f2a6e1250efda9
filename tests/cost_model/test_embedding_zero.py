"""The embedding and LM head follow the layers' ZeRO rule: ZeRO-2 reduce-scatters every micro-batch,
ZeRO-3 also gathers the weights for forward and backward and holds them while they run; a tied embedding split over
the pipeline sums its gradients between its two stages, exposed."""

from __future__ import annotations

from dataclasses import replace

import pytest

from solvers.api import estimate
from solvers.cost_model import communication as comm
from solvers.cost_model.aggregate import stage_context
from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.request import HybridRequest, parse
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

from .conftest import request


def _fixed(zero: int, dp_overlap: float = 1.0) -> tuple[AnalyticCostModel, dict[str, float], dict[str, float],
                                                          dict[str, float]]:
    req = parse(HybridRequest, request(model={"preset": "llama2-7b", "num_layers": 2},
                                       cluster={"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}))
    model = AnalyticCostModel(req.model, req.cluster, req.training,
                              calibration=replace(DEFAULT_CALIBRATION, dp_overlap=dp_overlap))
    plan = PlanStrategy(pp=1, micro_batches=8, layers=(LayerStrategy(dp=8),) * 2, stage_layers=(2,),
                        embedding=EmbeddingStrategy(tp=1, dp=8, zero=zero))
    fixed = model.stage_fixed(stage_context(plan, 0, 64))
    return model, fixed.parts_s, fixed.step_parts_s, fixed.memory_parts_bytes


def test_embedding_zero_traffic_and_gathered_weights() -> None:
    model, *_ = _fixed(0)
    params = 2 * 32000 * 4096  # embedding and untied head on the one stage, tp 1
    gather = float(comm.allgather_s(params * 2.0, 8, 8, model.links)[()])
    scatter = float(comm.allgather_s(params * model.cal.grad_comm_bytes, 8, 8, model.links)[()])
    allreduce = float(comm.allreduce_s(params * model.cal.grad_comm_bytes, 8, 8, model.links)[()])

    _, parts, _, memory = _fixed(3)
    hide = model.cal.zero_overlap * parts["compute"]
    assert parts["dp_comm_exposed"] == pytest.approx(max(0.0, 2 * gather + scatter - hide), rel=1e-9)
    assert parts["dp_comm_exposed"] > 0  # a lookup and one head GEMM cannot hide 3 collectives of 0.5 GB
    assert memory["gathered"] == pytest.approx(params * 2.0 * 7 / 8)
    _, parts, _, memory = _fixed(2)
    assert parts["dp_comm_exposed"] == pytest.approx(max(0.0, scatter - hide), rel=1e-9)
    assert "gathered" not in memory
    for zero in (0, 1):
        _, parts, _, memory = _fixed(zero)
        assert "dp_comm_exposed" not in parts and "gathered" not in memory

    # per step, with nothing hidden: ZeRO-0 all-reduces, ZeRO-1 reduce-scatters and gathers, ZeRO-2 gathers
    per_step = {0: allreduce, 1: scatter + gather, 2: gather, 3: 0.0}
    for zero, expected in per_step.items():
        _, _, step, _ = _fixed(zero, dp_overlap=0.0)
        assert step["dp_comm_exposed"] == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 2), (2, 1)])
def test_a_tied_embedding_split_over_the_pipeline_sums_its_gradients_exposed(nodes: int, per_node: int) -> None:
    """A tied embedding's first (lookup) and last (LM head) stages sum its gradients once a step, after the
    data-parallel sync (Megatron's finalize_model_grads): exposed although the stack overlaps that sync, over the
    node's links where both stages share it and over the network where they do not. An untied model has no sum."""
    model = {"preset": "bert-large", "num_layers": 2}
    req = request(model=model, cluster={"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": per_node},
                  training={"global_batch_size": 2, "seq_length": 512},
                  strategy={"pp": 2, "micro_batches": 1, "stage_layers": [1, 1]})
    parsed = parse(HybridRequest, req)
    links = AnalyticCostModel(parsed.model, parsed.cluster, parsed.training).links
    grads = parsed.model.vocab_size * parsed.model.hidden_size * DEFAULT_CALIBRATION.grad_comm_bytes
    expected = float(comm.allreduce_s(grads, 2, 2 if nodes == 1 else 1, links))
    breakdown = estimate(req).to_json()["breakdown_s"]
    assert breakdown["dp_comm_exposed"] == pytest.approx(expected, rel=1e-9)
    untied = estimate({**req, "model": {**model, "tied_embeddings": False}}).to_json()["breakdown_s"]
    assert untied.get("dp_comm_exposed", 0.0) == 0.0  # (one GPU a stage: no data-parallel sync either)
