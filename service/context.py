"""What the routes share: settings, the database, the token cache and the metrics (one per app)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from fastapi import Request

from service.db.engine import Database
from service.metrics import Metrics
from service.plan_cache import PlanCache
from service.settings import Settings
from service.tokens import TokenCache


@dataclass
class ServiceContext:
    settings: Settings
    db: Database
    tokens: TokenCache = field(default_factory=TokenCache)
    metrics: Metrics = field(default_factory=Metrics)
    plans: PlanCache = field(default_factory=PlanCache)
    # Called after a new job is queued; the in-process dispatcher hooks its wake-up here.
    on_queued: Callable[[], None] = lambda: None


async def get_context(request: Request) -> ServiceContext:
    # async on purpose: FastAPI runs a sync dependency in the thread pool, a hop per request for nothing
    ctx: ServiceContext = request.app.state.ctx
    return ctx
