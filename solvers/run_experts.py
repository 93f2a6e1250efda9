"""How the runtime lays out a plan's MoE layers, and which expert layouts it cannot run exactly.

Parallel folding (Megatron-Core; ``solvers.cost_model.moe``): an MoE layer's attention keeps the layer's own
``tp x dp`` layout of the ranks of its pipeline stage, and the same ranks are re-read for the experts as
``etp x ep x edp`` (expert TP innermost, then expert parallelism, then expert data parallelism). The runtime
runs that layout per MoE layer with the plan's ``ep``, ``etp`` (``LayerStrategy.expert_tp``) and ``lsh``; dense
layers carry no expert fields. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from solvers.errors import FieldProblem
from solvers.request import HybridRequest
from solvers.strategy import PlanStrategy

STRATEGY = ("result", "strategy")


@dataclass(frozen=True)
class ExpertLayout:
    """One MoE layer's experts: ``ep`` ranks share the experts out, each expert's MLP is split over ``etp``
    ranks, and ``lsh`` compresses the all-to-alls (LSH-MoE, approximate by design)."""

    ep: int = 1
    etp: int = 1
    lsh: bool = False

    def edp(self, layer_ranks: int) -> int:
        """Ranks holding the same expert shard (their gradients are reduced together)."""
        return layer_ranks // (self.ep * self.etp)


def expert_layouts(request: HybridRequest, plan: PlanStrategy, order: Sequence[int] | None = None
                   ) -> tuple[tuple[ExpertLayout | None, ...], list[FieldProblem]]:
    """Per layer of the model, in model order: its expert layout (None for a dense layer), and what the runtime
    cannot run exactly (locations inside the plan document), each MoE layer against its own tp/dp/cp/sp layout.

    ``order``: for each model layer, the index of its strategy in ``plan.layers``
    (``solvers.cost_model.pipeline.model_layer_order``; default the identity). Whether a layer is MoE is a
    property of its place in the model; a problem names the plan's index of the strategy."""
    model, training = request.model, request.training
    moe = model.moe
    problems: list[FieldProblem] = []
    out: list[ExpertLayout | None] = []
    for i, j in enumerate(range(len(plan.layers)) if order is None else order):
        x = plan.layers[j]
        loc = (*STRATEGY, "layers", j)
        if not model.is_moe_layer(i):
            field = "ep" if x.ep > 1 else "etp" if x.etp is not None else "lsh" if x.lsh else None
            if field is not None:
                why = ("the model has no MoE layers" if moe is None else
                       f"layer {i} is dense (moe_layer_frequency={moe.moe_layer_frequency})")
                problems.append(FieldProblem((*loc, field), f"{why}: expert fields need an MoE layer"))
            out.append(None)
            continue
        assert moe is not None
        layout = ExpertLayout(ep=x.ep, etp=x.expert_tp, lsh=x.lsh)
        ranks = x.tp * x.cp * x.dp
        if x.ep < 1 or moe.num_experts % x.ep:
            problems.append(FieldProblem((*loc, "ep"), f"ep={x.ep} must divide the {moe.num_experts} experts"))
        elif layout.etp < 1 or ranks % (x.ep * layout.etp):
            problems.append(FieldProblem((*loc, "ep" if x.ep > 1 else "etp"),
                                         f"ep*etp = {x.ep}*{layout.etp} must divide the layer's tp*cp*dp = {ranks} "
                                         "ranks (parallel folding)"))
        elif model.expert_ffn_size % layout.etp:
            problems.append(FieldProblem((*loc, "etp" if x.etp is not None else "tp"),
                                         f"expert TP {layout.etp} must divide the expert FFN width "
                                         f"{model.expert_ffn_size}"))
        if x.cp > 1:
            problems.append(FieldProblem((*loc, "cp"), f"cp={x.cp} on an MoE layer: the runtime folds a layer's "
                                                       "experts over its tp x dp ranks only (expert parallelism across "
                                                       "cp ranks has no runtime yet)"))
        if x.tp > 1 and x.sp is None:
            # Attention under TP without sequence parallelism leaves every tp rank the same tokens; each routes
            # its 1/tp of a micro-batch's tokens (then the outputs are gathered back), so they must split evenly.
            rows = training.global_batch_size // max(1, x.dp * plan.micro_batches)
            if (rows * training.seq_length) % x.tp:
                problems.append(FieldProblem(("request", "training", "seq_length"),
                                             f"a rank's {rows}x{training.seq_length} tokens of a micro-batch do not "
                                             f"split evenly over tp={x.tp} for the MoE layers' routing"))
        out.append(layout)
    unique = list({(p.loc, p.msg): p for p in problems}.values())  # a request field once, whichever layers
    return tuple(out), unique
