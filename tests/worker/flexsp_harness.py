"""Run by torchrun from test_flexsp_runtime.py: train every case of a JSON file in one process group and write
{case: {"loss": [per step]}} from rank 0, and each rank's first-step gradients (after the reduction over all
ranks, before the optimizer uses them) to ``<out dir>/<case>-rank<r>.pt``.

A case is {"model": ModelConfig fields, "lengths": [per step: sequence lengths], "grouping": [per step: FlexSP
micro_batches], "fault": null or a ``faults`` name}.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.worker.faults import fault
from worker.runtime.flexsp import GroupCache, grouping_of, sequence_tokens, step_gradients
from worker.runtime.model import ModelConfig, build_model


def main() -> None:
    cases, out = json.loads(Path(sys.argv[1]).read_text()), Path(sys.argv[2])
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    groups = GroupCache()  # shared by the cases, as by a run's steps
    results = {}
    for name, case in cases.items():
        cfg = ModelConfig(**case["model"])
        model = build_model(cfg, seed=0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
        losses = []
        with fault(case["fault"]):
            for step, (lengths, micro_batches) in enumerate(zip(case["lengths"], case["grouping"], strict=True)):
                def tokens_of(i: int, lengths: list[int] = lengths, step: int = step, vocab: int = cfg.vocab_size
                              ) -> torch.Tensor:
                    return sequence_tokens(vocab, lengths[i], 0, step, i)

                losses.append(step_gradients(model, grouping_of(micro_batches), tokens_of, lengths, groups))
                if step == 0:
                    torch.save({n: p.grad.clone() if p.grad is not None else torch.zeros_like(p)
                                for n, p in model.named_parameters()}, out.parent / f"{name}-rank{rank}.pt")
                opt.step()
                opt.zero_grad()
        results[name] = {"loss": losses}
    if rank == 0:
        out.write_text(json.dumps(results))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
