"""A FlexSP plan trained through the worker's launch path (``worker.launch.run_locally`` -> torchrun ->
``worker.runtime.train`` -> ``flexsp_train``) on 4 gloo ranks for 20 steps over the Wikipedia length stream:
losses finite and falling, every step's metrics present, and every step ran the grouping it reports, which is the
planner's for its batch (or, for a step whose plan was late, the previous step's rule).

The cost model is the reference's explicit form with constants that make a tiny CPU model's long sequences worth
splitting (attention-heavy, fast all-to-all), so that the planner mixes group sizes within steps."""

from __future__ import annotations

import itertools
import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from solvers.errors import SpecError
from solvers.flexsp.api import solve
from solvers.run_flexsp import check_flexsp_runnable
from worker.launch import Launch, run_locally
from worker.runtime import flexsp_train
from worker.runtime.data import DocumentFile
from worker.runtime.flexsp import Group, grouping_of
from worker.runtime.flexsp_train import FlexSPRun, Planner, fallback_grouping, static_grouping
from worker.runtime.model import ModelConfig, build_model

WIKIPEDIA = Path(__file__).parents[3] / "shared" / "reference" / "flexsp" / "wikipedia_lengths.txt"
MAX_LENGTH, SEQUENCES, STEPS = 512, 8, 20
COST = {"kind": "flexsp", "alpha1_ms_per_token2": 1e-4, "alpha2_ms_per_token": 0.01, "beta_ms": 0.5,
        "activation_mb_per_token": 0.01, "params_billion": 0.0001, "alltoall_GBps_by_group_size": {"2": 1.0, "4": 0.5}}


def stream() -> list[int]:
    return [n for n in map(int, WIKIPEDIA.read_text().split()[:20_000]) if n <= MAX_LENGTH]


def plan_doc(gpus: int = 4) -> dict[str, Any]:
    first = stream()[-SEQUENCES:]  # the plan's own batch: not the stream's first block, which step 1 takes
    request = {"kind": "flexsp", "cluster": {"gpu": "cpu", "nodes": 1, "gpus_per_node": gpus}, "precision": "fp32",
               "model": {"name": "tiny", "num_layers": 2, "hidden_size": 64, "num_attention_heads": 4,
                         "vocab_size": 128},
               "cost_model": COST, "batch": {"sequence_lengths": first}}
    return {"kind": "flexsp", "request": request, "result": solve(request).model_dump(mode="json")}


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], dict[str, Any], Path]:
    if not WIKIPEDIA.exists():
        pytest.skip(f"{WIKIPEDIA} (../shared) is not here")
    doc, work = plan_doc(), tmp_path_factory.mktemp("flexsp-run")
    # a generous budget: on a loaded 2-core host a solve can take seconds (the late path is tested below)
    metrics = run_locally(doc, Launch(4, lengths=WIKIPEDIA, max_length=MAX_LENGTH, plan_budget_s=10.0), STEPS, work,
                          timeout_s=150, max_launches=1)
    return doc, metrics, work


def positions(micro_batches: list[dict[str, Any]], lengths: list[int], world: int) -> list[list[int]]:
    """Per rank, per micro-batch: the positions its model runs under ``micro_batches`` (its 1/sp of its group's
    packed sequence, padded to a multiple of sp; 0 where it idles)."""
    out = [[0] * len(micro_batches) for _ in range(world)]
    for m, mb in enumerate(micro_batches):
        for g in mb["groups"]:
            tokens = sum(lengths[i] for i in g["sequences"])
            for r in range(g["ranks"][0], g["ranks"][1] + 1):
                out[r][m] = -(-tokens // g["sp"]) if tokens else 0
    return out


@pytest.mark.slow
def test_a_flexsp_run_trains_and_reports_every_step(trained: tuple[dict[str, Any], dict[str, Any], Path]) -> None:
    _, metrics, work = trained
    losses = metrics["loss"]
    assert len(losses) == STEPS and all(math.isfinite(x) for x in losses)
    assert sum(losses[-5:]) / 5 < sum(losses[:5]) / 5 - 0.2  # measured: 4.85 -> 3.65 over 20 steps
    assert metrics["layout"] == "flexsp" and metrics["world_size"] == 4 and len(metrics["step_times_s"]) == STEPS
    assert len(metrics["peak_memory_gib_per_rank"]) == 4 and metrics["predicted_step_time_s"] > 0
    for record in metrics["flexsp_steps"]:
        assert record["step_time_s"] > 0 and record["predicted_step_time_s"] > 0
        assert len(record["peak_memory_gib_per_rank"]) == 4 and min(record["peak_memory_gib_per_rank"]) > 0
    progress = [json.loads(line) for line in (work / "launch-1" / "progress.jsonl").read_text().splitlines()]
    assert [p["step"] for p in progress] == list(range(STEPS)) and [p["loss"] for p in progress] == losses


@pytest.mark.slow
def test_each_step_runs_the_planners_grouping_of_its_batch(
        trained: tuple[dict[str, Any], dict[str, Any], Path]) -> None:
    doc, metrics, _ = trained
    records = metrics["flexsp_steps"]
    blocks = stream()
    assert records[0]["lengths"] == doc["request"]["batch"]["sequence_lengths"]
    for k, record in enumerate(records[1:], start=1):  # then the stream's consecutive blocks
        assert record["lengths"] == blocks[(k - 1) * SEQUENCES:k * SEQUENCES]
    # every rank ran what the step's grouping gives it (positions per micro-batch, measured inside the step)
    for record in records:
        assert record["positions_by_rank"] == positions(record["micro_batches"], record["lengths"], 4)
    assert records[0]["grouping"] == "plan"
    assert grouping_of(records[0]["micro_batches"]) == grouping_of(doc["result"]["micro_batches"])
    assert metrics["groupings"]["planned"] >= STEPS // 2, metrics["groupings"]
    run = FlexSPRun(doc, 4)
    planned = [r for r in records if r["grouping"] == "planned"]
    for record in planned[:3]:  # the planner's own answer for that batch (it is deterministic)
        again = solve(run.request_for(record["lengths"]))
        assert grouping_of(record["micro_batches"]) == grouping_of(again.micro_batches)
    for before, record in itertools.pairwise(records):
        if record["grouping"] == "fallback":
            assert grouping_of(record["micro_batches"]) == fallback_grouping(grouping_of(before["micro_batches"]),
                                                                            record["lengths"])
    mixed = [r for r in records if any(len({g["sp"] for g in mb["groups"]}) > 1 for mb in r["micro_batches"])]
    assert mixed, "no step mixed group sizes within a micro-batch"


def test_a_late_plan_falls_back_and_no_second_solve_is_queued(monkeypatch: pytest.MonkeyPatch) -> None:
    doc = plan_doc()
    run = FlexSPRun(doc, 4)
    real = flexsp_train.solve

    def slow(request: dict[str, Any]) -> Any:
        time.sleep(0.5)
        return real(request)

    monkeypatch.setattr(flexsp_train, "solve", slow)
    planner = Planner(run)
    lengths = stream()[:SEQUENCES]
    planner.ask(1, lengths)
    grouping, _, why = planner.answer(1, budget_s=0.05)
    assert grouping is None and why is not None and why.startswith("late")
    planner.ask(2, lengths)  # the late solve still runs: not queued behind it
    assert planner.answer(2, budget_s=0.05)[2] == "not asked: the previous solve was still running"
    time.sleep(0.8)
    planner.ask(3, lengths)
    grouping, _, why = planner.answer(3, budget_s=5.0)
    assert why is None and grouping == grouping_of(real(run.request_for(lengths)).micro_batches)
    planner.close()


def test_the_fallback_keeps_the_blocks_and_deals_every_sequence_once() -> None:
    previous = ((Group(2, 0, 1, (0,)), Group(1, 2, 2, (1,)), Group(1, 3, 3, ())), (Group(4, 0, 3, (2,)),))
    lengths = [300, 20, 180, 90, 60, 10]
    got = fallback_grouping(previous, lengths)
    assert [[(g.sp, g.first, g.last) for g in mb] for mb in got] == [[(g.sp, g.first, g.last) for g in mb]
                                                                    for mb in previous]
    assert sorted(i for mb in got for g in mb for i in g.sequences) == list(range(len(lengths)))
    assert 0 in got[1][0].sequences and 2 in got[0][0].sequences  # longest to the widest block, next to sp2


@pytest.mark.parametrize("sp", [1, 2, 4])
def test_the_static_sp_baseline_groups_every_sequence_in_groups_of_its_degree(sp: int) -> None:
    run, lengths = FlexSPRun(plan_doc(), 4), stream()[:SEQUENCES]
    grouping = static_grouping(run, lengths, sp)
    assert {g.sp for mb in grouping for g in mb} == {sp} and run.problems(grouping, len(lengths)) == []


def test_a_plan_the_runtime_cannot_run_exactly_is_refused_naming_the_field() -> None:
    doc = plan_doc()
    with pytest.raises(SpecError) as err:
        FlexSPRun(doc, 2)
    assert err.value.problems[0].loc[:2] == ("request", "cluster")
    two_nodes = {**doc, "request": {**doc["request"], "cluster": {"gpu": "cpu", "nodes": 2, "gpus_per_node": 2}}}
    bf16 = {**doc, "request": {**doc["request"], "precision": "bf16"}}
    wide = json.loads(json.dumps(doc))
    wide["request"]["model"]["num_attention_heads"] = 2  # an sp4 group cannot split 2 heads
    wide["result"]["micro_batches"] = [{"time_s": 0.0, "groups": [
        {"sp": 4, "ranks": [0, 3], "sequences": list(range(SEQUENCES))}]}]
    for bad, loc in ((two_nodes, ("request", "cluster", "nodes")), (bf16, ("request", "precision")),
                     (wide, ("result", "micro_batches", 0, "groups", 0, "sp"))):
        with pytest.raises(SpecError) as err:
            check_flexsp_runnable(bad)
        assert [p.loc for p in err.value.problems] == [loc]


SEPARATOR = 127  # the tiny model's last token id ends each document of the test datasets


def write_documents(path: Path, lengths: list[int], seed: int = 0) -> list[np.ndarray]:
    """A uint16 token file of documents of ``lengths`` (random ids below the separator), each ended by it; returns
    each document's ids."""
    rng = np.random.default_rng(seed)
    docs = [rng.integers(0, SEPARATOR, n).astype(np.uint16) for n in lengths]
    np.concatenate([np.append(d, np.uint16(SEPARATOR)) for d in docs]).tofile(path)
    return docs


def test_a_document_file_cuts_at_separators_and_drops_what_it_cannot_train(tmp_path: Path) -> None:
    """Documents are the runs of tokens before each separator: an empty one (two separators in a row), one longer
    than the limit and the tokens after the last separator (an unfinished document) are dropped; a document's
    sequence is its tokens and the separator; batches are consecutive documents, cycling."""
    path = tmp_path / "tokens.bin"
    docs = write_documents(path, [5, 3, 700, 2])
    with path.open("ab") as f:  # an empty document, one more of 4, and an unfinished tail
        np.array([SEPARATOR, 1, 2, 3, 4, SEPARATOR, 9, 9], dtype=np.uint16).tofile(f)
    got = DocumentFile(path, "uint16", 128, SEPARATOR, max_length=512)
    assert list(got.lengths) == [5, 3, 2, 4] and len(got) == 4
    assert got.sequence(0).tolist() == [*docs[0].tolist(), SEPARATOR]
    assert got.sequence(2).tolist() == [*docs[3].tolist(), SEPARATOR]
    assert got.sequence(3).tolist() == [1, 2, 3, 4, SEPARATOR]
    assert got.batch(0, 3) == [0, 1, 2] and got.batch(1, 3) == [3, 0, 1]
    with pytest.raises(ValueError, match=r"no document of 1\.\.1 tokens"):
        DocumentFile(path, "uint16", 128, SEPARATOR, max_length=1)
    with pytest.raises(ValueError, match="outside the model's vocabulary"):
        DocumentFile(path, "uint16", 100, 5, max_length=512)


@pytest.mark.slow
def test_a_dataset_run_trains_the_files_documents_with_their_planned_groupings(tmp_path: Path) -> None:
    """Through the launch path with a tokenized dataset: every step, the first too, trains the next block of the
    file's documents (their lengths, in file order), grouped by the planner for that block; step 0's loss is the
    single-process model's on those documents' own tokens (the synthetic tokens of the same lengths miss it)."""
    lengths = stream()[:4 * SEQUENCES]
    path = tmp_path / "tokens.bin"
    docs = write_documents(path, lengths, seed=1)
    doc = plan_doc()
    steps = 3
    metrics = run_locally(doc, Launch(4, dataset=path, document_separator=SEPARATOR, max_length=MAX_LENGTH,
                                      plan_budget_s=10.0), steps, tmp_path / "work", timeout_s=150, max_launches=1)
    records = metrics["flexsp_steps"]
    assert [r["documents"] for r in records] == [list(range(k * SEQUENCES, (k + 1) * SEQUENCES)) for k in range(steps)]
    assert [r["lengths"] for r in records] == [lengths[k * SEQUENCES:(k + 1) * SEQUENCES] for k in range(steps)]
    assert records[0]["grouping"] == "planned"
    run = FlexSPRun(doc, 4)
    assert grouping_of(records[0]["micro_batches"]) == grouping_of(solve(run.request_for(lengths[:SEQUENCES]))
                                                                   .micro_batches)
    model = build_model(ModelConfig.from_spec(run.request.model), seed=0)

    def token_mean_loss(sequences: list[torch.Tensor]) -> float:
        with torch.no_grad():
            total = sum(float(F.cross_entropy(model(t[None, :-1]).flatten(0, 1), t[1:], reduction="sum"))
                        for t in sequences)
        return total / sum(len(t) - 1 for t in sequences)

    own = [torch.tensor([*d.tolist(), SEPARATOR]) for d in docs[:SEQUENCES]]
    synthetic = [flexsp_train.sequence_tokens(128, n, 0, 0, i) for i, n in enumerate(lengths[:SEQUENCES])]
    assert abs(metrics["loss"][0] - token_mean_loss(own)) < 1e-4
    assert abs(metrics["loss"][0] - token_mean_loss(synthetic)) > 1e-2
