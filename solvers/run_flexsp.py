"""Whether paraplan's FlexSP runtime (``worker.runtime.flexsp``, ``worker.runtime.flexsp_train``) runs a FlexSP plan
exactly as planned; what it refuses is named by field and reason, never approximated.

The runtime trains a dense model on the ranks of one node, one process per GPU of the plan's cluster; every
micro-batch's groups are disjoint rank blocks of ``sp`` ranks, each sequence of the batch is trained once, and a
group that trains sequences splits the attention heads (query and key/value) over its ``sp`` ranks (Ulysses).
CPU ranks compute in fp32 only. Pure: no torch.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from solvers.documents.flexsp import FlexSPResult
from solvers.errors import FieldProblem, SpecError
from solvers.flexsp.request import FlexSPRequest, parse_request

GroupTuple = tuple[int, int, int, Sequence[int]]  # sp, first rank, last rank, sequences


@dataclass(frozen=True)
class FlexSPRunLayout:
    """What a FlexSP run needs of the nodes that run it."""

    world_size: int
    nodes: int
    vocab_size: int
    gpu_name: str
    peak_memory_gib: float | None

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes


def grouping_problems(micro_batches: Sequence[Sequence[GroupTuple]], sequences: int, world: int, heads: int,
                      kv_heads: int, at: tuple[str | int, ...] = ("micro_batches",)) -> list[FieldProblem]:
    """Why the runtime cannot run this grouping (per micro-batch, its groups) of a batch of ``sequences`` on
    ``world`` ranks (empty: it can); locations under ``at``."""
    problems = []
    seen: list[int] = []
    for m, groups in enumerate(micro_batches):
        used: set[int] = set()
        for q, (sp, first, last, seqs) in enumerate(groups):
            loc = (*at, m, "groups", q)
            if not 0 <= first <= last < world or last - first + 1 != sp:
                problems.append(FieldProblem((*loc, "ranks"), f"ranks [{first}, {last}] are not a block of sp={sp} "
                                                              f"of {world} ranks"))
                continue
            block = set(range(first, last + 1))
            if used & block:
                problems.append(FieldProblem((*loc, "ranks"), f"ranks [{first}, {last}] overlap another group of the "
                                                              "micro-batch"))
            used |= block
            if seqs and (heads % sp or kv_heads % sp):
                problems.append(FieldProblem((*loc, "sp"), f"Ulysses splits heads, and sp={sp} does not divide the "
                                                           f"model's {heads} attention and {kv_heads} key/value heads"))
            seen.extend(seqs)
    if sorted(seen) != list(range(sequences)):
        problems.append(FieldProblem(at, f"the groups do not train each of the batch's {sequences} sequences "
                                         "exactly once"))
    return problems


def is_flexsp_plan(doc: Any) -> bool:
    """Whether a plan document (``{"kind", "request", "result"}``) is a FlexSP plan."""
    return isinstance(doc, dict) and isinstance(doc.get("request"), dict) and "flexsp" in (
        doc.get("kind"), doc["request"].get("kind"))


def load_flexsp_plan(doc: Any) -> tuple[FlexSPRequest, FlexSPResult]:
    """A FlexSP plan document's request and result; SpecError names the bad field."""
    if not isinstance(doc, dict) or not isinstance(doc.get("request"), dict):
        raise SpecError.at(("request",), "a plan needs its request object")
    try:
        request = parse_request(doc["request"])[0]
    except SpecError as err:
        raise err.under("request") from None
    if doc.get("result") is None:
        raise SpecError.at(("result",), "a FlexSP run needs the plan's result (its first step's grouping)")
    try:
        result = FlexSPResult.model_validate(doc["result"])
    except ValueError as err:
        raise SpecError.at(("result",), f"not a FlexSP result: {err}") from None
    return request, result


def check_flexsp_runnable(doc: Any) -> FlexSPRunLayout:
    """The layout of a FlexSP plan document the runtime runs exactly; SpecError (locations inside the plan document)
    where it cannot."""
    request, result = load_flexsp_plan(doc)
    cluster, model = request.cluster, request.model
    problems = []
    if cluster.nodes > 1:
        problems.append(FieldProblem(("request", "cluster", "nodes"),
                                     f"{cluster.nodes} nodes: the FlexSP runtime runs on one node so far"))
    if model.moe is not None:
        problems.append(FieldProblem(("request", "model", "moe"), "the FlexSP runtime trains dense models only"))
    if cluster.gpu.name.lower() == "cpu" and request.precision != "fp32":
        problems.append(FieldProblem(("request", "precision"), f"{request.precision} on CPU ranks: they compute in "
                                                               "fp32 only (set precision to fp32)"))
    grouping = [[(g.sp, g.ranks[0], g.ranks[1], g.sequences) for g in mb.groups] for mb in result.micro_batches]
    problems += grouping_problems(grouping, len(request.batch.sequence_lengths), cluster.num_gpus,
                                  model.num_attention_heads, model.kv_heads, at=("result", "micro_batches"))
    if problems:
        raise SpecError(problems)
    return FlexSPRunLayout(world_size=cluster.num_gpus, nodes=cluster.nodes, vocab_size=model.vocab_size,
                           gpu_name=cluster.gpu.name, peak_memory_gib=result.estimate.peak_memory_gib)
