"""FlexSP's runtime step (``worker.runtime.flexsp``) on 4 gloo ranks, fp32, equals the single-process model run on
the same sequences each on its own (causal, no packing): the loss of every step and every parameter's first-step
gradient on every rank, within 1e-4 (gradients: relative to the parameter's largest gradient entry).

The groupings mix group sizes within a step (sp2 + sp1 + sp1 beside each other, then sp4 alone in the next
micro-batch; then sp4, then two sp2 groups) and pack sequences whose total is not a multiple of the group's size
(padding at the end). Negative controls, the real runtime broken one thing at a time (``faults``, in the same
launch): the packed sequence attended without the block-diagonal mask, labels shifted along the packed stream
rather than per sequence, gradients not summed over all ranks; each misses the reference by far more than the
tolerance. (Positions not restarted per sequence cannot be caught by any output: under the block-diagonal mask
RoPE sees only relative positions, so a per-sequence offset changes nothing; measured, ~4e-7 relative.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from worker.runtime.flexsp import grouping_of, grouping_problems, pack, sequence_tokens
from worker.runtime.model import ModelConfig, build_model

TOL = 1e-4
MODEL: dict[str, Any] = {"num_layers": 2, "hidden_size": 64, "num_heads": 4, "num_kv_heads": 4, "head_dim": 16,
         "ffn_hidden_size": 128, "vocab_size": 128}
LENGTHS = [[37, 20, 15, 9, 26, 50, 13], [12, 44, 30, 7, 19]]


def _g(sp: int, first: int, sequences: list[int]) -> dict[str, Any]:
    return {"sp": sp, "ranks": [first, first + sp - 1], "sequences": sequences}


GROUPING = [
    # step 0: sp2 on ranks 0-1 (57 tokens: one pad), sp1 on rank 2 (two sequences), sp1 on rank 3; then sp4 alone
    [{"groups": [_g(2, 0, [0, 1]), _g(1, 2, [2, 3]), _g(1, 3, [4])]}, {"groups": [_g(4, 0, [5, 6])]}],
    # step 1: sp4 alone (44 tokens), then two sp2 groups (37 and 31 tokens)
    [{"groups": [_g(4, 0, [1])]}, {"groups": [_g(2, 0, [2, 3]), _g(2, 2, [0, 4])]}],
]
FAULTS = ["flexsp-no-block-mask", "flexsp-labels-across-sequences", "flexsp-grads-not-reduced"]
CASES = {"mixed": {"model": MODEL, "lengths": LENGTHS, "grouping": GROUPING, "fault": None}} | {
    fault: {"model": MODEL, "lengths": LENGTHS[:1], "grouping": GROUPING[:1], "fault": fault} for fault in FAULTS}


def reference() -> tuple[list[float], dict[str, torch.Tensor]]:
    """Single process: each step's token-mean loss over its sequences, each run alone; first-step gradients."""
    cfg = ModelConfig(**MODEL)
    model = build_model(cfg, seed=0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0)
    losses, grads = [], {}
    for step, lengths in enumerate(LENGTHS):
        total, loss = sum(lengths), 0.0
        for i, n in enumerate(lengths):
            t = sequence_tokens(cfg.vocab_size, n, 0, step, i)
            ce = F.cross_entropy(model(t[None, :-1]).flatten(0, 1), t[1:], reduction="sum")
            (ce / total).backward()
            loss += float(ce.detach())
        losses.append(loss / total)
        if step == 0:
            grads = {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    return losses, grads


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    tmp = tmp_path_factory.mktemp("flexsp")
    (tmp / "cases.json").write_text(json.dumps(CASES))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           str(Path(__file__).with_name("flexsp_harness.py")), str(tmp / "cases.json"), str(tmp / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads((tmp / "out.json").read_text()), tmp


@pytest.fixture(scope="module")
def expected() -> tuple[list[float], dict[str, torch.Tensor]]:
    return reference()


def gradient_errors(tmp: Path, case: str, ref: dict[str, torch.Tensor]) -> dict[str, float]:
    """Per (rank, parameter): max |gradient - reference| over the reference's largest |entry|."""
    out = {}
    for rank in range(4):
        got = torch.load(tmp / f"{case}-rank{rank}.pt")
        assert got.keys() == ref.keys()
        for name, g in ref.items():
            out[f"rank{rank}:{name}"] = float((got[name] - g).abs().max() / g.abs().max())
    return out


def test_the_groupings_are_ones_the_runtime_runs() -> None:
    for lengths, micro_batches in zip(LENGTHS, GROUPING, strict=True):
        assert grouping_problems(grouping_of(micro_batches), len(lengths), 4, 4, 4) == []
    # negative controls: a sequence trained twice, a block past the world, sp not dividing the heads
    twice = grouping_of([{"groups": [_g(4, 0, [0, 1, 1, 2, 3, 4])]}])
    assert "exactly once" in grouping_problems(twice, 5, 4, 4, 4)[0]
    assert "not a block" in grouping_problems(grouping_of(GROUPING[1]), 5, 2, 4, 4)[0]
    assert "does not divide" in grouping_problems(grouping_of(GROUPING[1]), 5, 4, 4, 2)[0]


def test_pack_pads_only_the_end_and_slices_contiguously() -> None:
    seqs = [torch.arange(10, 15), torch.arange(20, 24)]  # 4 and 3 training tokens
    parts = [pack(seqs, 2, r) for r in range(2)]
    assert parts[0].segments == (4, 3, 1)
    inputs = torch.cat([p.inputs[0] for p in parts]).tolist()
    labels = torch.cat([p.labels[0] for p in parts]).tolist()
    assert inputs == [10, 11, 12, 13, 20, 21, 22, 0] and labels == [11, 12, 13, 14, 21, 22, 23, -100]


@pytest.mark.slow
def test_flexsp_step_matches_the_single_process_model(runs: tuple[dict[str, Any], Path],
                                                      expected: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    results, tmp = runs
    losses, grads = expected
    assert results["mixed"]["loss"] == pytest.approx(losses, abs=TOL)
    errors = gradient_errors(tmp, "mixed", grads)
    assert len(errors) == 4 * len(grads) and max(errors.values()) < TOL, max(errors.items(), key=lambda kv: kv[1])


@pytest.mark.slow
@pytest.mark.parametrize("fault", FAULTS)
def test_a_broken_flexsp_runtime_is_caught(fault: str, runs: tuple[dict[str, Any], Path],
                                           expected: tuple[list[float], dict[str, torch.Tensor]]) -> None:
    results, tmp = runs
    losses, grads = expected
    assert max(gradient_errors(tmp, fault, grads).values()) > 100 * TOL
    # The loss shows only the mask: the loss is summed over all ranks whether or not the gradients are, and on
    # random tokens an untrained model's loss is ~ln(vocab) whichever token a label is (measured: 6e-6 off)
    if fault == "flexsp-no-block-mask":
        assert abs(results[fault]["loss"][0] - losses[0]) > 10 * TOL
