"""The MoE part of the hybrid planner's search space: expert layouts of a layer candidate.

Every attention layout (tp, cp, dp, sp, zero, recompute) of an MoE layer is combined with the legal expert
layouts on the same ranks (parallel folding, ``solvers.cost_model.moe``):
- ``ep``: a divisor of the expert count with ``etp * ep`` dividing the layer's ranks;
- ``etp``: as the layer's MLP (the default, ``None``: tp, or 1 under Ulysses) or 1 (experts whole);
- ``lsh``: LSH-MoE compression, only where the EP group crosses nodes (inside a node NVLink is fast enough
  that hashing would not pay) and the request allows approximate methods.

The unchanged layout (ep=1, etp=tp, no LSH) comes first for each attention layout: dense layers, which the
same candidate list serves, cost the same under every expert layout, and the planner's dominance filter
keeps the first of equal candidates, so dense layers never carry expert fields.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import replace
from functools import lru_cache

from solvers.strategy import LayerStrategy


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def crosses_nodes(ep: int, etp: int, gpus_per_node: int) -> bool:
    """The EP group (ep ranks, etp apart) spans nodes (as ``cost_model.moe.alltoall_crosses_nodes``)."""
    return ep > max(1, gpus_per_node // etp)


@lru_cache(maxsize=65536)
def expert_layouts(x: LayerStrategy, num_experts: int, gpus_per_node: int, allow_approximate: bool
                   ) -> tuple[LayerStrategy, ...]:
    """``x`` with each legal (etp, ep, lsh), the unchanged layout first (cached: the planner asks per config)."""
    out: list[LayerStrategy] = []
    for etp in (None, 1):  # None = as the layer's MLP
        if etp == 1 and x.expert_tp == 1:
            continue  # the same layout as None
        etp_n = x.expert_tp if etp is None else etp
        for ep in _divisors(math.gcd(num_experts, x.world)):  # ep divides both (the world: see below)
            if x.world % (etp_n * ep):
                continue
            crosses = crosses_nodes(ep, etp_n, gpus_per_node)
            for lsh in (False, True) if (crosses and allow_approximate) else (False,):
                out.append(replace(x, ep=ep, etp=etp, lsh=lsh))
    return tuple(out)


def with_expert_layouts(candidates: Iterable[LayerStrategy], num_experts: int, gpus_per_node: int,
                        allow_approximate: bool) -> list[LayerStrategy]:
    return [y for x in candidates for y in expert_layouts(x, num_experts, gpus_per_node, allow_approximate)]

