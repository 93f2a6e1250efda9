"""Expert layouts of the planner's candidates, against a brute-force enumeration."""

from __future__ import annotations

import itertools

import pytest

from solvers.hybrid.moe import approximate_layers, expert_layouts, with_expert_layouts
from solvers.strategy import LayerStrategy


def brute(x: LayerStrategy, experts: int, gpn: int, approx: bool) -> set[tuple[int, int, bool]]:
    """(etp, ep, lsh) by definition: ranks of the EP group are etp apart; nodes are gpn consecutive ranks."""
    out = set()
    for etp, ep in itertools.product({x.tp, 1}, range(1, experts + 1)):
        if experts % ep or x.world % (etp * ep):
            continue
        crosses = len({(etp * i) // gpn for i in range(ep)}) > 1
        out.add((etp, ep, False))
        if crosses and approx:
            out.add((etp, ep, True))
    return out


@pytest.mark.parametrize("approx", [False, True])
@pytest.mark.parametrize(("tp", "dp", "cp"), [(1, 64, 1), (8, 8, 1), (4, 8, 2), (2, 2, 1), (1, 12, 1)])
def test_expert_layouts_are_exactly_the_legal_ones(tp: int, dp: int, cp: int, approx: bool) -> None:
    x = LayerStrategy(tp=tp, dp=dp, cp=cp, sp="megatron" if tp > 1 else None, zero=1)
    got = expert_layouts(x, 8, 8, approx)
    assert got[0] == x  # the unchanged layout first
    keys = [(y.expert_tp, y.ep, y.lsh) for y in got]
    assert len(keys) == len(set(keys))
    assert set(keys) == brute(x, 8, 8, approx)
    assert all((y.tp, y.dp, y.cp, y.sp, y.zero, y.recompute) == (tp, dp, cp, x.sp, 1, "none") for y in got)


def test_lsh_only_across_nodes_and_when_allowed() -> None:
    x = LayerStrategy(tp=8, dp=8)
    cands = with_expert_layouts([x, LayerStrategy(dp=8)], 8, 8, True)
    lsh = [y for y in cands if y.lsh]
    assert lsh and all(y.ep * y.expert_tp > 8 for y in lsh)
    assert not [y for y in with_expert_layouts([x], 8, 8, False) if y.lsh]
    assert approximate_layers(cands) == [i for i, y in enumerate(cands) if y.lsh]
