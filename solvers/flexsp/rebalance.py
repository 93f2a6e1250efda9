"""Moves between micro-batches, after the planners have fixed who shares a micro-batch.

Every micro-batch pays the fixed cost and lasts as long as its slowest group, so two kinds of move pay:

- dissolving a light micro-batch: each of its sequences (longest first) goes to the group of another
  micro-batch where it raises that micro-batch's time least (idle groups count: they are GPUs with
  memory); kept when the raises sum to less than the dissolved micro-batch's time, fixed cost included;
- moving a sequence off a slowest group: it goes where it raises another micro-batch least, kept when that
  raise is smaller than what its own micro-batch saves.

Both only ever lower the step time; they stop at a local optimum or after a bounded number of passes.
"""

from __future__ import annotations

from dataclasses import dataclass

from solvers.flexsp.packing import PackingContext, group_loads, longest_first
from solvers.flexsp.plan import Group, MicroBatch

MAX_MOVE_PASSES = 4


@dataclass
class _State:
    """Per-micro-batch group loads and tokens, kept in step with the groups' members."""

    groups: list[list[Group]]
    loads: list[list[float]]
    tokens: list[list[int]]

    @classmethod
    def of(cls, ctx: PackingContext, plan: list[MicroBatch]) -> _State:
        groups = [[Group(g.size, list(g.sequences)) for g in mb.groups] for mb in plan]
        return cls(
            groups=groups,
            loads=[group_loads(ctx, MicroBatch(gs)) for gs in groups],
            tokens=[[sum(ctx.lengths[i] for i in g.sequences) for g in gs] for gs in groups],
        )

    def peak(self, m: int) -> float:
        return max(self.loads[m])

    def best_home(self, ctx: PackingContext, i: int, skip: int) -> tuple[float, int, int] | None:
        """(raise of that micro-batch's time, micro-batch, group) of the cheapest place for sequence i."""
        best: tuple[float, int, int] | None = None
        for m, gs in enumerate(self.groups):
            if m == skip:
                continue
            peak = self.peak(m)
            for q, g in enumerate(gs):
                j = ctx.index[g.size]
                if self.tokens[m][q] + ctx.lengths[i] > ctx.capacity[j]:
                    continue
                raise_ms = max(0.0, self.loads[m][q] + ctx.time[i][j] - peak)
                if best is None or raise_ms < best[0]:
                    best = (raise_ms, m, q)
                    if raise_ms == 0.0:
                        return best
        return best

    def move(self, ctx: PackingContext, i: int, src: tuple[int, int] | None, dst: tuple[int, int]) -> None:
        if src is not None:
            m, q = src
            self.groups[m][q].sequences.remove(i)
            self.loads[m][q] -= ctx.time[i][ctx.index[self.groups[m][q].size]]
            self.tokens[m][q] -= ctx.lengths[i]
        m, q = dst
        self.groups[m][q].sequences.append(i)
        self.loads[m][q] += ctx.time[i][ctx.index[self.groups[m][q].size]]
        self.tokens[m][q] += ctx.lengths[i]

    def plan(self) -> list[MicroBatch]:
        """The state as micro-batches, without those its moves emptied (an empty micro-batch only costs its fixed
        time, and it crashed the repacking that follows: found by a fuzz)."""
        return [MicroBatch([Group(g.size, sorted(g.sequences)) for g in gs]) for gs in self.groups
                if any(g.sequences for g in gs)]


def _dissolve_one(ctx: PackingContext, plan: list[MicroBatch], victim: int) -> list[MicroBatch] | None:
    rest = [mb for k, mb in enumerate(plan) if k != victim]
    state = _State.of(ctx, rest)
    saved = ctx.table.beta_ms + max(group_loads(ctx, plan[victim]))
    added = 0.0
    for i in longest_first(ctx.table, [r for g in plan[victim].groups for r in g.sequences]):
        home = state.best_home(ctx, i, skip=-1)
        if home is None:
            return None
        added += home[0]
        if added >= saved:
            return None
        state.move(ctx, i, None, (home[1], home[2]))
    return state.plan()


def dissolve_light_micro_batches(ctx: PackingContext, plan: list[MicroBatch]) -> list[MicroBatch]:
    while len(plan) > 1:
        victim = min(range(len(plan)), key=lambda k: (max(group_loads(ctx, plan[k])), k))
        merged = _dissolve_one(ctx, plan, victim)
        if merged is None:
            return plan
        plan = merged
    return plan


def move_off_slowest_groups(ctx: PackingContext, plan: list[MicroBatch]) -> list[MicroBatch]:
    state = _State.of(ctx, plan)
    for _ in range(MAX_MOVE_PASSES):
        improved = False
        for m in range(len(state.groups)):
            while True:
                peak = state.peak(m)
                q = max(range(len(state.loads[m])), key=lambda k: (state.loads[m][k], -k))
                j = ctx.index[state.groups[m][q].size]
                second = max((ld for k, ld in enumerate(state.loads[m]) if k != q), default=0.0)
                best: tuple[float, int, tuple[int, int]] | None = None
                # Shortest first: small moves trim the peak without emptying the group.
                for i in sorted(state.groups[m][q].sequences, key=lambda r: (ctx.lengths[r], r)):
                    saved = peak - max(second, peak - ctx.time[i][j])
                    if saved <= 1e-9:
                        continue
                    home = state.best_home(ctx, i, skip=m)
                    if home is not None and saved - home[0] > 1e-6 and (best is None or saved - home[0] > best[0]):
                        best = (saved - home[0], i, (home[1], home[2]))
                if best is None:
                    break
                state.move(ctx, best[1], (m, q), best[2])
                improved = True
        if not improved:
            break
    return state.plan()
