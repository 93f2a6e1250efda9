"""A small public client for training scripts: ask a paraplan server for a plan, then apply it.

    from worker.client import PlanClient, apply_plan
    plan_doc = PlanClient("http://planner:8000", token).plan(request, wait_s=60)
    pm = apply_plan(plan_doc, my_model, device)          # inside torch.distributed (torchrun)
    for batch in data: loss = pm.train_step(batch)

``apply_plan`` works on any model laid out like ``worker.runtime.model.Decoder``: ``tok_embeddings``,
``layers`` (a ModuleDict of blocks keyed by layer index, each with ``attention.{wq,wk,wv,wo}``,
``feed_forward.{w1,w2[,w3]}``, ``attention_norm``, ``ffn_norm``), ``norm`` and ``output`` - the torchtitan
naming that the tensor-parallel and pipeline functions address. For an MoE plan, the blocks the model spec makes
MoE have a whole ``worker.runtime.moe.MoELayer`` as ``feed_forward`` (identical on every rank: each keeps its
shard).
"""

from __future__ import annotations

import time
from typing import Any

import httpx

from solvers.documents import TERMINAL


class PlanError(RuntimeError):
    """The server rejected the request (``problems`` lists the fields) or the solve failed."""

    def __init__(self, message: str, problems: list[dict[str, Any]] | None = None) -> None:
        super().__init__(message)
        self.problems = problems or []


class PlanClient:
    def __init__(self, server: str, token: str | None = None, timeout_s: float = 30.0) -> None:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=server.rstrip("/"), headers=headers, timeout=timeout_s)

    def __enter__(self) -> PlanClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.http.close()

    def _json(self, resp: httpx.Response) -> dict[str, Any]:
        if resp.status_code >= 400:
            try:
                detail = resp.json().get("detail")
            except ValueError:
                detail = resp.text
            problems = detail if isinstance(detail, list) else None
            raise PlanError(f"HTTP {resp.status_code}: {detail}", problems)
        out: dict[str, Any] = resp.json()
        return out

    def plan(self, request: dict[str, Any], wait_s: float = 120.0, poll_s: float = 0.5) -> dict[str, Any]:
        """Submit a plan request and return the finished plan document (``{"id", "request", "result", ...}``)."""
        created = self._json(self.http.post("/v1/plans", params={"wait": min(wait_s, 30.0)}, json=request,
                                            timeout=min(wait_s, 30.0) + 30.0))
        deadline = time.monotonic() + wait_s
        plan = created
        while plan.get("status") not in TERMINAL or "result" not in plan:
            if time.monotonic() > deadline:
                raise PlanError(f"plan {created['id']} not finished after {wait_s:.0f} s (status {plan.get('status')})")
            time.sleep(poll_s)
            plan = self.get_plan(created["id"])
        if plan["status"] != "succeeded":
            raise PlanError(f"plan {plan['id']} {plan['status']}: {plan.get('error')}")
        return plan

    def get_plan(self, plan_id: str) -> dict[str, Any]:
        return self._json(self.http.get(f"/v1/plans/{plan_id}"))

    def estimate(self, request: dict[str, Any]) -> dict[str, Any]:
        return self._json(self.http.post("/v1/estimate", json=request))


def apply_plan(plan_doc: dict[str, Any], model: Any, device: Any, lr: float = 1e-3) -> Any:
    """Apply a plan document to ``model`` on this rank (process group already initialised); returns a
    ``worker.runtime.parallelize.ParallelModel`` whose ``train_step(tokens)`` trains one global batch."""
    import torch.distributed as dist

    from worker.runtime.parallelize import apply_plan as apply
    from worker.runtime.plan import from_document, load_plan

    plan = from_document(*load_plan(plan_doc), world_size=dist.get_world_size())
    return apply(plan, model, device, lr=lr)
