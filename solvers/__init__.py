"""paraplan solvers: specs, presets, the cost model and the planners (pure Python, no web/DB/torch)."""

from solvers.api import estimate, solve

__all__ = ["estimate", "solve"]
