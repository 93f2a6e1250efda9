"""The module cost model: FLOP-derived per-layer time, memory and communication terms."""

from __future__ import annotations

import pytest

from solvers.spindle.api import build_problem, parse_request
from solvers.spindle.cost import Topology, allreduce_s, transfer_s
from solvers.spindle.workload import MetaOp

VIT_L = {"name": "vit", "num_layers": 24, "hidden_size": 1024, "num_attention_heads": 16, "ffn_hidden_size": 4096,
         "seq_length": 257}


def _op(**kw: object) -> MetaOp:
    req = {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
           "workload": {"metaops": [{"name": "m", "batch_size": 64, "module": VIT_L, **kw}]},
           "options": {"efficiency": 0.5, "kernel_overhead_ms": 0.0}}
    op: MetaOp = build_problem(parse_request(req)).workload.ops[0]
    return op


def test_train_slope_is_three_forward_passes_of_the_layer_flops() -> None:
    op = _op()
    h, s = 1024, 257
    params = 4 * h * h + 2 * h * 4096 + 2 * h
    flops = 3 * (2 * (params - 2 * h) * s + 4 * s * s * h)
    eff = 0.5 * h / (h + 256)  # narrow-layer efficiency of the model
    assert op.slope_ms == pytest.approx(flops / (312e12 * eff) * 1e3, rel=1e-6)
    assert op.layers == 24 and op.params_per_layer == params
    # recomputation adds a forward and keeps only layer inputs
    rc = _op(recompute=True)
    assert rc.slope_ms == pytest.approx(op.slope_ms * 4 / 3)
    assert rc.act_bytes_per_sample_layer < op.act_bytes_per_sample_layer / 10


def test_decode_scales_worse_than_training() -> None:
    train, dec = _op(), _op(mode="decode", decode_tokens=128)
    # the weight-read floor per decode step makes the intercept a larger share of a layer's time
    assert dec.intercept_ms / dec.layer_ms(8) > train.intercept_ms / train.layer_ms(8)


def test_collectives_are_slower_across_nodes() -> None:
    topo = Topology(16, 8, 300e9, 25e9)
    inside = allreduce_s(1e9, frozenset(range(8)), topo)
    across = allreduce_s(1e9, frozenset(range(4, 12)), topo)
    assert 0 < inside < across
    assert allreduce_s(1e9, frozenset({3}), topo) == 0.0
    op = _op()
    assert transfer_s(op, (0, 4), (0, 4), topo) == 0.0  # same block: nothing moves
    assert transfer_s(op, (0, 4), (4, 4), topo) < transfer_s(op, (0, 4), (8, 4), topo)
