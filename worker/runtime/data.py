"""Training data: synthetic tokens (the same global batch on every rank for a (seed, step), each rank taking its
part), or a tokenized dataset file from which each data-parallel rank reads only its own rows; for FlexSP, whose
sequences vary in length, the same file cut at its documents' boundaries (``DocumentFile``).

The synthetic global batch is generated whole and sliced, so a plan and the single-process model see the very
same tokens; that is what makes their losses comparable.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from solvers.run_layout import TOKEN_DTYPES
from worker.runtime.ring_attention import shard_sequence


def global_batch(vocab_size: int, batch: int, seq_length: int, seed: int, step: int) -> torch.Tensor:
    """(batch, seq_length + 1) token ids; inputs are [:, :-1], labels [:, 1:]."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, vocab_size, (batch, seq_length + 1), generator=gen)


def local_batch(tokens: torch.Tensor, dp_rank: int, dp: int, sp_rank: int = 0, sp: int = 1, cp_rank: int = 0,
                cp: int = 1) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's (inputs, labels): rows of its data-parallel slice; of their columns, its context-parallel
    rank's two load-balanced chunks (``ring_attention.shard_sequence``), and of those its Ulysses slice."""
    rows = tokens.shape[0] // dp
    part = tokens[dp_rank * rows:(dp_rank + 1) * rows]
    # Inputs and labels are cut at the same positions, so every label stays with the token that predicts it.
    inputs, labels = (shard_sequence(t, 1, cp_rank, cp) for t in (part[:, :-1], part[:, 1:]))
    cols = inputs.shape[1] // sp
    sl = slice(sp_rank * cols, (sp_rank + 1) * cols)
    return inputs[:, sl].contiguous(), labels[:, sl].contiguous()


def open_tokens(path: Path, dtype: str, vocab_size: int) -> np.memmap:
    """A flat token-id file mapped read-only; ValueError where it is not whole ``dtype`` tokens or holds an id
    outside the vocabulary (one pass at the start: a bad id fails the run before it trains, not mid-way)."""
    if dtype not in TOKEN_DTYPES:
        raise ValueError(f"dtype {dtype!r}: one of {', '.join(TOKEN_DTYPES)}")
    itemsize = np.dtype(dtype).itemsize
    size = path.stat().st_size  # FileNotFoundError names the path
    if size % itemsize:
        raise ValueError(f"{path}: {size} bytes is not a whole number of {dtype} tokens")
    tokens = np.memmap(path, dtype=dtype, mode="r")
    top = int(tokens.max()) if len(tokens) else -1
    if top >= vocab_size:
        raise ValueError(f"{path}: token id {top} is outside the model's vocabulary of {vocab_size}")
    return tokens


class TokenFile:
    """A tokenized dataset: one flat array of token ids (uint16 or uint32, as written by e.g. nanoGPT's prepare
    scripts), read with ``numpy.memmap``. The file is cut into consecutive windows of ``seq_length + 1`` tokens;
    sample ``g`` of the run (``g = step * global_batch + row``) is window ``g mod windows``. Data-parallel rank ``r``
    of ``dp`` reads rows ``[r, r + 1) * global_batch / dp`` of each step: its own shard, disjoint from the other
    ranks', the same on every attempt (the data position is the step, which checkpoints carry)."""

    def __init__(self, path: Path, dtype: str, seq_length: int, vocab_size: int) -> None:
        self.path, self.window, self.vocab_size = path, seq_length + 1, vocab_size
        self.tokens = open_tokens(path, dtype, vocab_size)
        self.windows = len(self.tokens) // self.window
        if self.windows == 0:
            raise ValueError(f"{path}: {len(self.tokens)} tokens, fewer than one sample of {self.window}")

    def rows(self, step: int, global_batch: int, dp_rank: int, dp: int) -> torch.Tensor:
        """This data-parallel rank's rows of ``step``'s global batch: (global_batch / dp, seq_length + 1) ids."""
        per_rank = global_batch // dp
        first = step * global_batch + dp_rank * per_rank
        windows = [(first + i) % self.windows for i in range(per_rank)]
        return torch.from_numpy(np.stack([self.tokens[w * self.window:(w + 1) * self.window] for w in windows])
                                .astype(np.int64))


class DocumentFile:
    """A tokenized dataset cut at its documents' boundaries: document ``i`` is the tokens before the ``i``-th
    ``separator`` token (e.g. GPT-2's end-of-text id 50256) since the one before it. Its training sequence is its
    tokens and the separator (``length + 1`` ids: inputs ``[:-1]``, labels ``[1:]``, the last label the separator),
    so a sequence of ``length`` positions, which is the length FlexSP plans. Documents longer than ``max_length`` are
    dropped (as FlexSP's reference drops those above its context limit), as are empty ones and the tokens after the
    last separator (no end: an unfinished document)."""

    def __init__(self, path: Path, dtype: str, vocab_size: int, separator: int, max_length: int) -> None:
        if not 0 <= separator < vocab_size:
            raise ValueError(f"document separator {separator} is outside the model's vocabulary of {vocab_size}")
        self.path, self.tokens = path, open_tokens(path, dtype, vocab_size)
        ends = np.flatnonzero(self.tokens == separator)
        starts = np.concatenate([[0], ends[:-1] + 1]).astype(np.int64)
        lengths = ends - starts
        keep = (lengths >= 1) & (lengths <= max_length)
        self.starts, self.lengths = starts[keep], lengths[keep].astype(np.int64)
        if len(self.lengths) == 0:
            raise ValueError(f"{path}: no document of 1..{max_length} tokens ends with the separator {separator} "
                             f"({len(ends)} separators in {len(self.tokens)} tokens)")

    def __len__(self) -> int:
        return len(self.lengths)

    def batch(self, index: int, size: int) -> list[int]:
        """Documents of batch ``index``: the ``size`` after the first ``index * size``, cycling over the file."""
        first = index * size
        return [(first + i) % len(self.lengths) for i in range(size)]

    def sequence(self, doc: int) -> torch.Tensor:
        """Document ``doc``'s ``length + 1`` ids: its tokens, then the separator."""
        start, n = int(self.starts[doc]), int(self.lengths[doc])
        return torch.from_numpy(np.asarray(self.tokens[start:start + n + 1]).astype(np.int64))
