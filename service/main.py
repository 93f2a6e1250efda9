"""ASGI entry point for uvicorn: ``service.main:app``."""

from service.app import create_app

app = create_app()
