"""Checkpoints and dataset files with real gloo ranks (``worker.runtime.train`` under torchrun, FSDP2 ZeRO-3 on 2
ranks): a run interrupted after a checkpoint and resumed gives the uninterrupted run's loss curve within 1e-5 (model,
optimizer, data position and RNG restored); a torn checkpoint (no marker) is never resumed; a run on a tokenized
file of a repetitive corpus learns it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import ROOT
from tests.worker.plans import plan_doc
from worker.runtime.train_checkpoint import MARKER, newest_complete, step_dir

STEPS, EVERY = 6, 2
PLAN = plan_doc(world=2, dp=2, zero=3)


def train(tmp: Path, name: str, steps: int, *extra: str) -> dict[str, Any]:
    work = tmp / name
    work.mkdir()
    (work / "plan.json").write_text(json.dumps(PLAN))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", "-m",
           "worker.runtime.train", "--plan", str(work / "plan.json"), "--steps", str(steps), "--out",
           str(work / "metrics.json"), "--progress", str(work / "progress.jsonl"), *extra]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    metrics: dict[str, Any] = json.loads((work / "metrics.json").read_text())
    metrics["progress"] = [json.loads(x) for x in (work / "progress.jsonl").read_text().splitlines()]
    return metrics


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repetitive toy corpus: a 16-token phrase over and over (uint16)."""
    path = tmp_path_factory.mktemp("data") / "tokens.bin"
    np.tile(np.array([5, 17, 99, 3, 42, 42, 7, 120, 64, 1, 0, 88, 23, 23, 9, 77], dtype=np.uint16), 400).tofile(path)
    return path


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory, corpus: Path) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("ckpt")
    data = ("--dataset", str(corpus), "--dataset-dtype", "uint16")
    ckpt = tmp / "checkpoints"
    whole = train(tmp, "whole", STEPS, *data)
    # attempt 1 gets through step 3 (a checkpoint after 2 steps), then dies: its 3rd step's work is lost
    first = train(tmp, "first", 3, *data, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY))
    torn = step_dir(ckpt, 4)  # a checkpoint a crash interrupted: files but no marker
    torn.mkdir()
    (torn / "state.json").write_text(json.dumps({"step": 4, "losses": [9.0] * 4}))
    second = train(tmp, "second", STEPS, *data, "--checkpoint-dir", str(ckpt), "--checkpoint-every", str(EVERY))
    return {"whole": whole, "first": first, "second": second, "ckpt": ckpt}


@pytest.mark.slow
def test_a_resumed_run_continues_the_uninterrupted_loss_curve(runs: dict[str, Any]) -> None:
    whole, first, second = runs["whole"], runs["first"], runs["second"]
    assert first["resumed_from_step"] is None and second["resumed_from_step"] == EVERY
    assert [p["step"] for p in second["progress"]] == list(range(EVERY, STEPS))  # attempt 2 starts at the checkpoint
    assert all(p["resumed_from_step"] == EVERY for p in second["progress"])
    assert first["loss"] == pytest.approx(whole["loss"][:3], abs=1e-5)
    assert second["loss"] == pytest.approx(whole["loss"], abs=1e-5)  # the whole curve, restored steps included
    assert len(second["step_times_s"]) == STEPS - EVERY
    # checkpoints after 2 and 4 steps of attempt 2 (none after the last step); the torn one was replaced
    assert (step_dir(runs["ckpt"], 4) / MARKER).is_file() and newest_complete(runs["ckpt"]) == step_dir(runs["ckpt"], 4)
    assert not step_dir(runs["ckpt"], STEPS).exists()


@pytest.mark.slow
def test_a_run_on_a_dataset_file_learns_the_corpus(runs: dict[str, Any]) -> None:
    losses = runs["whole"]["loss"]
    assert losses[-1] < losses[0] - 0.3 and losses == sorted(losses, reverse=True), losses


def test_ranks_read_disjoint_deterministic_shards(tmp_path: Path) -> None:
    from worker.runtime.data import TokenFile

    path = tmp_path / "ids.bin"
    np.arange(50 * 32, dtype=np.uint32).tofile(path)  # token t sits at offset t: a row's first id names its window
    data = TokenFile(path, "uint32", seq_length=31, vocab_size=50 * 32)
    assert data.windows == 50
    gbs, dp = 8, 4
    for step in (0, 1, 7):  # step 7 wraps around the file (56 > 50 windows)
        shards = [data.rows(step, gbs, r, dp) for r in range(dp)]
        assert all(s.shape == (gbs // dp, 32) for s in shards)
        windows = [int(row[0]) // 32 for s in shards for row in s]
        assert windows == [(step * gbs + i) % 50 for i in range(gbs)]  # disjoint, in rank order
        again = TokenFile(path, "uint32", seq_length=31, vocab_size=50 * 32)
        assert all(bool((again.rows(step, gbs, r, dp) == shards[r]).all()) for r in range(dp))


@pytest.mark.parametrize(("content", "dtype", "vocab", "reason"), [
    (np.arange(10, dtype=np.uint16), "uint16", 128, "fewer than one sample"),
    (np.arange(200, dtype=np.uint16), "uint16", 128, "token id 199 is outside the model's vocabulary of 128"),
    (np.arange(100, dtype=np.uint8), "uint16", 128, "not a whole number of uint16 tokens"),
])
def test_a_dataset_file_the_run_cannot_use_is_refused_with_the_reason(tmp_path: Path, content: Any, dtype: str,
                                                                      vocab: int, reason: str) -> None:
    from worker.runtime.data import TokenFile

    path = tmp_path / "bad.bin"
    content[:99].tofile(path) if content.dtype == np.uint8 else content.tofile(path)
    with pytest.raises(ValueError, match=reason):
        TokenFile(path, dtype, seq_length=31, vocab_size=vocab)
