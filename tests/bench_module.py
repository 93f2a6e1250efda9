"""bench/ scripts loaded as modules: they are scripts, not a package, and tests reuse their functions."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

BENCH = Path(__file__).resolve().parents[1] / "bench"


def load_bench(script: str, name: str | None = None) -> ModuleType:
    """Execute bench/<script> as the module `name` (registered in sys.modules: dataclasses look it up there)."""
    name = name or f"bench_{Path(script).stem}"
    spec = importlib.util.spec_from_file_location(name, BENCH / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module
