"""Prometheus metrics: request latency by route (in-process) and queue/job/run/worker state read from the
database at scrape time, so every replica reports the same shared truth."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from datetime import datetime

from prometheus_client import CollectorRegistry, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric, SummaryMetricFamily
from prometheus_client.registry import Collector
from sqlalchemy import func, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from service.db.models import Job, Plan, Run, Worker, utcnow

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.request_latency = Histogram("paraplan_http_request_duration_seconds", "HTTP request latency",
                                         ["method", "route", "status"], buckets=_LATENCY_BUCKETS,
                                         registry=self.registry)

    def attach_database(self, session_factory: Callable[[], Session]) -> None:
        self.registry.register(DatabaseCollector(session_factory))


class DatabaseCollector(Collector):
    def __init__(self, session_factory: Callable[[], Session]) -> None:
        self.session_factory = session_factory

    def describe(self) -> Iterator[Metric]:
        return iter(())  # registering must not query the database (it may not be migrated yet)

    def collect(self) -> Iterator[Metric]:
        try:
            families = list(self._collect())
        except SQLAlchemyError:
            families = []
        yield GaugeMetricFamily("paraplan_database_up", "whether the last scrape could read the database",
                                value=1.0 if families else 0.0)
        yield from families

    def _collect(self) -> Iterator[Metric]:
        with self.session_factory() as session:
            jobs = GaugeMetricFamily("paraplan_jobs", "solver jobs by state", labels=["state"])
            for state, n in session.execute(select(Job.status, func.count()).group_by(Job.status)):
                jobs.add_metric([state], n)
            yield jobs
            depth = session.execute(select(func.count()).select_from(Job).where(Job.status == "queued")).scalar_one()
            yield GaugeMetricFamily("paraplan_queue_depth", "solver jobs waiting for a dispatcher", value=depth)
            runs = GaugeMetricFamily("paraplan_runs", "runs by state", labels=["state"])
            for state, n in session.execute(select(Run.status, func.count()).group_by(Run.status)):
                runs.add_metric([state], n)
            yield runs
            solve = SummaryMetricFamily("paraplan_solve_seconds", "solver search time of succeeded plans",
                                        labels=["kind"])
            for kind, n, total in session.execute(
                select(Plan.kind, func.count(), func.sum(Plan.search_time_s))
                .where(Plan.status == "succeeded", Plan.search_time_s.is_not(None)).group_by(Plan.kind)
            ):
                solve.add_metric([kind], count_value=n, sum_value=float(total or 0.0))
            yield solve
            beats = GaugeMetricFamily("paraplan_worker_heartbeat_age_seconds", "seconds since a worker's last "
                                      "heartbeat", labels=["worker", "name", "host"])
            now = utcnow()
            for wid, name, host, last in session.execute(
                select(Worker.id, Worker.name, Worker.host, Worker.last_heartbeat)
            ):
                if isinstance(last, datetime):
                    beats.add_metric([wid, name, host], (now - last).total_seconds())
            yield beats
