from __future__ import annotations

from typing import Any

import pytest

from solvers.flexsp.constants import FlexSPConstants, explicit_constants
from solvers.flexsp.workloads import GPT7B_COST_MODEL, GPT7B_MODEL
from solvers.specs import ClusterSpec, ModelSpec


def gpt7b_constants(nodes: int = 8, gpus_per_node: int = 8, memory_gib: float = 30) -> FlexSPConstants:
    cluster = ClusterSpec.model_validate({"gpu": "A100-80GB", "nodes": nodes, "gpus_per_node": gpus_per_node})
    return explicit_constants(GPT7B_COST_MODEL, ModelSpec.model_validate(GPT7B_MODEL), cluster, memory_gib, 3)


@pytest.fixture
def gpt7b() -> Any:
    return gpt7b_constants
