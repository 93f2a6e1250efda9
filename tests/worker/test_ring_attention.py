"""Ring attention (context parallelism) against attention on one process, on 4 real gloo ranks.

Attention alone: output and the gradients of q, k and v equal full causal attention's within 1e-5 (fp32; the
ring reorders the softmax sums), for cp 2 and 4, grouped-query and multi-head, causal and not. The decoder: with
ring attention on each rank's load-balanced chunks, the loss and every parameter's gradient (averaged over the cp
ranks) equal the single-process model's. Negative controls: the ring fed contiguous chunks, rotary at local
positions, and contiguous chunks in the model are each off by more than 1000x the tolerance."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from worker.runtime.ring_attention import chunk_positions, shard_sequence, unshard_sequence

TOL = 1e-5


@pytest.fixture(scope="module")
def ring_results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("ring") / "out.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           str(Path(__file__).with_name("ring_attention_harness.py")), str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    result: dict = json.loads(out.read_text())
    return result


@pytest.mark.slow
@pytest.mark.parametrize("case", ["cp2-gqa-causal", "cp4-gqa-causal", "cp4-mha-causal", "cp4-gqa-full"])
def test_ring_attention_equals_full_attention(case: str, ring_results: dict) -> None:
    errors = ring_results["attention"][case]
    assert set(errors) == {"out", "dq", "dk", "dv"}
    assert max(errors.values()) < TOL, errors


@pytest.mark.slow
@pytest.mark.parametrize("cp", ["cp2", "cp4"])
def test_decoder_with_ring_attention_equals_single_process(cp: str, ring_results: dict) -> None:
    got = ring_results["model"][cp]
    assert got["loss"] < TOL and got["grad_rel"] < TOL, got


@pytest.mark.slow
def test_broken_context_parallelism_is_caught(ring_results: dict) -> None:
    assert min(ring_results["attention"]["control-cp4-contiguous"].values()) > 1000 * TOL
    assert ring_results["model"]["control-cp4-local-positions"]["grad_rel"] > 1000 * TOL
    assert ring_results["model"]["control-cp4-contiguous-chunks"]["grad_rel"] > 1000 * TOL


def test_load_balanced_chunks_and_their_positions() -> None:
    """cp 2 on 8 tokens: rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2; positions are the global ones."""
    seq = torch.arange(8)[None]
    parts = [shard_sequence(seq, 1, r, 2) for r in range(2)]
    assert [p.tolist() for p in parts] == [[[0, 1, 6, 7]], [[2, 3, 4, 5]]]
    assert [chunk_positions(4, r, 2).tolist() for r in range(2)] == [[0, 1, 6, 7], [2, 3, 4, 5]]
    assert torch.equal(unshard_sequence(parts, 1), seq)
    with pytest.raises(ValueError, match="2\\*cp = 4"):
        shard_sequence(torch.arange(6)[None], 1, 0, 2)
