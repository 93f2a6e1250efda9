"""The analytic cost model: FLOPs through a GEMM efficiency curve, collectives on the right links,
Korthikanti activations, ZeRO states, and the pipeline schedule — all explainable, all vectorised.

Per layer and micro-batch on one GPU (``b`` samples per data-parallel rank, ``s`` tokens, split over cp):
- compute = forward x 3 (backward = 2 forward): the layer's GEMMs through ``GemmEfficiency`` with their
  real per-rank shapes, the attention core as batched GEMMs, memory-bound elementwise kernels
  (``elementwise_traffic`` x the activation bytes, at HBM speed) and a per-kernel-launch overhead;
- recompute = one more forward (full) or the attention core (selective);
- tp_comm = Megatron TP/SP: 2 all-reduces (or reduce-scatter + all-gather pairs) forward and 2 backward
  of the b s h activation on the TP group, the backward ones partly hidden behind the weight-gradient
  GEMMs (``tp_overlap``); Ulysses: 4 all-to-alls each way; a vocabulary-parallel embedding one all-reduce
  forward, the LM head one backward and its cross-entropy three of one fp32 per token forward;
- cp_comm = ring attention's K/V exchange not hidden behind the attention core;
- ep_comm = MoE dispatch/combine all-to-alls over the expert-parallel group (``solvers.cost_model.moe``:
  capacity-capped load imbalance, parallel folding, optional LSH-MoE compression; a profile's measured
  all-to-alls of the group's size where it has them);
- dp_comm_exposed = ZeRO-2/3 traffic per micro-batch not hidden behind compute, and per step the
  gradient sync not hidden behind the last backward;
- optimizer = Adam's HBM traffic on the local shard, once per step.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field

import numpy as np

from solvers.cost_model import communication as comm
from solvers.cost_model import memory as mem
from solvers.cost_model import moe as moe_cost
from solvers.cost_model import pipeline
from solvers.cost_model.aggregate import GIB, evaluate_plan
from solvers.cost_model.base import CostModel, Estimate, LayerCosts, PipelineTraits, StageContext, StageFixed
from solvers.cost_model.calibration import DEFAULT_CALIBRATION, AnalyticCalibration
from solvers.cost_model.elementwise import eager_extra_bytes
from solvers.cost_model.flops import head_forward_flops, model_flops_per_step
from solvers.cost_model.matmul import linear_gemm_flops, matmul_scale
from solvers.cost_model.profile import CollectiveOp, Profile
from solvers.cost_model.shapes import LayerShape, layer_shape
from solvers.cost_model.stack import stack_terms
from solvers.documents.calibration import CalibrationSetUse
from solvers.documents.hybrid import MatmulDoc
from solvers.specs import ClusterSpec, Constraints, ModelSpec, TrainingSpec, memory_limit_bytes, memory_limit_note
from solvers.strategy import EmbeddingStrategy, LayerStrategy, PlanStrategy

_SP_CODE = {None: mem.SP_NONE, "megatron": mem.SP_MEGATRON, "ulysses": mem.SP_ULYSSES}
_RC_CODE = {"none": mem.RC_NONE, "selective": mem.RC_SELECTIVE, "full": mem.RC_FULL}
_CACHE_LIMIT = 4096
_SHARED_LIMIT = 8  # cost models whose layer caches a process keeps (a sizing front's GPU types, a service's requests)


@dataclass
class _Answers:
    """A cost model's answers: layer costs by (shape, candidate set, micro-batch context), its candidate sets, and
    stage fixed terms by (GPUs per stage, micro-batch context, edge, embedding) with their parts."""

    costs: dict[tuple[object, ...], LayerCosts] = field(default_factory=dict)
    token_of: dict[tuple[LayerStrategy, ...], int] = field(default_factory=dict)
    arrays_of: dict[int, Candidates] = field(default_factory=dict)
    by_identity: dict[int, tuple[tuple[LayerStrategy, ...], int, Candidates]] = field(default_factory=dict)
    fixed: dict[tuple[object, ...], StageFixed] = field(default_factory=dict)
    edge_work: dict[tuple[object, ...], tuple[dict[str, float], float]] = field(default_factory=dict)
    edge_states: dict[tuple[object, ...], tuple[dict[str, float], dict[str, float], float]] = field(
        default_factory=dict)

    def bound_layers(self) -> None:
        """Layer costs and candidate sets cleared together where either is full (the costs' keys name the sets)."""
        if len(self.costs) >= _CACHE_LIMIT or len(self.token_of) >= _CACHE_LIMIT:
            for cache in (self.costs, self.token_of, self.arrays_of, self.by_identity):
                cache.clear()

    def bound_stages(self) -> None:
        if len(self.fixed) >= 4 * _CACHE_LIMIT:  # (a few numbers each)
            for cache in (self.fixed, self.edge_work, self.edge_states):
                cache.clear()


# Layer costs and stage fixed terms depend on the GPU type, the node's size and links, the model, the batch and the
# calibration, and on a stage's GPU count, never on the cluster's node count (each group is priced from its own
# degrees and members per node): cost models that differ in nodes only, as a sizing front's sizes do, share their
# answers within a process. Most recently used last.
_SHARED: dict[str, _Answers] = {}


def _shared_answers(key: str | None) -> _Answers:
    if key is None:
        return _Answers()
    hit = _SHARED.pop(key, None) or _Answers()
    _SHARED[key] = hit
    while len(_SHARED) > _SHARED_LIMIT:
        del _SHARED[next(iter(_SHARED))]
    return hit


def zero_traffic_s(zero: np.ndarray | int, allreduce: np.ndarray | float, gather_w: np.ndarray | float,
                   scatter_g: np.ndarray | float) -> tuple[np.ndarray, np.ndarray]:
    """(per micro-batch, per step) data-parallel traffic of a ZeRO level, from the collectives' times over
    the replica group. ZeRO-0: one all-reduce of the accumulated gradients per step; ZeRO-1 (Megatron's
    distributed optimizer): reduce-scatter them, update the local shard, all-gather the new weights (at
    their own width) per step; ZeRO-2 reduce-scatters every micro-batch and gathers per step; ZeRO-3
    gathers for forward and backward and reduce-scatters every micro-batch."""
    per_mb = np.where(zero == 3, 2 * np.asarray(gather_w) + scatter_g, np.where(zero == 2, scatter_g, 0.0))
    per_step = np.where(zero == 0, allreduce,
                        np.where(zero == 1, np.asarray(scatter_g) + gather_w, np.where(zero == 2, gather_w, 0.0)))
    return per_mb, per_step


@dataclass(frozen=True)
class Candidates:
    """Candidate layer strategies as aligned float arrays."""

    tp: np.ndarray
    dp: np.ndarray
    cp: np.ndarray
    sp: np.ndarray
    zero: np.ndarray
    rc: np.ndarray
    ep: np.ndarray
    etp: np.ndarray  # tensor parallelism of the experts (parallel folding)
    lsh: np.ndarray  # LSH-MoE compression of the all-to-alls

    @classmethod
    def of(cls, strategies: Sequence[LayerStrategy]) -> Candidates:
        def col(f: object) -> np.ndarray:
            return np.fromiter((f(x) for x in strategies), dtype=float, count=len(strategies))  # type: ignore[operator]

        return cls(
            tp=col(lambda x: x.tp), dp=col(lambda x: x.dp), cp=col(lambda x: x.cp),
            sp=col(lambda x: _SP_CODE[x.sp]), zero=col(lambda x: x.zero), rc=col(lambda x: _RC_CODE[x.recompute]),
            ep=col(lambda x: x.ep), etp=col(lambda x: x.expert_tp), lsh=col(lambda x: x.lsh),
        )


def _vocabulary_split(emb: EmbeddingStrategy, n_stage: int) -> int:
    """The tensor-parallel ranks the embedding and LM head split the vocabulary over: theirs, at most the stage's
    GPUs (the pricing of both and the profile's head lookup must agree on it)."""
    return max(1, min(emb.tp, n_stage))


class AnalyticCostModel(CostModel):
    """Implements ``solvers.cost_model.base.CostModel`` from first principles plus a few calibrated constants."""

    def __init__(self, model: ModelSpec, cluster: ClusterSpec, training: TrainingSpec,
                 constraints: Constraints | None = None, calibration: AnalyticCalibration = DEFAULT_CALIBRATION,
                 profile: Profile | None = None, calibration_set: CalibrationSetUse | None = None):
        self.model, self.cluster, self.training, self.cal = model, cluster, training, calibration
        self.profile = profile
        self.calibration_set = calibration_set  # where ``calibration`` came from, stated with each estimate
        self.num_layers = model.num_layers
        self.num_gpus = cluster.num_gpus
        self.memory_limit_bytes = memory_limit_bytes(cluster, constraints)
        self.memory_limit_note = memory_limit_note(cluster, constraints)
        self.peak_flops = cluster.gpu.peak_flops(training.precision)
        # Under fp8 only the linear layers' GEMMs run in FP8: Transformer Engine quantises its linear modules (FP8
        # attention is opt-in) and Megatron's output layer is no TE module; torchtitan's float8 converter swaps
        # the blocks' nn.Linear and its configs leave the output layer out. The attention core and the LM head
        # run at the 16-bit peak.
        self.peak_flops_16 = cluster.gpu.peak_flops("bf16") if training.precision == "fp8" else self.peak_flops
        # what the GEMM curve prices against: the peaks scaled by this GPU's measured matmul share (matmul.py)
        self.matmul = matmul_scale(cluster.gpu, training.precision)
        self.gemm_flops = linear_gemm_flops(cluster.gpu, training.precision)
        self.gemm_flops_16 = self.peak_flops_16 * self.matmul.sixteen_bit
        self.hbm_Bps = cluster.gpu.memory_bandwidth_GBps * 1e9 * calibration.hbm_efficiency
        self.links = comm.Links.calibrated(cluster, calibration)
        self.elem_bytes = 4.0 if training.precision == "fp32" else 2.0
        self.state_per_param = mem.state_bytes_per_param(training.precision)
        self.stack = stack_terms(model, training, calibration)
        self.causal_fraction = self.stack.causal_fraction
        # layers differ only by being dense or MoE: cost each distinct shape once
        self._shapes: list[LayerShape] = []
        self._shape_of_layer: list[int] = []
        for i in range(model.num_layers):
            shape = layer_shape(model, i)
            if shape not in self._shapes:
                self._shapes.append(shape)
            self._shape_of_layer.append(self._shapes.index(shape))
        # (op, group size, ranks per node) priced by the formula for want of a profile entry, recorded while
        # ``_priced_noting_misses`` prices a plan (None otherwise)
        self._missed: set[tuple[str, int, int]] | None = None
        # (a profile is one object per request: its models keep their own cache)
        self._answers = _shared_answers(None if profile is not None else "\n".join((
            model.model_dump_json(), cluster.model_dump_json(exclude={"nodes"}), training.model_dump_json(),
            repr(calibration))))

    # --- building blocks --------------------------------------------------------------------------
    def _gemm(self, m: np.ndarray | float, n: np.ndarray | float, k: np.ndarray | float,
              peak_flops: float | None = None) -> np.ndarray:
        return self.cal.gemm.time_s(m, n, k, peak_flops or self.gemm_flops, self.hbm_Bps)

    def _attention_head(self, sq: np.ndarray | float, s: float, d: int) -> np.ndarray:
        """One head's attention core (QK^T and AV) for ``sq`` queries against ``s`` keys, forward, at the 16-bit
        peak: two GEMMs through the efficiency curve, of which a fused causal kernel computes only the unmasked
        fraction.

        Approximation: a fused kernel (FlashAttention, cuDNN) keeps the sq x s scores on chip, yet it is priced
        with the GEMMs' HBM roofline, which counts them as written and read; at long sequences that roofline
        binds (at s = 8192 about twice the tensor-core time). The term stands in for how far fused attention
        kernels fall short of the GEMM curve, which was fitted on A100 GEMMs: with it removed, and nothing in its
        place, the held-out modern tables of ``bench/fidelity.py`` are predicted faster still (bench/data/fidelity/
        README.md)."""
        pair = self._gemm(sq, s, d, self.gemm_flops_16) + self._gemm(sq, d, s, self.gemm_flops_16)
        return self.causal_fraction * pair if self.stack.fused_attention else pair

    def _mlp(self, tokens: np.ndarray, split: np.ndarray, shape: LayerShape) -> np.ndarray:
        h = shape.hidden
        return self._gemm(tokens, shape.mlp_in_width / split, h) + self._gemm(tokens, h, shape.ffn / split)

    def _collective(self, op: CollectiveOp, nbytes: np.ndarray, size: np.ndarray, k: np.ndarray,
                    used: np.ndarray | None = None) -> np.ndarray:
        """A collective's time: measured where the profile has this (op, group, placement), else analytic.
        ``used``: where the caller's price takes this time (it computes every candidate's, then selects), for
        ``_priced_noting_misses``."""
        analytic = comm.collective_s(op, nbytes, size, k, self.links)
        if self.profile is None or not self.profile.collectives:
            return analytic
        per_node = np.minimum(np.maximum(np.asarray(k, dtype=float), 1.0), np.asarray(size, dtype=float))
        measured = self.profile.collective_s(op, nbytes, size, per_node)
        if self._missed is not None:
            miss = ~np.isfinite(measured) & (np.asarray(size) > 1) & (True if used is None else used)
            shape = np.shape(miss)
            self._missed |= {(op, int(n), int(m)) for n, m in zip(np.broadcast_to(size, shape)[miss],
                                                                   np.broadcast_to(per_node, shape)[miss], strict=True)}
        return np.where(np.isfinite(measured) & (np.asarray(size) > 1), measured, analytic)

    def _one_collective(self, op: CollectiveOp, nbytes: float, size: float, k: float) -> float:
        """``_collective`` for one call of one group (the edge layers' terms, outside the vectorised search)."""
        return float(self._collective(op, np.array([nbytes]), np.array([size]), np.array([k]))[0])

    def _measured_layer(self, shape: LayerShape, b: np.ndarray, c: Candidates, fwd: np.ndarray, bwd: np.ndarray
                        ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray,
                                   np.ndarray]:
        """(forward, backward) seconds: profiled where this layout was measured, else the analytic ones (raised to
        ``_unmeasured_floor``), and masks: where a
        ring-attention layer was measured as such (its ring exchanges are then in those times); where a Ulysses
        layer was measured as such (its all-to-alls are then in those times); where an MoE
        layer was measured under TP with its experts split over the same ranks (etp = tp: the expert-TP exchanges
        are then in those times; another etp under TP is not measured); and where an MoE layer was measured under
        its expert parallelism (ep > 1 with etp = tp, uncompressed, the ep x etp ranks within a node: its dispatch /
        combine all-to-alls are then in those times; otherwise the ep = 1 layer is used and the all-to-alls priced
        from ``collectives``); last, where the times came from the profile at all.

        Profiles hold Megatron-TP layers at the full sequence, and may hold ring-attention (cp) layers as the
        runtime runs them. A cp rank's layer without such a measurement does the work of the same layer at
        ``b / cp`` samples (its GEMMs see ``b s / cp`` tokens; its causal ring attention, queries of ``s / cp``
        tokens against all ``s`` keys, does ``b / cp`` samples' attention), and a Ulysses rank's that of the
        tp = 1 layer at ``b / tp`` samples (full weights on ``b s / tp`` tokens, then all ``s`` tokens of
        ``heads / tp`` heads): they are priced from those measurements, without the ring's per-step kernels,
        merges and exchanges (the exchanges are priced apart) or the Ulysses all-to-alls (priced from
        ``collectives``)."""
        none = np.zeros(np.shape(c.tp), dtype=bool)
        if self.profile is None or not self.profile.layer_times:
            return fwd, bwd, none, none, none, none, none
        kind = "moe" if shape.is_moe else "dense"
        seq = self.training.seq_length
        sp = c.sp == mem.SP_MEGATRON
        uly = c.sp == mem.SP_ULYSSES
        tp = np.where(uly, 1, c.tp)
        same_work = b / c.cp / np.where(uly, c.tp, 1)
        f = self.profile.layer_s(same_work, seq, tp, kind, sp=sp)
        bw = self.profile.layer_s(same_work, seq, tp, kind, backward=True, sp=sp)
        expert_tp = expert_parallel = none
        if shape.is_moe:
            other_etp = (tp > 1) & (c.etp != tp)
            f, bw = np.where(other_etp, np.nan, f), np.where(other_etp, np.nan, bw)
            # (a profile's ep layer was timed on one node: an ep x etp group spanning nodes is not what it measured)
            ep_layout = (c.ep > 1) & (c.etp == tp) & (c.lsh == 0) & (c.ep * c.etp <= self.cluster.gpus_per_node)
            if ep_layout.any():
                ep_f = self.profile.layer_s(same_work, seq, tp, kind, sp=sp, ep=c.ep)
                expert_parallel = ep_layout & np.isfinite(ep_f)
                f = np.where(expert_parallel, ep_f, f)
                bw = np.where(expert_parallel,
                              self.profile.layer_s(same_work, seq, tp, kind, backward=True, sp=sp, ep=c.ep), bw)
            expert_tp = (tp > 1) & np.isfinite(f)
        ring = (c.cp > 1) & ~uly
        if ring.any():
            ring_f = self.profile.layer_s(b, seq, tp, kind, sp=sp, cp=c.cp)
            ring = ring & np.isfinite(ring_f)
            f = np.where(ring, ring_f, f)
            bw = np.where(ring, self.profile.layer_s(b, seq, tp, kind, backward=True, sp=sp, cp=c.cp), bw)
        # a Ulysses layer as the runtime runs it, its all-to-alls inside (timed within a node, without cp)
        ulysses = uly & (c.cp == 1) & (c.tp <= self.cluster.gpus_per_node)
        if ulysses.any():
            degree = np.where(ulysses, c.tp, 1)
            uly_f = self.profile.layer_s(b, seq, tp, kind, ulysses=degree)
            ulysses = ulysses & np.isfinite(uly_f)
            f = np.where(ulysses, uly_f, f)
            bw = np.where(ulysses, self.profile.layer_s(b, seq, tp, kind, backward=True, ulysses=degree), bw)
        use = np.isfinite(f)
        if not use.all():
            fwd, bwd = self._unmeasured_floor(same_work, tp, kind, fwd, bwd)
        return (np.where(use, f, fwd), np.where(use, bw, bwd), ring, expert_tp & ~ring, expert_parallel & ~ring,
                ulysses, use)

    def _unmeasured_floor(self, same_work: np.ndarray, tp: np.ndarray, kind: str, fwd: np.ndarray, bwd: np.ndarray
                          ) -> tuple[np.ndarray, np.ndarray]:
        """The analytic times of layouts the profile did not measure, raised to at least the measured tp = 1
        layer's time on the same work split perfectly over the tp ranks (splitting work tp ways never makes it more
        than tp times faster). The analytic formula alone can be far below what the profiled hardware does, and a
        search would then prefer exactly the layout nobody measured. Where the profile has no tp = 1 layer at this
        sequence length either, the analytic times stand (``_unmeasured_layouts_note`` names both)."""
        assert self.profile is not None
        seq = self.training.seq_length
        one = np.ones_like(tp)
        floor_f = self.profile.layer_s(same_work, seq, one, kind) / tp
        floor_b = self.profile.layer_s(same_work, seq, one, kind, backward=True) / tp
        return np.fmax(fwd, floor_f), np.fmax(bwd, floor_b)  # (fmax: the analytic where the floor is NaN)

    def _wrapper_overhead(self, c: Candidates, ctx: StageContext) -> tuple[np.ndarray, np.ndarray]:
        """Host time the FSDP2 wrapper adds per layer: (per micro-batch, per step); profiled, zero without a
        profile. The worker runtime shards a layer with FSDP2 at ZeRO-2/3 over its data-parallel ranks (dp x cp,
        x tp under Ulysses) when there are two or more of them; ZeRO-0/1 layers are not wrapped (their gradients
        are all-reduced in one flat buffer a step). Resharding (ZeRO-3) re-gathers every micro-batch; without it
        the parameters are gathered and the gradients reduce-scattered once a step (the schedule skips both on all
        but the last)."""
        if self.profile is None or not self.profile.overheads:
            return np.zeros_like(c.tp), np.zeros_like(c.tp)
        data_ranks = c.dp * c.cp * np.where(c.sp == mem.SP_ULYSSES, c.tp, 1.0)
        fsdp = (data_ranks > 1) & (c.zero >= 2)
        overhead = self.profile.fsdp_overhead_s(np.where(fsdp, np.where(c.zero >= 3, 3.0, 2.0), 0.0))
        reshard = c.zero >= 3
        return np.where(reshard, overhead, 0.0), np.where(reshard, 0.0, overhead)

    def _hbm(self, nbytes: np.ndarray | float) -> np.ndarray:
        return np.asarray(nbytes, dtype=float) / self.hbm_Bps

    def flops_per_step(self) -> float:
        return model_flops_per_step(self.model, self.training, self.causal_fraction)

    # --- CostModel protocol -----------------------------------------------------------------------
    def _candidate_set(self, candidates: Sequence[LayerStrategy]) -> tuple[int, Candidates]:
        """A small integer naming this candidate set, and its arrays. Tuples are recognised by identity
        (hashing hundreds of strategies per call would cost more than the arithmetic); other sequences,
        which may change in place, by content."""
        cache = self._answers
        if isinstance(candidates, tuple):
            hit = cache.by_identity.get(id(candidates))
            if hit is not None and hit[0] is candidates:
                return hit[1], hit[2]
        key = tuple(candidates)
        token = cache.token_of.get(key)
        if token is None:
            token = cache.token_of[key] = len(cache.token_of)
            cache.arrays_of[token] = Candidates.of(key)
        if isinstance(candidates, tuple):
            cache.by_identity[id(candidates)] = (candidates, token, cache.arrays_of[token])
        return token, cache.arrays_of[token]

    def layer_costs(self, layer: int, candidates: Sequence[LayerStrategy], ctx: StageContext) -> LayerCosts:
        cache = self._answers
        cache.bound_layers()
        token, arrays = self._candidate_set(candidates)
        key = (self._shape_of_layer[layer], token, self.layer_costs_key(ctx))
        hit = cache.costs.get(key)
        if hit is None:
            hit = cache.costs[key] = self._layer_costs(self._shapes[self._shape_of_layer[layer]], arrays, ctx)
        return hit

    def layer_costs_key(self, ctx: StageContext) -> Hashable:
        return (ctx.micro_batch_samples, ctx.micro_batches, ctx.pp > 1)  # (``_layer_costs`` reads the first alone)

    def _layer_costs(self, shape: LayerShape, c: Candidates, ctx: StageContext) -> LayerCosts:
        cal, s, h, e = self.cal, self.training.seq_length, shape.hidden, self.elem_bytes
        gpn = self.cluster.gpus_per_node
        fused = self.stack.fused_attention
        uly = c.sp == mem.SP_ULYSSES
        split = np.where(uly, 1.0, c.tp)  # how the weight matrices are split
        b = ctx.micro_batch_samples / c.dp  # samples per data-parallel rank
        tok = b * s / c.cp / np.where(uly, c.tp, 1.0)  # tokens through this rank's GEMMs

        # forward GEMMs with their per-rank shapes
        qkv = self._gemm(tok, (shape.q_width + 2 * shape.kv_width) / split, h)
        out = self._gemm(tok, h, shape.q_width / split)
        # MoE: each rank routes its sequence-parallel share of the tokens (solvers.cost_model.moe)
        expert = self._moe_terms(shape, c, tok / split) if shape.is_moe else None
        mlp = expert.compute_fwd_s if expert is not None else self._mlp(tok, split, shape)
        heads, sq = shape.heads / c.tp, s / c.cp
        core = b * heads * self._attention_head(sq, s, shape.head_dim)
        kept_none, _ = mem.activation_bytes(shape, s, b, c.tp, c.cp, c.sp, mem.RC_NONE, e, fused)
        kept_sel, _ = mem.activation_bytes(shape, s, b, c.tp, c.cp, c.sp, mem.RC_SELECTIVE, e, fused)
        core_elem = self._hbm(cal.elementwise_traffic * (kept_none - kept_sel))
        elem = self._hbm(cal.elementwise_traffic * kept_sel) + core_elem
        if self.stack.eager_elementwise:  # each elementwise op its own kernel, its operands through HBM
            extra = eager_extra_bytes(shape)
            elem = elem + self._hbm(tok * (extra.replicated / np.where(c.sp == mem.SP_MEGATRON, c.tp, 1.0)
                                           + extra.split / split) * e / 2.0)
        if self.stack.fp8_cast_bytes:  # quantising each GEMM's input (backward: its output gradient) to FP8
            gemm_inputs = tok * (2 * h + (shape.q_width + shape.ffn * shape.top_k) / split)
            elem = elem + self._hbm(self.stack.fp8_cast_bytes * gemm_inputs)
        # backward = twice the forward (input and weight gradients); a fused attention kernel recomputes the scores
        # from Q and K besides (FlashAttention: five matmuls backward to two forward, 2.5 times the forward)
        fwd_s = qkv + out + mlp + core + elem
        bwd_s = 2.0 * fwd_s + (0.5 * core if fused else 0.0)
        fwd, bwd, ring_measured, etp_measured, ep_measured, uly_measured, measured = self._measured_layer(
            shape, np.broadcast_to(b, c.tp.shape), c, fwd_s, bwd_s)
        compute = fwd + bwd

        # tensor / sequence parallel collectives (one direction = forward)
        k_tp = comm.members_per_node(c.tp, 1.0, gpn)
        act = tok * np.where(uly, c.tp, 1.0) * h * e  # the b s h activation of this rank's cp slice
        attention_fwd = self._collective("allreduce", act, c.tp, k_tp, used=~uly)
        # the MLP's all-reduce; an MoE layer's experts instead gather / scatter the routed rows over etp
        # (in the layer time where it was measured so)
        mlp_fwd = np.where(etp_measured, 0.0, expert.etp_fwd_s) if expert is not None else np.where(
            uly, 0.0, attention_fwd)
        ulysses_fwd = np.where(uly_measured, 0.0, self._collective(  # (in the layer time where measured so)
            "alltoall", tok * (2 * shape.q_width + 2 * shape.kv_width) * e, c.tp, k_tp, used=uly & ~uly_measured))
        tp_full = np.where(uly, ulysses_fwd, attention_fwd) + mlp_fwd
        # backward: Megatron issues the input-gradient all-reduce asynchronously and computes the weight
        # gradient meanwhile (a forward's worth of GEMMs), hiding up to tp_overlap of it where the stack does;
        # with userbuffers (tp_comm_overlap "full") the forward collectives hide behind the adjacent GEMMs too
        gemms = qkv + out + mlp
        tp_fwd = np.where(uly, tp_full, np.maximum(0.0, tp_full - self.stack.tp_overlap_forward * gemms))
        tp_bwd = np.where(uly, tp_full, np.maximum(0.0, tp_full - self.stack.tp_overlap_backward * gemms))
        tp_comm = tp_fwd + tp_bwd

        # ring attention: K and V of this rank's heads travel cp - 1 hops forward, K, V, dK, dV backward
        k_cp = comm.members_per_node(c.cp, c.tp, gpn)
        kv = b * sq * 2 * shape.kv_width / c.tp * e
        hop = np.where(k_cp >= c.cp, kv / self.links.intra_Bps, kv / self.links.inter_Bps)
        ring = np.where((c.cp > 1) & ~ring_measured, (c.cp - 1) * hop, 0.0)  # (a measured ring layer has them)
        cp_fwd = np.maximum(0.0, ring - cal.cp_overlap * core)
        cp_comm = cp_fwd + np.maximum(0.0, 2 * ring - cal.cp_overlap * 2 * core)

        # MoE token dispatch and combine (in the layer time where it was measured under its expert parallelism)
        ep_fwd = np.where(ep_measured, 0.0, expert.alltoall_fwd_s) if expert is not None else np.zeros_like(tok)
        ep_comm = 2.0 * ep_fwd

        if self.stack.selective_per_op:  # torchtitan's per-op policy: the even matmuls and every elementwise op
            # and the collectives it does not save: under SP (torchtitan runs TP only so) it keeps the reduce-scatters'
            # outputs and gathers the inputs of k and w3 again, half the layer's TP traffic. Layouts torchtitan does
            # not run are priced by analogy: without SP half of it too, under Ulysses every all-to-all again
            replayed_tp = np.where(c.sp == mem.SP_ULYSSES, 1.0, 0.5) * tp_fwd
            # (an MoE layer's experts are grouped GEMMs it does not save: all of them again)
            mlp_again = mlp if shape.is_moe else mlp / (3.0 if shape.gated else 2.0)
            selective = self._gemm(tok, shape.kv_width / split, h) + out + mlp_again + elem + replayed_tp
        else:  # Megatron's: the attention core
            selective = core + core_elem
        recompute = np.where(c.rc == mem.RC_FULL, fwd + tp_fwd + cp_fwd + ep_fwd,
                             np.where(c.rc == mem.RC_SELECTIVE, selective, 0.0))

        # data parallelism: weights are replicated over dp and cp (each cp rank's gradients cover only its
        # sequence slice, so they are summed over cp too, and ZeRO shards over dp x cp as Megatron's
        # distributed optimizer does), and over the Ulysses group; ranks are ordered tp, cp, dp
        dp_group = c.dp * c.cp * np.where(uly, c.tp, 1.0)
        k_dp = comm.members_per_node(dp_group, np.where(uly, 1.0, c.tp), gpn)
        # (parameters, replica group, its members per node): expert shards replicate over the expert-dp group
        groups: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = [
            ((shape.params - shape.expert_params) / split, dp_group, k_dp)]
        if expert is not None:
            groups.append((expert.expert_params, expert.edp, expert.edp_per_node))
        local_params = np.sum([p for p, _, _ in groups], axis=0)
        weight_bytes = local_params * self.state_per_param.params

        def over_groups(op: CollectiveOp, per_param: float, used: np.ndarray) -> np.ndarray:
            return np.sum([self._collective(op, p * per_param, grp, k, used) for p, grp, k in groups], axis=0)

        # (ZeRO-0 all-reduces the gradients; ZeRO-1/2/3 reduce-scatter them and all-gather the weights)
        sync = over_groups("allreduce", cal.grad_comm_bytes, c.zero == 0)
        gather_w = over_groups("allgather", self.state_per_param.params, c.zero > 0)
        scatter_g = over_groups("reduce_scatter", cal.grad_comm_bytes, c.zero > 0)
        per_mb, per_step = zero_traffic_s(c.zero, sync, gather_w, scatter_g)
        dp_mb = np.maximum(0.0, per_mb - cal.zero_overlap * (compute + recompute))
        dp_step = np.maximum(0.0, per_step - self.stack.dp_overlap * (bwd + recompute))
        opt_params = np.sum([p / np.where(c.zero >= 1, grp, 1.0) for p, grp, _ in groups], axis=0)
        optimizer = self._hbm(opt_params * cal.optimizer_traffic_bytes)

        gpu = compute + recompute + tp_comm + cp_comm + ep_comm + dp_mb
        # the host issues ~a forward's worth of kernels per pass; small layers wait for it, not for the GPU. A
        # measured layer's time already holds its host's issue time (the profiler times it as it runs)
        passes = 3.0 + (c.rc == mem.RC_FULL)
        wrapper_mb, wrapper_step = self._wrapper_overhead(c, ctx)
        launch = np.where(measured, 0.0, np.maximum(0.0, cal.kernel_overhead_s * passes - gpu)) + wrapper_mb
        time = gpu + launch
        states = [mem.model_state_bytes(p, grp, c.zero, self.state_per_param) for p, grp, _ in groups]
        w, g, o = (np.sum([x[i] for x in states], axis=0) for i in range(3))
        kept, transient = mem.activation_bytes(shape, s, b, c.tp, c.cp, c.sp, c.rc, e, fused,
                                               per_op=self.stack.selective_per_op, eager=self.stack.eager_elementwise)
        if expert is not None:
            kept = kept + expert.extra_activation_bytes
            if self.stack.selective_per_op:  # its save list names all_to_all_single: dispatch and combine kept
                kept = kept + np.where(c.rc == mem.RC_SELECTIVE, 2.0 * expert.alltoall_bytes, 0.0)
        frag = 1.0 + cal.fragmentation
        gathered = np.where(c.zero == 3, 2.0 * weight_bytes, 0.0)  # this layer's weights and the prefetched next
        # a layout whose (expert) TP does not divide the FFN width runs on no framework (the validator names it):
        # no plan of the search may take it, though an MoE model's dense layers share its candidate list
        unsplit = np.mod(shape.ffn, c.etp if shape.is_moe else split) != 0
        if unsplit.any():
            time, w = np.where(unsplit, np.inf, time), np.where(unsplit, np.inf, w)
        return LayerCosts(
            time_s=time,
            step_time_s=dp_step + optimizer + wrapper_step,
            state_bytes=w + g + o,
            activation_bytes=kept * frag,
            peak_extra_bytes=transient * frag + gathered,
            parts_s={"compute": compute, "recompute": recompute, "tp_comm": tp_comm, "cp_comm": cp_comm,
                     "ep_comm": ep_comm, "dp_comm_exposed": dp_mb, "launch_overhead": launch},
            step_parts_s={"dp_comm_exposed": dp_step, "optimizer": optimizer, "launch_overhead": wrapper_step},
            memory_parts_bytes={"parameters": w, "gradients": g, "optimizer": o},
        )

    def _moe_terms(self, shape: LayerShape, c: Candidates, tokens: np.ndarray) -> moe_cost.MoETerms:
        assert self.model.moe is not None
        dims = moe_cost.MoEDims(shape.hidden, shape.ffn, shape.gated, shape.num_experts, shape.top_k,
                                self.model.moe.capacity_factor)
        # the dispatch / combine all-to-alls as measured where the profile has them (as Ulysses' are)
        return moe_cost.layer_terms(self._gemm, self._hbm, self.links, dims, shape.expert_params, tokens,
                                    c.tp * c.cp * c.dp, c.ep, c.etp, c.lsh, self.elem_bytes,
                                    lambda nbytes, size, k: self._collective("alltoall", nbytes, size, k))

    def transition_s(self, prev: Sequence[LayerStrategy], nxt: Sequence[LayerStrategy], ctx: StageContext
                     ) -> np.ndarray:
        """Re-laying out the activation between differently split layers: an all-to-all over the stage each way,
        of the larger of the two layouts' shares of the micro-batch's activation, at the profile's measured
        all-to-all where it has one for the stage's ranks (as the MoE and Ulysses all-to-alls), else analytic."""
        n_stage = self.num_gpus // ctx.pp
        total = ctx.micro_batch_samples * self.training.seq_length * self.model.hidden_size * self.elem_bytes

        def held(x: LayerStrategy) -> float:
            return total / (x.dp * x.cp * (x.tp if x.sp is not None else 1))

        def layout(x: LayerStrategy) -> tuple[int, int, int, object]:
            return (x.tp, x.dp, x.cp, x.sp)

        k = min(n_stage, self.cluster.gpus_per_node)
        # vectorised over all pairs (MoE expert layouts multiply the candidates)
        ids = {x: i for i, x in enumerate(dict.fromkeys(layout(x) for x in (*prev, *nxt)))}
        la = np.array([ids[layout(x)] for x in prev])
        lb = np.array([ids[layout(x)] for x in nxt])
        ha = np.array([held(x) for x in prev], dtype=float)
        hb = np.array([held(x) for x in nxt], dtype=float)
        shape = (len(ha), len(hb))
        differ = la[:, None] != lb[None, :]
        moved = 2.0 * self._collective("alltoall", np.maximum(ha[:, None], hb[None, :]), np.full(shape, n_stage),
                                       np.full(shape, k), used=differ)
        return np.where(differ, moved, 0.0).reshape(len(prev), len(nxt))

    def _embedding(self, ctx: StageContext) -> EmbeddingStrategy:
        return ctx.embedding if ctx.embedding is not None else EmbeddingStrategy()

    def stage_fixed(self, ctx: StageContext) -> StageFixed:
        """Embedding (first stage), final norm + LM head + loss (last stage), pipeline p2p, reserves.

        Cached by what it reads: a middle stage's terms do not depend on its index, schedule or the
        embedding, nor a stage's on the pipeline's depth beyond its GPU count (the searches ask for every stage
        of hundreds of pipeline configurations, a sizing front's sizes for the same stages at other depths)."""
        first, last = ctx.stage == 0, ctx.stage == ctx.pp - 1
        key = (self.num_gpus // ctx.pp, ctx.pp > 1, ctx.micro_batch_samples, ctx.virtual_stages, first, last,
               self._embedding(ctx) if first or last else None)
        cache = self._answers
        hit = cache.fixed.get(key)
        if hit is None:
            cache.bound_stages()
            hit = cache.fixed[key] = self._stage_fixed(ctx)
        return hit

    def _edge_terms(self, n_stage: int, micro_batch_samples: float, first: bool, last: bool, pipelined: bool,
                    emb: EmbeddingStrategy) -> tuple[dict[str, float], dict[str, float], dict[str, float], float]:
        """The first stage's embedding and the last stage's head: (time parts, step parts, state bytes by
        part, activation bytes), from the work per micro-batch and the weights' state, each cached apart."""
        parts, act = self._edge_activity(n_stage, micro_batch_samples, first, last, _vocabulary_split(emb, n_stage))
        step_parts, mparts, per_mb = self._edge_state(n_stage, first, last, pipelined, emb)
        parts = dict(parts)
        if per_mb:  # ZeRO-2/3 traffic every micro-batch, partly hidden behind the edge layers' compute
            parts["dp_comm_exposed"] = max(0.0, per_mb - self.cal.zero_overlap * parts.get("compute", 0.0))
        return parts, step_parts, mparts, act

    def _edge_activity(self, n_stage: int, micro_batch_samples: float, first: bool, last: bool, tp_e: int
                       ) -> tuple[dict[str, float], float]:
        """The edge layers' work per micro-batch: (time parts, activation bytes). Depends on the tokens and the
        vocabulary split, not on the ZeRO level (cached apart from the state, which does not see the tokens)."""
        key = (n_stage, micro_batch_samples, first, last, tp_e)
        hit = self._answers.edge_work.get(key)
        if hit is not None:
            return hit
        cal, s, h, e = self.cal, self.training.seq_length, self.model.hidden_size, self.elem_bytes
        V = self.model.vocab_size
        dp_e = max(1, n_stage // tp_e)  # the vocabulary-parallel embedding spans the whole stage
        tokens = micro_batch_samples * s / dp_e
        k_tp = float(comm.members_per_node(tp_e, 1, self.cluster.gpus_per_node))
        parts: dict[str, float] = {}
        act = 0.0

        def allreduce(nbytes: float) -> float:  # on the vocabulary-parallel group, priced as the layers' are
            return self._one_collective("allreduce", nbytes, tp_e, k_tp)

        if first and V:
            lookup = float(self._hbm(3.0 * tokens * h * e))  # gather rows, write, scatter-add gradient
            parts["compute"] = lookup
            # the shards' partial rows summed forward (under SP a reduce-scatter, half that ring traffic: priced as
            # the all-reduce, an upper bound)
            parts["tp_comm"] = allreduce(tokens * h * e) if tp_e > 1 else 0.0
            # the embedding output, and its dropout mask where the model has hidden dropout
            act += tokens * h * (e + (1 if self.model.hidden_dropout > 0 else 0))
        if last and V:
            measured = self.profile.head_s(tokens / s, s, tp_e) if self.profile is not None else None
            if measured is not None:  # as the runtime ran it, its exchanges included
                parts["compute"] = parts.get("compute", 0.0) + measured
            else:
                logits = float(self._gemm(tokens, V / tp_e, h, self.gemm_flops_16))
                head = 3.0 * logits + float(self._hbm(cal.elementwise_traffic * tokens * V / tp_e * 4.0))
                parts["compute"] = parts.get("compute", 0.0) + head
                if tp_e > 1:
                    # Megatron's vocabulary-parallel head, as the runtime runs it too: the replicated head input's
                    # gradient all-reduced backward (under SP an all-gather forward and a reduce-scatter backward, the
                    # same ring traffic) and the cross-entropy's three all-reduces of one fp32 per token forward (the
                    # max logit, the sum of exponentials, the target's logit), latency-bound where links are slow
                    parts["tp_comm"] = (parts.get("tp_comm", 0.0) + allreduce(tokens * h * e)
                                        + 3 * allreduce(tokens * 4.0))
            act += tokens * V / tp_e * (4.0 + e) + tokens * h * e  # fp32 softmax, logits, final-norm input
        hit = self._answers.edge_work[key] = (parts, act)
        return hit

    def _edge_state(self, n_stage: int, first: bool, last: bool, pipelined: bool, emb: EmbeddingStrategy
                    ) -> tuple[dict[str, float], dict[str, float], float]:
        """The edge layers' weights under ``emb``: (per-step time parts, state bytes by part, ZeRO traffic per
        micro-batch). Independent of the micro-batch (cached apart from the work, which depends on it)."""
        key = (n_stage, first, last, pipelined, emb)
        hit = self._answers.edge_states.get(key)
        if hit is not None:
            return hit
        cal, h, V = self.cal, self.model.hidden_size, self.model.vocab_size
        tp_e = _vocabulary_split(emb, n_stage)
        dp_e = max(1, n_stage // tp_e)
        copies = int(bool(first and V)) + int(bool(last and V and (pipelined or not self.model.tied_embeddings)))
        step_parts: dict[str, float] = {}
        mparts: dict[str, float] = {}
        per_mb = 0.0
        if V and copies:
            params = copies * V * h / tp_e
            w, g, o = (float(x) for x in mem.model_state_bytes(params, dp_e, emb.zero, self.state_per_param))
            mparts.update({"parameters": w, "gradients": g, "optimizer": o})
            # the layers' ZeRO rule; only the collectives this level uses are costed
            k_dp = float(comm.members_per_node(dp_e, tp_e, self.cluster.gpus_per_node))

            def collective(op: CollectiveOp, per_param: float) -> float:
                return self._one_collective(op, params * per_param, dp_e, k_dp)

            zero = emb.zero
            allreduce = collective("allreduce", cal.grad_comm_bytes) if zero == 0 else 0.0
            gather_w = collective("allgather", self.state_per_param.params) if zero else 0.0
            scatter_g = collective("reduce_scatter", cal.grad_comm_bytes) if zero else 0.0
            per_mb, per_step = (float(x) for x in zero_traffic_s(zero, allreduce, gather_w, scatter_g))
            if zero == 3:  # gathered for forward and backward, held while they run
                mparts["gathered"] = params * self.state_per_param.params - w
            sync = per_step * (1.0 - self.stack.dp_overlap)
            if self.model.tied_embeddings and pipelined:
                # the first and last stages sum the shared embedding's gradients after the data-parallel sync has
                # finished (Megatron's finalize_model_grads), so nothing hides it; the two stages share a node only
                # where the whole job does
                pair_k = 2.0 if self.num_gpus <= self.cluster.gpus_per_node else 1.0
                sync += self._one_collective("allreduce", V * h / tp_e * cal.grad_comm_bytes, 2, pair_k)
            step_parts["dp_comm_exposed"] = sync
            shard = params / (dp_e if emb.zero >= 1 else 1)
            step_parts["optimizer"] = float(self._hbm(shard * cal.optimizer_traffic_bytes))
        hit = self._answers.edge_states[key] = (step_parts, mparts, per_mb)
        return hit

    def _stage_fixed(self, ctx: StageContext) -> StageFixed:
        cal, s, h, e = self.cal, self.training.seq_length, self.model.hidden_size, self.elem_bytes
        n_stage = self.num_gpus // ctx.pp
        first, last = ctx.stage == 0, ctx.stage == ctx.pp - 1
        edge = self._edge_terms(n_stage, ctx.micro_batch_samples, first, last, ctx.pp > 1, self._embedding(ctx))
        parts, step_parts, mparts = (dict(x) for x in edge[:3])
        act = edge[3]
        if ctx.pp > 1:
            # activations forward and gradients backward at each chunk boundary, scattered over the stage's GPUs
            sends = 2 * ctx.virtual_stages - (1 if first else 0) - (1 if last else 0)
            msg = ctx.micro_batch_samples * s * h * e / n_stage
            across = n_stage >= self.cluster.gpus_per_node
            parts["pp_comm"] = sends * float(comm.p2p_s(msg, across, self.links))
        if cal.microbatch_overhead_s:
            parts["other"] = cal.microbatch_overhead_s
        if cal.step_overhead_s:
            step_parts["other"] = cal.step_overhead_s
        state = sum(mparts.values())
        # (the CUDA context and cuBLAS/NCCL workspaces: a CPU host has none; it showed +320% on a CPU run's memory)
        reserve = 0.0 if self.cluster.gpu.is_cpu else cal.reserve_gib * GIB
        mparts["reserve"] = reserve
        return StageFixed(
            time_s=sum(parts.values()),
            step_time_s=sum(step_parts.values()),
            state_bytes=state,
            activation_bytes=act * (1.0 + cal.fragmentation),
            other_bytes=reserve,
            parts_s=parts,
            step_parts_s=step_parts,
            memory_parts_bytes=mparts,
        )

    def in_flight_micro_batches(self, ctx: StageContext) -> float:
        return pipeline.in_flight_micro_batches(ctx.schedule, ctx.pp, ctx.stage, ctx.micro_batches, ctx.virtual_stages)

    @property
    def linear_pipeline(self) -> bool:
        """Whether ``pipeline_step_time`` is exactly ``pipeline.step_time_s`` (no measured host bound on top).
        Measured layer and collective times keep it so; only a host contention bound does not."""
        return self.profile is None or not self.profile.host_bound

    @property
    def pipeline_traits(self) -> PipelineTraits:
        """The linear formula, or (a host contention bound on top) one that grows with the linear formula's step
        and the stages' mean work: bounded by the linear one either way (``step_bound_from_linear``)."""
        return PipelineTraits(linear=self.linear_pipeline, bounded_by_linear=True)

    def step_bound_from_linear(self, linear_s: float, mean_work_s: float) -> float:
        """A lower bound on ``pipeline_step_time`` from one on the linear formula's step and one on the stages'
        mean work per step (Σ_s (m t_s + u_s) / p)."""
        if self.profile is None:
            return linear_s
        return self.profile.host_step_lower_bound(linear_s, mean_work_s)

    def pipeline_step_time(self, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                           ctx: StageContext) -> float:
        step = pipeline.step_time_s(stage_time_s, stage_step_time_s, ctx.micro_batches, ctx.virtual_stages,
                                    ctx.schedule)
        if self.profile is None:
            return step
        return self.profile.host_bound_step_s(step, stage_time_s, stage_step_time_s, ctx.micro_batches,
                                              None if ctx.virtual_stages > 1 else ctx.schedule)

    def head_flops(self) -> float:
        return head_forward_flops(self.model, self.training.seq_length)

    def evaluate(self, plan: PlanStrategy) -> Estimate:
        est, missed = self._priced_noting_misses(plan)
        est.stack = self.training.priced_stack()
        est.matmul = [self.matmul_doc()]
        if self.calibration_set is not None:
            est.calibration_set = self.calibration_set
        for note in (self.memory_limit_note, moe_cost.approximate_note(plan.layers),
                     self._unfused_attention_note(plan), self._unfused_context_parallel_note(plan),
                     self._profile_stack_note(), self._unmeasured_layouts_note(plan), self._unmeasured_head_note(plan),
                     self._unmeasured_collectives_note(missed)):
            if note:
                est.notes.append(note)
        return est

    def matmul_doc(self) -> MatmulDoc:
        m = self.matmul
        return MatmulDoc(gpu=self.cluster.gpu.name, precision=self.training.precision, share_of_peak=m.linear_share,
                         share_of_peak_16bit=m.sixteen_bit_share, scale=m.linear, measured=m.measured, note=m.note)

    def _profile_stack_note(self) -> str | None:
        """Under a profile that states the stack it timed, where that stack runs a layer otherwise than the
        request's (the worker's profiler times paraplan's runtime: eager elementwise ops, no TP overlap): the
        measured layers keep the times of the stack that ran them, which the estimate must not pass off as the
        request's stack."""
        if self.profile is None or self.profile.stack is None or not self.profile.layer_times:
            return None
        differ = self.profile.layer_stack_differences(self.training.stack)
        if not differ:
            return None
        return (f"the profile's layers were timed on another stack (framework {self.profile.stack.framework}: "
                f"{', '.join(differ)}): its measured layers are priced as that stack ran them, not as this request's "
                f"would run them; ask for the profile's stack (training.stack.framework = "
                f"\"{self.profile.stack.framework}\") "
                "or profile the stack you will run")

    def _unmeasured_layouts_note(self, plan: PlanStrategy) -> str | None:
        """Under a profile, the plan's layer layouts it has no times for: priced analytically (at least the measured
        tp = 1 layer's time split over their ranks, ``_unmeasured_floor``), which the estimate must not pass off
        as measured."""
        if self.profile is None or not self.profile.layer_times:
            return None
        floored: list[str] = []
        bare: list[str] = []
        seq = self.training.seq_length
        # whether the profile holds a tp 1 layer of the kind at this sequence length (the floor's source)
        has_floor = {kind: bool(np.isfinite(self.profile.layer_s(np.ones(1), seq, np.ones(1), kind))[0])
                     for kind in ("dense", "moe")}
        for i, x in sorted({(self._shape_of_layer[j], x) for j, x in enumerate(plan.layers)},
                           key=lambda k: (k[0], str(k[1]))):
            shape, c = self._shapes[i], Candidates.of([x])
            zero = np.zeros(1)
            if self._measured_layer(shape, np.ones(1), c, zero, zero)[-1][0]:
                continue
            kind = "moe" if shape.is_moe else "dense"
            label = (f"{kind} tp {x.tp}" + (f" sp {x.sp}" if x.sp else "") + (f" cp {x.cp}" if x.cp > 1 else "")
                     + (f" ep {x.ep}" if shape.is_moe and x.ep > 1 else ""))
            (floored if has_floor[kind] else bare).append(label)
        if not floored and not bare:
            return None
        parts = []
        if floored:
            parts.append(f"{', '.join(dict.fromkeys(floored))}: the analytic time, at least the profile's tp 1 layer "
                         f"split over the tp ranks")
        if bare:
            parts.append(f"{', '.join(dict.fromkeys(bare))}: the analytic time alone (no tp 1 layer at seq {seq} "
                         f"in the profile either)")
        return "layer layouts the profile did not measure, estimated: " + "; ".join(parts)

    def _unmeasured_head_note(self, plan: PlanStrategy) -> str | None:
        """Under a profile with head times, a head layout it lacks (the formula prices it)."""
        if self.profile is None or not self.profile.head_times or not self.model.vocab_size:
            return None
        tp = _vocabulary_split(plan.embedding, self.num_gpus // plan.pp)
        seq = self.training.seq_length
        if self.profile.head_s(1.0, seq, tp) is not None:
            return None
        return f"the LM head the profile did not measure (tp {tp} at seq {seq}): estimated by the formula"

    def _priced_noting_misses(self, plan: PlanStrategy) -> tuple[Estimate, list[tuple[str, int, int]]]:
        """The plan's estimate, and under a profile with collectives those it issues that the profile has no times
        for (op, group size, its ranks on each node), which the formula priced. To find them the plan is priced
        with fresh caches (the search's cached answers would not call ``_collective`` again) while ``_collective``
        notes its misses: one evaluation either way."""
        def priced() -> Estimate:
            return evaluate_plan(self, plan, global_batch_size=self.training.global_batch_size,
                                 seq_length=self.training.seq_length, model_flops_per_step=self.flops_per_step(),
                                 peak_flops_per_gpu=self.peak_flops)

        if self.profile is None or not self.profile.collectives:
            return priced(), []
        saved, self._answers, self._missed = self._answers, _Answers(), set()
        try:
            return priced(), sorted(self._missed)
        finally:
            self._answers, self._missed = saved, None

    @staticmethod
    def _unmeasured_collectives_note(missed: list[tuple[str, int, int]]) -> str | None:
        """The collectives ``_priced_noting_misses`` found priced by the formula, named."""
        if not missed:
            return None
        names = {"allreduce": "all-reduce", "allgather": "all-gather", "reduce_scatter": "reduce-scatter",
                 "alltoall": "all-to-all"}
        return ("collectives the profile did not measure, estimated by the formula from the cluster's links: "
                + ", ".join(f"{names.get(op, op)} over {n} GPUs"
                            + (f" across nodes ({k} on each)" if k < n else "") for op, n, k in missed))

    def _unfused_context_parallel_note(self, plan: PlanStrategy) -> str | None:
        """Context parallelism as shipped (Megatron-LM through Transformer Engine, torchtitan through SDPA) runs
        ring attention on fused kernels only; priced with unfused blocks, a plan that uses it should say so."""
        if self.stack.fused_attention or all(x.cp == 1 for x in plan.layers):
            return None
        return ("context parallelism priced with unfused attention blocks (training.stack.attention = \"unfused\"); "
                "Megatron-LM (Transformer Engine) and torchtitan run ring attention on fused kernels only")

    def _unfused_attention_note(self, plan: PlanStrategy) -> str | None:
        """Say so where the unfused attention's s² tensors are much of what a layer keeps: fused kernels
        (FlashAttention, cuDNN) keep none of them and skip the masked half of causal scores, and a plan for a
        stack that uses them is asked with ``training.stack.attention = "fused"`` (the default)."""
        if self.stack.fused_attention:
            return None
        s, e = self.training.seq_length, self.elem_bytes
        mbs = self.training.global_batch_size / plan.micro_batches
        worst_core, worst_share = 0.0, 0.0
        for shape_id, x in dict.fromkeys(zip(self._shape_of_layer, plan.layers, strict=True)):
            args = (self._shapes[shape_id], s, mbs / x.dp, x.tp, x.cp, _SP_CODE[x.sp], _RC_CODE[x.recompute], e)
            kept = float(mem.activation_bytes(*args, flash=False)[0])
            core = kept - float(mem.activation_bytes(*args, flash=True)[0])
            if kept > 0 and core > worst_core:
                worst_core, worst_share = core, core / kept
        if worst_share < 0.25:
            return None
        return (f"unfused attention (training.stack.attention = \"unfused\"): the attention scores "
                f"keep {worst_core / GIB:.2f} GiB per layer and micro-batch, {worst_share:.0%} of what such a layer "
                f"keeps; fused attention (FlashAttention) keeps none of them and computes only the unmasked half "
                f"of causal scores")
