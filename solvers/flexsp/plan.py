"""A FlexSP plan (micro-batches of SP groups holding sequences), its rank layout and its evaluation."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from solvers.flexsp.cost import CostTable


@dataclass
class Group:
    size: int
    sequences: list[int] = field(default_factory=list)  # rows of the cost table


@dataclass
class MicroBatch:
    groups: list[Group]

    def rows(self) -> list[int]:
        """The cost-table rows of every sequence it holds, ascending."""
        return sorted(i for g in self.groups for i in g.sequences)


@dataclass(frozen=True)
class GroupCost:
    compute_ms: float
    comm_ms: float
    tokens: int

    @property
    def load_ms(self) -> float:
        return self.compute_ms + self.comm_ms


def group_cost(table: CostTable, group: Group) -> GroupCost:
    j = table.size_index(group.size)
    idx = np.asarray(group.sequences, dtype=np.int64)
    return GroupCost(
        compute_ms=float(table.compute_ms[idx, j].sum()),
        comm_ms=float(table.comm_ms[idx, j].sum()),
        tokens=int(table.lengths[idx].sum()),
    )


def micro_batch_time_ms(table: CostTable, mb: MicroBatch) -> float:
    """The slowest group's load plus the fixed cost (a micro-batch ends when its last group does)."""
    return table.beta_ms + max(group_cost(table, g).load_ms for g in mb.groups)


def step_time_ms(table: CostTable, plan: list[MicroBatch]) -> float:
    return sum(micro_batch_time_ms(table, mb) for mb in plan)


def rank_layout(groups: list[Group], table: CostTable) -> list[tuple[Group, int, int]]:
    """Contiguous rank blocks, largest groups first, so every block is aligned to its own size.

    Sizes are powers of two dividing a node or node multiples (``allowed_group_sizes``), hence each
    offset is a multiple of the size and a block of ≤ a node never straddles two nodes. Ties go to the
    busier group first so the layout is deterministic.
    """
    order = sorted(groups, key=lambda g: (-g.size, -group_cost(table, g).load_ms, g.sequences[:1]))
    out = []
    first = 0
    for g in order:
        out.append((g, first, first + g.size - 1))
        first += g.size
    return out


def check_plan(table: CostTable, plan: list[MicroBatch], num_gpus: int) -> list[str]:
    """Every violated invariant, in words (empty when the plan is valid)."""
    problems = []
    seen = np.zeros(len(table.lengths), dtype=np.int64)
    for m, mb in enumerate(plan):
        if sum(g.size for g in mb.groups) != num_gpus:
            problems.append(f"micro-batch {m}: groups use {sum(g.size for g in mb.groups)} of {num_gpus} GPUs")
        for g in mb.groups:
            if g.size not in table.sizes:
                problems.append(f"micro-batch {m}: SP degree {g.size} is not allowed")
                continue
            cost = group_cost(table, g)
            if cost.tokens > table.capacity[table.size_index(g.size)]:
                problems.append(f"micro-batch {m}: SP{g.size} group holds {cost.tokens} tokens, "
                                f"capacity {table.capacity[table.size_index(g.size)]}")
            for i in g.sequences:
                seen[i] += 1
    for bad in np.flatnonzero(seen != 1):
        problems.append(f"sequence {int(bad)} placed {int(seen[bad])} times")
    return problems


def breakdown_ms(table: CostTable, mb: MicroBatch) -> dict[str, float]:
    """Where a micro-batch's time goes: its slowest group's compute and all-to-all, plus the fixed cost."""
    slowest = max((group_cost(table, g) for g in mb.groups), key=lambda c: c.load_ms)
    return {"compute": slowest.compute_ms, "alltoall": slowest.comm_ms, "fixed": table.beta_ms}


def plan_to_dict(table: CostTable, plan: list[MicroBatch], original_index: np.ndarray) -> list[dict[str, Any]]:
    """Micro-batches as the contract shows them; ``original_index`` maps table rows to request indices."""
    out = []
    for mb in plan:
        groups = []
        for g, first, last in rank_layout(mb.groups, table):
            cost = group_cost(table, g)
            groups.append({
                "sp": g.size,
                "ranks": [first, last],
                "sequences": sorted(int(original_index[i]) for i in g.sequences),
                "tokens": cost.tokens,
                "time_s": (cost.load_ms + table.beta_ms) / 1e3,
                "breakdown_s": {"compute": cost.compute_ms / 1e3, "alltoall": cost.comm_ms / 1e3,
                                "fixed": table.beta_ms / 1e3},
            })
        br = breakdown_ms(table, mb)
        out.append({
            "time_s": micro_batch_time_ms(table, mb) / 1e3,
            "breakdown_s": {k: v / 1e3 for k, v in br.items()},
            "tokens": int(sum(int(table.lengths[g.sequences].sum()) for g in mb.groups)),
            "groups": groups,
        })
    return out
