"""The solver job queue against a real database: claims, leases, expiry, exactly-once completion."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import update

from service import jobs, plans
from service.db.engine import Database
from service.db.models import Job, utcnow
from solvers.documents import load_result
from tests.service.helpers import HYBRID, RESULT, variant

DOCUMENT = load_result("hybrid", RESULT)

pytestmark = pytest.mark.db


def _expire(db: Database, job_id: str) -> None:
    with db.writing() as s:
        s.execute(update(Job).where(Job.id == job_id).values(lease_expires_at=utcnow() - timedelta(seconds=1)))


def test_claim_takes_oldest_and_each_job_once(db: Database) -> None:
    ids = [plans.submit_plan(db, variant(i), "hybrid", 3)[0]["id"] for i in range(3)]
    claimed = [jobs.claim_job(db, f"d{i}", 30) for i in range(4)]
    assert [c.plan_id for c in claimed[:3] if c] == ids
    assert claimed[3] is None
    with db.reading() as s:
        assert plans.get_plan(s, ids[0])["status"] == "running"


def test_concurrent_claimers_never_share_a_job(db: Database) -> None:
    n = 30
    for i in range(n):
        plans.submit_plan(db, variant(i), "hybrid", 3)
    got: list[str] = []
    lock = threading.Lock()

    def claimer(name: str) -> None:
        while (job := jobs.claim_job(db, name, 30)) is not None:
            with lock:
                got.append(job.id)

    threads = [threading.Thread(target=claimer, args=(f"t{i}",)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == n and len(set(got)) == n


def test_expired_lease_is_released_to_another_and_old_owner_cannot_write(db: Database) -> None:
    plan_id = plans.submit_plan(db, HYBRID, "hybrid", 3)[0]["id"]
    first = jobs.claim_job(db, "dead", 30)
    assert first is not None and jobs.claim_job(db, "other", 30) is None  # lease still valid
    _expire(db, first.id)
    second = jobs.claim_job(db, "alive", 30)
    assert second is not None and second.id == first.id and second.attempt == 2
    assert not jobs.renew_lease(db, first.id, "dead", 30)
    assert not jobs.complete_job(db, first.id, "dead", DOCUMENT)
    assert jobs.complete_job(db, second.id, "alive", DOCUMENT)
    assert not jobs.complete_job(db, second.id, "alive", DOCUMENT)  # terminal states are final
    with db.reading() as s:
        view = plans.get_plan(s, plan_id)
    assert view["status"] == "succeeded" and view["result"] == DOCUMENT and view["attempts"] == 2
    assert view["estimate"] == RESULT["estimate"] and view["search_time_s"] == 0.5 and view["solver"] == "dp"


def test_job_fails_with_reason_after_max_attempts(db: Database) -> None:
    plan_id = plans.submit_plan(db, HYBRID, "hybrid", 2)[0]["id"]
    for attempt in (1, 2):
        job = jobs.claim_job(db, f"d{attempt}", 30)
        assert job is not None and job.attempt == attempt
        _expire(db, job.id)
    assert jobs.claim_job(db, "d3", 30) is None
    with db.reading() as s:
        view = plans.get_plan(s, plan_id)
    assert view["status"] == "failed" and "lease expired 2 times" in view["error"]
    # a failure not caused by the request: resubmitting solves again, as a new plan
    again, created = plans.submit_plan(db, HYBRID, "hybrid", 2)
    assert created and again["id"] != plan_id


def test_request_error_keeps_dedupe_and_cancel_releases_it(db: Database) -> None:
    plan_id = plans.submit_plan(db, HYBRID, "hybrid", 3)[0]["id"]
    job = jobs.claim_job(db, "d", 30)
    assert job is not None
    assert jobs.fail_job(db, job.id, "d", "training.global_batch_size: infeasible", [], request_error=True)
    same, created = plans.submit_plan(db, HYBRID, "hybrid", 3)
    assert not created and same["id"] == plan_id and same["status"] == "failed"
    other = plans.submit_plan(db, variant(5), "hybrid", 3)[0]["id"]
    assert plans.cancel_plan(db, other)["status"] == "cancelled"
    running = jobs.claim_job(db, "d", 30)
    assert running is None  # cancelled jobs are not claimable
    assert plans.submit_plan(db, variant(5), "hybrid", 3)[1]


def test_cancel_running_job_revokes_lease(db: Database) -> None:
    plan_id = plans.submit_plan(db, HYBRID, "hybrid", 3)[0]["id"]
    job = jobs.claim_job(db, "d", 30)
    assert job is not None and jobs.renew_lease(db, job.id, "d", 30, 0.5, "half")
    with db.reading() as s:
        assert plans.get_plan(s, plan_id)["progress"] == {"fraction": 0.5, "message": "half"}
    plans.cancel_plan(db, plan_id)
    assert not jobs.renew_lease(db, job.id, "d", 30)
    assert not jobs.complete_job(db, job.id, "d", DOCUMENT)
    with db.reading() as s:
        assert plans.get_plan(s, plan_id)["status"] == "cancelled"


def test_release_requeues_without_counting_the_attempt(db: Database) -> None:
    plans.submit_plan(db, HYBRID, "hybrid", 3)
    job = jobs.claim_job(db, "stopping", 30)
    assert job is not None and jobs.release_job(db, job.id, "stopping")
    again = jobs.claim_job(db, "next", 30)
    assert again is not None and again.id == job.id and again.attempt == 1
