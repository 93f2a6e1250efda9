"""``estimate(request)`` for hybrid strategies: what-if time and memory of a given plan (the contract's
``POST /v1/estimate`` and ``paraplan estimate``)."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from solvers.cost_model.factory import make_cost_model, plan_from_dict, plan_from_shorthand
from solvers.cost_model.validate import check_plan
from solvers.errors import SpecError
from solvers.json_file import json_kind, read_json_file
from solvers.request import HybridRequest, parse
from solvers.strategy import PlanStrategy
from solvers.unknown_keys import unknown_key_problems


def galvatron_plan_file(path: str, profiles_dir: Any) -> Path:
    """The file a Galvatron ``strategy.path`` names: as given when absolute, else under ``profiles_dir`` (a str)
    where it is there, else under the working directory (else the profiles_dir one, to name it as missing). The
    service holds this path, the one read, to its data roots."""
    p = Path(path)
    if p.is_absolute():
        return p
    candidates = [Path(profiles_dir) / p] if isinstance(profiles_dir, str) else []
    candidates.append(Path.cwd() / p)
    return next((c for c in candidates if c.is_file()), candidates[0])


def _galvatron_plan(strategy: dict[str, Any], req: HybridRequest) -> PlanStrategy:
    if unknown := unknown_key_problems(strategy, ("format", "path"), ("strategy",)):
        raise SpecError(unknown)
    path = strategy.get("path")
    if not isinstance(path, str) or not path:
        raise SpecError.at(("strategy", "path"), "a Galvatron plan needs the path of its galvatron_config_*.json")
    p = galvatron_plan_file(path, (req.cost_model.model_extra or {}).get("profiles_dir"))
    config = read_json_file(p, ("strategy", "path"))
    if not isinstance(config, dict):
        raise SpecError.at(("strategy", "path"),
                           f"{p} holds {json_kind(config)}, not a Galvatron config (a JSON object)")
    try:
        formats = importlib.import_module("solvers.formats.galvatron")
    except ModuleNotFoundError:
        raise SpecError.at(("strategy", "format"), "the Galvatron plan format is not available") from None
    plan: PlanStrategy = formats.plan_from_galvatron_config(config, req.cluster.num_gpus)
    problems = check_plan(plan, req.model, req.cluster, req.training)
    if problems:
        raise SpecError(problems)
    return plan


def plan_of_request(req: HybridRequest) -> PlanStrategy:
    """The request's ``strategy`` in any of its three forms, validated against model and cluster."""
    strategy = req.strategy
    if strategy is None:
        raise SpecError.at(("strategy",), "an estimate needs a strategy")
    fmt = strategy.get("format")
    if fmt is not None:
        if fmt != "galvatron":
            raise SpecError.at(("strategy", "format"), f"unknown plan format {fmt!r}; known: galvatron")
        return _galvatron_plan(strategy, req)
    if "layers" in strategy:
        return plan_from_dict(strategy, req.model, req.cluster, req.training)
    return plan_from_shorthand(strategy, req.model, req.cluster, req.training)


def estimate(request: dict[str, Any]) -> dict[str, Any]:
    """The contract's ``estimate`` object for the request's strategy (plus the expanded ``strategy``)."""
    req: HybridRequest = parse(HybridRequest, request)
    plan = plan_of_request(req)
    model = make_cost_model(req)
    result = model.evaluate(plan).to_json()
    result["strategy"] = plan.to_dict()
    result["cost_model"] = req.cost_model.kind
    return result
