"""The reference wavefront planner, re-implemented (Spindle, arXiv 2409.03365, §4).

Per wave (the metaops whose predecessors are all done):
1. malleable allocation: bisection on the common finish time T over a continuous device share f_m, with
   f_m(T) the share that runs m's remaining layers in T (below one device, m time-shares a device);
2. two-adjacent-counts split / wavefront packing: the shares are laid side by side on the device line; a
   device straddled by two metaops is used by the left one first and the right one after, so each metaop
   runs on floor(f) and ceil(f) devices in turn, its layers split in proportion (a new stage each time its
   block grows or shrinks: stage extension);
3. contiguous placement with inter-wave locality: metaops are ordered on the line next to the devices of
   their predecessors (their activations are there) and, as alternatives, by size and by module.
Share models (``Shares``): ``fluid`` is the reference's continuous relaxation; ``mix`` prices the two
adjacent widths with the per-device batch rounded up; ``whole`` gives whole efficient widths and hands spare
devices to the last finisher. The placements are timed by ``schedule.timeline`` (slices start as soon as
their devices are free); ``planner`` keeps the best line-up and share model by full evaluation.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal

from solvers.spindle.bounds import DeviceRange, bottom_levels_s
from solvers.spindle.schedule import Placement, Problem
from solvers.spindle.workload import MetaOp

_BISECT_STEPS = 60
Shares = Literal["fluid", "mix", "whole"]
SHARES: tuple[Shares, ...] = ("fluid", "mix", "whole")


def _share(op: MetaOp, layers: int, t_ms: float, r: DeviceRange, shares: Shares) -> float:
    """Device share that runs ``layers`` layers of ``op`` in ``t_ms`` (clamped to its range).

    fluid: the reference's continuous relaxation, per-layer time slope * batch / f + intercept.
    mix: a share f between widths n and n+1 is realised by running on n and n+1 devices in turn (time
    fractions n+1-f and f-n), so f is where that mix's layer rate, with the per-device batch rounded up,
    meets ``layers / t_ms``. whole: the fewest whole devices that make it, which is always an efficient
    width (no other width has the same per-device batch with fewer devices)."""
    on_lo = layers * op.layer_ms(r.lo)
    if on_lo <= t_ms:
        # time-share: a lone device (or the memory-minimum block) is enough; use only the needed fraction
        return r.lo * on_lo / t_ms if r.lo == 1 else float(r.lo)
    if shares == "fluid" and not op.layouts:  # (a layout table has no affine form: priced as mix below)
        budget = t_ms / layers - op.intercept_ms
        if budget <= 0:
            return float(r.hi)
        return min(float(r.hi), max(float(r.lo), op.slope_ms * op.batch / budget))
    # the fewest devices that make it (layer rate 1 / layer_ms grows with the width): binary search
    lo, hi = r.lo, r.hi
    if layers * op.layer_ms(hi) > t_ms:
        return float(hi)
    while lo < hi:
        mid = (lo + hi) // 2
        if layers * op.layer_ms(mid) <= t_ms:
            hi = mid
        else:
            lo = mid + 1
    if shares == "whole" or lo == r.lo:
        return float(lo)
    need = layers / t_ms
    below, above = 1.0 / op.layer_ms(lo - 1), 1.0 / op.layer_ms(lo)
    return lo - 1 + (need - below) / (above - below)


def allocate(ops: Sequence[MetaOp], layers: Sequence[int], ranges: Sequence[DeviceRange], devices: int,
             shares: Shares = "fluid") -> tuple[float, list[float]]:
    """Bisection on the common finish time T (ms) so that the shares fill ``devices``.

    Discrete shares leave devices over; they go, one efficient width step at a time, to the metaop that
    finishes last (stage extension within the wave)."""
    rows = list(zip(ops, layers, ranges, strict=True))
    lo_t = max(k * op.layer_ms(r.hi) for op, k, r in rows)
    hi_t = max(lo_t, sum(k * op.layer_ms(r.lo) * r.lo for op, k, r in rows))

    def total(t: float) -> float:
        return sum(_share(op, k, t, r, shares) for op, k, r in rows)

    if total(lo_t) <= devices:
        t = lo_t
    else:
        for _ in range(_BISECT_STEPS):
            if hi_t - lo_t <= 1e-12 * hi_t:  # (as close as the floats' last bits: further steps change nothing)
                break
            mid = 0.5 * (lo_t + hi_t)
            if total(mid) > devices:
                lo_t = mid
            else:
                hi_t = mid
        t = hi_t
    share = [_share(op, k, t, r, shares) for op, k, r in rows]
    if shares == "whole":
        spare = devices - sum(share)
        while spare >= 1:
            finish = [k * op.layer_ms(max(1, int(f))) if f >= 1 else 0.0 for f, (op, k, _) in zip(share, rows,
                                                                                                  strict=True)]
            grown = False
            for j in sorted(range(len(rows)), key=lambda j: -finish[j]):
                op, _, r = rows[j]
                n = int(share[j])
                if n < 1:
                    continue
                step = next((m for m in range(n + 1, min(r.hi, n + int(spare)) + 1)
                             if op.layer_ms(m) < op.layer_ms(n)), None)
                if step is not None:
                    spare -= step - n
                    share[j] = float(step)
                    grown = True
                    break
            if not grown:
                break
        t = max([t, *(k * op.layer_ms(int(f)) for f, (op, k, _) in zip(share, rows, strict=True) if f >= 1)])
    return t, share


@dataclass(frozen=True)
class _Phase:
    t0: float  # fraction of the wave
    t1: float
    lo: int
    n: int


def column_phases(intervals: Sequence[tuple[float, float]]) -> list[list[_Phase]]:
    """Device blocks over time for shares laid side by side on the device line.

    ``intervals`` are the [a, b) positions of the shares, left to right. Device d's time is handed out left
    to right: whoever overlaps it further left uses it earlier. So a share uses its left boundary device at
    the end of the wave, its right boundary device at the start, and everything between throughout; the set
    is contiguous at every moment.
    """
    out = []
    for a, b in intervals:
        first, last = math.floor(a + 1e-9), math.ceil(b - 1e-9) - 1
        windows: dict[int, tuple[float, float]] = {}
        for d in range(first, last + 1):
            start = max(0.0, a - d) if d == first else 0.0
            end = min(1.0, b - d) if d == last else 1.0
            # in column d, the fraction before this share belongs to shares to its left: it goes first
            windows[d] = (start, end) if d == first else (0.0, end)
        cuts = sorted({0.0, 1.0, *(w for pair in windows.values() for w in pair)})
        phases: list[_Phase] = []
        for t0, t1 in itertools.pairwise(cuts):
            if t1 - t0 < 1e-9:
                continue
            mid = 0.5 * (t0 + t1)
            active = [d for d, (s, e) in windows.items() if s <= mid < e]
            if not active:
                continue
            lo, n = min(active), len(active)
            if phases and phases[-1].lo == lo and phases[-1].n == n and abs(phases[-1].t1 - t0) < 1e-9:
                phases[-1] = _Phase(phases[-1].t0, t1, lo, n)
            else:
                phases.append(_Phase(t0, t1, lo, n))
        out.append(phases)
    return out


def split_layers(op: MetaOp, layers: int, phases: Sequence[_Phase], t_ms: float) -> list[int]:
    """Integer layers per phase, in proportion to what each phase can run, summing to ``layers``."""
    cap = [(p.t1 - p.t0) * t_ms / op.layer_ms(p.n) for p in phases]
    total = sum(cap) or 1.0
    want = [c * layers / total for c in cap]
    got = [math.floor(w) for w in want]
    for i in sorted(range(len(want)), key=lambda i: got[i] - want[i])[: layers - sum(got)]:
        got[i] += 1
    return got


def lay_out(seq: Sequence[int], share: Sequence[float], min_devices: Sequence[int], n_dev: int) -> list[
        tuple[float, float]]:
    """Positions [a, b) on the device line, in ``seq`` order.

    A metaop that needs several devices at once for memory gets a whole, integer block (a straddled device
    would leave it short-handed for part of the wave); the others fill the rest of the line continuously.
    """
    whole = {j: max(min_devices[j], round(share[j])) for j in seq if min_devices[j] > 1}
    while sum(whole.values()) > n_dev:
        j = max((j for j in whole if whole[j] > min_devices[j]), key=lambda j: whole[j] - share[j])
        whole[j] -= 1
    rest = n_dev - sum(whole.values())
    flexible = sum(share[j] for j in seq if j not in whole)
    scale = min(1.0, rest / flexible) if flexible > 0 else 0.0
    # whole blocks first so that they start on device boundaries
    pos, at = 0.0, {}
    for j in [j for j in seq if j in whole] + [j for j in seq if j not in whole]:
        width = float(whole[j]) if j in whole else share[j] * scale
        at[j] = (pos, min(float(n_dev), pos + width))
        pos += width
    return [at[j] for j in seq]


Order = Callable[[Problem, list[int], list[float], dict[int, float]], list[int]]


def _by_locality(problem: Problem, ready: list[int], share: list[float], centre: dict[int, float]) -> list[int]:
    """Next to the devices of the predecessors (activations stay local); newcomers after, biggest first."""
    wl = problem.workload
    far = float(problem.num_devices)

    def key(j: int) -> tuple[float, float]:
        op = ready[j]
        cs = [centre[u] for u in wl.preds[op] if u in centre]
        if op in centre:  # a metaop continuing from the previous wave stays put
            cs = [centre[op]]
        return (sum(cs) / len(cs) if cs else far, -share[j])

    return sorted(range(len(ready)), key=key)


def _by_size(problem: Problem, ready: list[int], share: list[float], centre: dict[int, float]) -> list[int]:
    return sorted(range(len(ready)), key=lambda j: -share[j])


def _by_module(problem: Problem, ready: list[int], share: list[float], centre: dict[int, float]) -> list[int]:
    ops = problem.workload.ops
    return sorted(range(len(ready)), key=lambda j: (ops[ready[j]].module, ops[ready[j]].task, -share[j]))


ORDERS: dict[str, Order] = {"locality": _by_locality, "size": _by_size, "module": _by_module}


MAX_SPLIT_WAVE = 24  # the split tries O(k^2) allocations of a wave of k metaops: bigger waves run whole


def split_wave(ops: Sequence[MetaOp], layers: Sequence[int], ranges: Sequence[DeviceRange], devices: int,
               shares: Shares) -> list[list[int]]:
    """A wave's metaops (``ops``, the first being the most critical) in groups that run in turn: indices into
    ``ops``, the group to run now first, the others by their most critical metaop.

    All at once is the reference's choice, and right for convex width-time curves. Where a metaop is far
    cheaper per sample on many devices (an MoE stack whose hybrid layout at one sample per device drops the
    expert all-to-all and recomputation: 650 ms on 16 devices, 108 ms on 64), squeezing four such metaops side
    by side costs several times running them in turn. Agglomerative: from every metaop in its own group (the
    groups run in turn), merge the two groups whose merge saves most, each group priced by ``allocate``,
    while a merge does not lose (ties merge: the reference's side by side). The group holding the first
    metaop runs now. Where no metaop gains by running alone after the others, the wave stays whole without
    this search. (With every metaop's work n * t(n) non-decreasing in n, fluid shares would never gain
    by a split; integer widths and hybrid layouts make the curves jagged, so the split is priced, not
    assumed, and kept only where the whole schedule's evaluation prefers it.)"""
    if len(ops) < 2 or len(ops) > MAX_SPLIT_WAVE:
        return [list(range(len(ops)))]

    def time_of(group: tuple[int, ...]) -> float:
        return allocate([ops[j] for j in group], [layers[j] for j in group], [ranges[j] for j in group],
                        devices, shares)[0]

    groups: dict[tuple[int, ...], float] = {(j,): time_of((j,)) for j in range(len(ops))}
    # the common case first, for a fraction of the cost: no metaop gains by running alone after the others
    everyone = tuple(range(len(ops)))
    whole = time_of(everyone)
    if all(time_of(tuple(k for k in everyone if k != j)) + groups[(j,)] >= whole * (1 - 1e-9) for j in everyone):
        return [list(everyone)]
    merged: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
    while len(groups) > 1:
        for a, b in itertools.combinations(sorted(groups), 2):
            if (a, b) not in merged:
                merged[(a, b)] = time_of(tuple(sorted(a + b)))
        saving, a, b = max((groups[a] + groups[b] - merged[(a, b)], a, b)
                           for a, b in itertools.combinations(sorted(groups), 2))
        if saving < -1e-9 * (groups[a] + groups[b]):
            break
        groups[tuple(sorted(a + b))] = merged[(a, b)]
        del groups[a], groups[b]
    return [list(g) for g in sorted(groups)]  # (each group sorted: the one holding metaop 0 comes first)


# (metaop indices ready, their remaining layers) -> the indices to run now; one per problem, ranges and shares:
# the split does not depend on the line-up, so the orderings share it
SplitMemo = dict[tuple[tuple[int, ...], tuple[int, ...]], list[int]]


def plan_waves(problem: Problem, ranges: list[DeviceRange], order: Order, shares: Shares = "fluid",
               split: SplitMemo | None = None) -> list[Placement]:
    """The wavefront schedule; with ``split`` (a memo, possibly empty) a wave may leave some of its ready
    metaops to the next one (``split_wave``)."""
    wl = problem.workload
    n_dev = problem.num_devices
    remaining = [op.layers for op in wl.ops]
    blevel = bottom_levels_s(problem, ranges)
    centre: dict[int, float] = {}
    placements: list[tuple[int, float, int, Placement]] = []
    wave = 0
    while any(remaining):
        ready = [i for i in range(len(wl.ops)) if remaining[i] and all(not remaining[u] for u in wl.preds[i])]
        # more memory-bound metaops than devices: the most critical go first, the rest wait a wave
        ready.sort(key=lambda i: -blevel[i])
        chosen, used = [], 0
        for i in ready:
            if ranges[i].lo == 1 or used + ranges[i].lo <= n_dev:
                chosen.append(i)
                used += ranges[i].lo if ranges[i].lo > 1 else 0
        ready = chosen
        if split is not None:
            key = (tuple(ready), tuple(remaining[i] for i in ready))
            if key not in split:
                groups = split_wave([wl.ops[i] for i in ready], list(key[1]), [ranges[i] for i in ready],
                                    n_dev, shares)
                # the next waves meet the rest of this one again unless something new became ready: their
                # split is this one's remainder (and pricing it again would cost as much as this one)
                for g in range(len(groups)):
                    rest = sorted(j for group in groups[g:] for j in group)
                    split.setdefault((tuple(ready[j] for j in rest), tuple(key[1][j] for j in rest)),
                                     [rest.index(j) for j in groups[g]])
            ready = [ready[j] for j in split[key]]
        t_ms, share = allocate([wl.ops[i] for i in ready], [remaining[i] for i in ready],
                               [ranges[i] for i in ready], n_dev, shares)
        seq = order(problem, ready, share, centre)
        intervals = lay_out(seq, share, [ranges[i].lo for i in ready], n_dev)
        for (a, b), j, phases in zip(intervals, seq, column_phases(intervals), strict=True):
            op_i = ready[j]
            if not phases:  # squeezed out by whole blocks: waits for the next wave
                continue
            counts = split_layers(wl.ops[op_i], remaining[op_i], phases, t_ms)
            for p, layers in zip(phases, counts, strict=True):
                if layers:
                    placements.append((wave, p.t0, p.lo, Placement(op_i, layers, p.lo, p.n, wave)))
            centre[op_i] = 0.5 * (a + b)
            remaining[op_i] = 0
        wave += 1
    placements.sort(key=lambda x: (x[0], x[1], x[2]))
    return [p for *_, p in placements]
