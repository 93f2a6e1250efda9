"""Plans built in one process share their process groups (``worker.runtime.groups``): on two real gloo ranks, a
plan built again (also inside a second, nested open) adds no group, each set of ranks has one group, and the plans
train as when built alone."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.distributed as dist

from tests.worker.plans import plan_doc
from tests.worker.two_ranks import on_two_ranks
from worker.runtime.data import global_batch
from worker.runtime.groups import shared_process_groups
from worker.runtime.parallelize import ParallelModel, parallelize
from worker.runtime.plan import from_document, load_plan

TP2 = plan_doc(world=2, gbs=4, seq=16, tp=2, sp="megatron")
DP2_ZERO3 = plan_doc(world=2, gbs=4, seq=16, dp=2, zero=3)


def _build(doc: dict[str, Any]) -> ParallelModel:
    return parallelize(from_document(*load_plan(doc), world_size=2), 0, torch.device("cpu"))


def _groups_in_the_world() -> int:
    return len(dist.distributed_c10d._world.pg_map)


def _first_loss(model: ParallelModel) -> float:
    plan = model.plan
    return model.train_step(global_batch(plan.model.vocab_size, plan.global_batch_size, plan.seq_length, 0, 0))


def _build_twice(rank: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    alone = _build(TP2)
    before = _groups_in_the_world()
    _build(TP2)
    out["unshared_again"] = _groups_in_the_world() - before  # the negative control: new groups every build
    with shared_process_groups() as groups:
        first = _build(TP2)
        after_first = _groups_in_the_world()
        other = _build(DP2_ZERO3)
        with shared_process_groups() as inner:  # opened again inside (as the profiler does): the outer's groups
            again = _build(TP2)
            out["inner_is_outer"] = inner is groups
        out["shared_again"] = _groups_in_the_world() - after_first
        out["keys"] = sorted(groups)
        out["losses"] = [_first_loss(m) for m in (first, other, again)]
    out["alone"] = [_first_loss(alone), _first_loss(_build(DP2_ZERO3))]
    return out


def test_plans_built_in_one_process_share_their_groups_and_train_as_alone() -> None:
    got = on_two_ranks(_build_twice)
    for out in got.values():
        assert out["unshared_again"] > 0
        assert out["shared_again"] == 0  # another plan and the first plan again: every group already there
        assert out["inner_is_outer"]
        ranks = [k[0] for k in out["keys"]]
        assert len(ranks) == len(set(ranks))  # one group per set of ranks
        first, other, again = out["losses"]
        assert first == pytest.approx(out["alone"][0], abs=1e-6) and again == pytest.approx(first, abs=1e-6)
        assert other == pytest.approx(out["alone"][1], abs=1e-6)
    assert got[0]["losses"] == pytest.approx(got[1]["losses"], abs=1e-6)
