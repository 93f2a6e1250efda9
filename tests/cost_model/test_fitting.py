"""The constants' fit against a loss whose optimum is known, and which constants a loss pins down
(``solvers.cost_model.fitting``)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.cost_model.fitting import (
    FIT_KEYS,
    PROFILE_FIT_KEYS,
    LayerMeasurement,
    coordinate_fit,
    fit_calibration,
    identified_keys,
    layer_measurements,
    profile_measurements,
    unfinished_keys,
)
from solvers.cost_model.profile import Profile, load_profile
from solvers.errors import SpecError


def _loss(c: AnalyticCalibration) -> float:
    # depends on two constants only: the GEMM plateau strongly, the NVLink efficiency (optimum at its bound) weakly
    return abs(c.gemm_eta_max - 0.6) + 0.02 * (1.0 - c.intra_efficiency)


def test_the_fit_moves_only_what_the_loss_sees_and_finds_its_optimum() -> None:
    fitted = coordinate_fit(_loss, replace(DEFAULT_CALIBRATION, intra_efficiency=0.8), FIT_KEYS, max_sweeps=40)
    assert abs(fitted.gemm_eta_max - 0.6) < 0.02 and fitted.intra_efficiency == 1.0  # capped at its bound
    for key in FIT_KEYS:
        if key not in ("gemm_eta_max", "intra_efficiency"):
            assert getattr(fitted, key) == getattr(DEFAULT_CALIBRATION, key), key


def test_identified_keys_are_those_a_twenty_percent_move_costs_more_than_the_tolerance() -> None:
    at_optimum = replace(DEFAULT_CALIBRATION, gemm_eta_max=0.6, intra_efficiency=1.0)
    # gemm_eta_max: ±20 % costs 0.12; intra_efficiency: +20 % is capped at 1.0, −20 % costs 0.004
    assert identified_keys(_loss, at_optimum, FIT_KEYS) == ["gemm_eta_max"]
    assert identified_keys(_loss, at_optimum, FIT_KEYS, tolerance=0.003) == ["gemm_eta_max", "intra_efficiency"]
    assert identified_keys(_loss, at_optimum, ["kernel_overhead_s", "dp_overlap"], tolerance=0.0) == []


def test_a_profiles_layer_times_are_measurements_of_its_models_layer_on_its_stack() -> None:
    """Plain and Megatron-SP dense layers with their backward at whole samples are measured points (ring
    attention, Ulysses, MoE and forward-only points are not what the analytic layer prices); the precision is the
    profiler's (fp32 on a CPU); each point's prediction is the analytic layer's compute and kernel issue."""
    model = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    keep = [{"batch": 2, "seq": 64, "tp": 1, "forward_ms": 1.0, "backward_ms": 2.0},
            {"batch": 4, "seq": 64, "tp": 2, "sp": True, "forward_ms": 1.0, "backward_ms": 2.5}]
    skip = [{"batch": 2, "seq": 64, "cp": 2, "forward_ms": 1.0, "backward_ms": 2.0},
            {"batch": 2, "seq": 64, "ulysses": 2, "forward_ms": 1.0, "backward_ms": 2.0},
            {"batch": 2, "seq": 64, "forward_ms": 1.0},
            {"batch": 0.5, "seq": 64, "forward_ms": 1.0, "backward_ms": 2.0}]
    profile = Profile.model_validate({"model": model, "stack": {"framework": "paraplan"},
                                      "layer_times": keep + skip})
    got = layer_measurements(profile, "cpu")
    assert [(m.layer.tp, m.layer.sp, m.samples, m.step_time_s) for m in got] == [
        (1, None, 2, 0.003), (2, "megatron", 4, 0.0035)]
    assert {m.training.precision for m in got} == {"fp32"} and got[0].training.stack.framework == "paraplan"
    cal = replace(DEFAULT_CALIBRATION, kernel_overhead_s=0.0)  # the layer's compute alone
    slower = replace(cal, gemm_eta_max=cal.gemm_eta_max / 2)
    assert got[0].predicted_s(slower) > got[0].predicted_s(cal) > 0
    # an MoE model's dense points time its dense layer (the profiler strips the experts for them)
    moe = {**model, "moe": {"num_experts": 4, "top_k": 2, "moe_layer_frequency": 1}}
    of_moe = layer_measurements(Profile.model_validate({"model": moe, "stack": {"framework": "paraplan"},
                                                        "layer_times": keep}), "cpu")
    assert [m.predicted_s(cal) for m in of_moe] == [m.predicted_s(cal) for m in got]
    with pytest.raises(SpecError) as err:
        layer_measurements(Profile.model_validate({"stack": {"framework": "paraplan"}, "layer_times": keep}), "cpu",
                           ("profiles", 0))
    assert err.value.problems[0].loc == ("profiles", 0, "model")


def test_a_profiles_collectives_are_measurements_of_nvlink_within_a_node_and_of_the_network_across() -> None:
    """A profile's collectives within a node are priced as the analytic model prices them on the cluster's NVLink
    (a ring all-reduce: 2(n-1)/n of the bytes at the efficiency's bandwidth plus a latency per step); those across
    nodes, where the profile states the nodes each group spans and its launch's ranks per node, on the GPU's share
    of the node's network (the launch's ranks shared it). Groups across nodes that do not say how many, a profile
    that does not say its ranks per node, and groups larger than its node are left out."""
    model = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    within = [{"op": "allreduce", "group_size": 4, "message_bytes": 1e8, "time_ms": 5.0},
              {"op": "p2p", "group_size": 2, "message_bytes": 1e6, "time_ms": 0.1}]
    across = [{"op": "allreduce", "group_size": 8, "across_nodes": True, "nodes": 2, "message_bytes": 1e8,
               "time_ms": 9.0},
              {"op": "allreduce", "group_size": 2, "across_nodes": True, "nodes": 2, "message_bytes": 1e8,
               "time_ms": 7.0},
              {"op": "p2p", "group_size": 2, "across_nodes": True, "nodes": 2, "message_bytes": 1e6, "time_ms": 0.2}]
    left_out = [{"op": "allreduce", "group_size": 4, "across_nodes": True, "message_bytes": 1e8, "time_ms": 9.0},
                {"op": "allreduce", "group_size": 16, "message_bytes": 1e8, "time_ms": 9.0}]
    doc = {"model": model, "stack": {"framework": "paraplan"},
           "layer_times": [{"batch": 2, "seq": 64, "tp": 1, "forward_ms": 1.0, "backward_ms": 2.0}],
           "collectives": within + across + left_out}
    got = profile_measurements(Profile.model_validate({**doc, "gpus_per_node": 4}), "H100-SXM")
    assert [type(m).__name__ for m in got] == ["LayerMeasurement"] + ["CollectiveMeasurement"] * 5
    ring, p2p, two_nodes, strided, p2p_across = got[1:]
    assert (ring.op, ring.group_size, ring.step_time_s, p2p.op) == ("allreduce", 4, 0.005, "p2p")
    cal = replace(DEFAULT_CALIBRATION, intra_efficiency=0.5, intra_latency_s=1e-5, inter_efficiency=0.25,
                  inter_latency_s=3e-5)
    nvlink = ring.cluster.intra_GBps * 1e9 * 0.5
    assert ring.predicted_s(cal) == pytest.approx(2 * 3 / 4 * 1e8 / nvlink + 2 * 3 * 1e-5, rel=1e-12)
    assert p2p.predicted_s(cal) == pytest.approx(1e6 / nvlink + 1e-5, rel=1e-12)
    # across two nodes of the launch's 4 ranks each: each rank's quarter of the node's 3.2 Tb/s, at 25 %
    assert (two_nodes.cluster.nodes, two_nodes.cluster.gpus_per_node, two_nodes.ranks_per_node) == (2, 4, 4)
    nic = 3200e9 / 8 / 4 * 0.25
    assert two_nodes.predicted_s(cal) == pytest.approx(  # within each node over 4, then across over 2, a quarter each
        2 * 3 / 4 * 1e8 / nvlink + 2 * 3 * 1e-5 + 2 * 1 / 2 * 1e8 / 4 / nic + 2 * 1 * 3e-5, rel=1e-12)
    assert strided.ranks_per_node == 1
    assert strided.predicted_s(cal) == pytest.approx(1e8 / nic + 2 * 3e-5, rel=1e-12)
    assert p2p_across.predicted_s(cal) == pytest.approx(1e6 / nic + 3e-5, rel=1e-12)
    # the network's constants move only the collectives across nodes
    slow_net = replace(cal, inter_efficiency=0.125)
    assert [m.predicted_s(slow_net) == m.predicted_s(cal) for m in got] == [True, True, True, False, False, False]
    # a profile that does not say its ranks per node: its collectives across nodes are left out
    unsaid = profile_measurements(Profile.model_validate(doc), "H100-SXM")
    assert [(m.op, m.group_size) for m in unsaid[1:]] == [("allreduce", 4), ("p2p", 2)]


def test_the_networks_efficiency_is_fitted_against_the_network_the_profile_states() -> None:
    """Profiled on nodes whose network is 800 Gb/s (not the H100-SXM preset's 3.2 Tb/s), running at 60 % of it:
    stated, the fit finds 60 %, which prices a request for that network as measured; not stated, it finds 15 % of
    the preset's (the same bytes a second), which a request stating its 800 Gb/s would price four times too slow. The
    fit's report says which network its efficiency is relative to and whether the profile stated it."""
    model = {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "vocab_size": 128}
    collectives = [{"op": "allreduce", "group_size": n, "across_nodes": True, "nodes": 2, "message_bytes": b,
                    "time_ms": 1.0} for n in (8, 2) for b in (1e6, 1e8)]
    doc = {"model": model, "stack": {"framework": "paraplan"}, "gpus_per_node": 4, "collectives": collectives,
           "layer_times": [{"batch": 2, "seq": 64, "tp": 1, "forward_ms": 1.0, "backward_ms": 2.0}]}
    truth = replace(DEFAULT_CALIBRATION, inter_efficiency=0.6)
    stated = Profile.model_validate({**doc, "inter_node_bandwidth_Gbps": 800})
    times = [m.predicted_s(truth) for m in profile_measurements(stated, "H100-SXM")]
    measured = {**doc, "collectives": [{**c, "time_ms": 1e3 * t} for c, t in zip(collectives, times[1:], strict=True)]}
    fits = {}
    for label, extra in (("stated", {"inter_node_bandwidth_Gbps": 800}), ("unstated", {})):
        got = profile_measurements(Profile.model_validate({**measured, **extra}), "H100-SXM")
        assert {m.cluster.inter_node_bandwidth_Gbps for m in got[1:]} == {extra.get("inter_node_bandwidth_Gbps")}
        fits[label] = fit_calibration(got[1:], keys=PROFILE_FIT_KEYS, max_sweeps=20)
    assert fits["stated"].constants.inter_efficiency == pytest.approx(0.6, rel=0.05)
    assert fits["unstated"].constants.inter_efficiency < 0.3  # (a quarter of the truth, bar what latencies absorb)
    # the large messages across nodes, on a cluster that states its 800 Gb/s as a request does
    on_800 = [m for m in profile_measurements(Profile.model_validate({**measured, "inter_node_bandwidth_Gbps": 800}),
                                              "H100-SXM")[1:]
              if m.message_bytes == 1e8]
    for m in on_800:
        assert m.predicted_s(fits["stated"].constants) == pytest.approx(m.step_time_s, rel=0.05)
        assert m.predicted_s(fits["unstated"].constants) > 1.5 * m.step_time_s
    assert (fits["stated"].report.network_Gbps, fits["stated"].report.network_stated) == (800, True)
    assert (fits["unstated"].report.network_Gbps, fits["unstated"].report.network_stated) == (3200, False)
    # a profile of one node: no network in the report
    one = profile_measurements(Profile.model_validate({**doc, "collectives": [
        {"op": "allreduce", "group_size": 4, "message_bytes": 1e8, "time_ms": 5.0}]}), "H100-SXM")
    assert (fit_calibration(one).report.network_Gbps, fit_calibration(one).report.network_stated) == (None, None)


@pytest.mark.parametrize(("point", "field"), [
    ({"across_nodes": False, "nodes": 2}, "collectives.0"),
    ({"across_nodes": True, "nodes": 1}, "collectives.0"),
    ({"group_size": 6, "across_nodes": True, "nodes": 4}, "collectives.0")])
def test_a_collective_states_nodes_consistent_with_its_group(point: dict, field: str) -> None:
    """A group across nodes spans two or more, with as many of its ranks on each; the refusal names the point."""
    bad = {"op": "allreduce", "group_size": 4, "message_bytes": 1e6, "time_ms": 1.0, **point}
    with pytest.raises(SpecError) as err:
        load_profile({"collectives": [bad]}, ("data",))
    problem = err.value.problems[0]
    assert ".".join(map(str, problem.loc[1:3])) == field and "nodes" in problem.msg


def test_a_constant_that_starts_at_zero_is_searched_too() -> None:
    """A CPU start has no kernel-issue floor (0 s): no factor moves 0, so the search steps up from the shipped
    constant's scale; a loss whose optimum is at 0.3 ms finds it."""
    start = replace(DEFAULT_CALIBRATION, kernel_overhead_s=0.0)

    def loss(c: AnalyticCalibration) -> float:
        return abs(c.kernel_overhead_s - 3e-4) / 3e-4

    fitted = coordinate_fit(loss, start, ["kernel_overhead_s"], max_sweeps=40)
    assert fitted.kernel_overhead_s == pytest.approx(3e-4, rel=0.05)
    # a loss that is best at 0 keeps it there, and pins it (a step up costs); one that does not see it does not
    at_zero = coordinate_fit(lambda c: c.kernel_overhead_s / 1e-3, start, ["kernel_overhead_s"])
    assert at_zero.kernel_overhead_s == 0.0
    assert identified_keys(lambda c: c.kernel_overhead_s / 1e-3, at_zero, ["kernel_overhead_s"]) == [
        "kernel_overhead_s"]
    assert identified_keys(lambda c: 0.0, at_zero, ["kernel_overhead_s"]) == []


def _slower_host(slower: float) -> tuple[AnalyticCalibration, list[LayerMeasurement]]:
    """A CPU profile's layer times as the start constants price them on a host ``slower`` times slower (its GEMM
    plateau that much lower): the constants and the measurements."""
    model = {"name": "tiny", "num_layers": 2, "hidden_size": 256, "num_attention_heads": 4, "vocab_size": 128}
    points = [{"batch": b, "seq": 512, "tp": 1, "forward_ms": 1.0, "backward_ms": 2.0} for b in (1, 2, 4, 8)]
    layers = layer_measurements(Profile.model_validate({"model": model, "stack": {"framework": "paraplan"},
                                                        "layer_times": points}), "cpu")
    truth = replace(DEFAULT_CALIBRATION, gemm_eta_max=DEFAULT_CALIBRATION.gemm_eta_max / slower)
    return truth, [replace(m, step_time_s=m.predicted_s(truth)) for m in layers]


@pytest.mark.parametrize("slower", [1.5, 10.0, 300.0])
def test_a_host_far_slower_than_its_start_is_fitted_in_one_set(slower: float) -> None:
    """Layer times of a host 1.5x, 10x or 300x slower than the start constants price it (a CPU's speed is not its
    preset's): a set's fit extends the move that gains most while a measurement is more than ``FAR_OFF`` off
    (``_extend``), so its six sweeps reach the GEMM plateau that produced them, 300x down too, where 20 % a sweep
    reached 0.8^6 = 0.26x of the start at most."""
    truth, far = _slower_host(slower)
    fit = fit_calibration(far, keys=["gemm_eta_max", "kernel_overhead_s"])
    assert fit.report.start_mape > 0.3 and fit.report.fit_mape < 0.03 and fit.report.unfinished == []
    assert fit.constants.gemm_eta_max == pytest.approx(truth.gemm_eta_max, rel=0.03)
    assert fit.report.held_out_mape is not None and fit.report.held_out_mape < 0.03


def test_a_search_out_of_sweeps_says_which_constants_it_stopped_short_of() -> None:
    """A search stopped before it reached its measurements' best (here: one sweep of 20 % moves, not extended,
    against a host 10x slower) reports the constants one more move would still improve, and the move
    does; at the measurements' best it names none."""
    truth, far = _slower_host(10.0)

    def error(c: AnalyticCalibration) -> float:
        return float(np.mean([abs(m.predicted_s(c) / m.step_time_s - 1) for m in far]))

    keys = ["gemm_eta_max", "kernel_overhead_s"]
    short = coordinate_fit(error, DEFAULT_CALIBRATION, keys, max_sweeps=1)
    assert short.gemm_eta_max == pytest.approx(DEFAULT_CALIBRATION.gemm_eta_max * 0.8) and error(short) > 0.3
    assert unfinished_keys(error, short, keys) == ["gemm_eta_max"]
    assert error(replace(short, gemm_eta_max=short.gemm_eta_max * 0.8)) < error(short) - 0.005
    assert unfinished_keys(error, truth, keys) == []
