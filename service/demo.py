"""The demo plan seeded on first start (``PARAPLAN_SEED_DEMO_PLAN=true``, set by ``make run``)."""

from __future__ import annotations

import logging
from typing import Any

from service import plans
from service.context import ServiceContext
from service.validation import available_kinds, validate_plan_request

log = logging.getLogger("paraplan.demo")

_CLUSTER = {"gpu": "A100-80GB", "nodes": 1, "gpus_per_node": 8}
DEMO_REQUESTS: dict[str, dict[str, Any]] = {
    "hybrid": {"kind": "hybrid", "model": {"preset": "llama2-7b"}, "cluster": _CLUSTER,
               "training": {"global_batch_size": 64, "seq_length": 2048}},
    "flexsp": {"kind": "flexsp", "model": {"preset": "llama2-7b"}, "cluster": _CLUSTER,
               "batch": {"sequence_lengths": [32768, 16384, 8192, 4096, 4096, 2048, 1024, 1024, 512, 512]}},
    "spindle": {"kind": "spindle", "cluster": _CLUSTER, "workload": {
        "metaops": [{"name": "vision", "task": "cap", "batch_size": 64, "num_layers": 24,
                     "time_ms_per_layer": {"slope_ms_per_sample": 0.29, "intercept_ms": 0.94}},
                    {"name": "llm", "task": "cap", "batch_size": 64, "num_layers": 32,
                     "time_ms_per_layer": {"slope_ms_per_sample": 0.5, "intercept_ms": 1.2}}],
        "edges": [["vision", "llm"]]}},
}


def seed_demo_plan(ctx: ServiceContext) -> str | None:
    """Queue one demo request if no plan exists yet; returns its plan id (None when nothing was seeded)."""
    with ctx.db.reading() as session:
        if plans.count_plans(session):
            return None
    for kind in available_kinds():
        request = DEMO_REQUESTS[kind]
        try:
            validate_plan_request(request, ctx.settings)
        except Exception as err:
            log.warning("demo %s request rejected: %s", kind, err)
            continue
        view, _ = plans.submit_plan(ctx.db, request, kind, ctx.settings.job_max_attempts)
        log.info("seeded demo plan %s (%s)", view["id"], kind)
        return str(view["id"])
    log.warning("no solver available: no demo plan seeded")
    return None
