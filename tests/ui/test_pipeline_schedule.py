"""The timeline replay obeys the schedule's rules and matches closed forms where they exist."""

from __future__ import annotations

import itertools
import random

import pytest

from service.ui.pipeline_schedule import simulate


def _check_valid(tl, fwd, bwd, m):  # type: ignore[no-untyped-def]
    p = len(fwd)
    end = {(op.phase, op.stage, op.micro_batch): op.end_s for op in tl.ops}
    start = {(op.phase, op.stage, op.micro_batch): op.start_s for op in tl.ops}
    assert len(end) == 2 * p * m
    for s in range(p):
        mine = sorted((op for op in tl.ops if op.stage == s), key=lambda o: o.start_s)
        for a, b in itertools.pairwise(mine):
            assert a.end_s <= b.start_s + 1e-12, "a stage runs two passes at once"
        for i in range(m):
            if s > 0:
                assert start[("F", s, i)] >= end[("F", s - 1, i)] - 1e-12
            if s < p - 1:
                assert start[("B", s, i)] >= end[("B", s + 1, i)] - 1e-12
            assert start[("B", s, i)] >= end[("F", s, i)] - 1e-12


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
@pytest.mark.parametrize(("p", "m"), [(1, 1), (1, 5), (4, 1), (4, 8), (3, 2), (8, 16)])
def test_uniform_stages_take_m_plus_p_minus_1_slots(schedule: str, p: int, m: int) -> None:
    tl = simulate([1.0] * p, [2.0] * p, m, schedule)
    _check_valid(tl, [1.0] * p, [2.0] * p, m)
    assert tl.makespan_s == pytest.approx((m + p - 1) * 3.0)
    assert tl.bubble_fraction == pytest.approx((p - 1) / (m + p - 1))


def test_gpipe_equals_flow_shop_closed_form_on_random_stages() -> None:
    # Identical jobs through a flow shop: sum of stage times + (m - 1) x the slowest stage, per phase.
    rng = random.Random(0)
    for _ in range(50):
        p, m = rng.randint(1, 6), rng.randint(1, 9)
        fwd = [rng.uniform(0.1, 2) for _ in range(p)]
        bwd = [rng.uniform(0.1, 4) for _ in range(p)]
        tl = simulate(fwd, bwd, m, "gpipe")
        _check_valid(tl, fwd, bwd, m)
        assert tl.makespan_s == pytest.approx(sum(fwd) + (m - 1) * max(fwd) + sum(bwd) + (m - 1) * max(bwd))


def test_1f1b_is_valid_bounded_and_keeps_few_micro_batches_in_flight() -> None:
    rng = random.Random(1)
    for _ in range(50):
        p, m = rng.randint(1, 6), rng.randint(1, 9)
        fwd = [rng.uniform(0.1, 2) for _ in range(p)]
        bwd = [rng.uniform(0.1, 4) for _ in range(p)]
        tl = simulate(fwd, bwd, m, "1f1b")
        _check_valid(tl, fwd, bwd, m)
        # No schedule beats the busiest stage plus the fill and drain of the others.
        assert tl.makespan_s >= max(m * (f + b) for f, b in zip(fwd, bwd, strict=True)) - 1e-9
        assert tl.makespan_s >= sum(fwd) + sum(bwd) - 1e-9
        for s in range(p):  # stage s never holds more than p - s activations (why 1F1B saves memory)
            events = sorted((op.end_s if op.phase == "F" else op.start_s, op.phase) for op in tl.ops
                            if op.stage == s)
            live = peak = 0
            for _, phase in events:
                live += 1 if phase == "F" else -1
                peak = max(peak, live)
            assert peak <= min(p - s, m)


def test_degenerate_input_gives_empty_timeline() -> None:
    assert simulate([], [], 4).ops == ()
    assert simulate([1.0], [1.0], 0).makespan_s == 0.0
