"""Training checkpoints: model and optimizer with ``torch.distributed.checkpoint`` (each rank writes its shards),
each rank's RNG state, and the run's position (steps done, which is also the data position: a step's batch is a
function of its index) with the loss curve so far.

Layout under the run's checkpoint directory (shared storage when a run spans nodes)::

    step-00000010/        one checkpoint, after 10 steps
        *.distcp, .metadata   torch.distributed.checkpoint's files
        rng-<rank>.pt         torch's RNG state of each rank
        state.json            {"step": 10, "losses": [...]}   (rank 0)
        COMPLETE              written last, after every rank has finished: only such a checkpoint is resumed

A retried attempt resumes from the newest complete checkpoint; one torn by a crash (no ``COMPLETE``) is ignored.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

MARKER = "COMPLETE"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Resumed:
    step: int  # steps already done: the next step to run
    losses: list[float]  # of those steps


def step_dir(root: Path, step: int) -> Path:
    return root / f"step-{step:08d}"


def newest_complete(root: Path) -> Path | None:
    """The checkpoint with the most steps whose marker exists, or None."""
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := _STEP_DIR.match(p.name)) and (p / MARKER).is_file()]
    return max(found)[1] if found else None


# The optimizer's state keyed by parameter name, its hyperparameters too: unflattened, ``param_groups`` is a list whose
# entry 0 has the same key on every rank but lists each pipeline stage's own parameters, and the checkpoint keeps
# one rank's copy of such a key; a resumed pipeline then lost its learning rate and betas (KeyError 'betas').
_OPTIONS = StateDictOptions(flatten_optimizer_state_dict=True)


def _state(modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> tuple[nn.Module, dict[str, object]]:
    # One module over this rank's stages: parameter names carry global layer indices, so no two ranks' differ only
    # by position, and replicated parameters (data parallelism) share their name as they should.
    holder = nn.ModuleList(modules)
    model_sd, optim_sd = get_state_dict(holder, optimizer, options=_OPTIONS)
    return holder, {"model": model_sd, "optimizer": optim_sd}


def save(root: Path, step: int, modules: list[nn.Module], optimizer: torch.optim.Optimizer,
         losses: list[float]) -> Path:
    """Collective: every rank writes its part of the checkpoint after ``step`` steps; rank 0 marks it complete
    once all have."""
    target = step_dir(root, step)
    _, state = _state(modules, optimizer)
    dcp.save(state, checkpoint_id=str(target))
    torch.save(torch.get_rng_state(), target / f"rng-{dist.get_rank()}.pt")
    if dist.get_rank() == 0:
        (target / "state.json").write_text(json.dumps({"step": step, "losses": losses}))
    dist.barrier()  # every rank's files are written before the marker
    if dist.get_rank() == 0:
        (target / MARKER).write_text(str(step))
    dist.barrier()
    return target


def resume(root: Path, modules: list[nn.Module], optimizer: torch.optim.Optimizer) -> Resumed | None:
    """Collective: load the newest complete checkpoint into ``modules`` and ``optimizer`` (and this rank's RNG);
    None when there is none. Every rank decides from rank 0's view of the directory."""
    found = [str(newest_complete(root) or "") if dist.get_rank() == 0 else ""]
    dist.broadcast_object_list(found, src=0)
    if not found[0]:
        return None
    source = Path(found[0])
    holder, state = _state(modules, optimizer)
    dcp.load(state, checkpoint_id=str(source))
    set_state_dict(holder, optimizer, model_state_dict=state["model"],  # type: ignore[arg-type]
                   optim_state_dict=state["optimizer"], options=_OPTIONS)  # type: ignore[arg-type]
    rng = source / f"rng-{dist.get_rank()}.pt"
    if rng.is_file():
        torch.set_rng_state(torch.load(rng))
    meta = json.loads((source / "state.json").read_text())
    return Resumed(step=int(meta["step"]), losses=[float(x) for x in meta["losses"]])
