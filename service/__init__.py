"""paraplan service: REST API, plan database, solver job dispatcher, dashboard."""
