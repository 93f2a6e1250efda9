"""Pipeline schedules: step-time formulas against a simulated 1F1B schedule, and in-flight counts."""

from __future__ import annotations

import itertools

import pytest

from solvers.cost_model import pipeline


def simulate_1f1b(fwd: list[float], bwd: list[float], m: int) -> float:
    """Makespan of Megatron's non-interleaved 1F1B: each stage runs its op list in order, an op starts
    when its stage is free and its dependency (previous stage's forward / next stage's backward) is done."""
    p = len(fwd)
    orders = []
    for s in range(p):
        warm = min(p - s - 1, m)
        ops = [("F", i) for i in range(warm)]
        nf, nb = warm, 0
        while nb < m:
            if nf < m:
                ops.append(("F", nf))
                nf += 1
            ops.append(("B", nb))
            nb += 1
        orders.append(ops)
    done: dict[tuple[str, int, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        progressed = False
        for s in range(p):
            if pos[s] >= len(orders[s]):
                continue
            kind, i = orders[s][pos[s]]
            dep = ("F", s - 1, i) if kind == "F" and s > 0 else ("B", s + 1, i) if kind == "B" and s < p - 1 else None
            if dep is not None and dep not in done:
                continue
            start = max(free[s], done.get(dep, 0.0) if dep else 0.0)
            free[s] = done[(kind, s, i)] = start + (fwd[s] if kind == "F" else bwd[s])
            pos[s] += 1
            progressed = True
        assert progressed
    return max(free)


@pytest.mark.parametrize(("p", "m"), [(1, 4), (2, 2), (4, 8), (4, 3), (8, 16)])
def test_uniform_1f1b_matches_simulation_and_bubble(p: int, m: int) -> None:
    f, b = 1.0, 2.0
    sim = simulate_1f1b([f] * p, [b] * p, m)
    formula = pipeline.pipeline_time_s([f + b] * p, m)
    assert formula == pytest.approx(sim)
    assert formula == pytest.approx((m + p - 1) * (f + b))
    assert (formula - m * (f + b)) / (m * (f + b)) == pytest.approx(pipeline.bubble_fraction(p, m))


def test_nonuniform_stages_formula_is_an_upper_bound_of_the_simulation() -> None:
    for times in itertools.product([1.0, 2.0, 3.0], repeat=3):
        sim = simulate_1f1b([t / 3 for t in times], [2 * t / 3 for t in times], 6)
        formula = pipeline.pipeline_time_s(list(times), 6)
        assert sim <= formula + 1e-9
        assert formula <= sim * 1.35  # and not loose


def test_interleaved_bubble_shrinks_by_virtual_stages() -> None:
    p, m, v, t = 4, 8, 2, 3.0
    assert pipeline.pipeline_time_s([t] * p, m, v, "interleaved") == pytest.approx((m + (p - 1) / v) * t)
    assert pipeline.bubble_fraction(p, m, v) == pytest.approx((p - 1) / (v * m))
    # GPipe has 1F1B's time (its cost is memory) and ignores virtual stages
    assert pipeline.pipeline_time_s([t] * p, m, v, "gpipe") == pytest.approx((m + p - 1) * t)


def test_step_adds_the_slowest_stage_step_work() -> None:
    assert pipeline.step_time_s([1.0, 1.0], [0.5, 2.0], 4) == pytest.approx(5.0 + 2.0)


def test_in_flight_micro_batches() -> None:
    assert pipeline.in_flight_micro_batches("gpipe", 4, 0, 8) == 8
    assert [pipeline.in_flight_micro_batches("1f1b", 4, s, 8) for s in range(4)] == [4, 3, 2, 1]
    assert pipeline.in_flight_micro_batches("1f1b", 4, 0, 2) == 2  # never more than there are
    # Megatron interleaved: first stage holds p (1 + (p - 1) / (p v)) stage-equivalents
    p, v = 4, 2
    assert pipeline.in_flight_micro_batches("interleaved", p, 0, 8, v) == pytest.approx(p * (1 + (p - 1) / (p * v)))
    assert pipeline.in_flight_micro_batches("interleaved", p, p - 1, 8, v) == pytest.approx((v - 1) * p / v + 1 / v)


def test_virtual_stages_keep_each_stages_planned_layers() -> None:
    """Interleaving cuts each stage's own layer count into its chunks (front-loaded), in the looped order: rank s
    runs virtual stages s, s + pp, ...; the plan's strategies, listed stage by stage, follow their stage."""
    assert pipeline.virtual_stage_layers((5, 2), 2) == (3, 1, 2, 1)
    assert pipeline.virtual_stage_layers((4, 4, 3), 3) == (2, 2, 1, 1, 1, 1, 1, 1, 1)
    assert pipeline.virtual_stage_layers((3, 1), 1) == (3, 1)
    for split, v in (((5, 2), 2), ((4, 4, 3), 3), ((7, 3, 6), 2)):
        cut = pipeline.virtual_stage_layers(split, v)
        assert [sum(cut[s::len(split)]) for s in range(len(split))] == list(split)
    # model layers 0-2 are stage 0's chunk 0, 3 stage 1's chunk 0 (plan layer 5), 4-5 stage 0's chunk 1
    assert pipeline.model_layer_order((5, 2), 2) == (0, 1, 2, 5, 3, 4, 6)
    assert pipeline.model_layer_order((3, 1), 1) == (0, 1, 2, 3)
    order = pipeline.model_layer_order((4, 4, 3), 3)
    assert sorted(order) == list(range(11))
