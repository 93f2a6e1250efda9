from __future__ import annotations

from types import ModuleType
from typing import Any

import pytest

from tests.bench_module import load_bench


@pytest.fixture(scope="module")
def fidelity(request: pytest.FixtureRequest) -> ModuleType:
    """bench/fidelity.py loaded as a module (a script, not a package), once per test module."""
    name = f"bench_fidelity_{request.module.__name__.rsplit('.', 1)[-1]}"
    return load_bench("fidelity.py", name)


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "hybrid",
        "model": {"preset": "llama2-7b"},
        "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_length": 2048},
    }
    base.update(overrides)
    return base
