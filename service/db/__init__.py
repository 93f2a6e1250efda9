"""Database layer: SQLAlchemy models and engine/session factories."""
