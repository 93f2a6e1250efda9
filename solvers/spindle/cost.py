"""The Spindle cost model: per-layer time of a module shape, memory of a slice, transfers and gradient sync.

Time is affine in the local batch, so every metaop reduces to ``slope * ceil(batch / n) + intercept`` per
layer, the reference planner's form; the planners see nothing else. Memory and communication are costed on
a finished schedule (``schedule.evaluate``):
- states: per hosted layer, bf16 weights + grads (4 B/param) and fp32 Adam states (12 B/param) sharded over
  the slice's data-parallel group (ZeRO-1); frozen / decode modules keep bf16 weights only (2 B/param);
- activations: Spindle runs every wave's forward, then the backward in reverse, so a device holds the
  activations of all its training slices at the turn (34·s·h bytes per sample per layer with flash attention,
  Korthikanti et al. 2022); a decode slice holds its KV cache while it runs (freed before the update);
- activation transfer between dependent slices on different device blocks (forward + gradient back);
- gradient all-reduce of each trained layer over every device that hosts it (tasks sharing a module sync
  together), after the module's last slice; NVLink inside a node, the node's NICs across nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from solvers.specs import ClusterSpec, ModelSpec, Precision
from solvers.spindle.workload import MetaOp, MetaOpSpec, Mode

BF16_BYTES = _BF16 = 2.0
LINK_LATENCY_S = 20e-6  # NCCL's per-message latency on NVLink / InfiniBand (SpindleOptions.link_latency_us)
_NARROW = 256.0
ACHIEVED_LINK_SHARE = _ACHIEVED = 0.7  # fraction of nominal link bandwidth NCCL collectives reach


def _flops_fwd_per_sample(model: ModelSpec, seq: int, layer: int) -> float:
    """Forward FLOPs of one layer for one sample of ``seq`` tokens (matmuls + attention scores)."""
    h = model.hidden_size
    attn_proj = model.attention_params()
    if model.is_moe_layer(layer):
        assert model.moe is not None
        mlp = model.moe.top_k * model.mlp_params(model.expert_ffn_size) + h * model.moe.num_experts
    else:
        mlp = model.mlp_params()
    width = model.num_attention_heads * model.head_size
    scores = 4.0 * seq * seq * width * (0.5 if model.causal else 1.0)
    return 2.0 * (attn_proj + mlp) * seq + scores


@dataclass(frozen=True)
class DeviceModel:
    peak_flops: float
    memory_bandwidth_Bps: float
    efficiency: float
    kernel_overhead_ms: float


def module_metaop(spec: MetaOpSpec, task: str, dev: DeviceModel) -> MetaOp:
    """Derive a metaop's per-layer slope/intercept, memory and transfer sizes from its module shape."""
    assert spec.module is not None
    shape = spec.module
    model = shape.model_spec()
    seq = shape.seq_length
    layers = range(spec.layer_offset, spec.layer_offset + spec.layers)
    params = sum(model.layer_params(i) for i in layers) / len(layers)
    fwd = sum(_flops_fwd_per_sample(model, seq, i) for i in layers) / len(layers)
    # narrow layers leave tensor cores idle: achieved efficiency grows with the width (h / (h + 256))
    compute_s = 1.0 / (dev.peak_flops * dev.efficiency * model.hidden_size / (model.hidden_size + _NARROW))
    weights_read_s = params * _BF16 / dev.memory_bandwidth_Bps
    kv_per_token = 2.0 * model.kv_heads * model.head_size * _BF16
    mode: Mode = spec.mode
    work = 34.0 * seq * model.hidden_size  # one layer's forward activations (flash attention)
    if mode == "train":
        # backward = 2x forward (+1 forward when recomputing); weights read once forward, twice backward
        slope = (4.0 if spec.recompute else 3.0) * fwd * compute_s
        intercept = 3.0 * weights_read_s + dev.kernel_overhead_ms / 1e3
        act = 2.0 * seq * model.hidden_size if spec.recompute else work
    elif mode == "forward":
        slope = spec.steps * fwd * compute_s
        intercept = spec.steps * (weights_read_s + dev.kernel_overhead_ms / 3e3)
        act = 0.0
        work = 8.0 * seq * model.hidden_size  # nothing kept for a backward
    else:
        tokens = spec.decode_tokens
        ctx = seq + tokens / 2.0  # mean context length while decoding
        per_token = 2.0 * params + 4.0 * ctx * model.num_attention_heads * model.head_size
        kv_read = tokens * ctx * kv_per_token / dev.memory_bandwidth_Bps
        slope = tokens * per_token * compute_s + kv_read
        # each decode step reads the layer's weights once for the whole local batch: poor scaling.
        intercept = tokens * (weights_read_s + dev.kernel_overhead_ms / 3e3)
        act = (seq + tokens) * kv_per_token
        work = 8.0 * model.hidden_size
    return MetaOp(
        name=spec.name, task=task, batch=spec.batch_size, layers=spec.layers,
        slope_ms=slope * 1e3, intercept_ms=intercept * 1e3, mode=mode,
        module=shape.name or spec.name, layer_offset=spec.layer_offset, params_per_layer=params,
        act_bytes_per_sample_layer=act, work_bytes_per_sample=work,
        out_bytes_per_sample=seq * model.hidden_size * _BF16,
    )


def given_time_metaop(spec: MetaOpSpec, task: str, dev: DeviceModel) -> MetaOp:
    """A metaop with a module shape and a given ``time_ms_per_layer`` (e.g. measured on the cluster): the given
    time prices its layers; the shape still sizes its memory, its hand-overs and its gradient sync."""
    assert spec.time_ms_per_layer is not None
    t = spec.time_ms_per_layer
    return replace(module_metaop(spec, task, dev), slope_ms=t.slope_ms_per_sample, intercept_ms=t.intercept_ms,
                   given_time=True)


def explicit_metaop(spec: MetaOpSpec, task: str) -> MetaOp:
    assert spec.time_ms_per_layer is not None
    t = spec.time_ms_per_layer
    return MetaOp(name=spec.name, task=task, batch=spec.batch_size, layers=spec.layers,
                  slope_ms=t.slope_ms_per_sample, intercept_ms=t.intercept_ms, mode=spec.mode, module=spec.name)


def device_model(cluster: ClusterSpec, precision: Precision, efficiency: float, overhead_ms: float) -> DeviceModel:
    return DeviceModel(cluster.gpu.peak_flops(precision), cluster.gpu.memory_bandwidth_GBps * 1e9, efficiency,
                       overhead_ms)


@dataclass(frozen=True)
class Topology:
    """Device numbering is node-major: device d sits in node d // gpus_per_node."""

    num_devices: int
    gpus_per_node: int
    intra_Bps: float  # per GPU, one direction
    inter_Bps_per_gpu: float  # a node's NICs shared by its GPUs
    latency_s: float = LINK_LATENCY_S  # per message (a hand-over; a ring step of an all-reduce)

    @classmethod
    def of(cls, cluster: ClusterSpec, latency_s: float = LINK_LATENCY_S) -> Topology:
        return cls(cluster.num_gpus, cluster.gpus_per_node, cluster.intra_GBps * 1e9, cluster.inter_GBps_per_gpu * 1e9,
                   latency_s)

    def nodes_of(self, lo: int, n: int) -> int:
        return (lo + n - 1) // self.gpus_per_node - lo // self.gpus_per_node + 1

    def bandwidth(self, devices: set[int] | frozenset[int]) -> float:
        nodes = {d // self.gpus_per_node for d in devices}
        return self.intra_Bps if len(nodes) <= 1 else self.inter_Bps_per_gpu


def state_bytes_per_param(mode: Mode, dp: int) -> float:
    if mode == "train":
        return 4.0 + 12.0 / dp
    return _BF16


def state_bytes_per_layer(op: MetaOp, n: int) -> float:
    """Weights, gradients and optimizer states of one layer per device on ``n`` devices (its layout's, where it
    runs one: sharded over tensor / context parallelism and, under ZeRO-3, over data parallelism too)."""
    lay = op.layout(n)
    return lay.state_bytes_per_layer if lay is not None else op.params_per_layer * state_bytes_per_param(op.mode, n)


def slice_memory_bytes(op: MetaOp, layers: int, n: int) -> tuple[float, float, float]:
    """(states, held activations, transient working set) per device of ``layers`` layers on ``n`` devices."""
    lay = op.layout(n)
    if lay is not None:
        return layers * lay.state_bytes_per_layer, layers * lay.act_bytes_per_layer, lay.work_bytes
    local = -(-op.batch // n)
    states = layers * state_bytes_per_layer(op, n)
    return states, layers * local * op.act_bytes_per_sample_layer, local * op.work_bytes_per_sample


def transfer_s(op: MetaOp, src: tuple[int, int], dst: tuple[int, int], topo: Topology) -> float:
    """Hand a metaop's output from one device block (lo, n) to another; zero on the same block.

    Samples stay where they are when their device is in both blocks: only the share of the batch that
    changes device moves (re-sharding n -> m data-parallel devices keeps min(n, m) shares in place when the
    blocks overlap that much)."""
    if src == dst or op.out_bytes_per_sample == 0:
        return 0.0
    shared = max(0, min(src[0] + src[1], dst[0] + dst[1]) - max(src[0], dst[0]))
    moved = 1.0 - shared / max(src[1], dst[1])
    devices = set(range(src[0], src[0] + src[1])) | set(range(dst[0], dst[0] + dst[1]))
    return _handover_s(op, moved, min(src[1], dst[1]), topo.bandwidth(devices), topo.latency_s)


def _handover_s(op: MetaOp, moved: float, links: int, bandwidth_Bps: float, latency_s: float) -> float:
    # every device of the smaller block sends/receives its share in parallel
    size = moved * op.out_bytes_per_sample * op.batch * (2.0 if op.mode == "train" else 1.0)
    return latency_s + size / (links * bandwidth_Bps)


def worst_transfer_s(op: MetaOp, n_src: int, n_dst: int, topo: Topology) -> float:
    """Transfer to a disjoint block (across nodes when the cluster has several): an upper bound for planners
    that cannot see block positions."""
    if op.out_bytes_per_sample == 0:
        return 0.0
    bw = topo.inter_Bps_per_gpu if topo.num_devices > topo.gpus_per_node else topo.intra_Bps
    return _handover_s(op, 1.0, min(n_src, n_dst), bw, topo.latency_s)


def allreduce_s(nbytes: float, devices: frozenset[int], topo: Topology) -> float:
    """Hierarchical all-reduce (NCCL-like): reduce-scatter / all-gather over NVLink inside each node, and
    across nodes each GPU carries 1/g of the data over its share of the node's NICs."""
    per_node: dict[int, int] = {}
    for d in devices:
        per_node[d // topo.gpus_per_node] = per_node.get(d // topo.gpus_per_node, 0) + 1
    return allreduce_by_node_s(nbytes, max(per_node.values(), default=0), len(per_node), topo)


def allreduce_by_node_s(nbytes: float, g: int, k: int, topo: Topology) -> float:
    """All-reduce over k nodes with (at most) g participating GPUs in a node."""
    if g * k <= 1 or nbytes == 0:
        return 0.0
    intra = 2.0 * (g - 1) / g * nbytes / (_ACHIEVED * topo.intra_Bps) if g > 1 else 0.0
    inter = 2.0 * (k - 1) / k * (nbytes / g) / (_ACHIEVED * topo.inter_Bps_per_gpu) if k > 1 else 0.0
    return topo.latency_s * (g + k) + intra + inter
