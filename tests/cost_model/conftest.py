from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def fidelity(request: pytest.FixtureRequest) -> ModuleType:
    """bench/fidelity.py loaded as a module (a script, not a package), once per test module."""
    name = f"bench_fidelity_{request.module.__name__.rsplit('.', 1)[-1]}"
    spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / "fidelity.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def request(**overrides: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "hybrid",
        "model": {"preset": "llama2-7b"},
        "cluster": {"gpu": "A100-80GB", "nodes": 2, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_length": 2048},
    }
    base.update(overrides)
    return base
