"""``worker.profiler.merge_profiles``: several passes of one launch become one profile, point by point (median),
that the cost model accepts."""

from __future__ import annotations

from typing import Any

import pytest

from solvers.cost_model.profile import load_profile
from worker.profiler import _group_sets, merge_profiles


def one_pass(scale: float) -> dict[str, Any]:
    return {"profile": {"name": "p", "gpu": "cpu",
                        "layer_times": [{"batch": 4, "seq": 128, "tp": 1, "forward_ms": 10 * scale,
                                         "backward_ms": 20 * scale},
                                        {"batch": 4, "seq": 128, "tp": 1, "cp": 2, "forward_ms": 7 * scale,
                                         "backward_ms": 9 * scale},
                                        {"batch": 4, "seq": 128, "tp": 1, "layer_type": "moe",
                                         "forward_ms": 11 * scale, "backward_ms": 21 * scale},
                                        {"batch": 4, "seq": 128, "tp": 1, "ep": 2, "layer_type": "moe",
                                         "forward_ms": 13 * scale, "backward_ms": 23 * scale}],
                        "collectives": [{"op": "allreduce", "group_size": 4, "across_nodes": False,
                                         "message_bytes": 1024.0, "time_ms": scale},
                                        {"op": "allreduce", "group_size": 4, "across_nodes": True,
                                         "message_bytes": 1024.0, "time_ms": 3 * scale}],
                        "overheads": [{"parallelism": "fsdp", "reshard": True, "forward_ms": scale,
                                       "backward_ms": 0.0}],
                        "host": {"busy_ranks": 4, "slowdown": 1.0 + scale}},
            "device": {"peak_tflops": scale, "memory_bandwidth_GBps": 10 * scale, "optimizer_s_per_param": 1e-9 * scale,
                       "profile_time_s": 1.0}}


def test_passes_merge_point_by_point_into_their_median() -> None:
    doc = merge_profiles([one_pass(1.0), one_pass(5.0), one_pass(2.0)])  # a burst of load in the second pass
    prof = load_profile(doc["profile"])
    dense = {x.cp: x for x in prof.layer_times if x.layer_type == "dense"}
    assert len(prof.layer_times) == 4 and dense[1].forward_ms == 20.0 and dense[2].backward_ms == 18.0
    moe = {x.ep: x for x in prof.layer_times if x.layer_type == "moe"}  # the expert-parallel degree keeps them apart
    assert (moe[1].forward_ms, moe[2].forward_ms, moe[2].backward_ms) == (22.0, 26.0, 46.0)
    by_across = {c.across_nodes: c.time_ms for c in prof.collectives}
    assert by_across == {False: 2.0, True: 6.0}  # the placement is part of a point's identity
    assert prof.overheads[0].forward_ms == 2.0 and prof.host is not None and prof.host.slowdown == 3.0
    assert doc["device"]["peak_tflops"] == 2.0 and doc["device"]["passes"] == 3
    assert doc["device"]["profile_time_s"] == 3.0
    with pytest.raises(ValueError):
        merge_profiles([])


def test_collective_groups_of_a_multi_node_launch_say_how_many_nodes_they_span() -> None:
    one_node = _group_sets(4, 1)
    assert one_node == [([[0, 1], [2, 3]], 1), ([[0, 1, 2, 3]], 1)]
    two_nodes = _group_sets(4, 2)  # ranks 0, 1 on the first node, 2, 3 on the second
    assert two_nodes == [([[0, 1], [2, 3]], 1), ([[0, 1, 2, 3]], 2), ([[0, 2], [1, 3]], 2)]
    # two nodes of 8: 16 over both (8 ranks on each)
    assert [(len(groups[0]), spans) for groups, spans in _group_sets(16, 2)] == [
        (2, 1), (4, 1), (8, 1), (16, 2), (2, 2)]
    # nodes of 3 ranks: the pair that fits inside each node (contiguous pairs would straddle them unevenly), and one
    # rank of each node; no group of 4 (it would take one node and part of the other)
    assert _group_sets(6, 2) == [([[0, 1], [3, 4]], 1), ([[0, 3], [1, 4], [2, 5]], 2)]
    # a node of 6: three pairs, and the group of 4 that fits (ranks 4 and 5 sit it out)
    assert _group_sets(6, 1) == [([[0, 1], [2, 3], [4, 5]], 1), ([[0, 1, 2, 3]], 1)]
