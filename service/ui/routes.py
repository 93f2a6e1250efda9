"""The dashboard's HTML pages (server-rendered Jinja2) and its static files, as one APIRouter.

Pages: ``/`` plans list, ``/plans/new`` the submit form, ``/plans/{id}`` one plan (a page per kind, with
"Run this plan"), ``/runs`` the runs, ``/runs/{id}`` one run, ``/workers`` the workers. ``/ui/status`` answers
the pages' status poller; ``/ui/static/...`` serves the CSS, script and vendored Chart.js. Each page reports its
server time in a ``Server-Timing`` header.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, assert_never

from fastapi import APIRouter, FastAPI, Query, Request
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from service.context import ServiceContext
from service.errors import DomainError, Unauthorized, http_status
from service.schemas import RunCreate
from service.ui import data, flexsp_view, hybrid_view, plan_form, run_view, spindle_view
from service.ui import format as fmt
from service.ui.request_info import batch_label, cluster_label, headline, model_label
from service.validation import available_kinds
from solvers.documents import (
    DEFAULT_KIND,
    PLAN_KINDS,
    STATUSES,
    TERMINAL,
    FlexSPResult,
    HybridResult,
    PlanResult,
    SpindleResult,
)
from solvers.errors import SpecError
from solvers.exports import FORMATS

HERE = Path(__file__).resolve().parent
STATIC = HERE / "static"
PAGE_SIZE = 50
EXPORT_FORMATS = ("megatron", "deepspeed", "torchtitan", "galvatron")
DEFAULT_RUN_STEPS = RunCreate.model_fields["steps"].default

templates = Jinja2Templates(directory=str(HERE / "templates"))
templates.env.filters.update(fmt.FILTERS)
templates.env.globals.update(TERMINAL=TERMINAL)

router = APIRouter(include_in_schema=False)



def _plan_view(request: dict[str, Any], result: PlanResult) -> tuple[str, Any]:
    """The page of a solved plan: its kind's template and what it shows."""
    if isinstance(result, HybridResult):
        return "plan_hybrid.html", hybrid_view.build(request, result)
    if isinstance(result, FlexSPResult):
        return "plan_flexsp.html", flexsp_view.build(request, result)
    if isinstance(result, SpindleResult):
        return "plan_spindle.html", spindle_view.build(request, result)
    assert_never(result)


def _page(request: Request, template: str, context: dict[str, Any], started: float, status: int = 200) -> Response:
    response = templates.TemplateResponse(request, template, context, status_code=status)
    response.headers["Server-Timing"] = f"app;dur={(time.perf_counter() - started) * 1e3:.1f}"
    return response


def _error_page(request: Request, err: Exception, started: float) -> Response:
    status = http_status(err) or 500
    message = str(err.detail) if isinstance(err, DomainError) else str(err)
    return _page(request, "error.html", {"status": status, "message": message}, started, status)


@router.get("/", response_class=HTMLResponse)
def plans_page(request: Request, kind: str | None = None, status: str | None = None, cursor: str | None = None,
               limit: int = Query(PAGE_SIZE, ge=1, le=200)) -> Response:
    started = time.perf_counter()
    try:
        data.principal(request, "read")
        page = data.list_plans(request, kind=kind or None, status=status or None, cursor=cursor or None, limit=limit)
    except (DomainError, SpecError) as err:
        return _error_page(request, err, started)
    rows = [{**item, **headline(item["kind"], item["estimate"]), "model": model_label(item["request"]),
             "cluster": cluster_label(item["request"])} for item in page["items"]]
    return _page(request, "plans.html", {"rows": rows, "next_cursor": page["next_cursor"], "kind": kind or "",
                                         "status": status or "", "kinds": PLAN_KINDS, "limit": limit,
                                         "statuses": STATUSES}, started)


def _form_context(inp: plan_form.FormInput) -> dict[str, Any]:
    return {"form": inp, "kinds": available_kinds(), "models": plan_form.model_choices(),
            "gpus": plan_form.gpu_choices(), "workloads": list(plan_form.spindle_workloads()),
            "attention_kernels": plan_form.attention_choices()}


@router.get("/plans/new", response_class=HTMLResponse)
def new_plan_form(request: Request, kind: str = DEFAULT_KIND) -> Response:
    started = time.perf_counter()
    try:
        return _page(request, "new_plan.html", _form_context(plan_form.FormInput(kind=kind)), started)
    except DomainError as err:  # a solver that fails to load: the page says which and why
        return _error_page(request, err, started)


@router.post("/plans/new")
async def submit_plan(request: Request) -> Response:
    form = dict(await request.form())
    # Validation and the database write are blocking: keep them off the event loop.
    return await run_in_threadpool(_submit, request, form)


def _submit(request: Request, form: dict[str, Any]) -> Response:
    started = time.perf_counter()
    token = str(form.pop("token", "") or "").strip() or None
    inp = plan_form.read_form(form)
    if inp.errors:
        return _page(request, "new_plan.html", _form_context(inp), started, 422)
    try:
        data.principal(request, "submit", token)
        view, created = data.submit(request, plan_form.to_request(inp))
    except SpecError as err:
        inp.errors = list(err.problems)
        return _page(request, "new_plan.html", _form_context(inp), started, 422)
    except DomainError as err:
        return _page(request, "new_plan.html", {**_form_context(inp), "message": err.detail}, started,
                     http_status(err) or 400)
    # an identical request's plan is shown as what it is: one made before, not a new solve
    response = RedirectResponse(f"/plans/{view['id']}" + ("" if created else "?existing=1"), status_code=303)
    if token:
        response.set_cookie(data.TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


@router.get("/plans/{plan_id}", response_class=HTMLResponse)
def plan_page(request: Request, plan_id: str, existing: bool = False) -> Response:
    return _plan_page(request, plan_id, time.perf_counter(), existing=existing)


def _plan_page(request: Request, plan_id: str, started: float, run_form: dict[str, Any] | None = None,
               status: int = 200, existing: bool = False) -> Response:
    """A plan's page; ``run_form``: what its "Run this plan" form was given, and why it was refused."""
    try:
        caller = data.principal(request, "read")
        plan = data.get_plan(request, plan_id)
        plan_runs = data.runs_of_plan(request, plan_id, caller)
    except (DomainError, SpecError) as err:
        return _error_page(request, err, started)
    req: dict[str, Any] = plan["request"]
    result: PlanResult | None = plan["result"]
    succeeded = plan["status"] == "succeeded" and result is not None
    megatron = result.baselines.get("megatron") if isinstance(result, HybridResult) else None
    context: dict[str, Any] = {
        "plan": plan, "request_doc": req, "model": model_label(req), "cluster": cluster_label(req),
        "batch": batch_label(req), "runs": plan_runs,
        # only a solved plan exports (a failed one has nothing to export) and runs
        "exports": FORMATS if plan["kind"] == "hybrid" and succeeded else (),
        # the best uniform plan exports as it is: what a Megatron-LM user can launch unchanged
        "megatron_baseline": succeeded and megatron is not None and megatron.strategy is not None,
        "run_form": run_form or {"steps": DEFAULT_RUN_STEPS}, "existing": existing,
        "workers_online": sum(w["online"] for w in data.list_workers(request)) if succeeded else 0,
    }
    template = "plan_pending.html"
    if succeeded:
        assert result is not None
        template, context["view"] = _plan_view(req, result)
    return _page(request, template, context, started, status)


@router.post("/plans/{plan_id}/runs")
async def run_plan(request: Request, plan_id: str) -> Response:
    form = dict(await request.form())
    return await run_in_threadpool(_run_plan, request, plan_id, form)


def _run_plan(request: Request, plan_id: str, form: dict[str, Any]) -> Response:
    """The plan page's "Run this plan": queue a run (a submit token, as POST /v1/plans/{id}/runs) and show it."""
    started = time.perf_counter()
    token = str(form.get("token", "") or "").strip() or None
    given = {"steps": str(form.get("steps", "")).strip()}
    try:
        steps = RunCreate.model_validate({"steps": given["steps"] or DEFAULT_RUN_STEPS}).steps
    except ValidationError:
        return _plan_page(request, plan_id, started, {**given, "message": "steps: a whole number from 1 to "
                                                                          "1,000,000"}, 422)
    try:
        data.principal(request, "submit", token)
        run = data.create_run(request, plan_id, steps)
    except DomainError as err:
        return _plan_page(request, plan_id, started, {**given, "message": err.detail}, http_status(err) or 400)
    response = RedirectResponse(f"/runs/{run['id']}", status_code=303)
    if token:
        response.set_cookie(data.TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


@router.get("/runs", response_class=HTMLResponse)
def runs_page(request: Request, status: str | None = None, limit: int = Query(PAGE_SIZE, ge=1, le=500)) -> Response:
    started = time.perf_counter()
    try:
        caller = data.principal(request, "read")
        rows = data.list_runs(request, caller, status or None, limit)
        online = sum(w["online"] for w in data.list_workers(request))
    except (DomainError, SpecError) as err:
        return _error_page(request, err, started)
    return _page(request, "runs.html", {"rows": rows, "status": status or "", "statuses": STATUSES,
                                        "workers_online": online}, started)


@router.get("/workers", response_class=HTMLResponse)
def workers_page(request: Request) -> Response:
    started = time.perf_counter()
    try:
        data.principal(request, "read")
        rows = data.list_workers(request)
    except (DomainError, SpecError) as err:
        return _error_page(request, err, started)
    return _page(request, "workers.html", {"rows": rows, "online_within_s": data.context(request).settings.run_lease_s},
                 started)


@router.get("/runs/{run_id}", response_class=HTMLResponse)
def run_page(request: Request, run_id: str) -> Response:
    started = time.perf_counter()
    try:
        caller = data.principal(request, "read")
        run = data.get_run(request, run_id, caller)
        plan = data.get_plan(request, run["plan_id"])
    except (DomainError, SpecError) as err:
        return _error_page(request, err, started)
    return _page(request, "run.html", {"run": run, "view": run_view.build(run, plan["request"])}, started)


@router.get("/ui/token", response_class=HTMLResponse)
def token_form(request: Request) -> Response:
    return _page(request, "token.html", {}, time.perf_counter())


@router.post("/ui/token")
async def token_submit(request: Request) -> Response:
    form = await request.form()
    return await run_in_threadpool(_remember_token, request, str(form.get("token", "")).strip())


def _remember_token(request: Request, token: str) -> Response:
    """Check a typed token (any scope that may read) and keep it in an HTTP-only cookie for the pages."""
    started = time.perf_counter()
    try:
        if not token:
            raise Unauthorized("paste an API token")
        data.principal(request, "read", token)
    except DomainError as err:
        return _page(request, "token.html", {"message": err.detail}, started, http_status(err) or 401)
    response = RedirectResponse("/", status_code=303)
    response.set_cookie(data.TOKEN_COOKIE, token, httponly=True, samesite="strict")
    return response


@router.get("/ui/status")
def plan_statuses(request: Request, ids: str = "") -> Response:
    """Status of up to one page of plans, for the live poller (small: no results)."""
    wanted = [i for i in ids.split(",") if i][:200]
    try:
        data.principal(request, "read")
        found = data.statuses(request, wanted)
    except (DomainError, SpecError) as err:
        return JSONResponse({"detail": str(err)}, status_code=http_status(err) or 400)
    return JSONResponse(found, headers={"Cache-Control": "no-store"})


@router.get("/ui/static/{path:path}")
def static_file(path: str) -> Response:
    # Served by a route rather than a Mount so that including the router is all an app has to do.
    target = (STATIC / path).resolve()
    if not target.is_relative_to(STATIC) or not target.is_file():
        return Response(status_code=404)
    return FileResponse(target, headers={"Cache-Control": "public, max-age=3600"})


def mount_ui(app: FastAPI, ctx: ServiceContext) -> None:
    """Add the dashboard to ``app``; its pages reach settings, database and token cache through ``ctx`` (kept as
    ``app.state.ctx``, where the API's routes find the same one)."""
    app.state.ctx = ctx
    app.include_router(router)
