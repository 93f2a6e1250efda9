"""GPU specs for tests."""

from __future__ import annotations

from typing import Any

from solvers.presets import GPU_PRESETS


def datasheet_only(preset: str) -> dict[str, Any]:
    """The preset's datasheet figures without its measured matmul throughput, under a name of its own (a preset's
    name would bring the preset back): its GEMMs are priced at the reference GPU's share of peak, as every GPU's
    were before the presets carried measured figures."""
    figures = {k: v for k, v in GPU_PRESETS[preset].items() if not k.startswith("matmul") and k != "source"}
    return {**figures, "name": f"{preset}-datasheet"}
