"""Expert layouts of the planner's candidates, against a brute-force enumeration."""

from __future__ import annotations

import itertools

import pytest

from solvers.cost_model.moe import alltoall_crosses_nodes, approximate_note
from solvers.hybrid.moe import crosses_nodes, expert_layouts, with_expert_layouts
from solvers.strategy import LayerStrategy, SpKind


def brute(x: LayerStrategy, experts: int, gpn: int, approx: bool) -> set[tuple[int, int, bool]]:
    """(etp, ep, lsh) by definition: ranks of the EP group are etp apart; nodes are gpn consecutive ranks."""
    out = set()
    mlp_split = 1 if x.sp == "ulysses" else x.tp  # Ulysses keeps whole weights
    for etp, ep in itertools.product({mlp_split, 1}, range(1, experts + 1)):
        if experts % ep or x.world % (etp * ep):
            continue
        crosses = len({(etp * i) // gpn for i in range(ep)}) > 1
        out.add((etp, ep, False))
        if crosses and approx:
            out.add((etp, ep, True))
    return out


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize(("tp", "dp", "cp", "sp"), [(1, 64, 1, None), (8, 8, 1, "megatron"), (4, 8, 2, "megatron"),
                                                 (2, 2, 1, None), (1, 12, 1, None), (4, 16, 1, "ulysses")])
def test_expert_layouts_are_exactly_the_legal_ones(tp: int, dp: int, cp: int, sp: SpKind, approx: bool) -> None:
    x = LayerStrategy(tp=tp, dp=dp, cp=cp, sp=sp, zero=1)
    got = expert_layouts(x, 8, 8, approx)
    assert got[0] == x  # the unchanged layout first
    keys = [(y.expert_tp, y.ep, y.lsh) for y in got]
    assert len(keys) == len(set(keys))
    assert set(keys) == brute(x, 8, 8, approx)
    assert all((y.tp, y.dp, y.cp, y.sp, y.zero, y.recompute) == (tp, dp, cp, x.sp, 1, "none") for y in got)


def test_crossing_agrees_with_the_cost_model() -> None:
    for ep, etp, gpn in itertools.product((1, 2, 4, 8, 16), (1, 2, 4, 8), (4, 8)):
        assert crosses_nodes(ep, etp, gpn) == bool(alltoall_crosses_nodes(ep, etp, gpn))


def test_lsh_only_across_nodes_and_when_allowed() -> None:
    x = LayerStrategy(tp=8, dp=8)
    cands = with_expert_layouts([x, LayerStrategy(dp=8)], 8, 8, True)
    lsh = [y for y in cands if y.lsh]
    assert lsh and all(y.ep * y.expert_tp > 8 for y in lsh)
    assert not [y for y in with_expert_layouts([x], 8, 8, False) if y.lsh]
    note = approximate_note(cands)
    assert note is not None and note.startswith("approximate") and approximate_note([x]) is None


def test_the_expert_degrees_tried_are_read_off_the_layer_not_every_expert_count(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A million experts on 64 GPUs took 49 s to plan: every candidate scanned 1..num_experts for divisors.
    The expert degree divides the layer's ranks too, so only their common divisors are looked at."""
    import solvers.hybrid.moe as moe

    scanned: list[int] = []
    real = moe._divisors
    monkeypatch.setattr(moe, "_divisors", lambda n: scanned.append(n) or real(n))
    x = LayerStrategy(tp=2, dp=32)
    layouts = expert_layouts.__wrapped__(x, 2**20, 8, False)
    assert {y.ep for y in layouts} == {1, 2, 4, 8, 16, 32, 64} and max(scanned) <= x.world
