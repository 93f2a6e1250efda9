"""Runs: a succeeded plan executed by workers, leased like a solver job (claim, heartbeat, complete/fail).

Every write by a worker is conditional on it holding a lease of a running run, so a run completes exactly once
and a worker that lost its lease learns it (409) and aborts.

A run on N nodes is claimed all-or-nothing: workers that can hold a node's ranks join it one by one while it
is queued (each keeps its place by polling ``claim``; a member that stops polling drops out), and it starts only
when N have joined: then each member holds its own lease (one per node), the first to join is node 0 (the
c10d rendezvous endpoint), and each gets the run from its next claim. When any node's lease expires, or any
node fails, the whole run goes back to the queue (a new attempt, all nodes again) and the other nodes learn it
from the 409 of their next heartbeat.
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from service.calibration_sets import resolved
from service.db.engine import Database
from service.db.models import Plan, PlanRequest, Run, utcnow
from service.errors import Conflict, Forbidden, NotFound, NotRunnable, get_or_404
from service.tokens import Principal
from service.workers import owned_worker, workers_of_token
from solvers.documents import TERMINAL, FlexSPResult, HybridResult, PlanResult, SpindleResult, load_result
from solvers.documents.hybrid import HybridEstimate
from solvers.errors import FieldProblem, SpecError
from solvers.run_layout import check_runnable, dataset_problems, runtime_request
from solvers.run_spindle import SpindleProgram


def predicted_of(result: PlanResult | None) -> dict[str, Any]:
    """What the plan predicts a run measures: its step (a Spindle iteration) and its peak memory per GPU; for a
    hybrid plan also the constants it was priced with (``calibration_set``: a stored set's name, version and why it
    was chosen, or null name for the shipped constants)."""
    if isinstance(result, HybridResult):
        return _hybrid_predicted(result.estimate)
    if isinstance(result, FlexSPResult):
        return {"step_time_s": result.estimate.step_time_s, "peak_memory_gib": result.estimate.peak_memory_gib}
    if isinstance(result, SpindleResult):
        return {"step_time_s": result.estimate.iteration_time_s, "peak_memory_gib": result.estimate.peak_memory_gib}
    return {"step_time_s": None, "peak_memory_gib": None}


def _hybrid_predicted(estimate: HybridEstimate) -> dict[str, Any]:
    used = estimate.calibration_set
    return {"step_time_s": estimate.step_time_s, "peak_memory_gib": estimate.peak_memory_gib,
            "calibration_set": None if used is None else {"name": used.name, "version": used.version,
                                                           "chosen_by": used.chosen_by}}


def runtime_predicted(session: Session, request: dict[str, Any], result: HybridResult) -> dict[str, Any]:
    """What a run of a hybrid plan should measure: the plan's strategy priced on the stack the runtime runs
    (``solvers.run_layout.RUNTIME_STACK``) with the newest calibration set stored for its GPU type and that stack,
    else the shipped constants; ``stack`` says what was priced, and where the plan was priced for another stack,
    ``plan_step_time_s`` keeps the plan's own figure. Where the runtime's stack cannot be priced, the plan's
    prediction with a ``note`` that says so."""
    from solvers.api import estimate

    ask = resolved(session, runtime_request(request))
    try:
        doc = estimate({**ask, "strategy": result.strategy.to_json()})
    except SpecError as err:
        return {**predicted_of(result), "note": f"priced for the plan's stack: the runtime's could not be ({err})"}
    assert isinstance(doc, HybridEstimate)
    out = _hybrid_predicted(doc)
    out["stack"] = None if doc.stack is None else doc.stack.model_dump(mode="json")
    if result.estimate.stack != doc.stack:
        out["plan_step_time_s"] = result.estimate.step_time_s
    return out


def run_view(run: Run) -> dict[str, Any]:
    return {"id": run.id, "plan_id": run.plan_id, "status": run.status, "worker": run.worker_id,
            "steps": run.steps, "attempts": run.attempts, "attempt": run.attempts,
            "resumed_from_step": run.resumed_from_step, "checkpoint_every_steps": run.checkpoint_every_steps,
            "dataset": run.dataset, "nodes_needed": run.nodes_needed,
            "nodes": [{k: n[k] for k in ("worker_id", "node_rank", "host")} for n in run.nodes or []],
            "error": run.error, "metrics": run.metrics or {},
            "predicted": run.predicted or {}, "progress": run.progress or [],
            "lease_expires_at": run.lease_expires_at, "created_at": run.created_at,
            "started_at": run.started_at, "finished_at": run.finished_at}


def create_run(session: Session, plan_id: str, steps: int, max_attempts: int, checkpoint_every_steps: int | None = None,
               dataset: dict[str, Any] | None = None) -> dict[str, Any]:
    plan = get_or_404(session, Plan, plan_id, "plan")
    if plan.status != "succeeded":
        raise Conflict(f"plan {plan_id} is {plan.status}; only a succeeded plan can be run")
    request = session.get(PlanRequest, plan.request_id)
    assert request is not None  # a foreign key
    try:  # the worker's own test: a run is queued only when it will execute this plan as planned
        layout = check_runnable({"kind": plan.kind, "request": request.request, "result": plan.result})
    except SpecError as err:
        raise NotRunnable(err.problems) from None
    if plan.kind in ("flexsp", "spindle"):  # their runtimes keep no checkpoints; Spindle's trains synthetic tokens
        kind = {"flexsp": "FlexSP", "spindle": "Spindle"}[plan.kind]
        refused = [FieldProblem((name,), f"a {kind} run takes no {name} (its runtime has none yet)")
                   for name, value in (("dataset", dataset if plan.kind == "spindle" else None),
                                       ("checkpoint_every_steps", checkpoint_every_steps))
                   if value]
        if refused:
            raise SpecError(refused)
    if dataset is not None:
        assert not isinstance(layout, SpindleProgram)  # refused above
        problems = dataset_problems(dataset["path"], dataset["dtype"], layout.vocab_size,
                                    dataset.get("document_separator"), by_document=plan.kind == "flexsp")
        if problems:
            raise SpecError(problems)
    result = load_result(plan.kind, plan.result) if plan.result else None
    predicted = (runtime_predicted(session, request.request, result) if isinstance(result, HybridResult)
                 else predicted_of(result))
    run = Run(plan_id=plan_id, steps=steps, status="queued", max_attempts=max_attempts, predicted=predicted,
              progress=[], checkpoint_every_steps=checkpoint_every_steps, dataset=dataset, nodes_needed=layout.nodes,
              ranks_per_node=layout.ranks_per_node, nodes=[])
    session.add(run)
    session.flush()
    return run_view(run)


def _readable(session: Session, run: Run, principal: Principal) -> None:
    if principal.scope == "worker" and principal.token_id is not None and (
        run.worker_id is None or run.worker_id not in workers_of_token(session, principal.token_id)
    ):
        raise Forbidden(f"run {run.id} is not held by a worker of this token")


def get_run(session: Session, run_id: str, principal: Principal) -> dict[str, Any]:
    run = get_or_404(session, Run, run_id, "run")
    _readable(session, run, principal)
    return run_view(run)


def list_runs(session: Session, principal: Principal, plan_id: str | None = None, status: str | None = None,
              limit: int = 100) -> list[dict[str, Any]]:
    query = select(Run).order_by(Run.created_at.desc()).limit(limit)
    if plan_id:
        query = query.where(Run.plan_id == plan_id)
    if status:
        query = query.where(Run.status == status)
    if principal.scope == "worker" and principal.token_id is not None:
        query = query.where(Run.worker_id.in_(workers_of_token(session, principal.token_id)))
    return [run_view(r) for r in session.execute(query).scalars()]


def _iso(t: datetime) -> str:
    return t.isoformat()


def _expired(node: dict[str, Any], now: datetime) -> bool:
    return datetime.fromisoformat(node["lease_expires_at"]) < now


def _requeue_or_fail(run: Run, reason: str, now: datetime) -> None:
    """The whole run back to the queue (every node again), or failed on its last attempt."""
    if run.attempts >= run.max_attempts:
        run.status, run.finished_at = "failed", now
        reason = f"{reason} (gave up after {run.attempts} attempts)"
    else:
        run.status, run.nodes = "queued", []
    run.error, run.lease_expires_at = reason, None


def reap_expired_runs(session: Session) -> int:
    """Runs with a node whose worker stopped renewing: back to queued, whole, or failed on the last attempt; and
    members of gathering runs that stopped polling leave them (a run never starts on fewer nodes)."""
    now = utcnow()
    expired = session.execute(
        select(Run).where(Run.status == "running", Run.lease_expires_at < now).with_for_update(skip_locked=True)
    ).scalars().all()
    for run in expired:
        lost = [n["worker_id"] for n in run.nodes or [] if _expired(n, now)] or [run.worker_id]
        _requeue_or_fail(run, f"lease of worker {', '.join(map(str, lost))} expired (attempt {run.attempts} of "
                              f"{run.max_attempts}); the run restarts on all its nodes", now)
    gathering = session.execute(
        select(Run).where(Run.status == "queued", Run.nodes_needed > 1).with_for_update(skip_locked=True)
    ).scalars().all()
    for run in gathering:
        kept = [n for n in run.nodes or [] if not _expired(n, now)]
        if len(kept) != len(run.nodes or []):
            run.nodes = [{**n, "node_rank": i} for i, n in enumerate(kept)]
    return len(expired)


def _claimed_view(session: Session, run: Run, worker_id: str) -> dict[str, Any]:
    plan, request = session.execute(
        select(Plan, PlanRequest.request).join(PlanRequest, PlanRequest.id == Plan.request_id)
        .where(Plan.id == run.plan_id)
    ).one()
    nodes = run.nodes or []
    me = next(n for n in nodes if n["worker_id"] == worker_id)
    return {"id": run.id, "plan_id": run.plan_id, "steps": run.steps, "attempt": run.attempts,
            "lease_expires_at": run.lease_expires_at, "checkpoint_every_steps": run.checkpoint_every_steps,
            "dataset": run.dataset, "nnodes": run.nodes_needed, "node_rank": me["node_rank"],
            "rendezvous_endpoint": nodes[0].get("endpoint") if run.nodes_needed > 1 else None,
            "plan": {"id": plan.id, "kind": plan.kind, "request": request,
                     "result": load_result(plan.kind, plan.result) if plan.result else None}}


def _start(run: Run, now: datetime, lease_s: float) -> None:
    lease = now + timedelta(seconds=lease_s)
    run.status, run.attempts, run.resumed_from_step = "running", run.attempts + 1, None
    run.worker_id = run.nodes[0]["worker_id"] if run.nodes else None
    run.nodes = [{**n, "lease_expires_at": _iso(lease), "told": False} for n in run.nodes or []]
    run.lease_expires_at = lease
    run.started_at = run.started_at or now


def claim_run(db: Database, worker_id: str, principal: Principal, lease_s: float,
              endpoint: str | None = None) -> dict[str, Any] | None:
    """The run this worker is to execute now, or None. A worker in a run gathering its nodes keeps its place by
    calling again (``endpoint``: where it would host the rendezvous as node 0)."""
    with db.writing() as session:
        worker = owned_worker(session, worker_id, principal)
        now = utcnow()
        worker.last_heartbeat = now
        reap_expired_runs(session)
        for member_of in session.execute(select(Run).where(Run.status.in_(("queued", "running")),
                                                           Run.nodes_needed > 1).with_for_update()).scalars():
            nodes = list(member_of.nodes or [])
            mine = next((n for n in nodes if n["worker_id"] == worker_id), None)
            if mine is None:
                continue
            if member_of.status == "running":
                if mine.get("told"):
                    continue  # this node has run its part; the run's result is node 0's to report
                member_of.nodes = [{**n, "told": True} if n is mine else n for n in nodes]
                return _claimed_view(session, member_of, worker_id)
            member_of.nodes = [{**n, "lease_expires_at": _iso(now + timedelta(seconds=lease_s)),
                                "endpoint": endpoint or n.get("endpoint")} if n is mine else n for n in nodes]
            return None  # still gathering: keep polling
        fitting = (Run.ranks_per_node <= worker.gpus) if worker.gpus else (Run.nodes_needed == 1)
        run = session.execute(
            select(Run).where(Run.status == "queued", fitting).order_by(Run.created_at).limit(1)
            .with_for_update(skip_locked=True)
        ).scalar_one_or_none()
        if run is None:
            return None
        node = {"worker_id": worker_id, "node_rank": len(run.nodes or []), "host": worker.host, "endpoint": endpoint,
                "lease_expires_at": _iso(now + timedelta(seconds=lease_s))}
        run.nodes = [*(run.nodes or []), node]
        if len(run.nodes) < run.nodes_needed:
            return None  # joined; it starts when every node has
        _start(run, now, lease_s)
        run.nodes = [{**n, "told": True} if n["worker_id"] == worker_id else n for n in run.nodes]
        return _claimed_view(session, run, worker_id)


def _held_run(session: Session, run_id: str, worker_id: str, principal: Principal) -> Run:
    owned_worker(session, worker_id, principal)
    run = session.execute(select(Run).where(Run.id == run_id).with_for_update()).scalar_one_or_none()
    if run is None:
        raise NotFound(f"run {run_id} not found")
    if run.status in TERMINAL:
        raise Conflict(f"run {run_id} is already {run.status}")
    # A lease past its expiry is honoured until a claim reaps it (status back to queued): a late heartbeat
    # from a live worker is not a crash.
    members = [n["worker_id"] for n in run.nodes or []] or [run.worker_id]
    if run.status != "running" or worker_id not in members:
        raise Conflict(f"worker {worker_id} does not hold a lease of run {run_id}")
    return run


def _renew(run: Run, worker_id: str, lease_s: float) -> None:
    """Renew this node's lease; the run's lease is its earliest node's."""
    lease = utcnow() + timedelta(seconds=lease_s)
    if not run.nodes:
        run.lease_expires_at = lease
        return
    run.nodes = [{**n, "lease_expires_at": _iso(lease)} if n["worker_id"] == worker_id else n for n in run.nodes]
    run.lease_expires_at = min(datetime.fromisoformat(n["lease_expires_at"]) for n in run.nodes)


def heartbeat_run(db: Database, run_id: str, worker_id: str, principal: Principal, lease_s: float) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        _renew(run, worker_id, lease_s)
        return {"lease_expires_at": run.lease_expires_at}


def report_metrics(db: Database, run_id: str, worker_id: str, principal: Principal, lease_s: float,
                   point: dict[str, Any]) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        # one point per (attempt, step): a worker's retried report (its response lost) replaces its first instead
        # of doubling it, and a retried run's points stay apart from the failed attempt's
        point = {**point, "attempt": run.attempts}
        progress = list(run.progress or [])
        key = (run.attempts, point["step"])
        at = next((i for i, p in enumerate(progress) if (p.get("attempt"), p.get("step")) == key), None)
        if at is None:
            progress.append(point)
        else:
            progress[at] = point
        run.progress = progress[-10_000:]
        if point.get("resumed_from_step") is not None:
            run.resumed_from_step = point["resumed_from_step"]
        _renew(run, worker_id, lease_s)
        return {"ok": True, "lease_expires_at": run.lease_expires_at}


def complete_run(db: Database, run_id: str, worker_id: str, principal: Principal,
                 metrics: dict[str, Any]) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        run.status, run.metrics, run.finished_at, run.lease_expires_at = "succeeded", metrics, utcnow(), None
        run.error = None
        return run_view(run)


def fail_run(db: Database, run_id: str, worker_id: str, principal: Principal, error: str,
             retryable: bool) -> dict[str, Any]:
    with db.writing() as session:
        run = _held_run(session, run_id, worker_id, principal)
        if retryable:
            _requeue_or_fail(run, error, utcnow())
        else:
            run.status, run.finished_at, run.error, run.lease_expires_at = "failed", utcnow(), error, None
        return run_view(run)


def cancel_run(db: Database, run_id: str) -> dict[str, Any]:
    with db.writing() as session:
        run = get_or_404(session, Run, run_id, "run")
        if run.status in TERMINAL:
            raise Conflict(f"run {run_id} is already {run.status}")
        run.status, run.finished_at, run.lease_expires_at = "cancelled", utcnow(), None
        return run_view(run)
