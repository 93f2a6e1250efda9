"""FastAPI application factory."""

from __future__ import annotations

from fastapi import FastAPI

from service.settings import Settings, get_settings


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or get_settings()
    app = FastAPI(title="paraplan", version="0.1.0", description="Parallel training plans as a service.")
    app.state.settings = settings

    @app.get("/healthz", tags=["ops"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    return app
