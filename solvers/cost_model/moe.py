"""Mixture-of-experts cost terms, as pure numpy-vectorised functions of the candidates' degrees.

Layout of an MoE layer's ranks (Megatron-Core "parallel folding"): attention keeps its own tp x cp x dp;
the same ``world = tp * cp * dp`` ranks are re-read for the experts as ``etp * ep * edp``, expert-TP
innermost, then expert-parallel, then expert data-parallel. So the EP group has stride ``etp`` and stays
inside a node while ``etp * ep <= gpus_per_node``: folding lets attention use TP=8 on a node while the
experts use EP=8 on the same node.

Per micro-batch on one rank (``tokens`` = the tokens this rank routes, i.e. its sequence-parallel share):
- routing volume: each token is sent to ``top_k`` experts; rows per rank = tokens x top_k;
- load: a balanced router's busiest rank sees ``min(capacity_factor, LOAD_IMBALANCE)`` times the mean
  (tokens beyond the capacity are dropped, so the capacity factor caps it); both the expert GEMMs and the
  all-to-alls wait for that busiest rank;
- two all-to-alls per MoE layer forward (dispatch, combine), two more backward, on the EP group's links;
- expert TP: the rows an EP rank receives are all-gathered over its ETP group before the experts and
  reduce-scattered after (Megatron's ETP), and the expert weights are split over etp;
- expert states: ``expert_params / (etp * ep)`` per rank, ZeRO-sharded and gradient-synchronised over edp;
- LSH-MoE (arXiv 2411.08446, approximate): all-to-all bytes x ``LSH_COMPRESSION_RATE``; hashing costs a
  GEMM of the rows against ``hashes x proj_dim`` directions plus the centroid scatter; the residuals
  (x - centroid, one row per routed copy) are kept until the combine.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from solvers.cost_model import communication as comm
from solvers.strategy import LayerStrategy

ArrayLike = np.ndarray | float
Gemm = Callable[[ArrayLike, ArrayLike, ArrayLike], np.ndarray]

# Busiest expert's load over the mean with an auxiliary-loss-balanced router (Switch/GShard report 1.1-1.3
# at capacity factors 1.25-2); capped by the capacity factor since tokens above it are dropped.
LOAD_IMBALANCE = 1.2
# Bytes sent / bytes uncompressed at 6 hash functions: ~20% in the paper; bench/moe_training.py measures
# 0.30-0.31 on a tiny model's hidden states (tests/moe: ~0.10 on clustered tokens). The conservative end.
LSH_COMPRESSION_RATE = 0.3
LSH_HASHES = 6
LSH_PROJ_DIM = 16


@dataclass(frozen=True)
class MoEDims:
    """What the MoE formulas need of one MoE layer."""

    hidden: int
    ffn: int  # one expert's FFN width
    gated: bool
    num_experts: int
    top_k: int
    capacity_factor: float
    imbalance: float = LOAD_IMBALANCE

    @property
    def load(self) -> float:
        return min(self.capacity_factor, self.imbalance)


def routed_rows(tokens: ArrayLike, dims: MoEDims) -> np.ndarray:
    """Token copies the busiest rank sends (and receives) per all-to-all."""
    return np.asarray(tokens, dtype=float) * dims.top_k * dims.load


def ep_group_members_per_node(ep: ArrayLike, etp: ArrayLike, gpus_per_node: int) -> np.ndarray:
    return comm.members_per_node(ep, etp, gpus_per_node)


def alltoall_crosses_nodes(ep: ArrayLike, etp: ArrayLike, gpus_per_node: int) -> np.ndarray:
    """True where the EP group spans more than one node (LSH compression only pays there)."""
    return ep_group_members_per_node(ep, etp, gpus_per_node) < np.asarray(ep, dtype=float)


# (bytes held per rank, group size, group members per node) -> seconds of one all-to-all
AllToAll = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


def alltoall_bytes(tokens: ArrayLike, lsh: ArrayLike, dims: MoEDims, elem_bytes: float) -> np.ndarray:
    """Bytes one all-to-all moves from (and to) the busiest rank: its routed rows, compressed under LSH."""
    nbytes = routed_rows(tokens, dims) * dims.hidden * elem_bytes
    return nbytes * np.where(np.asarray(lsh, dtype=bool), LSH_COMPRESSION_RATE, 1.0)


def alltoall_forward_s(tokens: ArrayLike, ep: ArrayLike, etp: ArrayLike, lsh: ArrayLike, dims: MoEDims,
                       elem_bytes: float, links: comm.Links, alltoall: AllToAll | None = None) -> np.ndarray:
    """Dispatch + combine all-to-alls of one forward (the backward repeats them with the same volume);
    ``alltoall`` prices one call (default: the analytic links; the cost model passes its measured collectives)."""
    nbytes = alltoall_bytes(tokens, lsh, dims, elem_bytes)
    k = ep_group_members_per_node(ep, etp, links.gpus_per_node)
    size = np.asarray(ep, dtype=float)
    one = alltoall(nbytes, size, k) if alltoall is not None else comm.alltoall_s(nbytes, size, k, links)
    return 2.0 * np.where(size > 1, one, 0.0)


def expert_tp_forward_s(tokens: ArrayLike, etp: ArrayLike, lsh: ArrayLike, dims: MoEDims, elem_bytes: float,
                        links: comm.Links) -> np.ndarray:
    """Expert TP: all-gather the received rows over the ETP group, reduce-scatter the outputs (contiguous)."""
    rate = np.where(np.asarray(lsh, dtype=bool), LSH_COMPRESSION_RATE, 1.0)
    gathered = routed_rows(tokens, dims) * rate * np.asarray(etp, dtype=float) * dims.hidden * elem_bytes
    k = comm.members_per_node(etp, 1.0, links.gpus_per_node)
    return 2.0 * comm.allgather_s(gathered, etp, k, links)


def expert_forward_s(gemm: Gemm, tokens: ArrayLike, ep: ArrayLike, etp: ArrayLike, lsh: ArrayLike,
                     dims: MoEDims) -> np.ndarray:
    """Local experts' GEMMs on the busiest rank: E/ep experts, each on its share of the gathered rows
    (centroids only under LSH), weights split over etp; plus the router's GEMM on this rank's tokens."""
    ep, etp = np.asarray(ep, dtype=float), np.asarray(etp, dtype=float)
    rate = np.where(np.asarray(lsh, dtype=bool), LSH_COMPRESSION_RATE, 1.0)
    rows = routed_rows(tokens, dims) * rate * etp  # rows this rank's experts see, after the ETP gather
    local = dims.num_experts / ep
    per_expert = rows / local
    width_in = (2 if dims.gated else 1) * dims.ffn / etp
    mlp = gemm(per_expert, width_in, dims.hidden) + gemm(per_expert, dims.hidden, dims.ffn / etp)
    return local * mlp + gemm(np.asarray(tokens, dtype=float), dims.num_experts, dims.hidden)


def lsh_hash_forward_s(gemm: Gemm, hbm_time: Callable[[ArrayLike], np.ndarray], tokens: ArrayLike, lsh: ArrayLike,
                       dims: MoEDims, elem_bytes: float) -> np.ndarray:
    """Hashing the routed copies (projection GEMM + argmax), the centroid scatter-mean and the residual
    add-back, where LSH is on; the backward costs about as much again (scatter of gradients)."""
    rows = routed_rows(tokens, dims)
    project = gemm(rows, LSH_HASHES * 2 * LSH_PROJ_DIM, dims.hidden)
    # read rows for the projection, read + scatter-add for centroids, write residuals, read them at the add
    traffic = hbm_time(5.0 * rows * dims.hidden * elem_bytes)
    return np.where(np.asarray(lsh, dtype=bool), project + traffic, 0.0)


def lsh_residual_bytes(tokens: ArrayLike, lsh: ArrayLike, dims: MoEDims, elem_bytes: float) -> np.ndarray:
    """Residuals (x - centroid) plus an int64 bucket index per routed copy, kept until the combine."""
    rows = routed_rows(tokens, dims)
    return np.where(np.asarray(lsh, dtype=bool), rows * (dims.hidden * elem_bytes + 8.0), 0.0)


def expert_params_per_rank(expert_params: float, ep: ArrayLike, etp: ArrayLike) -> np.ndarray:
    return expert_params / (np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float))


def expert_dp(world: ArrayLike, ep: ArrayLike, etp: ArrayLike) -> np.ndarray:
    """Ranks holding the same expert shard: the group over which its gradients sync and ZeRO shards."""
    return np.asarray(world, dtype=float) / (np.asarray(ep, dtype=float) * np.asarray(etp, dtype=float))


def expert_dp_members_per_node(ep: ArrayLike, etp: ArrayLike, world: ArrayLike, gpus_per_node: int) -> np.ndarray:
    return comm.members_per_node(expert_dp(world, ep, etp), np.asarray(ep, dtype=float) * etp, gpus_per_node)


@dataclass(frozen=True)
class MoETerms:
    """An MoE layer's expert path per candidate, what the analytic model adds to its attention part."""

    compute_fwd_s: np.ndarray  # expert GEMMs (busiest rank), router, LSH hashing: one forward
    alltoall_fwd_s: np.ndarray  # dispatch + combine all-to-alls: one forward
    etp_fwd_s: np.ndarray  # expert-TP gather / scatter (replaces the dense MLP's TP all-reduce): one forward
    expert_params: np.ndarray  # expert weights held per rank
    edp: np.ndarray  # ranks holding the same expert shard (ZeRO and gradient sync group)
    edp_per_node: np.ndarray
    extra_activation_bytes: np.ndarray  # LSH residuals, per micro-batch in flight
    alltoall_bytes: np.ndarray  # what one all-to-all (dispatch or combine) leaves on this rank (0 without ep)


def layer_terms(gemm: Gemm, hbm_time: Callable[[ArrayLike], np.ndarray], links: comm.Links, dims: MoEDims,
                expert_params: float, tokens: ArrayLike, world: ArrayLike, ep: ArrayLike, etp: ArrayLike,
                lsh: ArrayLike, elem_bytes: float, alltoall: AllToAll | None = None) -> MoETerms:
    """All expert-path terms for candidates routing ``tokens`` tokens per rank (their sequence-parallel share)."""
    return MoETerms(
        compute_fwd_s=expert_forward_s(gemm, tokens, ep, etp, lsh, dims)
        + lsh_hash_forward_s(gemm, hbm_time, tokens, lsh, dims, elem_bytes),
        alltoall_fwd_s=alltoall_forward_s(tokens, ep, etp, lsh, dims, elem_bytes, links, alltoall),
        etp_fwd_s=expert_tp_forward_s(tokens, etp, lsh, dims, elem_bytes, links),
        expert_params=expert_params_per_rank(expert_params, ep, etp),
        edp=expert_dp(world, ep, etp),
        edp_per_node=expert_dp_members_per_node(ep, etp, world, links.gpus_per_node),
        extra_activation_bytes=lsh_residual_bytes(tokens, lsh, dims, elem_bytes),
        alltoall_bytes=np.where(np.asarray(ep, dtype=float) > 1, alltoall_bytes(tokens, lsh, dims, elem_bytes), 0.0),
    )


def approximate_note(layers: Sequence[LayerStrategy]) -> str | None:
    """The estimate's flag that a plan is approximate (LSH-compressed all-to-alls change the numerics)."""
    lsh = [i for i, x in enumerate(layers) if x.lsh]
    if not lsh:
        return None
    return (f"approximate: LSH-MoE compression of the all-to-alls on {len(lsh)} MoE layer(s) (first {lsh[0]}); "
            f"bytes x {LSH_COMPRESSION_RATE} assumed at {LSH_HASHES} hash functions")
