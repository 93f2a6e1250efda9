"""Activation checkpointing per layer: ``full`` recomputes the whole block in backward, ``selective``
only its attention (the part whose activations grow with the sequence, Megatron's selective recompute)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from worker.runtime.model import blocks


class Checkpointed(nn.Module):
    """Runs ``inner`` under non-reentrant checkpointing; parameters stay reachable as ``inner.*``."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = checkpoint(self.inner, x, use_reentrant=False)
        return out


def apply_checkpointing(model: nn.Module, recompute: Sequence[str]) -> None:
    """Wrap the blocks of ``model.layers`` (keyed by global layer index) per ``recompute[index]``."""
    layers = blocks(model)
    for key in list(layers.keys()):
        mode = recompute[int(key)] if int(key) < len(recompute) else "none"
        if mode == "full":
            layers[key] = Checkpointed(layers[key])
        elif mode == "selective":
            block = layers[key]
            block.attention = Checkpointed(block.get_submodule("attention"))
