"""Pipeline parallelism with ``torch.distributed.pipelining``: GPipe, 1F1B and interleaved 1F1B.

Stages are cut from the full model torchtitan-style: a rank copies the model once per stage it owns,
deletes the blocks that stage does not run (``layers`` is keyed by global index, so names survive) and
drops the embedding / head when it is not the first / last stage. ``stage_layers`` is the run's layers per
virtual stage in model order (``RunLayout.stage_layers``: the plan's split, interleaved ones cut by
``solvers.cost_model.pipeline.virtual_stage_layers``); with interleaving, rank r owns virtual stages
r, r + pp, r + 2pp, ...
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.distributed import ProcessGroup
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B
from torch.distributed.pipelining.schedules import PipelineScheduleMulti, PipelineScheduleSingle
from torch.distributed.pipelining.stage import _PipelineStageBase

from worker.runtime.model import blocks

Schedule = PipelineScheduleSingle | PipelineScheduleMulti


def stage_ids(pp_rank: int, pp: int, virtual_stages: int) -> list[int]:
    return [pp_rank + v * pp for v in range(virtual_stages)]


def cut_stage(model: nn.Module, stage: int, stage_layers: Sequence[int]) -> nn.Module:
    """The part of ``model`` that pipeline stage ``stage`` runs (a copy when several stages share a rank)."""
    first = sum(stage_layers[:stage])
    keep = {str(i) for i in range(first, first + stage_layers[stage])}
    part = copy.deepcopy(model)
    layers = blocks(part)
    for key in list(layers.keys()):
        if key not in keep:
            del layers[key]
    # Decoder.forward skips the parts set to None.
    if stage > 0:
        setattr(part, "tok_embeddings", None)  # noqa: B010
    if stage < len(stage_layers) - 1:
        setattr(part, "norm", None)  # noqa: B010
        setattr(part, "output", None)  # noqa: B010
    return part


class OneFOneB(Schedule1F1B):
    """torch's 1F1B, also with fewer micro-batches than stages (a plan whose global batch is smaller than pp, or
    whose micro-batches the user fixed): torch refuses that in the constructor only, while its step already
    handles it (each stage's warm-up is min(m, stages - stage) forwards, what the cost model prices)."""

    def __init__(self, stage: _PipelineStageBase, n_microbatches: int,
                 loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
        if n_microbatches >= stage.num_stages:
            super().__init__(stage, n_microbatches=n_microbatches, loss_fn=loss_fn)
        else:  # Schedule1F1B.__init__ is its parent's plus the refusal
            PipelineScheduleSingle.__init__(self, stage, n_microbatches=n_microbatches, loss_fn=loss_fn)


def build_schedule(stages: Sequence[nn.Module], ids: Sequence[int], num_stages: int, group: ProcessGroup,
                   device: torch.device, micro_batches: int, schedule: str,
                   loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> Schedule:
    pipe_stages: list[_PipelineStageBase] = [
        PipelineStage(m, i, num_stages, device, group=group) for m, i in zip(stages, ids, strict=True)
    ]
    if schedule == "interleaved":
        return ScheduleInterleaved1F1B(pipe_stages, n_microbatches=micro_batches, loss_fn=loss_fn)
    if schedule == "gpipe":
        return ScheduleGPipe(pipe_stages[0], n_microbatches=micro_batches, loss_fn=loss_fn)
    assert schedule == "1f1b", schedule  # run_layout refuses any other
    return OneFOneB(pipe_stages[0], micro_batches, loss_fn)
