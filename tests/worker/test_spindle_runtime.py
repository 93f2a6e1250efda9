"""A Spindle iteration, run by ``worker.runtime.spindle`` over 4 gloo ranks as the real planner scheduled it,
gives each task's loss, and every parameter's synchronised gradient, of running the tasks one after another on
one process (``reference_iteration``), for three iterations (AdamW steps in between).

Tolerance: 1e-4 absolute on the losses (fp32; measured gap ~5e-7 on losses of ~4 and ~2e-6 on the RL loss of
~16), 1e-4 relative on gradient norms. Negative controls, the real runtime broken in one place each
(``spindle_harness.SPINDLE_FAULTS``, in the same launch): cross-device activations arriving as zeros, the
backward not sending gradients back across devices, the shared decoder's gradients not summed across the tasks
and devices using it. Measured: each moves some task's loss by 2e-3 to 1e-2 within three iterations (> 20x the
tolerance) and every one moves gradients."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from solvers.run_spindle import load_program, moves
from tests.worker.spindle_plans import planned
from worker.runtime import spindle

STEPS = 3
TOL = 1e-4
GRAD_RTOL = 1e-4
PLANS = ("captioning", "rl")
CONTROLS = {"captioning:edge-zeroed": ("captioning", "edge-zeroed"),
            "captioning:gradients-kept": ("captioning", "gradients-kept"),
            "captioning:shared-unsynced": ("captioning", "shared-unsynced")}


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    tmp = tmp_path_factory.mktemp("spindle")
    cases: dict[str, list[Any]] = {name: [planned(name), None] for name in PLANS}
    cases.update({name: [planned(plan), broken] for name, (plan, broken) in CONTROLS.items()})
    (tmp / "cases.json").write_text(json.dumps(cases))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "4",
           str(Path(__file__).with_name("spindle_harness.py")), str(tmp / "cases.json"), str(STEPS),
           str(tmp / "out.json")]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=Path(__file__).parents[2])
    assert proc.returncode == 0, proc.stderr[-4000:]
    out: dict[str, Any] = json.loads((tmp / "out.json").read_text())
    return out


_references: dict[str, tuple[list[dict[str, float]], dict[str, float]]] = {}


def reference_of(doc: dict[str, Any], steps: int) -> tuple[list[dict[str, float]], dict[str, float]]:
    """Per iteration each task's loss, and the first iteration's gradient norms, of a plan document's tasks run
    in turn on one process (AdamW steps in between)."""
    program = load_program(doc)
    stacks = spindle.build_stacks(program, 0)
    params = [p for s in stacks.values() for p in s.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=spindle.LR, weight_decay=0.0)
    losses, grads = [], {}
    for step in range(steps):
        losses.append(spindle.reference_iteration(program, stacks, step))
        if step == 0:
            grads = {f"{m}.{n}": float(p.grad.norm()) for m, s in stacks.items()
                     for n, p in s.named_parameters() if p.grad is not None}
        opt.step()
        opt.zero_grad()
    return losses, grads


def reference(name: str) -> tuple[list[dict[str, float]], dict[str, float]]:
    if name not in _references:
        _references[name] = reference_of(planned(name), STEPS)
    return _references[name]


def loss_gap(got: list[dict[str, float]], expected: list[dict[str, float]]) -> float:
    assert [sorted(g) for g in got] == [sorted(e) for e in expected]
    return max(abs(g[t] - e[t]) for g, e in zip(got, expected, strict=True) for t in e)


def gradient_mismatches(ranks: list[dict[str, float]], expected: dict[str, float]) -> list[str]:
    """Every (rank, parameter) whose gradient norm is off the reference's (each parameter must be on some rank)."""
    seen = {name for grads in ranks for name in grads}
    out = [f"{name}: on no rank" for name in expected if name not in seen]
    for rank, grads in enumerate(ranks):
        for name, norm in grads.items():
            if abs(norm - expected.get(name, 0.0)) > GRAD_RTOL * expected.get(name, 0.0) + 1e-8:
                out.append(f"rank {rank} {name}: {norm} vs {expected.get(name)}")
    return out


def test_the_captioning_plan_exercises_what_is_checked() -> None:
    """The planner's plan splits metaops over device blocks, hands rows across devices and runs the shared
    decoder on several device groups (else the equivalence below would not test them)."""
    program = load_program(planned("captioning"))
    assert any(not s.first for s in program.steps)  # a metaop split into slices
    crossing = [(s, src) for s in program.steps for src in s.sources
                if any(a != b for a, b, _, _ in moves(program.metaops[s.metaop].batch,
                                                      program.step(src).devices, s.devices))]
    assert any(program.step(src).metaop != s.metaop for s, src in crossing)  # an edge between modules
    assert any(program.step(src).metaop == s.metaop for s, src in crossing)  # a split metaop's layers
    llm_devices = {s.devices for s in program.steps if program.metaops[s.metaop].module == "llm"}
    assert len(llm_devices) > 1


@pytest.mark.slow
@pytest.mark.parametrize("name", PLANS)
def test_each_task_loss_matches_the_tasks_run_in_turn(name: str, runs: dict[str, Any]) -> None:
    expected, _ = reference(name)
    assert loss_gap(runs[name]["task_loss"], expected) < TOL, (runs[name]["task_loss"], expected)


@pytest.mark.slow
@pytest.mark.parametrize("name", PLANS)
def test_every_gradient_matches_the_tasks_run_in_turn(name: str, runs: dict[str, Any]) -> None:
    """After the sync, every rank holding a part (the shared decoder on all four) has its whole gradient."""
    assert gradient_mismatches(runs[name]["grads"], reference(name)[1]) == []


@pytest.mark.slow
@pytest.mark.parametrize("control", list(CONTROLS))
def test_a_broken_runtime_is_caught(control: str, runs: dict[str, Any]) -> None:
    plan = CONTROLS[control][0]
    expected, grads = reference(plan)
    assert loss_gap(runs[control]["task_loss"], expected) > 10 * TOL
    assert gradient_mismatches(runs[control]["grads"], grads)
