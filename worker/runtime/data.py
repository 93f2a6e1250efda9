"""Synthetic training data: the same global batch on every rank for a (seed, step), each rank taking its part.

The global batch is generated whole and sliced, so a plan and the single-process model see the very same
tokens; that is what makes their losses comparable.
"""

from __future__ import annotations

import torch


def global_batch(vocab_size: int, batch: int, seq_length: int, seed: int, step: int) -> torch.Tensor:
    """(batch, seq_length + 1) token ids; inputs are [:, :-1], labels [:, 1:]."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab_size, (batch, seq_length + 1), generator=gen)


def local_batch(tokens: torch.Tensor, dp_rank: int, dp: int, sp_rank: int = 0, sp: int = 1
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (inputs, labels): rows of its data-parallel slice, columns of its sequence slice."""
    rows = tokens.shape[0] // dp
    part = tokens[dp_rank * rows:(dp_rank + 1) * rows]
    inputs, labels = part[:, :-1], part[:, 1:]
    cols = inputs.shape[1] // sp
    sl = slice(sp_rank * cols, (sp_rank + 1) * cols)
    return inputs[:, sl].contiguous(), labels[:, sl].contiguous()
