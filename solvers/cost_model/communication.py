"""Collective and point-to-point times on the right links.

Ranks are laid out Megatron-style, tensor-parallel innermost, then context-parallel, data-parallel and
pipeline outermost, so a group of ``size`` ranks with ``stride`` between members puts
``k = min(size, gpus_per_node // stride)`` (at least 1) of its members on each node it touches.
A collective over such a group is modelled hierarchically (what NCCL's rings/trees achieve): the part
inside a node runs on NVLink at the per-GPU bandwidth, the part across nodes on each GPU's share of the
node's NICs (all GPUs of a node communicate at once, each in its own group), each with an efficiency.
All functions are numpy-vectorised over candidates.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from solvers.cost_model.calibration import AnalyticCalibration
from solvers.specs import ClusterSpec

ArrayLike = np.ndarray | float


@dataclass(frozen=True)
class Links:
    """Per-GPU bandwidths (bytes/s, one direction) and per-step latencies of the two link kinds."""

    intra_Bps: float
    inter_Bps: float  # this GPU's share of the node's network bandwidth
    gpus_per_node: int
    intra_latency_s: float = 5e-6
    inter_latency_s: float = 10e-6

    @classmethod
    def calibrated(cls, cluster: ClusterSpec, cal: AnalyticCalibration) -> Links:
        """The cluster's links at the constants' efficiencies and per-step latencies."""
        return cls.of(cluster, cal.intra_efficiency, cal.inter_efficiency, cal.intra_latency_s, cal.inter_latency_s)

    @classmethod
    def of(cls, cluster: ClusterSpec, intra_efficiency: float, inter_efficiency: float,
           intra_latency_s: float = 5e-6, inter_latency_s: float = 10e-6) -> Links:
        return cls(
            intra_Bps=cluster.intra_GBps * 1e9 * intra_efficiency,
            inter_Bps=cluster.inter_GBps_per_gpu * 1e9 * inter_efficiency,
            gpus_per_node=cluster.gpus_per_node,
            intra_latency_s=intra_latency_s,
            inter_latency_s=inter_latency_s,
        )


def members_per_node(size: ArrayLike, stride: ArrayLike, gpus_per_node: int) -> np.ndarray:
    """How many members of a group with the given stride share a node (1 when the stride fills a node)."""
    size, stride = np.asarray(size, dtype=float), np.asarray(stride, dtype=float)
    per_node = np.maximum(1.0, np.floor(gpus_per_node / np.maximum(stride, 1.0)))
    return np.minimum(size, per_node)


def _split(size: ArrayLike, k: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    n = np.maximum(np.asarray(size, dtype=float), 1.0)
    per_node = np.clip(np.asarray(k, dtype=float), 1.0, n)
    return per_node, np.ceil(n / per_node)


def allreduce_s(nbytes: ArrayLike, size: ArrayLike, k: ArrayLike, links: Links) -> np.ndarray:
    """Ring all-reduce of ``nbytes`` per rank: reduce-scatter + all-gather, 2(n-1)/n of the data each way."""
    k, nodes = _split(size, k)
    nbytes = np.asarray(nbytes, dtype=float)
    intra = 2 * (k - 1) / k * nbytes / links.intra_Bps + 2 * (k - 1) * links.intra_latency_s
    inter = 2 * (nodes - 1) / nodes * nbytes / k / links.inter_Bps + 2 * (nodes - 1) * links.inter_latency_s
    return np.where(np.asarray(size) > 1, intra + inter, 0.0)


def allgather_s(nbytes: ArrayLike, size: ArrayLike, k: ArrayLike, links: Links) -> np.ndarray:
    """All-gather (or reduce-scatter) whose full result is ``nbytes`` per rank: half an all-reduce."""
    return 0.5 * allreduce_s(nbytes, size, k, links)


def alltoall_s(nbytes: ArrayLike, size: ArrayLike, k: ArrayLike, links: Links) -> np.ndarray:
    """All-to-all of ``nbytes`` held per rank: (n-1)/n of it leaves; on- and off-node parts run concurrently."""
    k, nodes = _split(size, k)
    n = k * nodes
    nbytes = np.asarray(nbytes, dtype=float)
    intra = (k - 1) / n * nbytes / links.intra_Bps + (k - 1) * links.intra_latency_s
    inter = (n - k) / n * nbytes / links.inter_Bps + (nodes - 1) * links.inter_latency_s
    return np.where(np.asarray(size) > 1, np.maximum(intra, inter), 0.0)


def collective_s(op: str, nbytes: ArrayLike, size: ArrayLike, k: ArrayLike, links: Links) -> np.ndarray:
    """``op`` ("allreduce", "allgather", "reduce_scatter" or "alltoall") of ``nbytes`` over a group of ``size``
    with ``k`` members per node; a reduce-scatter costs what the all-gather of its result does."""
    fn = {"allreduce": allreduce_s, "allgather": allgather_s, "reduce_scatter": allgather_s,
          "alltoall": alltoall_s}[op]
    return fn(nbytes, size, k, links)


def p2p_s(nbytes: ArrayLike, across_nodes: bool, links: Links) -> np.ndarray:
    nbytes = np.asarray(nbytes, dtype=float)
    if across_nodes:
        return nbytes / links.inter_Bps + links.inter_latency_s
    return nbytes / links.intra_Bps + links.intra_latency_s
