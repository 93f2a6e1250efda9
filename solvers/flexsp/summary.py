"""A FlexSP plan in a few lines of text: its step, how far from the lower bound, and the static SP degrees it
is compared with."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from solvers.documents.flexsp import FlexSPResult
from solvers.text import baseline_line, seconds, within_bound


def summarise(request: Mapping[str, Any], result: FlexSPResult) -> list[str]:
    step = result.estimate.step_time_s
    base = result.baselines
    lines = [f"flexsp: step {seconds(step)}", *within_bound(step, result.lower_bound_s),
             "baselines (same cost model):"]
    lines += [baseline_line(f"static sp {degree}", t, step) for degree, t in base.static_sp.items()]
    # no static degree fits: nothing is best
    lines.append(f"  best static sp: {base.best_static_sp if base.best_static_sp is not None else 'none fits'}")
    if base.static_sp_rule is not None:
        lines.append(f"  static sp rule: {base.static_sp_rule}")
    return lines
