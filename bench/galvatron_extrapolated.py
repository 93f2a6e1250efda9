"""Run the Galvatron 2.4.0 peer runner on 4x8 and 8x8 GPUs, with the shared extrapolated hardware files.

Run with the Galvatron venv's Python, with the runner's own arguments:

    .venv-galvatron/bin/python bench/galvatron_extrapolated.py --nodes 4 --gpus-per-node 8 --memory-gb 36 ...

The PyPI package ships bandwidth files for 1x4, 1x8 and 2x8 GPUs only, and the runner refuses other shapes.
``../shared/reference/galvatron/hardware-extrapolated/`` holds the same formats for 4x8 and 8x8 (extrapolated
from the 2x8 measurements). This launcher gives the runner a hardware folder with those files and the
package's measured overlap coefficient, then runs it unchanged; paraplan reads the same folder.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

SHARED = Path(__file__).resolve().parents[2] / "shared"
RUNNER = SHARED / "peers" / "galvatron_pypi" / "run_galvatron_pypi.py"
EXTRAPOLATED = SHARED / "reference" / "galvatron" / "hardware-extrapolated"


def extrapolated_hardware_dir(pkg_hw_dir: str, nodes: int, gpn: int, workdir: str) -> tuple[str, list[str]]:
    """The runner's ``hardware_dir`` for shapes the package lacks: shared extrapolated files + shipped overlap."""
    shape = f"{nodes}nodes_{gpn}gpus_per_node"
    out = Path(workdir) / "hardware_configs"
    out.mkdir(parents=True, exist_ok=True)
    files = [EXTRAPOLATED / f"{kind}_{shape}.json" for kind in ("allreduce_bandwidth", "p2p_bandwidth", "sp_time")]
    missing = [f.name for f in files if not f.exists()]
    if missing:
        raise SystemExit(f"no extrapolated hardware file {', '.join(missing)} in {EXTRAPOLATED}")
    for f in files:
        shutil.copy(f, out / f.name)
    shutil.copy(Path(pkg_hw_dir) / "overlap_coefficient.json", out / "overlap_coefficient.json")
    return str(out), [f"hardware: {shape} bandwidths extrapolated from 2x8 ({EXTRAPOLATED.name}), "
                      "the package's measured overlap coefficient"]


def main() -> None:
    spec = importlib.util.spec_from_file_location("run_galvatron_pypi", RUNNER)
    assert spec and spec.loader
    runner = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(runner)
    vars(runner)["hardware_dir"] = extrapolated_hardware_dir
    sys.path.insert(0, os.path.dirname(RUNNER))
    runner.main(sys.argv[1:])


if __name__ == "__main__":
    main()
