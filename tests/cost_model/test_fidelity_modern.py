"""The held-out modern tables of bench/fidelity.py (issue 34): published H100 / H200 / B200 throughput tables with
fused attention (bench/data/fidelity/). Every row parses and prices; the MAPE the bench prints is the one computed
here from the rows alone; the figures are pinned as the bench reports them, and the goal (<= 12 % each) is a
strict expected failure while it is not met."""

from __future__ import annotations

import re
from types import ModuleType
from typing import Any

import numpy as np
import pytest

from solvers.cost_model.analytic import AnalyticCostModel
from solvers.cost_model.base import StageContext
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.factory import plan_from_shorthand
from solvers.specs import TrainingSpec

# What the bench reports with the shipped constants (MAPE of tokens/s per GPU), pinned so that a change to the
# model shows here and in the report together.
REPORTED_MAPE = {"NeMo 24.07 DGX-H100 FP8": 0.059, "NeMo 25.09-26.02 DGX-H100/B200 Llama 3": 0.093,
                 "torchtitan H100 (2024-12) / H200 (2025-06)": 0.167}
MEETS_GOAL = ("NeMo 24.07 DGX-H100 FP8", "NeMo 25.09-26.02 DGX-H100/B200 Llama 3")
ROWS = {"NeMo 24.07 DGX-H100 FP8": 9, "NeMo 25.09-26.02 DGX-H100/B200 Llama 3": 16,
        "torchtitan H100 (2024-12) / H200 (2025-06)": 14}
# Rows the model puts above the GPU's memory although they ran: none. (Before torchtitan's "selective" was priced
# as its per-op policy, the three T1 rows were put at 105 GiB of 94.5: the Megatron-style selective the model priced
# them with keeps, on fused attention, as much as no recomputation.)
OVER_MEMORY: set[str] = set()


@pytest.fixture(scope="module")
def reports(fidelity: ModuleType) -> dict[str, Any]:
    return {rep.name: rep for rep in fidelity.run_modern()}


def tokens_per_gpu(row: Any, precision: str | None = None) -> float:
    """The row priced from its specs alone (not through the bench's helpers); ``precision`` replaces the row's."""
    training = row.training if precision is None else _as(row.training, precision=precision)
    plan = plan_from_shorthand(row.strategy, row.model, row.cluster, training)
    step = AnalyticCostModel(row.model, row.cluster, training, calibration=DEFAULT_CALIBRATION
                             ).evaluate(plan).step_time_s
    return training.global_batch_size * training.seq_length / (row.cluster.num_gpus * step)


def mape(rows: list[Any], predicted: list[float]) -> float:
    return float(np.mean([abs(p - r.measured) / r.measured for r, p in zip(rows, predicted, strict=True)]))


def test_every_csv_parses_into_rows_of_its_stated_stack(fidelity: ModuleType) -> None:
    sets = fidelity.modern_sets()
    assert {name: len(rows) for name, (rows, _) in sets.items()} == ROWS
    for rows, _ in sets.values():
        for r in rows:
            stack = r.training.priced_stack()
            assert stack.attention == "fused" and stack.distributed_optimizer and stack.dp_overlap  # the defaults
            assert r.cluster.gpu.name in {"H100-SXM", "H100-96GB-500W", "H200", "B200"} and r.measured > 0
            assert (stack.fp8_recipe is not None) == (r.training.precision == "fp8")
    titan = {r.label: r for r in sets["torchtitan H100 (2024-12) / H200 (2025-06)"][0]}
    assert titan["T4 70B FSDP32 TP8 AsyncTP"].training.priced_stack().tp_comm_overlap == "full"
    assert titan["T4 70B FSDP32 TP8"].training.priced_stack().tp_comm_overlap == "none"  # torchtitan's own


def test_every_row_prices_and_fits_but_the_named_ones(fidelity: ModuleType) -> None:
    over = set()
    for rows, _ in fidelity.modern_sets().values():
        for r in rows:
            est = fidelity.estimate(r)
            assert np.isfinite(est.step_time_s) and est.step_time_s > 0
            if not est.fits:
                over.add(r.label)
    assert over == OVER_MEMORY


def test_the_printed_mape_is_the_rows_mape(fidelity: ModuleType, reports: dict[str, Any]) -> None:
    for rep in reports.values():
        mine = [tokens_per_gpu(r) for r in rep.rows]
        assert mine == pytest.approx(rep.predicted, rel=1e-12)
        printed = re.search(r"MAPE (\d+\.\d)%", fidelity.modern_table(rep))
        assert printed is not None and float(printed.group(1)) == round(100 * mape(rep.rows, mine), 1)
        assert "held out" in fidelity.modern_table(rep)


def test_the_check_sees_the_stack_a_row_states(reports: dict[str, Any]) -> None:
    """Negative control: priced in bf16 instead of the FP8 the rows state, the NeMo 24.07 table's MAPE moves by
    more than the printed precision, so a bench that dropped the row's precision would fail the check above."""
    rep = reports["NeMo 24.07 DGX-H100 FP8"]
    as_stated = mape(rep.rows, [tokens_per_gpu(r) for r in rep.rows])
    as_bf16 = mape(rep.rows, [tokens_per_gpu(r, "bf16") for r in rep.rows])
    assert abs(as_stated - as_bf16) > 0.01


@pytest.mark.parametrize("name", sorted(REPORTED_MAPE))
def test_the_reported_figures(reports: dict[str, Any], name: str) -> None:
    assert float(reports[name].ape.mean()) == pytest.approx(REPORTED_MAPE[name], abs=5e-4)


@pytest.mark.parametrize("name", [
    *MEETS_GOAL,
    pytest.param("torchtitan H100 (2024-12) / H200 (2025-06)", marks=pytest.mark.xfail(
        strict=True, reason="held out, shipped constants: MAPE 16.7 %, predicted fast: long-context CP +30-35 %, "
                            "H200 +28-30 %, AsyncTP +23 % (bench/data/fidelity/README.md)"))])
def test_modern_goal_mape_within_twelve_percent(reports: dict[str, Any], name: str) -> None:
    assert reports[name].ape.mean() <= 0.12


def test_fp8_prices_attention_and_the_lm_head_at_the_16_bit_peak(fidelity: ModuleType) -> None:
    """Transformer Engine and torchtitan's float8 quantise the linear layers only: under fp8 the attention core
    and the LM head take as long as under bf16, the layers' GEMMs about half (the negative control)."""
    row = fidelity.modern_sets()["NeMo 24.07 DGX-H100 FP8"][0][7]  # LLAMA3-8B
    fp8_model = AnalyticCostModel(row.model, row.cluster, row.training)
    bf16_model = AnalyticCostModel(row.model, row.cluster, _as(row.training, precision="bf16"))
    assert fp8_model._attention_head(4096, 8192, 128) == pytest.approx(bf16_model._attention_head(4096, 8192, 128))
    qkv = (8192, 6144, 4096)
    assert fp8_model._gemm(*qkv) < 0.6 * bf16_model._gemm(*qkv)
    head = [m._edge_activity(8, 8.0, False, True, 1)[0]["compute"] for m in (fp8_model, bf16_model)]
    assert head[0] == pytest.approx(head[1])


def test_a_fused_kernels_backward_recomputes_its_scores(fidelity: ModuleType) -> None:
    """FlashAttention's backward runs five matmuls to the forward's two. With full recomputation (one more
    forward, and no TP or CP traffic to recompute) a fused layer's compute is three times its recomputed forward
    plus half its attention core; an unfused layer's is three times its forward (the negative control)."""
    rows = {r.label: r for r in fidelity.modern_sets()["NeMo 25.09-26.02 DGX-H100/B200 Llama 3"][0]}
    row = rows["25.11 H100 LLAMA3_8B"]  # tp 1, cp 1, pp 1
    strategy = {**row.strategy, "recompute": "full"}
    s = row.training.seq_length
    for training, extra in ((row.training, 0.5), (_as(row.training, attention="unfused"), 0.0)):
        plan = plan_from_shorthand(strategy, row.model, row.cluster, training)
        ctx = StageContext(pp=1, stage=0, micro_batches=plan.micro_batches,
                           micro_batch_samples=training.global_batch_size / plan.micro_batches)
        model = AnalyticCostModel(row.model, row.cluster, training)
        parts = model.layer_costs(0, [plan.layers[0]], ctx).parts_s
        core = ctx.micro_batch_samples / plan.layers[0].dp * row.model.num_attention_heads * \
            model._attention_head(s, s, row.model.head_size)
        assert parts["compute"][0] == pytest.approx(3 * parts["recompute"][0] + extra * float(core), rel=1e-9)
        assert extra == 0.0 or parts["compute"][0] > 3.01 * parts["recompute"][0]


def _as(training: TrainingSpec, precision: str | None = None, attention: str | None = None) -> TrainingSpec:
    """``training`` with another precision (and no FP8 recipe) or attention kernel."""
    stack = training.stack
    if attention is not None:
        stack = stack.model_copy(update={"attention": attention})
    update: dict[str, object] = {"stack": stack}
    if precision is not None:
        update = {"precision": precision, "stack": stack.model_copy(update={"fp8_recipe": None})}
    return training.model_copy(update=update)
