"""ASGI entry point for uvicorn: ``service.main:app``."""

from service.app import create_app
from service.logs import configure_logging
from service.settings import get_settings

configure_logging(as_json=get_settings().log_json)
app = create_app()
