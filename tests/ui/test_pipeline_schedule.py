"""The timeline replay obeys the schedule's rules and matches closed forms where they exist."""

from __future__ import annotations

import itertools
import random

import pytest

from service.ui.pipeline_schedule import simulate


def _check_valid(tl, fwd, bwd, m, v=1):  # type: ignore[no-untyped-def]
    p = len(fwd)
    end = {(op.phase, op.stage, op.chunk, op.micro_batch): op.end_s for op in tl.ops}
    start = {(op.phase, op.stage, op.chunk, op.micro_batch): op.start_s for op in tl.ops}
    assert len(end) == 2 * p * m * v  # every pass of every chunk and micro-batch exactly once
    for s in range(p):
        mine = sorted((op for op in tl.ops if op.stage == s), key=lambda o: o.start_s)
        for a, b in itertools.pairwise(mine):
            assert a.end_s <= b.start_s + 1e-12, "a stage runs two passes at once"
    # Chunk c of stage s is virtual stage c*p + s: forward flows up that chain, backward down it.
    chain = [(c, s) for c in range(v) for s in range(p)]
    for i in range(m):
        for (c0, s0), (c1, s1) in itertools.pairwise(chain):
            assert start[("F", s1, c1, i)] >= end[("F", s0, c0, i)] - 1e-12
            assert start[("B", s0, c0, i)] >= end[("B", s1, c1, i)] - 1e-12
        for c, s in chain:
            assert start[("B", s, c, i)] >= end[("F", s, c, i)] - 1e-12


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


@pytest.mark.parametrize("v", [2, 3])
@pytest.mark.parametrize(("p", "m"), [(2, 2), (2, 6), (4, 4), (4, 8), (3, 9)])
def test_interleaved_divides_the_bubble_by_the_chunks(p: int, m: int, v: int) -> None:
    # Megatron's interleaved 1F1B: bubble (p - 1)(f + b) / v instead of (p - 1)(f + b).
    tl = simulate([1.0] * p, [2.0] * p, m, "interleaved", virtual_stages=v)
    _check_valid(tl, [1.0] * p, [2.0] * p, m, v)
    assert tl.schedule == "interleaved" and tl.virtual_stages == v
    assert tl.makespan_s == pytest.approx(m * 3.0 + (p - 1) * 3.0 / v)


def test_interleaved_on_uneven_stages_is_valid_and_beats_plain_1f1b() -> None:
    rng = random.Random(2)
    for _ in range(30):
        p, v = rng.randint(2, 4), rng.randint(2, 3)
        m = p * rng.randint(1, 3)
        fwd = [rng.uniform(0.5, 1.5) for _ in range(p)]
        bwd = [2 * f for f in fwd]
        tl = simulate(fwd, bwd, m, "interleaved", virtual_stages=v)
        _check_valid(tl, fwd, bwd, m, v)
        assert tl.makespan_s >= max(m * (f + b) for f, b in zip(fwd, bwd, strict=True)) - 1e-9
        assert tl.makespan_s <= simulate(fwd, bwd, m, "1f1b").makespan_s + 1e-9


def test_interleaving_needs_micro_batches_in_multiples_of_stages() -> None:
    tl = simulate([1.0] * 4, [2.0] * 4, 6, "interleaved", virtual_stages=2)
    assert tl.schedule == "1f1b" and tl.virtual_stages == 1
