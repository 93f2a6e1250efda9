"""FlexSP's runtime step: the step's variable-length sequences trained over heterogeneous sequence-parallel groups.

A FlexSP plan (``solvers.documents.flexsp``) gives each step micro-batches; each micro-batch gives disjoint rank
blocks ``[first, last]`` of ``sp`` ranks, each with the sequences it trains. In a micro-batch every rank joins its
block: the block packs its sequences into one sequence (varlen semantics: positions restart per sequence and no
token attends to another sequence; the packed sequence is padded at its end only, to a multiple of ``sp``), each
rank holds a contiguous ``1/sp`` of it and the attention exchanges sequence for heads over the block
(``ulysses``). Parameters are replicated on every rank: the loss is the token mean over every sequence of the
step, each rank back-propagates its own tokens' share of it, and the gradients are summed over all ranks before
the one optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from solvers import run_flexsp
from worker.runtime.ulysses import apply_ulysses

IGNORE = -100  # label of the padding at the end of a packed sequence (cross-entropy skips it)


@dataclass(frozen=True)
class Group:
    """One sequence-parallel group of a micro-batch: ranks ``first..last`` (``sp`` of them) train ``sequences``."""

    sp: int
    first: int
    last: int
    sequences: tuple[int, ...]

    def holds(self, rank: int) -> bool:
        return self.first <= rank <= self.last


Grouping = tuple[tuple[Group, ...], ...]  # one step: per micro-batch, its groups


def grouping_of(micro_batches: Sequence[Any]) -> Grouping:
    """The grouping of a FlexSP document's ``micro_batches`` (``MicroBatchDoc`` objects or their dicts)."""
    out = []
    for mb in micro_batches:
        groups = mb["groups"] if isinstance(mb, dict) else mb.groups
        out.append(tuple(
            Group(int(g["sp"]), int(g["ranks"][0]), int(g["ranks"][1]), tuple(int(i) for i in g["sequences"]))
            if isinstance(g, dict) else Group(g.sp, g.ranks[0], g.ranks[1], tuple(g.sequences))
            for g in groups))
    return tuple(out)


def grouping_to_dicts(grouping: Grouping) -> list[dict[str, Any]]:
    """The grouping as a FlexSP document's ``micro_batches`` (``groups`` only), e.g. for ``solvers.flexsp.api
    .estimate``."""
    return [{"groups": [{"sp": g.sp, "ranks": [g.first, g.last], "sequences": list(g.sequences)} for g in mb]}
            for mb in grouping]


def grouping_problems(grouping: Grouping, sequences: int, world: int, heads: int, kv_heads: int) -> list[str]:
    """Why this runtime cannot run ``grouping`` on ``world`` ranks for a batch of ``sequences`` (empty: it can);
    ``solvers.run_flexsp.grouping_problems``, the service's check."""
    tuples = [[(g.sp, g.first, g.last, g.sequences) for g in mb] for mb in grouping]
    return [".".join(str(x) for x in p.loc) + f": {p.msg}"
            for p in run_flexsp.grouping_problems(tuples, sequences, world, heads, kv_heads)]


def sequence_tokens(vocab_size: int, length: int, seed: int, step: int, index: int) -> torch.Tensor:
    """Synthetic tokens of sequence ``index`` of ``step``: ``length + 1`` ids (inputs ``[:-1]``, labels ``[1:]``),
    the same on every rank and in a single-process reference. A random start, then each token 1-3 above the one
    before (mod vocab): a model can learn it, so a run's loss falls from ln(vocab) toward ln(3)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + step) * 1_000_003 + index)
    start = torch.randint(0, vocab_size, (1,), generator=gen)
    steps = torch.randint(1, 4, (length,), generator=gen)
    return torch.cat([start, start + steps.cumsum(0)]) % vocab_size


@dataclass(frozen=True)
class Packed:
    """One rank's slice of a group's packed sequence."""

    inputs: torch.Tensor  # (1, packed / sp)
    labels: torch.Tensor  # (1, packed / sp), IGNORE on the padding
    segments: tuple[int, ...]  # lengths of the pieces of the whole packed sequence (the padding last, if any)


def pack(sequences: Sequence[torch.Tensor], sp: int, sp_rank: int) -> Packed:
    """Pack ``sequences`` (each ``length + 1`` token ids) end to end, pad the end to a multiple of ``sp`` and take
    rank ``sp_rank``'s contiguous slice."""
    inputs = torch.cat([t[:-1] for t in sequences])
    labels = torch.cat([t[1:] for t in sequences])
    segments = [len(t) - 1 for t in sequences]
    pad = -len(inputs) % sp
    if pad:
        inputs = torch.cat([inputs, inputs.new_zeros(pad)])
        labels = torch.cat([labels, labels.new_full((pad,), IGNORE)])
        segments.append(pad)
    part = len(inputs) // sp
    sl = slice(sp_rank * part, (sp_rank + 1) * part)
    return Packed(inputs[sl][None], labels[sl][None], tuple(segments))


class GroupCache:
    """The process groups of the rank blocks the steps use, created once each, in the same order on every rank
    (``new_group`` is collective over the whole world)."""

    def __init__(self) -> None:
        self.groups: dict[tuple[int, int], dist.ProcessGroup] = {}

    def ensure(self, grouping: Grouping) -> None:
        """Create the groups of ``grouping``'s blocks of more than one rank that do not exist yet (collective:
        every rank calls it with the same grouping)."""
        blocks = sorted({(g.first, g.last) for mb in grouping for g in mb if g.sp > 1} - self.groups.keys())
        for first, last in blocks:
            group = dist.new_group(list(range(first, last + 1)))
            assert group is not None
            self.groups[(first, last)] = group

    def ensure_aligned(self, world: int, sizes: Sequence[int]) -> None:
        """Create the groups of every block of each size in ``sizes`` that starts at a multiple of its size (the
        blocks the planner's tilings use), before a run's first step: ``new_group`` sets up connections between
        the block's ranks, which inside a timed step would count as the step's time (collective, as ``ensure``)."""
        self.ensure((tuple(Group(d, first, first + d - 1, ()) for d in sorted(set(sizes)) if d > 1 and world % d == 0
                           for first in range(0, world - d + 1, d)),))

    def of(self, group: Group) -> dist.ProcessGroup | None:
        return self.groups[(group.first, group.last)] if group.sp > 1 else None


def all_reduce_gradients(model: nn.Module) -> None:
    """Sum every parameter's gradient over all ranks (one flat buffer; a rank that computed none adds zeros)."""
    params = list(model.parameters())
    flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).flatten() for p in params])
    dist.all_reduce(flat)
    offset = 0
    for p in params:
        n = p.numel()
        p.grad = flat[offset:offset + n].view_as(p).clone()
        offset += n


def step_gradients(model: nn.Module, grouping: Grouping, tokens_of: Callable[[int], torch.Tensor],
                   lengths: Sequence[int], groups: GroupCache, trace: list[int] | None = None) -> float:
    """Forward and backward of one step: every micro-batch in this rank's group, then the gradients summed over all
    ranks. Returns the step's loss (the token mean over all its sequences; the same on every rank). ``tokens_of(i)``
    gives sequence ``i``'s ``lengths[i] + 1`` token ids (only those of this rank's groups are asked for).
    ``trace`` gets, per micro-batch, the number of positions this rank's model ran (0 where it idled)."""
    rank = dist.get_rank()
    groups.ensure(grouping)
    total = sum(lengths)  # every sequence trains all its tokens: inputs [:-1] predict labels [1:]
    device = next(model.parameters()).device
    local = torch.zeros((), dtype=torch.float64, device=device)
    for mb in grouping:
        mine = next((g for g in mb if g.holds(rank)), None)
        if mine is None or not mine.sequences:
            if trace is not None:
                trace.append(0)
            continue  # this rank idles in this micro-batch
        packed = pack([tokens_of(i) for i in mine.sequences], mine.sp, rank - mine.first)
        if trace is not None:
            trace.append(packed.inputs.numel())
        apply_ulysses(model, groups.of(mine))
        logits = model(packed.inputs.to(device), segments=packed.segments)
        ce = F.cross_entropy(logits.float().flatten(0, 1), packed.labels.to(device).flatten(), ignore_index=IGNORE,
                             reduction="sum")
        (ce / total).backward()
        local += ce.detach().double()
    apply_ulysses(model, None)
    all_reduce_gradients(model)
    dist.all_reduce(local)
    return float(local) / total

