"""Measured calibration profiles: per-layer forward/backward times and collective times that override the
analytic model's parts where they were measured.

JSON form (what the worker uploads; ``cost_model.profile`` inline or ``cost_model.profile_path``)::

    {"name": "llama2-7b on 8xA100 (worker w-3, 2026-11-30)",
     "gpu": "A100-80GB",
     "gpus_per_node": 8,                   # optional: ranks per node of the launch that timed it
     "inter_node_bandwidth_Gbps": 3200,    # optional: the nodes' network, per node (as the cluster's field)
     "layer_times": [                      # one transformer layer, Megatron TP layout, on its tp ranks
        {"batch": 1, "seq": 2048, "tp": 1, "forward_ms": 11.9, "backward_ms": 24.1},
        {"batch": 4, "seq": 2048, "tp": 1, "forward_ms": 45.0},          # backward defaults to 2x forward
        {"batch": 2, "seq": 2048, "tp": 2, "forward_ms": 12.4, "layer_type": "moe"},
        {"batch": 2, "seq": 2048, "tp": 1, "ep": 4, "forward_ms": 9.8, "layer_type": "moe"}],
     "head_times": [                       # optional: final norm + LM head + loss, vocabulary-parallel over tp
        {"batch": 1, "seq": 2048, "tp": 2, "forward_ms": 3.1, "backward_ms": 5.9}],
     "collectives": [                      # one collective, time per call
        {"op": "allreduce", "group_size": 8, "across_nodes": false, "message_bytes": 67108864, "time_ms": 0.61},
        {"op": "allreduce", "group_size": 8, "across_nodes": false, "message_bytes": 4194304, "time_ms": 0.07},
        {"op": "allreduce", "group_size": 2, "across_nodes": true, "nodes": 2,   # nodes: optional, the nodes the
         "message_bytes": 67108864, "time_ms": 1.9}],                           # group spans, as many ranks on each
     "overheads": [                        # optional: what a parallelism's wrapper adds per layer and micro-batch
        {"parallelism": "fsdp", "reshard": true, "forward_ms": 1.9, "backward_ms": 3.2}],
     "host": {"busy_ranks": 4, "slowdown": 1.9}}   # optional: ranks share the host's cores (CPU "clusters")

Rules: ``batch`` is samples per data-parallel rank; layer times exclude the layer's communication (that
comes from ``collectives``), except exchanges that run inside a layout's own layer: ring attention's K/V
exchanges (``cp`` > 1), DeepSpeed-Ulysses' all-to-alls around attention (``ulysses`` > 1), an MoE layer's
expert-TP exchanges (``tp`` > 1, its experts split over the tp ranks) and, under expert parallelism (``ep`` > 1:
its experts dealt over ep ranks), its token dispatch and combine all-to-alls. Head times are the final norm, LM
head and loss as the runtime runs them, their exchanges included (at tp > 1 the head input's gradient all-reduce and
the vocabulary-parallel loss's all-reduces); where the profile has none for a plan's (seq, tp) the formula prices the
head (named in the estimate's notes when the profile has head times at all). For a (seq, tp, sp, cp, ep,
ulysses, layer type) with two or more batch sizes the time is interpolated between the measured batches and
extended beyond them on the end segments' lines (``interpolated_s``); with one, it scales in proportion to the
batch. Not one line through all the batches: a GPU layer's time is flat while the host issuing its kernels is the
bottleneck, linear above, and not always monotone (vTrain's A100 runs, hidden 2048, a layer and micro-batch at 1,
2, 4, 8 samples: tp 1 3.4, 5.0, 9.1, 16.7 ms; tp 4 3.0, 2.8, 5.0, 7.5 ms, which one line misprices by -11, +20,
-5 %). A measured layer's time holds the host's issue time: the analytic launch floor (``kernel_overhead_s``)
applies only to layouts priced analytically. Collective times per (op, group size, ranks on each node: the group
within one node, or spread over ``nodes``) are interpolated between the measured message sizes the same way; a
point across nodes that does not state ``nodes`` (an older profile's) stands for any layout across nodes that no
point states. Where nothing was measured, the analytic formula stands: for a layer layout, raised to at least
the profile's tp = 1 layer time on the same work split over the layout's tp ranks; a collective (op, group size,
ranks per node) the profile lacks, from the cluster's links. The estimate's notes name both;
``cost_model.kind = "profile"`` requires a profile.

``overheads`` are the wrapper's own cost beyond the plain layer and the collectives it issues: FSDP2's
per-layer hooks, parameter copy-in/copy-out and DTensor bookkeeping. The profiler times one wrapped and one
plain layer on the same ranks and subtracts the collectives' fitted time, so the overhead is a property of
the software stack, not of a plan. ``host`` says that the layer times were taken with ``busy_ranks`` ranks
computing at once and ran ``slowdown`` times slower than one rank alone: where ranks share cores (a CPU host)
a pipeline bubble hands its cores to the busy ranks, so the step is bounded by the node's total work, not by
the contended critical path; GPipe and 1F1B steps are simulated under that processor sharing
(``host_bound_step_s``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from itertools import product
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, model_validator

from solvers.cost_model.pipeline import shared_core_pipeline_s
from solvers.errors import SpecError, shown
from solvers.json_file import read_json_file
from solvers.request import HybridRequest, problems_from_validation
from solvers.specs import MAX_BANDWIDTH, MAX_SEQ_LENGTH, MIN_BANDWIDTH, ModelSpec, StackSpec
from solvers.strategy import Schedule

CollectiveOp = Literal["allreduce", "allgather", "reduce_scatter", "alltoall", "p2p"]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


# A measured time or size beyond these is not a measurement; near the float limit (1e308 ms) it priced every
# plan as infinite, and the planner then blamed the memory limit.
MAX_MS = 1e9  # 11.6 days
MAX_BYTES = 2.0**60
# Nor is a batch below a thousandth of a sample or a message below a byte: two such points (1e-300, 2e-300)
# underflowed the least-squares fit, which raised LinAlgError; one priced a step at inf.
MIN_BATCH = 1e-3
MIN_BYTES = 1.0


class LayerTime(_Strict):
    batch: float = Field(ge=MIN_BATCH, le=2**40)
    seq: int = Field(gt=0, le=MAX_SEQ_LENGTH)
    tp: int = Field(default=1, gt=0)
    forward_ms: float = Field(gt=0, le=MAX_MS)
    backward_ms: float | None = Field(default=None, gt=0, le=MAX_MS)
    layer_type: Literal["dense", "moe"] = "dense"
    sp: bool = False  # Megatron sequence parallelism (sequence-sharded residual, DTensor redistributions)
    # context parallelism: ring attention over cp ranks, each holding batch samples of seq / cp tokens; the time
    # includes the ring's K/V exchanges (its p2p transfers, its per-step kernels and merges)
    cp: int = Field(default=1, gt=0)
    # expert parallelism (an MoE layer): its experts dealt over ep ranks, expert TP = tp; the time includes the
    # token dispatch and combine all-to-alls over the ep group
    ep: int = Field(default=1, gt=0)
    # DeepSpeed-Ulysses over this many ranks (tp = 1, full weights), each holding batch samples of seq / ulysses
    # tokens; the time includes the four all-to-alls each way that trade sequence for heads around attention
    ulysses: int = Field(default=1, gt=0)


class HeadTime(_Strict):
    """The final norm, LM head and loss of one micro-batch, vocabulary-parallel over ``tp`` ranks, as the runtime
    runs them: their exchanges (the head input's gradient all-reduce, the loss's all-reduces) are in the time."""
    batch: float = Field(ge=MIN_BATCH, le=2**40)
    seq: int = Field(gt=0, le=MAX_SEQ_LENGTH)
    tp: int = Field(default=1, gt=0)
    forward_ms: float = Field(gt=0, le=MAX_MS)
    backward_ms: float | None = Field(default=None, gt=0, le=MAX_MS)


class CollectiveTime(_Strict):
    op: CollectiveOp
    group_size: int = Field(gt=1)
    across_nodes: bool = False
    # the nodes the group spans, as many of its ranks on each (the profiler records it; older profiles do not): what
    # a calibration set fitted on the profile prices a collective across nodes as
    nodes: int | None = Field(default=None, gt=0)
    message_bytes: float = Field(ge=MIN_BYTES, le=MAX_BYTES)
    time_ms: float = Field(gt=0, le=MAX_MS)

    @model_validator(mode="after")
    def _placement(self) -> CollectiveTime:
        if self.nodes is not None:
            if (self.nodes > 1) != self.across_nodes:
                raise ValueError(f"nodes {self.nodes} with across_nodes {str(self.across_nodes).lower()}: a group "
                                 "across nodes spans two or more")
            if self.group_size % self.nodes:
                raise ValueError(f"group_size {self.group_size} is not as many ranks on each of its {self.nodes} "
                                 "nodes")
        return self

    @property
    def ranks_per_node(self) -> int | None:
        """The group's ranks on each of its nodes; None where a group across nodes does not state how many."""
        if not self.across_nodes:
            return self.group_size
        return None if self.nodes is None else self.group_size // self.nodes


class LayerOverhead(_Strict):
    parallelism: Literal["fsdp"]
    reshard: bool  # FSDP2 reshard_after_forward (ZeRO-3) or not (ZeRO-1/2)
    forward_ms: float = Field(ge=0, le=MAX_MS)
    backward_ms: float = Field(ge=0, le=MAX_MS)


class HostContention(_Strict):
    busy_ranks: int = Field(gt=0)  # ranks of the node computing at once while the layer times were measured
    slowdown: float = Field(ge=1, le=1e6)  # a layer's time with busy_ranks busy / its time on one rank alone


class Profile(_Strict):
    name: str = "profile"
    gpu: str | None = None
    # the software stack whose layers were timed (the worker's profiler: paraplan's runtime, framework "paraplan");
    # a request on another stack is priced with these times all the same, and its estimate says so
    stack: StackSpec | None = None
    # the model whose layers were timed (``paraplan worker profile --model``): what a calibration set fitted on the
    # profile's layer times prices them as (``solvers.cost_model.fitting.layer_measurements``)
    model: ModelSpec | None = None
    # ranks per node of the launch that timed it: each rank of a node timed its collectives at once, so a collective
    # across nodes had its GPU's share of the node's network (the profiler records it; older profiles do not)
    gpus_per_node: int | None = Field(default=None, gt=0)
    # the network of the nodes that timed its collectives across nodes, per node, all NICs together (the cluster's
    # field of the name, stated by whoever profiled): a calibration set measures the network's efficiency against it,
    # and against the GPU preset's where it is not stated
    inter_node_bandwidth_Gbps: float | None = Field(default=None, ge=MIN_BANDWIDTH, le=MAX_BANDWIDTH)
    layer_times: list[LayerTime] = Field(default_factory=list)
    head_times: list[HeadTime] = Field(default_factory=list)
    collectives: list[CollectiveTime] = Field(default_factory=list)
    overheads: list[LayerOverhead] = Field(default_factory=list)
    host: HostContention | None = None
    # the measured points per layout, sorted and medianed once: an estimate looks each layout up several times and a
    # search or a fit prices thousands of plans on one profile (``_points``)
    _memo: tuple[tuple[int, ...], dict[tuple[Any, ...], Any]] | None = PrivateAttr(default=None)

    def _points(self, key: tuple[Any, ...], find: Callable[[], tuple[np.ndarray, np.ndarray] | None]
                ) -> tuple[np.ndarray, np.ndarray] | None:
        """``find()``, once per ``key``. The memo belongs to the lists it was read from: the model is frozen and
        no code mutates its lists, but a copy made with other lists (``model_copy(update=...)`` shares private
        attributes) starts its own."""
        owner = (id(self.layer_times), id(self.head_times), id(self.collectives))
        if self._memo is None or self._memo[0] != owner:
            self._memo = (owner, {})
        found = self._memo[1]
        if key not in found:
            found[key] = find()
        return found[key]

    def layer_stack_differences(self, stack: StackSpec) -> list[str]:
        """What the profile's stack runs in a layer otherwise than ``stack`` (attention kernel, elementwise kernels,
        TP overlap, with defaults resolved), as "field profile's (this request: stack's)"; empty where it states
        no stack or the two time a layer alike."""
        if self.stack is None:
            return []

        def timed(st: StackSpec) -> dict[str, str]:  # what of a stack a layer's time depends on
            return {"attention": st.attention, "elementwise": st.elementwise_kernels, "tp_comm_overlap": st.tp_overlap}

        mine, theirs = timed(stack), timed(self.stack)
        return [f"{k} {theirs[k]} (this request: {mine[k]})" for k in mine if theirs[k] != mine[k]]

    def head_s(self, batch: float, seq: int, tp: int) -> float | None:
        """Measured forward + backward seconds of the head at ``batch`` samples per data-parallel rank (interpolated
        between the measured batches as layer times are); None where this (seq, tp) was not measured."""
        points = self._points(("head", seq, tp), lambda: median_points(
            (x.batch, (x.forward_ms + (x.backward_ms or 2 * x.forward_ms)) / 1e3)
            for x in self.head_times if x.seq == seq and x.tp == tp))
        return None if points is None else float(interpolated_s(*points, np.array([batch]))[0])

    def fsdp_overhead_s(self, mode: np.ndarray) -> np.ndarray:
        """Forward + backward seconds per layer and micro-batch that FSDP2 adds: ``mode`` 0 = no FSDP,
        2 = without resharding, 3 = resharding after forward. Zero where nothing was measured."""
        mode = np.asarray(mode, dtype=float)
        out = np.zeros(mode.shape)
        for o in self.overheads:
            if o.parallelism == "fsdp":
                out = np.where(mode == (3 if o.reshard else 2), (o.forward_ms + o.backward_ms) / 1e3, out)
        return out

    @property
    def host_bound(self) -> bool:
        """Whether ``host_bound_step_s`` can lower a step: ranks share cores and the layer times show it."""
        return self.host is not None and self.host.slowdown > 1.0

    def host_bound_step_s(self, step_s: float, stage_time_s: Sequence[float], stage_step_time_s: Sequence[float],
                          micro_batches: int, schedule: Schedule | None = None) -> float:
        """The step time where ranks share the host's cores (``host.slowdown`` > 1).

        Per-stage times were measured with every rank busy. Where a schedule leaves ranks idle (bubbles, an
        uneven stage), the busy ones run up to ``slowdown`` times faster. For GPipe and 1F1B (``schedule``) the
        pipelined part is simulated under processor sharing (``pipeline.shared_core_pipeline_s``), then the
        slowest stage's per-step work added; for another schedule, or none given, it is the longer of the critical
        path at uncontended speed and the average rank's work at contended speed (the cores' total work divided
        among the ranks), a bound the simulation never goes below. With no idle rank (pp = 1) both give
        ``step_s`` back."""
        if self.host is None or not self.host_bound or not stage_time_s:  # (the search's hot path: no work sums)
            return step_s
        work = [micro_batches * t + u for t, u in zip(stage_time_s, stage_step_time_s, strict=True)]
        bound = self.host_step_lower_bound(step_s, sum(work) / len(work))
        if len(stage_time_s) < 2 or schedule not in ("gpipe", "1f1b"):
            return bound
        shared = shared_core_pipeline_s(tuple(float(t) for t in stage_time_s), micro_batches, schedule,
                                        self.host.slowdown) + max(stage_step_time_s)
        return max(bound, min(step_s, shared))

    def host_step_lower_bound(self, linear_s: float, mean_work_s: float) -> float:
        """``host_bound_step_s`` from its two inputs, the contention-free pipeline step L (``linear_s``) and the
        stages' mean work W, m t + u (``mean_work_s``): min(L, max(L / slowdown, W)). It grows with L and with W,
        so given lower bounds on them it is a lower bound on the step: the planner's bounds on the linear
        formula then carry over to a contended host."""
        if self.host is None or not self.host_bound:
            return linear_s
        return min(linear_s, max(linear_s / self.host.slowdown, mean_work_s))

    def _layer_points(self, seq: int, tp: int, layer_type: str, backward: bool, sp: bool = False, cp: int = 1,
                      ep: int = 1, ulysses: int = 1) -> tuple[np.ndarray, np.ndarray] | None:
        """The measured (batch, seconds) of this layout, one point per batch (the median where a batch was measured
        more than once), by batch; None where it was not measured."""
        return self._points(("layer", seq, tp, layer_type, backward, sp, cp, ep, ulysses),
                            lambda: self._find_layer_points(seq, tp, layer_type, backward, sp, cp, ep, ulysses))

    def _find_layer_points(self, seq: int, tp: int, layer_type: str, backward: bool, sp: bool, cp: int, ep: int,
                           ulysses: int) -> tuple[np.ndarray, np.ndarray] | None:
        def points(sp: bool) -> list[LayerTime]:
            return [x for x in self.layer_times if x.seq == seq and x.tp == tp and x.layer_type == layer_type
                    and x.sp == sp and x.cp == cp and x.ep == ep and x.ulysses == ulysses]

        # an SP layout without SP measurements falls back on the plain TP layout's
        pts = points(sp) or (points(False) if sp else [])
        if not pts:
            return None

        def seconds(x: LayerTime) -> float:
            return (x.backward_ms if (backward and x.backward_ms) else (2 if backward else 1) * x.forward_ms) / 1e3

        return median_points((x.batch, seconds(x)) for x in pts)

    def layer_s(self, batch: np.ndarray, seq: int, tp: np.ndarray, layer_type: str = "dense",
                backward: bool = False, sp: np.ndarray | None = None, cp: np.ndarray | None = None,
                ep: np.ndarray | None = None, ulysses: np.ndarray | None = None) -> np.ndarray:
        """Measured forward (or backward) seconds per candidate; NaN where this (seq, tp, cp, ep, ulysses) was not
        profiled. ``sp`` marks the candidates running Megatron SP (only meaningful with tp > 1); ``cp`` their
        context parallel degree (default 1; ``batch`` is then samples of seq / cp tokens each); ``ep`` an MoE
        layer's expert-parallel degree (default 1); ``ulysses`` their DeepSpeed-Ulysses degree (default 1; with
        tp = 1, ``batch`` samples of seq / ulysses tokens each)."""
        batch, tp = np.asarray(batch, dtype=float), np.asarray(tp, dtype=float)
        cp_arr, ep_arr, uly_arr = (np.asarray(x if x is not None else 1.0, dtype=float) for x in (cp, ep, ulysses))
        shape = np.broadcast(batch, tp, cp_arr, ep_arr, uly_arr).shape
        sp_arr = np.broadcast_to(np.asarray(sp if sp is not None else False, dtype=bool), shape) & (tp > 1)
        out = np.full(shape, np.nan)
        # the degrees' distinct values, not every candidate, in a Python loop (the search's hot path)
        for t, c, e, u in product(*(np.unique(d) for d in (tp, cp_arr, ep_arr, uly_arr))):
            for s in (False, True):
                points = self._layer_points(seq, int(t), layer_type, backward, s, int(c), int(e), int(u))
                if points is not None:
                    sel = np.broadcast_to((tp == t) & (cp_arr == c) & (ep_arr == e) & (uly_arr == u), shape)
                    out = np.where(sel & (sp_arr == s), interpolated_s(*points, batch), out)
        return out

    def _collective_points(self, op: str, size: int, per_node: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The measured (message bytes, seconds) of this (op, group size, ranks per node), one point per size (the
        median where a size was measured more than once), by size. A point across nodes that does not state its
        nodes (an older profile's: the profiler now states every group's) stands for any layout across
        nodes where none states this one."""
        return self._points(("collective", op, size, per_node),
                            lambda: self._find_collective_points(op, size, per_node))

    def _find_collective_points(self, op: str, size: int, per_node: int) -> tuple[np.ndarray, np.ndarray] | None:
        across = per_node < size
        same = [x for x in self.collectives if x.op == op and x.group_size == size and x.across_nodes == across]
        chosen = [x for x in same if x.ranks_per_node == per_node] or [x for x in same if x.ranks_per_node is None]
        return median_points((x.message_bytes, x.time_ms / 1e3) for x in chosen)

    def collective_s(self, op: CollectiveOp, nbytes: np.ndarray, size: np.ndarray, per_node: np.ndarray
                     ) -> np.ndarray:
        """Measured seconds per call of a group of ``size`` with ``per_node`` of its ranks on each node (``size``
        within one); NaN where this (op, group size, ranks per node) was not profiled."""
        nbytes, size = np.asarray(nbytes, dtype=float), np.asarray(size, dtype=float)
        per_node = np.minimum(np.maximum(np.asarray(per_node, dtype=float), 1.0), size)
        shape = np.broadcast(nbytes, size, per_node).shape
        out = np.full(shape, np.nan)
        pairs = {(int(n), int(k)) for n, k in zip(np.broadcast_to(size, shape).ravel(),
                                                  np.broadcast_to(per_node, shape).ravel(), strict=True)}
        for n, k in pairs:
            points = self._collective_points(op, n, k)
            if points is not None:
                sel = (size == n) & (per_node == k)
                out = np.where(sel, interpolated_s(*points, nbytes), out)
        return out


def median_points(points: Iterable[tuple[float, float]]) -> tuple[np.ndarray, np.ndarray] | None:
    """(sizes ascending, seconds) with one point per size, the median where a size was measured more than once;
    None for no points."""
    by_size: dict[float, list[float]] = {}
    for size, seconds in points:
        by_size.setdefault(size, []).append(seconds)
    if not by_size:
        return None
    xs = np.array(sorted(by_size))
    return xs, np.array([float(np.median(by_size[x])) for x in xs])


def interpolated_s(xs: np.ndarray, ys: np.ndarray, size: np.ndarray) -> np.ndarray:
    """Seconds at ``size`` (a collective's message bytes, a layer's batch) from the measured (sizes ``xs``,
    ascending; seconds ``ys``): between two measured sizes on the line through them, beyond the measured range on the
    nearest end segment's line (its slope at least 0: a noisy pair never makes a larger message cheaper), never below
    0; one measured size scales in proportion to the size.

    Not one least-squares line over all sizes: gloo's small all-reduces are latency-bound (6.2 ms at 16 KiB and at
    256 KiB, 7.0 ms at 2 MiB on 4 CPU ranks) and a line fitted through them and 8-32 MiB put 2 MiB at 8.9 ms and
    16 KiB at 4.1 ms, the TP activation and the vocabulary-parallel loss's exchanges 28 % too slow and 33 % too fast."""
    size = np.asarray(size, dtype=float)
    if len(xs) < 2:
        return np.asarray(ys[0] / xs[0] * size)
    inside = np.interp(size, xs, ys)
    low = ys[0] - max(0.0, (ys[1] - ys[0]) / (xs[1] - xs[0])) * (xs[0] - size)
    high = ys[-1] + max(0.0, (ys[-1] - ys[-2]) / (xs[-1] - xs[-2])) * (size - xs[-1])
    return np.maximum(0.0, np.where(size < xs[0], low, np.where(size > xs[-1], high, inside)))


def load_profile(data: object, loc: tuple[str | int, ...] = ("cost_model", "profile")) -> Profile:
    if not isinstance(data, dict):
        raise SpecError.at(loc, "a profile must be a JSON object")
    try:
        return Profile.model_validate(data)
    except ValidationError as err:
        raise problems_from_validation(err, loc, Profile) from None


def profile_from_request(req: HybridRequest) -> Profile | None:
    """The request's profile (``cost_model.profile`` inline, or ``cost_model.profile_path``), if any."""
    extras = req.cost_model.model_extra or {}
    if extras.get("profile") is not None:
        return load_profile(extras["profile"])
    path = extras.get("profile_path")
    if path is None:
        if req.cost_model.kind == "profile":
            raise SpecError.at(("cost_model", "profile"), "cost_model.kind 'profile' needs a profile or profile_path")
        return None
    loc = ("cost_model", "profile_path")
    if not isinstance(path, str) or not path or "\0" in path:
        raise SpecError.at(loc, f"must be the path of a profile JSON file, got {shown(path)}")
    data = read_json_file(path, loc)
    return load_profile(data, loc)
