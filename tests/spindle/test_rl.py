"""RL post-training (rollout, reward, update): the updated policy's weights resharded into the generation
layout, co-located or on a separate device group, through the public entry points and against brute force."""

from __future__ import annotations

import itertools
from dataclasses import replace
from typing import Any

import pytest

from solvers import api
from solvers.documents import SpindleEstimateResult, SpindleResult
from solvers.spindle.api import build_problem, parse_request
from solvers.spindle.cost import ACHIEVED_LINK_SHARE, LINK_LATENCY_S
from solvers.spindle.layouts import Layout
from solvers.spindle.schedule import Placement, evaluate, timeline
from solvers.spindle.summary import summarise
from solvers.strategy import LayerStrategy

POLICY = {"name": "policy", "num_layers": 4, "hidden_size": 1024, "num_attention_heads": 8, "seq_length": 256,
          "causal": True}
RL_OPS = [
    {"name": "rollout", "task": "rollout", "batch_size": 8, "module": POLICY, "mode": "decode", "decode_tokens": 64},
    {"name": "reward", "task": "reward", "batch_size": 8, "module": {**POLICY, "name": "reward-model"},
     "mode": "forward"},
    {"name": "update", "task": "update", "batch_size": 8, "module": POLICY},
]


def rl_request(nodes: int, per_node: int, off_policy: bool = False, **extra: Any) -> dict[str, Any]:
    """A synchronous step (the update trains on this step's rollouts), or a one-step off-policy one (on the
    previous step's: no edge into the update, so it may run beside the next rollout on a separate group)."""
    edges = [["rollout", "reward"]] + ([] if off_policy else [["reward", "update"]])
    return {"kind": "spindle", "cluster": {"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": per_node},
            "workload": {"metaops": RL_OPS, "edges": edges},
            "options": {"exact": False, "hybrid_layouts": False}, **extra}


def _slices(rollout: list[int], reward: list[int], update: list[int]) -> list[dict[str, Any]]:
    return [{"metaop": "rollout", "devices": rollout, "layers": 4},
            {"metaop": "reward", "devices": reward, "layers": 4},
            {"metaop": "update", "devices": update, "layers": 4}]


def _policy_bytes(request: dict[str, Any]) -> float:
    """bf16 weights of the whole policy (what a generation device without them must receive)."""
    problem = build_problem(parse_request(request))
    update = problem.workload.ops[problem.workload.index["update"]]
    return 2.0 * update.params_per_layer * update.layers


def test_co_located_data_parallel_update_needs_no_reshard() -> None:
    request = rl_request(1, 4)
    est = api.estimate({**request, "slices": _slices([0, 1, 2, 3], [0, 1, 2, 3], [0, 1, 2, 3])})
    assert isinstance(est, SpindleEstimateResult)
    move = est.weight_reshard["policy"]
    assert (move.colocation, move.time_s, move.max_gib_per_device, move.generation_devices) == ("co-located", 0.0,
                                                                                               0.0, 4)
    assert set(est.weight_reshard) == {"policy"}  # the reward model is never trained: nothing to reshard


@pytest.mark.parametrize(("nodes", "per_node", "link"), [(1, 4, "intra"), (2, 2, "inter")])
def test_a_separate_generation_group_receives_the_whole_policy(nodes: int, per_node: int, link: str) -> None:
    request = rl_request(nodes, per_node)
    est = api.estimate({**request, "slices": _slices([0, 1], [0, 1], [2, 3])})
    assert isinstance(est, SpindleEstimateResult)
    move = est.weight_reshard["policy"]
    nbytes = _policy_bytes(request)
    cluster = parse_request(request).cluster
    bandwidth = (cluster.intra_GBps if link == "intra" else cluster.inter_GBps_per_gpu) * 1e9 * ACHIEVED_LINK_SHARE
    assert move.colocation == "separate" and move.generation_devices == 2
    assert move.max_gib_per_device == pytest.approx(nbytes / 2**30)
    # each generation device takes the whole policy over its link (across nodes: the trainers' NICs send as
    # much, two of them for two receivers), after the update: the step pays it in full
    assert move.time_s == pytest.approx(nbytes / bandwidth + LINK_LATENCY_S)
    assert est.iteration_time_s >= est.makespan_s + move.time_s - 1e-12


def test_partly_co_located_generation_receives_only_what_it_lacks() -> None:
    request = rl_request(1, 4)
    est = api.estimate({**request, "slices": _slices([0, 1, 2, 3], [0, 1, 2, 3], [2, 3])})
    assert isinstance(est, SpindleEstimateResult)
    move = est.weight_reshard["policy"]
    assert move.colocation == "partly co-located" and move.generation_devices == 4
    assert move.max_gib_per_device == pytest.approx(_policy_bytes(request) / 2**30)


def _brute_force(request: dict[str, Any]) -> tuple[float, str]:
    """The best single-slice plan by full evaluation (time, transfers, gradient sync, reshard, memory): every
    block of every metaop, in every order the edges allow; its time and its policy co-location."""
    problem = build_problem(parse_request(request))
    wl = problem.workload
    n = problem.num_devices
    blocks = [(lo, k) for k in range(1, n + 1) for lo in range(n - k + 1)]
    orders = [p for p in itertools.permutations(range(3)) if all(p.index(u) < p.index(v)
                                                                  for v in range(3) for u in wl.preds[v])]
    best: tuple[float, str] = (float("inf"), "")
    for choice in itertools.product(blocks, repeat=3):
        for order in orders:
            placements = [Placement(i, wl.ops[i].layers, *choice[i]) for i in order]
            ev = evaluate(problem, timeline(problem, placements))
            if ev.fits and ev.iteration_time_s < best[0] * (1 - 1e-12):
                best = (ev.iteration_time_s, ev.reshards[0].colocation)
    return best


def test_the_planner_matches_brute_force_on_a_synchronous_rl_step() -> None:
    # the update trains on this step's rollouts: everything in turn, on every device, nothing to reshard
    request = rl_request(1, 4)
    want, colocation = _brute_force(request)
    out = api.solve(request)
    assert isinstance(out, SpindleResult)
    assert out.estimate.iteration_time_s <= want * (1 + 1e-9)
    assert colocation == out.estimate.weight_reshard["policy"].colocation == "co-located"
    assert "weight reshard of policy into the generation layout" in "\n".join(summarise(request, out))


@pytest.mark.parametrize(("nodes", "per_node"), [(1, 4), (2, 2)])
def test_an_off_policy_step_runs_the_update_beside_the_rollout_and_pays_the_reshard(nodes: int,
                                                                                     per_node: int) -> None:
    request = rl_request(nodes, per_node, off_policy=True)
    want, colocation = _brute_force(request)
    # the best single-slice plan trains on a separate device group while the others generate
    assert colocation == "separate"
    out = api.solve(request)
    assert isinstance(out, SpindleResult)
    # the planner may split the rollout into stages (wider once the update is done): never worse
    assert out.estimate.iteration_time_s <= want * (1 + 1e-9)
    move = out.estimate.weight_reshard["policy"]
    assert move.colocation != "co-located" and move.time_s > 0
    updated = max(s.end_s for s in out.slices if s.metaop == "update")
    assert out.estimate.iteration_time_s >= updated + move.time_s - 1e-12
    synchronous = api.solve(rl_request(nodes, per_node))
    assert isinstance(synchronous, SpindleResult)
    assert out.estimate.iteration_time_s < synchronous.estimate.iteration_time_s


@pytest.mark.parametrize(("strategy", "held"), [(LayerStrategy(tp=2, dp=2, zero=1), 1 / 2),
                                                 (LayerStrategy(tp=2, dp=2, zero=3), 1 / 4),
                                                 (LayerStrategy(tp=1, dp=4, zero=2), 1.0)])
def test_a_sharding_training_layout_gathers_the_rest_of_the_weights(strategy: LayerStrategy, held: float) -> None:
    request = rl_request(1, 4)
    problem = build_problem(parse_request(request))
    wl = problem.workload
    update = wl.index["update"]
    layouts = tuple(Layout(strategy, 1.0, 0.0, 0.0, 0.0) if n == 4 else None for n in range(1, 5))
    ops = tuple(replace(op, layouts=layouts) if i == update else op for i, op in enumerate(wl.ops))
    problem = replace(problem, workload=replace(wl, ops=ops))
    slices = timeline(problem, [Placement(i, wl.ops[i].layers, 0, 4) for i in range(3)])
    (move,) = evaluate(problem, slices).reshards
    nbytes = (1 - held) * _policy_bytes(request)
    bandwidth = parse_request(request).cluster.intra_GBps * 1e9 * ACHIEVED_LINK_SHARE
    assert move.colocation == "co-located"
    assert move.max_bytes_per_device == pytest.approx(nbytes)
    assert move.time_s == pytest.approx(nbytes / bandwidth + (LINK_LATENCY_S if nbytes else 0.0))
