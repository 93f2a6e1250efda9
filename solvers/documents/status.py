"""The life of a plan, a solver job and a run, as the contract names its states.

A terminal state is final: nothing moves a plan, job or run out of one.
"""

from __future__ import annotations

from typing import Literal

Status = Literal["queued", "running", "succeeded", "failed", "cancelled"]
ACTIVE: tuple[Status, ...] = ("queued", "running")
TERMINAL: frozenset[Status] = frozenset({"succeeded", "failed", "cancelled"})
STATUSES: tuple[Status, ...] = (*ACTIVE, "succeeded", "failed", "cancelled")
