"""Weight resharding in RL post-training: the updated policy's weights brought into the generation layout.

A module that one metaop trains and another runs for generation (``decode``, or ``forward`` as in a rollout's
denoising steps) is one set of weights: after the update, every device that runs a generation slice of a layer
must hold that layer's new weights in full (generation runs plain data parallelism: one bf16 replica per
device) before the next step's rollout. What it already holds decides the cost:
- **co-located** with a plain data-parallel training slice of the layer: the full weights are there after the
  optimizer step (ZeRO-1's all-gather is in the gradient sync): nothing to move;
- co-located with a training layout that shards the weights (tensor parallelism, ZeRO-3): it holds
  ``1 / (tp * (dp if ZeRO-3 else 1))`` of them and gathers the rest from its training group;
- **separate** (no training slice of the layer on the device): the whole layer comes from the training
  devices: over NVLink when one of them shares its node, else over the node's NICs.
Each device receives its bytes at its link's achieved bandwidth; the training devices send the network share
between them (whichever side is slower decides). The transfer starts when the module's gradient sync ends and,
the next step's rollout waiting for it, is exposed in full: synchronous on-policy RL, one step per iteration.
Not modelled: asynchronous (off-policy) pipelines, where the next rollout overlaps this update on a separate
group.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np

from solvers.spindle.cost import ACHIEVED_LINK_SHARE, BF16_BYTES

if TYPE_CHECKING:  # (schedule.evaluate calls this module)
    from solvers.spindle.schedule import Problem, Slice

Colocation = Literal["co-located", "separate", "partly co-located"]


@dataclass(frozen=True)
class Reshard:
    module: str
    time_s: float
    max_bytes_per_device: float  # the most one generation device receives
    generation_devices: int
    colocation: Colocation  # generation devices that also train the module: all, none, some


def _held_fraction(problem: Problem, s: Slice) -> float:
    """The share of a layer's weights a training slice's device holds after the optimizer step."""
    lay = problem.workload.ops[s.op].layout(s.n)
    if lay is None:
        return 1.0
    st = lay.strategy
    return 1.0 / (st.tp * (st.dp if st.zero >= 3 else 1))


def reshards(problem: Problem, slices: Sequence[Slice]) -> list[Reshard]:
    """Per module both trained and run for generation in this schedule: the weight reshard after the update."""
    wl = problem.workload
    n_dev = problem.num_devices
    trained = {wl.ops[s.op].module for s in slices if wl.ops[s.op].mode == "train"}
    generating = {wl.ops[s.op].module for s in slices if wl.ops[s.op].mode != "train"} & trained
    out = []
    topo = problem.topo
    nodes = np.arange(n_dev) // topo.gpus_per_node
    for module in sorted(generating):
        ops = [op for op in wl.ops if op.module == module]
        n_layers = max(op.layer_offset + op.layers for op in ops)
        held = np.zeros((n_layers, n_dev))  # share of each layer's weights on each device after the update
        params = np.zeros(n_layers)
        updated = np.zeros(n_layers, dtype=bool)  # layers some slice trains: only they change
        need = np.zeros((n_layers, n_dev), dtype=bool)  # generation slices' layers
        for s in slices:
            op = wl.ops[s.op]
            if op.module != module:
                continue
            rows = slice(op.layer_offset + s.layer_start, op.layer_offset + s.layer_start + s.layers)
            params[rows] = op.params_per_layer
            if op.mode == "train":
                updated[rows] = True
                block = held[rows, s.lo:s.lo + s.n]
                np.maximum(block, _held_fraction(problem, s), out=block)
            else:
                need[rows, s.lo:s.lo + s.n] = True
        # bytes each device must receive, per layer
        missing = (need & updated[:, None]) * (1.0 - held) * (BF16_BYTES * params)[:, None]
        received = missing.sum(axis=0)
        trainers = held.any(axis=0)
        gen_devices = need.any(axis=0)
        train_nodes = set(nodes[trainers].tolist())
        # a device gathers from a training device in its node over NVLink, else over its share of the NICs
        near = np.array([nodes[d] in train_nodes for d in range(n_dev)])
        bandwidth = np.where(near, topo.intra_Bps, topo.inter_Bps_per_gpu) * ACHIEVED_LINK_SHARE
        receive_s = float((received / bandwidth).max()) if received.any() else 0.0
        network = float(received[~near].sum())
        send_s = network / (max(1, int(trainers.sum())) * topo.inter_Bps_per_gpu * ACHIEVED_LINK_SHARE)
        time_s = max(receive_s, send_s) + (topo.latency_s if received.any() else 0.0)
        both = int((gen_devices & trainers).sum())
        colocation: Colocation = ("co-located" if both == int(gen_devices.sum()) else
                                  "separate" if both == 0 else "partly co-located")
        out.append(Reshard(module, time_s, float(received.max()), int(gen_devices.sum()), colocation))
    return out
