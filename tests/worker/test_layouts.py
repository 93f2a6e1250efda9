"""Re-layouts between layer layouts (``worker.runtime.layouts``), checked on one process: every rank's exchange is
simulated by routing the pieces each sends to the rank that receives them. (On real ranks they run inside the
per-layer plans of test_equivalence.py.)"""

from __future__ import annotations

import itertools

import pytest
import torch

from solvers.run_layout import LayerLayout
from worker.runtime.layouts import Block, block_of, exchange_plan, relayout

WORLD, ROWS, SEQ = 4, 8, 16


def _layouts() -> list[LayerLayout]:
    """Every 4-rank layout: dp x cp x tp, each sequence-parallel kind."""
    out = []
    for dp, cp in ((1, 1), (2, 1), (4, 1), (1, 2), (2, 2), (1, 4)):
        tp = WORLD // (dp * cp)
        out += [LayerLayout(dp=dp, cp=cp, tp=tp, sp=sp) for sp in ((None, "megatron", "ulysses") if tp > 1
                                                                    else (None,))]
    return out


LAYOUTS = _layouts()
ACTIVATION = torch.arange(ROWS * SEQ * 3, dtype=torch.float32).reshape(ROWS, SEQ, 3)


def _held(block: Block) -> torch.Tensor:
    return torch.cat([ACTIVATION[block.rows[0]:block.rows[1], a:b] for a, b in block.seq], dim=1)


def _where(block: Block, rows: tuple[int, int], seq: tuple[int, int]) -> tuple[slice, slice]:
    """Local index of a global (rows, seq) range in ``block``'s tensor (written independently of the runtime's)."""
    offset = 0
    for a, b in block.seq:
        if a <= seq[0] and seq[1] <= b:
            return slice(rows[0] - block.rows[0], rows[1] - block.rows[0]), slice(offset + seq[0] - a,
                                                                                offset + seq[1] - a)
        offset += b - a
    raise AssertionError(f"{seq} not held")


def test_blocks_of_a_layout() -> None:
    """tp varies fastest: under plain TP neighbours hold copies of a dp share; under SP slices of the sequence
    (of their cp rank's chunks)."""
    assert block_of(LayerLayout(dp=2, tp=2), 3, ROWS, SEQ) == Block((4, 8), ((0, 16),), copy=1, copies=2)
    assert block_of(LayerLayout(dp=2, tp=2, sp="megatron"), 3, ROWS, SEQ) == Block((4, 8), ((8, 16),), 0, 1)
    assert block_of(LayerLayout(dp=4), 2, ROWS, SEQ) == Block((4, 6), ((0, 16),), 0, 1)
    # cp rank 0 of 2 holds chunks 0 and 3 of 4 (ring attention's load balance); its 2 SP ranks one each
    assert block_of(LayerLayout(cp=2, tp=2), 0, ROWS, SEQ) == Block((0, 8), ((0, 4), (12, 16)), 0, 2)
    assert block_of(LayerLayout(cp=2, tp=2, sp="ulysses"), 1, ROWS, SEQ) == Block((0, 8), ((12, 16),), 0, 1)
    assert block_of(LayerLayout(cp=4), 3, ROWS, SEQ) == Block((0, 8), ((6, 8), (8, 10)), 0, 1)


@pytest.mark.parametrize(("src", "dst"), list(itertools.product(LAYOUTS, LAYOUTS)), ids=str)
def test_every_rank_ends_with_its_block_of_the_new_layout(src: LayerLayout, dst: LayerLayout) -> None:
    plans = [exchange_plan(src, dst, r, WORLD, ROWS, SEQ) for r in range(WORLD)]
    for j, receiver in enumerate(plans):
        out = torch.full_like(_held(receiver.dst), float("nan"))
        for i, sender in enumerate(plans):
            assert sender.send[j] == receiver.recv[i]  # both sides agree on what travels
            for rows, seq in sender.send[j]:
                out[_where(receiver.dst, rows, seq)] = _held(sender.src)[_where(sender.src, rows, seq)]
        assert torch.equal(out, _held(receiver.dst)), (src, dst, j)


def test_copies_are_sent_once_and_neighbours_stay_local() -> None:
    """tp4 -> dp4 and Megatron SP <-> Ulysses over the same ranks need no communication; tp2 x dp2 -> tp4 gathers
    the other rows from one copy each."""
    def local(a: LayerLayout, b: LayerLayout) -> bool:
        return exchange_plan(a, b, 0, WORLD, ROWS, SEQ).local

    assert local(LayerLayout(tp=4), LayerLayout(dp=4))
    assert local(LayerLayout(dp=2, tp=2, sp="megatron"), LayerLayout(dp=2, tp=2, sp="ulysses"))
    assert not local(LayerLayout(dp=4), LayerLayout(tp=4))
    gather = exchange_plan(LayerLayout(dp=2, tp=2), LayerLayout(tp=4), 0, WORLD, ROWS, SEQ)
    assert [len(frm) for frm in gather.recv] == [1, 0, 1, 0]  # its own rows, and rank 2's (not rank 3's copy)


def test_same_layout_is_no_op() -> None:
    x = torch.ones(2, 3, 4)
    layout = LayerLayout(dp=2, tp=2, zero=0)
    assert relayout(x, layout, LayerLayout(dp=2, tp=2, zero=3), group=None) is x  # type: ignore[arg-type]
