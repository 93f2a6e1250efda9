"""Calibration sets over HTTP against a real database (issue 34): fitted from a finished run or from measured steps,
versioned by name, named by a request or picked for its cluster's GPU type and stack, and stated by every
estimate (``estimate.calibration_set``), the shipped constants included.

The "measured" steps are the analytic model's own under other constants (``TRUTH``: slower GEMMs and kernel
launches than the shipped ones), so that a fit has something to find and a second plan a known answer."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest
import sqlalchemy as sa
from sqlalchemy import select

from service import jobs
from service.db.engine import Database
from service.db.models import Job
from solvers.api import solve
from solvers.cost_model.calibration import DEFAULT_CALIBRATION
from solvers.cost_model.fitting import measurement_of, predict_s, profile_measurements
from solvers.cost_model.profile import load_profile
from solvers.run_layout import runtime_request
from solvers.specs import ModelSpec

pytestmark = pytest.mark.db

TRUTH = replace(DEFAULT_CALIBRATION, gemm_eta_max=0.62, kernel_overhead_s=1.5 * DEFAULT_CALIBRATION.kernel_overhead_s)
H100 = {"kind": "hybrid", "model": {"preset": "llama2-7b"},
        "cluster": {"gpu": "H100-SXM", "nodes": 1, "gpus_per_node": 8},
        "training": {"global_batch_size": 64, "seq_length": 2048}}
# nodes whose NVLink runs at 70 % of nominal and network at 40 % besides: what a profile's collectives measure
PROFILED = replace(TRUTH, intra_efficiency=0.7, inter_efficiency=0.4)
# the first plan is one the worker runs exactly (uniform, ZeRO-3: the runtime has no ZeRO-1)
FIRST = {"tp": 2, "pp": 1, "micro_batch_size": 2, "zero": 3}
SECOND = {"tp": 1, "pp": 2, "micro_batch_size": 1, "zero": 1, "recompute": "full"}


def _auth(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def measured_s(request: dict[str, Any], strategy: dict[str, Any]) -> float:
    return predict_s(measurement_of(request, strategy, 1.0), TRUTH)


def _step(client: Any, request: dict[str, Any], strategy: dict[str, Any], token: str) -> dict[str, Any]:
    r = client.post("/v1/estimate", json={**request, "strategy": strategy}, headers=_auth(token))
    assert r.status_code == 200, r.text
    return dict(r.json())


def _solve_queued(client: Any, db: Database, plan_id: str, token: str) -> dict[str, Any]:
    """Solve a queued plan's stored request as the dispatcher does (in this process) and read it back."""
    stored = client.get(f"/v1/plans/{plan_id}", headers=_auth(token)).json()
    with db.writing() as s:
        job = s.execute(select(Job).where(Job.plan_id == plan_id)).scalar_one()
        job.status, job.lease_owner, job.attempts = "running", "test-dispatcher", 1
    assert jobs.complete_job(db, job.id, "test-dispatcher", solve(stored["request"]))
    return dict(client.get(f"/v1/plans/{plan_id}", headers=_auth(token)).json())


def _measured_run(client: Any, db: Database, plan_id: str, tokens: dict[str, str], step_s: float) -> str:
    run = client.post(f"/v1/plans/{plan_id}/runs", json={"steps": 3}, headers=_auth(tokens["submit"])).json()
    worker = client.post("/v1/workers/register", headers=_auth(tokens["worker"]),
                         json={"name": "w", "host": "h100-node", "gpus": 8, "gpu_name": "H100-SXM"}).json()["id"]
    claim = client.post("/v1/runs/claim", json={"worker_id": worker, "wait_s": 0}, headers=_auth(tokens["worker"]))
    assert claim.status_code == 200 and claim.json()["run"]["id"] == run["id"]
    done = client.post(f"/v1/runs/{run['id']}/complete", headers=_auth(tokens["worker"]),
                       json={"worker_id": worker, "metrics": {"step_time_s": step_s}})
    assert done.status_code == 200, done.text
    return str(run["id"])


def test_the_first_run_calibrates_its_cluster_and_the_next_plan_is_priced_closer(
        client: Any, db: Database, make_token: Callable[[str], str]) -> None:
    tokens = {scope: make_token(scope) for scope in ("submit", "worker")}
    submit = tokens["submit"]
    # a run measures paraplan's runtime, whose stack is its own (eager elementwise ops, the gradient sync after
    # the backward, no TP overlap): what a run of a plan on this cluster is priced on
    RUNTIME = runtime_request(H100)
    before = _step(client, RUNTIME, SECOND, submit)
    assert before["calibration_set"]["chosen_by"] == "shipped" and before["calibration_set"]["name"] is None
    assert "none is stored for its GPU type and stack" in before["calibration_set"]["note"]

    # the first plan on the cluster runs, and its measured step fits a set
    # (planned for what the worker runs exactly: a run of another plan is refused)
    first = client.post("/v1/plans", json={**H100, "training": {**H100["training"], "global_batch_size": 32},
                                           "constraints": {"target": "torchtitan"}}, headers=_auth(submit)).json()
    plan = _solve_queued(client, db, first["id"], submit)
    strategy = plan["result"]["strategy"]
    run_id = _measured_run(client, db, first["id"], tokens, measured_s(runtime_request(plan["request"]), strategy))
    r = client.post("/v1/calibration-sets", json={"name": "h100-worker", "runs": [run_id]}, headers=_auth(submit))
    assert r.status_code == 201, r.text
    made = r.json()
    # the set is the runtime's: keyed by its stack, not by the stack the plan's request was priced for
    assert made["version"] == 1 and made["gpu"] == "H100-SXM"
    assert {k: made["stack"][k] for k in ("framework", "elementwise", "dp_overlap", "tp_comm_overlap")} == {
        "framework": "paraplan", "elementwise": "eager", "dp_overlap": False, "tp_comm_overlap": "none"}
    assert made["sources"] == {"runs": [run_id]}
    fit = made["fit"]
    assert fit["measurements"] == 1 and fit["fit_mape"] < fit["start_mape"] and fit["fit_mape"] <= 0.03
    assert fit["held_out_mape"] is None and "one measurement" in fit["held_out_note"]
    # what one run on one node measured, and what it left assumed (no step crossed the network)
    assert fit["identified"] and set(fit["identified"]) < set(fit["keys"])
    assert "inter_efficiency" not in fit["identified"]

    # a second, different plan on that cluster, as the runtime runs it: picked by GPU type and stack, and closer
    # to what it measures
    after = _step(client, RUNTIME, SECOND, submit)
    used = after["calibration_set"]
    assert (used["name"], used["version"], used["chosen_by"]) == ("h100-worker", 1, "cluster")
    assert used["constants"]["gemm_eta_max"] == made["constants"]["gemm_eta_max"] and used["fit"] == fit
    measured, assumed = used["note"].split("measured by them: ")[1].split(", assumed: ")
    assert measured.split(", ") == fit["identified"] and "inter_efficiency" in assumed.split(", ")
    truth = measured_s(RUNTIME, SECOND)
    error_before, error_after = abs(before["step_time_s"] / truth - 1), abs(after["step_time_s"] / truth - 1)
    assert error_after < error_before / 3, (error_before, error_after)
    # a request for another stack (the default: Megatron-core) is not priced with the runtime's set
    other = _step(client, H100, SECOND, submit)["calibration_set"]
    assert other["chosen_by"] == "shipped" and "none is stored for its GPU type and stack" in other["note"]

    # a plan solved on that cluster for the runtime's stack states the set in its stored request and its result
    second = client.post("/v1/plans", json=RUNTIME, headers=_auth(submit)).json()
    assert second["request"]["cost_model"]["resolved_calibration_set"]["name"] == "h100-worker"
    solved = _solve_queued(client, db, second["id"], submit)
    assert solved["result"]["estimate"]["calibration_set"]["name"] == "h100-worker"
    page = client.get(f"/plans/{second['id']}", headers=_auth(submit))
    assert page.status_code == 200 and "calibration set h100-worker v1 (cluster)" in page.text
    assert f"measured by them: {', '.join(fit['identified'])}, assumed: " in page.text

    # the first plan (priced for the default stack with the shipped constants) runs again: this run is predicted
    # for the runtime, with the set, and closer to what it measures than the first run's prediction was
    rerun = _measured_run(client, db, first["id"], tokens, 1.0)
    predicted = client.get(f"/v1/runs/{rerun}", headers=_auth(submit)).json()["predicted"]
    assert predicted["calibration_set"] == {"name": "h100-worker", "version": 1, "chosen_by": "cluster"}
    assert predicted["stack"]["framework"] == "paraplan" and predicted["plan_step_time_s"] > 0
    first_predicted = client.get(f"/v1/runs/{run_id}", headers=_auth(submit)).json()["predicted"]
    assert first_predicted["calibration_set"]["chosen_by"] == "shipped"
    truth = measured_s(runtime_request(plan["request"]), strategy)
    assert abs(predicted["step_time_s"] / truth - 1) < abs(first_predicted["step_time_s"] / truth - 1) / 3
    page = client.get(f"/runs/{rerun}", headers=_auth(submit))
    assert page.status_code == 200 and "calibration set h100-worker v1 (chosen by cluster)" in page.text
    assert "paraplan&#39;s runtime" in page.text or "paraplan's runtime" in page.text
    page = client.get(f"/runs/{run_id}", headers=_auth(submit))
    assert "Predicted with the shipped constants" in page.text


def _profile(truth: Any, model: dict[str, Any] | None = None, network_Gbps: float | None = None) -> dict[str, Any]:
    """A hardware profile of llama2-7b's layer as the worker's profiler writes one on two nodes of 8 (the runtime's
    stack, the model it timed), its times the analytic model's under ``truth``: tp 1, 2 and 8, Megatron SP or not,
    1 and 4 samples; collectives within a node, and across the two (16 ranks, and one rank of each node), on the
    GPU preset's network or on ``network_Gbps`` per node (which the profile then states)."""
    spec = model or ModelSpec.model_validate({"preset": "llama2-7b"}).model_dump(mode="json", exclude_none=True)
    points = [{"batch": b, "seq": 2048, "tp": t, "sp": sp, "forward_ms": 1.0, "backward_ms": 2.0}
              for t in (1, 2, 8) for b in (1, 4) for sp in ((False, True) if t > 1 else (False,))]
    collectives = [{"op": op, "group_size": n, "message_bytes": b, "time_ms": 1.0}
                   for op in ("allreduce", "alltoall") for n in (2, 8) for b in (2**16, 2**26)]
    collectives += [{"op": "allreduce", "group_size": n, "across_nodes": True, "nodes": 2, "message_bytes": b,
                     "time_ms": 1.0} for n in (16, 2) for b in (2**16, 2**26)]
    doc = {"name": "h100 nodes", "gpu": "NVIDIA H100 80GB HBM3", "stack": {"framework": "paraplan"}, "model": spec,
           "gpus_per_node": 8, "layer_times": points, "collectives": collectives,
           **({"inter_node_bandwidth_Gbps": network_Gbps} if network_Gbps else {})}
    times = [m.predicted_s(truth) for m in profile_measurements(load_profile(doc), "H100-SXM")]
    doc["layer_times"] = [{**p, "forward_ms": 1e3 * t / 3, "backward_ms": 2e3 * t / 3}
                          for p, t in zip(points, times[:len(points)], strict=True)]
    doc["collectives"] = [{**c, "time_ms": 1e3 * t} for c, t in zip(collectives, times[len(points):], strict=True)]
    return doc


def test_a_set_fitted_on_a_profiles_layer_times_prices_other_plans_closer(
        client: Any, make_token: Callable[[str], str]) -> None:
    """A hardware profile the worker uploaded (its layer and collective times; here the model's own under
    ``PROFILED``) fits a set for the GPU it ran on and the stack it timed; a plan on that stack is then priced with
    it, closer to ``PROFILED`` than with the shipped constants. Refusals name the field."""
    submit, worker = _auth(make_token("submit")), _auth(make_token("worker"))
    upload = client.post("/v1/profiles", json={"name": "h100 node", "kind": "hardware", "data": _profile(PROFILED)},
                         headers=worker)
    assert upload.status_code == 201, upload.text
    runtime = runtime_request(H100)
    before = _step(client, runtime, SECOND, make_token("submit"))
    r = client.post("/v1/calibration-sets", json={"name": "h100-profiled", "profiles": [upload.json()["id"]],
                                                  "gpu": "H100-SXM"}, headers=submit)
    assert r.status_code == 201, r.text
    made = r.json()
    assert made["gpu"] == "H100-SXM" and made["stack"]["framework"] == "paraplan"
    assert made["sources"] == {"profiles": [upload.json()["id"]], "gpu": "H100-SXM"}
    fit = made["fit"]
    assert fit["measurements"] == 10 + 8 + 4 and fit["fit_mape"] < 0.02 < fit["start_mape"]
    assert fit["held_out_mape"] is not None and fit["held_out_mape"] < 0.02  # five folds of the layer times
    # its layers pin the GEMM plateau and the host's kernel issue, its collectives the efficiencies and latencies of
    # NVLink (within a node) and of the network (across the two)
    assert set(fit["keys"]) == {"gemm_eta_max", "kernel_overhead_s", "intra_efficiency", "intra_latency_s",
                                "inter_efficiency", "inter_latency_s"}
    assert {"gemm_eta_max", "kernel_overhead_s", "intra_efficiency", "inter_efficiency"} <= set(fit["identified"])
    for key in ("gemm_eta_max", "intra_efficiency", "inter_efficiency"):
        assert made["constants"][key] == pytest.approx(getattr(PROFILED, key), rel=0.05), key

    after = _step(client, runtime, SECOND, make_token("submit"))
    assert (after["calibration_set"]["name"], after["calibration_set"]["chosen_by"]) == ("h100-profiled", "cluster")
    truth = predict_s(measurement_of(runtime, SECOND, 1.0), PROFILED)
    assert abs(after["step_time_s"] / truth - 1) < abs(before["step_time_s"] / truth - 1) / 3
    # and a plan whose data parallelism spans four nodes, its gradient sync on the network the profile measured
    wide = {**runtime, "cluster": {**runtime["cluster"], "nodes": 4}, "training": {
        **runtime["training"], "global_batch_size": 256}}
    across = {"tp": 8, "pp": 1, "micro_batch_size": 1, "zero": 3}
    truth = predict_s(measurement_of(wide, across, 1.0), PROFILED)
    shipped = predict_s(measurement_of(wide, across, 1.0), DEFAULT_CALIBRATION)
    assert abs(_step(client, wide, across, make_token("submit"))["step_time_s"] / truth - 1) < abs(
        shipped / truth - 1) / 3

    def refused(body: dict[str, Any]) -> list[Any]:
        got = client.post("/v1/calibration-sets", json={"name": "p", **body}, headers=submit)
        assert got.status_code == 422, got.text
        return list(got.json()["detail"][0]["loc"][1:])

    pid = upload.json()["id"]
    assert refused({"profiles": [pid]}) == ["gpu"]  # the GPU it ran on: a profile names its device as torch does
    assert refused({"profiles": [pid], "gpu": "H100-SXM", "runs": ["r"]})[-1] == "profiles"
    assert refused({"measurements": _measurements([FIRST]), "gpu": "H100-SXM"}) == ["gpu"]
    assert refused({"profiles": ["no-such-profile"], "gpu": "H100-SXM"}) == ["profiles", 0]
    assert refused({"profiles": [pid], "gpu": "H1000"}) == ["gpu"]
    old = {**_profile(PROFILED)}
    del old["model"]  # a profile from before the profiler recorded the model it timed
    old_id = client.post("/v1/profiles", json={"name": "old", "kind": "hardware", "data": old},
                         headers=worker).json()["id"]
    assert refused({"profiles": [pid, old_id], "gpu": "H100-SXM"}) == ["profiles", 1, "model"]


def test_a_profile_that_states_its_network_fits_the_efficiency_of_that_network(
        client: Any, make_token: Callable[[str], str]) -> None:
    """Nodes on an 800 Gb/s network (a quarter of the H100-SXM preset's), at 40 % of it: a profile that states its
    network fits 40 % of it, and a plan for that cluster (its request stating 800 Gb/s) is priced as the truth; the
    same profile unstated fits its efficiency against the preset's network, prices that plan's network four times
    too slow, and the set's report and note say the preset's network was assumed."""
    submit, worker = _auth(make_token("submit")), _auth(make_token("worker"))
    runtime = runtime_request(H100)
    wide = {**runtime, "training": {**runtime["training"], "global_batch_size": 256},
            "cluster": {**runtime["cluster"], "nodes": 4, "inter_node_bandwidth_Gbps": 800}}
    across = {"tp": 8, "pp": 1, "micro_batch_size": 1, "zero": 3}
    truth = predict_s(measurement_of(wide, across, 1.0), PROFILED)
    doc = _profile(PROFILED, network_Gbps=800)
    unstated = {k: v for k, v in doc.items() if k != "inter_node_bandwidth_Gbps"}
    errors, fits = {}, {}
    for name, data in (("h100-800g", doc), ("h100-unstated", unstated)):
        pid = client.post("/v1/profiles", json={"name": name, "kind": "hardware", "data": data},
                          headers=worker).json()["id"]
        made = client.post("/v1/calibration-sets", json={"name": name, "profiles": [pid], "gpu": "H100-SXM"},
                           headers=submit)
        assert made.status_code == 201, made.text
        fits[name] = made.json()
        priced = _step(client, {**wide, "cost_model": {"calibration_set": name}}, across, make_token("submit"))
        assert priced["calibration_set"]["name"] == name
        errors[name] = (priced["step_time_s"] / truth - 1, priced["calibration_set"]["note"])
    stated = fits["h100-800g"]
    assert (stated["fit"]["network_Gbps"], stated["fit"]["network_stated"]) == (800, True)
    assert stated["constants"]["inter_efficiency"] == pytest.approx(PROFILED.inter_efficiency, rel=0.05)
    assert abs(errors["h100-800g"][0]) < 0.05, errors
    assert errors["h100-800g"][1].endswith("relative to 800 Gb/s per node")
    assert (fits["h100-unstated"]["fit"]["network_Gbps"], fits["h100-unstated"]["fit"]["network_stated"]) == (
        3200, False)
    assert errors["h100-unstated"][0] > 0.10, errors  # its gradient sync priced on a network a quarter as fast
    assert ("relative to 3200 Gb/s per node (the GPU preset's: the measurements did not state their network)"
            in errors["h100-unstated"][1]), errors
    # a tenth of the preset's network lies far from the start (0.71): the search reaches it (it extends its largest
    # gain while a measurement is over 25 % off) and the set does not say it stopped short
    assert stated["fit"]["unfinished"] == fits["h100-unstated"]["fit"]["unfinished"] == []
    assert fits["h100-unstated"]["constants"]["inter_efficiency"] == pytest.approx(
        PROFILED.inter_efficiency * 800 / 3200, rel=0.1)
    assert "stopped short" not in errors["h100-unstated"][1], errors


def _measurements(strategies: list[dict[str, Any]], request: dict[str, Any] = H100) -> list[dict[str, Any]]:
    return [{"request": request, "strategy": s, "step_time_s": measured_s(request, s)} for s in strategies]


def test_versions_names_and_refusals(client: Any, make_token: Callable[[str], str]) -> None:
    headers = _auth(make_token("submit"))
    post = lambda body: client.post("/v1/calibration-sets", json=body, headers=headers)  # noqa: E731
    v1 = post({"name": "h100", "measurements": _measurements([FIRST])})
    v2 = post({"name": "h100", "measurements": _measurements([FIRST, SECOND])})
    assert (v1.status_code, v2.status_code) == (201, 201)
    assert [v1.json()["version"], v2.json()["version"]] == [1, 2]
    fit = v2.json()["fit"]  # two measurements: each predicted by a fit on the other
    assert fit["measurements"] == 2 and fit["held_out_mape"] is not None and fit["held_out_mape"] >= fit["fit_mape"]
    assert client.get("/v1/calibration-sets/h100", headers=headers).json()["version"] == 2
    first = client.get("/v1/calibration-sets/h100", params={"version": 1}, headers=headers).json()
    assert first["id"] == v1.json()["id"]
    assert [s["version"] for s in client.get("/v1/calibration-sets", params={"name": "h100"}, headers=headers).json()
            ] == [2, 1]
    assert client.get("/v1/calibration-sets/nope", headers=headers).status_code == 404

    # named by the request, a version too; a plan request is a new plan when its set has a new version
    named = _step(client, {**H100, "cost_model": {"calibration_set": "h100@1"}}, SECOND, make_token("submit"))
    assert (named["calibration_set"]["version"], named["calibration_set"]["chosen_by"]) == (1, "request")
    plan_v2 = client.post("/v1/plans", json=H100, headers=headers).json()["id"]
    post({"name": "h100", "measurements": _measurements([SECOND])})
    assert client.post("/v1/plans", json=H100, headers=headers).json()["id"] != plan_v2
    # an override on top of a set is said
    over = _step(client, {**H100, "cost_model": {"calibration": {"dp_overlap": 0.5}}}, SECOND, make_token("submit"))
    assert over["calibration_set"]["overridden"] == ["dp_overlap"]

    # only the service writes a resolution: one a client sent for a cluster no set matches is dropped
    forged = {"name": "h100", "version": 9, "chosen_by": "cluster", "note": "forged", "constants": {}}
    a100 = {**H100, "cluster": {**H100["cluster"], "gpu": "A100-80GB"}}
    stored = client.post("/v1/plans", json={**a100, "cost_model": {"resolved_calibration_set": forged}},
                         headers=headers).json()["request"]
    assert stored == {**a100, "cost_model": {}}

    def refused(body: dict[str, Any], status: int = 422) -> Any:
        r = post(body)
        assert r.status_code == status, r.text
        return r.json()["detail"]

    assert "A100-80GB" in refused({"name": "h100", "measurements": _measurements([FIRST], a100)}, 409)
    mixed = refused({"name": "mixed", "measurements": _measurements([FIRST]) + _measurements([FIRST], a100)})
    assert mixed[0]["loc"][-2:] == ["measurements", 1]
    assert refused({"name": "x", "runs": ["no-such-run"]})[0]["loc"][-2:] == ["runs", 0]
    assert refused({"name": "x"})[0]["loc"][-1] == "runs"
    assert refused({"name": "x y", "measurements": _measurements([FIRST])})[0]["loc"][-1] == "name"
    bad = refused({"name": "x", "measurements": [{**_measurements([FIRST])[0], "strategy": {"tp": 3}}]})
    assert bad[0]["loc"][-3:] == ["measurements", 0, "strategy"] or bad[0]["loc"][-4:-1] == ["measurements", 0,
                                                                                              "strategy"]
    for name, why in (("nope", "no stored calibration set"), ("h100@x", "positive integer")):
        r = client.post("/v1/estimate", json={**H100, "strategy": SECOND, "cost_model": {"calibration_set": name}},
                        headers=headers)
        assert r.status_code == 422 and r.json()["detail"][0]["loc"][-2:] == ["cost_model", "calibration_set"]
        assert why in r.json()["detail"][0]["msg"]


def test_a_set_stored_before_the_stack_had_elementwise_ops_is_found_after_the_upgrade(
        database_url: str, settings: Any, make_token: Callable[[str], str]) -> None:
    """Migration 34elementwise: a set stored when the stack had no ``elementwise`` field was fitted on fused
    kernels; upgraded, its stack and key say so and a request on that cluster finds it as before. Downgraded, the
    key is again the one the code of that revision wrote (the stack's fields without it, in sorted order)."""
    from alembic import command
    from fastapi.testclient import TestClient

    from service.app import create_app
    from service.migrate import alembic_config, upgrade

    old_key = ("H100-SXM|attention=fused,distributed_optimizer=True,dp_overlap=True,fp8_recipe=None,"
               "framework=megatron-core,framework_version=None,tp_comm_overlap=backward")
    token = make_token("submit")
    with TestClient(create_app(settings)) as c:
        made = c.post("/v1/calibration-sets", json={"name": "h100-before", "measurements": _measurements([FIRST])},
                      headers=_auth(token))
        assert made.status_code == 201, made.text
    database = Database.connect(database_url, pool_size=1)

    def stored() -> tuple[str, dict[str, Any]]:
        with database.engine.connect() as conn:
            row = conn.execute(sa.text("SELECT set_key, stack FROM calibration_sets")).one()
        stack = row.stack if isinstance(row.stack, dict) else json.loads(row.stack)
        return row.set_key, stack

    try:
        assert stored()[0] == old_key.replace("dp_overlap=True,", "dp_overlap=True,elementwise=fused,")
        command.downgrade(alembic_config(database_url), "c34a7e51")
        key, stack = stored()
        assert key == old_key and "elementwise" not in stack
    finally:
        upgrade(database_url=database_url)
    key, stack = stored()
    database.dispose()
    assert key == old_key.replace("dp_overlap=True,", "dp_overlap=True,elementwise=fused,")
    assert stack["elementwise"] == "fused"
    with TestClient(create_app(settings)) as c:
        used = _step(c, H100, SECOND, token)["calibration_set"]
    assert (used["name"], used["chosen_by"]) == ("h100-before", "cluster")
