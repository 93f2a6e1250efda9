"""Closed-loop calibration on this machine (issue 34): the first run on a CPU "cluster" calibrates its set; other
plans on that cluster are then predicted with the set's constants and measured, against their prediction with the
constants the request started from.

    .venv/bin/python bench/calibration_loop.py              # first run dp4, then four other plans, 4 gloo ranks
    .venv/bin/python bench/calibration_loop.py --steps 8
    .venv/bin/python bench/calibration_loop.py --from-profile   # the set fitted on a profile of this host instead
    .venv/bin/python bench/calibration_loop.py --from-profile --nodes 2   # two "nodes" of 2 ranks profiled together

The first plan (``FIRST``) is run with the worker runtime (``worker.launch.run_locally``, as a worker daemon
launches it) and its measured step fits a set exactly as ``POST /v1/calibration-sets`` does
(``solvers.cost_model.fitting.fit_calibration`` on ``measurement_of`` the run; the set's few constants, from the
constants the request is priced with: the analytic model with ``bench/closed_loop.py``'s CPU calibration and the
``cpu`` GPU at a nominal 0.2 TFLOP/s, no profile). Each other plan (``OTHERS``, none of them seen by the fit) is
predicted before (the starting constants) and after (the set's), then run and measured; the error of each is
printed, and their mean. Predictions are estimates, measurements are the median step after warm-up; the others
are held out from the fit. The machine is shared: the load average is printed with the table.

``--nodes 2`` (with ``--from-profile``): the profile is taken by two torchrun agents of 2 ranks meeting at a c10d
rendezvous on this host, as ``paraplan worker profile --nnodes 2`` takes one, so that its collectives across the two
"nodes" are measured and the set fits the network's constants too; the held-out plans are ``bench/closed_loop.py``'s
two-node plans, run in the same launch between the profile's passes (``measure_interleaved``: the profile and the
steps under the same load). Both nodes are this host: "the network" is gloo over loopback, as within a node."""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.closed_loop import (  # noqa: E402
    CPU_CALIBRATION,
    MODEL,
    PLANS_4,
    PROFILE_SPEC,
    RANKS,
    ROUND_STEPS,
    measure_interleaved,
    measured_links,
    request,
    run_profiler,
)
from solvers.cost_model.calibration import DEFAULT_CALIBRATION  # noqa: E402
from solvers.cost_model.fitting import (  # noqa: E402
    PROFILE_FIT_KEYS,
    fit_calibration,
    measurement_of,
    predict_s,
    profile_measurements,
)
from solvers.cost_model.profile import load_profile  # noqa: E402
from worker.launch import run_locally  # noqa: E402

FIRST = "dp4"
OTHERS = ("dp4-recompute", "dp4-zero3", "tp4", "pp2-dp2-gpipe")


def measured_step_s(name: str, steps: int, work: Path) -> float:
    req = request(PLANS_4[name], None)
    metrics = run_locally({"kind": "hybrid", "request": req}, RANKS, steps, work / name)
    return float(metrics["step_time_s"])


def fit_on_profile(profile: dict[str, Any], start: Any) -> tuple[Any, dict[str, float]]:
    """A set fitted on ``profile`` as the service fits one (``profile_measurements``: its dense layer times and its
    collectives, the constants ``PROFILE_FIT_KEYS``), on the cluster the requests name with the links the profile's
    p2p transfers measured (``bench.closed_loop.measured_links``: the GPU defaults are ~100 times too fast for gloo,
    beyond what an efficiency can be fitted down to); and those links."""
    links = measured_links(profile)
    gpu = {**request(PLANS_4[FIRST], None)["cluster"]["gpu"], **links}
    fit = fit_calibration(profile_measurements(load_profile(profile), gpu), start=start, keys=PROFILE_FIT_KEYS)
    return fit, links


def profile_fit(work: Path, start: Any, repeats: int) -> tuple[Any, dict[str, float]]:
    """``fit_on_profile`` of this host's profile (``worker.profiler`` on the 4 ranks, as ``paraplan worker profile``
    takes it)."""
    return fit_on_profile(run_profiler(work, repeats, RANKS)["profile"], start)


def two_node_steps(work: Path, repeats: int, rounds: int) -> tuple[dict[str, Any], dict[str, float]]:
    """The profile of two "nodes" of 2 ranks taken together (its passes merged, the model it timed stated), and the
    median step of each two-node plan, measured in the same launch between the profile's passes."""
    from worker.profiler import merge_profiles

    names = [n for n, plan in PLANS_4.items() if plan[2] == 2]
    docs = {n: {"kind": "hybrid", "request": request(PLANS_4[n], None)} for n in names}
    got = measure_interleaved(docs, RANKS, rounds, ROUND_STEPS, work, 2, {**PROFILE_SPEC, "repeats": repeats})
    profile = {**merge_profiles(got["profiles"])["profile"], "model": PROFILE_SPEC["model"]}
    return profile, {n: statistics.median(got["samples"][n]) for n in names}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--from-profile", action="store_true",
                    help="fit the set on a profile of this host instead of the first run; every plan held out")
    ap.add_argument("--repeats", type=int, default=3, help="with --from-profile: the profiler's repeats")
    ap.add_argument("--nodes", type=int, choices=(1, 2), default=1,
                    help="with --from-profile: 2 = profile two nodes of 2 ranks together, predict the two-node plans")
    ap.add_argument("--rounds", type=int, default=3, help="with --nodes 2: rounds of profile passes and steps")
    args = ap.parse_args()
    assert all(PLANS_4[n][1] is MODEL and PLANS_4[n][2] == 1 for n in (FIRST, *OTHERS))  # one cluster, one model
    work = Path(tempfile.mkdtemp(prefix="calibration-loop-"))
    t0 = time.time()
    start = replace(DEFAULT_CALIBRATION, **CPU_CALIBRATION)  # what the requests are priced with before any set

    links: dict[str, float] = {}  # the cluster's links as measured (with --from-profile)

    def measurement(name: str, step_s: float) -> Any:
        strategy, _, _ = PLANS_4[name]
        req = request(PLANS_4[name], None)
        return measurement_of({**req, "cluster": {**req["cluster"], **links}}, strategy, step_s)

    if args.nodes == 2 and not args.from_profile:
        ap.error("--nodes 2 needs --from-profile")
    steps_of: dict[str, float] = {}  # steps measured beside the profile (--nodes 2)
    within: Any = None  # (--nodes 2) the set fitted on the same profile less its collectives across nodes
    if args.from_profile:
        if args.nodes == 2:
            profile, steps_of = two_node_steps(work, args.repeats, args.rounds)
            fit, measured = fit_on_profile(profile, start)
            within, _ = fit_on_profile({**profile, "collectives": [
                c for c in profile["collectives"] if not c["across_nodes"]]}, start)
        else:
            fit, measured = profile_fit(work, start, args.repeats)
        links.update(measured)
        report = fit.report
        print(f"set fitted on this host's profile: {report.measurements} layer and collective times, start MAPE "
              f"{100 * report.start_mape:.1f}%, fit {100 * report.fit_mape:.1f}%, held out (five folds) "
              f"{100 * (report.held_out_mape or 0.0):.1f}%; pinned: {', '.join(report.identified or [])}; "
              f"the search stopped short on: {', '.join(report.unfinished or []) or 'none'}")
        held_out: tuple[str, ...] = tuple(steps_of) or (FIRST, *OTHERS)
    else:
        first_s = measured_step_s(FIRST, args.steps, work)
        fit = fit_calibration([measurement(FIRST, first_s)], start=start)
        changed = {k: round(v, 6) for k, v in fit.report.model_dump().items() if k in ("start_mape", "fit_mape")}
        print(f"first run {FIRST}: measured {first_s:.4f} s; set fitted on it: {changed} "
              f"(constants {', '.join(fit.report.keys)}; the search stopped short on: "
              f"{', '.join(fit.report.unfinished or []) or 'none'})")
        held_out = OTHERS
    # (--nodes 2: also the set the same profile fits without its collectives across nodes, as before they were
    # fitted: the network at the starting constants)
    print(f"\n{'plan (held out)':<18}{'measured s':>11}{'before s':>10}{'error':>9}{'after s':>10}{'error':>9}"
          + (f"{'within s':>10}{'error':>9}" if within else "") + f"{'load':>6}")
    before_err, after_err, within_err = [], [], []
    for name in held_out:
        got = steps_of[name] if name in steps_of else measured_step_s(name, args.steps, work)
        m = measurement(name, got)
        before, after = predict_s(m, start), predict_s(m, fit.constants)
        before_err.append(abs(before / got - 1))
        after_err.append(abs(after / got - 1))
        line = (f"{name:<18}{got:>11.4f}{before:>10.4f}{100 * (before / got - 1):>8.1f}%{after:>10.4f}"
                f"{100 * (after / got - 1):>8.1f}%")
        if within:
            alone = predict_s(m, within.constants)
            within_err.append(abs(alone / got - 1))
            line += f"{alone:>10.4f}{100 * (alone / got - 1):>8.1f}%"
        print(f"{line}{os.getloadavg()[0]:>6.1f}", flush=True)
    n = len(held_out)
    if within:
        print(f"\nthe set fitted on the profile's collectives within a node only: mean absolute error "
              f"{100 * sum(within_err) / n:.1f}%; pinned: {', '.join(within.report.identified or [])}")
    source = "this host's profile" if args.from_profile else "the first run"
    print(f"\nmean absolute error over the {n} held-out plans: before the set {100 * sum(before_err) / n:.1f}%, "
          f"with the set fitted on {source} {100 * sum(after_err) / n:.1f}% ({time.time() - t0:.0f} s, load "
          f"average {os.getloadavg()})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
