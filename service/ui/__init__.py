"""The web dashboard: server-rendered pages over the service layer (``router``; ``mount_ui(app)``)."""

from service.ui.routes import mount_ui, router

__all__ = ["mount_ui", "router"]
